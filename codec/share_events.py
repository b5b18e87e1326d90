"""The share-group event log: an append-only record of what happened to records (docs/event-log.md).

Compacted share state forgets history; the proxy also publishes, per share-partition, batched
ranges of events (acquired, accepted, released, rejected, lock-expired, archived with reason,
dead-lettered, marked in progress, stale-released ...) to an event topic. The Spark pipeline
(``spark/``) decodes them with this module.

This module fixes the wire ids (never renumber: the log is read long after it is written) and
the value types. Encoding: an int16 version prefix on key and value, then a Kafka-style message
(``codec/schemas/ShareEvent{Key,Value}.json``), byte tables in docs/event-log.md.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import struct
import uuid
from collections.abc import Sequence

from .errors import ShareEventError
from .varint import write_compact_string, write_uvarint


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


# --- encoding ---------------------------------------------------------------------------------
# The layouts are the JSON definitions' (ShareEventKey / ShareEventValue, flexible version 0),
# which stay the reference: tests check these hand-written readers and writers against the
# schema-built classes on arbitrary values and bytes. Written by hand because the proxy encodes
# every acknowledgement's events and the Spark jobs decode tens of millions of them: building
# entity objects per event is 5-10x slower.

#: The int16 prefix of every event-log key: the key layout (ShareEventKey v0).
EVENT_KEY_VERSION = 0
#: The int16 prefix of every event-log value: the value layout (ShareEventValue v0).
EVENT_VALUE_VERSION = 0


@functools.cache
def schema_classes() -> tuple[type, type]:
    """The (ShareEventKey, ShareEventValue) classes built from the JSON definitions: the reference
    layout, for tests and tools. Built on demand: importing kio (and what it pulls in) would make
    the pure engine, which imports this module's enums, and Spark's workers import far more."""
    from .schema import MessageDefinition

    return (MessageDefinition.bundled("ShareEventKey").entity(EVENT_KEY_VERSION),
            MessageDefinition.bundled("ShareEventValue").entity(EVENT_VALUE_VERSION))

_INT16 = struct.Struct(">h")
_KEY_FIXED = struct.Struct(">16si")  # TopicId, Partition
_EVENT_HEAD = struct.Struct(">bqq")  # Kind, FirstOffset, LastOffset
_EVENT_TAIL = struct.Struct(">hbq")  # DeliveryCount, Reason, Timestamp
_NO_TAGGED_FIELDS = b"\x00"
# Known ids map to their enum member; an id a newer proxy wrote stays a plain int.
_KINDS = {int(kind): kind for kind in EventKind}
_REASONS = {int(reason): reason for reason in ArchiveReason}
_MAX_STRING_BYTES = 0x7FFF  # Kafka's string limit (int16 length in non-flexible versions)


class UnsupportedEventVersion(ShareEventError):
    """A key or value version this codec does not know (written by a newer proxy)."""

    def __init__(self, what: str, version: int) -> None:
        self.version = version
        super().__init__(f"share event {what} version {version} is not supported")


def _compact_string(text: str | None) -> bytes:
    # UTF-8 takes at most 4 bytes a character: only a long string needs measuring.
    if text is not None and len(text) > _MAX_STRING_BYTES // 4 and len(text.encode("utf-8")) > _MAX_STRING_BYTES:
        raise ShareEventError(f"string of {len(text.encode('utf-8'))} bytes is longer than {_MAX_STRING_BYTES}")
    return write_compact_string(text)


def encode_event_key(group_id: str, topic_id: uuid.UUID, partition: int) -> bytes:
    """The key of a share-partition's event records (the same bytes for all of them)."""
    try:
        return b"".join(
            (_INT16.pack(EVENT_KEY_VERSION), _compact_string(group_id), _KEY_FIXED.pack(topic_id.bytes, partition), _NO_TAGGED_FIELDS)
        )
    except (struct.error, AttributeError, UnicodeError) as error:
        raise ShareEventError(f"cannot encode the event key of {group_id}/{topic_id}-{partition}: {error}") from error


