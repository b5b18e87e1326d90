"""The reader: upstream log reads for ShareFetch, the read cache, and long polling.

Theory of operation
-------------------
For each partition of a member's share session (rotating the start so none starves) the reader
reads the log upstream from the engine's ``next_fetch_offset()`` and lets the engine acquire
records from the batch headers; the batches overlapping the acquired ranges go back to the client
as the broker's raw bytes (never decoded). Reads are sized for what can be acquired (bytes per
record are learned), and only one read per share-partition runs at a time: members fetching the
same partition queue behind it and take their records from the batches it brought in (the read
cache), so the log is read once, not once per member.

The read caches of all share-partitions share **one byte budget** (``max_read_cache_bytes``):
when a new read would exceed it, the least recently used caches are dropped (a later fetch reads
again). When nothing can be acquired, a fetch long-polls until MaxWaitMs, woken when records may
have become acquirable (:class:`WorkSignal`: acknowledgements, releases, lock expiry, commits) or
when upstream has new data for an idle partition.

Metadata is refreshed through :class:`MetadataRefresher`, which bounds how often: unknown topic
ids and stale-leader errors cost at most one refresh per interval, however many partitions or
requests hit them.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import trio
from kio.schema.errors import ErrorCode

from codec.errors import RecordBatchError
from codec.records import RecordBatchHeader, iter_batches
from proxy.errors import UpstreamError
from proxy.share import metrics, observe
from proxy.share.assignor import TopicIdPartition
from proxy.share.cluster import EARLIEST_TIMESTAMP, NONE, OFFSET_OUT_OF_RANGE, RETRIABLE_FETCH_ERRORS, TopicInfo
from proxy.share.commit import Cause, CommitPipeline
from proxy.share.leaders import Leader, PartitionRegistry
from proxy.share.partition import AcquireMode
from proxy.share.persister import PersistError

log = structlog.get_logger(__name__)

FIRST_FETCH_BYTES = 1024 * 1024  # until the partition's record size is known
MIN_FETCH_BYTES = 64 * 1024


class WorkSignal:
    """A re-armable broadcast: waiters see every `fire()` after they started waiting."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    @property
    def event(self) -> trio.Event:
        return self._event


class MetadataRefresher:
    """Upstream metadata refreshes, at most one per `min_interval_s` whatever asks for them."""

    def __init__(self, cluster, on_refreshed: Callable[[], None], *, min_interval_s: float = 0.5) -> None:
        self.cluster = cluster
        self._on_refreshed = on_refreshed
        self.min_interval_s = min_interval_s
        self.last_refresh = float("-inf")
        self._lock = trio.Lock()
        self._background_pending = False

    async def refresh(self, reason: str) -> bool:
        """Refresh now (the periodic loop, start-up); False when the upstream did not answer."""
        async with self._lock:
            return await self._refresh(reason)

    async def _refresh(self, reason: str) -> bool:
        metrics.METADATA_REFRESHES.labels(reason=reason).inc()
        try:
            await self.cluster.refresh()
        except UpstreamError as exc:
            log.warning("metadata refresh failed", error=str(exc), reason=reason)
            return False
        self.last_refresh = trio.current_time()
        self._on_refreshed()
        return True

    async def refresh_if_due(self, reason: str) -> None:
        """Refresh unless one ran within the interval (callers then use what that one found)."""
        async with self._lock:
            if trio.current_time() - self.last_refresh >= self.min_interval_s:
                await self._refresh(reason)

    def refresh_soon(self, nursery: trio.Nursery | None, reason: str) -> None:
        """A background refresh at the next allowed moment; a burst of callers costs one."""
        if self._background_pending or nursery is None:
            return
        self._background_pending = True

        async def later() -> None:
            try:
                await trio.sleep_until(self.last_refresh + self.min_interval_s)
                await self.refresh_if_due(reason)
            finally:
                self._background_pending = False

        nursery.start_soon(later)


@dataclass(frozen=True, slots=True)
class ReadCache:
    """The batches of the last upstream read of a share-partition, kept until taken."""

    records: bytes
    batches: tuple[RecordBatchHeader, ...]
    aborted_transactions: tuple[tuple[int, int], ...]

    def batches_from(self, offset: int) -> tuple[RecordBatchHeader, ...]:
        """The cached batches holding `offset` and after, or () when `offset` is not cached."""
        if not self.batches or not self.batches[0].base_offset <= offset <= self.batches[-1].last_offset:
            return ()
        return tuple(b for b in self.batches if b.last_offset >= offset)


