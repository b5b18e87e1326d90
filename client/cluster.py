"""What the client knows about the cluster behind the proxy: nodes, topics, leaders, extension keys.

Filled from the proxy's own answers: ApiVersions (which APIs, and the extension keys the proxy
advertises as SupportedFeatures, decision 11 of issue 10), Metadata v12 (node endpoints - already
the proxy's listeners - topic ids and partition leaders) and FindCoordinator (the group's
coordinator, key type 0 GROUP, which is where Kafka's share consumers send ShareGroupHeartbeat).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import uuid

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from codec.registry import request_type_for

from .config import ConsumerConfig
from .errors import KafkaError, KafkaException
from .wire import Connection

MARK_IN_PROGRESS_FEATURE = "kafka-share-proxy.mark-in-progress.api-key"
DESCRIBE_IN_FLIGHT_FEATURE = "kafka-share-proxy.describe-in-flight.api-key"
CLIENT_SOFTWARE_NAME = "ksp-python-client"
CLIENT_SOFTWARE_VERSION = "0.1.0"
API_VERSIONS_VERSION = 3  # the first with SupportedFeatures
METADATA_VERSION = 12  # topic ids in requests and answers
FIND_COORDINATOR_VERSION = 6
GROUP_KEY_TYPE = 0


@dataclasses.dataclass(frozen=True, slots=True)
class ExtensionKeys:
    """The extension RPCs' api keys and whether the proxy advertises them in ApiKeys."""

    mark_in_progress: int
    describe_in_flight: int
    mark_in_progress_served: bool
    describe_in_flight_served: bool
    advertised: bool  # taken from SupportedFeatures (else from the configuration)


def api_versions(connection: Connection, timeout_s: float) -> tuple[dict[int, tuple[int, int]], dict[str, tuple[int, int]]]:
    """(api key -> (min, max), feature name -> (min, max)) from ApiVersions v3."""
    request = request_type_for(18, API_VERSIONS_VERSION)(
        client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=CLIENT_SOFTWARE_VERSION)
    response = connection.call(request, timeout_s=timeout_s)
    if int(response.error_code):
        raise KafkaException(KafkaError(int(response.error_code), "ApiVersions failed"))
    keys = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in response.api_keys}
    features = {f.name: (int(f.min_version), int(f.max_version)) for f in (response.supported_features or ())}
    return keys, features


