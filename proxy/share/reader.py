"""The reader: upstream log reads for ShareFetch, the read cache, and long polling.

Theory of operation
-------------------
A ShareFetch takes records from the partitions of the member's share session in turn (rotating
the start so none starves) until it has MaxRecords. A partition whose **read cache** (the
batches of an earlier upstream read not yet acquired) holds that many records from the engine's
``next_fetch_offset()`` on, or all the log had, is served from it; otherwise the reader reads
its log upstream. The engine acquires from the batch headers; the batches overlapping the
acquired ranges go back to the client as the broker's raw bytes (never decoded). A cache short
of the records wanted is read on rather than topped up from the next partition, so a
response carries one partition's records while its log has enough (each partition in a
response costs a state write when its records are acknowledged). The read starts where the
cached batches end and the cache keeps them (when only records not yet taken lie ahead: new
ones, or redeliveries a read back brought without the large batch after them). Reading again
from the next fetch offset fetched them twice: with log batches smaller than a fetch takes,
1.2-2.6 x the bytes consumers got. A read for redeliveries inside the window starts at the first
of them; when the cache holds records after it, it reads up to them and keeps them (reading on
past the window fetched those again: 3.2 x the bytes consumed with 10 % of the records released),
asking for exactly the batches between when the headers dropped caches left behind cover them.

**The window kept for redeliveries.** A share-partition that handed out a redelivery in the last
``KEEP_WINDOW_S`` keeps its window's batches (from the SPSO on) in its read cache instead of
dropping them once taken, so its next redeliveries are taken from the cache and reads go on after
it: with 10 % of the records released state_bench read its log 1.05-1.16 x, 2.3 x when each
redelivery read the window back. Only partitions that release pay the window's bytes (at most the
record-lock limit's records) in the cache budget.

Reads are sized for what can be acquired: the records wanted times the bytes per record learned
from earlier reads, never less than the partition's largest recent log batch (a broker answers a
partition whose next batch exceeds its PartitionMaxBytes with nothing unless it comes first in
the response) -- or than the batch itself, for a read back inside a batch a dropped cache held.
A broker sends log bytes up to PartitionMaxBytes, so a read may end inside a batch; those bytes
are thrown away, but their first 12 say the batch's size, and the next read from it asks for that
batch and the 12 bytes after it exactly, so reads chain on batch boundaries
(:func:`_whole_batches`).

**Read-ahead.** Once a fetch has taken records, the partitions of its session whose caches hold
fewer than a fetch takes, and whose log had more at their last read, are read in the background
with **one upstream Fetch per leader broker** (the leaders at once; at most a quarter of the
cache budget per batch, and never more than the budget has free: a read-ahead drops no cache),
so the member's next fetch -- or another member's -- finds its records in a cache instead of
waiting for an upstream round trip. While more than half the budget stays free, a read-ahead
reads up to ``READ_AHEAD_FETCHES`` fetches' worth (an upstream Fetch for every few ShareFetches),
cut to whole batches of the size the last read learned (:func:`_in_whole_batches`). So does a
fetch's own read when no cache held its records: with many members on few partitions the next
fetch often came before the background read-ahead had run.

Only one read per share-partition runs at a time (its ``read_lock``, held by a fetch from before
its read until it has taken its records, and by a read-ahead until its reads are cached):
members fetching the same partition skip it while it is being read, and only if nothing else was
acquirable wait and take their records from the batches that read brought in, so the log is read
once, not once per member (a read is sized for the members queued behind it too).

The read caches of all share-partitions share **one byte budget** (``max_read_cache_bytes``):
when a new read would exceed it, the least recently used caches are dropped (a later fetch reads
again). When nothing can be acquired, a fetch long-polls until MaxWaitMs, woken when records may
have become acquirable on a share-partition of its session (:class:`WorkSignal`: acknowledgements,
releases, lock expiry, commits) or when upstream has new data for an idle partition. Only the
fetches waiting on that share-partition wake: every wake-up of a fetch that finds nothing costs a
round over its session, and with one signal for all, each acknowledgement in any group woke every
waiting fetch of every group (16 members on 4 partitions: 4,929 wake-ups per million records,
4,076 of them to nothing). The upstream long polls are the service's tasks,
one per caught-up partition and offset however many fetches wait on it, no more per broker than its
long-poll connections, and not cancelled when the fetch that started one wakes. A partition a read
found at its log's end counts as caught up -- not read again by fetches that may wait -- for
``CAUGHT_UP_RECHECK_S`` or while a long poll watches it.

**A member pinning a full window is answered early.** When the member itself holds the Acquired
record at the SPSO of a share-partition at its record-lock limit (``SharePartition.pinned_by``),
nothing but its own acknowledgement (or its lock expiring) lets anyone acquire there. Clients send
acknowledgements with their next ShareFetch, and the Java client sends a ShareFetch while its
application still holds the records of the last one (it prefetches), so a long poll there stalls
the partition for every member until MaxWaitMs. Such a fetch is answered empty after
``SELF_PINNED_HOLD_S`` (10 ms), doubling with every early answer to that member at the same SPSO
up to MaxWaitMs, so the acknowledgement comes with the client's next fetch, and a member that holds
its records for long (slow processing, explicit acknowledgement) soon long-polls as usual.

Metadata is refreshed through :class:`MetadataRefresher`, which bounds how often: unknown topic
ids and stale-leader errors cost at most one refresh per interval, however many partitions or
requests hit them.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import operator
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import trio
from kio.schema.errors import ErrorCode

from codec.errors import RecordBatchError
from codec.records import LOG_OVERHEAD, RecordBatchHeader, iter_batches, partial_batch
from proxy.errors import UpstreamError
from proxy.share import metrics, observe
from proxy.share.assignor import TopicIdPartition
from proxy.share.cluster import (
    EARLIEST_TIMESTAMP,
    NONE,
    OFFSET_OUT_OF_RANGE,
    RETRIABLE_FETCH_ERRORS,
    FetchedPartition,
    PartitionRead,
    TopicInfo,
)
from proxy.share.commit import Cause, CommitPipeline
from proxy.share.leaders import Leader, PartitionRegistry, SharePartitionKey
from proxy.share.partition import AcquireMode
from proxy.share.persister import PersistError
from proxy.share.sessions import response_order

log = structlog.get_logger(__name__)

FIRST_FETCH_BYTES = 1024 * 1024  # until the partition's record size is known
MIN_FETCH_BYTES = 64 * 1024
# A read-ahead reads up to this many fetches' worth of records (and of the fetch's MaxBytes) while
# more than half the read-cache budget stays free. Sized for one fetch, the proxy sent an upstream
# Fetch per ShareFetch, ~1 MiB each (a Java consumer's MaxBytes), its Python cost with every
# ShareFetch: share_bench, stop 44, 0.50 Fetches per ShareFetch on 4 partitions with this, proxy
# CPU per record a median 0.98 of before. Into all the free room, where windows kept for
# redeliveries fill the budget, the fetches' own reads dropped the larger read-aheads to make room
# and read them again (state_bench, 64 partitions fragmented: 47-79 MiB dropped against 4-7).
# A fetch's own read reads as far ahead, under the same rule.
READ_AHEAD_FETCHES = 4
# A fetch whose member itself pins a full window is answered after this hold, doubling with each
# early answer at the same SPSO (see Reader._pinned_deadline).
SELF_PINNED_HOLD_S = 0.01
# For this long after an upstream read found a partition's log at its end, fetches take it as
# caught up without reading it again: with many members on a partially drained topic nearly every
# fetch visited a drained partition and waited for an empty read (share_bench, stop 38). A fetch
# that waits long-polls such partitions as before, and new records a long poll sees end it at once;
# a fetch that may not wait reads them; records appended while fetches are answered from other
# partitions are seen at most this late.
CAUGHT_UP_RECHECK_S = 0.1
# A share-partition that handed out a redelivery less than this long ago keeps its window's batches
# (from the SPSO on) in its read cache, so the next redelivery is taken from there instead of read
# back from the broker (state_bench fragmented, 10 % released once: the log was read 2.2 x). Only
# partitions that release pay the window's bytes in the cache budget; in-order accepts never do.
KEEP_WINDOW_S = 10.0
# Batch headers dropped read caches leave behind for sizing a read back (_batch_floor,
# _window_bytes): the first ones from the SPSO on, where redeliveries are.
DROPPED_BATCHES_KEPT = 16


WOKE_TO_RECORDS = metrics.FETCH_WAKEUPS.labels(outcome="records")
WOKE_TO_NOTHING = metrics.FETCH_WAKEUPS.labels(outcome="nothing")

MOVED_MESSAGE = "This share-partition moved to another proxy instance while the fetch waited; refresh metadata."


class WorkSignal:
    """Wakes the fetches waiting for records: those waiting on one share-partition, or all.

    A fetch takes a :meth:`mark` before it looks for records and, finding none, waits (:meth:`wait`)
    on its share-partitions from that mark. Any fire after the mark ends the wait at once (the
    fetch looks again), so no fire between its look and its wait is missed. A look that does not
    suspend (nothing to read upstream) lets no fire in between, so this seldom costs a look.
    """

    def __init__(self) -> None:
        self.fired = 0  # fires so far, of any share-partition
        self._waiting: dict[SharePartitionKey, set[trio.Event]] = {}

    def mark(self) -> int:
        return self.fired

    def fire(self, key: SharePartitionKey | None = None) -> None:
        """Wake the fetches waiting on share-partition `key` (None: every waiting fetch)."""
        self.fired += 1
        if key is None:
            woken = set().union(*self._waiting.values())
            self._waiting.clear()
        else:
            woken = self._waiting.pop(key, ())
        for event in woken:
            event.set()

    def waiting(self, key: SharePartitionKey) -> int:
        """How many fetches wait on share-partition `key`."""
        return len(self._waiting.get(key, ()))

    async def wait(self, keys: list[SharePartitionKey], mark: int, deadline: float) -> bool:
        """Wait until one of `keys` fires (or all do), or until `deadline` (trio time); at once if
        anything fired since `mark`. True: woken, not timed out."""
        if self.fired != mark:
            return True
        event = trio.Event()
        for key in keys:
            self._waiting.setdefault(key, set()).add(event)
        try:
            with trio.move_on_at(deadline):
                await event.wait()
        finally:
            for key in keys:
                waiters = self._waiting.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiting[key]
        return event.is_set()


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


_LAST_OFFSET = operator.attrgetter("last_offset")


@dataclass(frozen=True, slots=True)
class ReadCache:
    """The batches of the last upstream read of a share-partition, kept until taken."""

    records: bytes | memoryview  # a view of the Fetch response that read them, or bytes
    batches: tuple[RecordBatchHeader, ...]
    aborted_transactions: tuple[tuple[int, int], ...]

    def batches_from(self, offset: int) -> tuple[RecordBatchHeader, ...]:
        """The cached batches holding `offset` and after, or () when `offset` is not cached."""
        batches = self.batches
        if not batches or not batches[0].base_offset <= offset <= batches[-1].last_offset:
            return ()
        # A log's batches are in offset order: the first ending at `offset` or later is found by
        # bisection (asked on every fetch, for every partition of its session, by the read-ahead).
        return batches[bisect.bisect_left(batches, offset, key=_LAST_OFFSET):]

    def reaches(self, offset: int) -> bool:
        """Whether these batches hold `offset` or end just before it: a read from `offset` on can
        be joined behind them."""
        return bool(self.batches) and self.batches[0].base_offset <= offset <= self.batches[-1].last_offset + 1

    def tail_from(self, offset: int, *, copy: bool = True) -> ReadCache | None:
        """A cache of only the batches holding `offset` and after (their bytes copied out, so the
        rest can be freed; with `copy` False a view of them, for a caller that joins them to more
        and so copies them anyway), or None when `offset` is not cached."""
        batches = self.batches_from(offset)
        if not batches:
            return None
        start, end = batches[0].position, batches[-1].position + batches[-1].size
        if start == 0 and end == len(self.records):
            return self
        view = memoryview(self.records)[start:end]
        return ReadCache(bytes(view) if copy else view,
                         tuple(b._replace(position=b.position - start) for b in batches),
                         self.aborted_transactions)

    def owned(self) -> ReadCache:
        """These batches in bytes of their own: a view (of a Fetch response, or of an older cache)
        is copied out so what it views can be freed."""
        if type(self.records) is bytes:
            return self
        return ReadCache(bytes(self.records), self.batches, self.aborted_transactions)

    def followed_by(self, later: ReadCache) -> ReadCache:
        """These batches, then `later`'s (read on from where these end), as one cache; a batch of
        `later` these already hold is left out."""
        last = self.batches[-1].last_offset if self.batches else -1
        added = [b for b in later.batches if b.last_offset > last]
        if not added:
            return self
        start = added[0].position
        shift = len(self.records) - start
        aborted = self.aborted_transactions + tuple(
            a for a in later.aborted_transactions if a not in self.aborted_transactions)
        return ReadCache(b"".join((self.records, memoryview(later.records)[start:])),
                         self.batches + tuple(b._replace(position=b.position + shift) for b in added), aborted)


class ReadCacheBudget:
    """One byte budget for every share-partition's read cache (least recently used dropped first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.reserved = 0  # bytes read-aheads in flight will cache
        self._sizes: OrderedDict[Leader, int] = OrderedDict()

    def store(self, leader: Leader, cache: ReadCache) -> None:
        self.drop(leader)
        size = len(cache.records)
        if size > self.max_bytes:
            return  # used for this acquisition only
        while self.used + size > self.max_bytes and self._sizes:
            victim, victim_size = self._sizes.popitem(last=False)
            _forget(victim)
            self.used -= victim_size
            metrics.READ_CACHE_EVICTED_BYTES.inc(victim_size)  # rising: the budget is short
        leader.cache = cache
        self._sizes[leader] = size
        self.used += size
        metrics.READ_CACHE_BYTES.set(self.used)

    @property
    def room(self) -> int:
        """Bytes a read may cache without dropping another cache (nor taking what read-aheads in
        flight will cache)."""
        return self.max_bytes - self.used - self.reserved

    def touch(self, leader: Leader) -> None:
        if leader in self._sizes:
            self._sizes.move_to_end(leader)

    def drop(self, leader: Leader) -> None:
        size = self._sizes.pop(leader, None)
        _forget(leader)
        if size is not None:
            self.used -= size
            metrics.READ_CACHE_BYTES.set(self.used)


