"""The partition registry: the share-partitions this proxy leads, by group, and their deadlines.

Theory of operation
-------------------
A share-partition (group, topic id, partition) is led here once a member's assignment needs it
(or replay found durable state for it). Its :class:`Leader` holds the pure engine plus what the
I/O around it needs: commit versions (for :mod:`proxy.share.commit`), the read lock and cache
(for :mod:`proxy.share.reader`), epochs and timestamps written with every snapshot.

* **Initialisation**: a new share-partition takes its SPSO from ``share.auto.offset.reset``
  (ListOffsets upstream) and becomes servable only once that initial state is durable. Callers
  racing for the same key wait on one initialisation.
* **Live group configs**: :meth:`PartitionRegistry.refresh_config` is called before every
  acquisition (and progress mark, sweep and member departure) and hands the engine the group's
  *current* config (lock duration, delivery limit, record-lock limit, isolation level, IN_PROGRESS
  staleness / max extension / grace), so an IncrementalAlterConfigs reaches engines in flight.
* **Deadlines**: one heap of (deadline, key) for every share-partition with acquired records,
  instead of walking every leader on each timer pass. Entries are lazy: a popped entry whose
  leader has moved on is dropped, and :meth:`schedule` only pushes a deadline earlier than the
  one already queued for that leader.
* **Memory**: a share-partition of a group with no members and nothing in flight (an empty
  window, every change durable) is *parked*: only its SPSO, epochs and creation time stay in
  memory (all its durable state is exactly that), and the engine comes back from them on demand.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
import trio

from proxy.errors import UpstreamError
from proxy.share.cluster import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from proxy.share.coordinator import ShareGroupCoordinator
from proxy.share.group_config import ShareGroupConfig
from proxy.share.partition import PartitionConfig, PartitionSnapshot, SharePartition, SharePartitionKey
from proxy.share.state_delta import DeltaBase

if TYPE_CHECKING:  # the reader imports this module
    from codec.records import RecordBatchHeader
    from proxy.share.reader import ReadCache

log = structlog.get_logger(__name__)


@dataclass(eq=False, slots=True)
class Leader:
    """One share-partition led by this proxy."""

    key: SharePartitionKey
    engine: SharePartition
    create_timestamp: int
    snapshot_epoch: int = 0
    state_epoch: int = 0
    # Commit bookkeeping (proxy.share.commit): versions bump on every change that must become
    # durable; `staged` holds (version, change id, events) of engine changes awaiting their write
    # (the events are published when the change commits, dropped when it rolls back).
    version: int = 0
    durable: int = 0
    failed: int = 0
    settled: trio.Event = field(default_factory=trio.Event)
    staged: list[tuple[int, int, tuple]] = field(default_factory=list)
    # The last durable snapshot cumulative ShareUpdates are written against (proxy.share.commit,
    # --state-deltas on); None: the next write is a snapshot.
    delta_base: DeltaBase | None = None
    # The deadline queued for this leader in the registry's heap (math.inf when none).
    scheduled: float = math.inf
    # Reader state (proxy.share.reader): log bytes per record learned from fetches, one upstream
    # read at a time, and the batches of the last read kept for the members queued behind it.
    bytes_per_record: float = 0.0
    batch_bytes: int = 0  # the largest log batch of recent reads (decaying): a read's floor
    # (base offset, size) of the log batch the last read ended inside: a read from that offset
    # asks for it exactly (proxy.share.reader._read_size). None: the last read ended on a boundary.
    next_batch: tuple[int, int] | None = None
    read_lock: trio.Lock = field(default_factory=trio.Lock)
    readers_waiting: int = 0
    # (member, SPSO, answers): how many fetches of the member pinning the full window at that SPSO
    # were answered early (proxy.share.reader: a self-pinned fetch), for their back-off.
    pinned_answers: tuple[str, int, int] | None = None
    cache: ReadCache | None = None
    # Batch headers of the read caches dropped or replaced, from the SPSO on (16 at most,
    # reader._forget): a read back at a redelivery inside one of them asks for that batch's size,
    # not the largest recent one, and one they cover to its end for exactly them (reader._bounded,
    # reader._window_bytes).
    dropped_batches: tuple[RecordBatchHeader, ...] = ()
    # The partition's end offset from the last upstream read (-1: none yet); metrics compute lag
    # from it without asking the cluster (proxy.share.observe).
    high_watermark: int = -1
    # trio time of the last upstream read that found nothing past the next fetch offset: for a
    # moment after it, fetches take the partition as caught up without reading it again
    # (proxy.share.reader.CAUGHT_UP_RECHECK_S).
    caught_up_at: float = -math.inf
    # trio time until which the read cache keeps the window's batches for redeliveries (renewed by
    # each one handed out; proxy.share.reader.KEEP_WINDOW_S).
    keeps_window_until: float = -math.inf
    # Dropped from the registry (deleted, or handed to another instance): never written again --
    # a write of this engine after its share-partition was rebuilt elsewhere would regress it.
    removed: bool = False

    @property
    def group_id(self) -> str:
        return self.key[0]

    @property
    def settled_clean(self) -> bool:
        """Every change is durable and nothing is staged."""
        return self.durable >= self.version and not self.staged


@dataclass(frozen=True, slots=True)
class _Parked:
    """All that an idle share-partition's durable state amounts to."""

    start_offset: int
    snapshot_epoch: int
    state_epoch: int
    create_timestamp: int