def encode_event_value(topic: str, events: tuple[ShareEvent, ...] | list[ShareEvent]) -> bytes:
    """The value of one event record: the source topic's name and the events, oldest first."""
    parts = [_INT16.pack(EVENT_VALUE_VERSION), _compact_string(topic), write_uvarint(len(events) + 1)]
    append, head, tail, string = parts.append, _EVENT_HEAD.pack, _EVENT_TAIL.pack, _compact_string
    try:
        for event in events:
            append(head(event.kind, event.first_offset, event.last_offset))
            append(string(event.member_id))
            append(tail(event.delivery_count, event.reason, event.timestamp_ms))
            append(_NO_TAGGED_FIELDS)
    except (struct.error, UnicodeError) as error:
        raise ShareEventError(f"cannot encode event {event!r} of {topic}: {error}") from error
    append(_NO_TAGGED_FIELDS)
    return b"".join(parts)


def encode_event_rows(topic: str, rows: Sequence[Sequence]) -> bytes:
    """:func:`encode_event_value` for plain rows in :data:`EventRow`'s field order (kind,
    first_offset, last_offset, member_id, delivery_count, reason, timestamp_ms): the same bytes,
    without building a ShareEvent per event (the publisher encodes what it merged as lists)."""
    parts = [_INT16.pack(EVENT_VALUE_VERSION), _compact_string(topic), write_uvarint(len(rows) + 1)]
    append, head, tail, string = parts.append, _EVENT_HEAD.pack, _EVENT_TAIL.pack, _compact_string
    try:
        for kind, first_offset, last_offset, member_id, delivery_count, reason, timestamp_ms in rows:
            append(head(kind, first_offset, last_offset))
            append(string(member_id))
            append(tail(delivery_count, reason, timestamp_ms))
            append(_NO_TAGGED_FIELDS)
    except (struct.error, UnicodeError) as error:
        raise ShareEventError(f"cannot encode an event row of {topic}: {error}") from error
    append(_NO_TAGGED_FIELDS)
    return b"".join(parts)


def encode_event_batch(batch: ShareEventBatch) -> tuple[bytes, bytes]:
    """(key, value) bytes of one event-topic record."""
    return encode_event_key(batch.group_id, batch.topic_id, batch.partition), encode_event_value(batch.topic, batch.events)


# --- decoding ---------------------------------------------------------------------------------

#: One decoded event as a plain tuple, in ShareEvent's field order:
#: (kind, first_offset, last_offset, member_id, delivery_count, reason, timestamp_ms).
EventRow = tuple[EventKind | int, int, int, str | None, int, ArchiveReason | int, int]


def _version(data: bytes, what: str) -> int:
    if len(data) < 2:
        raise ShareEventError(f"{what} of {len(data)} bytes has no version prefix")
    return _INT16.unpack_from(data)[0]


def _read_uvarint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]  # IndexError past the end: reported as truncated by the caller
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 28:
            raise ShareEventError(f"varint longer than 5 bytes before byte {position}")


def _read_string(data: bytes, position: int, nullable: bool) -> tuple[str | None, int]:
    length, position = _read_uvarint(data, position)
    if length == 0:
        if nullable:
            return None, position
        raise ShareEventError(f"null string at byte {position - 1} where a value is required")
    end = position + length - 1
    if end > len(data):
        raise ShareEventError(f"string of {length - 1} bytes at byte {position} runs past the end ({len(data)})")
    return data[position:end].decode("utf-8"), end


def _skip_tagged_fields(data: bytes, position: int) -> int:
    count, position = _read_uvarint(data, position)
    previous_tag = -1
    for _ in range(count):
        tag, position = _read_uvarint(data, position)
        if tag <= previous_tag:
            raise ShareEventError(f"tagged fields out of order before byte {position}")
        previous_tag = tag
        size, position = _read_uvarint(data, position)
        position += size
        if position > len(data):
            raise ShareEventError(f"tagged field {tag} of {size} bytes runs past the end ({len(data)})")
    return position