def _forget(leader: Leader) -> None:
    """Drop the leader's read cache, remembering batch headers: those of earlier dropped caches
    and its own, from the SPSO on, the first ``DROPPED_BATCHES_KEPT`` (their sizes size a read
    back; the rest of a cache of many small batches would be memory outside the cache budget, for
    little). Earlier caches' headers are kept, not replaced: a read back at a redelivery usually
    starts in a batch dropped before the cache that came after it."""
    if leader.cache is not None:
        spso = leader.engine.start_offset
        known = {b.base_offset: b for b in leader.dropped_batches if b.last_offset >= spso}
        known.update((b.base_offset, b) for b in leader.cache.batches[:DROPPED_BATCHES_KEPT]
                     if b.last_offset >= spso)
        leader.dropped_batches = tuple(known[base] for base in sorted(known)[:DROPPED_BATCHES_KEPT])
        leader.cache = None


@dataclass(slots=True)
class Fetched:
    """What one share-partition contributes to a ShareFetch response."""

    records: bytes | memoryview = b""  # a view of the read cache's bytes when contiguous
    acquired: tuple = ()
    count: int = 0
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    idle_at: int | None = None  # caught up at this offset: long-poll upstream here
    leader_id: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_records: int
    max_bytes: int
    batch_size: int | None
    mode: AcquireMode
    deadline: float  # trio time
    waits: bool = True  # MaxWaitMs > 0: the client lets the fetch wait for records


