"""What the share-group side of the proxy asks the upstream cluster: metadata, offsets, records.

The share service never forwards client bytes; it makes its own requests on its own connections:
Metadata (topic names, ids, partition leaders), ListOffsets (SPSO initialisation) and Fetch by
topic id (the reader: ``fetch_many`` reads every partition a ShareFetch needs with one Fetch per
leader broker, the leaders at once). Connections are pooled per upstream broker; a connection
that fails is dropped, never reused.

Long polls cannot starve the prompt requests. A Fetch with MaxWaitMs > 0 (the service's wait
for new data, up to 5 s) holds its connection for that long, so long polls get their own pool
per broker (``long_poll_connections_per_broker``), apart from the pool that ListOffsets,
ListGroups and the acquisition reads (MaxWaitMs 0) use (``connections_per_broker``). However
many long polls wait, a prompt request only ever queues behind other prompt requests; a long
poll beyond its pool's bound waits for a slot (its caller's deadline still applies). Long polls
for the same partition and offset share one upstream Fetch instead of each taking a connection.
Metadata is asked on a fresh connection of its own (``refresh``), outside both pools.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import structlog
import trio
from kio.index import load_request_schema

# The Fetch versions codec.fetch writes and reads: from v13, the first addressed by topic id, to v17.
from codec.fetch import FIRST_VERSION as FETCH_MIN_VERSION
from codec.fetch import LAST_VERSION as FETCH_MAX_VERSION
from codec.fetch import PartitionFetch, decode_fetch_response, encode_fetch_request
from codec.registry import nested_types
from proxy.config import HostPort
from proxy.errors import UpstreamError
from proxy.security import UpstreamSecurity
from proxy.share import metrics
from proxy.upstream import EncodedRequest, UpstreamClient, open_first_upstream, open_upstream

log = structlog.get_logger(__name__)

METADATA_VERSION = 12  # topic ids and names; served by Kafka 3.x and 4.x alike
LIST_OFFSETS_VERSION = 7  # 3.9 and 4.x
FETCH = 1
LIST_GROUPS = 16
LIST_GROUPS_MAX_VERSION = 5  # v5 reports the group type (classic, consumer, share, streams)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# Kafka error codes this module interprets.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
RETRIABLE_FETCH_ERRORS = frozenset({NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
                                    UNKNOWN_TOPIC_OR_PARTITION})


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionInfo]


@dataclass(slots=True)
class ClusterSnapshot:
    brokers: dict[int, HostPort] = field(default_factory=dict)
    topics_by_name: dict[str, TopicInfo] = field(default_factory=dict)
    topics_by_id: dict[uuid.UUID, TopicInfo] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of an upstream Fetch response; `records` are passed through untouched."""

    error_code: int
    log_start_offset: int
    aborted_transactions: tuple[tuple[int, int], ...]
    records: bytes | memoryview  # a view of the response when it carried this partition's records only
    high_watermark: int = -1  # the partition's end offset as the leader answered (-1 unknown)


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """One partition of an upstream Fetch: where to read from and at most how many bytes."""

    topic: TopicInfo
    partition: int
    offset: int
    max_bytes: int


class _BrokerPool:
    """Idle UpstreamClient connections to one broker, and how many may be open at once."""

    def __init__(self, address: HostPort, limit: int) -> None:
        self.address = address
        self.idle: list[UpstreamClient] = []
        self.slots = trio.Semaphore(limit)


class _SharedPoll:
    """One upstream long poll that several callers wait on."""

    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: FetchedPartition | None = None
        self.error: UpstreamError | None = None


