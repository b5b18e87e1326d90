"""Record states of a share-partition and their legal moves, as one table (KIP-932 "In-flight records").

Every state change of an in-flight record goes through ``TRANSITIONS[(state, event)]``; a missing
key is an illegal move and the engine turns it into ``INVALID_RECORD_STATE`` (for a client's
acknowledgement) or a bug (for its own bookkeeping). The IN_PROGRESS extension adds its state and
its rows here; nothing else in the engine needs to learn new states.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from codec.share_events import ArchiveReason


class RecordState(enum.IntEnum):
    """Per-record state with Kafka's wire ids (``DeliveryState`` in ShareSnapshot/ShareUpdate)."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    # KIP-1191: archived for a dead-letter reason, the dead-letter write pending (then ARCHIVED).
    ARCHIVING = 3
    ARCHIVED = 4
    # Draft KIP KAFKA-20458 §2.2: the application has the record and said it is working on it.
    IN_PROGRESS = 5


@dataclass(frozen=True, slots=True)
class StateTraits:
    """What a state means to the engine, so a new state is a row here, not a special case there.

    ``holds_owner``: records in it belong to one member (only that member may acknowledge them).
    ``holds_lock``: they are under an acquisition lock that expires (the engine's deadline heap).
    ``persisted``: the state is written to the state topic as itself. A state that is not (Acquired,
    KIP-932) is written as ``persisted_as`` with the delivery count moved by ``persisted_count_delta``:
    what was durable before the member took the records.
    ``terminal``: never moves again; the SPSO advances over it.
    ``progress_held``: held by progress marks instead of the acquisition lock: released by the
    staleness sweep, the max extension and the rebalance grace (draft KIP §3.3), never by expire().
    """

    holds_owner: bool = False
    holds_lock: bool = False
    persisted: bool = True
    persisted_as: RecordState | None = None
    persisted_count_delta: int = 0
    terminal: bool = False
    progress_held: bool = False


STATE_TRAITS: dict[RecordState, StateTraits] = {
    RecordState.AVAILABLE: StateTraits(),
    # KIP-932: "the ACQUIRED state is not persisted" -- a restart makes the records available again.
    RecordState.ACQUIRED: StateTraits(holds_owner=True, holds_lock=True, persisted=False,
                                      persisted_as=RecordState.AVAILABLE, persisted_count_delta=-1),
    RecordState.ACKNOWLEDGED: StateTraits(terminal=True),
    RecordState.ARCHIVED: StateTraits(terminal=True),
    # KIP-1191: persisted as itself so a restart dead-letters it again; not terminal (the SPSO waits
    # for the dead-letter write), owned by nobody, never acquired again.
    RecordState.ARCHIVING: StateTraits(),
    # Persisted as itself with its owner and times (tags 100-102), so in-progress work survives a
    # restart; not under the acquisition lock (docs/in-progress.md "The IN_PROGRESS lock").
    RecordState.IN_PROGRESS: StateTraits(holds_owner=True, progress_held=True),
}

# Records in these states never move again; SPSO advances over them (KIP-932 "Managing the SPSO").
TERMINAL_STATES: frozenset[RecordState] = frozenset(s for s, t in STATE_TRAITS.items() if t.terminal)


