"""Share-state records, byte-compatible with Apache Kafka's share coordinator.

A record on the share-group state topic has a key and a value, each an int16
version prefix followed by a Kafka-style message (definitions in ``codec/schemas``):

========================  ===========  ==================================
key version (record type)  key          value (value version 0)
========================  ===========  ==================================
0                          ShareSnapshotKey  ShareSnapshotValue: full state
1                          ShareUpdateKey    ShareUpdateValue: a delta
32001                      ProxyShareGroupMetadataKey    group epoch
32002                      ProxyShareGroupPartitionsKey  initialized partitions
32003                      ProxyShareGroupConfigKey      group configs
32004                      ProxyStateLayoutKey           the layout marker
========================  ===========  ==================================

Types 0 and 1 are exactly Kafka 4.4's (including the tagged DeliveryCompleteCount).
The IN_PROGRESS extension adds state 5 and three tagged fields per state batch
(tags 100 InProgressStartTimestamp, 101 LastProgressTimestamp, 102 InProgressMemberId);
state 3 (ARCHIVING, KIP-1191, as Kafka 4.4) batches carry tag 103 ArchiveReason
(int8: 1 rejected, 2 delivery limit, 0 unknown -- Kafka's own ARCHIVING batches lack it, and a
reader then derives the reason from the delivery count, as Kafka does). Kafka's readers keep
these as unknown tagged fields. Types
32001+ are the proxy's own; Kafka's coordinator loaders skip unknown record types.
A ``None`` value is a tombstone.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Iterable
from typing import NamedTuple

from .errors import CodecError, StateRecordError
from .registry import decode_entity, encode
from .schema import MessageDefinition


class RecordType(enum.IntEnum):
    SHARE_SNAPSHOT = 0
    SHARE_UPDATE = 1
    PROXY_GROUP_METADATA = 32001
    PROXY_GROUP_PARTITIONS = 32002
    PROXY_GROUP_CONFIG = 32003
    PROXY_STATE_LAYOUT = 32004


class DeliveryState(enum.IntEnum):
    """Persisted record states (Kafka's RecordState ids; ACQUIRED is never persisted)."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVING = 3
    ARCHIVED = 4
    IN_PROGRESS = 5  # extension (draft KIP KAFKA-20458)


VALUE_VERSION = 0

_NAMES = {
    RecordType.SHARE_SNAPSHOT: "ShareSnapshot",
    RecordType.SHARE_UPDATE: "ShareUpdate",
    RecordType.PROXY_GROUP_METADATA: "ProxyShareGroupMetadata",
    RecordType.PROXY_GROUP_PARTITIONS: "ProxyShareGroupPartitions",
    RecordType.PROXY_GROUP_CONFIG: "ProxyShareGroupConfig",
    RecordType.PROXY_STATE_LAYOUT: "ProxyStateLayout",
}
_KEYS: dict[int, type] = {}
_VALUES: dict[int, type] = {}
for _record_type, _name in _NAMES.items():
    _KEYS[_record_type] = MessageDefinition.bundled(f"{_name}Key").entity(0)
    _VALUES[_record_type] = MessageDefinition.bundled(f"{_name}Value").entity(VALUE_VERSION)

ShareSnapshotKey = _KEYS[RecordType.SHARE_SNAPSHOT]
ShareSnapshotValue = _VALUES[RecordType.SHARE_SNAPSHOT]
ShareUpdateKey = _KEYS[RecordType.SHARE_UPDATE]
ShareUpdateValue = _VALUES[RecordType.SHARE_UPDATE]
ProxyShareGroupMetadataKey = _KEYS[RecordType.PROXY_GROUP_METADATA]
ProxyShareGroupMetadataValue = _VALUES[RecordType.PROXY_GROUP_METADATA]
ProxyShareGroupPartitionsKey = _KEYS[RecordType.PROXY_GROUP_PARTITIONS]
ProxyShareGroupPartitionsValue = _VALUES[RecordType.PROXY_GROUP_PARTITIONS]
ProxyShareGroupConfigKey = _KEYS[RecordType.PROXY_GROUP_CONFIG]
ProxyShareGroupConfigValue = _VALUES[RecordType.PROXY_GROUP_CONFIG]
ProxyStateLayoutKey = _KEYS[RecordType.PROXY_STATE_LAYOUT]
ProxyStateLayoutValue = _VALUES[RecordType.PROXY_STATE_LAYOUT]

_TYPE_OF_KEY = {cls: record_type for record_type, cls in _KEYS.items()}
_TYPE_OF_VALUE = {cls: record_type for record_type, cls in _VALUES.items()}
_INT16 = struct.Struct(">h")


class UnknownStateRecordType(StateRecordError):
    """A key version this codec does not know; replaying readers may skip the record."""

    def __init__(self, record_type: int) -> None:
        self.record_type = record_type
        super().__init__(f"unknown state record type (key version) {record_type}")


@dataclasses.dataclass(frozen=True, slots=True)
class StateRecord:
    """A decoded state-topic record; ``value`` None is a tombstone."""

    record_type: RecordType
    key: object
    value: object | None

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


def encode_key(key: object) -> bytes:
    """The record key bytes: int16 record type, then the key message."""
    record_type = _TYPE_OF_KEY.get(type(key))
    if record_type is None:
        raise StateRecordError(f"{type(key).__name__} is not a state record key")
    return _INT16.pack(record_type) + encode(key)


def encode_value(value: object | None) -> bytes | None:
    """The record value bytes: int16 value version, then the message; None stays None (tombstone)."""
    if value is None:
        return None
    if type(value) not in _TYPE_OF_VALUE:
        raise StateRecordError(f"{type(value).__name__} is not a state record value")
    return _INT16.pack(VALUE_VERSION) + encode(value)


def encode_record(key: object, value: object | None) -> tuple[bytes, bytes | None]:
    """Key and value bytes; the value's type must match the key's record type."""
    if value is not None and _TYPE_OF_KEY.get(type(key)) != _TYPE_OF_VALUE.get(type(value)):
        raise StateRecordError(f"{type(value).__name__} does not belong with {type(key).__name__}")
    return encode_key(key), encode_value(value)


def _split_version(data: bytes | bytearray | memoryview, what: str) -> tuple[int, memoryview]:
    view = memoryview(data)
    if len(view) < 2:
        raise StateRecordError(f"{what} of {len(view)} bytes has no version prefix")
    return _INT16.unpack_from(view)[0], view[2:]


def decode_key(data: bytes | bytearray | memoryview) -> tuple[RecordType, object]:
    """(record type, key entity) from record key bytes."""
    version, body = _split_version(data, "key")
    if version not in _KEYS:
        raise UnknownStateRecordType(version)
    record_type = RecordType(version)
    return record_type, _decode(_KEYS[record_type], body)


def decode_value(record_type: RecordType, data: bytes | bytearray | memoryview | None) -> object | None:
    """The value entity for ``record_type``, or None for a tombstone."""
    if data is None:
        return None
    version, body = _split_version(data, "value")
    if version != VALUE_VERSION:
        raise StateRecordError(f"{_NAMES[record_type]}Value version {version} is not supported")
    return _decode(_VALUES[record_type], body)


def decode_record(key: bytes | bytearray | memoryview, value: bytes | bytearray | memoryview | None) -> StateRecord:
    """Decode a state-topic record (value None: tombstone)."""
    record_type, key_entity = decode_key(key)
    return StateRecord(record_type, key_entity, decode_value(record_type, value))


def _decode(entity_type: type, body: memoryview) -> object:
    try:
        return decode_entity(entity_type, body)
    except CodecError as error:
        raise StateRecordError(str(error)) from error


# ----- the replay fast path -------------------------------------------------------------------
#
# Replay reads every ShareSnapshot and ShareUpdate on the state topic. The generic path (a bounds
# walk over the schema, then kio building entities) costs about 30 us for a small snapshot; this
# reader walks the two value layouts directly with struct, checking every length against the bytes
# left as it goes (so hostile counts allocate nothing), and returns plain tuples. It accepts only
# the canonical encoding: known tags in ascending order, one-byte varints where the proxy writes
# one-byte varints, no trailing bytes. Anything else -- damaged or merely unusual -- returns None,
# and the caller decodes with decode_value(), which then gives exactly today's result or error.


# One StateBatch as a plain tuple (built at C speed in the hot loop): (first_offset, last_offset,
# delivery_state, delivery_count, in_progress_start_timestamp, last_progress_timestamp,
# in_progress_member_id, archive_reason); absent tags at their defaults -1, -1, None, 0.
StateBatchView = tuple[int, int, int, int, int, int, "str | None", int]
_NO_TAGS = (-1, -1, None, 0)


class ShareValueView(NamedTuple):
    """What replay reads of a ShareSnapshot / ShareUpdate value (an update has no state epoch or
    create timestamp: 0 here)."""

    snapshot_epoch: int
    state_epoch: int
    start_offset: int
    create_timestamp: int
    state_batches: tuple[StateBatchView, ...]


_SNAPSHOT_HEAD = struct.Struct(">hiiiqqq")  # value version, epochs (snapshot, state, leader), start, create, write
_UPDATE_HEAD = struct.Struct(">hiiq")  # value version, snapshot epoch, leader epoch, start offset
_BATCH_HEAD = struct.Struct(">qqbh")  # first, last, delivery state, delivery count
_I64 = struct.Struct(">q")
_MIN_BATCH = _BATCH_HEAD.size + 1  # the fixed fields and an empty tag section


class _NotCanonical(Exception):
    """Not the encoding the fast reader handles; the generic decoder decides."""


def _batch_tags(buf: bytes, pos: int, end: int, count: int) -> tuple[tuple, int]:
    """The extension tags (100-103) of one StateBatch: ((start, progress, member, reason), new pos)."""
    if count > 4:
        raise _NotCanonical
    start, progress, member, reason = _NO_TAGS
    previous = -1
    for _ in range(count):
        if pos + 2 > end:
            raise _NotCanonical
        tag, size = buf[pos], buf[pos + 1]
        pos += 2
        if tag <= previous or size & 0x80 or pos + size > end:
            raise _NotCanonical
        previous = tag
        if tag == 100 and size == 8:
            start = _I64.unpack_from(buf, pos)[0]
        elif tag == 101 and size == 8:
            progress = _I64.unpack_from(buf, pos)[0]
        elif tag == 102 and size >= 1:
            length = buf[pos]  # compact nullable string: length + 1, 0 for null
            if length & 0x80 or (length - 1 if length else 0) != size - 1:
                raise _NotCanonical
            member = None if length == 0 else buf[pos + 1:pos + size].decode("utf-8")
        elif tag == 103 and size == 1:
            reason = buf[pos] - 256 if buf[pos] > 127 else buf[pos]
        else:
            raise _NotCanonical
        pos += size
    return (start, progress, member, reason), pos


def read_share_value(record_type: RecordType, data: bytes) -> ShareValueView | None:
    """The ShareSnapshot / ShareUpdate value in ``data`` read without the generic decoder, or None
    when it is not in the canonical encoding (damaged or unusual): then ``decode_value`` decides.
    Never raises, never allocates by a length it has not checked against the bytes left."""
    try:
        return _read_share_value(record_type, data if type(data) is bytes else bytes(data))
    except (_NotCanonical, struct.error, IndexError, UnicodeDecodeError):
        return None


def _read_share_value(record_type: RecordType, buf: bytes) -> ShareValueView:
    end = len(buf)
    if record_type is RecordType.SHARE_SNAPSHOT:
        version, epoch, state_epoch, _leader, start, created, _written = _SNAPSHOT_HEAD.unpack_from(buf, 0)
        pos = _SNAPSHOT_HEAD.size
    elif record_type is RecordType.SHARE_UPDATE:
        version, epoch, _leader, start = _UPDATE_HEAD.unpack_from(buf, 0)
        state_epoch = created = 0
        pos = _UPDATE_HEAD.size
    else:
        raise _NotCanonical
    if version != VALUE_VERSION:
        raise _NotCanonical
    # The batch count (compact array: count + 1), at most two varint bytes (16,382 batches).
    first_byte = buf[pos]
    if first_byte & 0x80:
        second = buf[pos + 1]
        if second & 0x80 or second == 0:
            raise _NotCanonical
        count_plus_one = (first_byte & 0x7F) | second << 7
        pos += 2
    else:
        count_plus_one = first_byte
        pos += 1
    count = count_plus_one - 1
    if count < 0 or count * _MIN_BATCH > end - pos:
        raise _NotCanonical
    unpack = _BATCH_HEAD.unpack_from
    head = _BATCH_HEAD.size
    no_tags = _NO_TAGS
    batches = []
    append = batches.append
    for _ in range(count):
        fixed = unpack(buf, pos)
        tags = buf[pos + head]
        pos += head + 1
        if tags == 0:
            append(fixed + no_tags)
        else:
            values, pos = _batch_tags(buf, pos, end, tags)
            append(fixed + values)
    # The value's own tag section: DeliveryCompleteCount (tag 0, int32) or nothing.
    tags = buf[pos]
    pos += 1
    if tags == 1 and buf[pos] == 0 and buf[pos + 1] == 4:
        pos += 6
    elif tags != 0:
        raise _NotCanonical
    if pos != end:
        raise _NotCanonical
    return ShareValueView(epoch, state_epoch, start, created, tuple(batches))


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_EMPTY_TAGS = b"\x00"
_DCC_TAG = struct.Struct(">BBi")  # tag 0, size 4, DeliveryCompleteCount
_I8 = struct.Struct(">b")


def _batch_bytes(batch: StateBatchView) -> bytes:
    """One StateBatch, tags 100-103 written only where they differ from their defaults (as the
    generic encoder writes them)."""
    first, last, state, count, start, progress, member, reason = batch
    head = _BATCH_HEAD.pack(first, last, state, count)
    if start == -1 and progress == -1 and member is None and reason == 0:
        return head + _EMPTY_TAGS
    tags = []
    if start != -1:
        tags.append(b"\x64\x08" + _I64.pack(start))
    if progress != -1:
        tags.append(b"\x65\x08" + _I64.pack(progress))
    if member is not None:
        encoded = member.encode("utf-8")
        field = _uvarint(len(encoded) + 1) + encoded
        tags.append(b"\x66" + _uvarint(len(field)) + field)
    if reason != 0:
        tags.append(b"\x67\x01" + _I8.pack(reason))
    return head + bytes([len(tags)]) + b"".join(tags)


def encode_share_value(record_type: RecordType, *, snapshot_epoch: int, leader_epoch: int, start_offset: int,
                       state_batches: Iterable[StateBatchView], delivery_complete_count: int = -1,
                       state_epoch: int = 0, create_timestamp: int = 0, write_timestamp: int = 0) -> bytes:
    """A ShareSnapshot / ShareUpdate value's bytes written directly (the reverse of
    :func:`read_share_value`): the same bytes ``encode_value`` gives for the entity with these
    fields, without building it (a state batch is ``StateBatchView``: first, last, state, count,
    in-progress start, last progress, member id, archive reason; the update ignores state epoch and
    timestamps, which it does not have)."""
    if record_type is RecordType.SHARE_SNAPSHOT:
        head = _SNAPSHOT_HEAD.pack(VALUE_VERSION, snapshot_epoch, state_epoch, leader_epoch, start_offset,
                                   create_timestamp, write_timestamp)
    elif record_type is RecordType.SHARE_UPDATE:
        head = _UPDATE_HEAD.pack(VALUE_VERSION, snapshot_epoch, leader_epoch, start_offset)
    else:
        raise StateRecordError(f"{record_type!r} is not a share-partition state record")
    batches = [_batch_bytes(batch) for batch in state_batches]
    tail = _EMPTY_TAGS if delivery_complete_count == -1 else b"\x01" + _DCC_TAG.pack(0, 4, delivery_complete_count)
    return b"".join((head, _uvarint(len(batches) + 1), *batches, tail))


def share_value_view(value: object) -> ShareValueView:
    """The same view of a decoded ShareSnapshotValue / ShareUpdateValue entity (the generic path)."""
    return ShareValueView(
        int(value.snapshot_epoch), int(getattr(value, "state_epoch", 0)), int(value.start_offset),
        int(getattr(value, "create_timestamp", 0)),
        tuple((int(b.first_offset), int(b.last_offset), int(b.delivery_state), int(b.delivery_count),
               int(b.in_progress_start_timestamp), int(b.last_progress_timestamp), b.in_progress_member_id,
               int(b.archive_reason))
              for b in value.state_batches),
    )
