"""Record-batch headers read from raw ``records`` bytes, never decompressing.

The share-partition leader needs only each batch's offsets, record count, and
whether it is a transaction marker; the record bytes themselves go to the client
untouched. So this module reads the fixed 61-byte v2 batch header with one
``struct.unpack_from`` on a memoryview and jumps to the next batch.

A fetch response may end in a partial batch (the broker cuts at max bytes); the
iterator stops there and reports it rather than failing. Magic 0/1 message sets
(pre-0.11 formats) are reported as :class:`LegacyMessageSet` entries, not parsed.

Layout of a v2 batch (Kafka's DefaultRecordBatch)::

    0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
    17 crc uint32 (CRC-32C of bytes 21..end) | 21 attributes int16 | 23 lastOffsetDelta int32
    27 baseTimestamp int64 | 35 maxTimestamp int64 | 43 producerId int64 | 51 producerEpoch int16
    53 baseSequence int32 | 57 recordCount int32 | 61 records...
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import typing
from collections.abc import Iterator

import crc32c

from .errors import CorruptRecordBatch, RecordBatchError

_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_HEADER_SIZE = _V2_HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part not counted in batchLength
_PREFIX = struct.Struct(">qi")
_V2_MIN_BATCH_LENGTH = V2_HEADER_SIZE - LOG_OVERHEAD  # 49
_LEGACY_MIN_MESSAGE_SIZE = 14  # crc + magic + attributes + key length + value length
_CRC_START = 21

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(enum.IntEnum):
    """The type in a control record's key (transaction markers)."""

    ABORT = 0
    COMMIT = 1


