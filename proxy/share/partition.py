"""The share-partition engine: in-flight record state of one (group, topic id, partition).

Theory of operation
-------------------
A share-partition is a sliding window over a topic-partition's log (KIP-932 "In-flight
records"). Offsets below the share-partition start offset (SPSO) are finished (Archived); offsets
from the share-partition end offset (SPEO, exclusive here, as in the KIP's worked example) on have
not been read yet and are implicitly Available with delivery count 0. In between lie the in-flight
records, each Available, Acquired (by one member, with a lock deadline), IN_PROGRESS (by one
member, held by its progress marks), Acknowledged or Archived, and each with a delivery count.

The window is stored as in-flight batches keyed by first offset in a ``SortedDict`` that tiles
[SPSO, SPEO) without holes, so looking up an offset is a floor search (O(log n)). A batch keeps one
state for all its offsets while they move together -- the common case: a log batch is acquired
whole and accepted whole -- and splits into per-offset states the first time an operation touches
only part of it (as Kafka's ``InFlightBatch``/``InFlightState``). Per-offset state is
copy-on-write: equal neighbours share one state object, and when an operation ends they are merged
again -- a batch whose offsets all agree back into one uniform batch -- so a release-heavy window
does not stay per offset (see :class:`_InFlightBatch`). Every state change goes through
the transition table in :mod:`proxy.share.states`.

The engine does no I/O and reads no clock: each call that depends on time takes ``now`` (ms), and
the caller drives lock expiry with ``next_deadline()`` / ``expire(now)``. The caller also reads the
log: ``acquire`` takes the record-batch headers of a Fetch made from ``next_fetch_offset()``.

IN_PROGRESS (draft KIP KAFKA-20458): an owned record is under a ``_Lock`` -- for ACQUIRED records
the acquisition lock shared by one acquire (or renew) call, with its deadline in a heap; for
IN_PROGRESS records a *progress hold* with no deadline, shared by the records one mark moved from
one previous holder, carrying acquired_at, in_progress_start, last_progress, the owner and (after
its member left) a grace deadline. A mark moves records to a new hold (keeping the start of a
refreshed one), so per-offset memory stays one lock id. IN_PROGRESS records are released by
``release_in_progress(now)``: the sweep, due every staleness threshold / 4 while any exist
(``next_deadline()`` reports it, with grace deadlines), releases stale and over-extended ones, and
grace deadlines release a departed member's fresh work. No IN_PROGRESS path changes the delivery
count (counted once, at acquisition). IN_PROGRESS is persisted as itself with owner and times.

Every change that must survive a restart yields a :class:`StateDelta` -- the content of one
ShareUpdate record (new start offset or -1, and the changed state batches; IN_PROGRESS batches
with their owner and times). Acquired records are never persisted (KIP-932 "Managing durable share-partition state"), so after a restart
(:meth:`SharePartition.from_persisted`) a record that was Acquired for the k-th time comes back as
it was last written: Available with delivery count k-1 (nothing at all if k was 1).

*Changed ranges.* Every move of a record's state (and every batch added to the window) also
notes its offsets in a list that :meth:`SharePartition.drain_changed` hands over and clears. The
commit pipeline drains it at every state write, so it names, as a superset, the offsets whose
persisted view may differ from what the previous write saw; with :meth:`persisted_view` of just
those offsets it rebuilds the snapshot and the cumulative update without walking the whole window
(``proxy.share.state_delta.splice``). The list is "unknown" (None) for a new engine, after
:meth:`reset` and once it grows past ``_CHANGED_RANGES_LIMIT``: the caller then snapshots the whole
window, as it would without the list.

Errors a client can cause raise :class:`ShareStateError` carrying a Kafka error code; the whole
acknowledgement of a partition is validated before any of it is applied (all or nothing).
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from sortedcontainers import SortedDict

from codec.share_events import DEAD_LETTER_REASONS, ArchiveReason, EventKind
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
    "ArchivingRun",
    "BatchHeader",
    "InFlightRun",
    "InProgressRelease",
    "PartitionConfig",
    "PartitionSnapshot",
    "PersistedBatch",
    "RecordBatchHeader",
    "RecordEvent",
    "ReleaseReason",
    "SharePartition",
    "SharePartitionKey",
    "ShareStateError",
    "StagedChange",
    "StateDelta",
    "acquisition_mark",
]

# What names a share-partition across the proxy: (group id, topic id, partition).
SharePartitionKey = tuple[str, uuid.UUID, int]

# Kafka error codes (org.apache.kafka.common.protocol.Errors).
INVALID_REQUEST = 42
INVALID_RECORD_STATE = 121

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVED = RecordState.ARCHIVED
_ARCHIVING = RecordState.ARCHIVING
_IN_PROGRESS = RecordState.IN_PROGRESS
_NO_REASON = ArchiveReason.NONE
_DELIVERY_LIMIT = ArchiveReason.DELIVERY_LIMIT

_NO_OFFSET = 2**63
# Changed ranges kept between two drains at most (see drain_changed): past it the engine stops
# counting and the next write compares the whole window, so a partition whose writes stall (an
# outage) does not grow the list without bound.
_CHANGED_RANGES_LIMIT = 4096
_STATE_IDS = range(8)  # room for ARCHIVING (3), IN_PROGRESS (5) and beyond


class _Row(tuple):
    """The table's column for one event, indexed by state id (hot loops then index a tuple instead
    of hashing enum pairs), with the event-log kind the event is reported as (None: not reported
    by itself, e.g. a GAP or a log truncation, whose ARCHIVED event says it all)."""

    kind: EventKind | None
    kind_id: int


# What the event log calls each engine event (docs/event-log.md).
_EVENT_KINDS: dict[Event, EventKind | None] = {
    Event.ACQUIRE: EventKind.ACQUIRED,
    Event.ACCEPT: EventKind.ACCEPTED,
    Event.RELEASE: EventKind.RELEASED,
    Event.REJECT: EventKind.REJECTED,
    Event.GAP: None,
    Event.RENEW: EventKind.RENEWED,
    Event.LOCK_EXPIRED: EventKind.LOCK_EXPIRED,
    Event.MEMBER_LEFT: EventKind.MEMBER_RELEASED,
    Event.ARCHIVE: None,
    Event.MARK: EventKind.MARKED_IN_PROGRESS,
    Event.STALE: EventKind.STALE_RELEASED,
    Event.MAX_EXTENSION: EventKind.MAX_EXTENSION_RELEASED,
    Event.GRACE_EXPIRED: EventKind.GRACE_EXPIRED,
    Event.DEAD_LETTER: EventKind.DEAD_LETTERED,
}


def _row(event: Event, kind: EventKind | None) -> _Row:
    by_id = {int(state): move for (state, e), move in TRANSITIONS.items() if e is event}
    row = _Row(by_id.get(i) for i in _STATE_IDS)
    row.kind = kind
    row.kind_id = 0 if kind is None else int(kind)
    return row


_ROWS: dict[Event, _Row] = {event: _row(event, _EVENT_KINDS[event]) for event in Event}
# finish_archiving() when the dead-letter write was given up: ARCHIVED, not DEAD_LETTERED.
_ARCHIVE_UNLETTERED = _row(Event.DEAD_LETTER, None)
_ACK_ROWS: tuple = tuple(_ROWS[ACK_EVENTS[t]] for t in sorted(ACK_EVENTS))  # indexed by wire type


def _trait(name: str, default: object = False) -> tuple:
    """One column of the states table, indexed by state id (hot loops index tuples)."""
    by_id = {int(state): getattr(traits, name) for state, traits in STATE_TRAITS.items()}
    return tuple(by_id.get(i, default) for i in _STATE_IDS)


_IS_TERMINAL: tuple[bool, ...] = _trait("terminal")
_HOLDS_OWNER: tuple[bool, ...] = _trait("holds_owner")
_HOLDS_LOCK: tuple[bool, ...] = _trait("holds_lock")
_PERSISTED: tuple[bool, ...] = _trait("persisted", True)
_PROGRESS_HELD: tuple[bool, ...] = _trait("progress_held")
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
_MARK = _ROWS[Event.MARK]
_STALE = _ROWS[Event.STALE]
_MAX_EXTENSION = _ROWS[Event.MAX_EXTENSION]
_GRACE_EXPIRED = _ROWS[Event.GRACE_EXPIRED]
_DEAD_LETTER = _ROWS[Event.DEAD_LETTER]
_ARCHIVING_KIND = EventKind.ARCHIVING
_DEAD_LETTERED_KIND = EventKind.DEAD_LETTERED
_ARCHIVED_KIND = EventKind.ARCHIVED
_ARCHIVING_KIND_ID = int(EventKind.ARCHIVING)
_ARCHIVED_KIND_ID = int(EventKind.ARCHIVED)
_RENEW_TYPE = int(AcknowledgeType.RENEW)
_NOT_IN_PROGRESS: tuple[int, int, None] = (-1, -1, None)


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
    ``in_progress_staleness_threshold_ms``: ``share.in.progress.staleness.threshold.ms`` -- an
    IN_PROGRESS record with no progress for longer is released by the sweeper (every threshold/4).
    ``in_progress_max_lock_extension_ms``: ``share.in.progress.max.lock.extension.ms`` -- the longest
    a record may stay IN_PROGRESS, progress or not.
    ``in_progress_rebalance_grace_ms``: ``share.in.progress.rebalance.grace.ms`` -- how long a departed
    member's fresh IN_PROGRESS records are held for it.
    The proxy's flags and group configs bound these; the engine only refuses values it cannot run.
    """

    delivery_count_limit: int = 5
    record_lock_duration_ms: int = 30_000
    max_record_locks: int = 2000
    read_committed: bool = False
    in_progress_staleness_threshold_ms: int = 90_000
    in_progress_max_lock_extension_ms: int = 1_800_000
    in_progress_rebalance_grace_ms: int = 5_000
    # KIP-1191: the group has a dead-letter topic (``errors.deadletterqueue.topic.name`` set): a
    # reject or an archive at the delivery limit goes to ARCHIVING until the dead-letter writer
    # calls finish_archiving().
    dead_letter: bool = False

    def __post_init__(self) -> None:
        if not 2 <= self.delivery_count_limit <= 10:
            raise ValueError(f"delivery_count_limit {self.delivery_count_limit} not in [2, 10]")
        if not 1000 <= self.record_lock_duration_ms <= 3_600_000:
            raise ValueError(f"record_lock_duration_ms {self.record_lock_duration_ms} not in [1000, 3600000]")
        if not 100 <= self.max_record_locks <= 10_000:
            raise ValueError(f"max_record_locks {self.max_record_locks} not in [100, 10000]")
        if self.in_progress_staleness_threshold_ms < 4:
            raise ValueError(f"in_progress_staleness_threshold_ms {self.in_progress_staleness_threshold_ms} < 4")
        if self.in_progress_max_lock_extension_ms < 1:
            raise ValueError(f"in_progress_max_lock_extension_ms {self.in_progress_max_lock_extension_ms} < 1")
        if self.in_progress_rebalance_grace_ms < 0:
            raise ValueError(f"in_progress_rebalance_grace_ms {self.in_progress_rebalance_grace_ms} < 0")

    @property
    def sweep_interval_ms(self) -> int:
        """How often the staleness sweep runs while records are IN_PROGRESS (draft KIP §3.3: threshold / 4)."""
        return self.in_progress_staleness_threshold_ms // 4

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
    lock_deadline: int  # ms on the engine's clock, -1 when not under the acquisition lock
    in_progress_start: int = -1  # engine clock ms of the first mark, -1 when not IN_PROGRESS
    last_progress: int = -1  # engine clock ms of the latest mark
    grace_deadline: int = -1  # set while held for a departed member (rebalance grace)