class ReadCacheBudget:
    """One byte budget for every share-partition's read cache (least recently used dropped first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._sizes: OrderedDict[Leader, int] = OrderedDict()

    def store(self, leader: Leader, cache: ReadCache) -> None:
        self.drop(leader)
        size = len(cache.records)
        if size > self.max_bytes:
            return  # used for this acquisition only
        while self.used + size > self.max_bytes and self._sizes:
            victim, victim_size = self._sizes.popitem(last=False)
            victim.cache = None
            self.used -= victim_size
        leader.cache = cache
        self._sizes[leader] = size
        self.used += size
        metrics.READ_CACHE_BYTES.set(self.used)

    def touch(self, leader: Leader) -> None:
        if leader in self._sizes:
            self._sizes.move_to_end(leader)

    def drop(self, leader: Leader) -> None:
        size = self._sizes.pop(leader, None)
        leader.cache = None
        if size is not None:
            self.used -= size
            metrics.READ_CACHE_BYTES.set(self.used)


@dataclass(slots=True)
class Fetched:
    """What one share-partition contributes to a ShareFetch response."""

    records: bytes = b""
    acquired: tuple = ()
    count: int = 0
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    idle_at: int | None = None  # caught up at this offset: long-poll upstream here
    leader_id: int = -1
    leader_epoch: int = -1


_BUSY = object()  # fetch_partition(wait=False): another fetch is reading this partition


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_records: int
    max_bytes: int
    batch_size: int | None
    mode: AcquireMode
    deadline: float  # trio time


class Reader:
    def __init__(
        self,
        cluster,
        registry: PartitionRegistry,
        commits: CommitPipeline,
        work: WorkSignal,
        refresher: MetadataRefresher,
        *,
        clock: Callable[[], int],
        schedule: Callable[[Leader], None],
        max_fetch_bytes_per_partition: int,
        max_read_cache_bytes: int,
        background: Callable[[], trio.Nursery | None],
    ) -> None:
        self.cluster = cluster
        self.registry = registry
        self.commits = commits
        self.work = work
        self.refresher = refresher
        self.clock = clock
        self._schedule = schedule
        self.max_fetch_bytes_per_partition = max_fetch_bytes_per_partition
        self.cache_budget = ReadCacheBudget(max_read_cache_bytes)
        self._background = background
        self._rotation = itertools.count()

    async def fetch_records(
        self, partitions, group_id: str, member_id: str, params: FetchParams,
    ) -> dict[TopicIdPartition, Fetched]:
        order = sorted(partitions, key=lambda tp: (str(tp[0]), tp[1]))
        if order:
            shift = next(self._rotation) % len(order)
            order = order[shift:] + order[:shift]  # rotate so no partition starves
        results: dict[TopicIdPartition, Fetched] = {}
        while True:
            work = self.work.event
            idle_partitions = []
            remaining_records, remaining_bytes = params.max_records, params.max_bytes
            busy: list[TopicIdPartition] = []
            for tp, wait in _passes(order, results, busy):
                if remaining_records <= 0 or remaining_bytes <= 0:
                    break
                outcome = await self.fetch_partition(group_id, member_id, tp, remaining_records, remaining_bytes,
                                                     params.batch_size, params.mode, wait=wait)
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
            if any(r.count for r in results.values()) or trio.current_time() >= params.deadline or not order:
                return results
            if any(r.error is not ErrorCode.none for r in results.values()):
                return results
            await self._wait_for_work(work, idle_partitions, params.deadline)

    async def _wait_for_work(self, work: trio.Event, idle_partitions, deadline: float) -> None:
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
                        data = await self.cluster.fetch(topic, tp[1], offset, max_bytes=1, max_wait_ms=wait_ms,
                                                        read_committed=False)
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

    async def fetch_partition(
        self, group_id: str, member_id: str, tp: TopicIdPartition, max_records: int, max_bytes: int,
        batch_size: int | None, mode: AcquireMode, *, wait: bool = True,
    ):
        topic = self.cluster.topic_by_id(tp[0])
        if topic is None:
            # At most one refresh per interval however many partitions and requests ask.
            await self.refresher.refresh_if_due("unknown-topic-id")
            topic = self.cluster.topic_by_id(tp[0])
            if topic is None:
                return Fetched(error=ErrorCode.unknown_topic_id, message="Unknown topic id.")
        if tp[1] not in topic.partitions:
            return Fetched(error=ErrorCode.unknown_topic_or_partition, message="Unknown partition.")
        key = (group_id, tp[0], tp[1])
        try:
            leader = await self.registry.ensure(key)
        except (UpstreamError, PersistError) as exc:
            return Fetched(error=ErrorCode.coordinator_not_available, message=str(exc))
        self.registry.refresh_config(leader)
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
        self, leader: Leader, topic: TopicInfo, tp: TopicIdPartition, member_id: str, max_records: int,
        max_bytes: int, batch_size: int | None, mode: AcquireMode,
    ) -> Fetched | None:
        engine = leader.engine
        if not engine.can_acquire():
            return None
        offset = engine.next_fetch_offset()
        cache = leader.cache
        cached = cache.batches_from(offset) if cache is not None else ()
        if cached:
            assert cache is not None
            records, batches, aborted = cache.records, cached, cache.aborted_transactions
            self.cache_budget.touch(leader)
        else:
            self.cache_budget.drop(leader)
            fetched = await self._read(leader, topic, tp, offset, max_records, max_bytes)
            if not isinstance(fetched, tuple):
                return fetched
            records, batches, aborted = fetched
            self.cache_budget.store(leader, ReadCache(records, batches, aborted))
        result = engine.acquire(
            member_id, batches, now=self.clock(), max_records=max_records, batch_size=batch_size, mode=mode,
            aborted_transactions=aborted,
        )
        if result.delta is not None:
            self.commits.record(leader, result.delta, Cause.ACQUIRED)  # archived control/aborted records
        self.commits.note_delivered(leader.key, result.delivered)
        if not result.acquired:
            return None
        self._schedule(leader)
        acquired = result.acquired
        lo, hi = acquired[0].first_offset, acquired[-1].last_offset
        if hi >= batches[-1].last_offset:
            self.cache_budget.drop(leader)  # all taken: free the bytes
        view = memoryview(records)
        chunks = [
            view[b.position:b.position + b.size]
            for b in batches
            if b.last_offset >= lo and b.base_offset <= hi and not b.is_control
        ]
        metrics.RECORDS_ACQUIRED.inc(result.count)
        observe.EVENTS.acquired(leader.key, acquired)
        return Fetched(records=b"".join(chunks), acquired=acquired, count=result.count,
                       leader_id=topic.partitions[tp[1]].leader_id,
                       leader_epoch=topic.partitions[tp[1]].leader_epoch)

    async def _read(
        self, leader: Leader, topic: TopicInfo, tp: TopicIdPartition, offset: int, max_records: int, max_bytes: int,
    ):
        """Read the log upstream from `offset`: (records, batches, aborted) or a Fetched/None outcome."""
        engine = leader.engine
        read_bytes = min(max_bytes, self.max_fetch_bytes_per_partition)
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
            self.refresher.refresh_soon(self._background(), "stale-leader")
            return Fetched(error=ErrorCode.not_leader_or_follower, message=str(exc))
        if data.error_code == OFFSET_OUT_OF_RANGE:
            # Retention removed records below the window: move SPSO up to the log start.
            start = await self.cluster.list_offset(topic, tp[1], EARLIEST_TIMESTAMP)
            self._log_start(leader, start)
            return None
        if data.error_code in RETRIABLE_FETCH_ERRORS:
            self.refresher.refresh_soon(self._background(), "stale-leader")
            return Fetched(error=ErrorCode.not_leader_or_follower, message="Partition leadership moved.")
        if data.error_code != NONE:
            return Fetched(error=ErrorCode(data.error_code), message="Upstream fetch failed.")
        if data.high_watermark >= 0:
            leader.high_watermark = data.high_watermark
        if data.log_start_offset > engine.start_offset:
            self._log_start(leader, data.log_start_offset)
        try:
            batches = [b for b in iter_batches(data.records) if isinstance(b, RecordBatchHeader)]
        except RecordBatchError as exc:
            return Fetched(error=ErrorCode.corrupt_message, message=str(exc))
        if not batches:
            return Fetched(idle_at=offset)
        records_read = sum(b.record_count for b in batches) or 1
        observed = (batches[-1].position + batches[-1].size) / records_read
        leader.bytes_per_record = (observed if not leader.bytes_per_record
                                   else 0.8 * leader.bytes_per_record + 0.2 * observed)
        return data.records, tuple(batches), data.aborted_transactions

    def _log_start(self, leader: Leader, log_start: int) -> None:
        delta = leader.engine.advance_log_start(log_start)
        if delta is not None:
            self.commits.record(leader, delta, Cause.LOG_TRUNCATED)


def _passes(order, results, busy):
    """Partitions to fetch: all in rotated order without waiting, then -- only if that acquired
    nothing -- the ones another fetch was reading, waiting for them."""
    for tp in order:
        yield tp, False
    if not any(r.count for r in results.values()):
        for tp in list(busy):
            yield tp, True


__all__ = ["Fetched", "FetchParams", "MetadataRefresher", "ReadCache", "ReadCacheBudget", "Reader", "WorkSignal"]