class AcknowledgeType(enum.IntEnum):
    """Acknowledgement types as they travel in ShareFetch/ShareAcknowledge ``AcknowledgeTypes``."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


class Event(enum.Enum):
    """What can happen to a record."""

    ACQUIRE = "acquire"  # handed to a member by ShareFetch
    ACCEPT = "accept"
    RELEASE = "release"  # explicit release by the owning member
    REJECT = "reject"
    GAP = "gap"  # the offset holds no record (compaction)
    RENEW = "renew"  # restart the acquisition lock
    LOCK_EXPIRED = "lock-expired"
    MEMBER_LEFT = "member-left"  # share session closed / member left the group
    ARCHIVE = "archive"  # log truncation (control batches, aborted transactions and gaps join the window archived)
    MARK = "mark"  # MarkInProgress (draft KIP §3.2)
    STALE = "stale"  # no progress within the staleness threshold (sweeper, or a stuck member leaving)
    MAX_EXTENSION = "max-extension"  # in progress for the max lock extension, progress or not
    GRACE_EXPIRED = "grace-expired"  # the rebalance grace of a departed member's fresh work ran out
    DEAD_LETTER = "dead-letter"  # the dead-letter write is done (or given up): ARCHIVING -> ARCHIVED


ACK_EVENTS: dict[AcknowledgeType, Event] = {
    AcknowledgeType.GAP: Event.GAP,
    AcknowledgeType.ACCEPT: Event.ACCEPT,
    AcknowledgeType.RELEASE: Event.RELEASE,
    AcknowledgeType.REJECT: Event.REJECT,
    AcknowledgeType.RENEW: Event.RENEW,
}


@dataclass(frozen=True, slots=True)
class Transition:
    """The outcome of one (state, event) pair.

    ``delivery_delta`` is applied to the delivery count. ``archive_at_limit`` turns a move to
    AVAILABLE into ARCHIVED once the delivery count has reached the group's limit.
    ``archive_reason``: why a move to ARCHIVED archives (an archive at the limit is always
    DELIVERY_LIMIT). Archived for a dead-letter reason (``DEAD_LETTER_REASONS``: a reject, the
    delivery limit) with a dead-letter queue configured, records go to ARCHIVING instead (KIP-1191).
    """

    new_state: RecordState
    delivery_delta: int = 0
    archive_at_limit: bool = False
    keeps_owner: bool = False
    archive_reason: ArchiveReason = ArchiveReason.NONE


_A = RecordState.AVAILABLE
_Q = RecordState.ACQUIRED
_K = RecordState.ACKNOWLEDGED
_X = RecordState.ARCHIVED
_D = RecordState.ARCHIVING
_P = RecordState.IN_PROGRESS
_REJECTED = ArchiveReason.REJECTED
_GAP = ArchiveReason.GAP
_TRUNCATED = ArchiveReason.LOG_TRUNCATED

TRANSITIONS: dict[tuple[RecordState, Event], Transition] = {
    # KIP-932: "Every time that a record is acquired ... its delivery count increments by 1."
    (_A, Event.ACQUIRE): Transition(_Q, delivery_delta=+1, keeps_owner=True),
    (_Q, Event.ACCEPT): Transition(_K),
    # KIP-932 state diagram: released / lock elapsed -> Available, or Archived at the limit.
    (_Q, Event.RELEASE): Transition(_A, archive_at_limit=True),
    (_Q, Event.LOCK_EXPIRED): Transition(_A, archive_at_limit=True),
    (_Q, Event.REJECT): Transition(_X, archive_reason=_REJECTED),
    # Gap: nothing was there to deliver; archived, delivery count left as it is (as Kafka).
    (_Q, Event.GAP): Transition(_X, archive_reason=_GAP),
    (_Q, Event.RENEW): Transition(_Q, keeps_owner=True),
    # Kafka releases a closing session's records with DeliveryCountOps.DECREASE: the attempt
    # never reached the application, so it does not count and never archives.
    (_Q, Event.MEMBER_LEFT): Transition(_A, delivery_delta=-1),
    (_A, Event.ARCHIVE): Transition(_X, archive_reason=_TRUNCATED),
    (_Q, Event.ARCHIVE): Transition(_X, archive_reason=_TRUNCATED),
    # Draft KIP §2.2 "Allowed transitions". No row changes the delivery count: the delivery was
    # counted at acquisition, and an IN_PROGRESS record has provably reached the application, so
    # releasing it is that same attempt ending (docs/in-progress.md "Delivery counting").
    (_Q, Event.MARK): Transition(_P, keeps_owner=True),
    (_P, Event.MARK): Transition(_P, keeps_owner=True),  # progress refreshed, start kept
    (_P, Event.RENEW): Transition(_P, keeps_owner=True),  # a stock client's renew counts as progress
    (_P, Event.ACCEPT): Transition(_K),
    (_P, Event.RELEASE): Transition(_A, archive_at_limit=True),
    (_P, Event.REJECT): Transition(_X, archive_reason=_REJECTED),
    (_P, Event.GAP): Transition(_X, archive_reason=_GAP),
    (_P, Event.STALE): Transition(_A, archive_at_limit=True),
    (_P, Event.MAX_EXTENSION): Transition(_A, archive_at_limit=True),
    (_P, Event.GRACE_EXPIRED): Transition(_A, archive_at_limit=True),
    (_P, Event.ARCHIVE): Transition(_X, archive_reason=_TRUNCATED),
    # KIP-1191: the dead-letter record is written (or the write given up, as Kafka archives anyway);
    # the records keep the reason they entered ARCHIVING with.
    # No ARCHIVE row: records waiting for their dead-letter write stay so when the log start passes
    # them (written with headers only) -- the SPSO never passes ARCHIVING.
    (_D, Event.DEAD_LETTER): Transition(_X),
    # No (IN_PROGRESS, MEMBER_LEFT) row: a departing member's in-progress records are STALE at once
    # or held for the rebalance grace, then GRACE_EXPIRED, by freshness (draft KIP "Rebalance flow").
}


def transition(state: RecordState, event: Event) -> Transition:
    """Look up a legal move; ``KeyError`` if the move is illegal."""
    return TRANSITIONS[(state, event)]
