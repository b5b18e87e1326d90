import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.errors import CorruptRecordBatch, RecordBatchError
from codec.records import (
    V2_HEADER_SIZE,
    Compression,
    ControlType,
    LegacyMessageSet,
    RecordBatchHeader,
    TimestampType,
    encode_batch,
    iter_batches,
    scan_batches,
)

batch_specs = st.tuples(
    st.integers(0, 2**40),  # base offset
    st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=6),  # values
    st.integers(0, 2**41),  # base timestamp
    st.integers(-1, 2**40),  # producer id
    st.booleans(),  # transactional
)


def _legacy_message(offset: int, magic: int = 1) -> bytes:
    message = struct.pack(">Ibb", 0, magic, 0) + (b"\x00" * 8 if magic == 1 else b"") + struct.pack(">ii", -1, 1) + b"v"
    return struct.pack(">qi", offset, len(message)) + message


@settings(max_examples=150, deadline=None)
@given(st.lists(batch_specs, min_size=1, max_size=5), st.integers(0, 60))
def test_encoded_batches_come_back_with_their_headers_and_a_partial_tail_is_skipped(specs, tail):
    batches = [
        encode_batch(base, values, base_timestamp=ts, producer_id=pid, transactional=txn)
        for base, values, ts, pid, txn in specs
    ]
    data = b"".join(batches) + batches[0][:tail]
    scan = scan_batches(data, verify_crc=True)
    assert len(scan.entries) == len(specs)
    assert scan.truncated_bytes == tail  # a batch is longer than 60 bytes, so the tail is partial
    position = 0
    for header, (base, values, ts, pid, txn), raw in zip(scan.entries, specs, batches):
        assert isinstance(header, RecordBatchHeader)
        assert (header.position, header.size, header.base_offset) == (position, len(raw), base)
        assert header.last_offset == base + len(values) - 1 and header.record_count == len(values)
        assert (header.base_timestamp, header.producer_id, header.is_transactional) == (ts, pid, txn)
        assert header.magic == 2 and header.compression is Compression.NONE and not header.is_control
        assert header.timestamp_type is TimestampType.CREATE_TIME
        position += len(raw)


def test_header_fields_are_read_from_their_offsets():
    raw = encode_batch(7, [b"x"], partition_leader_epoch=4, producer_epoch=3, base_sequence=11,
                       timestamp_type=TimestampType.LOG_APPEND_TIME)
    (header,) = iter_batches(raw)
    assert header.partition_leader_epoch == 4 and header.producer_epoch == 3 and header.base_sequence == 11
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.crc == struct.unpack_from(">I", raw, 17)[0]
    assert header.next_offset == 8


@pytest.mark.parametrize("marker", [ControlType.COMMIT, ControlType.ABORT])
def test_control_batches_report_their_marker(marker):
    data = encode_batch(0, [b"a", b"b"], transactional=True) + encode_batch(2, [b""], control_type=marker)
    data_batch, control = iter_batches(data, verify_crc=True)
    assert data_batch.control_type is None and data_batch.is_transactional
    assert control.is_control and control.control_type is marker


def test_compressed_control_batch_is_an_error():
    raw = bytearray(encode_batch(0, [b""], control_type=ControlType.COMMIT))
    raw[22] |= Compression.GZIP
    with pytest.raises(RecordBatchError, match="compressed"):
        list(iter_batches(bytes(raw)))


def test_compression_is_reported_without_decompressing():
    raw = bytearray(encode_batch(0, [b"a"]))
    raw[22] |= Compression.ZSTD  # attributes low byte; the (now nonsense) records are never read
    (header,) = iter_batches(bytes(raw))
    assert header.compression is Compression.ZSTD


def test_crc_mismatch_is_detected_only_when_asked():
    raw = bytearray(encode_batch(0, [b"payload"]))
    raw[-2] ^= 0xFF
    assert len(list(iter_batches(bytes(raw)))) == 1
    with pytest.raises(CorruptRecordBatch):
        list(iter_batches(bytes(raw), verify_crc=True))


def test_legacy_message_sets_are_reported_as_such():
    data = _legacy_message(5, magic=0) + _legacy_message(6, magic=1) + encode_batch(7, [b"x"])
    scan = scan_batches(data)
    legacy0, legacy1, batch = scan.entries
    assert legacy0 == LegacyMessageSet(0, 5, len(_legacy_message(5, 0)), 0)
    assert isinstance(legacy1, LegacyMessageSet) and legacy1.magic == 1
    assert isinstance(batch, RecordBatchHeader) and scan.has_legacy and scan.batches == (batch,)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (struct.pack(">qi", 0, -5) + b"\x00" * 20, "negative"),
        (struct.pack(">qi", 0, 30) + b"\x00" * 4 + b"\x02" + b"\x00" * 25, "below the header"),
        (struct.pack(">qi", 0, 60) + b"\x00" * 4 + b"\x07" + b"\x00" * 55, "magic 7"),
        (struct.pack(">qi", 0, 3) + b"\x00" * 3, "too short"),
    ],
)
def test_impossible_batches_raise_record_batch_errors(data, message):
    with pytest.raises(RecordBatchError, match=message):
        list(iter_batches(data))


def test_empty_null_and_memoryview_input():
    assert list(iter_batches(None)) == [] and list(iter_batches(b"")) == []
    raw = encode_batch(3, [b"a"])
    assert [h.base_offset for h in iter_batches(memoryview(bytearray(raw)))] == [3]
    assert scan_batches(raw[: V2_HEADER_SIZE - 1]).truncated_bytes == V2_HEADER_SIZE - 1


def test_a_hostile_batch_length_is_a_partial_tail_not_an_allocation():
    data = encode_batch(0, [b"a"]) + struct.pack(">qi", 1, 2**31 - 1) + b"\x00" * 50
    scan = scan_batches(data)
    assert len(scan.entries) == 1 and scan.truncated_bytes == 62


def test_a_partial_tail_names_its_batchs_base_offset_and_whole_size_once_12_bytes_are_there():
    from codec.records import partial_batch

    first, second = encode_batch(100, [b"a" * 50]), encode_batch(101, [b"b" * 70, b"c"])
    records = first + second
    assert partial_batch(records, len(first)) is None  # whole: nothing cut short
    assert partial_batch(records[:len(first) + 11], len(first)) is None  # its length not there yet
    assert partial_batch(records[:len(first) + 12], len(first)) == (101, len(second))
    assert partial_batch(records[:-1], len(first)) == (101, len(second))
    assert partial_batch(first + (-1).to_bytes(8, "big", signed=True) + (-5).to_bytes(4, "big", signed=True),
                         len(first)) is None  # an impossible length is no batch
