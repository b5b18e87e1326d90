"""spark/audit.py: every table written once, counted and reported from memory; re-runs replace, not add."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from spark import audit, decode

from .conftest import TOPIC_ID, at, event, events_frame

TABLES = {"summary", "throughput", "ack_latency", "ack_latency_summary", "redelivery", "delivery_counts", "spso",
          "dead_letters_by_reason", "in_progress"}


def inputs(spark: SparkSession) -> audit.AuditInputs:
    events = events_frame(spark, [
        event("acquired", 0, 9, seconds=0), event("accepted", 0, 7, seconds=1),
        event("rejected", 8, 9, seconds=2), event("archived", 8, 9, seconds=2, member=None, reason="rejected"),
        event("marked_in_progress", 0, seconds=0.5),
        event("acquired", 0, 4, seconds=3, group="other"),  # another group
    ])
    snapshots = spark.createDataFrame([("g", str(TOPIC_ID), 0, "snapshot", 10, 1, at(5), 0, 0, 0)],
                                      decode.SNAPSHOT_DDL)
    return audit.AuditInputs(events, snapshots)


def test_write_all_writes_every_table_counts_its_rows_and_reports(spark: SparkSession, tmp_path: Path) -> None:
    timer = audit.StageTimer()
    counts = audit.write_all(inputs(spark), tmp_path, "Audit", timer)
    assert set(counts) == TABLES
    for name in TABLES:
        assert len(pd.read_parquet(tmp_path / name)) == counts[name], name
    summary = pd.read_parquet(tmp_path / "summary")
    assert sorted((r.group, r.kind, r.reason, r.records) for r in summary.itertuples()) == [
        ("g", "accepted", "none", 8), ("g", "acquired", "none", 10), ("g", "archived", "rejected", 2),
        ("g", "marked_in_progress", "none", 1), ("g", "rejected", "none", 2), ("other", "acquired", "none", 5)]
    latency = pd.read_parquet(tmp_path / "ack_latency_summary")
    assert latency[["group", "records", "p50_ms"]].values.tolist() == [["g", 8, 1000.0]]
    in_progress = pd.read_parquet(tmp_path / "in_progress")
    assert in_progress[["offset", "outcome", "duration_ms"]].values.tolist() == [[0, "accepted", 500.0]]
    spso = pd.read_parquet(tmp_path / "spso")
    assert spso[["group", "topic", "spso", "highest_offset_seen", "lag"]].values.tolist() == [["g", "t", 10, 9, 0]]
    page = (tmp_path / "report.html").read_text()
    assert "<svg" in page and "Audit" in page
    assert TABLES | {"report"} <= set(timer.seconds)


def test_write_all_again_replaces_the_tables(spark: SparkSession, tmp_path: Path) -> None:
    first = audit.write_all(inputs(spark), tmp_path, "Audit")
    again = audit.write_all(inputs(spark), tmp_path, "Audit")
    assert again == first
    assert len(pd.read_parquet(tmp_path / "summary")) == first["summary"] == 6


def test_write_all_without_events_writes_empty_tables(spark: SparkSession, tmp_path: Path) -> None:
    empty = audit.AuditInputs(events_frame(spark, []), spark.createDataFrame([], decode.SNAPSHOT_DDL))
    counts = audit.write_all(empty, tmp_path, "Audit")
    assert counts == {name: 0 for name in TABLES}
    assert "No events in the range read." in (tmp_path / "report.html").read_text()


def test_select_keeps_one_group_and_the_time_span(spark: SparkSession) -> None:
    chosen = audit.select(inputs(spark).events, inputs(spark).snapshots, "g",
                          since_ms=int(at(1).timestamp() * 1000), until_ms=int(at(3).timestamp() * 1000))
    assert sorted((r["kind"], r["group"]) for r in chosen.events.collect()) == [
        ("accepted", "g"), ("archived", "g"), ("rejected", "g")]
    assert chosen.snapshots.count() == 0  # written at 5 s, after the span