class PersistedBatch(NamedTuple):
    """A state batch as persisted: (first_offset, last_offset, delivery_state, delivery_count).

    IN_PROGRESS batches also carry their owner and times (state-record tags 100-102); the times are
    on the engine's clock here, and ``state_store`` converts them to and from wall-clock time.
    ARCHIVING batches carry why they are archived (tag 103; NONE = unknown, e.g. written by Kafka).

    A named tuple, not a frozen dataclass: every state write makes one per run of a fragmented
    window, and a frozen dataclass took 3.5x as long to build (1.27 against 0.36 µs)."""

    first_offset: int
    last_offset: int
    delivery_state: RecordState
    delivery_count: int
    in_progress_start: int = -1
    last_progress: int = -1
    member_id: str | None = None
    archive_reason: ArchiveReason = ArchiveReason.NONE

    @property
    def content(self) -> tuple:
        """Everything but the offsets: equal contents of adjacent batches merge into one."""
        return self[2:]  # (delivery_state, delivery_count, in_progress_start, last_progress, member_id, archive_reason)


class RecordEvent(NamedTuple):
    """What happened to the records [first_offset, last_offset] (one entry of the event log; a
    named tuple, for what PersistedBatch is one).

    ``member_id`` is the member that acted, or the former holder on expiry / release paths (None when
    none). ``delivery_count`` is the records' count after the event. ``reason`` is set on ARCHIVING,
    ARCHIVED and DEAD_LETTERED events (NONE on the others). No timestamp: the engine reads no clock (the publisher stamps events)."""

    kind: EventKind
    first_offset: int
    last_offset: int
    member_id: str | None
    delivery_count: int
    reason: ArchiveReason = ArchiveReason.NONE


@dataclass(frozen=True, slots=True)
class ArchivingRun:
    """Offsets [first_offset, last_offset] ARCHIVING with one delivery count and reason: one
    dead-letter write each (see :meth:`SharePartition.archiving`)."""

    first_offset: int
    last_offset: int
    delivery_count: int
    reason: ArchiveReason


@dataclass(frozen=True, slots=True)
class StateDelta:
    """ShareUpdate content: ``start_offset`` is the new SPSO, or -1 when it did not move."""

    start_offset: int
    state_batches: tuple[PersistedBatch, ...]
    # Every record the change moved, including those the SPSO then passed (not persisted, so
    # not in state_batches): what metrics count. Not part of the persisted content.
    changed: tuple[PersistedBatch, ...] = field(default=(), compare=False)
    # What happened, in order, coalesced (the event log's input). Not part of the persisted content.
    events: tuple[RecordEvent, ...] = field(default=(), compare=False)


class ReleaseReason(enum.Enum):
    """Why IN_PROGRESS records were released (metrics label them so)."""

    STALENESS = "staleness"
    MAX_EXTENSION = "max_extension"
    GRACE_EXPIRY = "grace_expiry"


@dataclass(frozen=True, slots=True)
class InProgressRelease:
    """IN_PROGRESS records released (or archived at the delivery limit) for one reason."""

    reason: ReleaseReason
    delta: StateDelta | None  # what to persist for this reason (None if nothing)
    records: int


# Release reasons in the order release_in_progress() reports them, with their table rows.
_RELEASE_ROWS = (
    (ReleaseReason.STALENESS, _STALE),
    (ReleaseReason.MAX_EXTENSION, _MAX_EXTENSION),
    (ReleaseReason.GRACE_EXPIRY, _GRACE_EXPIRED),
)


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
    """Records handed to the member, and what to persist (archived control/aborted records).

    ``events``: ACQUIRED events (the member, the new delivery count) for what was handed over, and
    ARCHIVED events for control / aborted / gap records met on the way, in offset order. Acquired
    records are not persisted, so the ACQUIRED events are not in ``delta``; the ARCHIVED ones are
    in both (``delta.events``): the caller records the delta and passes :attr:`delivered` to
    ``CommitPipeline.note_delivered``."""

    acquired: tuple[AcquiredRecords, ...]
    delta: StateDelta | None
    events: tuple[RecordEvent, ...] = ()

    @property
    def delivered(self) -> tuple[RecordEvent, ...]:
        """The ACQUIRED events only (what ``delta`` does not carry)."""
        return tuple(e for e in self.events if e.kind is EventKind.ACQUIRED)

    @property
    def count(self) -> int:
        return sum(r.last_offset - r.first_offset + 1 for r in self.acquired)


# --------------------------------------------------------------------------------------------
# In-flight storage (mutable, private)
# --------------------------------------------------------------------------------------------


class _OffsetState:
    """State of one offset of a batch that is tracked per offset."""

    __slots__ = ("state", "delivery_count", "member_id", "lock_id", "rollback", "reason")

    def __init__(
        self, state: RecordState, delivery_count: int, member_id: str | None, lock_id: int,
        rollback: _Rollback | None = None, reason: ArchiveReason = _NO_REASON,
    ) -> None:
        self.state = state
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.lock_id = lock_id
        self.rollback = rollback
        # Why the record is ARCHIVING / ARCHIVED (read only in those states; not reset on other moves).
        self.reason = reason

    def copy(self) -> _OffsetState:
        return _OffsetState(self.state, self.delivery_count, self.member_id, self.lock_id, self.rollback, self.reason)

    def same_as(self, other: _OffsetState) -> bool:
        """Equal unstaged states: offsets holding them may share one object (see _InFlightBatch)."""
        return (self.rollback is None and other.rollback is None and self.state is other.state
                and self.delivery_count == other.delivery_count and self.lock_id == other.lock_id
                and self.member_id == other.member_id and self.reason is other.reason)


