"""`share-proxy spark audit`: the audit tables (Parquet) and report.html from the event log and state topic."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import decode, report, session, sources, transforms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditInputs:
    events: DataFrame  # decode.EVENT_DDL rows
    snapshots: DataFrame  # decode.SNAPSHOT_DDL rows


def tables(inputs: AuditInputs) -> dict[str, DataFrame]:
    """Every audit table by name (the names are the Parquet directories; docs/spark.md)."""
    latencies = transforms.ack_latencies(inputs.events)
    return {
        "summary": transforms.summary(inputs.events),
        "throughput": transforms.throughput(inputs.events),
        "ack_latency": transforms.ack_latency_histogram(latencies),
        "ack_latency_summary": transforms.ack_latency_summary(latencies),
        "redelivery": transforms.redelivery(inputs.events),
        "delivery_counts": transforms.delivery_counts(inputs.events),
        "spso": transforms.spso_progress(inputs.snapshots, inputs.events),
        "dead_letters_by_reason": transforms.dead_letters_by_reason(inputs.events),
        "in_progress": transforms.in_progress(inputs.events),
    }


def select(events: DataFrame, snapshots: DataFrame, group: str | None, since_ms: int | None,
           until_ms: int | None) -> AuditInputs:
    """Keep one group (if named) and the [since, until) time span (by the proxy's event times)."""
    if group is not None:
        events = events.filter(F.col("group") == group)
        snapshots = snapshots.filter(F.col("group") == group)
    if since_ms is not None:
        since = F.timestamp_millis(F.lit(since_ms))
        events = events.filter(F.col("event_time") >= since)
        snapshots = snapshots.filter(F.col("written_at") >= since)
    if until_ms is not None:
        until = F.timestamp_millis(F.lit(until_ms))
        events = events.filter(F.col("event_time") < until)
        snapshots = snapshots.filter(F.col("written_at") < until)
    return AuditInputs(events, snapshots)


def _state_records(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The whole (compacted) state topic; no rows when it is absent or unreadable."""
    try:
        records = sources.read_topic(spark, args.bootstrap_server, args.state_topic)
        return sources.decoded_snapshots(records).cache()
    except Exception as error:  # a missing state topic leaves the spso table empty, not the audit undone
        log.warning("state topic %s not read: %s", args.state_topic, error)
        return spark.createDataFrame([], decode.SNAPSHOT_DDL)


def write_all(inputs: AuditInputs, output: Path, title: str) -> dict[str, int]:
    """Write every table and report.html under ``output``; returns each table's row count."""
    output.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    frames = {}
    for name, table in tables(inputs).items():
        sources.write_parquet(table, output / name)
        written = table.sparkSession.read.parquet(str(output / name))
        counts[name] = written.count()
        frames[name] = written.toPandas() if name != "in_progress" else report.in_progress_frame(written)
    (output / "report.html").write_text(report.render(frames, title=title))
    return counts


def run_batch(spark: SparkSession, args: argparse.Namespace) -> dict[str, int]:
    span = sources.Range(args.starting_offsets, args.ending_offsets, args.since, args.until)
    events = sources.decoded_events(sources.read_topic(spark, args.bootstrap_server, args.events_topic, span)).cache()
    inputs = select(events, _state_records(spark, args), args.group, args.since, args.until)
    return write_all(inputs, Path(args.output), _title(args))


def run_stream(spark: SparkSession, args: argparse.Namespace) -> dict[str, int]:
    """Structured Streaming: each micro-batch appends its decoded events to OUTPUT/events (exactly once,
    through the checkpoint), then the tables are recomputed from everything appended so far."""
    output = Path(args.output)
    events_path = output / "events"
    counts: dict[str, int] = {}

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        sources.write_parquet(batch, events_path, mode="append")
        events = batch.sparkSession.read.parquet(str(events_path))
        inputs = select(events, _state_records(batch.sparkSession, args), args.group, args.since, args.until)
        counts.update(write_all(inputs, output, _title(args)))
        log.info("audit micro-batch %d written", batch_id)

    stream = sources.decoded_events(sources.stream_topic(spark, args.bootstrap_server, args.events_topic))
    writer = stream.writeStream.foreachBatch(each_batch).option("checkpointLocation", args.checkpoint)
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    writer.start().awaitTermination()
    return counts


def _title(args: argparse.Namespace) -> str:
    scope = f"group {args.group}" if args.group else "all share groups"
    return f"Share-group audit: {scope} (events topic {args.events_topic})"


def run(args: argparse.Namespace) -> int:
    spark = session.start("ksp-audit", args.master)
    try:
        counts = run_stream(spark, args) if args.stream else run_batch(spark, args)
    finally:
        spark.stop()
    for name, rows in counts.items():
        print(f"{name}: {rows} rows")
    print(f"report: {Path(args.output) / 'report.html'}")
    return 0
