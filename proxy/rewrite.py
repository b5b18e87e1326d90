"""Rewriting broker endpoints in responses so clients only ever see the proxy.

Responses that name brokers (Metadata, FindCoordinator in all versions including
v4+ batched coordinators, DescribeCluster, and the KIP-951 ``NodeEndpoints`` of
Produce v10+ / Fetch v16+) are decoded with kio, every endpoint is replaced by
the proxy's advertised host and the port mapped to that broker id, and the
response is encoded again with kio's writer. The response header bytes are kept
verbatim. Error placeholders (node id -1, as in a failed FindCoordinator) are
left alone: they carry no address.

Metadata, the one of them every client asks for on every connection and again whenever a
leader moves, is not re-encoded whole: only its brokers array (which comes before the topics
in every version) is read and written, and the bytes around it are kept as they are. Its cost
is then the brokers', not the partitions' (decoding and encoding a whole response took ~3 ms
for 64 partitions, on the event loop every connection shares).

Everything here is pure: the node-id -> endpoint mapping is passed in.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_compact_array_length, read_legacy_array_length
from kio.serial.writers import write_compact_array_length, write_legacy_array_length
from kio.static.primitive import i32

from codec.errors import CodecError
from codec.headers import parse_response_header, response_header_version
from codec.registry import response_type_for
from proxy.errors import UpstreamError

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = 0, 1, 3, 10, 60


@dataclass(frozen=True, slots=True)
class Endpoint:
    node_id: int
    host: str
    port: int


EndpointOf = Callable[[int], tuple[str, int]]
"""Maps an upstream broker id to the (host, port) the proxy advertises for it."""


def decode_response(api_key: int, api_version: int, payload: bytes) -> tuple[bytes, Any]:
    """Split a response frame into its raw header bytes and the kio body entity."""
    try:
        _, body_offset = parse_response_header(payload, response_header_version(api_key, api_version))
        schema = response_type_for(api_key, api_version)
        entity, _ = entity_reader(schema)(payload, body_offset)
    except CodecError as exc:
        raise UpstreamError(f"bad response header for api {api_key} v{api_version}: {exc}") from exc
    except Exception as exc:  # kio raises its own DecodeError family and index errors
        raise UpstreamError(f"cannot decode response for api {api_key} v{api_version}: {exc}") from exc
    return bytes(payload[:body_offset]), entity


def encode_response(header: bytes, entity: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(header)
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def _fields(entity: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(entity)}


def _broker_like(items: Iterable[Any], id_field: str) -> list[Endpoint]:
    return [
        Endpoint(int(getattr(item, id_field)), item.host, int(item.port))
        for item in items
        if int(getattr(item, id_field)) >= 0
    ]


def upstream_endpoints(api_key: int, entity: Any) -> list[Endpoint]:
    """The broker endpoints a response names (what the proxy must map)."""
    if api_key == METADATA:
        return _broker_like(entity.brokers, "node_id")
    if api_key == DESCRIBE_CLUSTER:
        return _broker_like(entity.brokers, "broker_id")
    if api_key == FIND_COORDINATOR:
        if "coordinators" in _fields(entity):
            return _broker_like(entity.coordinators, "node_id")
        return _broker_like([entity], "node_id")
    if api_key in (PRODUCE, FETCH):
        return _broker_like(getattr(entity, "node_endpoints", ()), "node_id")
    return []


def _replace_endpoint(item: Any, id_field: str, endpoint_of: EndpointOf) -> Any:
    node_id = int(getattr(item, id_field))
    if node_id < 0:
        return item
    host, port = endpoint_of(node_id)
    return dataclasses.replace(item, host=host, port=i32(port))


def _replace_all(items: tuple[Any, ...], id_field: str, endpoint_of: EndpointOf) -> tuple[Any, ...]:
    return tuple(_replace_endpoint(item, id_field, endpoint_of) for item in items)


def rewrite_endpoints(api_key: int, entity: Any, endpoint_of: EndpointOf) -> Any:
    """Return ``entity`` with every broker endpoint replaced by ``endpoint_of(node_id)``."""
    if api_key == METADATA:
        return dataclasses.replace(entity, brokers=_replace_all(entity.brokers, "node_id", endpoint_of))
    if api_key == DESCRIBE_CLUSTER:
        return dataclasses.replace(entity, brokers=_replace_all(entity.brokers, "broker_id", endpoint_of))
    if api_key == FIND_COORDINATOR:
        if "coordinators" in _fields(entity):
            return dataclasses.replace(
                entity, coordinators=_replace_all(entity.coordinators, "node_id", endpoint_of)
            )
        return _replace_endpoint(entity, "node_id", endpoint_of)
    if api_key in (PRODUCE, FETCH):
        endpoints = getattr(entity, "node_endpoints", ())
        if not endpoints:
            return entity
        return dataclasses.replace(entity, node_endpoints=_replace_all(endpoints, "node_id", endpoint_of))
    return entity


def rewrite_response(
    api_key: int, api_version: int, payload: bytes, endpoint_of: EndpointOf
) -> bytes:
    """One response frame payload (header included) with its endpoints rewritten (Metadata: only
    its brokers array re-encoded; the others decoded, rewritten and encoded again)."""
    if api_key == METADATA:
        return locate_metadata_brokers(api_version, payload).rewritten(endpoint_of)
    header, entity = decode_response(api_key, api_version, payload)
    return encode_response(header, rewrite_endpoints(api_key, entity, endpoint_of))


@dataclass(frozen=True, slots=True)
class BrokerArray:
    """A Metadata response's brokers array, located in its bytes (``payload[start:end]``)."""

    payload: bytes
    start: int
    end: int
    brokers: tuple[Any, ...]
    broker_type: type
    flexible: bool

    def endpoints(self) -> list[Endpoint]:
        return _broker_like(self.brokers, "node_id")

    def rewritten(self, endpoint_of: EndpointOf) -> bytes:
        """The payload with this array's endpoints replaced; every other byte as it was."""
        buffer = io.BytesIO()
        with memoryview(self.payload) as view:
            buffer.write(view[: self.start])
            if self.flexible:
                write_compact_array_length(buffer, len(self.brokers))
            else:
                write_legacy_array_length(buffer, i32(len(self.brokers)))
            write = entity_writer(self.broker_type)
            for broker in self.brokers:
                write(buffer, _replace_endpoint(broker, "node_id", endpoint_of))
            buffer.write(view[self.end :])
        return buffer.getvalue()


