"""The share-group event log: an append-only record of what happened to records (docs/event-log.md).

Compacted share state forgets history; the proxy also publishes, per share-partition, batched
ranges of events (acquired, accepted, released, rejected, lock-expired, archived with reason,
dead-lettered, marked in progress, stale-released ...) to an event topic. The Spark pipeline
(``spark/``) decodes them with this module.

This module fixes the wire ids (never renumber: the log is read long after it is written) and
the value types. Encoding: an int16 version prefix on key and value, then a Kafka-style message
(``codec/schemas/ShareEvent{Key,Value}.json``).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid


class EventKind(enum.IntEnum):
    """What happened to a range of records (int8 on the wire)."""

    ACQUIRED = 1  # handed to a member by ShareFetch (delivery_count is the new count)
    ACCEPTED = 2  # acknowledged ACCEPT
    RELEASED = 3  # acknowledged RELEASE by its member
    REJECTED = 4  # acknowledged REJECT (ARCHIVED or, with a dead-letter queue, ARCHIVING follows)
    LOCK_EXPIRED = 5  # acquisition lock ran out
    MEMBER_RELEASED = 6  # the member's session closed / it left: released, the delivery not counted
    ARCHIVED = 7  # reached ARCHIVED; ``reason`` says why
    DEAD_LETTERED = 8  # written to the group's dead-letter topic (ARCHIVED follows)
    MARKED_IN_PROGRESS = 9  # MarkInProgress (IN_PROGRESS extension)
    STALE_RELEASED = 10  # IN_PROGRESS without progress for the staleness threshold
    MAX_EXTENSION_RELEASED = 11  # IN_PROGRESS for the max lock extension
    GRACE_EXPIRED = 12  # a departed member's IN_PROGRESS records: the rebalance grace ran out
    RENEWED = 13  # acknowledged RENEW: the acquisition lock restarted
    ARCHIVING = 14  # entered ARCHIVING: the dead-letter write is pending (``reason`` says why)


class ArchiveReason(enum.IntEnum):
    """Why records were archived (int8 on the wire); NONE for events that archive nothing."""

    NONE = 0
    REJECTED = 1  # the client rejected them
    DELIVERY_LIMIT = 2  # released / lock expired / IN_PROGRESS released at the delivery count limit
    LOG_TRUNCATED = 3  # the log start offset moved past them (retention, DeleteRecords)
    GAP = 4  # acknowledged GAP: no record at the offset
    ABORTED_TRANSACTION = 5  # read_committed: part of an aborted transaction
    CONTROL_RECORD = 6  # a transaction marker


#: The dead-letter reasons: records archived for these are what KIP-1191 dead-letters.
DEAD_LETTER_REASONS = frozenset({ArchiveReason.REJECTED, ArchiveReason.DELIVERY_LIMIT})

#: Kafka's ``__dlq.errors.message`` header for each dead-letter reason (KIP-1191).
DEAD_LETTER_MESSAGES = {
    ArchiveReason.REJECTED: "Offset rejected by client.",
    ArchiveReason.DELIVERY_LIMIT: "Offset delivery count exceeded the threshold.",
}


@dataclasses.dataclass(frozen=True, slots=True)
class ShareEvent:
    """One event over the offsets [first_offset, last_offset] of a share-partition."""

    kind: EventKind
    first_offset: int
    last_offset: int
    member_id: str | None  # the member that acted or held the records; None when none did
    delivery_count: int  # the records' delivery count after the event
    reason: ArchiveReason = ArchiveReason.NONE
    timestamp_ms: int = -1  # wall-clock ms when the proxy saw the change

    @property
    def records(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclasses.dataclass(frozen=True, slots=True)
class ShareEventBatch:
    """One event-topic record: a share-partition's events in the order they happened."""

    group_id: str
    topic_id: uuid.UUID  # the source topic's id
    topic: str  # the source topic's name when the event was published
    partition: int
    events: tuple[ShareEvent, ...]