@dataclass(slots=True)
class _Budget:
    """What a ShareFetch may still take: records and bytes."""

    records: int
    bytes: int

    @property
    def spent(self) -> bool:
        return self.records <= 0 or self.bytes <= 0


# A share-partition whose records this fetch will take: key, leader, topic.
_Held = tuple[TopicIdPartition, Leader, TopicInfo]


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
        # One batched read may fill at most a quarter of the cache budget (its first partition
        # always goes), so it never evicts what it read itself before it is served.
        self.max_batched_read_bytes = max(max_read_cache_bytes // 4, MIN_FETCH_BYTES)
        self.read_ahead_fetches = READ_AHEAD_FETCHES
        self._background = background
        self._rotation = itertools.count()
        # (group, topic id, partition, offset) of the upstream long polls running in the background:
        # one per caught-up share-partition however many fetches wait on it (see _wait_for_work),
        # and how many run per broker: no more than its long-poll connections, so none waits for a
        # connection while its partition counts as watched.
        self._long_polls: set[tuple[str, uuid.UUID, int, int]] = set()
        self._long_polls_per_broker: collections.Counter[int] = collections.Counter()
        # Scale-out: whether this instance still leads a share-partition (ServiceOwnership.leads);
        # a long poll whose partition is handed over mid-wait is answered at once. None: all.
        self.leads: Callable[[uuid.UUID, int], bool] | None = None

    async def fetch_records(
        self, partitions, group_id: str, member_id: str, params: FetchParams,
    ) -> dict[TopicIdPartition, Fetched]:
        order = sorted(partitions, key=response_order)
        if order:
            shift = next(self._rotation) % len(order)
            order = order[shift:] + order[:shift]  # rotate so no partition starves
        results: dict[TopicIdPartition, Fetched] = {}
        pinned_deadline: float | None = None  # the member itself holds a full window: answer by then
        woken = False  # the last wait ended by a wake-up, not by a time-out
        while True:
            mark = self.work.mark()
            if self.leads is not None:
                moved = [tp for tp in order if not self.leads(*tp)]
                if moved:  # handed over mid-wait (give_up fires work): the client asks the new leader
                    for tp in moved:
                        results[tp] = Fetched(error=ErrorCode.not_leader_or_follower, message=MOVED_MESSAGE)
                    order = [tp for tp in order if tp not in moved]
            idle_partitions: list[tuple[TopicIdPartition, int]] = []
            budget = _Budget(params.max_records, params.max_bytes)
            busy = await self._fetch_round(order, group_id, member_id, params, budget, results, idle_partitions)
            if not any(r.count for r in results.values()):
                # Nothing acquired without waiting: wait for the partitions other fetches were
                # reading, one at a time, and take from what they brought in.
                for tp in busy:
                    if budget.spent:
                        break
                    outcome = await self.fetch_partition(group_id, member_id, tp, params, budget)
                    _note(tp, outcome, budget, results, idle_partitions)
            took = any(r.count for r in results.values())
            if woken:
                (WOKE_TO_RECORDS if took else WOKE_TO_NOTHING).inc()
            if took:
                self._read_ahead(group_id, order, params)
                return results
            if trio.current_time() >= params.deadline or not order:
                return results
            if any(r.error is not ErrorCode.none for r in results.values()):
                return results
            pinned_deadline = self._pinned_deadline(group_id, member_id, order, pinned_deadline)
            if pinned_deadline is not None and trio.current_time() >= pinned_deadline:
                metrics.SELF_PINNED_ANSWERS.inc()
                return results
            woken = await self._wait_for_work(
                mark, group_id, order, idle_partitions,
                params.deadline if pinned_deadline is None else min(pinned_deadline, params.deadline))

    def _pinned_deadline(
        self, group_id: str, member_id: str, order: list[TopicIdPartition], current: float | None,
    ) -> float | None:
        """When this fetch should be answered, empty, because the member itself pins a full window.

        A member that holds the Acquired record at the SPSO of a share-partition at its
        record-lock limit is the only one whose acknowledgement lets anyone acquire there again.
        A client sends its acknowledgements with its next ShareFetch, and the Java client may
        send a ShareFetch before its application has processed the records it holds (it
        prefetches); waiting for MaxWaitMs then keeps the partition stalled for every member until
        the wait ends. So the fetch is answered after a short hold instead, and the client's next
        ShareFetch brings the acknowledgements. The hold doubles with each early answer to the
        same member at the same SPSO (SELF_PINNED_HOLD_S up to MaxWaitMs), so a member holding its
        records for long -- slow processing, explicit acknowledgement -- soon long-polls as usual.
        None: the member pins nothing (it waits until MaxWaitMs).
        """
        if current is not None:
            return current  # decided when this fetch first found itself pinned
        hold: float | None = None
        for tp in order:
            leader = self.registry.active((group_id, tp[0], tp[1]))
            if leader is None or leader.engine.pinned_by() != member_id:
                continue
            spso = leader.engine.start_offset
            previous = leader.pinned_answers
            answers = previous[2] + 1 if previous is not None and previous[:2] == (member_id, spso) else 0
            leader.pinned_answers = (member_id, spso, answers)
            leader_hold = SELF_PINNED_HOLD_S * (2 ** min(answers, 16))
            hold = leader_hold if hold is None else min(hold, leader_hold)
        return None if hold is None else trio.current_time() + hold

    async def _fetch_round(
        self, order: list[TopicIdPartition], group_id: str, member_id: str, params: FetchParams, budget: _Budget,
        results: dict[TopicIdPartition, Fetched], idle_partitions: list,
    ) -> list[TopicIdPartition]:
        """Take records from the partitions no other fetch is reading, in order: from a partition's
        read cache when that holds enough, else from an upstream read of it. Returns the partitions
        another fetch (or a read-ahead) was reading."""
        busy: list[TopicIdPartition] = []
        for tp in order:
            if budget.spent:
                break
            prepared = await self._prepare(group_id, tp)
            if isinstance(prepared, Fetched):
                results[(tp[0], tp[1])] = prepared
                continue
            if prepared is None:
                continue
            _, leader, topic = prepared
            if leader.read_lock.locked():
                busy.append(tp)
                continue
            async with leader.read_lock:  # free: taken without waiting
                outcome = await self._take(prepared, member_id, budget, params)
            _note(tp, outcome, budget, results, idle_partitions)
        return busy

    async def _take(self, prepared: _Held, member_id: str, budget: _Budget, params: FetchParams) -> Fetched | None:
        """Acquire from the partition's read cache, or from a fresh read when it holds too few
        records (the caller holds the partition's read lock)."""
        tp, leader, topic = prepared
        if not leader.engine.can_acquire():
            return None
        outcome = leader.cache if self._cache_covers(leader, budget.records) else None
        if outcome is None:
            if params.waits and self._caught_up_lately(leader):
                # A fetch that may wait long-polls it; one that may not (MaxWaitMs 0) reads it.
                return Fetched(idle_at=leader.engine.next_fetch_offset())
            outcome = (await self._read_many([prepared], budget.records, budget.bytes)).get(tp)
        if isinstance(outcome, ReadCache):
            return self._acquire(leader, topic, tp, member_id, outcome, budget, params)
        return outcome

    def _read_ahead(self, group_id: str, order: list[TopicIdPartition], params: FetchParams) -> None:
        """After a fetch took records: read, in the background, the partitions of its session whose
        caches hold fewer than a fetch takes and whose log has more, so the member's next fetch
        (or another member's) finds its records in a cache instead of waiting for a read."""
        nursery = self._background()
        if nursery is None:
            return
        wanted: list[_Held] = []
        # Asked after every fetch for every partition of its session (32 for one member of a
        # 32-partition topic): a topic is looked up again only when the topic id object changes
        # (`order` runs topic by topic; hashing a UUID is a Python call), and each partition's
        # next fetch offset is found once.
        topic_id, topic = None, None
        for tp in order:
            leader = self.registry.active((group_id, tp[0], tp[1]))
            if leader is None or leader.read_lock.locked():
                continue
            if tp[0] is not topic_id:
                topic_id, topic = tp[0], self.cluster.topic_by_id(tp[0])
            if topic is None or tp[1] not in topic.partitions:
                continue
            offset = leader.engine.next_fetch_offset()
            if 0 <= leader.high_watermark <= offset:
                continue  # caught up at the last read: a fetch long-polls for more
            if not self._cache_covers(leader, params.max_records, offset):
                wanted.append((tp, leader, topic))
        if wanted:
            nursery.start_soon(self._read_ahead_task, wanted, params.max_records, params.max_bytes)

    async def _read_ahead_task(self, wanted: list[_Held], records: int, max_bytes: int) -> None:
        held = []
        try:
            for entry in wanted:
                lock = entry[1].read_lock
                if not lock.locked():  # a fetch may have started reading it since
                    lock.acquire_nowait()
                    held.append(entry)
            if held:
                # Into the caches, but only into the budget's free room: a read-ahead that dropped
                # caches not yet taken from read what the next fetch then read again. With 64
                # partitions keeping windows larger than the budget held, state_bench's fragmented
                # workload read its log 6.5-7.1 x (2.1-2.4 x now), more than half of what was
                # cached dropped so.
                await self._read_many(held, records, max_bytes, room=self.cache_budget.room)
        finally:
            for _, leader, _ in held:
                leader.read_lock.release()

    async def _prepare(self, group_id: str, tp: TopicIdPartition) -> _Held | Fetched | None:
        """The partition's leader and topic, an error to answer, or None: nothing to acquire."""
        topic = self.cluster.topic_by_id(tp[0])
        if topic is None:
            # At most one refresh per interval however many partitions and requests ask.
            await self.refresher.refresh_if_due("unknown-topic-id")
            topic = self.cluster.topic_by_id(tp[0])
            if topic is None:
                return Fetched(error=ErrorCode.unknown_topic_id, message="Unknown topic id.")
        if tp[1] not in topic.partitions:
            return Fetched(error=ErrorCode.unknown_topic_or_partition, message="Unknown partition.")
        try:
            leader = await self.registry.ensure((group_id, tp[0], tp[1]))
        except (UpstreamError, PersistError) as exc:
            return Fetched(error=ErrorCode.coordinator_not_available, message=str(exc))
        self.registry.refresh_config(leader)
        if not leader.engine.can_acquire():
            return None  # record-lock limit reached and nothing released in the window
        return tp, leader, topic

    async def fetch_partition(
        self, group_id: str, member_id: str, tp: TopicIdPartition, params: FetchParams, budget: _Budget,
    ) -> Fetched | None:
        """One partition, waiting for the fetch reading it first (then usually served from its cache)."""
        prepared = await self._prepare(group_id, tp)
        if not isinstance(prepared, tuple):
            return prepared
        leader = prepared[1]
        leader.readers_waiting += 1
        queued = True
        try:
            async with leader.read_lock:
                leader.readers_waiting -= 1
                queued = False
                return await self._take(prepared, member_id, budget, params)
        finally:
            if queued:  # cancelled while waiting for the lock
                leader.readers_waiting -= 1

    def _caught_up_lately(self, leader: Leader) -> bool:
        """Whether a read found the partition's log ending at its next fetch offset a moment ago, or
        a long poll watches it there (nothing to redeliver since, nothing new seen by a long poll)."""
        offset = leader.engine.next_fetch_offset()
        return 0 <= leader.high_watermark <= offset and (
            trio.current_time() - leader.caught_up_at < CAUGHT_UP_RECHECK_S
            or (*leader.key, offset) in self._long_polls)

    def _cache_covers(self, leader: Leader, records: int, offset: int | None = None) -> bool:
        """Whether the read cache holds `records` from the next fetch offset on (`offset`, when the
        caller has it), or all the log has."""
        cache = leader.cache
        if cache is None:
            return False
        engine = leader.engine
        if offset is None:
            offset = engine.next_fetch_offset()
        batches = cache.batches_from(offset)
        if not batches:
            return False
        end = batches[-1].last_offset + 1
        # Short of `records`, a fresh read brings more for this partition, so the response takes
        # one partition's records instead of topping up from the next (one state write per commit).
        # The window's records below SPEO do not count: few of them are redeliveries.
        return end - max(offset, batches[0].base_offset, engine.end_offset) >= records or 0 <= leader.high_watermark <= end

    def _read_size(self, leader: Leader, read_from: int, records: int, max_bytes: int, *, ahead: bool = False) -> int:
        """Bytes to read from offset `read_from` for `records` (and the members queued behind this
        read), from the partition's learned bytes per record, no more than the record-lock limit
        lets be acquired (a read-ahead: a whole window's worth); plus, when the read starts at
        redeliveries inside the window, the window's bytes. A read that would end inside its first
        or second batch asks for the first exactly, when its size is known (see
        :func:`_whole_batches`); a longer one, whole batches of that size (:func:`_in_whole_batches`)."""
        cap = self.max_fetch_bytes_per_partition
        read_bytes = min(max_bytes, cap)
        window_bytes = 0
        if leader.bytes_per_record:
            # Read for the members queued behind this read too; they take from the cache.
            records *= 1 + leader.readers_waiting
            engine = leader.engine
            if read_from >= engine.end_offset:
                # Only new records: no more than the lock limit lets be acquired -- now, or for a
                # read-ahead a whole window's worth (the acknowledgements on their way free locks).
                locks = engine.config.max_record_locks
                records = min(records, locks if ahead else max(locks - engine.in_flight_count, 0))
            else:
                # Redeliveries first: the read brings back the window's batches from `read_from` on --
                # mostly records already acknowledged -- before any new one. Sized for those as
                # well, it serves this partition's redeliveries and new records in one response,
                # where a read sized for new records alone held the window's batch only and the
                # response was topped up from the next partition (a state write more per commit).
                window_bytes = _window_bytes(leader, read_from, engine.end_offset)
            wanted = records * leader.bytes_per_record * 1.25
            read_bytes = _in_whole_batches(leader, read_from, min(read_bytes, max(MIN_FETCH_BYTES, int(wanted))))
        else:
            read_bytes = min(read_bytes, FIRST_FETCH_BYTES)
        return self._bounded(leader, read_from, read_bytes, window_bytes)

    def _sized_read(self, leader: Leader, read_from: int, records: int, max_bytes: int, within: int) -> int:
        """:meth:`_read_size` for one fetch's worth, or up to READ_AHEAD_FETCHES fetches' worth
        while that stays `within` these bytes; never less than one fetch's."""
        size = self._read_size(leader, read_from, records, max_bytes)
        if within <= size:
            return size
        more = self.read_ahead_fetches
        return max(size, self._read_size(leader, read_from, records * more, min(max_bytes * more, within), ahead=True))

    def _window_read_size(self, leader: Leader, read_from: int, upto: int) -> int:
        """Bytes to read from `read_from`, a redelivery inside the window, up to offset `upto` (the
        records from there on are cached), bounded as every read is (:meth:`_bounded`)."""
        return self._bounded(leader, read_from, _window_bytes(leader, read_from, upto))

    def _bounded(self, leader: Leader, read_from: int, read_bytes: int, window_bytes: int = 0) -> int:
        """`read_bytes` never less than the log batch at `read_from` (:func:`_batch_floor`) -- a
        broker answers a partition whose next batch exceeds its PartitionMaxBytes with nothing,
        unless it comes first in the response -- plus `window_bytes`, within the per-partition cap,
        and on batch boundaries (:func:`_whole_batches`)."""
        cap = self.max_fetch_bytes_per_partition
        read_bytes = min(max(read_bytes, min(_batch_floor(leader, read_from), cap), 1) + window_bytes, cap)
        return min(_whole_batches(leader, read_from, read_bytes), cap)

    async def _read_many(
        self, candidates: list[_Held], records: int, max_bytes: int, *, room: int | None = None,
    ) -> dict[TopicIdPartition, ReadCache | Fetched | None]:
        """Read the candidates' logs from their next fetch offsets, one upstream Fetch per leader
        broker, each sized for `records` (for up to READ_AHEAD_FETCHES times as many while more
        than half the budget stays free, :meth:`_sized_read`); the first always, the rest while
        the total stays within `max_batched_read_bytes`. With `room` (a read-ahead: no fetch
        waits for it) the first read is bounded like the rest, and the total also stays within
        `room`, which is held reserved in the budget until the reads are cached (read-aheads in
        flight together must not count the same room twice). Every read goes into its
        partition's cache; returns per partition the read, or a Fetched/None outcome (an error,
        caught up, the log start moved)."""
        reads: list[tuple[_Held, PartitionRead, ReadCache | None, ReadCache | None]] = []
        total = 0
        limit = self.max_batched_read_bytes if room is None else min(self.max_batched_read_bytes, room)
        for held in candidates:
            tp, leader, topic = held
            start = leader.engine.next_fetch_offset()  # the window's end unless redeliveries lie inside it
            # What a read may read beyond one fetch's worth, a fetch's own read as a read-ahead:
            # the room above half the budget. An own read of one fetch's worth sent an upstream
            # Fetch for nearly every ShareFetch at 16 consumers on 4 partitions (0.78-0.88 per
            # ShareFetch; 0.42-0.47 reading ahead; no throughput change measurable here).
            free = self.cache_budget.room if room is None else room
            above_half = free - self.cache_budget.max_bytes // 2 - total
            cached = _cache_worth_keeping(leader)
            kept = cached_after = None
            if cached is not None and cached.reaches(start):
                # The cache holds fewer records than wanted (or a kept window, all taken): read on
                # from its end and keep them, rather than read them again (with small log batches
                # that doubled what was read).
                kept = cached
                after = kept.batches[-1].last_offset + 1
                wanted = max(records - max(after - max(start, leader.engine.end_offset), 0), 1)
                read = PartitionRead(topic, tp[1], after, self._sized_read(leader, after, wanted, max_bytes, above_half))
            elif cached is not None and start < cached.batches[0].base_offset and leader.bytes_per_record:
                # Redeliveries below what is cached (the new records after the window, or the window
                # itself from a later offset): read up to the cache and keep it (reading on past it
                # fetched those records again: 3.2 x the bytes consumed with 10 % released,
                # state_bench fragmented).
                cached_after = cached
                upto = cached.batches[0].base_offset
                read = PartitionRead(topic, tp[1], start, self._window_read_size(leader, start, upto))
            else:
                read = PartitionRead(topic, tp[1], start, self._sized_read(leader, start, records, max_bytes, above_half))
            size = read.max_bytes
            if (reads or room is not None) and total + size > limit:
                break
            total += size
            reads.append((held, read, kept, cached_after))
        if not reads:
            return {}
        read_committed = reads[0][0][1].engine.config.read_committed  # one group, one isolation level
        for (_, leader, _), _, _, _ in reads:
            self.cache_budget.drop(leader)
        reserved = total if room is not None else 0
        self.cache_budget.reserved += reserved
        try:
            answers = await self.cluster.fetch_many([read for _, read, _, _ in reads], read_committed=read_committed)
            out: dict[TopicIdPartition, ReadCache | Fetched | None] = {}
            for (tp, leader, topic), read, kept, cached_after in reads:
                answer = answers.get((topic.topic_id, tp[1]))
                if answer is None:
                    answer = UpstreamError(f"no answer for {topic.name}-{tp[1]}")
                out[tp] = await self._take_read(leader, topic, tp, read.offset, answer, kept, cached_after)
        finally:
            self.cache_budget.reserved -= reserved
        return out

    async def _take_read(
        self, leader: Leader, topic: TopicInfo, tp: TopicIdPartition, offset: int,
        data: FetchedPartition | UpstreamError, kept: ReadCache | None = None,
        cached_after: ReadCache | None = None,
    ) -> ReadCache | Fetched | None:
        """One partition's upstream answer: its batches (kept in the read cache, after the `kept`
        batches it read on from, or before the `cached_after` batches when it read up to them), or
        an outcome."""
        engine = leader.engine
        if isinstance(data, UpstreamError):
            log.warning("upstream fetch failed", topic=topic.name, partition=tp[1], error=str(data))
            # Without a refresh a leader seen as -1 (or a moved broker) would fail every fetch
            # until the periodic refresh, while clients retry at once.
            self.refresher.refresh_soon(self._background(), "stale-leader")
            return Fetched(error=ErrorCode.not_leader_or_follower, message=str(data))
        if data.error_code == OFFSET_OUT_OF_RANGE:
            # Retention removed records below the window: move SPSO up to the log start.
            try:
                start = await self.cluster.list_offset(topic, tp[1], EARLIEST_TIMESTAMP)
            except UpstreamError as exc:
                return Fetched(error=ErrorCode.not_leader_or_follower, message=str(exc))
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
            entries = list(iter_batches(data.records))
        except RecordBatchError as exc:
            return Fetched(error=ErrorCode.corrupt_message, message=str(exc))
        batches = [b for b in entries if isinstance(b, RecordBatchHeader)]
        leader.next_batch = partial_batch(data.records, entries[-1].position + entries[-1].size if entries else 0)
        if not batches:
            if kept is not None:  # nothing after them yet: what was cached is still there to take
                kept = kept.owned()
                self.cache_budget.store(leader, kept)
                return kept
            leader.caught_up_at = trio.current_time()
            return Fetched(idle_at=offset)
        records_read = sum(b.record_count for b in batches) or 1
        observed = (batches[-1].position + batches[-1].size) / records_read
        leader.bytes_per_record = (observed if not leader.bytes_per_record
                                   else 0.8 * leader.bytes_per_record + 0.2 * observed)
        leader.batch_bytes = max(int(0.8 * leader.batch_bytes), max(b.size for b in batches))
        cache = ReadCache(data.records, tuple(batches), data.aborted_transactions)
        if kept is not None:
            cache = kept.followed_by(cache).owned()  # (followed by nothing new: still a view)
        elif cached_after is not None and batches[-1].last_offset + 1 >= cached_after.batches[0].base_offset:
            cache = cache.followed_by(cached_after)  # (a read that fell short of them leaves a gap: dropped)
        self.cache_budget.store(leader, cache)
        return cache

    def _acquire(
        self, leader: Leader, topic: TopicInfo, tp: TopicIdPartition, member_id: str, cache: ReadCache,
        budget: _Budget, params: FetchParams,
    ) -> Fetched | None:
        """Acquire from the batches of `cache` at the partition's next fetch offset."""
        engine = leader.engine
        if not engine.can_acquire():
            return None
        offset = engine.next_fetch_offset()
        batches = cache.batches_from(offset)
        if not batches:
            return None
        if offset < engine.end_offset:  # a redelivery: keep the window for the next one
            leader.keeps_window_until = trio.current_time() + KEEP_WINDOW_S
        if leader.cache is cache:
            self.cache_budget.touch(leader)
        result = engine.acquire(
            member_id, batches, now=self.clock(), max_records=budget.records, batch_size=params.batch_size,
            mode=params.mode, aborted_transactions=cache.aborted_transactions,
        )
        if result.delta is not None:
            self.commits.record(leader, result.delta, Cause.ACQUIRED)  # archived control/aborted records
        self.commits.note_delivered(leader.key, result.delivered)
        if not result.acquired:
            return None
        self._schedule(leader)
        acquired = result.acquired
        lo, hi = acquired[0].first_offset, acquired[-1].last_offset
        if hi >= batches[-1].last_offset and leader.cache is cache and not _keeps_window(leader):
            self.cache_budget.drop(leader)  # all taken: free the bytes
        metrics.RECORDS_ACQUIRED.inc(result.count)
        observe.EVENTS.acquired(leader.key, acquired)
        return Fetched(records=_records_bytes(cache.records, batches, lo, hi), acquired=acquired, count=result.count,
                       leader_id=topic.partitions[tp[1]].leader_id,
                       leader_epoch=topic.partitions[tp[1]].leader_epoch)

    async def _wait_for_work(self, mark: int, group_id: str, order: list[TopicIdPartition], idle_partitions,
                             deadline: float) -> bool:
        """Sleep until records may be acquirable: a release/expiry, new upstream data, or the deadline
        (re-checking every 0.5 s in case a partition appeared). True: woken, not timed out.

        Partitions caught up at their log's end are long-polled upstream by tasks of the service, one
        per partition however many fetches wait on it, which wake the fetches waiting on it when
        records arrive. A wait costs no task of its own, and a wake-up (every acknowledgement fires one)
        cancels no long poll: a cancelled upstream request costs its connection, and with many
        members on a drained topic such long polls were started and cancelled by the thousand, each
        closing a connection for the next to open again (stop 38, trio instrument counts).
        """
        nursery = self._background() if idle_partitions else None
        if nursery is not None:
            for tp, offset in idle_partitions[:4]:
                key = (group_id, tp[0], tp[1], offset)
                topic = self.cluster.topic_by_id(tp[0])
                info = topic.partitions.get(tp[1]) if topic is not None else None
                leader = self.registry.active((group_id, tp[0], tp[1]))
                if (key in self._long_polls or info is None or leader is None
                        or self._long_polls_per_broker[info.leader_id]
                        >= self.cluster.long_poll_connections_per_broker):
                    continue  # watched already, gone, or read again once CAUGHT_UP_RECHECK_S passed
                self._long_polls.add(key)
                self._long_polls_per_broker[info.leader_id] += 1
                nursery.start_soon(self._long_poll, key, topic, info.leader_id,
                                   leader.engine.config.read_committed, deadline)
        keys = [(group_id, tp[0], tp[1]) for tp in order]
        return await self.work.wait(keys, mark, min(deadline, trio.current_time() + 0.5))

    async def _long_poll(self, key: tuple[str, uuid.UUID, int, int], topic: TopicInfo, broker: int,
                         read_committed: bool, until: float) -> None:
        """Wait upstream, until `until` (5 s at most), for records at the offset of `key`; when they
        come, have the next fetch read the partition at once and wake the fetches waiting on it.

        At the group's isolation level: a read_committed group caught up at the last stable offset
        waits for a transaction to end, not for its first record (which the read could not return,
        so the fetches woke, read nothing and long-polled again until the transaction ended)."""
        group_id, topic_id, partition, offset = key
        try:
            wait_ms = int(max(0.0, min(until - trio.current_time(), 5.0)) * 1000)
            try:
                data = await self.cluster.fetch(topic, partition, offset, max_bytes=1, max_wait_ms=wait_ms,
                                                read_committed=read_committed)
            except UpstreamError:
                await trio.sleep(0.2)
            else:
                if not data.records and data.error_code == NONE:
                    return  # ran out: fetches still waiting start another when they re-check
        finally:
            self._long_polls.discard(key)
            self._long_polls_per_broker[broker] -= 1
        leader = self.registry.active((group_id, topic_id, partition))
        if leader is not None:  # the next round reads it, not taking it as caught up
            leader.caught_up_at = -math.inf
        self.work.fire((group_id, topic_id, partition))

    def _log_start(self, leader: Leader, log_start: int) -> None:
        delta = leader.engine.advance_log_start(log_start)
        if delta is not None:
            self.commits.record(leader, delta, Cause.LOG_TRUNCATED)


def _whole_batches(leader: Leader, read_from: int, read_bytes: int) -> int:
    """`read_bytes`, or the first batch exactly -- and the next batch's first 12 bytes, which say
    its size -- when the last read ended inside the batch at `read_from` and `read_bytes` would end
    inside it or the one after it.

    A broker sends a partition's log bytes up to PartitionMaxBytes, so such a read ended with part
    of a batch, sent, received and thrown away (part of the 1.09-1.22 x the bytes consumed that
    share_bench read with 32 partitions in stop 36). The first batch alone brings the same whole
    batches, and the 12 bytes after it size the next read the same way: reads chain on batch
    boundaries. (A read smaller than its first batch gets it whole only as the response's
    first partition; asked exactly, it always does.)"""
    size = _known_batch_size(leader, read_from)
    return size + LOG_OVERHEAD if size is not None and read_bytes < 2 * size else read_bytes


def _known_batch_size(leader: Leader, read_from: int) -> int | None:
    """The size of the log batch at `read_from` when the last read ended inside it (its first 12
    bytes, received, say it), else None."""
    known = leader.next_batch
    return known[1] if known is not None and known[0] == read_from else None


def _in_whole_batches(leader: Leader, read_from: int, read_bytes: int) -> int:
    """`read_bytes` of two batches or more cut to whole batches the size of the one at `read_from`
    (known from the bytes the last read brought past its end), and 1/64 more for batches a little
    larger. A read that ends inside a batch receives part of it and throws it away: read-aheads of
    ~4 MiB on ~1 MB batches read 1.17-1.24 x the log (share_bench, stop 44), 1.03 x so."""
    size = _known_batch_size(leader, read_from)
    if size is None or read_bytes < 2 * size:
        return read_bytes
    batches = read_bytes // size
    return batches * size + batches * size // 64 + LOG_OVERHEAD


def _records_bytes(records: bytes | memoryview, batches: tuple[RecordBatchHeader, ...], lo: int, hi: int) -> bytes | memoryview:
    """The bytes of the batches overlapping offsets `lo`..`hi` (control batches left out). Batches
    that lie back to back -- nearly always -- are a view of the cache's bytes, not a copy: the
    response's encoding copies them once anyway, and a ~1 MB join per ShareFetch was a few percent
    of the proxy's Python time (stop 35, py-spy --gil)."""
    wanted = [b for b in batches if b.last_offset >= lo and b.base_offset <= hi and not b.is_control]
    if not wanted:
        return b""
    view = memoryview(records)
    if all(a.position + a.size == b.position for a, b in zip(wanted, wanted[1:])):
        return view[wanted[0].position:wanted[-1].position + wanted[-1].size]
    return b"".join(view[b.position:b.position + b.size] for b in wanted)


def _batch_floor(leader: Leader, read_from: int) -> int:
    """The size of the log batch holding `read_from` when a dropped cache held it (a read back at a
    redelivery), else the largest recent batch. With batches of mixed sizes the largest one made a
    read back below a small batch bring a large partial one after it, thrown away."""
    known = _known_bytes(leader.dropped_batches, read_from, read_from + 1)
    return leader.batch_bytes if known is None else known


def _window_bytes(leader: Leader, read_from: int, upto: int) -> int:
    """The log bytes from `read_from` to offset `upto`: exactly, when dropped caches left the
    headers of every batch between (:func:`_known_bytes`), else at the learned bytes per record
    with a quarter to spare. (The spare quarter brought part of the next batch, thrown away: in
    state_bench's fragmented workload on 64 partitions ~260 KB a read back, 14 of 243 MiB read.)"""
    exact = _known_bytes(leader.dropped_batches, read_from, upto)
    return exact if exact is not None else int((upto - read_from) * leader.bytes_per_record * 1.25)


def _known_bytes(batches: tuple[RecordBatchHeader, ...], read_from: int, upto: int) -> int | None:
    """The size of the log batches from the one holding `read_from` through the one holding
    `upto - 1`, when `batches` (in offset order) hold each of them without a gap; else None."""
    total, expected = 0, None
    for batch in batches:
        if batch.last_offset < read_from:
            continue
        if batch.base_offset > (read_from if expected is None else expected):
            return None  # a batch between is not known
        total += batch.size
        expected = batch.last_offset + 1
        if expected >= upto:
            return total
    return None


def _keeps_window(leader: Leader) -> bool:
    """Whether the partition handed out a redelivery lately (KEEP_WINDOW_S)."""
    return trio.current_time() < leader.keeps_window_until


def _cache_worth_keeping(leader: Leader) -> ReadCache | None:
    """The cached batches a read need not fetch again: from the next fetch offset on (redeliveries
    not yet taken, then new records never acquired), or from the SPSO on while the partition keeps
    its window for redeliveries. A read goes on after them when they reach the next fetch offset
    (:meth:`ReadCache.reaches`), or reads up to them when it is a redelivery below them. None when
    nothing cached is worth keeping. Part of the cache is kept as a view: the read joins it to
    what it brings (one copy), or :meth:`ReadCache.owned` copies it out."""
    cache = leader.cache
    if cache is None or not cache.batches:
        return None
    engine = leader.engine
    # From the next fetch offset, not the window's end: a read back at redeliveries, taken before
    # the partition kept its window, ended short of a log batch too large to come with it; when
    # its batches were not kept, every read-ahead until a fetch took them read them back again
    # (state_bench's fragmented workload on 64 partitions: 20 of its 243 MiB read, in ~0.7 MB
    # reads that brought 55 KB of whole batches).
    keep_from = engine.start_offset if _keeps_window(leader) else engine.next_fetch_offset()
    if keep_from <= cache.batches[0].base_offset:
        return cache
    return cache.tail_from(keep_from, copy=False)


def _note(tp: TopicIdPartition, outcome: Fetched | None, budget: _Budget, results: dict[TopicIdPartition, Fetched],
          idle_partitions: list) -> None:
    """Add one partition's outcome to the response being built."""
    if outcome is None:
        return
    if outcome.idle_at is not None:
        idle_partitions.append((tp, outcome.idle_at))
    if outcome.count or outcome.error is not ErrorCode.none:
        results[(tp[0], tp[1])] = outcome
        budget.records -= outcome.count
        budget.bytes -= len(outcome.records)


__all__ = ["Fetched", "FetchParams", "MetadataRefresher", "ReadCache", "ReadCacheBudget", "Reader", "WorkSignal"]
