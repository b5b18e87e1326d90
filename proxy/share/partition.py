"""The share-partition engine: in-flight record state of one (group, topic id, partition).

Theory of operation
-------------------
A share-partition is a sliding window over a topic-partition's log (KIP-932 "In-flight
records"). Offsets below the share-partition start offset (SPSO) are finished (Archived); offsets
from the share-partition end offset (SPEO, exclusive here, as in the KIP's worked example) on have
not been read yet and are implicitly Available with delivery count 0. In between lie the in-flight
records, each Available, Acquired (by one member, with a lock deadline), Acknowledged or Archived,
and each with a delivery count.

The window is stored as in-flight batches keyed by first offset in a ``SortedDict`` that tiles
[SPSO, SPEO) without holes, so looking up an offset is a floor search (O(log n)). A batch keeps one
state for all its offsets while they move together -- the common case: a log batch is acquired
whole and accepted whole -- and splits into per-offset states the first time an operation touches
only part of it (as Kafka's ``InFlightBatch``/``InFlightState``). Every state change goes through
the transition table in :mod:`proxy.share.states`.

The engine does no I/O and reads no clock: each call that depends on time takes ``now`` (ms), and
the caller drives lock expiry with ``next_deadline()`` / ``expire(now)``. The caller also reads the
log: ``acquire`` takes the record-batch headers of a Fetch made from ``next_fetch_offset()``.

Every change that must survive a restart yields a :class:`StateDelta` -- the content of one
ShareUpdate record (new start offset or -1, and the changed state batches). Acquired records are
never persisted (KIP-932 "Managing durable share-partition state"), so after a restart
(:meth:`SharePartition.from_persisted`) a record that was Acquired for the k-th time comes back as
it was last written: Available with delivery count k-1 (nothing at all if k was 1).

Errors a client can cause raise :class:`ShareStateError` carrying a Kafka error code; the whole
acknowledgement of a partition is validated before any of it is applied (all or nothing).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sortedcontainers import SortedDict

from proxy.share.states import (
    ACK_EVENTS,
    STATE_TRAITS,
    TRANSITIONS,
    AcknowledgeType,
    Event,
    RecordState,
)

__all__ = [
    "INVALID_RECORD_STATE",
    "INVALID_REQUEST",
    "AckRange",
    "AcquireMode",
    "AcquireResult",
    "AcquiredRecords",
    "BatchHeader",
    "InFlightRun",
    "PartitionConfig",
    "PartitionSnapshot",
    "PersistedBatch",
    "RecordBatchHeader",
    "SharePartition",
    "ShareStateError",
    "StagedChange",
    "StateDelta",
    "acquisition_mark",
]

# Kafka error codes (org.apache.kafka.common.protocol.Errors).
INVALID_REQUEST = 42
INVALID_RECORD_STATE = 121

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVED = RecordState.ARCHIVED

_NO_OFFSET = 2**63
_STATE_IDS = range(8)  # room for ARCHIVING (3), IN_PROGRESS (5) and beyond


def _row(event: Event) -> tuple:
    """The table's column for one event, indexed by state id: hot loops then index a tuple
    instead of hashing enum pairs."""
    by_id = {int(state): move for (state, e), move in TRANSITIONS.items() if e is event}
    return tuple(by_id.get(i) for i in _STATE_IDS)


_ROWS: dict[Event, tuple] = {event: _row(event) for event in Event}
_ACK_ROWS: tuple = tuple(_ROWS[ACK_EVENTS[t]] for t in sorted(ACK_EVENTS))  # indexed by wire type


def _trait(name: str, default: object = False) -> tuple:
    """One column of the states table, indexed by state id (hot loops index tuples)."""
    by_id = {int(state): getattr(traits, name) for state, traits in STATE_TRAITS.items()}
    return tuple(by_id.get(i, default) for i in _STATE_IDS)


_IS_TERMINAL: tuple[bool, ...] = _trait("terminal")
_HOLDS_OWNER: tuple[bool, ...] = _trait("holds_owner")
_HOLDS_LOCK: tuple[bool, ...] = _trait("holds_lock")
_PERSISTED: tuple[bool, ...] = _trait("persisted", True)
# States a restart resumes as written; anything else read back is delivered again (Available).
_RESUMABLE = frozenset(state for state, traits in STATE_TRAITS.items() if traits.persisted)
_PERSISTED_AS: tuple = tuple(
    (STATE_TRAITS[RecordState(i)].persisted_as, STATE_TRAITS[RecordState(i)].persisted_count_delta)
    if i in RecordState._value2member_map_ and not STATE_TRAITS[RecordState(i)].persisted else None
    for i in _STATE_IDS
)
_ACQUIRE = _ROWS[Event.ACQUIRE]
_LOCK_EXPIRED = _ROWS[Event.LOCK_EXPIRED]
_MEMBER_LEFT = _ROWS[Event.MEMBER_LEFT]
_RENEW_TYPE = int(AcknowledgeType.RENEW)


class ShareStateError(Exception):
    """A request the engine refuses; ``error_code`` is the Kafka error for the partition."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


# --------------------------------------------------------------------------------------------
# Values in and out
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """Per share-partition settings (broker defaults, overridable per group).

    ``delivery_count_limit``: ``group.share.delivery.count.limit`` / ``share.delivery.count.limit``.
    ``record_lock_duration_ms``: ``share.record.lock.duration.ms``.
    ``max_record_locks``: ``group.share.partition.max.record.locks`` /
    ``share.partition.max.record.locks`` -- bound on the in-flight span SPEO - SPSO.
    ``read_committed``: ``share.isolation.level``; aborted transactional records are archived.
    """

    delivery_count_limit: int = 5
    record_lock_duration_ms: int = 30_000
    max_record_locks: int = 2000
    read_committed: bool = False

    def __post_init__(self) -> None:
        if not 2 <= self.delivery_count_limit <= 10:
            raise ValueError(f"delivery_count_limit {self.delivery_count_limit} not in [2, 10]")
        if not 1000 <= self.record_lock_duration_ms <= 3_600_000:
            raise ValueError(f"record_lock_duration_ms {self.record_lock_duration_ms} not in [1000, 3600000]")
        if not 100 <= self.max_record_locks <= 10_000:
            raise ValueError(f"max_record_locks {self.max_record_locks} not in [100, 10000]")

    @property
    def throttle_delivery_count(self) -> int:
        """Delivery count from which redelivery batches shrink: max(2, ceil(limit / 2)), as Kafka."""
        return max(2, math.ceil(self.delivery_count_limit / 2))


