"""spark/transforms.py: each transform on a small DataFrame, with the rows expected."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from spark import decode, transforms

from .conftest import TOPIC_ID, at, collect, event, events_frame


def test_valid_events_drops_undecodable_rows(spark: SparkSession) -> None:
    rows = [event("accepted", 0), (None, None, None, None, decode.UNDECODABLE, None, None, 0, None, None, None,
                                   at(0), 0, 5)]
    assert [r["kind"] for r in collect(transforms.valid_events(events_frame(spark, rows)), "kind")] == ["accepted"]


def test_summary_sums_records_and_events(spark: SparkSession) -> None:
    frame = events_frame(spark, [event("accepted", 0, 9), event("accepted", 10, 11),
                                 event("archived", 12, reason="rejected")])
    assert collect(transforms.summary(frame), "kind") == [
        {"group": "g", "topic": "t", "kind": "accepted", "reason": "none", "records": 12, "events": 2},
        {"group": "g", "topic": "t", "kind": "archived", "reason": "rejected", "records": 1, "events": 1},
    ]


def test_throughput_counts_records_per_minute_window(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("acquired", 0, 9, seconds=1), event("accepted", 0, 7, seconds=5), event("released", 8, seconds=6),
        event("rejected", 9, seconds=7), event("archived", 9, seconds=7, reason="rejected"),
        event("accepted", 8, seconds=65, count=2), event("lock_expired", 20, seconds=66),
    ])
    assert collect(transforms.throughput(frame), "window_start") == [
        {"group": "g", "topic": "t", "partition": 0, "window_start": at(0).replace(tzinfo=None),
         "acquired": 10, "accepted": 8, "released": 1, "rejected": 1, "archived": 1},
        {"group": "g", "topic": "t", "partition": 0, "window_start": at(60).replace(tzinfo=None),
         "acquired": 0, "accepted": 1, "released": 0, "rejected": 0, "archived": 0},
    ]


def test_ack_latencies_match_acquisition_and_acceptance_by_delivery_count(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("acquired", 0, 1, seconds=0), event("accepted", 0, seconds=0.25), event("released", 1, seconds=1),
        event("acquired", 1, seconds=2, count=2), event("accepted", 1, seconds=3, count=2),
        event("acquired", 1, seconds=9, count=2),  # a duplicate acquisition: the earliest counts
        event("accepted", 5, seconds=4),  # never seen acquired: no latency
    ])
    latencies = collect(transforms.ack_latencies(frame), "first_offset")
    assert [(r["first_offset"], r["last_offset"], r["delivery_count"], r["records"], r["latency_ms"])
            for r in latencies] == [(0, 0, 1, 1, 250.0), (1, 1, 2, 1, 1000.0)]


def test_ack_latencies_weigh_range_overlaps_by_records_across_buckets(spark: SparkSession) -> None:
    edge = transforms.RANGE_BUCKET  # ranges crossing a bucket boundary are cut there, no record counted twice
    frame = events_frame(spark, [
        event("acquired", edge - 10, edge + 9, seconds=0),
        event("accepted", edge - 20, edge - 6, seconds=1),  # overlaps the acquisition's first 5 records
        event("accepted", edge - 5, edge + 4, seconds=2),  # the next 10, across the boundary
        event("accepted", edge + 5, edge + 9, seconds=3, count=2),  # another delivery: no match
    ])
    latencies = collect(transforms.ack_latencies(frame), "first_offset")
    assert [(r["first_offset"], r["last_offset"], r["records"], r["latency_ms"]) for r in latencies] == [
        (edge - 10, edge - 6, 5, 1000.0), (edge - 5, edge - 1, 5, 2000.0), (edge, edge + 4, 5, 2000.0)]
    assert collect(transforms.ack_latency_histogram(transforms.ack_latencies(frame)), "le_ms") == [
        {"group": "g", "le_ms": 1000, "records": 5}, {"group": "g", "le_ms": 2500, "records": 10}]


def test_ack_latency_histogram_and_summary(spark: SparkSession) -> None:
    rows = [event("acquired", offset, seconds=0) for offset in range(4)]
    rows += [event("accepted", 0, seconds=0.004), event("accepted", 1, seconds=0.02), event("accepted", 2, seconds=0.02),
             event("accepted", 3, seconds=400)]
    latencies = transforms.ack_latencies(events_frame(spark, rows))
    assert collect(transforms.ack_latency_histogram(latencies), "le_ms") == [
        {"group": "g", "le_ms": None, "records": 1},
        {"group": "g", "le_ms": 5, "records": 1},
        {"group": "g", "le_ms": 25, "records": 2},
    ]
    assert collect(transforms.ack_latency_summary(latencies), "group") == [
        {"group": "g", "records": 4, "p50_ms": 20.0, "p90_ms": 400000.0, "p99_ms": 400000.0, "max_ms": 400000.0},
    ]


def test_redelivery_rate_per_share_partition(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("acquired", 0, 9), event("acquired", 3, 4, count=2), event("acquired", 0, 0, partition=1),
    ])
    assert collect(transforms.redelivery(frame), "partition") == [
        {"group": "g", "topic": "t", "partition": 0, "delivered": 12, "redelivered": 2, "redelivery_rate": 2 / 12},
        {"group": "g", "topic": "t", "partition": 1, "delivered": 1, "redelivered": 0, "redelivery_rate": 0.0},
    ]


def test_delivery_counts_histogram_of_finished_records(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("accepted", 0, 4), event("accepted", 5, count=2), event("archived", 6, 7, count=2, reason="delivery_limit"),
        event("released", 8),  # not finished
    ])
    assert collect(transforms.delivery_counts(frame), "delivery_count") == [
        {"group": "g", "delivery_count": 1, "accepted": 5, "archived": 0, "records": 5},
        {"group": "g", "delivery_count": 2, "accepted": 1, "archived": 2, "records": 3},
    ]


def test_dead_letters_by_reason(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("dead_lettered", 0, 1, reason="rejected"), event("archived", 0, 1, reason="rejected"),
        event("archived", 2, count=2, reason="delivery_limit"), event("archived", 10, 19, reason="log_truncated"),
    ])
    assert collect(transforms.dead_letters_by_reason(frame), "reason") == [
        {"group": "g", "topic": "t", "reason": "delivery_limit", "archived_records": 1, "dead_lettered_records": 0},
        {"group": "g", "topic": "t", "reason": "log_truncated", "archived_records": 10, "dead_lettered_records": 0},
        {"group": "g", "topic": "t", "reason": "rejected", "archived_records": 2, "dead_lettered_records": 2},
    ]


def test_in_progress_durations_and_outcomes(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("marked_in_progress", 0, 2, seconds=1), event("marked_in_progress", 0, 2, seconds=5),
        event("accepted", 0, seconds=11), event("stale_released", 1, seconds=31),
        event("accepted", 3, seconds=2),  # never marked
    ])
    rows = collect(transforms.in_progress(frame), "offset")
    assert [(r["offset"], r["member_id"], r["duration_ms"], r["outcome"]) for r in rows] == [
        (0, "m1", 10000.0, "accepted"), (1, "m1", 30000.0, "stale_released"), (2, "m1", None, None),
    ]


def test_spso_progress_and_lag(spark: SparkSession) -> None:
    events = events_frame(spark, [event("acquired", 0, 9, seconds=1), event("acquired", 10, 19, seconds=5)])
    snapshots = spark.createDataFrame([
        ("g", str(TOPIC_ID), 0, "snapshot", 0, 1, at(0), 0, 0, 0),
        ("g", str(TOPIC_ID), 0, "snapshot", 4, 1, at(3), 1, 0, 1),
        ("g", str(TOPIC_ID), 0, "snapshot", 20, 1, at(6), 0, 0, 2),
        ("g", str(TOPIC_ID), 0, "update", None, None, at(7), 1, 0, 3),  # an update without SPSO: left out
        ("g", str(TOPIC_ID), 0, "update", 22, None, at(8), 1, 0, 4),  # an update that moved it
    ], decode.SNAPSHOT_DDL)
    rows = collect(transforms.spso_progress(snapshots, events), "written_at")
    assert [(r["topic"], r["spso"], r["highest_offset_seen"], r["lag"]) for r in rows] == [
        ("t", 0, None, None), ("t", 4, 9, 6), ("t", 20, 19, 0), ("t", 22, 19, 0),
    ]


def test_dead_letter_candidates_keep_group_and_dead_letter_reasons_once_per_offset(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("archived", 0, 1, seconds=1, reason="rejected"),
        event("archived", 1, seconds=9, count=3, reason="delivery_limit"),  # offset 1 again: the latest wins
        event("archived", 5, reason="log_truncated"), event("archived", 7, reason="rejected", group="other"),
        event("rejected", 8),
    ])
    rows = collect(transforms.dead_letter_candidates(frame, "g"), "offset")
    assert [(r["offset"], r["delivery_count"], r["reason"], r["archived_at"].second) for r in rows] == [
        (0, 1, "rejected", 1), (1, 3, "delivery_limit", 9),
    ]


def test_with_payloads_joins_originals_and_keeps_missing_ones(spark: SparkSession) -> None:
    candidates = transforms.dead_letter_candidates(events_frame(spark, [
        event("archived", 0, 1, reason="rejected")]), "g")
    originals = spark.createDataFrame([("t", 0, 0, b"k", b"v", [("h", b"x")])],
                                      "topic string, `partition` int, offset bigint, key binary, value binary, "
                                      "headers array<struct<key:string,value:binary>>")
    rows = collect(transforms.with_payloads(candidates, originals), "offset")
    assert list(rows[0]) == list(transforms.DEAD_LETTER_COLUMNS)
    assert [(r["offset"], r["key"], r["value"], r["headers"]) for r in rows] == [
        (0, b"k", b"v", [("h", b"x")]), (1, None, None, None),
    ]


def dead_letters(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, transforms.DEAD_LETTER_DDL)


def test_not_yet_exported_leaves_out_rows_already_present(spark: SparkSession) -> None:
    fresh = dead_letters(spark, [("g", "t", 0, 1, 1, "rejected", None, None, None, at(0)),
                                 ("g", "t", 0, 2, 1, "rejected", None, None, None, at(0))])
    existing = dead_letters(spark, [("g", "t", 0, 1, 1, "rejected", b"k", None, None, at(0))])
    assert [r["offset"] for r in collect(transforms.not_yet_exported(fresh, existing), "offset")] == [2]


def test_dead_letter_records_carry_kafkas_headers_and_partition(spark: SparkSession) -> None:
    frame = dead_letters(spark, [("g", "t", 5, 42, 2, "delivery_limit", b"k", b"v", None, at(0)),
                                 ("g", "t", 1, 7, 1, "rejected", None, None, None, at(0))])
    rows = collect(transforms.dead_letter_records(frame, 3), "offset")
    headers = {h["key"]: bytes(h["value"]).decode() for h in rows[1]["headers"]}
    assert headers == {
        "__dlq.errors.topic": "t", "__dlq.errors.partition": "5", "__dlq.errors.offset": "42",
        "__dlq.errors.group": "g", "__dlq.errors.delivery.count": "2",
        "__dlq.errors.message": "Offset delivery count exceeded the threshold.",
    }
    assert [(r["offset"], r["kafka_partition"], r["key"], r["value"]) for r in rows] == [
        (7, 1, None, None), (42, 2, b"k", b"v")]
    assert {h["key"]: bytes(h["value"]).decode() for h in rows[0]["headers"]}["__dlq.errors.message"] == (
        "Offset rejected by client.")


def test_dead_letters_present_reads_the_headers_back(spark: SparkSession) -> None:
    frame = dead_letters(spark, [("g", "t", 5, 42, 2, "rejected", None, None, None, at(0))])
    written = transforms.dead_letter_records(frame, 3)
    foreign = spark.createDataFrame([([("__dlq.errors.group", b"x"), ("__dlq.errors.offset", b"nan")],)],
                                    "headers array<struct<key:string,value:binary>>")
    present = transforms.dead_letters_present(written.select("headers").unionByName(foreign))
    assert collect(present, "offset") == [{"group": "g", "topic": "t", "partition": 5, "offset": 42}]


def test_range_bucket_size_is_the_power_of_two_at_or_above_the_median_joined_range(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("acquired", 0, 9), event("accepted", 0, 9), event("accepted", 10, 14),
        event("archived", 100, 100_000, reason="log_truncated"),  # not joined: does not count
    ])
    assert transforms.range_bucket_size(frame) == 16
    assert transforms.range_bucket_size(events_frame(spark, [])) == 1


def test_small_buckets_match_the_same_records(spark: SparkSession) -> None:
    frame = events_frame(spark, [
        event("acquired", 0, 19, seconds=0), event("accepted", 0, 6, seconds=1), event("accepted", 7, 19, seconds=3),
        event("marked_in_progress", 5, 8, seconds=0.5),
    ])
    for bucket in (1, 4, 4096):
        latencies = transforms.ack_latencies(frame, bucket)
        assert collect(transforms.ack_latency_histogram(latencies), "le_ms") == [
            {"group": "g", "le_ms": 1000, "records": 7}, {"group": "g", "le_ms": 5000, "records": 13}], bucket
        rows = collect(transforms.in_progress(frame, bucket), "offset")
        assert [(r["offset"], r["duration_ms"]) for r in rows] == [
            (5, 500.0), (6, 500.0), (7, 2500.0), (8, 2500.0)], bucket