class Cluster:
    """The share service's view of, and its connections to, the upstream cluster."""

    def __init__(
        self,
        bootstrap: Sequence[HostPort],
        *,
        connect_timeout: float = 10.0,
        max_frame_size: int = 256 * 1024 * 1024,
        connections_per_broker: int = 32,
        long_poll_connections_per_broker: int = 8,
        security: UpstreamSecurity | None = None,
    ) -> None:
        if connections_per_broker < 1 or long_poll_connections_per_broker < 1:
            raise ValueError("connection pools need at least one connection per broker")
        self._bootstrap = tuple(bootstrap)
        # Every connection here is the proxy's own: TLS as configured, SASL with the service credentials.
        self._security = security
        self._connect_timeout = connect_timeout
        self._max_frame_size = max_frame_size
        self._per_broker = connections_per_broker
        self._long_poll_per_broker = long_poll_connections_per_broker
        self._pools: dict[int, _BrokerPool] = {}
        self._long_poll_pools: dict[int, _BrokerPool] = {}
        self._long_polls: dict[tuple, _SharedPoll] = {}
        self._refresh_lock = trio.Lock()
        self.snapshot = ClusterSnapshot()
        self.fetch_version = FETCH_MAX_VERSION
        self.list_groups_version: int | None = None  # learned with each refresh, like fetch_version

    # ----- metadata -------------------------------------------------------------------

    async def refresh(self) -> ClusterSnapshot:
        """Refresh brokers and all topics."""
        async with self._refresh_lock:
            _, stream = await open_first_upstream(
                self._bootstrap, timeout=self._connect_timeout, max_frame_size=self._max_frame_size,
                security=self._security, authenticate=True,
            )
            client = UpstreamClient(stream, client_id="kafka-share-proxy-metadata")
            try:
                versions = await client.api_versions()
                fetch_range = versions.get(1, (0, 0))
                self.fetch_version = min(fetch_range[1], FETCH_MAX_VERSION)
                self.list_groups_version = min(versions.get(LIST_GROUPS, (0, 0))[1], LIST_GROUPS_MAX_VERSION)
                if self.fetch_version < FETCH_MIN_VERSION:
                    raise UpstreamError(
                        f"upstream Fetch max version {fetch_range[1]} < {FETCH_MIN_VERSION}: "
                        "share groups need Kafka 3.1 or newer"
                    )
                schema = load_request_schema(3, METADATA_VERSION)
                response = await client.call(
                    schema(topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False)
                )
            finally:
                await client.aclose()
        snapshot = ClusterSnapshot(
            brokers={int(b.node_id): HostPort(b.host, int(b.port)) for b in response.brokers},
        )
        for topic in response.topics:
            if _code(topic.error_code) != NONE or topic.name is None or topic.topic_id is None:
                continue
            snapshot.topics_by_name[topic.name] = TopicInfo(
                topic.name,
                topic.topic_id,
                {int(p.partition_index): PartitionInfo(int(p.leader_id), int(p.leader_epoch))
                 for p in topic.partitions},
            )
        snapshot.topics_by_id = {t.topic_id: t for t in snapshot.topics_by_name.values()}
        self.snapshot = snapshot
        return snapshot

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self.snapshot.topics_by_id.get(topic_id)

    # ----- connections ----------------------------------------------------------------

    @asynccontextmanager
    async def _client(self, node_id: int, *, long_poll: bool = False):
        address = self.snapshot.brokers.get(node_id)
        if address is None:
            raise UpstreamError(f"no upstream broker with node id {node_id}")
        pools, limit = ((self._long_poll_pools, self._long_poll_per_broker) if long_poll
                        else (self._pools, self._per_broker))
        pool = pools.get(node_id)
        if pool is None or pool.address != address:
            if pool is not None:  # the broker moved: its idle connections go
                for stale in pool.idle:
                    await trio.aclose_forcefully(stale)
            pool = pools[node_id] = _BrokerPool(address, limit)
        async with pool.slots:
            client = pool.idle.pop() if pool.idle else None
            while client is not None and client.session_expired():
                # The broker would close it at the end of its SASL session: retire it first.
                await trio.aclose_forcefully(client)
                client = pool.idle.pop() if pool.idle else None
            if client is None:
                stream = await open_upstream(address, timeout=self._connect_timeout,
                                             max_frame_size=self._max_frame_size,
                                             security=self._security, authenticate=True)
                client = UpstreamClient(stream, client_id="kafka-share-proxy-reader")
            healthy = False
            try:
                yield client
                healthy = True
            finally:
                if healthy:
                    pool.idle.append(client)
                else:
                    with trio.CancelScope(shield=True):
                        await client.aclose()

    async def aclose(self) -> None:
        for pool in (*self._pools.values(), *self._long_poll_pools.values()):
            for client in pool.idle:
                with trio.move_on_after(1, shield=True):
                    await client.aclose()
        self._pools.clear()
        self._long_poll_pools.clear()

    # ----- requests -----------------------------------------------------------------

    async def upstream_group_type(self, group_id: str) -> str | None:
        """The type ("classic", "consumer", ...) of a group the upstream cluster knows, else None.

        ListGroups is answered per broker (each lists the groups it coordinates), so every broker
        is asked.
        """
        for node_id in list(self.snapshot.brokers):
            async with self._client(node_id) as client:
                version = self.list_groups_version
                if version is None:  # before the first metadata refresh
                    versions = await client.api_versions()
                    version = min(versions.get(LIST_GROUPS, (0, 0))[1], LIST_GROUPS_MAX_VERSION)
                schema = load_request_schema(LIST_GROUPS, version)
                response = await client.call(schema())
            if _code(response.error_code) != NONE:
                raise UpstreamError(f"ListGroups failed on broker {node_id}: error {_code(response.error_code)}")
            for group in response.groups:
                if group.group_id == group_id:
                    return getattr(group, "group_type", "") or group.protocol_type or "classic"
        return None

    async def has_authorizer(self) -> bool:
        """Whether the cluster runs an authorizer: DescribeAcls on the proxy's own connection answers
        SECURITY_DISABLED exactly when it does not (share authorization's auto mode)."""
        from proxy.share.authorization import describe_acls_request, has_authorizer

        if not self.snapshot.brokers:
            raise UpstreamError("no upstream broker known yet")
        async with self._client(next(iter(self.snapshot.brokers))) as client:
            return has_authorizer(await client.call(describe_acls_request()))

    async def list_offset(self, topic: TopicInfo, partition: int, timestamp: int) -> int:
        """The offset for `timestamp` (LATEST_TIMESTAMP, EARLIEST_TIMESTAMP or a time in ms).

        For a time past the last record Kafka answers -1; we then use the log end (nothing older
        qualifies), as Kafka's share groups do for `by_duration`.
        """
        leader = topic.partitions[partition].leader_id
        schema = load_request_schema(2, LIST_OFFSETS_VERSION)
        types = nested_types(schema)
        topic_type, partition_type = types["ListOffsetsTopic"], types["ListOffsetsPartition"]
        request = schema(
            replica_id=-1,
            isolation_level=0,
            topics=(topic_type(name=topic.name, partitions=(
                partition_type(partition_index=partition, current_leader_epoch=-1, timestamp=timestamp),
            )),),
        )
        async with self._client(leader) as client:
            response = await client.call(request)
        result = response.topics[0].partitions[0]
        if _code(result.error_code) != NONE:
            raise UpstreamError(f"ListOffsets {topic.name}-{partition} failed: error {_code(result.error_code)}")
        offset = int(result.offset)
        if offset < 0 and timestamp >= 0:
            return await self.list_offset(topic, partition, LATEST_TIMESTAMP)
        return offset

    @property
    def long_poll_connections_per_broker(self) -> int:
        """How many long polls may wait on one broker at once; more wait for a connection."""
        return self._long_poll_per_broker

    async def fetch(
        self,
        topic: TopicInfo,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int,
        read_committed: bool,
    ) -> FetchedPartition:
        """Read one partition from its leader, from `offset` (long-polls up to `max_wait_ms`).

        With `max_wait_ms` > 0 the read is a long poll on the long-poll pool. A long poll
        already waiting for the same partition, offset and size is joined rather than
        repeated; a caller still answers by its own deadline (an empty answer, as from an
        upstream long poll that ran out) and, when the shared poll ran out first, waits on.
        """
        if max_wait_ms <= 0:
            return await self._fetch(topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                                     read_committed=read_committed)
        key = (topic.topic_id, partition, offset, max_bytes, read_committed)
        deadline = trio.current_time() + max_wait_ms / 1000
        while True:
            shared = self._long_polls.get(key)
            if shared is None:
                remaining_ms = max(round((deadline - trio.current_time()) * 1000), 0)
                return await self._lead_long_poll(key, topic, partition, offset, max_bytes, remaining_ms,
                                                  read_committed)
            with trio.move_on_at(deadline):
                await shared.done.wait()
            if not shared.done.is_set():
                return FetchedPartition(NONE, -1, (), b"")  # our wait is over; the shared one goes on
            if shared.error is not None:
                raise shared.error
            result = shared.result
            if result is not None and (result.records or result.error_code != NONE
                                       or deadline - trio.current_time() < 0.01):
                return result
            # Its leader was cancelled, or it ran out before our wait would have: poll on.

    async def _lead_long_poll(self, key: tuple, topic: TopicInfo, partition: int, offset: int, max_bytes: int,
                              max_wait_ms: int, read_committed: bool) -> FetchedPartition:
        shared = self._long_polls[key] = _SharedPoll()
        try:
            shared.result = await self._fetch(topic, partition, offset, max_bytes=max_bytes,
                                              max_wait_ms=max_wait_ms, read_committed=read_committed,
                                              long_poll=True)
            return shared.result
        except UpstreamError as exc:
            shared.error = exc
            raise
        finally:
            del self._long_polls[key]
            shared.done.set()

    async def fetch_many(
        self, reads: Sequence[PartitionRead], *, read_committed: bool,
    ) -> dict[tuple[uuid.UUID, int], FetchedPartition | UpstreamError]:
        """Read several partitions at once: one Fetch (MaxWaitMs 0) per leader broker, all leaders
        concurrently. Each partition gets its answer, or the UpstreamError its leader's Fetch raised."""
        answers: dict[tuple[uuid.UUID, int], FetchedPartition | UpstreamError] = {}
        by_leader: dict[int, list[PartitionRead]] = {}
        for read in reads:
            info = read.topic.partitions.get(read.partition)
            if info is None:
                answers[(read.topic.topic_id, read.partition)] = UpstreamError(
                    f"{read.topic.name} has no partition {read.partition}")
            else:
                by_leader.setdefault(info.leader_id, []).append(read)

        async def from_leader(leader_id: int, group: list[PartitionRead]) -> None:
            try:
                answers.update(await self._fetch_from(leader_id, group, max_wait_ms=0, read_committed=read_committed))
            except UpstreamError as exc:
                answers.update({(read.topic.topic_id, read.partition): exc for read in group})

        if len(by_leader) == 1:
            await from_leader(*next(iter(by_leader.items())))
        elif by_leader:
            async with trio.open_nursery() as nursery:
                for leader_id, group in by_leader.items():
                    nursery.start_soon(from_leader, leader_id, group)
        return answers

    async def _fetch(
        self,
        topic: TopicInfo,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int,
        read_committed: bool,
        long_poll: bool = False,
    ) -> FetchedPartition:
        info = topic.partitions.get(partition)
        if info is None:
            raise UpstreamError(f"{topic.name} has no partition {partition}")
        answers = await self._fetch_from(info.leader_id, [PartitionRead(topic, partition, offset, max_bytes)],
                                         max_wait_ms=max_wait_ms, read_committed=read_committed, long_poll=long_poll)
        return answers[(topic.topic_id, partition)]

    async def _fetch_from(
        self, leader_id: int, reads: Sequence[PartitionRead], *, max_wait_ms: int, read_committed: bool,
        long_poll: bool = False,
    ) -> dict[tuple[uuid.UUID, int], FetchedPartition]:
        """One upstream Fetch to `leader_id` for `reads` (partitions it leads), answers by partition."""
        by_topic: dict[uuid.UUID, list[PartitionFetch]] = {}
        for read in reads:
            by_topic.setdefault(read.topic.topic_id, []).append(PartitionFetch(
                read.partition, read.topic.partitions[read.partition].leader_epoch, read.offset, read.max_bytes))
        request = EncodedRequest(FETCH, self.fetch_version, encode_fetch_request(
            self.fetch_version, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=sum(read.max_bytes for read in reads),
            isolation_level=1 if read_committed else 0, topics=list(by_topic.items())))
        async with self._client(leader_id, long_poll=long_poll) as client:
            response = await client.call(request, read=decode_fetch_response)
        (_LONG_POLL_FETCHES if long_poll else _READ_FETCHES).inc()
        metrics.UPSTREAM_FETCH_PARTITIONS.inc(len(reads))
        if response.error_code != NONE:
            raise UpstreamError(f"Fetch failed: error {response.error_code}")
        # Records stay a view of the response frame (no ~1 MB copy per read) when they are all it
        # carries; records of several partitions are copied out, or a small cached remainder of
        # one would keep the whole frame alive, uncounted by the read cache's byte budget.
        keep_view = sum(1 for data in response.partitions if data.records) == 1
        answers: dict[tuple[uuid.UUID, int], FetchedPartition] = {
            (data.topic_id, data.partition_index): FetchedPartition(
                error_code=data.error_code,
                log_start_offset=data.log_start_offset,
                aborted_transactions=data.aborted_transactions or (),
                records=(data.records if keep_view else bytes(data.records)) if data.records else b"",
                high_watermark=data.high_watermark,
            )
            for data in response.partitions
        }
        metrics.UPSTREAM_FETCH_BYTES.inc(sum(len(answer.records) for answer in answers.values()))
        for read in reads:  # a partition the broker left out read nothing
            answers.setdefault((read.topic.topic_id, read.partition), FetchedPartition(NONE, -1, (), b""))
        return answers


_READ_FETCHES = metrics.UPSTREAM_FETCHES.labels(kind="read")
_LONG_POLL_FETCHES = metrics.UPSTREAM_FETCHES.labels(kind="long_poll")


def _code(error_code: object) -> int:
    return int(getattr(error_code, "value", error_code))

