"""Small blocking Kafka requests that tell when the local broker is ready and what it offers.

Blocking sockets and kio's message classes, nothing from the proxy itself: the launcher
helps to test the proxy's codec, so it must not depend on it. Versions are ones every
broker we run accepts: ApiVersions v3, Metadata v4 (Kafka 4.0 dropped v0-v3) and, for
the share-groups check, ShareGroupHeartbeat v1.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersionsResponse
from kio.schema.metadata.v4.request import MetadataRequest
from kio.schema.metadata.v4.response import MetadataResponse
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.schema.share_group_heartbeat.v1.response import ShareGroupHeartbeatResponse
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from proxy.localkafka.errors import LocalKafkaError

CLIENT_ID = "ksp-local-kafka-probe"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """What the readiness probe learnt about the broker."""

    api_keys: frozenset[int]
    finalized_features: dict[str, int]
    broker_ids: frozenset[int]


class _Connection:
    """One blocking connection; requests are sent one at a time, as a broker expects."""

    def __init__(self, host: str, port: int, timeout: float, ca_path: Path | None = None) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        if ca_path is not None:
            try:
                context = ssl.create_default_context(cafile=str(ca_path))
                sock = context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self._sock = sock
        self._correlation_id = 0

    def close(self) -> None:
        self._sock.close()

    def call(self, request: Any, response_type: type[Any]) -> Any:
        self._correlation_id += 1
        flexible = type(request).__flexible__
        header_type = RequestHeaderV2 if flexible else RequestHeaderV1
        buffer = io.BytesIO()
        entity_writer(header_type)(
            buffer,
            header_type(
                request_api_key=type(request).__api_key__,
                request_api_version=type(request).__version__,
                correlation_id=i32(self._correlation_id),
                client_id=CLIENT_ID,
            ),
        )
        entity_writer(type(request))(buffer, request)
        payload = buffer.getvalue()
        self._sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", self._recv_exact(4))
        frame = self._recv_exact(size)
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        if correlation_id != self._correlation_id:
            raise LocalKafkaError(f"probe got correlation id {correlation_id}, expected {self._correlation_id}")
        # Response header v0 is the correlation id; v1 (flexible APIs other than ApiVersions)
        # adds an empty tagged-field section, one byte.
        body_offset = 5 if flexible and type(request).__api_key__ != 18 else 4
        response, _ = entity_reader(response_type)(frame[body_offset:], 0)
        return response

    def _recv_exact(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return bytes(data)


def api_versions(host: str, port: int, timeout: float = 2.0, ca_path: Path | None = None) -> BrokerInfo:
    """ApiVersions alone, over TLS when `ca_path` is given: Kafka answers it before SASL
    authentication, so it works on secured listeners too (`broker_ids` is left empty)."""
    connection = _Connection(host, port, timeout, ca_path)
    try:
        versions = connection.call(
            ApiVersionsRequest(client_software_name="ksp-probe", client_software_version="1"),
            ApiVersionsResponse,
        )
    finally:
        connection.close()
    if versions.error_code != 0:
        raise LocalKafkaError(f"ApiVersions answered {versions.error_code!r}")
    return BrokerInfo(
        api_keys=frozenset(int(api.api_key) for api in versions.api_keys),
        finalized_features={feature.name: int(feature.max_version_level) for feature in versions.finalized_features},
        broker_ids=frozenset(),
    )


def probe(host: str, port: int, timeout: float = 2.0) -> BrokerInfo:
    """ApiVersions then Metadata (no topics); raises OSError while the broker is not up."""
    connection = _Connection(host, port, timeout)
    try:
        versions = connection.call(
            ApiVersionsRequest(client_software_name="ksp-probe", client_software_version="1"),
            ApiVersionsResponse,
        )
        if versions.error_code != 0:
            raise LocalKafkaError(f"ApiVersions answered {versions.error_code!r}")
        metadata = connection.call(MetadataRequest(topics=(), allow_auto_topic_creation=False), MetadataResponse)
    finally:
        connection.close()
    return BrokerInfo(
        api_keys=frozenset(int(api.api_key) for api in versions.api_keys),
        finalized_features={feature.name: int(feature.max_version_level) for feature in versions.finalized_features},
        broker_ids=frozenset(int(broker.node_id) for broker in metadata.brokers),
    )


def share_group_heartbeat_error(host: str, port: int, timeout: float = 5.0) -> int:
    """Error code of a first ShareGroupHeartbeat (join) — 35 UNSUPPORTED_VERSION when share groups are off."""
    connection = _Connection(host, port, timeout)
    try:
        response = connection.call(
            ShareGroupHeartbeatRequest(
                group_id=GroupId("ksp-local-kafka-probe"),
                member_id=str(uuid.uuid4()),
                member_epoch=i32(0),
                subscribed_topic_names=(TopicName("ksp-local-kafka-probe"),),
            ),
            ShareGroupHeartbeatResponse,
        )
    finally:
        connection.close()
    return int(response.error_code)