class _InFlightBatch:
    """Offsets [first_offset, last_offset]; one shared state while ``offsets`` is None.

    Per-offset tracking (``offsets``) is copy-on-write: contiguous offsets in equal, unstaged states
    share one :class:`_OffsetState` object (each object fills one contiguous run of the list), so a
    batch split by a few acknowledgements holds a handful of objects, not one per offset. The
    engine takes a position's own object (:meth:`SharePartition._own`) before changing it, and
    merges equal neighbours again -- the whole batch back into one state when they all agree -- at
    the end of every operation (:meth:`SharePartition._merge_touched`).
    """

    __slots__ = (
        "first_offset", "last_offset", "state", "delivery_count", "member_id", "lock_id", "offsets", "full_size",
        "rollback", "reason", "merged",
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
        self.reason = _NO_REASON  # as _OffsetState.reason
        # Per-offset state merged back into one: acquired whole, it is reported as the per-offset
        # path would (joined to a contiguous range with the same count), so merging changes nothing.
        self.merged = False

    @property
    def size(self) -> int:
        return self.last_offset - self.first_offset + 1

    def split(self, shared: bool = True) -> list[_OffsetState]:
        """Switch to per-offset tracking (once the batch is no longer uniform): every offset starts
        on one shared state, or each on its own when staged (or ``shared`` is False)."""
        if self.offsets is None:
            state = _OffsetState(self.state, self.delivery_count, self.member_id, self.lock_id, self.rollback,
                                 self.reason)
            if shared and self.rollback is None:
                self.offsets = [state] * self.size
            else:
                self.offsets = [state] + [state.copy() for _ in range(self.size - 1)]
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

    __slots__ = ("change_id", "state", "delivery_count", "member_id", "lock_id", "lock")

    def __init__(
        self, change_id: int, state: RecordState, delivery_count: int, member_id: str | None, lock_id: int,
        lock: _Lock | None,
    ) -> None:
        self.change_id = change_id
        self.state = state
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.lock_id = lock_id
        # A copy of the record's lock (deadline, acquisition and in-progress times) as it was: the
        # live one may be gone, or changed, by the time a rollback brings the record back.
        self.lock = lock.copy() if lock is not None else None


class _Lock:
    """What holds a group of owned records: the acquisition lock shared by the records acquired (or
    renewed) in one call, or -- for IN_PROGRESS records -- their progress hold, shared by the
    records one mark moved from one previous holder (so they share their in-progress times).

    A progress hold has no acquisition deadline (-1, never in the deadline heap); its records are
    released by the sweep (``last_progress``, ``in_progress_start``) or at ``grace_deadline``.
    """

    __slots__ = ("deadline", "acquired_at", "first_offset", "last_offset", "held", "in_progress_start",
                 "last_progress", "grace_deadline", "member_id", "progress")

    def __init__(self, deadline: int, acquired_at: int, *, progress: bool = False, in_progress_start: int = -1,
                 last_progress: int = -1, grace_deadline: int = -1, member_id: str | None = None) -> None:
        self.progress = progress  # a progress hold (IN_PROGRESS records), not an acquisition lock
        self.deadline = deadline
        # When its records were acquired (ms, the caller's clock); a renewal keeps the earliest.
        self.acquired_at = acquired_at
        # Widened as records join the lock; expire() and the sweep scan only this range.
        self.first_offset = _NO_OFFSET
        self.last_offset = -1
        self.held = 0
        self.in_progress_start = in_progress_start
        self.last_progress = last_progress
        self.grace_deadline = grace_deadline
        self.member_id = member_id  # the owner, for progress holds (release_member finds them by it)

    def copy(self) -> _Lock:
        return _Lock(self.deadline, self.acquired_at, progress=self.progress, in_progress_start=self.in_progress_start,
                     last_progress=self.last_progress, grace_deadline=self.grace_deadline, member_id=self.member_id)


_NOTHING_TOUCHED: dict = {}  # shared, never written: no per-offset batch changed yet (see SharePartition._touch)
_NO_OPEN_EVENTS: list = [None] * (max(EventKind) + 1)  # shared, never written: no event yet


class _Changes:
    """Persisted-state changes and events collected during one operation."""

    __slots__ = ("_runs", "_events", "_open")

    def __init__(self) -> None:
        # [first, last, state, count, in_progress_start, last_progress, member, reason], merged
        # while contiguous
        self._runs: list[list] = []
        # [kind, first, last, member, count, reason] in the order they happened; _open[kind id] is
        # the latest entry of each kind, which the next event of that kind extends when it
        # continues it (so per-offset moves of a batch still give one event per kind).
        self._events: list[list] = []
        self._open: list[list | None] = _NO_OPEN_EVENTS  # copied on the first event

    def add(self, first: int, last: int, state: RecordState, delivery_count: int,
            progress: tuple[int, int, str | None] = (-1, -1, None), reason: ArchiveReason = _NO_REASON) -> None:
        runs = self._runs
        if runs:
            prev = runs[-1]
            if prev[1] + 1 == first and prev[2] is state and prev[3] == delivery_count \
                    and (prev[4], prev[5], prev[6]) == progress and prev[7] is reason:
                prev[1] = last
                return
        runs.append([first, last, state, delivery_count, *progress, reason])

    def note(self, kind: EventKind, kind_id: int, first: int, last: int, member_id: str | None,
             delivery_count: int, reason: ArchiveReason = _NO_REASON) -> None:
        """One event over [first, last] (coalesced with the latest of its kind when contiguous)."""
        if self._open is _NO_OPEN_EVENTS:
            self._open = [None] * len(_NO_OPEN_EVENTS)
        prev = self._open[kind_id]
        if prev is not None and prev[2] + 1 == first and prev[4] == delivery_count and prev[3] == member_id \
                and prev[5] is reason:
            prev[2] = last
            return
        entry = [kind, first, last, member_id, delivery_count, reason]
        self._events.append(entry)
        self._open[kind_id] = entry

    def empty(self) -> bool:
        return not self._runs and not self._events

    @property
    def batches(self) -> list[PersistedBatch]:
        return [PersistedBatch(*run) for run in self._runs]

    @property
    def events(self) -> tuple[RecordEvent, ...]:
        if not self._events:
            return ()
        return tuple(RecordEvent(*entry) for entry in self._events)


def _coalesce(batches: Iterable[PersistedBatch]) -> list[PersistedBatch]:
    """Sort and merge adjacent batches with equal state and count (later entries win overlaps)."""
    out: list[PersistedBatch] = []
    for b in sorted(batches, key=lambda b: b.first_offset):
        if out:
            prev = out[-1]
            if prev.last_offset + 1 == b.first_offset and prev.content == b.content:
                out[-1] = prev._replace(last_offset=b.last_offset)
                continue
        out.append(b)
    return out


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


class _Renewals:
    """The locks one acknowledge or mark call moves owned records to: one new acquisition lock for
    renewed ACQUIRED records, and for records entering or staying IN_PROGRESS one new progress hold
    per previous holder (keeping its acquisition time and, for a refresh, its in-progress start)."""

    __slots__ = ("_partition", "_member_id", "_now", "_renew_lock_id", "_holds")

    def __init__(self, partition: SharePartition, member_id: str, now: int) -> None:
        self._partition = partition
        self._member_id = member_id
        self._now = now
        self._renew_lock_id = 0
        self._holds: dict[int, int] = {}  # previous lock id -> the new progress hold's id

    def lock_for(self, holder: _InFlightBatch | _OffsetState, row: tuple) -> int:
        """The lock id ``holder``'s records take when ``row`` moves them (0: no lock)."""
        move = row[holder.state]
        if move is None or not _HOLDS_OWNER[move.new_state]:
            return 0
        partition = self._partition
        if _PROGRESS_HELD[move.new_state]:
            hold_id = self._holds.get(holder.lock_id)
            if hold_id is None:
                old = partition._locks.get(holder.lock_id)
                acquired_at = old.acquired_at if old is not None else self._now
                start = old.in_progress_start if old is not None and old.progress else self._now
                hold_id = self._holds[holder.lock_id] = next(partition._lock_ids)
                partition._locks[hold_id] = _Lock(-1, acquired_at, progress=True, in_progress_start=start,
                                                  last_progress=self._now, member_id=self._member_id)
                partition._progress_ids.add(hold_id)
            return hold_id
        if not self._renew_lock_id:
            self._renew_lock_id = next(partition._lock_ids)
            partition._locks[self._renew_lock_id] = _Lock(
                self._now + partition.config.record_lock_duration_ms, self._now)
        return self._renew_lock_id

    def arm(self) -> None:
        """Queue the renewed acquisition lock's deadline (once its records joined it)."""
        lock = self._partition._locks.get(self._renew_lock_id) if self._renew_lock_id else None
        if lock is not None:
            heapq.heappush(self._partition._deadlines, (lock.deadline, self._renew_lock_id))


# Lock ids come from one counter for every share-partition, so they also order acquisitions across
# share-partitions: see acquisition_mark().
_LOCK_IDS = itertools.count(1)


def acquisition_mark() -> int:
    """A point in acquisition order: every record acquired (or renewed) so far, on any share-partition,
    holds a lock id below it, and every later one a lock id above it."""
    return next(_LOCK_IDS)



def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive offset ranges sorted, with overlapping and adjacent ones merged (sorts ``ranges``)."""
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for first, last in ranges:
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged

class SharePartition:
    """In-flight state of one share-partition. Not thread-safe: one owner task calls it."""

    # Per-offset state shared between equal neighbours and merged back into batches (see
    # _InFlightBatch). False keeps one object per offset, never merged (what tests compare with).
    _merge = True

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
        # IN_PROGRESS bookkeeping: the progress holds (lock ids, pruned lazily as holds empty), how
        # many records are IN_PROGRESS, when the staleness sweep is next due (None: nothing to sweep).
        self._progress_ids: set[int] = set()
        self._in_progress_records = 0
        self._next_sweep: int | None = None
        # The latest `now` a call gave: the time a record leaves IN_PROGRESS in calls without one.
        self._now = 0
        self._finished: list[tuple[int, int]] = []  # (ms in progress, records) since the last drain
        # The stale IN_PROGRESS records the last release_member() released at once (see there).
        self.last_member_release: InProgressRelease | None = None
        # Records ARCHIVING (KIP-1191), and the highest log start applied: records kept ARCHIVING
        # below the log start hold the SPSO there, so the reader reports that log start on every
        # fetch and advance_log_start() must not rescan the window for it each time.
        self._archiving_records = 0
        self._log_start = start_offset
        # Per-offset batches changed by the running operation, with the spans of positions changed
        # (list indexes lo1, hi1, lo2, hi2, ...): merged again when it finishes.
        self._touched: dict[_InFlightBatch, list[int]] = _NOTHING_TOUCHED
        # Offset ranges ([first, last], in the order changed) whose persisted view may have changed
        # since the last drain_changed(); None: unknown (nothing drained yet, a reset, too many).
        self._changed: list[list[int]] | None = None

    def reconfigure(self, config: PartitionConfig) -> None:
        """Take the group's current settings: later acquisitions lock for the new duration, and
        releases and expiries archive at the new delivery limit (records in flight keep their locks).
        New in-progress thresholds apply to records already IN_PROGRESS from the next sweep, which a
        shorter sweep interval brings forward."""
        if self._next_sweep is not None:
            self._next_sweep = min(self._next_sweep, self._now + config.sweep_interval_ms)
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

    def pinned_by(self) -> str | None:
        """The member whose Acquired record at the SPSO holds the window at the record-lock limit.

        None while something can be acquired, or when the record at the SPSO is not Acquired (a
        staged acknowledgement, a record in progress, a dead letter being written): only that
        member's acknowledgement, or its lock expiring, lets anyone acquire here again.
        """
        if self.can_acquire() or self._start >= self._end:
            return None
        state, _, member = self.record_state(self._start)
        return member if state is _ACQUIRED else None

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
        for offset, last, holder in self._pieces():
            lock = self._locks.get(holder.lock_id) if _HOLDS_OWNER[holder.state] else None
            if lock is None:
                key = (holder.state, holder.delivery_count, holder.member_id, -1, -1, -1, -1, -1)
            elif lock.progress:
                key = (holder.state, holder.delivery_count, holder.member_id, lock.acquired_at, -1,
                       lock.in_progress_start, lock.last_progress, lock.grace_deadline)
            else:
                key = (holder.state, holder.delivery_count, holder.member_id, lock.acquired_at, lock.deadline,
                       -1, -1, -1)
            if run is not None and run[1] + 1 == offset and run[2] == key:
                run[1] = last
                continue
            if run is not None:
                yield InFlightRun(run[0], run[1], *run[2])
            run = [offset, last, key]
        if run is not None:
            yield InFlightRun(run[0], run[1], *run[2])

    def members(self) -> set[str]:
        """Members currently holding records (Acquired or IN_PROGRESS)."""
        return {member for _, _, state, _, member in self._runs() if _HOLDS_OWNER[state] and member is not None}

    def next_deadline(self) -> int | None:
        """When the caller must next call in (ms), or None: the earliest acquisition-lock deadline
        (then :meth:`expire`), and while records are IN_PROGRESS the next sweep and the earliest
        rebalance-grace deadline (then :meth:`release_in_progress`)."""
        lock_deadline = None
        while self._deadlines:
            deadline, lock_id = self._deadlines[0]
            lock = self._locks.get(lock_id)
            if lock is not None and lock.deadline == deadline:
                lock_deadline = deadline
                break
            heapq.heappop(self._deadlines)
        if not self._in_progress_records:
            return lock_deadline  # (the sweep time is kept: a rollback may bring its records back)
        if self._next_sweep is None:
            self._next_sweep = self._now + self.config.sweep_interval_ms
        due = self._next_sweep if lock_deadline is None else min(lock_deadline, self._next_sweep)
        for hold in self._progress_holds():
            if hold.grace_deadline != -1 and hold.grace_deadline < due:
                due = hold.grace_deadline
        return due

    @property
    def archiving_count(self) -> int:
        """Records ARCHIVING now (their dead-letter write pending), staged or not."""
        return self._archiving_records

    def archiving(self) -> list[ArchivingRun]:
        """The ARCHIVING ranges the dead-letter writer may write now, in offset order: a record
        whose move to ARCHIVING is staged (a reject not yet durable) is left out until it commits.
        Runs split where the delivery count or the reason changes (each is one header set)."""
        if not self._archiving_records:
            return []
        runs: list[ArchivingRun] = []
        run: list | None = None  # [first, last, count, reason]
        for first, last, holder in self._pieces():
            if holder.state is not _ARCHIVING or holder.rollback is not None:
                continue
            if run is not None and run[1] + 1 == first and run[2] == holder.delivery_count \
                    and run[3] is holder.reason:
                run[1] = last
                continue
            if run is not None:
                runs.append(ArchivingRun(*run))
            run = [first, last, holder.delivery_count, holder.reason]
        if run is not None:
            runs.append(ArchivingRun(*run))
        return runs

    def finish_archiving(self, first_offset: int, last_offset: int, *, dead_lettered: bool) -> StateDelta | None:
        """The dead-letter write of [first_offset, last_offset] is done (``dead_lettered``) or given up:
        the offsets in range still ARCHIVING become ARCHIVED (an unstaged change; the SPSO may advance).
        Events: DEAD_LETTERED (if ``dead_lettered``) then ARCHIVED, with the reason. Records whose
        move to ARCHIVING is still staged are left alone (the writer never saw them)."""
        changes = _Changes()
        row = _DEAD_LETTER if dead_lettered else _ARCHIVE_UNLETTERED
        first = max(first_offset, self._start)
        last = min(last_offset, self._end - 1)
        if first > last or not self._archiving_records:
            return None
        for batch in list(self._batches_from(first, last)):
            if batch.offsets is None:
                if batch.state is not _ARCHIVING or batch.rollback is not None:
                    continue
                if batch.first_offset >= first and batch.last_offset <= last:
                    self._apply_batch(batch, row, None, 0, changes)
                    continue
                self._split(batch)
            for offset, holder in batch.holders(first, last):
                if holder.state is _ARCHIVING and holder.rollback is None:
                    self._apply_offset(batch, offset, row, None, 0, changes)
        return self._finish(changes)

    def in_progress_count(self) -> int:
        """Records IN_PROGRESS now."""
        return self._in_progress_records

    def stale_count(self, now: int) -> int:
        """IN_PROGRESS records whose last progress is older than the staleness threshold."""
        threshold = self.config.in_progress_staleness_threshold_ms
        return sum(hold.held for hold in self._progress_holds() if now - hold.last_progress > threshold)

    def drain_in_progress_finished(self) -> list[tuple[int, int]]:
        """(ms spent IN_PROGRESS, records) for the records that left IN_PROGRESS since the last drain
        (for the duration histogram). A staged acknowledgement that is rolled back was counted."""
        finished, self._finished = self._finished, []
        return finished

    def _note_finished(self, duration: int, records: int) -> None:
        finished = self._finished
        if finished and finished[-1][0] == duration:  # offsets of one batch leave together
            finished[-1] = (duration, finished[-1][1] + records)
        else:
            finished.append((duration, records))

    def _progress_holds(self) -> list[_Lock]:
        """The live progress holds (pruning the ids of emptied ones)."""
        holds = []
        for hold_id in list(self._progress_ids):
            hold = self._locks.get(hold_id)
            if hold is None:
                self._progress_ids.discard(hold_id)
            else:
                holds.append(hold)
        return holds

    def _progress_of(self, holder: _InFlightBatch | _OffsetState) -> tuple[int, int, str | None]:
        """(in_progress_start, last_progress, owner) as persisted for a record; -1s and None unless IN_PROGRESS."""
        if not _PROGRESS_HELD[holder.state]:
            return _NOT_IN_PROGRESS
        hold = self._locks.get(holder.lock_id)
        if hold is None:
            return -1, -1, holder.member_id
        return hold.in_progress_start, hold.last_progress, holder.member_id

    def snapshot(self) -> PartitionSnapshot:
        """ShareSnapshot content: durable state as a restart would see it (Acquired not persisted)."""
        runs: list[list] = []
        self._persist_pieces(self._pieces(), runs)
        return PartitionSnapshot(self._start,
                                 tuple(PersistedBatch(first, last, *content) for first, last, content in runs))

    def persisted_view(self, ranges: Sequence[tuple[int, int]]) -> tuple[PersistedBatch, ...]:
        """The batches of :meth:`snapshot` over the offset ranges ``ranges`` ((first, last) pairs,
        sorted, disjoint, not adjacent) and nowhere else, cut at their ends; costs what the ranges
        cover (plus a bisect each), not the window."""
        if not ranges or not self._batches:
            return ()
        runs: list[list] = []
        # One list of the window's batches for every range (the SortedDict's own lookups cost more
        # per range than this costs once: a window holds tens of batches, a write hundreds of ranges).
        firsts, window = list(self._batches.keys()), list(self._batches.values())
        for first, last in ranges:
            first = max(first, self._start)
            for batch in _overlapping(firsts, window, first, last):
                self._persist_pieces(_pieces_of(batch, first, last), runs)
        return tuple(PersistedBatch(first, last, *content) for first, last, content in runs)

    def _persist_pieces(self, pieces: Iterable[tuple[int, int, _InFlightBatch | _OffsetState]],
                        runs: list[list]) -> None:
        """Add how ``pieces`` (in offset order) are persisted to ``runs`` ([first, last, content]
        with PersistedBatch.content, adjacent equal contents joined): per-offset states, e.g. a
        staged acknowledgement's, join into one run before any batch value is made."""
        last_holder = None  # the holder of runs[-1], whose content the next piece may share
        for first, last, holder in pieces:
            if last_holder is not None and runs[-1][1] + 1 == first and holder.state is last_holder.state \
                    and holder.delivery_count == last_holder.delivery_count \
                    and holder.lock_id == last_holder.lock_id and holder.member_id == last_holder.member_id \
                    and holder.reason is last_holder.reason:
                # What the content is made of is equal: the same content (a staged acknowledgement
                # leaves each offset a state of its own, so this is the common case per offset).
                runs[-1][1] = last
                continue
            state, count = holder.state, holder.delivery_count
            written_as = _PERSISTED_AS[state]
            if written_as is not None:
                # Not persisted as itself: e.g. the last write for an acquired record was Available
                # with the count before this acquisition (or nothing, for a first delivery).
                state, count = written_as[0], count + written_as[1]
            if state is _AVAILABLE and count == 0:
                continue
            content = (state, count, *self._progress_of(holder), holder.reason if state is _ARCHIVING else _NO_REASON)
            last_holder = holder
            if runs:
                prev = runs[-1]
                if prev[1] + 1 == first and prev[2] == content:
                    prev[1] = last
                    continue
            runs.append([first, last, content])

    def drain_changed(self) -> list[tuple[int, int]] | None:
        """The offset ranges (sorted, merged) whose persisted view may have changed since the last
        call -- a superset: acquisitions, renewals and rolled-back moves are in it too -- and start
        afresh. None when unknown (the first call, after :meth:`reset`, or more than
        ``_CHANGED_RANGES_LIMIT`` ranges): compare the whole :meth:`snapshot` then."""
        changed, self._changed = self._changed, []
        return None if changed is None else merge_ranges(changed)

    def _note_changed(self, first: int, last: int) -> None:
        """Offsets [first, last] may persist differently now (see drain_changed)."""
        changed = self._changed
        if changed is None:
            return
        if changed:
            prev = changed[-1]
            # A sweep through the window (offset by offset, or batch by batch) extends one range.
            if first <= prev[1] + 1 and prev[0] <= last + 1:
                if first < prev[0]:
                    prev[0] = first
                if last > prev[1]:
                    prev[1] = last
                return
            if len(changed) >= _CHANGED_RANGES_LIMIT:
                self._changed = None
                return
        changed.append([first, last])

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
        written as the state before acquisition), a delivery state id it does not know (garbage),
        or IN_PROGRESS without an owner -- is taken as unfinished: its records are
        Available again with the delivery count it carries. A restart then delivers them once more
        rather than losing or refusing them.

        IN_PROGRESS batches come back IN_PROGRESS, owned by their member with their times (engine
        clock; the caller converts from the wall clock). No rebalance grace starts: only staleness
        and the max extension release them, so a worker still busy across a restart keeps its
        records, and its owner rejoining under the same member id may keep marking them.

        ARCHIVING batches come back ARCHIVING with their reason (unknown: DELIVERY_LIMIT when the
        count reached the limit, else REJECTED, Kafka's rule), for the dead-letter writer.
        """
        start, batches = _persisted_view(snapshot, updates)
        partition = cls(config, start)
        cursor = start
        holds: dict[tuple[str, int, int], int] = {}  # (owner, start, last progress) -> hold id
        for persisted in _coalesce_persisted(batches, start):
            # An int id too (a caller may pass what it read); `is` checks elsewhere need the member.
            state = RecordState(persisted.delivery_state) if persisted.delivery_state in _RESUMABLE else _AVAILABLE
            if _PROGRESS_HELD[state] and persisted.member_id is None:
                state = _AVAILABLE  # nobody to give it back to: deliver it again
            first = max(persisted.first_offset, start)
            if first > cursor:
                # Offsets with no persisted state were read but never finished: deliver them again.
                partition._append(_InFlightBatch(cursor, first - 1, _AVAILABLE))
            batch = _InFlightBatch(first, persisted.last_offset, state, persisted.delivery_count)
            if _PROGRESS_HELD[state]:
                partition._resume_in_progress(batch, persisted, holds)
            elif state is _ARCHIVING:
                # Dead-lettered again after the restart (KIP-1191); a reason not written (Kafka's
                # records) comes from the count, as Kafka derives it.
                reason = ArchiveReason(persisted.archive_reason) if persisted.archive_reason in DEAD_LETTER_REASONS \
                    else _DELIVERY_LIMIT if persisted.delivery_count >= config.delivery_count_limit \
                    else ArchiveReason.REJECTED
                batch.reason = reason
                partition._archiving_records += batch.size
            partition._append(batch)
            cursor = persisted.last_offset + 1
        partition._advance_start()
        return partition

    def _resume_in_progress(
        self, batch: _InFlightBatch, persisted: PersistedBatch, holds: dict[tuple[str, int, int], int]
    ) -> None:
        """Put a rebuilt IN_PROGRESS batch under a progress hold with its persisted owner and times."""
        assert persisted.member_id is not None
        key = (persisted.member_id, persisted.in_progress_start, persisted.last_progress)
        hold_id = holds.get(key)
        if hold_id is None:
            hold_id = holds[key] = next(self._lock_ids)
            # The acquisition time is not persisted; the start of the work is the closest known.
            self._locks[hold_id] = _Lock(-1, persisted.in_progress_start, progress=True,
                                         in_progress_start=persisted.in_progress_start,
                                         last_progress=persisted.last_progress, member_id=persisted.member_id)
            self._progress_ids.add(hold_id)
        hold = self._locks[hold_id]
        batch.member_id = persisted.member_id
        batch.lock_id = hold_id
        hold.held += batch.size
        hold.first_offset = min(hold.first_offset, batch.first_offset)
        hold.last_offset = max(hold.last_offset, batch.last_offset)
        self._in_progress_records += batch.size
        # No `now` here: the first sweep is due when the first of them could go stale or over-extend.
        due = min(persisted.last_progress + self.config.in_progress_staleness_threshold_ms + 1,
                  persisted.in_progress_start + self.config.in_progress_max_lock_extension_ms)
        if self._next_sweep is None or due < self._next_sweep:
            self._next_sweep = due

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
        self._now = now
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
        delta = self._finish(changes, old_start=start_before)
        return AcquireResult(tuple(out), delta, _acquisition_events(member_id, out, delta))

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
                    self._emit(out, batch.first_offset, batch.last_offset, batch.delivery_count, merge=batch.merged)
                    remaining -= batch.size
                    continue
                self._split(batch)
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
            holder = self._apply_offset(batch, offset, _ACQUIRE, member_id, lock_id, None)
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
                self._append_archived(self._end, gap_last, changes, ArchiveReason.GAP)
                if self._end >= limit_end:
                    break
            # Batch-optimized: the whole log batch that starts inside the limit, as Kafka's
            # acquireNewBatchRecords does (the window may exceed the limit by the rest of it; a
            # cut batch would be sent whole for a sliver of records and then again for the rest).
            # Record-limit mode cuts at the limit.
            last = min(header.last_offset, limit_end - 1) if record_limit else header.last_offset
            if i in excluded:
                run_first = self._close_run(run_first, member_id, lock_id, out)
                self._append_archived(first, last, changes, ArchiveReason.CONTROL_RECORD if header.is_control
                                      else ArchiveReason.ABORTED_TRANSACTION)
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
        self._note_changed(batch.first_offset, batch.last_offset)  # (e.g. archived control records)
        if batch.last_offset + 1 > self._end:
            self._end = batch.last_offset + 1

    def _append_archived(self, first: int, last: int, changes: _Changes, reason: ArchiveReason) -> None:
        if last < first:
            return
        self._append(_InFlightBatch(first, last, _ARCHIVED))
        changes.add(first, last, _ARCHIVED, 0)
        changes.note(_ARCHIVED_KIND, _ARCHIVED_KIND_ID, first, last, None, 0, reason)

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
        return self._staged_call(lambda: self._acknowledge(member_id, ranges, now=now))

    def _staged_call(self, change: Callable[[], StateDelta | None]) -> StagedChange | None:
        change_id = next(self._change_ids)
        self._staging = change_id
        try:
            delta = change()
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
        firsts, window = list(self._batches.keys()), list(self._batches.values())  # (see _acknowledge)
        for first, last in ranges:
            for batch in _overlapping(firsts, window, first, last):
                offsets = batch.offsets
                if offsets is None:
                    if batch.rollback is not None and batch.rollback.change_id == change_id:
                        batch.rollback = None
                        self._lower_hint(batch, batch.first_offset)
                    continue
                self._touch(batch, first, last)  # (committed states may now merge with their neighbours)
                # Once per run of offsets sharing a state object (each fills one contiguous run).
                base = batch.first_offset
                i, stop = max(first, base) - base, min(last, batch.last_offset) - base
                while i <= stop:
                    holder = offsets[i]
                    if holder.rollback is not None and holder.rollback.change_id == change_id:
                        holder.rollback = None
                        self._lower_hint(holder, base + i)
                    i += 1
                    while i <= stop and offsets[i] is holder:
                        i += 1
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
                self._touch(batch, first, last)
                offsets = batch.offsets
                base, stop = batch.first_offset, min(last, batch.last_offset)
                for offset, holder in batch.holders(first, last):
                    if holder.rollback is not None and holder.rollback.change_id == change_id:
                        # Offsets staged together may share their state: restored together.
                        end = offset
                        while end < stop and offsets[end + 1 - base] is holder:
                            end += 1
                        self._restore(holder, offset, end)
        self._merge_touched()

    @property
    def staged_changes(self) -> int:
        """Staged changes not yet committed or rolled back."""
        return len(self._staged)

    def _restore(self, holder: _InFlightBatch | _OffsetState, first: int, last: int) -> None:
        saved = holder.rollback
        assert saved is not None
        self._note_changed(first, last)
        n = last - first + 1
        holder.rollback = None
        self._detach(holder, n)  # a staged mark left the records under a new progress hold
        if holder.state is _ARCHIVING:  # a staged reject (or archive at the limit) undone
            self._archiving_records -= n
        holder.state = saved.state
        holder.delivery_count = saved.delivery_count
        holder.member_id = saved.member_id
        holder.lock_id = saved.lock_id
        if not _HOLDS_OWNER[saved.state]:
            return
        lock = self._locks.get(saved.lock_id)
        if lock is None:
            # The lock (or progress hold) was dropped when its last record left it: bring it back,
            # times unchanged (a lock that ran out meanwhile expires at the next expire(), a stale
            # hold goes at the next sweep).
            assert saved.lock is not None
            lock = self._locks[saved.lock_id] = saved.lock.copy()
            if lock.progress:
                self._progress_ids.add(saved.lock_id)
            else:
                heapq.heappush(self._deadlines, (lock.deadline, saved.lock_id))
        lock.held += n
        lock.first_offset = min(lock.first_offset, first)
        lock.last_offset = max(lock.last_offset, last)
        if _PROGRESS_HELD[saved.state]:
            self._in_progress_records += n

    def _detach(self, holder: _InFlightBatch | _OffsetState, n: int) -> None:
        """``n`` records of ``holder`` leave its lock or progress hold (dropped once empty)."""
        if not _HOLDS_OWNER[holder.state]:
            return
        if _PROGRESS_HELD[holder.state]:
            self._in_progress_records -= n
        lock = self._locks.get(holder.lock_id)
        if lock is not None:
            lock.held -= n
            if lock.held <= 0:
                del self._locks[holder.lock_id]

    def _drop_staging(self, first: int, last: int) -> None:
        for batch in list(self._batches_from(first, last)):
            if batch.offsets is None:
                if batch.rollback is None:
                    continue
                if batch.first_offset >= first and batch.last_offset <= last:
                    batch.rollback = None
                    continue
                self._split(batch)
            self._touch(batch, first, last)
            for _, holder in batch.holders(first, last):
                holder.rollback = None  # (a shared state has none already)

    def _stage(self, holder: _InFlightBatch | _OffsetState, first: int, last: int) -> None:
        """Remember what `holder` is before the staged change moves it (see stage_acknowledge)."""
        change_id = self._staging
        saved = self._last_rollback
        # Offsets of one batch mostly replace the same thing: share one saved state between them.
        if (saved is None or saved.change_id != change_id or saved.state is not holder.state
                or saved.delivery_count != holder.delivery_count or saved.member_id != holder.member_id
                or saved.lock_id != holder.lock_id):
            lock = self._locks.get(holder.lock_id) if _HOLDS_OWNER[holder.state] else None
            saved = self._last_rollback = _Rollback(change_id, holder.state, holder.delivery_count,
                                                    holder.member_id, holder.lock_id, lock)
        holder.rollback = saved
        ranges = self._staged.setdefault(change_id, [])
        if ranges and ranges[-1][1] + 1 == first:
            ranges[-1] = (ranges[-1][0], last)
        elif not ranges or not (ranges[-1][0] <= first and last <= ranges[-1][1]):  # (one batch, several moves)
            ranges.append((first, last))

    def _lower_hint(self, holder: _InFlightBatch | _OffsetState, offset: int) -> None:
        if holder.state is _AVAILABLE and offset < self._available_hint:
            self._available_hint = offset

    def _acknowledge(self, member_id: str, ranges: Sequence[AckRange], *, now: int) -> StateDelta | None:
        self._now = now
        self._validate_ack_ranges(ranges)
        # Pass 1: validate everything before touching anything (atomic per partition). Adjacent
        # ranges are joined first (the same offsets with the same types), and each joined range's
        # batches, looked up here, are the ones pass 2 moves: nothing adds or drops a batch between.
        planned = []
        # The window's batches as plain lists, looked up by bisect: the SortedDict's own lookup
        # cost ~10% of staging a fragmented acknowledgement (a range per redelivered offset), and
        # nothing adds or drops a batch before pass 2 is done.
        firsts, window = list(self._batches.keys()), list(self._batches.values())
        for ack in _joined(ranges):
            first = max(ack.first_offset, self._start)
            if first <= ack.last_offset:
                batches = _overlapping(firsts, window, first, ack.last_offset)
                self._check_ack(member_id, ack, first, now, batches)
                planned.append((ack, first, batches))
        # Pass 2: apply.
        changes = _Changes()
        renewals = _Renewals(self, member_id, now)
        for ack, first, batches in planned:
            last = ack.last_offset
            types = ack.acknowledge_types
            single = _ACK_ROWS[types[0]] if len(types) == 1 else None
            for batch in batches:
                if batch.offsets is None and batch.first_offset >= first and batch.last_offset <= last:
                    # A uniform batch taking one type moves whole (also inside a range with a type
                    # per offset, e.g. adjacent ranges joined): no per-offset split and merge back.
                    row = single
                    if row is None:
                        span = types[batch.first_offset - ack.first_offset:batch.last_offset - ack.first_offset + 1]
                        row = _ACK_ROWS[span[0]] if span.count(span[0]) == len(span) else None
                    if row is not None:
                        self._apply_batch(batch, row, member_id, renewals.lock_for(batch, row), changes)
                        continue
                offsets = self._split(batch)
                base = batch.first_offset
                offset, stop = max(first, base), min(last, batch.last_offset)
                while offset <= stop:
                    holder = offsets[offset - base]
                    end = offset  # to the end of the run of offsets sharing this state object
                    while end < stop and offsets[end + 1 - base] is holder:
                        end += 1
                    if single is not None:
                        self._move_span(batch, holder, single, offset, end, member_id, renewals, changes)
                    else:
                        self._move_span_by_type(batch, holder, types, ack.first_offset, offset, end, member_id,
                                                renewals, changes)
                    offset = end + 1
        renewals.arm()
        return self._finish(changes)

    # ----- IN_PROGRESS (draft KIP KAFKA-20458) ---------------------------------------------------

    def mark_in_progress(
        self, member_id: str, ranges: Sequence[tuple[int, int]], *, now: int
    ) -> StateDelta | None:
        """MarkInProgress (draft KIP §3.2): the member is working on these records.

        ``ranges`` are (first, last) offset pairs, ascending and non-overlapping (else
        INVALID_REQUEST). Every offset at or above SPSO must be ACQUIRED or IN_PROGRESS by
        ``member_id``, and a record already IN_PROGRESS must not have been so for longer than the
        max lock extension (else INVALID_RECORD_STATE). Unlike an acknowledgement, a mark that
        names an offset below SPSO is refused (INVALID_RECORD_STATE): the record is finished, and a
        worker told its mark succeeded would go on working on a record it no longer holds. All or
        nothing. ACQUIRED records become IN_PROGRESS (start = last
        progress = now) and leave the acquisition lock; IN_PROGRESS ones get last progress = now
        and keep their start. A departed member's records held for the rebalance grace are its own
        again. The change is persisted (IN_PROGRESS is written as itself): a caller that persists
        before answering uses :meth:`stage_mark_in_progress`.
        """
        return self._mark(member_id, ranges, now=now)

    def stage_mark_in_progress(
        self, member_id: str, ranges: Sequence[tuple[int, int]], *, now: int
    ) -> StagedChange | None:
        """:meth:`mark_in_progress` as a staged change: :meth:`commit` once durable, or
        :meth:`rollback` to put the records back (ACQUIRED under their lock, or IN_PROGRESS with
        their previous times)."""
        return self._staged_call(lambda: self._mark(member_id, ranges, now=now))

    def _mark(self, member_id: str, ranges: Sequence[tuple[int, int]], *, now: int) -> StateDelta | None:
        self._now = now
        previous_last = -1
        for first, last in ranges:
            if first < 0 or first > last:
                raise ShareStateError(INVALID_REQUEST, f"bad progress range {first}-{last}")
            if first <= previous_last:
                raise ShareStateError(INVALID_REQUEST, "progress ranges must be ascending and non-overlapping")
            previous_last = last
            if first < self._start:
                raise ShareStateError(
                    INVALID_RECORD_STATE,
                    f"offset {first} is finished (below the share-partition start offset {self._start})",
                )
        live = list(ranges)
        for first, last in live:
            if last >= self._end:
                raise ShareStateError(INVALID_RECORD_STATE, f"offset {max(first, self._end)} was not acquired")
            for batch in self._batches_from(first, last):
                if batch.offsets is None:
                    self._check_progress(batch, member_id, Event.MARK, now, max(first, batch.first_offset))
                else:
                    for offset, holder in batch.holders(first, last):
                        self._check_progress(holder, member_id, Event.MARK, now, offset)
        changes = _Changes()
        renewals = _Renewals(self, member_id, now)
        for first, last in live:
            for batch in list(self._batches_from(first, last)):
                if batch.offsets is None and batch.first_offset >= first and batch.last_offset <= last:
                    self._apply_batch(batch, _MARK, member_id, renewals.lock_for(batch, _MARK), changes)
                    continue
                self._split(batch)
                for offset, holder in batch.holders(first, last):
                    self._apply_offset(batch, offset, _MARK, member_id, renewals.lock_for(holder, _MARK), changes)
        return self._finish(changes)

    def _check_progress(
        self, holder: _InFlightBatch | _OffsetState, member_id: str, event: Event, now: int, offset: int
    ) -> None:
        """``event`` (a mark, or a renew) may move the record: owned by the member, in a state with
        a row for it, and -- when already IN_PROGRESS -- within the max lock extension."""
        if _ROWS[event][holder.state] is None or holder.member_id != member_id:
            raise ShareStateError(
                INVALID_RECORD_STATE,
                f"offset {offset} is {holder.state.name}, not acquired or in progress by this member",
            )
        if _PROGRESS_HELD[holder.state]:
            hold = self._locks.get(holder.lock_id)
            limit = self.config.in_progress_max_lock_extension_ms
            if hold is not None and now - hold.in_progress_start > limit:
                raise ShareStateError(
                    INVALID_RECORD_STATE,
                    f"offset {offset} has been in progress for {now - hold.in_progress_start} ms, longer than "
                    f"share.in.progress.max.lock.extension.ms ({limit} ms)",
                )

    def release_in_progress(self, now: int) -> list[InProgressRelease]:
        """The staleness sweep and rebalance-grace expiry (draft KIP §3.3, "Rebalance flow").

        When the sweep is due (every staleness threshold / 4 while records are IN_PROGRESS, see
        :meth:`next_deadline`): records in progress for the max lock extension or longer are
        released (MAX_EXTENSION, even when also stale), and records with no progress for longer than
        the staleness threshold (STALENESS). On every call: records whose rebalance grace has ended
        (GRACE_EXPIRY). Released means Available, or Archived once the delivery count has reached the
        limit; the count itself is left as it is (docs/in-progress.md "Delivery counting"). One
        entry per reason that released something, each with its own delta to persist.
        """
        self._now = now
        config = self.config
        sweep = bool(self._in_progress_records) and self._next_sweep is not None and now >= self._next_sweep
        due: dict[ReleaseReason, list[int]] = {}
        for hold_id in list(self._progress_ids):
            hold = self._locks.get(hold_id)
            if hold is None:
                self._progress_ids.discard(hold_id)
                continue
            if sweep and now - hold.in_progress_start >= config.in_progress_max_lock_extension_ms:
                reason = ReleaseReason.MAX_EXTENSION
            elif sweep and now - hold.last_progress > config.in_progress_staleness_threshold_ms:
                reason = ReleaseReason.STALENESS
            elif hold.grace_deadline != -1 and hold.grace_deadline <= now:
                reason = ReleaseReason.GRACE_EXPIRY
            else:
                continue
            due.setdefault(reason, []).append(hold_id)
        released: list[InProgressRelease] = []
        for reason, row in _RELEASE_ROWS:
            hold_ids = due.get(reason)
            if hold_ids:
                changes = _Changes()
                count = sum(self._release_hold(hold_id, row, changes) for hold_id in hold_ids)
                released.append(InProgressRelease(reason, self._finish(changes), count))
        if sweep:
            self._next_sweep = now + config.sweep_interval_ms
        return released

    def _release_hold(self, hold_id: int, row: tuple, changes: _Changes) -> int:
        """Move every record of one progress hold by ``row``; returns how many moved."""
        hold = self._locks.get(hold_id)
        if hold is None:
            return 0
        count, first, last = hold.held, hold.first_offset, hold.last_offset
        for batch in list(self._batches_from(first, last)):
            if batch.offsets is None:
                if _PROGRESS_HELD[batch.state] and batch.lock_id == hold_id:
                    self._apply_batch(batch, row, None, 0, changes)
            else:
                for offset, holder in batch.holders(first, last):
                    if _PROGRESS_HELD[holder.state] and holder.lock_id == hold_id:
                        self._apply_offset(batch, offset, row, None, 0, changes)
        return count

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

    def _check_ack(self, member_id: str, ack: AckRange, first: int, now: int,
                   batches: Sequence[_InFlightBatch]) -> None:
        """Every offset of ``ack`` from ``first`` (its first at or above SPSO) on is Acquired by the
        member and may take its type; ``batches`` are the in-flight batches overlapping them."""
        last = ack.last_offset
        if last >= self._end:
            raise ShareStateError(INVALID_RECORD_STATE, f"offset {max(first, self._end)} was not acquired")
        types = ack.acknowledge_types
        for batch in batches:
            lo = max(first, batch.first_offset)
            hi = min(last, batch.last_offset)
            if batch.offsets is None:
                used = types if len(types) == 1 else set(types[lo - ack.first_offset:hi - ack.first_offset + 1])
                for ack_type in used:
                    self._check_holder(batch, member_id, ack_type, lo, now)
            else:
                # Offsets sharing one state object and taking one type pass or fail alike: checked
                # once per such run (at its first offset, the one an error names).
                offsets, base = batch.offsets, batch.first_offset
                single = types[0] if len(types) == 1 else None
                checked, checked_type = None, None
                for offset in range(lo, hi + 1):
                    holder = offsets[offset - base]
                    ack_type = single if single is not None else types[offset - ack.first_offset]
                    if holder is not checked or ack_type != checked_type:
                        self._check_holder(holder, member_id, ack_type, offset, now)
                        checked, checked_type = holder, ack_type

    def _check_holder(
        self, holder: _InFlightBatch | _OffsetState, member_id: str, ack_type: int, offset: int, now: int
    ) -> None:
        if ack_type == _RENEW_TYPE and _PROGRESS_HELD[holder.state]:
            # A renew of an IN_PROGRESS record is a mark: same rules (max extension).
            self._check_progress(holder, member_id, Event.RENEW, now, offset)
            return
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
        """Release every record whose acquisition lock deadline is at or before ``now``.

        IN_PROGRESS records are not under the acquisition lock: see :meth:`release_in_progress`."""
        self._now = now
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

    def release_member(self, member_id: str, *, now: int | None = None) -> StateDelta | None:
        """Release a departed member's records (session closed / member left).

        ACQUIRED records: released at once, and Kafka undoes the delivery-count increment here: the
        records may never have reached the application, so this is not a delivery attempt and never
        archives. The returned delta covers these (persist it as a member release).

        IN_PROGRESS records (draft KIP "Rebalance flow"): those with fresh progress (now - last
        progress <= staleness threshold) stay IN_PROGRESS, owner unchanged, until ``now`` + the
        rebalance grace (then :meth:`release_in_progress` releases them as GRACE_EXPIRY, unless the
        member marks or acknowledges them first); stale ones are released at once, the count left as
        it is (Archived at the limit). Those are NOT in the returned delta: they are in
        :attr:`last_member_release` (reason STALENESS, its own delta to persist, and how many), None
        when there were none. Without ``now`` (callers before the extension) every IN_PROGRESS record
        is taken as stale.
        """
        self.last_member_release = None
        if now is not None:
            self._now = now
        threshold = self.config.in_progress_staleness_threshold_ms
        stale_changes = _Changes()
        stale = 0
        for hold_id in list(self._progress_ids):
            hold = self._locks.get(hold_id)
            if hold is None:
                self._progress_ids.discard(hold_id)
            elif hold.member_id == member_id:
                if now is not None and now - hold.last_progress <= threshold:
                    if hold.grace_deadline == -1:  # a second departure does not extend the grace
                        hold.grace_deadline = now + self.config.in_progress_rebalance_grace_ms
                else:
                    stale += self._release_hold(hold_id, _STALE, stale_changes)
        if stale:
            self.last_member_release = InProgressRelease(ReleaseReason.STALENESS, self._finish(stale_changes), stale)
        changes = _Changes()
        self._release_acquired(
            self._batches.values(), self._start, self._end - 1,
            lambda holder: holder.member_id == member_id, _MEMBER_LEFT, changes,
        )
        return self._finish(changes)

    def newest_acquisition(self, member_id: str, first: int, last: int) -> int:
        """The latest lock id (see acquisition_mark) among the records in [first, last] that
        ``member_id`` holds Acquired; 0 when it holds none there. IN_PROGRESS records do not count:
        their progress hold's id tells when they were marked, not when they were acquired."""
        newest = 0
        for batch in self._batches_from(max(first, self._start), last):
            if batch.offsets is None:
                if _HOLDS_LOCK[batch.state] and batch.member_id == member_id and batch.lock_id > newest:
                    newest = batch.lock_id
            else:
                for _, holder in batch.holders(first, last):
                    if _HOLDS_LOCK[holder.state] and holder.member_id == member_id and holder.lock_id > newest:
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
        if changes.empty() and not self._touched:
            # Nothing was held (the usual case: callers ask per forgotten partition on every
            # acknowledging ShareFetch): SPSO cannot have moved and there is nothing to persist.
            return None
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
                        self._apply_offset(batch, offset, row, None, 0, changes)

    # ----- SPSO moves from outside ----------------------------------------------------------------

    def advance_log_start(self, log_start_offset: int) -> StateDelta | None:
        """Records below ``log_start_offset`` were deleted by retention: archive them, move SPSO.

        Records ARCHIVING stay so (KIP-1191: dead-lettered with headers only, the original being
        gone) and hold the SPSO below the log start until they are finished; offsets beyond the
        window up to the log start then join it as one archived batch (never delivered)."""
        if log_start_offset <= self._start or log_start_offset <= self._log_start:
            return None
        self._log_start = log_start_offset
        changes = _Changes()
        start_before = self._start
        cut = min(log_start_offset, self._end) - 1
        if cut >= self._start:
            self._drop_staging(self._start, cut)  # the records are gone: nothing left to roll back
            self._apply_range(self._start, cut, _ROWS[Event.ARCHIVE], None, 0, changes, only_live=True)
        if log_start_offset >= self._end:
            if self._archiving_records:
                # Not reported as events: the share group never read these offsets.
                if log_start_offset > self._end:
                    changes.add(self._end, log_start_offset - 1, _ARCHIVED, 0)
                    self._append(_InFlightBatch(self._end, log_start_offset - 1, _ARCHIVED))
                self._available_hint = max(self._available_hint, self._end)
            else:
                # Everything in flight is gone; the window restarts empty at the new log start.
                self._batches.clear()
                self._start = self._end = self._available_hint = log_start_offset
        # Archived records all lie below the new SPSO: the delta is just the start offset.
        return self._finish(changes, old_start=start_before)

    def reset(self, start_offset: int) -> PartitionSnapshot:
        """Discard all in-flight state and restart at ``start_offset`` (alter-offsets on an empty group).

        Records ARCHIVING are dropped too, never dead-lettered: the operator chose where the group
        starts again (Kafka's reset likewise discards the in-flight state, ARCHIVING included).

        The caller resolves latest / earliest / by-timestamp to an offset. Returns the ShareSnapshot
        to write, which supersedes every earlier record.
        """
        if start_offset < 0:
            raise ValueError(f"start_offset {start_offset} < 0")
        self._batches.clear()
        self._locks.clear()
        self._deadlines.clear()
        self._staged.clear()
        self._touched = _NOTHING_TOUCHED
        self._progress_ids.clear()
        self._in_progress_records = 0
        self._archiving_records = 0  # dropped, never dead-lettered: the operator reset the group
        self._log_start = start_offset
        self._next_sweep = None
        self._start = self._end = self._available_hint = start_offset
        self._changed = None  # the whole window changed
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
        or ``only_live``: skip records the event cannot move -- terminal ones, ARCHIVING ones)."""
        for batch in list(self._batches_from(first, last)):
            if batch.offsets is None:
                if only_live and row[batch.state] is None:
                    continue
                if batch.first_offset >= first and batch.last_offset <= last:
                    self._apply_batch(batch, row, member_id, lock_id, changes)
                    continue
                self._split(batch)
            for offset, holder in batch.holders(first, last):
                if only_live and row[holder.state] is None:
                    continue
                self._apply_offset(batch, offset, row, member_id, lock_id, changes)

    def _apply_batch(
        self, batch: _InFlightBatch, row: _Row, member_id: str | None, lock_id: int, changes: _Changes | None
    ) -> None:
        acting = member_id if member_id is not None else batch.member_id  # (the former holder)
        self._transit(batch, row, member_id, lock_id, batch.first_offset, batch.last_offset)
        if changes is not None:
            self._note(changes, batch, row, batch.first_offset, batch.last_offset, acting)
        if batch.state is _AVAILABLE and batch.first_offset < self._available_hint:
            self._available_hint = batch.first_offset

    def _move_span(self, batch: _InFlightBatch, holder: _OffsetState, row: _Row, first: int, last: int,
                   member_id: str, renewals: _Renewals, changes: _Changes) -> None:
        """Acknowledge [first, last] of a per-offset batch, which share ``holder``, by one ``row``."""
        lock_id = renewals.lock_for(holder, row)
        holder = self._own_span(batch, first, last)
        self._transit(holder, row, member_id, lock_id, first, last)
        self._note(changes, holder, row, first, last, member_id)
        if holder.state is _AVAILABLE and first < self._available_hint:
            self._available_hint = first

    def _move_span_by_type(self, batch: _InFlightBatch, holder: _OffsetState, types: Sequence[int], types_from: int,
                           first: int, last: int, member_id: str, renewals: _Renewals, changes: _Changes) -> None:
        """Acknowledge [first, last] of a per-offset batch, which share ``holder``, with a type per
        offset (``types[offset - types_from]``). Each distinct move is worked out once, over all the
        records taking it (their lock, counters and staged rollback go by record count), and a copy
        of its result is laid over each run of offsets taking it (each object still fills one
        contiguous run): a client acknowledging a poll run by run (10% released at random, ~180
        runs in 1,000 records) paid the whole move per run."""
        runs: list[tuple[int, int, _Row]] = []  # (first, last, row), in offset order
        run_first, row = first, _ACK_ROWS[types[first - types_from]]
        for offset in range(first + 1, last + 1):
            next_row = _ACK_ROWS[types[offset - types_from]]
            if next_row is not row:
                runs.append((run_first, offset - 1, row))
                run_first, row = offset, next_row
        runs.append((run_first, last, row))
        if len(runs) == 1:
            self._move_span(batch, holder, row, first, last, member_id, renewals, changes)
            return
        records: dict[int, int] = {}  # id(row) -> records taking it
        for run_first, run_last, row in runs:
            records[id(row)] = records.get(id(row), 0) + run_last - run_first + 1
        lock_ids = {id(row): renewals.lock_for(holder, row) for _, _, row in runs}
        original = self._own_span(batch, first, last)
        moved: dict[int, _OffsetState] = {}
        for _, _, row in runs:
            if id(row) not in moved:
                result = moved[id(row)] = original.copy()
                self._transit(result, row, member_id, lock_ids[id(row)], first, last, records[id(row)])
        offsets, base = batch.offsets, batch.first_offset
        assert offsets is not None
        for run_first, run_last, row in runs:
            own = moved[id(row)].copy()
            offsets[run_first - base:run_last - base + 1] = [own] * (run_last - run_first + 1)
            self._note(changes, own, row, run_first, run_last, member_id)
            if own.state is _AVAILABLE and run_first < self._available_hint:
                self._available_hint = run_first

    def _apply_offset(
        self,
        batch: _InFlightBatch,
        offset: int,
        row: _Row,
        member_id: str | None,
        lock_id: int,
        changes: _Changes | None,
    ) -> _OffsetState:
        """Move one offset of a per-offset batch (on its own state object, which is returned)."""
        holder = self._own(batch, offset)
        acting = member_id if member_id is not None else holder.member_id  # (the former holder)
        self._transit(holder, row, member_id, lock_id, offset, offset)
        if changes is not None:
            self._note(changes, holder, row, offset, offset, acting)
        if holder.state is _AVAILABLE and offset < self._available_hint:
            self._available_hint = offset
        return holder

    # ----- per-offset state: shared while equal, merged back (see _InFlightBatch) -----------------

    def _split(self, batch: _InFlightBatch) -> list[_OffsetState]:
        if batch.offsets is None:
            self._touch(batch, batch.first_offset, batch.first_offset)  # (left unchanged, it merges back)
        return batch.split(self._merge)

    def _touch(self, batch: _InFlightBatch, first: int, last: int) -> None:
        """Offsets [first, last] of a per-offset batch may have changed: merge around them later."""
        lo = max(first - batch.first_offset, 0)
        hi = min(last, batch.last_offset) - batch.first_offset
        spans = self._touched.get(batch)
        if spans is None:
            self._first_touch(batch, lo, hi)
        elif spans[-1] == lo - 1:  # (a sweep through the batch extends the last span)
            spans[-1] = hi
        else:
            spans += (lo, hi)

    def _first_touch(self, batch: _InFlightBatch, lo: int, hi: int) -> None:
        if self._touched is _NOTHING_TOUCHED:
            self._touched = {}  # (an engine that never splits a batch never holds a dict of its own)
        self._touched[batch] = [lo, hi]

    def _own(self, batch: _InFlightBatch, offset: int) -> _OffsetState:
        """The state object of ``offset`` alone, ready to change (see :meth:`_own_span`)."""
        offsets = batch.offsets
        assert offsets is not None
        i = offset - batch.first_offset
        holder = offsets[i]
        if (i == 0 or offsets[i - 1] is not holder) and (i + 1 == len(offsets) or offsets[i + 1] is not holder):
            spans = self._touched.get(batch)  # (the common case, inlined: the offset has its own already)
            if spans is None:
                self._first_touch(batch, i, i)
            elif spans[-1] == i - 1:
                spans[-1] = i
            else:
                spans += (i, i)
            return holder
        return self._own_span(batch, offset, offset)

    def _own_span(self, batch: _InFlightBatch, first: int, last: int) -> _OffsetState:
        """One state object for exactly the offsets [first, last], which share one now, ready to
        change. The parts of its run before and after them keep objects of their own (each object
        still fills one contiguous run); of the two, the shorter is relabelled, so a sweep through a
        run costs what it changes."""
        offsets = batch.offsets
        assert offsets is not None
        i, j = first - batch.first_offset, last - batch.first_offset
        self._touch(batch, first, last)
        holder = offsets[i]
        n = len(offsets)
        before = i > 0 and offsets[i - 1] is holder
        after = j + 1 < n and offsets[j + 1] is holder
        if not before and not after:
            return holder
        own = holder.copy()
        offsets[i:j + 1] = [own] * (j - i + 1)
        if before and after:
            left, right = i - 1, j + 1
            while True:
                left -= 1
                right += 1
                if left < 0 or offsets[left] is not holder:
                    offsets[left + 1:i] = [holder.copy()] * (i - left - 1)
                    break
                if right >= n or offsets[right] is not holder:
                    offsets[j + 1:right] = [holder.copy()] * (right - j - 1)
                    break
        return own

    def _merge_touched(self) -> None:
        """Share one state object between equal neighbours around the positions the operation
        changed, and turn a batch whose offsets all agree (none staged) back into one uniform batch."""
        touched = self._touched
        if not touched:
            return
        self._touched = _NOTHING_TOUCHED
        if not self._merge:
            return
        for batch, spans in touched.items():
            offsets = batch.offsets
            if offsets is None:
                continue
            n = len(offsets)
            # Each object fills one contiguous run, so comparing every position of a changed span
            # (and the one after it) with its left neighbour finds every pair of runs that can join;
            # a run that joins is taken over to its end.
            for index in range(0, len(spans), 2):
                k = max(spans[index], 1)
                stop = min(spans[index + 1] + 1, n - 1)
                while k <= stop:
                    holder, left = offsets[k], offsets[k - 1]
                    if holder is not left and holder.same_as(left):
                        while k < n and offsets[k] is holder:
                            offsets[k] = left
                            k += 1
                    else:
                        k += 1
            run = offsets[0]
            if run is offsets[-1] and run.rollback is None:
                _unsplit(batch, run)

    def _note(self, changes: _Changes, holder: _InFlightBatch | _OffsetState, row: _Row, first: int, last: int,
              member_id: str | None) -> None:
        """Collect what one move of [first, last] persists and the events it makes: the event
        itself (the member that acted, or the former holder), then ARCHIVING / ARCHIVED with why.
        (The common case -- a persisted move extending the previous run and event -- is inlined:
        this runs per offset when a batch is acknowledged offset by offset.)"""
        state, count = holder.state, holder.delivery_count
        if state is _ARCHIVED or state is _ARCHIVING:
            self._note_archived(changes, holder, row, first, last, member_id)
            return
        if _PERSISTED[state]:
            progress = self._progress_of(holder) if _PROGRESS_HELD[state] else _NOT_IN_PROGRESS
            runs = changes._runs
            prev = runs[-1] if runs else None
            if prev is not None and prev[1] + 1 == first and prev[2] is state and prev[3] == count \
                    and (prev[4], prev[5], prev[6]) == progress and prev[7] is _NO_REASON:
                prev[1] = last
            else:
                runs.append([first, last, state, count, *progress, _NO_REASON])
        kind = row.kind
        if kind is not None:
            entry = changes._open[row.kind_id]  # (the shared empty list before the first event)
            if entry is not None and entry[2] + 1 == first and entry[4] == count and entry[3] == member_id \
                    and entry[5] is _NO_REASON:
                entry[2] = last
            else:
                changes.note(kind, row.kind_id, first, last, member_id, count)

    def _note_archived(self, changes: _Changes, holder: _InFlightBatch | _OffsetState, row: _Row, first: int,
                       last: int, member_id: str | None) -> None:
        state, count, reason = holder.state, holder.delivery_count, holder.reason
        changes.add(first, last, state, count, _NOT_IN_PROGRESS, reason if state is _ARCHIVING else _NO_REASON)
        kind = row.kind
        if kind is not None:
            # The action itself carries no reason (its ARCHIVING / ARCHIVED event does), except
            # DEAD_LETTERED, which says what the dead-letter record said.
            changes.note(kind, row.kind_id, first, last, member_id, count,
                         reason if kind is _DEAD_LETTERED_KIND else _NO_REASON)
        if state is _ARCHIVING:
            changes.note(_ARCHIVING_KIND, _ARCHIVING_KIND_ID, first, last, member_id, count, reason)
        else:
            changes.note(_ARCHIVED_KIND, _ARCHIVED_KIND_ID, first, last, member_id, count, reason)

    def _transit(
        self,
        holder: _InFlightBatch | _OffsetState,
        row: tuple,
        member_id: str | None,
        lock_id: int,
        first: int,
        last: int,
        records: int | None = None,
    ) -> None:
        """One table-driven move of the records [first, last] that share ``holder``'s state
        (``records`` of them when not all: see _move_span_by_type)."""
        move = row[holder.state]
        if move is None:  # callers validate first: an illegal move here is an engine bug
            raise AssertionError(f"no transition from {holder.state.name} for records {first}-{last}")
        if self._changed is not None:
            self._note_changed(first, last)
        count = holder.delivery_count + move.delivery_delta
        new_state = move.new_state
        n = last - first + 1 if records is None else records
        if move.archive_at_limit and count >= self._delivery_count_limit:
            new_state = _ARCHIVED
            holder.reason = _DELIVERY_LIMIT
        elif new_state is _ARCHIVED:
            if holder.state is _ARCHIVING:  # its dead-letter write is done: the reason stays
                self._archiving_records -= n
            else:
                holder.reason = move.archive_reason
        if new_state is _ARCHIVED and holder.state is not _ARCHIVING and self.config.dead_letter \
                and holder.reason in DEAD_LETTER_REASONS:
            new_state = _ARCHIVING  # KIP-1191: dead-lettered first, then ARCHIVED
            self._archiving_records += n
        # The first record to enter IN_PROGRESS starts the sweep clock (a refresh does not restart it).
        sweep_starts = not self._in_progress_records
        if self._staging and _PERSISTED[new_state]:
            self._stage(holder, first, last)
        elif holder.rollback is not None:
            holder.rollback = None  # a later, unstaged change (e.g. log truncation) supersedes it
        if _HOLDS_OWNER[holder.state]:
            lock = self._locks.get(holder.lock_id)
            if lock is not None:
                if _PROGRESS_HELD[holder.state] and not _PROGRESS_HELD[new_state]:
                    self._note_finished(self._now - lock.in_progress_start, n)
                if _HOLDS_OWNER[new_state]:
                    # A renewal or a mark: the records are still held since their acquisition.
                    renewed = self._locks[lock_id]
                    if lock.acquired_at < renewed.acquired_at:
                        renewed.acquired_at = lock.acquired_at
            self._detach(holder, n)
        holder.state = new_state
        holder.delivery_count = count
        if _HOLDS_OWNER[new_state]:
            if not move.keeps_owner or member_id is None:
                raise AssertionError(f"a move to {new_state.name} must name the member")
            holder.member_id = member_id
            holder.lock_id = lock_id
            lock = self._locks[lock_id]
            lock.held += n
            # The lock's scan range covers every record it holds, for expire() and the sweep.
            if first < lock.first_offset:
                lock.first_offset = first
            if last > lock.last_offset:
                lock.last_offset = last
            if _PROGRESS_HELD[new_state]:
                self._in_progress_records += n
                if sweep_starts:
                    self._next_sweep = self._now + self.config.sweep_interval_ms
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
        index = max(batches.bisect_right(first) - 1, 0)
        if last is not None:
            # Most lookups (an acknowledgement range, a change) fall inside one batch: answered
            # without an islice iterator, which costs more than the rest of such a lookup.
            batch = batches.peekitem(index)[1]
            if batch.first_offset <= first and last <= batch.last_offset:
                yield batch
                return
        for key in batches.islice(index):
            batch = batches[key]
            if last is not None and batch.first_offset > last:
                return
            if batch.last_offset >= first:
                yield batch

    def _pieces(self) -> Iterator[tuple[int, int, _InFlightBatch | _OffsetState]]:
        """(first, last, holder) over the window: a whole batch while it is uniform, else each run of
        offsets sharing one state object."""
        for batch in self._batches.values():
            offsets = batch.offsets
            if offsets is None:
                yield batch.first_offset, batch.last_offset, batch
                continue
            # Offsets sharing one state object are one piece.
            first = batch.first_offset
            run_start, run = 0, offsets[0]
            for i in range(1, len(offsets)):
                holder = offsets[i]
                if holder is not run:
                    yield first + run_start, first + i - 1, run
                    run_start, run = i, holder
            yield first + run_start, batch.last_offset, run

    def _runs(self) -> Iterator[tuple[int, int, RecordState, int, str | None]]:
        for first, last, h in self._pieces():
            yield first, last, h.state, h.delivery_count, h.member_id

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
                rest = batch.offsets[0]
                if self._merge and rest is batch.offsets[-1] and rest.rollback is None:
                    _unsplit(batch, rest)  # what is left is one run (each object fills one run)
            break
        if not self._batches:
            self._start = max(self._start, self._end)
            self._end = self._start
        if self._available_hint < self._start:
            self._available_hint = self._start

    def _finish(self, changes: _Changes, old_start: int | None = None) -> StateDelta | None:
        """Advance SPSO, then describe what must be persisted (None when nothing)."""
        before = self._start if old_start is None else old_start
        self._merge_touched()
        self._advance_start()
        moved = self._start != before
        changed = tuple(_coalesce(changes.batches))
        batches = _clip(changed, self._start)
        events = changes.events
        if not moved and not batches and not events:
            return None
        # A delta may carry events only (e.g. renewals of Acquired records): nothing to write.
        return StateDelta(self._start if moved else -1, batches, changed, events)


def _overlapping(firsts: list[int], batches: list[_InFlightBatch], first: int, last: int) -> list[_InFlightBatch]:
    """The batches (sorted, with their first offsets ``firsts``) overlapping [first, last]."""
    index = max(bisect.bisect_right(firsts, first) - 1, 0)
    out = []
    while index < len(batches):
        batch = batches[index]
        if batch.first_offset > last:
            break
        if batch.last_offset >= first:
            out.append(batch)
        index += 1
    return out


def _joined(ranges: Sequence[AckRange]) -> list[AckRange]:
    """Adjacent acknowledgement ranges as one range with a type per offset (clients send one range
    per run of equal types): the same moves in the same order, with the batch lookups and the
    per-range set-up paid once per run of adjacent offsets instead of once per type change."""
    out: list[AckRange] = []
    pending: list | None = None  # [first, last, types] of adjacent ranges being joined
    for ack in ranges:
        if pending is not None and pending[1] + 1 == ack.first_offset:
            types = ack.acknowledge_types
            size = ack.last_offset - ack.first_offset + 1
            pending[2].extend(types if len(types) == size else types * size)
            pending[1] = ack.last_offset
            continue
        if pending is not None:
            out.append(_as_range(pending))
        types = ack.acknowledge_types
        size = ack.last_offset - ack.first_offset + 1
        pending = [ack.first_offset, ack.last_offset, list(types if len(types) == size else types * size)]
    if pending is not None:
        out.append(_as_range(pending))
    return out


def _as_range(pending: list) -> AckRange:
    first, last, types = pending
    # One type for all: kept as one, so whole uniform batches still move in one step.
    return AckRange(first, last, (types[0],) if types.count(types[0]) == len(types) else tuple(types))


def _pieces_of(
    batch: _InFlightBatch, first: int, last: int
) -> Iterator[tuple[int, int, _InFlightBatch | _OffsetState]]:
    """(first, last, holder) over the offsets of ``batch`` within [first, last], as
    :meth:`SharePartition._pieces` gives them (cut to the range)."""
    lo, hi = max(first, batch.first_offset), min(last, batch.last_offset)
    if lo > hi:
        return
    offsets = batch.offsets
    if offsets is None:
        yield lo, hi, batch
        return
    base = batch.first_offset
    run_start, run = lo, offsets[lo - base]
    for i in range(lo - base + 1, hi - base + 1):
        holder = offsets[i]
        if holder is not run:
            yield run_start, base + i - 1, run
            run_start, run = base + i, holder
    yield run_start, hi, run


def _unsplit(batch: _InFlightBatch, state: _OffsetState) -> None:
    """Back to one uniform batch in ``state`` (every offset holds it, unstaged)."""
    batch.state = state.state
    batch.delivery_count = state.delivery_count
    batch.member_id = state.member_id
    batch.lock_id = state.lock_id
    batch.reason = state.reason
    batch.rollback = None
    batch.offsets = None
    batch.merged = True


def _acquisition_events(
    member_id: str, acquired: list[AcquiredRecords], delta: StateDelta | None
) -> tuple[RecordEvent, ...]:
    """ACQUIRED events for the ranges handed to the member (contiguous ranges with one count are
    one event), with the delta's ARCHIVED events, in offset order."""
    events: list[RecordEvent] = []
    for records in acquired:
        if events:
            prev = events[-1]
            if prev.last_offset + 1 == records.first_offset and prev.delivery_count == records.delivery_count:
                events[-1] = RecordEvent(EventKind.ACQUIRED, prev.first_offset, records.last_offset, member_id,
                                         records.delivery_count)
                continue
        events.append(RecordEvent(EventKind.ACQUIRED, records.first_offset, records.last_offset, member_id,
                                  records.delivery_count))
    if delta is not None and delta.events:
        events.extend(delta.events)
        events.sort(key=lambda e: e.first_offset)
    return tuple(events)


