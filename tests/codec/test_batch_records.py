"""codec.batch_records: record batches decoded for every codec, control batches skipped, bad bytes refused."""

from __future__ import annotations

import gzip
import struct

import cramjam
import crc32c
import pytest

from codec.batch_records import decode_records, decompress
from codec.errors import CorruptRecordBatch, RecordBatchError
from codec.records import V2_HEADER_SIZE, Compression, ControlType, TimestampType, encode_batch


def _zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        if raw < 0x80:
            out.append(raw)
            return bytes(out)
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7


def _record_with_headers(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                         headers: list[tuple[str, bytes | None]]) -> bytes:
    body = bytearray(b"\x00") + _zigzag(timestamp_delta) + _zigzag(offset_delta)
    for field in (key, value):
        body += _zigzag(-1) if field is None else _zigzag(len(field)) + field
    body += _zigzag(len(headers))
    for name, header_value in headers:
        body += _zigzag(len(name.encode())) + name.encode()
        body += _zigzag(-1) if header_value is None else _zigzag(len(header_value)) + header_value
    return _zigzag(len(body)) + bytes(body)


def xerial(data: bytes, block: int = 64) -> bytes:
    """snappy-java's SnappyOutputStream framing, as Kafka's Java producer writes it."""
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    for start in range(0, len(data), block):
        chunk = bytes(cramjam.snappy.compress_raw(data[start:start + block]))
        out += struct.pack(">i", len(chunk)) + chunk
    return bytes(out)


COMPRESSORS = {
    "gzip": (Compression.GZIP, lambda data: gzip.compress(data)),
    "snappy-raw": (Compression.SNAPPY, lambda data: bytes(cramjam.snappy.compress_raw(data))),
    "snappy-xerial": (Compression.SNAPPY, xerial),
    "lz4-frame": (Compression.LZ4, lambda data: bytes(cramjam.lz4.compress(data))),
    "zstd": (Compression.ZSTD, lambda data: bytes(cramjam.zstd.compress(data))),
}


def compressed_batch(base_offset: int, values: list[bytes], codec: Compression, compress, *,
                     base_timestamp: int = 1_700_000_000_000, log_append_time: int | None = None) -> bytes:
    """A v2 batch whose records section is compressed with ``compress`` (CRC and attributes set)."""
    plain = encode_batch(base_offset, values, keys=[b"k%d" % i for i in range(len(values))],
                         base_timestamp=base_timestamp)
    records = plain[V2_HEADER_SIZE:]
    attributes = int(codec) | (0x08 if log_append_time is not None else 0)
    max_timestamp = log_append_time if log_append_time is not None else base_timestamp
    after_crc = struct.pack(">hiqqqhii", attributes, len(values) - 1, base_timestamp, max_timestamp, -1, -1, -1,
                            len(values)) + compress(records)
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, 0, 2, crc32c.crc32c(after_crc)) + after_crc


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_codec_decodes_to_the_produced_records(name):
    codec, compress = COMPRESSORS[name]
    values = [b"value-%d" % i * 20 for i in range(50)]
    batch = compressed_batch(100, values, codec, compress)
    records = list(decode_records(batch))
    assert [r.offset for r in records] == list(range(100, 150))
    assert [r.value for r in records] == values
    assert [r.key for r in records] == [b"k%d" % i for i in range(50)]
    assert {(r.timestamp_type, r.timestamp) for r in records} == {(TimestampType.CREATE_TIME, 1_700_000_000_000)}


def test_log_append_time_batches_give_every_record_the_batch_max_timestamp():
    batch = compressed_batch(0, [b"a", b"b"], Compression.NONE, lambda data: data, log_append_time=1_800_000_000_123)
    assert [(r.timestamp_type, r.timestamp) for r in decode_records(batch)] == [
        (TimestampType.LOG_APPEND_TIME, 1_800_000_000_123)] * 2


def test_headers_null_keys_and_values_come_through():
    record = _record_with_headers(0, 5, None, None, [("trace", b"abc"), ("empty", None), ("ü", b"")])
    plain = encode_batch(7, [b"x"], base_timestamp=1000)
    after_crc = plain[21:V2_HEADER_SIZE] + record
    batch = struct.pack(">qiibI", 7, 4 + 1 + 4 + len(after_crc), 0, 2, crc32c.crc32c(after_crc)) + after_crc
    [decoded] = decode_records(batch)
    assert (decoded.offset, decoded.key, decoded.value, decoded.timestamp) == (7, None, None, 1005)
    assert decoded.headers == [("trace", b"abc"), ("empty", None), ("ü", b"")]
    assert next(decode_records(encode_batch(0, [b"v"]))).headers is None


def test_control_batches_are_skipped():
    data = (encode_batch(0, [b"a", b"b"], transactional=True, producer_id=9)
            + encode_batch(2, [], control_type=ControlType.COMMIT, producer_id=9)
            + encode_batch(3, [b"c"]))
    assert [(r.offset, r.value) for r in decode_records(data)] == [(0, b"a"), (1, b"b"), (3, b"c")]


def test_a_partial_trailing_batch_is_ignored():
    data = encode_batch(0, [b"a"]) + encode_batch(1, [b"b"])[:-5]
    assert [r.offset for r in decode_records(data)] == [0]


def test_a_corrupt_batch_is_refused_when_crcs_are_checked():
    batch = bytearray(encode_batch(0, [b"hello"]))
    batch[-3] ^= 0xFF
    with pytest.raises(CorruptRecordBatch):
        list(decode_records(bytes(batch)))
    assert len(list(decode_records(bytes(batch), verify_crc=False))) == 1


def test_garbage_compressed_payloads_raise_record_batch_errors():
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        with pytest.raises(RecordBatchError):
            decompress(int(codec), b"\x00\x01not compressed at all")
    with pytest.raises(RecordBatchError):
        decompress(7, b"")


def test_a_record_running_past_its_batch_is_refused():
    plain = encode_batch(0, [b"abc"])
    after_crc = bytearray(plain[21:])
    after_crc[V2_HEADER_SIZE - 21] = 0x7E  # record length varint: 63 bytes, far past the end
    batch = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), 0, 2, crc32c.crc32c(bytes(after_crc))) + bytes(after_crc)
    with pytest.raises(RecordBatchError):
        list(decode_records(batch))

