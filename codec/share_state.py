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

from .errors import CodecError, StateRecordError
from .registry import decode_entity, encode
from .schema import MessageDefinition


class RecordType(enum.IntEnum):
    SHARE_SNAPSHOT = 0
    SHARE_UPDATE = 1
    PROXY_GROUP_METADATA = 32001
    PROXY_GROUP_PARTITIONS = 32002
    PROXY_GROUP_CONFIG = 32003


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