class RecordBatchHeader(typing.NamedTuple):
    """The header of one v2 record batch found at ``position`` in the records bytes.

    A NamedTuple rather than a frozen dataclass: one is built per batch on the fetch
    path, and a frozen dataclass's ``__init__`` costs ten times a tuple's.
    """

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    control_type: ControlType | int | None = None  # set for control batches only

    @property
    def size(self) -> int:
        """Bytes the whole batch takes, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression | int:
        code = self.attributes & _COMPRESSION_MASK
        return Compression(code) if code in Compression._value2member_map_ else code

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType.LOG_APPEND_TIME if self.attributes & _TIMESTAMP_TYPE_BIT else TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


@dataclasses.dataclass(frozen=True, slots=True)
class LegacyMessageSet:
    """A magic 0 or 1 message (pre-0.11 format) at ``position``; reported, not parsed."""

    position: int
    offset: int
    size: int
    magic: int


@dataclasses.dataclass(frozen=True, slots=True)
class BatchScan:
    """Every complete entry in a records buffer, and how many trailing bytes were partial."""

    entries: tuple[RecordBatchHeader | LegacyMessageSet, ...]
    complete_bytes: int
    truncated_bytes: int

    @property
    def batches(self) -> tuple[RecordBatchHeader, ...]:
        return tuple(entry for entry in self.entries if isinstance(entry, RecordBatchHeader))

    @property
    def has_legacy(self) -> bool:
        return any(isinstance(entry, LegacyMessageSet) for entry in self.entries)


def iter_batches(
    records: bytes | bytearray | memoryview | None, *, verify_crc: bool = False
) -> Iterator[RecordBatchHeader | LegacyMessageSet]:
    """Yield each complete batch (or legacy message) in ``records``; stop at a partial tail.

    Raises RecordBatchError for structurally impossible input and CorruptRecordBatch
    when ``verify_crc`` is set and a v2 batch's CRC-32C does not match.
    """
    if records is None:
        return
    view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    end = len(view)
    position = 0
    unpack_prefix = _PREFIX.unpack_from
    unpack_header = _V2_HEADER.unpack_from
    new_header = tuple.__new__
    while end - position >= LOG_OVERHEAD:
        base_offset, batch_length = unpack_prefix(view, position)
        if batch_length < 0:
            raise RecordBatchError(f"negative batch length {batch_length} at byte {position}")
        size = LOG_OVERHEAD + batch_length
        if size > end - position:
            return  # a partial batch: fetch responses may end with one
        if batch_length < 5:
            raise RecordBatchError(f"batch length {batch_length} at byte {position} is too short to hold a magic")
        magic = view[position + 16]
        if magic == 2:
            if batch_length < _V2_MIN_BATCH_LENGTH:
                raise RecordBatchError(f"v2 batch length {batch_length} at byte {position} is below the header size")
            fields = unpack_header(view, position)
            crc, attributes, last_offset_delta, record_count = fields[4], fields[5], fields[6], fields[12]
            if record_count < 0 or last_offset_delta < 0:
                raise RecordBatchError(
                    f"batch at byte {position}: record count {record_count}, last offset delta {last_offset_delta}"
                )
            if verify_crc:
                actual = crc32c.crc32c(view[position + _CRC_START : position + size])
                if actual != crc:
                    raise CorruptRecordBatch(
                        f"batch at offset {base_offset} (byte {position}): CRC-32C {actual:#010x} != stored {crc:#010x}"
                    )
            control_type = None
            if attributes & _CONTROL_BIT and record_count > 0:
                if attributes & _COMPRESSION_MASK:
                    raise RecordBatchError(f"control batch at offset {base_offset} is compressed")
                control_type = _control_type(view, position + V2_HEADER_SIZE, position + size)
            # The header's fields, in order, are the unpacked v2 header between position and control type.
            yield new_header(RecordBatchHeader, (position, *fields, control_type))
        elif magic in (0, 1):
            if batch_length < _LEGACY_MIN_MESSAGE_SIZE:
                raise RecordBatchError(f"legacy message size {batch_length} at byte {position} is too short")
            yield LegacyMessageSet(position, base_offset, size, magic)
        else:
            raise RecordBatchError(f"unknown record batch magic {magic} at byte {position}")
        position += size


def scan_batches(records: bytes | bytearray | memoryview | None, *, verify_crc: bool = False) -> BatchScan:
    """Collect :func:`iter_batches` and measure the partial tail."""
    entries = tuple(iter_batches(records, verify_crc=verify_crc))
    total = 0 if records is None else memoryview(records).nbytes
    complete = sum(entry.size for entry in entries)
    return BatchScan(entries, complete, total - complete)


def partial_batch(records: bytes | bytearray | memoryview, position: int) -> tuple[int, int] | None:
    """(base offset, whole size) of the batch cut short at `position` -- the partial tail a Fetch
    response may end with -- once its first 12 bytes are there; None when there is none or its
    length is impossible."""
    view = memoryview(records)
    if len(view) - position < LOG_OVERHEAD:
        return None
    base_offset, batch_length = _PREFIX.unpack_from(view, position)
    if batch_length < 0 or LOG_OVERHEAD + batch_length <= len(view) - position:
        return None  # not a batch's start, or not cut short
    return base_offset, LOG_OVERHEAD + batch_length


def _read_varint(view: memoryview, position: int, end: int, max_bytes: int) -> tuple[int, int]:
    """A zig-zag signed varint (records use signed varints), bounds-checked."""
    raw = 0
    for index in range(max_bytes):
        if position >= end:
            raise RecordBatchError("control record runs past the end of its batch")
        byte = view[position]
        position += 1
        raw |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
    raise RecordBatchError("varint too long in control record")


def _control_type(view: memoryview, position: int, end: int) -> ControlType | int:
    """The type (0 abort, 1 commit) from the key of the first record of a control batch."""
    _length, position = _read_varint(view, position, end, 5)
    position += 1  # record attributes
    _timestamp_delta, position = _read_varint(view, position, end, 10)
    _offset_delta, position = _read_varint(view, position, end, 5)
    key_length, position = _read_varint(view, position, end, 5)
    if key_length < 4 or position + 4 > end:
        raise RecordBatchError(f"control record key of {key_length} bytes is too short")
    _version, kind = struct.unpack_from(">hh", view, position)
    return ControlType(kind) if kind in ControlType._value2member_map_ else kind


# -- encoding, for tests, benchmarks and tools (uncompressed batches only) ----------------


def _zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = bytearray(b"\x00")  # record attributes
    body += _zigzag(timestamp_delta) + _zigzag(offset_delta)
    for field in (key, value):
        if field is None:
            body += _zigzag(-1)
        else:
            body += _zigzag(len(field)) + field
    body += _zigzag(0)  # no headers
    return _zigzag(len(body)) + bytes(body)


def encode_batch(
    base_offset: int,
    values: list[bytes | None],
    *,
    keys: list[bytes | None] | None = None,
    base_timestamp: int = 0,
    partition_leader_epoch: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control_type: ControlType | None = None,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> bytes:
    """Build an uncompressed v2 batch with a correct CRC-32C (one record per value).

    With ``control_type`` the batch is a transaction marker holding one control record.
    """
    attributes = 0
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= _TIMESTAMP_TYPE_BIT
    if transactional or control_type is not None:
        attributes |= _TRANSACTIONAL_BIT
    if control_type is not None:
        attributes |= _CONTROL_BIT
        keys = [struct.pack(">hh", 0, int(control_type))]
        values = [struct.pack(">hi", 0, 0)]  # marker value: version, coordinator epoch
    keys = keys if keys is not None else [None] * len(values)
    if not values:
        raise ValueError("a batch holds at least one record")
    records = b"".join(_record(index, 0, keys[index], value) for index, value in enumerate(values))
    last_offset_delta = len(values) - 1
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        last_offset_delta,
        base_timestamp,
        base_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(values),
    ) + records
    crc = crc32c.crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch + magic + crc + rest
    return struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, 2, crc) + after_crc