def _clip(batches: Iterable[PersistedBatch], start: int) -> tuple[PersistedBatch, ...]:
    """The batches' parts at or above ``start`` (the SPSO: nothing below it is persisted)."""
    return tuple(
        b if b.first_offset >= start else b._replace(first_offset=start)
        for b in batches
        if b.last_offset >= start
    )


def _persisted_view(snapshot: PartitionSnapshot, updates: Iterable[StateDelta],
                    ) -> tuple[int, Sequence[PersistedBatch]]:
    """The SPSO and the batches a rebuild starts from: the snapshot with the updates written over it
    in order, later writes winning. What the proxy writes is in offset order without overlaps, and
    is merged in one pass; anything else (another writer, damage) is laid over a sorted map."""
    updates = list(updates)
    start = snapshot.start_offset
    for update in updates:
        if update.start_offset >= 0:
            start = update.start_offset
    if not (_ascending(snapshot.state_batches) and all(_ascending(u.state_batches) for u in updates)):
        return start, _overlaid(snapshot.state_batches, updates)
    batches: Sequence[PersistedBatch] = snapshot.state_batches
    for update in updates:
        if update.state_batches:
            batches = _merged(batches, update.state_batches)
    return start, batches


def _ascending(batches: Sequence[PersistedBatch]) -> bool:
    """Whether ``batches`` are in offset order without overlaps (as the proxy writes them)."""
    previous_last = -1
    for batch in batches:
        if batch.first_offset <= previous_last or batch.last_offset < batch.first_offset:
            return False
        previous_last = batch.last_offset
    return True


