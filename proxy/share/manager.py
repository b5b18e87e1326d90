"""The share-group service: share-partition leaders, sessions, fetch/ack orchestration, timers.

Theory of operation
-------------------
One :class:`ShareService` serves every share group of the proxy. It owns

* the pure decision cores: :class:`ShareGroupCoordinator` (membership, assignment),
  :class:`ShareSessionCache` (share sessions bound to client connections) and one
  :class:`SharePartition` engine per share-partition (group, topic id, partition);
* the edges: :class:`Cluster` (metadata, ListOffsets and Fetch against the upstream brokers)
  and :class:`StateLogWriter` (durable state on the compacted state topic).

All engine calls happen on the trio thread between awaits, so each is atomic without locks.

**ShareFetch** (KIP-932 "ShareFetch"): session step; piggybacked acknowledgements applied and made
durable; then, for the session's partitions in rotating order, read the log upstream from the
engine's ``next_fetch_offset()`` and let the engine acquire records from those batch headers.
The batches overlapping the acquired ranges are returned as the raw bytes the broker sent
(never decoded or re-encoded); the client filters records by the AcquiredRecords ranges. When
nothing can be acquired, the request long-polls until MaxWaitMs, waking early when a partition
signals new work (released or expired records) or the upstream long-poll returns new data.

**Acknowledgements** (ShareAcknowledge or piggybacked) are applied to the engine atomically per
partition and answered only once the partition's state is durable. Durability is group-committed:
changed partitions are marked dirty and one writer task writes a snapshot record per dirty
partition in one producer batch; every waiter whose change is covered is then released. A failed
write answers the acknowledgement with a retriable error (never a silent success); the state
stays in memory and the next successful snapshot of the partition covers it.

**Timers**: one task sleeps until the earliest acquisition-lock deadline or member session
deadline, then expires locks (records become Available again, or Archived at the delivery limit)
and members (their records are released without counting a delivery).

**Connections**: share sessions are bound to the connection that last used them; when it closes,
its sessions are evicted and their members' acquired records released (no delivery counted).
"""

from __future__ import annotations

import datetime
import functools
import itertools
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields

import structlog
import trio
from kio.schema.errors import ErrorCode

from codec.errors import RecordBatchError
from codec.records import RecordBatchHeader, iter_batches
from codec.registry import DEFAULT_REGISTRY, nested_types
from proxy.errors import UpstreamError
from proxy.share import metrics, state_store
from proxy.share.assignor import TopicIdPartition
from proxy.share.cluster import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NONE,
    OFFSET_OUT_OF_RANGE,
    RETRIABLE_FETCH_ERRORS,
    Cluster,
    TopicInfo,
)
from proxy.share.coordinator import (
    AssignmentChanged,
    CoordinatorConfig,
    GroupEpochBumped,
    MemberDeparted,
    PartitionsDeleted,
    PartitionsToInitialize,
    ShareGroupCoordinator,
    describe_response,
    heartbeat_response,
)
from proxy.share.coordinator import TopicInfo as CoordinatorTopic
from proxy.share.partition import (
    AckRange,
    AcquireMode,
    PartitionConfig,
    SharePartition,
    ShareStateError,
)
from proxy.share.persister import PersistError, StateLogWriter
from proxy.share.sessions import ContextKind, ShareSessionCache, ShareSessionError

log = structlog.get_logger(__name__)

SharePartitionKey = tuple[str, uuid.UUID, int]
Clock = Callable[[], int]

FIRST_FETCH_BYTES = 1024 * 1024  # until the partition's record size is known
MIN_FETCH_BYTES = 64 * 1024
# Fetch failures that mean our metadata may be stale trigger a refresh at most this often.
STALE_METADATA_REFRESH_S = 0.5


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class ShareServiceConfig:
    state_topic: str = "__share_proxy_state"
    max_share_sessions: int = 2000
    metadata_refresh_interval_s: float = 10.0
    max_fetch_bytes_per_partition: int = 8 * 1024 * 1024
    coordinator: CoordinatorConfig = CoordinatorConfig()


@dataclass(eq=False, slots=True)
class _Leader:
    """One share-partition led by this proxy."""

    key: SharePartitionKey
    engine: SharePartition
    create_timestamp: int
    snapshot_epoch: int = 0
    state_epoch: int = 0
    version: int = 0  # bumps on every change that must become durable
    durable: int = 0  # the highest version known durable
    failed: int = 0  # the highest version whose write failed
    settled: trio.Event = field(default_factory=trio.Event)
    # Log bytes per record, learned from fetches: a fetch reads about what it can acquire, not
    # max_bytes (a fetch acquiring 500 records must not pull 8 MiB from the broker and drop most).
    bytes_per_record: float = 0.0
    # One upstream read per share-partition at a time: members fetching the same partition
    # queue here and then take their records from what the read brought in (the cache)
    # instead of each reading -- and mostly discarding -- the same log bytes.
    read_lock: trio.Lock = field(default_factory=trio.Lock)
    readers_waiting: int = 0
    cache: _ReadCache | None = None


