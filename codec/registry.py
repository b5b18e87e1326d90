"""Message registry: the APIs the proxy decodes itself, their versions, and body codecs.

Only these APIs are ever decoded; everything else passes through the proxy as opaque
bytes. Standard APIs use kio's generated classes; the versions kio 0.6.5 lacks but
Kafka 4.4 speaks (ApiVersions v5, DeleteGroups v3) and the extension RPCs use classes
built from ``codec/schemas`` by :mod:`codec.schema`. Bodies are what follows the
request/response header in a frame (see :mod:`codec.headers`).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
from collections.abc import Iterable

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.constants import EntityType

from . import extensions
from .bounds import check_bounds
from .errors import MessageDecodeError, MessageEncodeError, UnsupportedApi
from .schema import MessageDefinition


@dataclasses.dataclass(frozen=True, slots=True)
class StandardApi:
    """A Kafka API served by the proxy: the version range and where its classes come from."""

    api_key: int
    name: str
    min_version: int
    max_version: int
    # Versions whose classes come from our own definition in codec/schemas, not kio.
    own_definition_versions: frozenset[int] = frozenset()


# Version ranges: what Kafka 4.4 advertises, cut to what kio 0.6.5 carries unless we
# carry the definition ourselves. Version 0 of the share RPCs was Kafka 4.0's early
# access and is gone from 4.1+; it is not served.
STANDARD_APIS: tuple[StandardApi, ...] = (
    StandardApi(76, "ShareGroupHeartbeat", 1, 1),
    StandardApi(77, "ShareGroupDescribe", 1, 1),
    StandardApi(78, "ShareFetch", 1, 2),
    StandardApi(79, "ShareAcknowledge", 1, 2),
    StandardApi(90, "DescribeShareGroupOffsets", 0, 1),
    StandardApi(91, "AlterShareGroupOffsets", 0, 0),
    StandardApi(92, "DeleteShareGroupOffsets", 0, 0),
    # Kafka's share-coordinator RPCs, which scale-out instances send each other (proxy/share/peers.py).
    StandardApi(83, "InitializeShareGroupState", 0, 0),
    StandardApi(86, "DeleteShareGroupState", 0, 0),
    StandardApi(87, "ReadShareGroupStateSummary", 0, 1),
    StandardApi(16, "ListGroups", 0, 5),
    StandardApi(15, "DescribeGroups", 0, 6),
    StandardApi(42, "DeleteGroups", 0, 3, frozenset({3})),
    StandardApi(32, "DescribeConfigs", 1, 4),
    StandardApi(44, "IncrementalAlterConfigs", 0, 1),
    StandardApi(10, "FindCoordinator", 0, 6),
    StandardApi(3, "Metadata", 0, 13),
    StandardApi(18, "ApiVersions", 0, 5, frozenset({5})),
)

_DecodeFailures = (SerialError, KeyError, ValueError, TypeError, IndexError, OverflowError, UnicodeError, struct.error)


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    api_key: int
    name: str
    min_version: int
    max_version: int
    requests: dict[int, type]
    responses: dict[int, type]


def _standard_entry(api: StandardApi) -> _Entry:
    requests: dict[int, type] = {}
    responses: dict[int, type] = {}
    for version in range(api.min_version, api.max_version + 1):
        if version in api.own_definition_versions:
            requests[version] = MessageDefinition.bundled(f"{api.name}Request").entity(version)
            responses[version] = MessageDefinition.bundled(f"{api.name}Response").entity(version)
        else:
            requests[version] = getattr(
                load_payload_module(api.api_key, version, EntityType.request), f"{api.name}Request"
            )
            responses[version] = getattr(
                load_payload_module(api.api_key, version, EntityType.response), f"{api.name}Response"
            )
    return _Entry(api.api_key, api.name, api.min_version, api.max_version, requests, responses)


class MessageRegistry:
    """Which (api key, version) pairs the proxy serves, and their body codecs."""

    def __init__(
        self,
        *,
        mark_in_progress_key: int = extensions.DEFAULT_MARK_IN_PROGRESS_KEY,
        describe_in_flight_key: int = extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY,
    ) -> None:
        entries = [_standard_entry(api) for api in STANDARD_APIS]
        for extension in (
            extensions.mark_in_progress(mark_in_progress_key),
            extensions.describe_in_flight(describe_in_flight_key),
        ):
            entries.append(
                _Entry(
                    extension.api_key,
                    extension.name,
                    extension.min_version,
                    extension.max_version,
                    extension.requests,
                    extension.responses,
                )
            )
        self._entries: dict[int, _Entry] = {}
        for entry in entries:
            if entry.api_key in self._entries:
                raise ValueError(
                    f"api key {entry.api_key} assigned to both {self._entries[entry.api_key].name} and {entry.name}"
                )
            self._entries[entry.api_key] = entry

    def api_keys(self) -> list[int]:
        """Every api key the registry serves, ascending."""
        return sorted(self._entries)

    def name(self, api_key: int) -> str:
        return self._entry(api_key).name

    def serves(self, api_key: int, version: int | None = None) -> bool:
        entry = self._entries.get(api_key)
        if entry is None:
            return False
        return version is None or entry.min_version <= version <= entry.max_version

    def supported_versions(self, api_key: int) -> tuple[int, int]:
        """(min, max) version served for ``api_key``; raises UnsupportedApi if not served."""
        entry = self._entry(api_key)
        return entry.min_version, entry.max_version

    def request_type(self, api_key: int, version: int) -> type:
        return self._types(api_key, version).requests[version]

    def response_type(self, api_key: int, version: int) -> type:
        return self._types(api_key, version).responses[version]

    def decode_request(self, api_key: int, version: int, body: bytes | bytearray | memoryview) -> object:
        """Parse a request body (the bytes after the request header) into its entity."""
        return decode_entity(self.request_type(api_key, version), body)

    def decode_response(self, api_key: int, version: int, body: bytes | bytearray | memoryview) -> object:
        """Parse a response body (the bytes after the response header) into its entity."""
        return decode_entity(self.response_type(api_key, version), body)

    def _entry(self, api_key: int) -> _Entry:
        try:
            return self._entries[api_key]
        except KeyError:
            raise UnsupportedApi(api_key) from None

    def _types(self, api_key: int, version: int) -> _Entry:
        entry = self._entry(api_key)
        if not entry.min_version <= version <= entry.max_version:
            raise UnsupportedApi(api_key, version)
        return entry

    def entity_types(self) -> Iterable[tuple[int, int, type, type]]:
        """(api key, version, request class, response class) for everything served."""
        for api_key in self.api_keys():
            entry = self._entries[api_key]
            for version in range(entry.min_version, entry.max_version + 1):
                yield api_key, version, entry.requests[version], entry.responses[version]


def decode_entity(entity_type: type, body: bytes | bytearray | memoryview) -> object:
    """Parse ``body`` as exactly one ``entity_type`` value (bounds-checked, then kio)."""
    try:
        check_bounds(entity_type, body)
        entity, consumed = entity_reader(entity_type)(body, 0)
    except _DecodeFailures as error:
        raise MessageDecodeError(f"{entity_type.__name__} v{entity_type.__version__}: {error}") from error
    if consumed != len(body):
        raise MessageDecodeError(
            f"{entity_type.__name__} v{entity_type.__version__}: {len(body) - consumed} trailing bytes after the body"
        )
    return entity


@functools.cache
def nested_types(entity_type: type) -> dict[str, type]:
    """The entity classes defined beside `entity_type` (kio keeps a schema's nested structs in
    its module), by Kafka's struct name: ``nested_types(FetchRequest)["FetchTopic"]``."""
    import sys

    module = sys.modules[entity_type.__module__]
    return {name: value for name, value in vars(module).items() if isinstance(value, type)}


def encode(entity: object, *, header: bytes = b"") -> bytes:
    """Serialize a request or response entity (any kio-compatible entity) to body bytes, after
    `header` (a frame's header: one buffer built, not the body copied again behind it)."""
    buffer = io.BytesIO()
    buffer.write(header)
    try:
        entity_writer(type(entity))(buffer, entity)
    except (SerialError, ValueError, TypeError, OverflowError, AttributeError, struct.error) as error:
        raise MessageEncodeError(f"{type(entity).__name__}: {error}") from error
    return buffer.getvalue()


DEFAULT_REGISTRY = MessageRegistry()


def request_type_for(api_key: int, version: int) -> type:
    """The request class of any Kafka API version: the registry's where it carries one (versions
    kio lacks, e.g. DeleteGroups v3), else kio's."""
    if DEFAULT_REGISTRY.serves(api_key, version):
        return DEFAULT_REGISTRY.request_type(api_key, version)
    return load_request_schema(api_key, version)


def response_type_for(api_key: int, version: int) -> type:
    """The response class of any Kafka API version (see :func:`request_type_for`)."""
    if DEFAULT_REGISTRY.serves(api_key, version):
        return DEFAULT_REGISTRY.response_type(api_key, version)
    return load_response_schema(api_key, version)