def _merged(base: Sequence[PersistedBatch], over: Sequence[PersistedBatch]) -> list[PersistedBatch]:
    """``over`` written on top of ``base`` (both ``_ascending``), splitting what it covers: the
    overlay's result in one pass."""
    out: list[PersistedBatch] = []
    rest = iter(base)
    pending = next(rest, None)  # the base batch not yet passed, trimmed of what `over` covered
    for batch in over:
        first, last = batch.first_offset, batch.last_offset
        while pending is not None and pending.last_offset < first:
            out.append(pending)
            pending = next(rest, None)
        if pending is not None and pending.first_offset < first:
            out.append(pending._replace(last_offset=first - 1))
        out.append(batch)
        while pending is not None and pending.last_offset <= last:
            pending = next(rest, None)
        if pending is not None and pending.first_offset <= last:
            pending = pending._replace(first_offset=last + 1)
    if pending is not None:
        out.append(pending)
    out.extend(rest)
    return out


def _overlaid(snapshot_batches: Iterable[PersistedBatch], updates: Iterable[StateDelta]) -> Sequence[PersistedBatch]:
    """Every batch written over the ones before it, in any order or overlap."""
    overlay: SortedDict = SortedDict()  # first -> PersistedBatch, non-overlapping
    for batch in snapshot_batches:
        _overlay(overlay, batch)
    for update in updates:
        for batch in update.state_batches:
            _overlay(overlay, batch)
    return list(overlay.values())