class RecordBatchHeader(Protocol):
    """What the engine needs from a record-batch header read from the log."""

    @property
    def base_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def producer_id(self) -> int: ...


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A minimal record-batch header (satisfies :class:`RecordBatchHeader`)."""

    base_offset: int
    last_offset: int
    is_control: bool = False
    is_transactional: bool = False
    producer_id: int = -1


class AcquireMode(enum.IntEnum):
    """ShareFetch v2 ``ShareAcquireMode``."""

    BATCH_OPTIMIZED = 0  # whole batches; max_records may be exceeded to end on a batch boundary
    RECORD_LIMIT = 1  # never more than max_records


@dataclass(frozen=True, slots=True)
class AcquiredRecords:
    """One ``AcquiredRecords`` entry of a ShareFetch response."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class AckRange:
    """One acknowledgement batch: a type for the whole range, or one type per offset."""

    first_offset: int
    last_offset: int
    acknowledge_types: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InFlightRun:
    """Offsets [first_offset, last_offset] in one state, as :meth:`SharePartition.in_flight_locked` shows them."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int
    member_id: str | None
    acquired_at: int  # ms on the engine's clock, -1 when not acquired
    lock_deadline: int  # ms on the engine's clock, -1 when not acquired


@dataclass(frozen=True, slots=True)
class PersistedBatch:
    """A state batch as persisted: (first_offset, last_offset, delivery_state, delivery_count)."""

    first_offset: int
    last_offset: int
    delivery_state: RecordState
    delivery_count: int


@dataclass(frozen=True, slots=True)
class StateDelta:
    """ShareUpdate content: ``start_offset`` is the new SPSO, or -1 when it did not move."""

    start_offset: int
    state_batches: tuple[PersistedBatch, ...]
    # Every record the change moved, including those the SPSO then passed (not persisted, so
    # not in state_batches): what metrics count. Not part of the persisted content.
    changed: tuple[PersistedBatch, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class StagedChange:
    """A staged change: commit or roll back ``change_id`` once its state write settles.

    ``change_id`` is 0 when nothing needed staging (e.g. only renewals); ``delta`` is what the
    change would persist (its SPSO move, if any, happens at commit)."""

    change_id: int
    delta: StateDelta


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """ShareSnapshot content: the whole durable state of the share-partition."""

    start_offset: int
    state_batches: tuple[PersistedBatch, ...]


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """Records handed to the member, and what to persist (archived control/aborted records)."""

    acquired: tuple[AcquiredRecords, ...]
    delta: StateDelta | None

    @property
    def count(self) -> int:
        return sum(r.last_offset - r.first_offset + 1 for r in self.acquired)


# --------------------------------------------------------------------------------------------
# In-flight storage (mutable, private)
# --------------------------------------------------------------------------------------------


class _OffsetState:
    """State of one offset of a batch that is tracked per offset."""

    __slots__ = ("state", "delivery_count", "member_id", "lock_id", "rollback")

    def __init__(
        self, state: RecordState, delivery_count: int, member_id: str | None, lock_id: int,
        rollback: _Rollback | None = None,
    ) -> None:
        self.state = state
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.lock_id = lock_id
        self.rollback = rollback


class _InFlightBatch:
    """Offsets [first_offset, last_offset]; one shared state while ``offsets`` is None."""

    __slots__ = (
        "first_offset", "last_offset", "state", "delivery_count", "member_id", "lock_id", "offsets", "full_size",
        "rollback",
    )

    def __init__(
        self,
        first_offset: int,
        last_offset: int,
        state: RecordState,
        delivery_count: int = 0,
        member_id: str | None = None,
        lock_id: int = 0,
    ) -> None:
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.state = state
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.lock_id = lock_id
        self.offsets: list[_OffsetState] | None = None
        # Set while a staged change of these records awaits its state write (see stage_acknowledge).
        self.rollback: _Rollback | None = None
        # Size as first delivered; throttling halves from this even after SPSO trims the batch.
        self.full_size = last_offset - first_offset + 1

    @property
    def size(self) -> int:
        return self.last_offset - self.first_offset + 1

    def split(self) -> list[_OffsetState]:
        """Switch to per-offset tracking (once the batch is no longer uniform)."""
        if self.offsets is None:
            self.offsets = [
                _OffsetState(self.state, self.delivery_count, self.member_id, self.lock_id, self.rollback)
                for _ in range(self.size)
            ]
            self.rollback = None
        return self.offsets

    def holders(self, first: int, last: int) -> Iterator[tuple[int, _OffsetState]]:
        """(offset, state) for per-offset entries within [first, last]."""
        assert self.offsets is not None
        start = max(first, self.first_offset)
        stop = min(last, self.last_offset)
        for offset in range(start, stop + 1):
            yield offset, self.offsets[offset - self.first_offset]


class _Rollback:
    """What a staged change replaced: restored if its state write fails (Kafka's ``rollbackState``)."""

    __slots__ = ("change_id", "state", "delivery_count", "member_id", "lock_id", "lock_deadline", "acquired_at")

    def __init__(
        self, change_id: int, state: RecordState, delivery_count: int, member_id: str | None, lock_id: int,
        lock_deadline: int, acquired_at: int = -1,
    ) -> None:
        self.change_id = change_id
        self.state = state
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.lock_id = lock_id
        self.lock_deadline = lock_deadline
        self.acquired_at = acquired_at


class _Lock:
    """An acquisition lock shared by the records acquired (or renewed) in one call."""

    __slots__ = ("deadline", "acquired_at", "first_offset", "last_offset", "held")

    def __init__(self, deadline: int, acquired_at: int) -> None:
        self.deadline = deadline
        # When its records were acquired (ms, the caller's clock); a renewal keeps the earliest.
        self.acquired_at = acquired_at
        # Widened as records join the lock; expire() scans only this range.
        self.first_offset = _NO_OFFSET
        self.last_offset = -1
        self.held = 0


class _Changes:
    """Persisted-state changes collected during one operation."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: list[list] = []  # [first, last, state, count], merged while contiguous

    def add(self, first: int, last: int, state: RecordState, delivery_count: int) -> None:
        runs = self._runs
        if runs:
            prev = runs[-1]
            if prev[1] + 1 == first and prev[2] is state and prev[3] == delivery_count:
                prev[1] = last
                return
        runs.append([first, last, state, delivery_count])

    @property
    def batches(self) -> list[PersistedBatch]:
        return [PersistedBatch(*run) for run in self._runs]


def _coalesce(batches: Iterable[PersistedBatch]) -> list[PersistedBatch]:
    """Sort and merge adjacent batches with equal state and count (later entries win overlaps)."""
    out: list[PersistedBatch] = []
    for b in sorted(batches, key=lambda b: b.first_offset):
        if out:
            prev = out[-1]
            if (
                prev.last_offset + 1 == b.first_offset
                and prev.delivery_state == b.delivery_state
                and prev.delivery_count == b.delivery_count
            ):
                out[-1] = PersistedBatch(prev.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                continue
        out.append(b)
    return out


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


# Lock ids come from one counter for every share-partition, so they also order acquisitions across
# share-partitions: see acquisition_mark().
_LOCK_IDS = itertools.count(1)


def acquisition_mark() -> int:
    """A point in acquisition order: every record acquired (or renewed) so far, on any share-partition,
    holds a lock id below it, and every later one a lock id above it."""
    return next(_LOCK_IDS)


class SharePartition:
    """In-flight state of one share-partition. Not thread-safe: one owner task calls it."""

    def __init__(self, config: PartitionConfig, start_offset: int) -> None:
        """A fresh share-partition whose SPSO is ``start_offset`` (KIP-932 "Managing the SPSO and SPEO")."""
        if start_offset < 0:
            raise ValueError(f"start_offset {start_offset} < 0")
        self.config = config
        self._delivery_count_limit = config.delivery_count_limit
        self._start = start_offset
        self._end = start_offset  # SPEO, exclusive
        self._batches: SortedDict = SortedDict()  # first_offset -> _InFlightBatch, tiling [start, end)
        self._locks: dict[int, _Lock] = {}
        self._deadlines: list[tuple[int, int]] = []  # heap of (deadline, lock_id), stale entries allowed
        self._lock_ids = _LOCK_IDS
        # No Available offset lies below this; saves rescanning the window on every fetch.
        self._available_hint = start_offset
        # Staged changes awaiting their state write: change id -> offset ranges it touched.
        self._staged: dict[int, list[tuple[int, int]]] = {}
        self._change_ids = itertools.count(1)
        self._staging = 0  # the change being staged by the running call, 0 when none
        self._last_rollback: _Rollback | None = None

    def reconfigure(self, config: PartitionConfig) -> None:
        """Take the group's current settings: later acquisitions lock for the new duration, and
        releases and expiries archive at the new delivery limit (records in flight keep their locks)."""
        self.config = config
        self._delivery_count_limit = config.delivery_count_limit

    # ----- read side ---------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """SPSO."""
        return self._start

    @property
    def end_offset(self) -> int:
        """SPEO (exclusive): the next offset that has never been read into the window."""
        return self._end

    @property
    def in_flight_count(self) -> int:
        """The in-flight span SPEO - SPSO (Kafka's end - start + 1 with an inclusive end)."""
        return self._end - self._start

    def next_fetch_offset(self) -> int:
        """Where the caller should read the log from: the lowest Available offset, else SPEO."""
        for batch in self._batches_from(self._available_hint):
            if batch.offsets is None:
                if batch.state is _AVAILABLE and batch.rollback is None:
                    self._available_hint = max(batch.first_offset, self._available_hint)
                    return self._available_hint
            else:
                for offset, holder in batch.holders(self._available_hint, batch.last_offset):
                    if holder.state is _AVAILABLE and holder.rollback is None:
                        self._available_hint = offset
                        return offset
        self._available_hint = self._end
        return self._end

    def can_acquire(self) -> bool:
        """True when a fetch could acquire something: a released record, or room for new ones."""
        return self.next_fetch_offset() < self._end or self.in_flight_count < self.config.max_record_locks

    def record_state(self, offset: int) -> tuple[RecordState, int, str | None]:
        """(state, delivery count, owning member) of one offset."""
        if offset < self._start:
            return _ARCHIVED, 0, None
        if offset >= self._end:
            return _AVAILABLE, 0, None
        batch = self._batch_at(offset)
        if batch.offsets is None:
            return batch.state, batch.delivery_count, batch.member_id
        holder = batch.offsets[offset - batch.first_offset]
        return holder.state, holder.delivery_count, holder.member_id

    def in_flight(self) -> Iterator[tuple[int, int, RecordState, int, str | None]]:
        """(first, last, state, delivery count, member) runs over the window, coalesced."""
        run: tuple[int, int, RecordState, int, str | None] | None = None
        for current in self._runs():
            if run is not None and run[1] + 1 == current[0] and run[2:] == current[2:]:
                run = (run[0], current[1], *run[2:])
                continue
            if run is not None:
                yield run
            run = current
        if run is not None:
            yield run

    def in_flight_locked(self) -> Iterator[InFlightRun]:
        """The window as runs of uniform state, with each run's acquisition time and lock deadline
        (the caller's clock, -1 when not held under a lock). Read-only; for describing, not serving."""
        run: list | None = None
        for batch in self._batches.values():
            if batch.offsets is None:
                pieces: Iterable = ((batch.first_offset, batch),)
            else:
                pieces = batch.holders(batch.first_offset, batch.last_offset)
            for offset, holder in pieces:
                last = batch.last_offset if holder is batch else offset
                lock = self._locks.get(holder.lock_id) if _HOLDS_LOCK[holder.state] else None
                key = (holder.state, holder.delivery_count, holder.member_id,
                       lock.acquired_at if lock is not None else -1, lock.deadline if lock is not None else -1)
                if run is not None and run[1] + 1 == offset and run[2] == key:
                    run[1] = last
                    continue
                if run is not None:
                    yield InFlightRun(run[0], run[1], *run[2])
                run = [offset, last, key]
        if run is not None:
            yield InFlightRun(run[0], run[1], *run[2])

    def members(self) -> set[str]:
        """Members currently holding acquired records."""
        return {member for _, _, state, _, member in self._runs() if _HOLDS_OWNER[state] and member is not None}

    def next_deadline(self) -> int | None:
        """The earliest acquisition-lock deadline (ms), or None when nothing is acquired."""
        while self._deadlines:
            deadline, lock_id = self._deadlines[0]
            lock = self._locks.get(lock_id)
            if lock is not None and lock.deadline == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def snapshot(self) -> PartitionSnapshot:
        """ShareSnapshot content: durable state as a restart would see it (Acquired not persisted)."""
        batches: list[PersistedBatch] = []
        for first, last, state, count, _ in self._runs():
            written_as = _PERSISTED_AS[state]
            if written_as is not None:
                # Not persisted as itself: e.g. the last write for an acquired record was Available
                # with the count before this acquisition (or nothing, for a first delivery).
                state, count = written_as[0], count + written_as[1]
            if state is _AVAILABLE and count == 0:
                continue
            batches.append(PersistedBatch(first, last, state, count))
        return PartitionSnapshot(self._start, tuple(_coalesce(batches)))

    # ----- rebuild -------------------------------------------------------------------------

    @classmethod
    def from_persisted(
        cls,
        config: PartitionConfig,
        snapshot: PartitionSnapshot,
        updates: Iterable[StateDelta] = (),
    ) -> SharePartition:
        """Rebuild from the latest ShareSnapshot and the ShareUpdates written after it, in order.

        A batch in a state the engine cannot resume from -- Acquired (never persisted: it is
        written as the state before acquisition) or a delivery state id it does not know (Kafka's
        3, the extension's 5, or garbage) -- is taken as unfinished: its records are Available
        again with the delivery count it carries. A restart then delivers them once more rather
        than losing or refusing them.
        """
        start = snapshot.start_offset
        overlay: SortedDict = SortedDict()  # first -> PersistedBatch, non-overlapping
        for batch in snapshot.state_batches:
            _overlay(overlay, batch)
        for update in updates:
            if update.start_offset >= 0:
                start = update.start_offset
            for batch in update.state_batches:
                _overlay(overlay, batch)
        partition = cls(config, start)
        cursor = start
        for persisted in overlay.values():
            if persisted.last_offset < start:
                continue
            # An int id too (a caller may pass what it read); `is` checks elsewhere need the member.
            state = RecordState(persisted.delivery_state) if persisted.delivery_state in _RESUMABLE else _AVAILABLE
            first = max(persisted.first_offset, start)
            if first > cursor:
                # Offsets with no persisted state were read but never finished: deliver them again.
                partition._append(_InFlightBatch(cursor, first - 1, _AVAILABLE))
            partition._append(_InFlightBatch(first, persisted.last_offset, state, persisted.delivery_count))
            cursor = persisted.last_offset + 1
        partition._advance_start()
        return partition

    # ----- acquisition ------------------------------------------------------------------------

    def acquire(
        self,
        member_id: str,
        batches: Sequence[RecordBatchHeader],
        *,
        now: int,
        max_records: int,
        batch_size: int | None = None,
        mode: AcquireMode = AcquireMode.BATCH_OPTIMIZED,
        aborted_transactions: Sequence[tuple[int, int]] = (),
    ) -> AcquireResult:
        """Acquire records for ``member_id`` from the log batches the caller read.

        ``batches`` come from one Fetch made at ``next_fetch_offset()``, in offset order;
        ``aborted_transactions`` are the Fetch response's (producer_id, first_offset) pairs.
        Available in-flight records are acquired first, lowest offset first (KIP-932 "In-flight
        records"), then new records beyond SPEO while the record-lock limit allows.
        """
        if not batches or max_records <= 0:
            return AcquireResult((), None)
        record_limit = mode is AcquireMode.RECORD_LIMIT
        batch_size = batch_size if batch_size and batch_size > 0 else max_records
        lo = max(batches[0].base_offset, self._start)
        hi = batches[-1].last_offset
        changes = _Changes()
        start_before = self._start
        out: list[AcquiredRecords] = []
        lock_id = next(self._lock_ids)
        lock = _Lock(now + self.config.record_lock_duration_ms, now)
        self._locks[lock_id] = lock

        remaining = max_records
        stop = False
        if lo < self._end:
            remaining, stop = self._acquire_in_window(member_id, lock_id, lo, min(hi, self._end - 1), remaining,
                                                      record_limit, out)
        if not stop and remaining > 0 and hi >= self._end:
            excluded = self._excluded_batches(batches, aborted_transactions)
            self._acquire_new(member_id, lock_id, batches, excluded, remaining, batch_size, record_limit, out, changes)

        if lock.held == 0:
            del self._locks[lock_id]
        else:
            heapq.heappush(self._deadlines, (lock.deadline, lock_id))
        return AcquireResult(tuple(out), self._finish(changes, old_start=start_before))

    def _acquire_in_window(
        self,
        member_id: str,
        lock_id: int,
        lo: int,
        hi: int,
        remaining: int,
        record_limit: bool,
        out: list[AcquiredRecords],
    ) -> tuple[int, bool]:
        """Re-acquire Available in-flight records within [lo, hi]; returns (remaining, stop)."""
        throttle_at = self.config.throttle_delivery_count
        lo = max(lo, self._available_hint)
        for batch in list(self._batches_from(lo, hi)):
            if remaining <= 0:
                break
            if batch.offsets is None:
                if batch.state is not _AVAILABLE or batch.rollback is not None:
                    continue  # a release not yet durable is not acquirable
                throttled = batch.delivery_count >= throttle_at
                if throttled and out:
                    # Isolate a suspicious batch in a fetch of its own (Kafka's throttled delivery).
                    return remaining, True
                whole = batch.first_offset >= lo and batch.last_offset <= hi
                if whole and not throttled and not (record_limit and batch.size > remaining):
                    self._apply_batch(batch, _ACQUIRE, member_id, lock_id, None)
                    self._emit(out, batch.first_offset, batch.last_offset, batch.delivery_count)
                    remaining -= batch.size
                    continue
                batch.split()
            else:
                throttled = any(
                    h.state is _AVAILABLE and h.delivery_count >= throttle_at for _, h in batch.holders(lo, hi)
                )
                if throttled and out:
                    return remaining, True
            taken = self._acquire_offsets(batch, member_id, lock_id, lo, hi, remaining, record_limit, out)
            remaining -= taken
            if throttled and taken:
                return remaining, True
        return remaining, False

    def _acquire_offsets(
        self,
        batch: _InFlightBatch,
        member_id: str,
        lock_id: int,
        lo: int,
        hi: int,
        remaining: int,
        record_limit: bool,
        out: list[AcquiredRecords],
    ) -> int:
        """Acquire Available offsets of a per-offset batch, honouring throttling near the limit."""
        limit = self.config.delivery_count_limit
        throttle_at = self.config.throttle_delivery_count
        cap: int | None = None
        taken = 0
        run: list[int] = []  # [first, last, delivery count] of the contiguous run acquired so far
        for offset, holder in batch.holders(lo, hi):
            if holder.state is not _AVAILABLE or holder.rollback is not None:
                continue
            count = holder.delivery_count
            # A record on its last attempt goes alone, so a poison record cannot take others with
            # it to the archive (Kafka: only when the limit is above 2).
            if limit > 2 and count == limit - 1 and taken:
                break
            if count >= throttle_at and cap is None:
                # Batches halve with each attempt past the throttle threshold.
                cap = max(1, batch.full_size >> (count - throttle_at + 1))
            self._apply_offset(holder, offset, _ACQUIRE, member_id, lock_id, None)
            if run and run[1] + 1 == offset and run[2] == holder.delivery_count:
                run[1] = offset
            else:
                if run:
                    self._emit(out, *run, merge=True)
                run = [offset, offset, holder.delivery_count]
            taken += 1
            if limit > 2 and holder.delivery_count == limit:
                break
            if record_limit and taken >= remaining:
                break
            if cap is not None and taken >= cap:
                break
        if run:
            self._emit(out, *run, merge=True)
        return taken

    def _excluded_batches(
        self, batches: Sequence[RecordBatchHeader], aborted_transactions: Sequence[tuple[int, int]]
    ) -> set[int]:
        """Indexes of batches never delivered: control batches, and aborted ones under read_committed."""
        excluded = {i for i, b in enumerate(batches) if b.is_control}
        if not self.config.read_committed or not aborted_transactions:
            return excluded
        # The consumer's algorithm: a producer's batches are aborted from the first offset of its
        # aborted transaction until its next control batch (the abort marker).
        pending = sorted(aborted_transactions, key=lambda t: t[1])
        active: set[int] = set()
        next_abort = 0
        for i, b in enumerate(batches):
            while next_abort < len(pending) and pending[next_abort][1] <= b.last_offset:
                active.add(pending[next_abort][0])
                next_abort += 1
            if b.is_control:
                active.discard(b.producer_id)
            elif b.is_transactional and b.producer_id in active:
                excluded.add(i)
        return excluded

    def _acquire_new(
        self,
        member_id: str,
        lock_id: int,
        batches: Sequence[RecordBatchHeader],
        excluded: set[int],
        remaining: int,
        batch_size: int,
        record_limit: bool,
        out: list[AcquiredRecords],
        changes: _Changes,
    ) -> None:
        """Read new records beyond SPEO into the window, acquiring data records."""
        capacity = self.config.max_record_locks - self.in_flight_count
        if capacity <= 0:
            return  # record-lock limit reached: only released records can be acquired (KIP-932)
        # The caller's batches may start before SPEO; skip what is already in the window.
        if not self._batches:
            first_new = next((b.base_offset for b in batches if b.last_offset >= self._end), self._end)
            if first_new > self._end:
                # Nothing in flight and the log has no records here (deleted or compacted away).
                self._start = self._end = self._available_hint = first_new
        limit_end = self._start + self.config.max_record_locks  # exclusive bound of the window
        run_first = -1  # first offset of the acquired run being built
        for i, header in enumerate(batches):
            if header.last_offset < self._end:
                continue
            if remaining <= 0 or self._end >= limit_end:
                break
            first = max(header.base_offset, self._end)
            if first > self._end:
                # Offsets between batches hold no records (compaction): archive, never deliver.
                run_first = self._close_run(run_first, member_id, lock_id, out)
                gap_last = min(first, limit_end) - 1
                self._append_archived(self._end, gap_last, changes)
                if self._end >= limit_end:
                    break
            last = min(header.last_offset, limit_end - 1)
            if i in excluded:
                run_first = self._close_run(run_first, member_id, lock_id, out)
                self._append_archived(first, last, changes)
                continue
            if record_limit and last - first + 1 > remaining:
                # Record-limit mode: acquire exactly what was asked; the rest of the log batch
                # joins the window as Available (as Kafka keeps whole batches in its cache).
                split = first + remaining - 1
                run_first = first if run_first < 0 else run_first
                self._end = split + 1
                run_first = self._close_run(run_first, member_id, lock_id, out)
                self._append(_InFlightBatch(split + 1, last, _AVAILABLE))
                remaining = 0
                break
            if run_first >= 0 and not record_limit and first - run_first >= batch_size:
                # ShareFetch v2 batch_size: split acquired ranges on log-batch boundaries.
                self._close_run(run_first, member_id, lock_id, out)
                run_first = -1
            if run_first < 0:
                run_first = first
            self._end = last + 1
            remaining -= last - first + 1
        self._close_run(run_first, member_id, lock_id, out)

    def _close_run(self, run_first: int, member_id: str, lock_id: int, out: list[AcquiredRecords]) -> int:
        """Turn the pending new-record run [run_first, SPEO) into one acquired in-flight batch."""
        if run_first < 0 or run_first >= self._end:
            return -1
        batch = _InFlightBatch(run_first, self._end - 1, _AVAILABLE)
        self._append(batch)
        self._apply_batch(batch, _ACQUIRE, member_id, lock_id, None)
        self._emit(out, batch.first_offset, batch.last_offset, batch.delivery_count)
        return -1

    def _append(self, batch: _InFlightBatch) -> None:
        """Add a batch at the end of the window (it must start at, or extend, SPEO)."""
        self._batches[batch.first_offset] = batch
        if batch.last_offset + 1 > self._end:
            self._end = batch.last_offset + 1

    def _append_archived(self, first: int, last: int, changes: _Changes) -> None:
        if last < first:
            return
        self._append(_InFlightBatch(first, last, _ARCHIVED))
        changes.add(first, last, _ARCHIVED, 0)

    # ----- acknowledgement ------------------------------------------------------------------------

    def acknowledge(self, member_id: str, ranges: Sequence[AckRange], *, now: int) -> StateDelta | None:
        """Apply a member's acknowledgements to this partition, all or nothing, and commit at once.

        Ranges must be ascending and non-overlapping with known types (else INVALID_REQUEST); every
        offset at or above SPSO must be Acquired by ``member_id`` (else INVALID_RECORD_STATE).
        Offsets below SPSO are already finished and are skipped, as Kafka does. A caller that
        persists before committing uses :meth:`stage_acknowledge` instead.
        """
        return self._acknowledge(member_id, ranges, now=now)

    def stage_acknowledge(self, member_id: str, ranges: Sequence[AckRange], *, now: int) -> StagedChange | None:
        """Apply acknowledgements as a staged change (Kafka's two-phase state transition).

        The records take their new state at once -- so the snapshot written next carries it -- but
        until :meth:`commit` the SPSO does not move over them and released records are not
        acquired again; :meth:`rollback` restores what they were (Acquired by ``member_id``, under
        their lock) when the state write fails, so the member's retry succeeds. Renewals persist
        nothing and are not staged. Returns None when nothing durable changed.
        """
        change_id = next(self._change_ids)
        self._staging = change_id
        try:
            delta = self._acknowledge(member_id, ranges, now=now)
        finally:
            self._staging = 0
        if change_id not in self._staged:
            return None if delta is None else StagedChange(0, delta)
        return StagedChange(change_id, delta or StateDelta(-1, ()))

    def commit(self, change_id: int) -> StateDelta | None:
        """The staged change is durable: keep it, and move SPSO over what it finished."""
        ranges = self._staged.pop(change_id, None)
        if not ranges:
            return None
        start_before = self._start
        for first, last in ranges:
            for batch in self._batches_from(first, last):
                if batch.offsets is None:
                    if batch.rollback is not None and batch.rollback.change_id == change_id:
                        batch.rollback = None
                        self._lower_hint(batch, batch.first_offset)
                    continue
                for offset, holder in batch.holders(first, last):
                    if holder.rollback is not None and holder.rollback.change_id == change_id:
                        holder.rollback = None
                        self._lower_hint(holder, offset)
        return self._finish(_Changes(), old_start=start_before)

    def rollback(self, change_id: int) -> None:
        """The staged change's state write failed: put its records back as they were."""
        ranges = self._staged.pop(change_id, None)
        for first, last in ranges or ():
            for batch in list(self._batches_from(first, last)):
                if batch.offsets is None:
                    if batch.rollback is not None and batch.rollback.change_id == change_id:
                        self._restore(batch, batch.first_offset, batch.last_offset)
                    continue
                for offset, holder in batch.holders(first, last):
                    if holder.rollback is not None and holder.rollback.change_id == change_id:
                        self._restore(holder, offset, offset)

    @property
    def staged_changes(self) -> int:
        """Staged changes not yet committed or rolled back."""
        return len(self._staged)

    def _restore(self, holder: _InFlightBatch | _OffsetState, first: int, last: int) -> None:
        saved = holder.rollback
        assert saved is not None
        holder.rollback = None
        holder.state = saved.state
        holder.delivery_count = saved.delivery_count
        holder.member_id = saved.member_id
        holder.lock_id = saved.lock_id
        if not _HOLDS_LOCK[saved.state]:
            return
        lock = self._locks.get(saved.lock_id)
        if lock is None:
            # The lock was dropped when its last record left Acquired: bring it back, deadline
            # unchanged (a lock that ran out meanwhile expires at the next expire()).
            lock = self._locks[saved.lock_id] = _Lock(saved.lock_deadline, saved.acquired_at)
            heapq.heappush(self._deadlines, (lock.deadline, saved.lock_id))
        lock.held += last - first + 1
        lock.first_offset = min(lock.first_offset, first)
        lock.last_offset = max(lock.last_offset, last)

    def _drop_staging(self, first: int, last: int) -> None:
        for batch in list(self._batches_from(first, last)):
            if batch.offsets is None:
                if batch.rollback is None:
                    continue
                if batch.first_offset >= first and batch.last_offset <= last:
                    batch.rollback = None
                    continue
                batch.split()
            for _, holder in batch.holders(first, last):
                holder.rollback = None

    def _stage(self, holder: _InFlightBatch | _OffsetState, first: int, last: int) -> None:
        """Remember what `holder` is before the staged change moves it (see stage_acknowledge)."""
        change_id = self._staging
        saved = self._last_rollback
        # Offsets of one batch mostly replace the same thing: share one saved state between them.
        if (saved is None or saved.change_id != change_id or saved.state is not holder.state
                or saved.delivery_count != holder.delivery_count or saved.member_id != holder.member_id
                or saved.lock_id != holder.lock_id):
            lock = self._locks.get(holder.lock_id)
            saved = self._last_rollback = _Rollback(change_id, holder.state, holder.delivery_count,
                                                    holder.member_id, holder.lock_id,
                                                    lock.deadline if lock is not None else 0,
                                                    lock.acquired_at if lock is not None else -1)
        holder.rollback = saved
        ranges = self._staged.setdefault(change_id, [])
        if ranges and ranges[-1][1] + 1 == first:
            ranges[-1] = (ranges[-1][0], last)
        else:
            ranges.append((first, last))

    def _lower_hint(self, holder: _InFlightBatch | _OffsetState, offset: int) -> None:
        if holder.state is _AVAILABLE and offset < self._available_hint:
            self._available_hint = offset

    def _acknowledge(self, member_id: str, ranges: Sequence[AckRange], *, now: int) -> StateDelta | None:
        self._validate_ack_ranges(ranges)
        # Pass 1: validate everything before touching anything (atomic per partition).
        for ack in ranges:
            self._check_ack(member_id, ack)
        # Pass 2: apply.
        changes = _Changes()
        renew_lock_id = 0
        for ack in ranges:
            first = max(ack.first_offset, self._start)
            last = ack.last_offset
            if first > last:
                continue
            types = ack.acknowledge_types
            if not renew_lock_id and _RENEW_TYPE in types:
                renew_lock_id = next(self._lock_ids)
                self._locks[renew_lock_id] = _Lock(now + self.config.record_lock_duration_ms, now)
            single = _ACK_ROWS[types[0]] if len(types) == 1 else None
            for batch in list(self._batches_from(first, last)):
                if single is not None and batch.offsets is None and batch.first_offset >= first \
                        and batch.last_offset <= last:
                    self._apply_batch(batch, single, member_id, renew_lock_id, changes)
                    continue
                offsets = batch.split()
                base = batch.first_offset
                for offset in range(max(first, base), min(last, batch.last_offset) + 1):
                    row = single if single is not None else _ACK_ROWS[types[offset - ack.first_offset]]
                    self._apply_offset(offsets[offset - base], offset, row, member_id, renew_lock_id, changes)
        if renew_lock_id:
            lock = self._locks.get(renew_lock_id)
            if lock is not None:
                heapq.heappush(self._deadlines, (lock.deadline, renew_lock_id))
        return self._finish(changes)

    @staticmethod
    def _validate_ack_ranges(ranges: Sequence[AckRange]) -> None:
        previous_last = -1
        for ack in ranges:
            if ack.first_offset < 0 or ack.first_offset > ack.last_offset:
                raise ShareStateError(INVALID_REQUEST, f"bad acknowledgement range {ack.first_offset}-{ack.last_offset}")
            if ack.first_offset <= previous_last:
                raise ShareStateError(INVALID_REQUEST, "acknowledgement ranges must be ascending and non-overlapping")
            size = ack.last_offset - ack.first_offset + 1
            if len(ack.acknowledge_types) not in (1, size):
                raise ShareStateError(INVALID_REQUEST, "acknowledge types must be one, or one per offset")
            for ack_type in ack.acknowledge_types:
                if ack_type not in AcknowledgeType._value2member_map_:
                    raise ShareStateError(INVALID_REQUEST, f"unknown acknowledge type {ack_type}")
            previous_last = ack.last_offset

    def _check_ack(self, member_id: str, ack: AckRange) -> None:
        """Every offset of ``ack`` at or above SPSO is Acquired by the member and may take its type."""
        first = max(ack.first_offset, self._start)
        last = ack.last_offset
        if first > last:
            return
        if last >= self._end:
            raise ShareStateError(INVALID_RECORD_STATE, f"offset {max(first, self._end)} was not acquired")
        types = ack.acknowledge_types
        for batch in self._batches_from(first, last):
            lo = max(first, batch.first_offset)
            hi = min(last, batch.last_offset)
            if batch.offsets is None:
                used = types if len(types) == 1 else set(types[lo - ack.first_offset:hi - ack.first_offset + 1])
                for ack_type in used:
                    self._check_holder(batch, member_id, ack_type, lo)
            else:
                for offset, holder in batch.holders(lo, hi):
                    self._check_holder(holder, member_id, types[0 if len(types) == 1 else offset - ack.first_offset],
                                       offset)

    @staticmethod
    def _check_holder(holder: _InFlightBatch | _OffsetState, member_id: str, ack_type: int, offset: int) -> None:
        if not _HOLDS_OWNER[holder.state] or holder.member_id != member_id:
            raise ShareStateError(
                INVALID_RECORD_STATE, f"offset {offset} is {holder.state.name}, not acquired by this member"
            )
        if _ACK_ROWS[ack_type][holder.state] is None:
            raise ShareStateError(
                INVALID_RECORD_STATE, f"{AcknowledgeType(ack_type).name} not allowed in state {holder.state.name}"
            )

    # ----- releases ------------------------------------------------------------------------

    def expire(self, now: int) -> StateDelta | None:
        """Release every record whose acquisition lock deadline is at or before ``now``."""
        changes = _Changes()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lock_id = heapq.heappop(self._deadlines)
            lock = self._locks.get(lock_id)
            if lock is None or lock.deadline != deadline:
                continue
            self._release_acquired(
                self._batches_from(lock.first_offset, lock.last_offset), lock.first_offset, lock.last_offset,
                lambda holder, lock_id=lock_id: holder.lock_id == lock_id, _LOCK_EXPIRED, changes,
            )
        return self._finish(changes)

    def release_member(self, member_id: str) -> StateDelta | None:
        """Release a departed member's records (session closed / member left).

        Kafka undoes the delivery-count increment here: the records may never have reached the
        application, so this is not a delivery attempt and never archives.
        """
        changes = _Changes()
        self._release_acquired(
            self._batches.values(), self._start, self._end - 1,
            lambda holder: holder.member_id == member_id, _MEMBER_LEFT, changes,
        )
        return self._finish(changes)

    def newest_acquisition(self, member_id: str, first: int, last: int) -> int:
        """The latest lock id (see acquisition_mark) among the records in [first, last] that
        ``member_id`` holds Acquired; 0 when it holds none there."""
        newest = 0
        for batch in self._batches_from(max(first, self._start), last):
            if batch.offsets is None:
                if _HOLDS_OWNER[batch.state] and batch.member_id == member_id and batch.lock_id > newest:
                    newest = batch.lock_id
            else:
                for _, holder in batch.holders(first, last):
                    if _HOLDS_OWNER[holder.state] and holder.member_id == member_id and holder.lock_id > newest:
                        newest = holder.lock_id
        return newest

    def release_abandoned(self, member_id: str, through: int) -> StateDelta | None:
        """Release the records ``member_id`` acquired up to the mark ``through`` (see acquisition_mark)
        and still holds, as if their locks had expired: the member got them but will never acknowledge
        them, so the delivery counts (and may archive at the limit)."""
        changes = _Changes()
        self._release_acquired(
            self._batches.values(), self._start, self._end - 1,
            lambda holder: holder.member_id == member_id and holder.lock_id <= through, _LOCK_EXPIRED, changes,
        )
        return self._finish(changes)

    def _release_acquired(
        self, batches: Iterable[_InFlightBatch], first: int, last: int,
        selected: Callable[[_InFlightBatch | _OffsetState], bool], row: tuple, changes: _Changes,
    ) -> None:
        """Apply one event (its table ``row``) to the Acquired records in [first, last] whose holder
        is `selected`."""
        for batch in list(batches):
            if batch.offsets is None:
                if _HOLDS_LOCK[batch.state] and row[batch.state] is not None and selected(batch):
                    self._apply_batch(batch, row, None, 0, changes)
            else:
                for offset, holder in batch.holders(first, last):
                    if _HOLDS_LOCK[holder.state] and row[holder.state] is not None and selected(holder):
                        self._apply_offset(holder, offset, row, None, 0, changes)

    # ----- SPSO moves from outside ----------------------------------------------------------------

    def advance_log_start(self, log_start_offset: int) -> StateDelta | None:
        """Records below ``log_start_offset`` were deleted by retention: archive them, move SPSO."""
        if log_start_offset <= self._start:
            return None
        changes = _Changes()
        start_before = self._start
        cut = min(log_start_offset, self._end) - 1
        if cut >= self._start:
            self._drop_staging(self._start, cut)  # the records are gone: nothing left to roll back
            self._apply_range(self._start, cut, _ROWS[Event.ARCHIVE], None, 0, changes, only_live=True)
        if log_start_offset >= self._end:
            # Everything in flight is gone; the window restarts empty at the new log start.
            self._batches.clear()
            self._start = self._end = self._available_hint = log_start_offset
        # Archived records all lie below the new SPSO: the delta is just the start offset.
        return self._finish(changes, old_start=start_before)

    def reset(self, start_offset: int) -> PartitionSnapshot:
        """Discard all in-flight state and restart at ``start_offset`` (alter-offsets on an empty group).

        The caller resolves latest / earliest / by-timestamp to an offset. Returns the ShareSnapshot
        to write, which supersedes every earlier record.
        """
        if start_offset < 0:
            raise ValueError(f"start_offset {start_offset} < 0")
        self._batches.clear()
        self._locks.clear()
        self._deadlines.clear()
        self._staged.clear()
        self._start = self._end = self._available_hint = start_offset
        return self.snapshot()

    # ----- internals ------------------------------------------------------------------------

    def _apply_range(
        self,
        first: int,
        last: int,
        row: tuple,
        member_id: str | None,
        lock_id: int,
        changes: _Changes,
        *,
        only_live: bool = False,
    ) -> None:
        """Apply one event (its table ``row``) to every offset in [first, last] (pre-validated,
        or ``only_live``: skip records already terminal)."""
        for batch in list(self._batches_from(first, last)):
            if batch.offsets is None:
                if only_live and _IS_TERMINAL[batch.state]:
                    continue
                if batch.first_offset >= first and batch.last_offset <= last:
                    self._apply_batch(batch, row, member_id, lock_id, changes)
                    continue
                batch.split()
            for offset, holder in batch.holders(first, last):
                if only_live and _IS_TERMINAL[holder.state]:
                    continue
                self._apply_offset(holder, offset, row, member_id, lock_id, changes)

    def _apply_batch(
        self, batch: _InFlightBatch, row: tuple, member_id: str | None, lock_id: int, changes: _Changes | None
    ) -> None:
        self._transit(batch, row, member_id, lock_id, batch.first_offset, batch.last_offset)
        if changes is not None and _PERSISTED[batch.state]:
            changes.add(batch.first_offset, batch.last_offset, batch.state, batch.delivery_count)
        if batch.state is _AVAILABLE and batch.first_offset < self._available_hint:
            self._available_hint = batch.first_offset

    def _apply_offset(
        self,
        holder: _OffsetState,
        offset: int,
        row: tuple,
        member_id: str | None,
        lock_id: int,
        changes: _Changes | None,
    ) -> None:
        self._transit(holder, row, member_id, lock_id, offset, offset)
        if changes is not None and _PERSISTED[holder.state]:
            changes.add(offset, offset, holder.state, holder.delivery_count)
        if holder.state is _AVAILABLE and offset < self._available_hint:
            self._available_hint = offset

    def _transit(
        self,
        holder: _InFlightBatch | _OffsetState,
        row: tuple,
        member_id: str | None,
        lock_id: int,
        first: int,
        last: int,
    ) -> None:
        """One table-driven move of the records [first, last] that share ``holder``'s state."""
        move = row[holder.state]
        if move is None:  # callers validate first: an illegal move here is an engine bug
            raise AssertionError(f"no transition from {holder.state.name} for records {first}-{last}")
        count = holder.delivery_count + move.delivery_delta
        new_state = move.new_state
        if move.archive_at_limit and count >= self._delivery_count_limit:
            new_state = _ARCHIVED
        n = last - first + 1
        if self._staging and _PERSISTED[new_state]:
            self._stage(holder, first, last)
        elif holder.rollback is not None:
            holder.rollback = None  # a later, unstaged change (e.g. log truncation) supersedes it
        if _HOLDS_LOCK[holder.state]:
            lock = self._locks.get(holder.lock_id)
            if lock is not None:
                if _HOLDS_OWNER[new_state]:
                    # A renewal: the records are still held since their acquisition.
                    renewed = self._locks[lock_id]
                    if lock.acquired_at < renewed.acquired_at:
                        renewed.acquired_at = lock.acquired_at
                lock.held -= n
                if lock.held <= 0:
                    del self._locks[holder.lock_id]
        holder.state = new_state
        holder.delivery_count = count
        if _HOLDS_OWNER[new_state]:
            if not move.keeps_owner or member_id is None:
                raise AssertionError("a move to ACQUIRED must name the member")
            holder.member_id = member_id
            holder.lock_id = lock_id
            lock = self._locks[lock_id]
            lock.held += n
            # The lock's scan range covers every record it holds, for expire().
            if first < lock.first_offset:
                lock.first_offset = first
            if last > lock.last_offset:
                lock.last_offset = last
        else:
            holder.member_id = None
            holder.lock_id = 0

    @staticmethod
    def _emit(
        out: list[AcquiredRecords], first: int, last: int, delivery_count: int, *, merge: bool = False
    ) -> None:
        """Add an acquired range; per-offset acquisitions merge into the previous range when
        contiguous with an equal count (whole batches keep their own range, as batch_size wants)."""
        if merge and out:
            prev = out[-1]
            if prev.last_offset + 1 == first and prev.delivery_count == delivery_count:
                out[-1] = AcquiredRecords(prev.first_offset, last, delivery_count)
                return
        out.append(AcquiredRecords(first, last, delivery_count))

    def _batch_at(self, offset: int) -> _InFlightBatch:
        index = self._batches.bisect_right(offset) - 1
        return self._batches.peekitem(index)[1]

    def _batches_from(self, first: int, last: int | None = None) -> Iterator[_InFlightBatch]:
        """In-flight batches overlapping [first, last] (to SPEO when ``last`` is None), in order."""
        if not self._batches:
            return
        batches = self._batches
        for key in batches.islice(max(batches.bisect_right(first) - 1, 0)):
            batch = batches[key]
            if last is not None and batch.first_offset > last:
                return
            if batch.last_offset >= first:
                yield batch

    def _runs(self) -> Iterator[tuple[int, int, RecordState, int, str | None]]:
        for batch in self._batches.values():
            if batch.offsets is None:
                yield batch.first_offset, batch.last_offset, batch.state, batch.delivery_count, batch.member_id
            else:
                for offset, h in batch.holders(batch.first_offset, batch.last_offset):
                    yield offset, offset, h.state, h.delivery_count, h.member_id

    def _advance_start(self) -> None:
        """Move SPSO over contiguous terminal records and drop them (KIP-932 "Managing the SPSO")."""
        while self._batches:
            first, batch = self._batches.peekitem(0)
            if batch.offsets is None:
                if not _IS_TERMINAL[batch.state] or batch.rollback is not None:
                    break  # not finished, or finished by a change not yet durable
                del self._batches[first]
                self._start = batch.last_offset + 1
                continue
            skip = 0
            for holder in batch.offsets:
                if not _IS_TERMINAL[holder.state] or holder.rollback is not None:
                    break
                skip += 1
            if skip == len(batch.offsets):
                del self._batches[first]
                self._start = batch.last_offset + 1
                continue
            if skip:
                del self._batches[first]
                batch.offsets = batch.offsets[skip:]
                batch.first_offset += skip
                self._batches[batch.first_offset] = batch
                self._start = batch.first_offset
            break
        if not self._batches:
            self._start = max(self._start, self._end)
            self._end = self._start
        if self._available_hint < self._start:
            self._available_hint = self._start

    def _finish(self, changes: _Changes, old_start: int | None = None) -> StateDelta | None:
        """Advance SPSO, then describe what must be persisted (None when nothing)."""
        before = self._start if old_start is None else old_start
        self._advance_start()
        moved = self._start != before
        changed = tuple(_coalesce(changes.batches))
        batches = _clip(changed, self._start)
        if not moved and not batches:
            return None
        return StateDelta(self._start if moved else -1, batches, changed)


def _clip(batches: Iterable[PersistedBatch], start: int) -> tuple[PersistedBatch, ...]:
    """The batches' parts at or above ``start`` (the SPSO: nothing below it is persisted)."""
    return tuple(
        b if b.first_offset >= start else PersistedBatch(start, b.last_offset, b.delivery_state, b.delivery_count)
        for b in batches
        if b.last_offset >= start
    )


def _overlay(overlay: SortedDict, batch: PersistedBatch) -> None:
    """Write ``batch`` over a map of non-overlapping persisted batches, splitting what it covers."""
    first, last = batch.first_offset, batch.last_offset
    index = max(overlay.bisect_right(first) - 1, 0)
    covered = [b for b in overlay.values()[index:] if b.first_offset <= last and b.last_offset >= first]
    for old in covered:
        del overlay[old.first_offset]
        if old.first_offset < first:
            overlay[old.first_offset] = PersistedBatch(old.first_offset, first - 1, old.delivery_state, old.delivery_count)
        if old.last_offset > last:
            overlay[last + 1] = PersistedBatch(last + 1, old.last_offset, old.delivery_state, old.delivery_count)
    overlay[first] = batch