def _finish(data: bytes, position: int, what: str) -> None:
    if position != len(data):
        raise ShareEventError(f"{len(data) - position} trailing bytes after the event {what}")


def decode_event_key(key: bytes | bytearray | memoryview) -> tuple[str, uuid.UUID, int]:
    """(group id, topic id, partition) of an event-log key."""
    data = bytes(key)
    version = _version(data, "key")
    if version != EVENT_KEY_VERSION:
        raise UnsupportedEventVersion("key", version)
    try:
        group_id, position = _read_string(data, 2, nullable=False)
        topic_id, partition = _KEY_FIXED.unpack_from(data, position)
        position = _skip_tagged_fields(data, position + _KEY_FIXED.size)
    except (IndexError, struct.error) as error:
        raise ShareEventError(f"event key of {len(data)} bytes is truncated: {error}") from None
    except UnicodeDecodeError as error:
        raise ShareEventError(f"event key group id is not UTF-8: {error}") from None
    _finish(data, position, "key")
    return group_id, uuid.UUID(bytes=topic_id), partition  # type: ignore[return-value]


def decode_event_rows(value: bytes | bytearray | memoryview) -> tuple[str, list[EventRow]]:
    """(source topic name, event rows) of an event-log value: the fast path for bulk readers
    (Spark), plain tuples instead of ShareEvent objects. Unknown kind / reason ids stay ints."""
    data = bytes(value)
    version = _version(data, "value")
    if version != EVENT_VALUE_VERSION:
        raise UnsupportedEventVersion("value", version)
    kinds, reasons = _KINDS, _REASONS
    head, tail = _EVENT_HEAD.unpack_from, _EVENT_TAIL.unpack_from
    rows: list[EventRow] = []
    append = rows.append
    try:
        topic, position = _read_string(data, 2, nullable=False)
        count, position = _read_uvarint(data, position)
        if count == 0:
            raise ShareEventError("null event array")
        if count - 1 > len(data):  # each event takes at least 30 bytes: refuse absurd counts early
            raise ShareEventError(f"{count - 1} events cannot fit in {len(data)} bytes")
        for _ in range(count - 1):
            kind, first_offset, last_offset = head(data, position)
            position += 17
            length = data[position]
            if length == 0:
                member_id = None
                position += 1
            elif length < 0x80:  # one-byte length: every member id in practice
                end = position + length
                if end > len(data):
                    raise ShareEventError(f"member id at byte {position} runs past the end ({len(data)})")
                member_id = data[position + 1 : end].decode("utf-8")
                position = end
            else:
                member_id, position = _read_string(data, position, nullable=True)
            delivery_count, reason, timestamp = tail(data, position)
            position += 11
            if data[position] == 0:
                position += 1  # no tagged fields
            else:
                position = _skip_tagged_fields(data, position)  # a later version's fields
            append((kinds.get(kind, kind), first_offset, last_offset, member_id, delivery_count, reasons.get(reason, reason), timestamp))
        position = _skip_tagged_fields(data, position)
    except (IndexError, struct.error) as error:
        raise ShareEventError(f"event value of {len(data)} bytes is truncated: {error}") from None
    except UnicodeDecodeError as error:
        raise ShareEventError(f"event value string is not UTF-8: {error}") from None
    _finish(data, position, "value")
    return topic, rows  # type: ignore[return-value]


def decode_event_batch(key: bytes | bytearray | memoryview, value: bytes | bytearray | memoryview) -> ShareEventBatch:
    """The batch in one event-topic record; raises a ShareEventError (a CodecError) on bad bytes.

    Kind and reason ids this version does not know stay plain ints, so a reader keeps working on
    a newer proxy's events."""
    group_id, topic_id, partition = decode_event_key(key)
    topic, rows = decode_event_rows(value)
    return ShareEventBatch(group_id, topic_id, topic, partition, tuple(ShareEvent(*row) for row in rows))  # type: ignore[arg-type]