def partition_config(group: ShareGroupConfig) -> PartitionConfig:
    return PartitionConfig(
        delivery_count_limit=group.delivery_count_limit,
        record_lock_duration_ms=group.record_lock_duration_ms,
        max_record_locks=group.partition_max_record_locks,
        read_committed=group.isolation_level == "read_committed",
        in_progress_staleness_threshold_ms=group.in_progress_staleness_threshold_ms,
        in_progress_max_lock_extension_ms=group.in_progress_max_lock_extension_ms,
        in_progress_rebalance_grace_ms=group.in_progress_rebalance_grace_ms,
        dead_letter=bool(group.dead_letter_topic),
    )


class PartitionRegistry:
    """Leaders by key and by group, their initialisation, deadlines, and idle eviction."""

    def __init__(
        self,
        coordinator: ShareGroupCoordinator,
        cluster,
        *,
        clock: Callable[[], int],
        wall_clock: Callable[[], int],
        persist_initial: Callable[[Leader], object],
    ) -> None:
        self.coordinator = coordinator
        self.cluster = cluster
        self.clock = clock
        self.wall_clock = wall_clock
        # Awaitable that makes a new leader's first snapshot durable (the commit pipeline's).
        self._persist_initial = persist_initial
        self._leaders: dict[SharePartitionKey, Leader] = {}
        self._by_group: dict[str, dict[SharePartitionKey, Leader]] = {}
        self._parked: dict[SharePartitionKey, _Parked] = {}
        self._initializing: dict[SharePartitionKey, trio.Event] = {}
        # Scale-out: awaited before a share-partition is initialised (GroupConfigMirror.before_first_load).
        self.before_initialise: Callable[[str], Awaitable[None]] | None = None
        self._deadlines: list[tuple[int, int, SharePartitionKey]] = []
        self._sequence = 0  # tie-breaker: keys (with UUIDs) are never compared
        # ShareGroupConfig object -> PartitionConfig, so a refresh per acquisition is a dict hit.
        self._configs: dict[int, tuple[ShareGroupConfig, PartitionConfig]] = {}

    # ----- lookup ----------------------------------------------------------------------

    def get(self, key: SharePartitionKey) -> Leader | None:
        leader = self._leaders.get(key)
        if leader is None and key in self._parked:
            leader = self._unpark(key)
        return leader

    def active(self, key: SharePartitionKey) -> Leader | None:
        """The leader if it is in memory, without bringing a parked one back."""
        return self._leaders.get(key)

    def __len__(self) -> int:
        return len(self._leaders)

    @property
    def parked_count(self) -> int:
        return len(self._parked)

    def values(self) -> Iterator[Leader]:
        return iter(list(self._leaders.values()))

    def of_group(self, group_id: str) -> list[Leader]:
        return list(self._by_group.get(group_id, {}).values())

    def keys(self) -> set[SharePartitionKey]:
        return set(self._leaders) | set(self._parked)

    def group_ids(self) -> set[str]:
        """Groups with a share-partition here, in memory or parked."""
        return set(self._by_group) | {key[0] for key in self._parked}

    def active_group_ids(self) -> list[str]:
        """Groups with a share-partition in memory (the others hold no records)."""
        return list(self._by_group)

    def parked_start_offset(self, key: SharePartitionKey) -> int | None:
        """The SPSO of a parked share-partition (without bringing it back), None if not parked."""
        parked = self._parked.get(key)
        return None if parked is None else parked.start_offset

    def parked_of_group(self, group_id: str) -> list[SharePartitionKey]:
        return [key for key in self._parked if key[0] == group_id]

    # ----- configs ---------------------------------------------------------------------

    def config_for(self, group_id: str) -> PartitionConfig:
        group = self.coordinator.group_config(group_id)
        cached = self._configs.get(id(group))
        if cached is None or cached[0] is not group:
            cached = (group, partition_config(group))
            if len(self._configs) > 10_000:
                self._configs.clear()
            self._configs[id(group)] = cached
        return cached[1]

    def refresh_config(self, leader: Leader) -> None:
        """Give the engine its group's current config (called before each acquisition)."""
        config = self.config_for(leader.group_id)
        if leader.engine.config is not config:
            leader.engine.reconfigure(config)

    # ----- membership of the registry ----------------------------------------------------

    def add(self, leader: Leader) -> Leader:
        self._leaders[leader.key] = leader
        self._by_group.setdefault(leader.group_id, {})[leader.key] = leader
        self._parked.pop(leader.key, None)
        self.schedule(leader)
        return leader

    def rebuild(self, key: SharePartitionKey, snapshot: PartitionSnapshot, updates, *, snapshot_epoch: int,
                state_epoch: int, create_timestamp: int) -> Leader:
        """A leader rebuilt from replayed state, not served until it is ``add``-ed."""
        engine = SharePartition.from_persisted(self.config_for(key[0]), snapshot, updates)
        return Leader(key, engine, create_timestamp=create_timestamp, snapshot_epoch=snapshot_epoch,
                      state_epoch=state_epoch)

    def remove(self, key: SharePartitionKey) -> bool:
        """Forget a share-partition (its group or topic was deleted)."""
        leader = self._leaders.pop(key, None)
        parked = self._parked.pop(key, None)
        if leader is not None:
            leader.removed = True
            group = self._by_group.get(key[0])
            if group is not None:
                group.pop(key, None)
                if not group:
                    del self._by_group[key[0]]
        return leader is not None or parked is not None

    async def ensure(self, key: SharePartitionKey) -> Leader:
        """The leader of `key`, initialising its SPSO from share.auto.offset.reset if it is new."""
        leader = self.get(key)
        if leader is not None:
            return leader
        pending = self._initializing.get(key)
        if pending is not None:
            await pending.wait()
            leader = self.get(key)
            if leader is None:
                raise UpstreamError(f"initialisation of {key} failed")
            return leader
        pending = self._initializing[key] = trio.Event()
        try:
            group_id, topic_id, partition = key
            if self.before_initialise is not None:  # scale-out: the group's configs from its coordinator
                await self.before_initialise(group_id)
            topic = self.cluster.topic_by_id(topic_id)
            if topic is None:
                raise UpstreamError(f"unknown topic id {topic_id}")
            reset = self.coordinator.group_config(group_id).auto_offset_reset
            if reset.strategy == "earliest":
                timestamp = EARLIEST_TIMESTAMP
            elif reset.strategy == "latest":
                timestamp = LATEST_TIMESTAMP
            else:
                timestamp = self.wall_clock() - (reset.duration_ms or 0)
            start = await self.cluster.list_offset(topic, partition, timestamp)
            leader = Leader(key, SharePartition(self.config_for(group_id), start),
                            create_timestamp=self.wall_clock())
            try:
                await self._persist_initial(leader)
            except BaseException:
                # Never served: its initial write must not be retried behind everyone else's (an
                # instance that does not own the partition could never write it, and every write
                # batched with it would fail too).
                leader.removed = True
                raise
            self.add(leader)
            log.info("share-partition initialised", group=group_id, topic=topic.name, partition=partition,
                     start_offset=start)
            return leader
        finally:
            del self._initializing[key]
            pending.set()

    # ----- idle eviction ----------------------------------------------------------------

    def park_idle(self, group_ids: Iterable[str]) -> int:
        """Park the idle share-partitions of these member-less groups; returns how many."""
        parked = 0
        for group_id in group_ids:
            for leader in self.of_group(group_id):
                engine = leader.engine
                if engine.in_flight_count or engine.staged_changes or not leader.settled_clean:
                    continue
                if leader.read_lock.locked() or leader.readers_waiting:
                    continue
                self.remove(leader.key)
                self._parked[leader.key] = _Parked(engine.start_offset, leader.snapshot_epoch, leader.state_epoch,
                                                   leader.create_timestamp)
                parked += 1
        return parked

    def _unpark(self, key: SharePartitionKey) -> Leader:
        parked = self._parked.pop(key)
        engine = SharePartition(self.config_for(key[0]), parked.start_offset)
        return self.add(Leader(key, engine, create_timestamp=parked.create_timestamp,
                               snapshot_epoch=parked.snapshot_epoch, state_epoch=parked.state_epoch))

    # ----- deadlines --------------------------------------------------------------------

    def schedule(self, leader: Leader) -> int | None:
        """Queue the leader's next lock deadline if it is earlier than the one queued; returns it."""
        deadline = leader.engine.next_deadline()
        if deadline is not None and deadline < leader.scheduled:
            leader.scheduled = deadline
            self._sequence += 1
            heapq.heappush(self._deadlines, (deadline, self._sequence, leader.key))
        return deadline

    def next_deadline(self) -> int | None:
        while self._deadlines:
            deadline, _, key = self._deadlines[0]
            leader = self._leaders.get(key)
            if leader is not None and leader.scheduled == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def due(self, now: int) -> list[Leader]:
        """Leaders whose queued deadline has passed (taken off the heap; re-`schedule` them)."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, key = heapq.heappop(self._deadlines)
            leader = self._leaders.get(key)
            if leader is None or leader.scheduled != deadline:
                continue
            leader.scheduled = math.inf
            out.append(leader)
        return out