@dataclass(frozen=True, slots=True)
class _ReadCache:
    """The batches of the last upstream read of a share-partition, kept until taken."""

    records: bytes
    batches: tuple[RecordBatchHeader, ...]
    aborted_transactions: tuple[tuple[int, int], ...]

    def batches_from(self, offset: int) -> tuple[RecordBatchHeader, ...]:
        """The cached batches holding `offset` and after, or () when `offset` is not cached."""
        if not self.batches or not self.batches[0].base_offset <= offset <= self.batches[-1].last_offset:
            return ()
        return tuple(b for b in self.batches if b.last_offset >= offset)


_BUSY = object()  # _fetch_partition(wait=False): another fetch is reading this partition


class _Wakeup:
    """A re-armable broadcast: waiters see every `fire()` after they started waiting."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    @property
    def event(self) -> trio.Event:
        return self._event


class ShareService:
    def __init__(
        self,
        cluster: Cluster,
        writer: StateLogWriter,
        config: ShareServiceConfig = ShareServiceConfig(),
        *,
        clock: Clock = wall_clock_ms,
        advertised_endpoint: Callable[[int], tuple[str, int]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.writer = writer
        self.config = config
        self.clock = clock
        # node id -> the proxy's (host, port) for that broker: leader hints never leak upstream addresses.
        self.advertised_endpoint = advertised_endpoint
        self.coordinator = ShareGroupCoordinator(config.coordinator)
        self.sessions = ShareSessionCache(config.max_share_sessions)
        self.leaders: dict[SharePartitionKey, _Leader] = {}
        self._initializing: dict[SharePartitionKey, trio.Event] = {}
        self._dirty: set[_Leader] = set()
        self._dirty_groups: dict[str, list[tuple[bytes, bytes | None]]] = {}
        self._dirty_wakeup = trio.Event()
        self._timer_wakeup = trio.Event()
        self._timer_due = 0  # clock ms at which the timer task next wakes unless woken earlier
        self._work = _Wakeup()  # fired when records may have become acquirable anywhere
        self._watched_connections: set[int] = set()
        self._rotation = itertools.count()
        self._nursery: trio.Nursery | None = None
        self._group_created: dict[str, int] = {}
        self._last_refresh = 0.0
        self._stale_refresh_pending = False
        self._stale_refresh_at = float("-inf")

    # ----- lifecycle -----------------------------------------------------------------

    def restore(self, recovered: state_store.RecoveredState) -> None:
        """Serve from replayed state: groups (no members; they rejoin) and share-partitions."""
        for group_id, group in recovered.groups.items():
            self.coordinator.restore_group(
                group_id,
                group_epoch=group.group_epoch,
                initialized=[(t, p) for t, p in group.initialized],
                config_overrides=group.configs or None,
            )
        for key, partition in recovered.partitions.items():
            engine = SharePartition.from_persisted(
                self._partition_config(key[0]), partition.snapshot, partition.updates
            )
            self.leaders[key] = _Leader(
                key,
                engine,
                create_timestamp=partition.create_timestamp,
                snapshot_epoch=partition.snapshot_epoch,
                state_epoch=partition.state_epoch,
            )
        log.info("share state restored", groups=len(recovered.groups), partitions=len(recovered.partitions),
                 skipped_records=recovered.skipped)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self.cluster.refresh()
                self._last_refresh = trio.current_time()
                self.coordinator.update_topic_metadata(self._coordinator_topics(), self.clock())
            except UpstreamError as exc:
                log.warning("upstream metadata unavailable at start", error=str(exc))
            nursery.start_soon(self._writer_loop)
            nursery.start_soon(self._timer_loop)
            nursery.start_soon(self._metadata_loop)
            task_status.started()

    async def aclose(self) -> None:
        """Write what is still dirty, then close the writer and upstream connections."""
        if self._dirty or self._dirty_groups:
            self._dirty_wakeup.set()
        # Dirty leaders and those whose write is in flight (taken off `_dirty` by the writer).
        for leader in [lead for lead in self.leaders.values() if lead.durable < lead.version]:
            try:
                await self._durable(leader, leader.version)
            except PersistError:
                pass  # already answered as failed; nothing more can be done at shutdown
        await self.writer.aclose()
        await self.cluster.aclose()

    # ----- helpers --------------------------------------------------------------------

    def _partition_config(self, group_id: str) -> PartitionConfig:
        group = self.coordinator.group_config(group_id)
        return PartitionConfig(
            delivery_count_limit=group.delivery_count_limit,
            record_lock_duration_ms=group.record_lock_duration_ms,
            max_record_locks=group.partition_max_record_locks,
            read_committed=group.isolation_level == "read_committed",
        )

    def _coordinator_topics(self) -> list[CoordinatorTopic]:
        return [
            CoordinatorTopic(t.name, t.topic_id, len(t.partitions))
            for t in self.cluster.snapshot.topics_by_name.values()
        ]

    def _changed(self, leader: _Leader) -> int:
        """Note a change that must become durable; returns the version to wait for."""
        leader.version += 1
        self._dirty.add(leader)
        self._dirty_wakeup.set()
        return leader.version

    async def _durable(self, leader: _Leader, version: int) -> None:
        while leader.durable < version:
            if leader.failed >= version:
                raise PersistError(f"state write for {leader.key} failed")
            await leader.settled.wait()

    def _queue_group_records(self, group_id: str, records: list[tuple[bytes, bytes | None]]) -> None:
        self._dirty_groups.setdefault(group_id, []).extend(records)
        self._dirty_wakeup.set()

    # ----- background tasks ---------------------------------------------------------

    async def _writer_loop(self) -> None:
        while True:
            await self._dirty_wakeup.wait()
            self._dirty_wakeup = trio.Event()
            leaders, self._dirty = self._dirty, set()
            groups, self._dirty_groups = self._dirty_groups, {}
            now = self.clock()
            batch: list[tuple[bytes, bytes | None]] = []
            covered: list[tuple[_Leader, int]] = []
            for group_records in groups.values():
                batch.extend(group_records)
            for leader in leaders:
                leader.snapshot_epoch += 1
                batch.append(
                    state_store.snapshot_record(
                        leader.key,
                        leader.engine.snapshot(),
                        snapshot_epoch=leader.snapshot_epoch,
                        state_epoch=leader.state_epoch,
                        create_timestamp=leader.create_timestamp,
                        write_timestamp=now,
                    )
                )
                covered.append((leader, leader.version))
            try:
                await self.writer.write(self.config.state_topic, batch)
                metrics.STATE_WRITES.labels(outcome="ok").inc()
                for leader, version in covered:
                    leader.durable = max(leader.durable, version)
            except PersistError as exc:
                metrics.STATE_WRITES.labels(outcome="failed").inc()
                log.error("state write failed", error=str(exc), partitions=len(covered))
                for leader, version in covered:
                    leader.failed = max(leader.failed, version)
                # Group records are re-queued: they carry no waiters, only eventual durability.
                for group_id, group_records in groups.items():
                    self._dirty_groups.setdefault(group_id, [])[:0] = group_records
                if groups:
                    await trio.sleep(0.5)
                    self._dirty_wakeup.set()
            for leader, _ in covered:
                leader.settled.set()
                leader.settled = trio.Event()

    async def _timer_loop(self) -> None:
        while True:
            now = self.clock()
            self._expire(now)
            deadlines = [d for d in (lead.engine.next_deadline() for lead in self.leaders.values()) if d is not None]
            member_deadline = self.coordinator.next_deadline()
            if member_deadline is not None:
                deadlines.append(member_deadline)
            now = self.clock()
            self._timer_due = min([*deadlines, now + 1000])  # re-checked at least every second
            with trio.move_on_after(max(0, self._timer_due - now) / 1000):
                await self._timer_wakeup.wait()
            self._timer_wakeup = trio.Event()

    def _wake_timer(self, deadline: int | None) -> None:
        """Wake the timer task for a new `deadline` only if it falls before the task's own wake-up:
        each timer pass walks every share-partition, so it must not run on every acquisition."""
        if deadline is not None and deadline < self._timer_due:
            self._timer_wakeup.set()

    def _expire(self, now: int) -> None:
        released = False
        for leader in self.leaders.values():
            deadline = leader.engine.next_deadline()
            if deadline is not None and deadline <= now:
                delta = leader.engine.expire(now)
                released = True
                if delta is not None:
                    self._changed(leader)
        self._handle_events(self.coordinator.expire(now))
        if released:
            self._work.fire()

    async def _metadata_loop(self) -> None:
        while True:
            await trio.sleep(self.config.metadata_refresh_interval_s)
            await self._refresh_metadata()

    def _refresh_stale_metadata(self) -> None:
        """Refresh metadata in the background after a fetch found it stale (e.g. a leader of -1
        seen while the broker restarted): one refresh at a time, at most every
        STALE_METADATA_REFRESH_S, so a burst of failing fetches costs one refresh, not one each."""
        if self._stale_refresh_pending or self._nursery is None:
            return
        self._stale_refresh_pending = True

        async def refresh() -> None:
            try:
                await trio.sleep_until(self._stale_refresh_at + STALE_METADATA_REFRESH_S)
                self._stale_refresh_at = trio.current_time()
                await self._refresh_metadata()
            finally:
                self._stale_refresh_pending = False

        self._nursery.start_soon(refresh)

    async def _refresh_metadata(self) -> None:
        try:
            await self.cluster.refresh()
        except UpstreamError as exc:
            log.warning("metadata refresh failed", error=str(exc))
            return
        self._last_refresh = trio.current_time()
        self._handle_events(self.coordinator.update_topic_metadata(self._coordinator_topics(), self.clock()))

    # ----- coordinator events ---------------------------------------------------------

    def _handle_events(self, events: Iterable[object]) -> None:
        for event in events:
            if isinstance(event, MemberDeparted):
                # The share session stays: it belongs to the connection, and a client may still
                # send its final ShareAcknowledge after leaving (librdkafka leaves first).
                self._release_member(event.group_id, event.member_id)
            elif isinstance(event, PartitionsToInitialize):
                assert self._nursery is not None
                self._nursery.start_soon(self._initialize_partitions, event.group_id, event.partitions)
            elif isinstance(event, GroupEpochBumped):
                created = self._group_created.setdefault(event.group_id, self.clock())
                self._queue_group_records(
                    event.group_id, [state_store.group_metadata_record(event.group_id, event.group_epoch, created)]
                )
            elif isinstance(event, PartitionsDeleted):
                for tp in event.partitions:
                    key = (event.group_id, tp[0], tp[1])
                    if self.leaders.pop(key, None) is not None:
                        self._queue_group_records(event.group_id, [state_store.partition_tombstone(key)])
            elif isinstance(event, AssignmentChanged):
                pass  # assignments travel in heartbeat responses; nothing to do here

    def _release_member(self, group_id: str, member_id: str) -> None:
        """Release everything `member_id` holds in `group_id` (no delivery counted)."""
        released = False
        for key, leader in self.leaders.items():
            if key[0] != group_id:
                continue
            delta = leader.engine.release_member(member_id)
            if delta is not None:
                self._changed(leader)
                released = True
        if released:
            self._work.fire()

    async def _initialize_partitions(self, group_id: str, partitions: Iterable[TopicIdPartition]) -> None:
        done = []
        for tp in partitions:
            try:
                await self._ensure_leader((group_id, tp[0], tp[1]))
                done.append(tp)
            except (UpstreamError, PersistError) as exc:
                log.warning("share-partition initialisation failed", group=group_id, topic_id=str(tp[0]),
                            partition=tp[1], error=str(exc))
                self.coordinator.initialization_failed(group_id, [tp])
        if done:
            self.coordinator.mark_initialized(group_id, done)
            topic_names = {t.topic_id: t.name for t in self.cluster.snapshot.topics_by_id.values()}
            self._queue_group_records(
                group_id,
                [state_store.group_partitions_record(
                    group_id, [(t[0], t[1]) for t in self.coordinator.initialized_partitions(group_id)],
                    topic_names,
                )],
            )

    async def _ensure_leader(self, key: SharePartitionKey) -> _Leader:
        """The leader of `key`, initialising its SPSO from share.auto.offset.reset if it is new."""
        leader = self.leaders.get(key)
        if leader is not None:
            return leader
        pending = self._initializing.get(key)
        if pending is not None:
            await pending.wait()
            leader = self.leaders.get(key)
            if leader is None:
                raise UpstreamError(f"initialisation of {key} failed")
            return leader
        pending = self._initializing[key] = trio.Event()
        try:
            group_id, topic_id, partition = key
            topic = self.cluster.topic_by_id(topic_id)
            if topic is None:
                raise UpstreamError(f"unknown topic id {topic_id}")
            reset = self.coordinator.group_config(group_id).auto_offset_reset
            if reset.strategy == "earliest":
                timestamp = EARLIEST_TIMESTAMP
            elif reset.strategy == "latest":
                timestamp = LATEST_TIMESTAMP
            else:
                timestamp = self.clock() - (reset.duration_ms or 0)
            start = await self.cluster.list_offset(topic, partition, timestamp)
            leader = _Leader(key, SharePartition(self._partition_config(group_id), start),
                             create_timestamp=self.clock())
            await self._durable(leader, self._changed(leader))
            self.leaders[key] = leader
            log.info("share-partition initialised", group=group_id, topic=topic.name, partition=partition,
                     start_offset=start)
            return leader
        finally:
            del self._initializing[key]
            pending.set()

    # ----- connections ----------------------------------------------------------------

    def watch_connection(self, connection_id: int, closed: trio.Event) -> None:
        """Release a connection's sessions when it closes (KIP-932: sessions are per connection)."""
        if connection_id in self._watched_connections or self._nursery is None:
            return
        self._watched_connections.add(connection_id)

        async def watch() -> None:
            await closed.wait()
            self._watched_connections.discard(connection_id)
            for session in self.sessions.connection_closed(connection_id):
                log.debug("share session evicted with its connection", group=session.key.group_id,
                          member=session.key.member_id)
                self._release_member(session.key.group_id, session.key.member_id)

        self._nursery.start_soon(watch)

    # ----- ShareGroupHeartbeat / ShareGroupDescribe -------------------------------------

    async def heartbeat(self, request, *, client_id: str, client_host: str):
        subscribed = request.subscribed_topic_names
        if subscribed and any(name not in self.cluster.snapshot.topics_by_name for name in subscribed):
            # A topic the proxy has not seen yet: refresh (at most once a second) before assigning.
            # Within that second wait instead of skipping: a skipped refresh leaves the member
            # without an assignment for a whole heartbeat interval.
            await trio.sleep_until(self._last_refresh + 1.0)
            if trio.current_time() - self._last_refresh >= 1.0:
                await self._refresh_metadata()
        other_type = False
        if int(request.member_epoch) == 0 and not self.coordinator.has_group(request.group_id):
            # One group-id namespace: a new share group must not shadow an upstream group.
            try:
                other_type = await self.cluster.upstream_group_type(request.group_id) is not None
            except UpstreamError as exc:
                log.warning("cannot check upstream groups", group=request.group_id, error=str(exc))
        result = self.coordinator.heartbeat(
            request.group_id,
            request.member_id,
            int(request.member_epoch),
            self.clock(),
            rack_id=request.rack_id,
            subscribed_topic_names=subscribed,
            client_id=client_id,
            client_host=client_host,
            group_is_other_type=other_type,
        )
        self._handle_events(result.events)
        self._wake_timer(self.coordinator.next_deadline())
        return heartbeat_response(result)

    def describe(self, request):
        return describe_response(self.coordinator.describe(request.group_ids))

    # ----- acknowledgements -------------------------------------------------------------

    async def _acknowledge(
        self, group_id: str, member_id: str, topics: Iterable[object]
    ) -> dict[tuple[uuid.UUID, int], tuple[ErrorCode, str | None]]:
        """Apply acknowledgement batches per partition, then wait until they are durable."""
        results, waits = self._apply_acknowledgements(group_id, member_id, topics)
        await self._await_durable(results, waits)
        return results

    def _apply_acknowledgements(
        self, group_id: str, member_id: str, topics: Iterable[object]
    ) -> tuple[dict[tuple[uuid.UUID, int], tuple[ErrorCode, str | None]], list[tuple[tuple[uuid.UUID, int], _Leader, int]]]:
        """Apply acknowledgement batches to the engines (atomic per partition, in memory).

        Returns the per-partition results and the state versions that must be durable before
        any of those results may be reported as a success.
        """
        results: dict[tuple[uuid.UUID, int], tuple[ErrorCode, str | None]] = {}
        waits: list[tuple[tuple[uuid.UUID, int], _Leader, int]] = []
        now = self.clock()
        released = False
        for topic in topics:
            for partition in topic.partitions:
                tp = (topic.topic_id, int(partition.partition_index))
                batches = partition.acknowledgement_batches
                if not batches:
                    continue
                leader = self.leaders.get((group_id, *tp))
                if leader is None:
                    code = (ErrorCode.unknown_topic_or_partition if self.cluster.topic_by_id(tp[0]) is None
                            else ErrorCode.invalid_record_state)
                    results[tp] = (code, "No records are acquired on this share-partition.")
                    continue
                ranges = [
                    AckRange(int(b.first_offset), int(b.last_offset), tuple(int(t) for t in b.acknowledge_types))
                    for b in batches
                ]
                try:
                    delta = leader.engine.acknowledge(member_id, ranges, now=now)
                except ShareStateError as exc:
                    results[tp] = (ErrorCode(exc.error_code), str(exc))
                    continue
                results[tp] = (ErrorCode.none, None)
                # Any acknowledgement may free record locks, so waiting fetches re-check (Kafka
                # completes delayed share fetches on every acknowledgement, not only on release).
                released = True
                if delta is not None or leader.durable < leader.version:
                    # Also when nothing changed now but an earlier write of this partition failed
                    # (e.g. this is the client's retry): answer only once the state is durable.
                    waits.append((tp, leader, self._changed(leader)))
        if released:
            self._work.fire()
        return results, waits

    async def _await_durable(self, results, waits) -> None:
        """Turn each result whose state write failed into a retriable error."""
        for tp, leader, version in waits:
            try:
                await self._durable(leader, version)
            except PersistError as exc:
                results[tp] = (ErrorCode.kafka_storage_error,
                               f"The acknowledgement could not be made durable; retry. ({exc})")
        metrics.ACKNOWLEDGEMENTS.inc(sum(1 for code, _ in results.values() if code is ErrorCode.none))

    # ----- ShareFetch ---------------------------------------------------------------------

    async def share_fetch(self, request, version: int, connection_id: int):
        response_type = DEFAULT_REGISTRY.response_type(78, version)
        group_id, member_id = request.group_id, request.member_id
        if not group_id or not member_id:
            return _fetch_error(response_type, ErrorCode.invalid_request, "GroupId and MemberId are required.")
        fetch_partitions = [
            (t.topic_id, int(p.partition_index)) for t in request.topics for p in t.partitions
        ]
        forgotten = [
            (t.topic_id, int(p)) for t in request.forgotten_topics_data for p in t.partitions
        ]
        has_acks = any(p.acknowledgement_batches for t in request.topics for p in t.partitions)
        try:
            context = self.sessions.share_fetch(
                group_id, member_id, int(request.share_session_epoch), connection_id,
                fetch_partitions=fetch_partitions, forgotten_partitions=forgotten, has_acknowledgements=has_acks,
            )
        except ShareSessionError as exc:
            return _fetch_error(response_type, exc.code, str(exc))

        ack_results, ack_waits = (self._apply_acknowledgements(group_id, member_id, request.topics)
                                  if has_acks else ({}, []))
        lock_ms = self.coordinator.group_config(group_id).record_lock_duration_ms

        if context.kind is ContextKind.FINAL:
            await self._await_durable(ack_results, ack_waits)
            self._release_member(group_id, member_id)
            return _fetch_response(response_type, {}, ack_results, lock_ms, self.cluster, self.advertised_endpoint)
        if context.replaced is not None:
            self._release_member(group_id, member_id)

        # The state write of the acknowledgements and the read of new records overlap: the
        # response goes out when both are done, so an acknowledgement is still reported only
        # once durable, but the fetch does not wait behind the write.
        fetched: dict[tuple[uuid.UUID, int], _Fetched] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._await_durable, ack_results, ack_waits)
            if not getattr(request, "is_renew_ack", False):
                fetched = await self._fetch_records(request, context.session.partitions, group_id, member_id,
                                                    version)
        return _fetch_response(response_type, fetched, ack_results, lock_ms, self.cluster, self.advertised_endpoint)

    async def _fetch_records(self, request, partitions, group_id: str, member_id: str, version: int):
        max_records = int(getattr(request, "max_records", 0) or 0) or 500
        batch_size = int(getattr(request, "batch_size", 0) or 0) or None
        mode = AcquireMode(int(getattr(request, "share_acquire_mode", 0) or 0))
        max_bytes = int(request.max_bytes) if request.max_bytes else 50 * 1024 * 1024
        max_wait_ms = int(request.max_wait.total_seconds() * 1000)
        deadline = trio.current_time() + max_wait_ms / 1000
        order = sorted(partitions, key=lambda tp: (str(tp[0]), tp[1]))
        if order:
            shift = next(self._rotation) % len(order)
            order = order[shift:] + order[:shift]  # rotate so no partition starves
        results: dict[tuple[uuid.UUID, int], _Fetched] = {}
        while True:
            work = self._work.event
            idle_partitions = []
            remaining_records, remaining_bytes = max_records, max_bytes
            busy = []
            for tp, wait in _passes(order, results, busy):
                if remaining_records <= 0 or remaining_bytes <= 0:
                    break
                outcome = await self._fetch_partition(group_id, member_id, tp, remaining_records, remaining_bytes,
                                                      batch_size, mode, wait=wait)
                if outcome is _BUSY:
                    busy.append(tp)
                    continue
                if outcome is None:
                    continue
                if outcome.idle_at is not None:
                    idle_partitions.append((tp, outcome.idle_at))
                if outcome.count or outcome.error is not ErrorCode.none:
                    results[(tp[0], tp[1])] = outcome
                    remaining_records -= outcome.count
                    remaining_bytes -= len(outcome.records)
            if any(r.count for r in results.values()) or trio.current_time() >= deadline or not order:
                return results
            if any(r.error is not ErrorCode.none for r in results.values()):
                return results
            await self._wait_for_work(work, idle_partitions, group_id, deadline)

    async def _wait_for_work(self, work: trio.Event, idle_partitions, group_id: str, deadline: float) -> None:
        """Sleep until records may be acquirable: a release/expiry, new upstream data, or the deadline."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                async def on_work() -> None:
                    await work.wait()
                    nursery.cancel_scope.cancel()

                async def on_new_data(tp: TopicIdPartition, offset: int) -> None:
                    topic = self.cluster.topic_by_id(tp[0])
                    if topic is None:
                        return
                    wait_ms = int(max(0.0, min(deadline - trio.current_time(), 5.0)) * 1000)
                    try:
                        data = await self.cluster.fetch(topic, tp[1], offset, max_bytes=1,
                                                        max_wait_ms=wait_ms, read_committed=False)
                    except UpstreamError:
                        await trio.sleep(0.2)
                    else:
                        if not data.records and data.error_code == NONE:
                            return  # upstream long-poll ran out: the next round re-checks the deadline
                    nursery.cancel_scope.cancel()

                nursery.start_soon(on_work)
                for tp, offset in idle_partitions[:4]:
                    nursery.start_soon(on_new_data, tp, offset)
                if not idle_partitions:
                    # Nothing to long-poll upstream (e.g. the record-lock limit is reached):
                    # re-check periodically in case a partition appeared.
                    await trio.sleep(0.5)
                    nursery.cancel_scope.cancel()

    async def _fetch_partition(
        self, group_id: str, member_id: str, tp: TopicIdPartition, max_records: int, max_bytes: int,
        batch_size: int | None, mode: AcquireMode, *, wait: bool = True,
    ):
        topic = self.cluster.topic_by_id(tp[0])
        if topic is None:
            await self._refresh_metadata()
            topic = self.cluster.topic_by_id(tp[0])
            if topic is None:
                return _Fetched(error=ErrorCode.unknown_topic_id, message="Unknown topic id.")
        if tp[1] not in topic.partitions:
            return _Fetched(error=ErrorCode.unknown_topic_or_partition, message="Unknown partition.")
        key = (group_id, tp[0], tp[1])
        try:
            leader = await self._ensure_leader(key)
        except (UpstreamError, PersistError) as exc:
            return _Fetched(error=ErrorCode.coordinator_not_available, message=str(exc))
        if not leader.engine.can_acquire():
            return None  # record-lock limit reached and nothing released in the window
        if not wait and leader.read_lock.locked():
            return _BUSY
        leader.readers_waiting += 1
        queued = True
        try:
            async with leader.read_lock:
                leader.readers_waiting -= 1
                queued = False
                return await self._read_and_acquire(leader, topic, tp, member_id, max_records, max_bytes,
                                                    batch_size, mode)
        finally:
            if queued:  # cancelled while waiting for the lock
                leader.readers_waiting -= 1

    async def _read_and_acquire(
        self, leader: _Leader, topic: TopicInfo, tp: TopicIdPartition, member_id: str, max_records: int,
        max_bytes: int, batch_size: int | None, mode: AcquireMode,
    ) -> _Fetched | None:
        engine = leader.engine
        if not engine.can_acquire():
            return None
        offset = engine.next_fetch_offset()
        cached = leader.cache.batches_from(offset) if leader.cache is not None else ()
        if cached:
            assert leader.cache is not None
            records, batches, aborted = leader.cache.records, cached, leader.cache.aborted_transactions
        else:
            leader.cache = None
            fetched = await self._read(leader, topic, tp, offset, max_records, max_bytes)
            if not isinstance(fetched, tuple):
                return fetched
            records, batches, aborted = fetched
            leader.cache = _ReadCache(records, batches, aborted)
        result = engine.acquire(
            member_id, batches, now=self.clock(), max_records=max_records, batch_size=batch_size, mode=mode,
            aborted_transactions=aborted,
        )
        if result.delta is not None:
            self._changed(leader)  # archived control/aborted records: durable eventually
        if not result.acquired:
            return None
        self._wake_timer(engine.next_deadline())
        acquired = result.acquired
        lo, hi = acquired[0].first_offset, acquired[-1].last_offset
        if hi >= batches[-1].last_offset:
            leader.cache = None  # all taken: free the bytes
        view = memoryview(records)
        chunks = [
            view[b.position:b.position + b.size]
            for b in batches
            if b.last_offset >= lo and b.base_offset <= hi and not b.is_control
        ]
        metrics.RECORDS_ACQUIRED.inc(result.count)
        return _Fetched(records=b"".join(chunks), acquired=acquired, count=result.count,
                        leader_id=topic.partitions[tp[1]].leader_id,
                        leader_epoch=topic.partitions[tp[1]].leader_epoch)

    async def _read(
        self, leader: _Leader, topic: TopicInfo, tp: TopicIdPartition, offset: int, max_records: int, max_bytes: int,
    ):
        """Read the log upstream from `offset`: (records, batches, aborted) or a _Fetched/None outcome."""
        engine = leader.engine
        read_bytes = min(max_bytes, self.config.max_fetch_bytes_per_partition)
        if leader.bytes_per_record:
            # Read for the members queued behind this read too; they take from the cache.
            wanted = max_records * (1 + leader.readers_waiting) * leader.bytes_per_record * 1.25
            read_bytes = min(read_bytes, max(MIN_FETCH_BYTES, int(wanted)))
        else:
            read_bytes = min(read_bytes, FIRST_FETCH_BYTES)
        try:
            data = await self.cluster.fetch(topic, tp[1], offset, max_bytes=max(read_bytes, 1),
                                            max_wait_ms=0, read_committed=engine.config.read_committed)
        except UpstreamError as exc:
            log.warning("upstream fetch failed", topic=topic.name, partition=tp[1], error=str(exc))
            # Without a refresh a leader seen as -1 (or a moved broker) would fail every fetch
            # until the periodic refresh, while clients retry at once.
            self._refresh_stale_metadata()
            return _Fetched(error=ErrorCode.not_leader_or_follower, message=str(exc))
        if data.error_code == OFFSET_OUT_OF_RANGE:
            # Retention removed records below the window: move SPSO up to the log start.
            start = await self.cluster.list_offset(topic, tp[1], EARLIEST_TIMESTAMP)
            if engine.advance_log_start(start) is not None:
                self._changed(leader)
            return None
        if data.error_code in RETRIABLE_FETCH_ERRORS:
            self._refresh_stale_metadata()
            return _Fetched(error=ErrorCode.not_leader_or_follower, message="Partition leadership moved.")
        if data.error_code != NONE:
            return _Fetched(error=ErrorCode(data.error_code), message="Upstream fetch failed.")
        if data.log_start_offset > engine.start_offset:
            if engine.advance_log_start(data.log_start_offset) is not None:
                self._changed(leader)
        try:
            batches = [b for b in iter_batches(data.records) if isinstance(b, RecordBatchHeader)]
        except RecordBatchError as exc:
            return _Fetched(error=ErrorCode.corrupt_message, message=str(exc))
        if not batches:
            return _Fetched(idle_at=offset)
        records_read = sum(b.record_count for b in batches) or 1
        observed = (batches[-1].position + batches[-1].size) / records_read
        leader.bytes_per_record = (observed if not leader.bytes_per_record
                                   else 0.8 * leader.bytes_per_record + 0.2 * observed)
        return data.records, tuple(batches), data.aborted_transactions

    # ----- ShareAcknowledge -------------------------------------------------------------

    async def share_acknowledge(self, request, version: int, connection_id: int):
        response_type = DEFAULT_REGISTRY.response_type(79, version)
        group_id, member_id = request.group_id, request.member_id
        if not group_id or not member_id:
            return _ack_response(response_type, {}, 0, ErrorCode.invalid_request, "GroupId and MemberId are required.")
        try:
            context = self.sessions.share_acknowledge(group_id, member_id, int(request.share_session_epoch),
                                                      connection_id)
        except ShareSessionError as exc:
            return _ack_response(response_type, {}, 0, exc.code, str(exc))
        results = await self._acknowledge(group_id, member_id, request.topics)
        if context.kind is ContextKind.FINAL:
            self._release_member(group_id, member_id)
        lock_ms = self.coordinator.group_config(group_id).record_lock_duration_ms
        return _ack_response(response_type, results, lock_ms)


@dataclass(slots=True)
class _Fetched:
    records: bytes = b""
    acquired: tuple = ()
    count: int = 0
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    idle_at: int | None = None  # caught up at this offset: long-poll upstream here
    leader_id: int = -1
    leader_epoch: int = -1


def _passes(order, results, busy):
    """Partitions to fetch: all in rotated order without waiting, then -- only if that acquired
    nothing -- the ones another fetch was reading, waiting for them."""
    for tp in order:
        yield tp, False
    if not any(r.count for r in results.values()):
        for tp in list(busy):
            yield tp, True


def _ms(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def _fetch_error(response_type: type, code: ErrorCode, message: str):
    return response_type(
        throttle_time=_ms(0), error_code=code, error_message=message, acquisition_lock_timeout=_ms(0),
        responses=(), node_endpoints=(),
    )


def _fetch_response(response_type, fetched, ack_results, lock_ms: int, cluster: Cluster, advertised_endpoint=None):
    types = nested_types(response_type)
    partition_type, topic_type = types["PartitionData"], types["ShareFetchableTopicResponse"]
    leader_type, acquired_type = types["LeaderIdAndEpoch"], types["AcquiredRecords"]
    by_topic: dict[uuid.UUID, list] = {}
    moved_leaders: set[int] = set()
    for tp in sorted(set(fetched) | set(ack_results), key=lambda k: (str(k[0]), k[1])):
        outcome = fetched.get(tp) or _Fetched()
        ack_code, ack_message = ack_results.get(tp, (ErrorCode.none, None))
        topic = cluster.topic_by_id(tp[0])
        info = topic.partitions.get(tp[1]) if topic else None
        if outcome.error is ErrorCode.not_leader_or_follower and info is not None and info.leader_id >= 0:
            moved_leaders.add(info.leader_id)
        by_topic.setdefault(tp[0], []).append(partition_type(
            partition_index=tp[1],
            error_code=outcome.error,
            error_message=outcome.message,
            acknowledge_error_code=ack_code,
            acknowledge_error_message=ack_message,
            current_leader=leader_type(leader_id=info.leader_id if info else -1,
                                       leader_epoch=info.leader_epoch if info else -1),
            records=outcome.records,
            acquired_records=tuple(
                acquired_type(first_offset=a.first_offset, last_offset=a.last_offset, delivery_count=a.delivery_count)
                for a in outcome.acquired
            ),
        ))
    return response_type(
        throttle_time=_ms(0),
        error_code=ErrorCode.none,
        error_message=None,
        acquisition_lock_timeout=_ms(lock_ms),
        responses=tuple(topic_type(topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
        node_endpoints=_node_endpoints(types["NodeEndpoint"], moved_leaders, advertised_endpoint),
    )


def _node_endpoints(endpoint_type, node_ids, advertised_endpoint) -> tuple:
    """KIP-951 leader hints for moved partitions, with the proxy's endpoints for those nodes."""
    if advertised_endpoint is None:
        return ()
    endpoints = []
    for node_id in sorted(node_ids):
        try:
            host, port = advertised_endpoint(node_id)
        except KeyError:
            continue  # a broker the proxy has no listener for yet; the client refreshes metadata
        endpoints.append(endpoint_type(node_id=node_id, host=host, port=port, rack=None))
    return tuple(endpoints)


def _ack_response(response_type, results, lock_ms: int, code: ErrorCode = ErrorCode.none, message: str | None = None):
    types = nested_types(response_type)
    partition_type, topic_type, leader_type = (
        types["PartitionData"], types["ShareAcknowledgeTopicResponse"], types["LeaderIdAndEpoch"],
    )
    by_topic: dict[uuid.UUID, list] = {}
    for (topic_id, partition), (ack_code, ack_message) in sorted(results.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        by_topic.setdefault(topic_id, []).append(partition_type(
            partition_index=partition, error_code=ack_code, error_message=ack_message,
            current_leader=leader_type(leader_id=-1, leader_epoch=-1),
        ))
    extra = {"acquisition_lock_timeout": _ms(lock_ms)} if _has_field(response_type, "acquisition_lock_timeout") else {}
    return response_type(
        throttle_time=_ms(0), error_code=code, error_message=message,
        responses=tuple(topic_type(topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
        node_endpoints=(), **extra,
    )


@functools.cache
def _has_field(entity_type: type, name: str) -> bool:
    return any(f.name == name for f in fields(entity_type))
