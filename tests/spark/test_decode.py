"""spark/decode.py: event-topic and state-topic records to rows, with the project's codec."""

from __future__ import annotations

import datetime
from types import SimpleNamespace as StateBatch  # the fields effective_spso reads
import uuid

import pyarrow as pa
from pyspark.sql import SparkSession

from codec.share_events import ArchiveReason, EventKind, ShareEvent, ShareEventBatch, encode_event_batch
from codec.share_state import ShareSnapshotKey, ShareSnapshotValue, encode_record
from spark import decode, sources

TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
BATCH = ShareEventBatch("g", TOPIC_ID, "orders", 3, (
    ShareEvent(EventKind.ACQUIRED, 10, 19, "m1", 1, timestamp_ms=1_000),
    ShareEvent(EventKind.ARCHIVED, 12, 12, None, 2, ArchiveReason.DELIVERY_LIMIT, 2_000),
    ShareEvent(EventKind.ACCEPTED, 10, 11, "m1", 1),  # no timestamp of its own
))
UTC = datetime.timezone.utc


def expected_rows(log_timestamp_ms: int) -> list[tuple]:
    return [
        ("g", "orders", str(TOPIC_ID), 3, "acquired", 10, 19, 10, "m1", 1, "none", 1_000_000, 0, 5),
        ("g", "orders", str(TOPIC_ID), 3, "archived", 12, 12, 1, None, 2, "delivery_limit", 2_000_000, 0, 5),
        ("g", "orders", str(TOPIC_ID), 3, "accepted", 10, 11, 2, "m1", 1, "none", log_timestamp_ms * 1000, 0, 5),
    ]


def test_record_rows_decode_an_encoded_batch() -> None:
    key, value = encode_event_batch(BATCH)
    assert list(decode.record_rows(key, value, 0, 5, 9_000)) == expected_rows(9_000)


def test_event_rows_of_a_batch_equal_the_records_rows() -> None:
    key, value = encode_event_batch(BATCH)
    assert list(decode.event_rows(BATCH, 0, 5, 9_000)) == list(decode.record_rows(key, value, 0, 5, 9_000))


def test_unknown_ids_stay_visible_by_number() -> None:
    assert decode.kind_name(99) == "kind_99"
    assert decode.reason_name(ArchiveReason.GAP) == "gap"
    assert decode.reason_name(42) == "reason_42"


def source_batch(rows: list[tuple]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [dict(zip(decode.SOURCE_COLUMNS, row)) for row in rows],
        schema=pa.schema([("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()),
                          ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))]))


def test_decode_events_turns_bad_records_into_undecodable_rows() -> None:
    key, value = encode_event_batch(BATCH)
    stamp = datetime.datetime.fromtimestamp(9, UTC)
    batch = source_batch([(key, value, 0, 5, stamp), (key, b"\x00\x07junk", 0, 6, stamp), (None, value, 0, 7, stamp)])
    (out,) = list(decode.decode_events([batch]))
    assert out.schema == decode.EVENT_SCHEMA
    rows = out.to_pylist()
    assert [row["kind"] for row in rows] == ["acquired", "archived", "accepted", "undecodable", "undecodable"]
    assert [row["log_offset"] for row in rows[3:]] == [6, 7]
    assert rows[2]["event_time"] == stamp


def snapshot_record(spso: int) -> tuple[bytes, bytes | None]:
    key = ShareSnapshotKey(group_id="g", topic_id=TOPIC_ID, partition=3)
    value = ShareSnapshotValue(snapshot_epoch=1, state_epoch=2, leader_epoch=0, start_offset=spso,
                               delivery_complete_count=-1, create_timestamp=1_000, write_timestamp=4_000,
                               state_batches=())
    return encode_record(key, value)


def test_snapshot_rows_carry_the_spso_and_write_time() -> None:
    key, value = snapshot_record(17)
    assert decode.snapshot_row(key, value, 1, 8) == ("g", str(TOPIC_ID), 3, "snapshot", 17, 2, 4_000_000, 0, 1, 8)
    assert decode.snapshot_row(key, None, 1, 9) is None  # a tombstone


def test_decode_snapshots_skips_what_it_cannot_use() -> None:
    key, value = snapshot_record(17)
    batch = source_batch([(key, value, 0, 1, None), (b"\x7f\x00junk", b"x", 0, 2, None), (key, None, 0, 3, None)])
    (out,) = list(decode.decode_snapshots([batch]))
    assert [(row["spso"], row["log_offset"]) for row in out.to_pylist()] == [(17, 1)]


def test_decoded_events_through_spark(spark: SparkSession) -> None:
    key, value = encode_event_batch(BATCH)
    records = spark.createDataFrame(
        [(key, value, 0, 5, datetime.datetime.fromtimestamp(9, UTC))],
        "key binary, value binary, `partition` int, offset bigint, timestamp timestamp")
    rows = sorted(sources.decoded_events(records).collect(), key=lambda row: row["kind"])
    assert [(row["kind"], row["first_offset"], row["records"], row["reason"]) for row in rows] == [
        ("accepted", 10, 2, "none"), ("acquired", 10, 10, "none"), ("archived", 12, 1, "delivery_limit")]


def test_the_spso_moves_past_finished_records_at_the_head_of_the_state() -> None:
    batches = [StateBatch(first_offset=20, last_offset=22, delivery_state=2, delivery_count=1),
               StateBatch(first_offset=15, last_offset=19, delivery_state=4, delivery_count=2),
               StateBatch(first_offset=23, last_offset=24, delivery_state=0, delivery_count=1),
               StateBatch(first_offset=25, last_offset=30, delivery_state=2, delivery_count=1)]
    assert decode.effective_spso(15, batches) == 23  # archived 15-19, acknowledged 20-22; 23 is available
    assert decode.effective_spso(15, batches[2:]) == 15
    assert decode.effective_spso(-1, batches) is None  # an update that leaves the SPSO as it was