def _overlay(overlay: SortedDict, batch: PersistedBatch) -> None:
    """Write ``batch`` over a map of non-overlapping persisted batches, splitting what it covers."""
    first, last = batch.first_offset, batch.last_offset
    index = max(overlay.bisect_right(first) - 1, 0)
    covered = []
    for b in itertools.islice(overlay.values(), index, None):
        if b.first_offset > last:
            break  # sorted: nothing further overlaps (an update in the middle costs what it covers)
        if b.last_offset >= first:
            covered.append(b)
    for old in covered:
        del overlay[old.first_offset]
        if old.first_offset < first:
            overlay[old.first_offset] = old._replace(last_offset=first - 1)
        if old.last_offset > last:
            overlay[last + 1] = old._replace(first_offset=last + 1)
    overlay[first] = batch


def _coalesce_persisted(batches: Iterable[PersistedBatch], start: int) -> Iterator[PersistedBatch]:
    """Replayed batches at or above ``start`` as the engine rebuilds from them: an explicit Available
    batch with delivery count 0 (a cumulative ShareUpdate's "back to nothing", state_delta) is left
    out, exactly like a gap, and adjacent batches of equal content are joined, so a snapshot with
    updates over it rebuilds the same engine as one snapshot of the same state."""
    run: PersistedBatch | None = None
    for batch in batches:
        if batch.last_offset < start:
            continue
        if batch.delivery_state == _AVAILABLE and batch.delivery_count == 0:
            continue
        if run is not None and run.last_offset + 1 == batch.first_offset and run.content == batch.content:
            run = run._replace(last_offset=batch.last_offset)
            continue
        if run is not None:
            yield run
        run = batch
    if run is not None:
        yield run
