"""What is inside a v2 record batch: the records section decompressed (every Kafka codec) and parsed.

:mod:`codec.records` finds the batch headers (offsets, attributes, CRC); this module reads the
records themselves -- each record's offset, timestamp, key, value and headers -- for whoever needs
the application's bytes (the Python share consumer; a dead-letter copy). Control batches
(transaction markers) hold no application records and are skipped.

Codecs (attributes bits 0-2): none; gzip (zlib); snappy, raw or in the xerial framing Kafka's Java
producer writes; lz4 frame; zstd. The three non-zlib ones come from cramjam's wheels.

Pure: bytes in, records out.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import cramjam

from .errors import RecordBatchError
from .records import V2_HEADER_SIZE, Compression, LegacyMessageSet, TimestampType, iter_batches

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic (8) + version (4) + compatible version (4)
_INT32 = struct.Struct(">i")


class Record:
    """One record as the application sees it (the share consumer wraps it in a Message)."""

    __slots__ = ("offset", "timestamp_type", "timestamp", "key", "value", "headers")

    def __init__(self, offset: int, timestamp_type: TimestampType, timestamp: int, key: bytes | None,
                 value: bytes | None, headers: list[tuple[str, bytes | None]] | None) -> None:
        self.offset = offset
        self.timestamp_type = timestamp_type
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return f"Record(offset={self.offset}, key={self.key!r}, value={self.value!r})"


def decompress(compression: int, data: bytes | memoryview) -> bytes:
    """The records section of a batch compressed with ``compression`` (Kafka's attribute code)."""
    try:
        if compression == Compression.NONE:
            return bytes(data)
        if compression == Compression.GZIP:
            return zlib.decompress(data, 47)  # 32 + 15: gzip or zlib header, detected
        if compression == Compression.SNAPPY:
            return _snappy(bytes(data))
        if compression == Compression.LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if compression == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except (zlib.error, cramjam.DecompressionError, ValueError) as error:
        raise RecordBatchError(f"cannot decompress {Compression(compression).name} batch: {error}") from error
    raise RecordBatchError(f"unknown compression codec {compression}")


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    # Xerial framing (snappy-java's SnappyOutputStream): a 16-byte header, then blocks of
    # int32 length + raw snappy.
    out = bytearray()
    position = _XERIAL_HEADER
    while position < len(data):
        if position + 4 > len(data):
            raise RecordBatchError("xerial snappy block length cut short")
        (length,) = _INT32.unpack_from(data, position)
        position += 4
        if length < 0 or position + length > len(data):
            raise RecordBatchError(f"xerial snappy block of {length} bytes runs past the batch")
        out += cramjam.snappy.decompress_raw(data[position:position + length])
        position += length
    return bytes(out)


def _records_in(payload: bytes, count: int, base_offset: int, base_timestamp: int,
                log_append_time: int | None) -> list[Record]:
    """Parse ``count`` records from an uncompressed records section (Kafka's DefaultRecord)."""
    records: list[Record] = []
    position = 0
    end = len(payload)

    def varint() -> int:
        nonlocal position
        shift = 0
        raw = 0
        while True:
            byte = payload[position]
            position += 1
            raw |= (byte & 0x7F) << shift
            if byte < 0x80:
                return (raw >> 1) ^ -(raw & 1)
            shift += 7
            if shift > 63:
                raise RecordBatchError("varint too long in record")

    try:
        for _ in range(count):
            length = varint()
            record_end = position + length
            if length < 0 or record_end > end:
                raise RecordBatchError(f"record of {length} bytes runs past its batch")
            position += 1  # attributes (unused)
            timestamp_delta = varint()
            offset_delta = varint()
            key_length = varint()
            if key_length < 0:
                key = None
            else:
                key = payload[position:position + key_length]
                position += key_length
            value_length = varint()
            if value_length < 0:
                value = None
            else:
                value = payload[position:position + value_length]
                position += value_length
            header_count = varint()
            headers: list[tuple[str, bytes | None]] | None = None
            if header_count > 0:
                headers = []
                for _ in range(header_count):
                    name_length = varint()
                    name = payload[position:position + name_length].decode("utf-8")
                    position += name_length
                    header_length = varint()
                    if header_length < 0:
                        header_value = None
                    else:
                        header_value = payload[position:position + header_length]
                        position += header_length
                    headers.append((name, header_value))
            if position != record_end:
                raise RecordBatchError(f"record at offset delta {offset_delta} is {record_end - position} bytes off")
            if log_append_time is None:
                records.append(Record(base_offset + offset_delta, TimestampType.CREATE_TIME,
                                      base_timestamp + timestamp_delta, key, value, headers))
            else:
                records.append(Record(base_offset + offset_delta, TimestampType.LOG_APPEND_TIME,
                                      log_append_time, key, value, headers))
    except (IndexError, UnicodeDecodeError) as error:
        raise RecordBatchError(f"record cut short or malformed: {error}") from error
    return records


def decode_records(data: bytes | memoryview | None, *, verify_crc: bool = True) -> Iterator[Record]:
    """Every application record in ``data`` (a ShareFetch partition's records), control batches skipped.

    Raises :class:`codec.errors.RecordBatchError` (a :class:`CodecError`) for bad bytes.
    """
    if not data:
        return
    view = memoryview(data)
    for batch in iter_batches(view, verify_crc=verify_crc):
        if isinstance(batch, LegacyMessageSet):
            raise RecordBatchError(f"magic {batch.magic} message set at offset {batch.offset} is not supported")
        if batch.is_control or batch.record_count == 0:
            continue
        section = view[batch.position + V2_HEADER_SIZE:batch.position + batch.size]
        payload = decompress(batch.attributes & 0x07, section)
        log_append = batch.max_timestamp if batch.timestamp_type is TimestampType.LOG_APPEND_TIME else None
        yield from _records_in(payload, batch.record_count, batch.base_offset, batch.base_timestamp, log_append)


__all__ = ["Record", "decompress", "decode_records"]