@functools.cache
def _metadata_layout(api_version: int) -> tuple[int, type, bool]:
    """(bytes of fixed-size fields before the brokers array, the broker class, flexible)."""
    response_type = response_type_for(METADATA, api_version)
    skip = 0
    for field in dataclasses.fields(response_type):
        if field.name == "brokers":
            (broker_type,) = {arg for arg in typing.get_args(typing.get_type_hints(response_type)["brokers"])
                              if isinstance(arg, type)}
            return skip, broker_type, bool(response_type.__flexible__)
        if field.metadata.get("kafka_type") not in ("int32", "timedelta_i32"):  # throttle_time_ms, v3+
            break
        skip += 4
    raise LookupError(f"Metadata v{api_version}: no brokers array after fixed-size fields")


def locate_metadata_brokers(api_version: int, payload: bytes) -> BrokerArray:
    """Read the brokers array of a Metadata response frame payload, and only that.

    :class:`UpstreamError` if the header or the array cannot be read.
    """
    try:
        _, body_offset = parse_response_header(payload, response_header_version(METADATA, api_version))
        skip, broker_type, flexible = _metadata_layout(api_version)
        start = body_offset + skip
        count, size = (read_compact_array_length if flexible else read_legacy_array_length)(payload, start)
        if count is None or count < 0:
            raise UpstreamError(f"Metadata v{api_version} response with a null brokers array")
        offset = start + size
        read_broker = entity_reader(broker_type)
        brokers = []
        for _ in range(count):
            broker, size = read_broker(payload, offset)
            brokers.append(broker)
            offset += size
    except UpstreamError:
        raise
    except CodecError as exc:
        raise UpstreamError(f"bad response header for api {METADATA} v{api_version}: {exc}") from exc
    except Exception as exc:  # kio raises its own DecodeError family and index errors
        raise UpstreamError(f"cannot decode response for api {METADATA} v{api_version}: {exc}") from exc
    return BrokerArray(payload, start, offset, tuple(brokers), broker_type, flexible)