def extension_keys(keys: dict[int, tuple[int, int]], features: dict[str, tuple[int, int]],
                   fallback_mark: int, fallback_describe: int) -> ExtensionKeys:
    """The proxy's advertised extension keys (MinVersion = MaxVersion = the key), else the fallbacks."""
    mark = features.get(MARK_IN_PROGRESS_FEATURE)
    describe = features.get(DESCRIBE_IN_FLIGHT_FEATURE)
    mark_key = mark[1] if mark is not None and mark[0] == mark[1] else fallback_mark
    describe_key = describe[1] if describe is not None and describe[0] == describe[1] else fallback_describe
    return ExtensionKeys(
        mark_in_progress=mark_key,
        describe_in_flight=describe_key,
        mark_in_progress_served=mark_key in keys and keys[mark_key][0] <= 0 <= keys[mark_key][1],
        describe_in_flight_served=describe_key in keys and keys[describe_key][0] <= 0 <= keys[describe_key][1],
        advertised=mark is not None or describe is not None,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    topic_id: uuid.UUID
    partition: int
    leader: int


class Cluster:
    """Nodes, topics and leaders, refreshed from Metadata; thread-safe reads."""

    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self.nodes: dict[int, tuple[str, int]] = {}
        self.topic_ids: dict[str, uuid.UUID] = {}
        self.topic_names: dict[uuid.UUID, str] = {}
        self.leaders: dict[tuple[uuid.UUID, int], int] = {}
        self.extensions: ExtensionKeys | None = None

    def connect_bootstrap(self) -> Connection:
        """A connection to the first reachable bootstrap server."""
        errors = []
        for host, port in self.config.bootstrap_servers:
            try:
                return Connection(host, port, client_id=self.config.client_id,
                                  connect_timeout_s=self.config.socket_connection_setup_timeout_s,
                                  security=self.config.security)
            except KafkaException as error:
                if error.args[0].code() in (KafkaError.AUTHENTICATION, KafkaError.SSL):
                    raise  # another server would refuse the same credentials or certificate
                errors.append(str(error))
        raise KafkaException(KafkaError(KafkaError.TRANSPORT, "no bootstrap server reachable: " + "; ".join(errors)))

    def connect(self, node_id: int) -> Connection:
        with self._lock:
            address = self.nodes.get(node_id)
        if address is None:
            raise KafkaException(KafkaError(KafkaError.TRANSPORT, f"node {node_id} is unknown"))
        return Connection(*address, client_id=self.config.client_id,
                          connect_timeout_s=self.config.socket_connection_setup_timeout_s,
                          security=self.config.security)

    def bootstrap(self) -> None:
        """ApiVersions (extension keys) and a first Metadata, over one bootstrap connection."""
        connection = self.connect_bootstrap()
        try:
            keys, features = api_versions(connection, self.config.request_timeout_s)
            self.extensions = extension_keys(keys, features, self.config.mark_in_progress_api_key,
                                             self.config.describe_in_flight_api_key)
            self._metadata(connection, topics=())
        finally:
            connection.close()

    def refresh(self, topics: list[str] | None) -> None:
        """Metadata for ``topics`` (None: every topic)."""
        connection = self.connect_bootstrap()
        try:
            self._metadata(connection, topics=topics)
        finally:
            connection.close()

    def _metadata(self, connection: Connection, topics: list[str] | tuple[()] | None) -> None:
        schema = load_request_schema(3, METADATA_VERSION)
        module = sys.modules[schema.__module__]
        request = schema(
            topics=None if topics is None else tuple(module.MetadataRequestTopic(topic_id=None, name=t) for t in topics),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        response = connection.call(request, timeout_s=self.config.request_timeout_s)
        with self._lock:
            for broker in response.brokers:
                self.nodes[int(broker.node_id)] = (broker.host, int(broker.port))
            for topic in response.topics:
                if int(topic.error_code) or topic.name is None or topic.topic_id is None:
                    continue
                self.topic_ids[topic.name] = topic.topic_id
                self.topic_names[topic.topic_id] = topic.name
                for partition in topic.partitions:
                    if int(partition.error_code) == 0:
                        self.leaders[(topic.topic_id, int(partition.partition_index))] = int(partition.leader_id)

    def leader(self, topic_id: uuid.UUID, partition: int) -> int | None:
        with self._lock:
            leader = self.leaders.get((topic_id, partition))
        return leader if leader is not None and leader >= 0 else None

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        with self._lock:
            return self.topic_names.get(topic_id)

    def forget_leader(self, topic_id: uuid.UUID, partition: int) -> None:
        with self._lock:
            self.leaders.pop((topic_id, partition), None)

    def find_coordinator(self, group_id: str) -> int:
        """The node id of ``group_id``'s coordinator (its endpoint is recorded in ``nodes``)."""
        connection = self.connect_bootstrap()
        try:
            request = load_request_schema(10, FIND_COORDINATOR_VERSION)(key_type=i8(GROUP_KEY_TYPE),
                                                                        coordinator_keys=(group_id,))
            response = connection.call(request, timeout_s=self.config.request_timeout_s)
        finally:
            connection.close()
        [coordinator] = response.coordinators
        if int(coordinator.error_code):
            raise KafkaException(KafkaError(int(coordinator.error_code),
                                            f"FindCoordinator: {coordinator.error_message or ErrorCode(int(coordinator.error_code)).name}"))
        with self._lock:
            self.nodes[int(coordinator.node_id)] = (coordinator.host, int(coordinator.port))
        return int(coordinator.node_id)


__all__ = ["Cluster", "ExtensionKeys", "PartitionInfo", "api_versions", "extension_keys"]
