"""`share-proxy spark audit`: the audit tables (Parquet) and report.html from the event log and state topic."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import decode, report, session, sources, transforms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditInputs:
    events: DataFrame  # decode.EVENT_DDL rows
    snapshots: DataFrame  # decode.SNAPSHOT_DDL rows


def tables(inputs: AuditInputs, bucket: int = transforms.RANGE_BUCKET,
           latencies: DataFrame | None = None) -> dict[str, DataFrame]:
    """Every audit table by name (the names are the Parquet directories; docs/spark.md); ``bucket`` sizes
    the range joins (transforms.range_bucket_size); ``latencies`` (transforms.ack_latencies) when the
    caller keeps them."""
    if latencies is None:
        latencies = transforms.ack_latencies(inputs.events, bucket)
    return {
        "summary": transforms.summary(inputs.events),
        "throughput": transforms.throughput(inputs.events),
        "ack_latency": transforms.ack_latency_histogram(latencies),
        "ack_latency_summary": transforms.ack_latency_summary(latencies),
        "redelivery": transforms.redelivery(inputs.events),
        "delivery_counts": transforms.delivery_counts(inputs.events),
        "spso": transforms.spso_progress(inputs.snapshots, inputs.events),
        "dead_letters_by_reason": transforms.dead_letters_by_reason(inputs.events),
        "in_progress": transforms.in_progress(inputs.events, bucket),
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
        # read_committed: with --state-fencing transactional a fenced instance's aborted records are
        # on the topic too, and must not count (Spark's Kafka source reads uncommitted by default).
        records = sources.read_topic(spark, args.bootstrap_server, args.state_topic,
                                     options={"kafka.isolation.level": "read_committed"})
        snapshots = sources.decoded_snapshots(records).persist(StorageLevel.MEMORY_AND_DISK)
        snapshots.count()  # read now: a missing topic fails here, inside this try
        return snapshots
    except Exception as error:  # a missing state topic leaves the spso table empty, not the audit undone
        log.warning("state topic %s not read: %s", args.state_topic, error)
        return spark.createDataFrame([], decode.SNAPSHOT_DDL)


class StageTimer:
    """Wall time of each stage of an audit (the Spark UI is off): printed by the CLI, read by the benchmark."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started
            log.info("audit stage %s: %.2f s", name, self.seconds[name])


def write_all(inputs: AuditInputs, output: Path, title: str, timer: StageTimer | None = None) -> dict[str, int]:
    """Write every table and report.html under ``output``; returns each table's row count.

    Each table is computed once (an eager local checkpoint) and that result is both written and handed to
    the report, which never reads the Parquet back.
    """
    timer = timer or StageTimer()
    output.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    frames = {}
    with timer.stage("range_bucket_size"):
        bucket = transforms.range_bucket_size(inputs.events)
    log.info("range joins in buckets of %d offsets", bucket)
    # Two tables come from the latencies: kept after the first computes them, not joined again.
    latencies = transforms.ack_latencies(inputs.events, bucket).persist(StorageLevel.MEMORY_AND_DISK)
    for name, table in tables(inputs, bucket, latencies).items():
        with timer.stage(name):
            computed = table.localCheckpoint(eager=True)
            sources.write_parquet(computed, output / name)
            counts[name] = computed.count()
            frames[name] = report.in_progress_frame(computed) if name == "in_progress" else computed.toPandas()
    latencies.unpersist()  # a streaming audit calls this every micro-batch
    with timer.stage("report"):
        (output / "report.html").write_text(report.render(frames, title=title))
    return counts


def decoded(events: DataFrame, timer: StageTimer) -> DataFrame:
    """The decoded events kept in memory (spilling to disk) for every table: the topic is read and decoded
    once, not once per table."""
    with timer.stage("read_and_decode"):
        # The event-topic positions are for debugging bad records, not for any table: not kept.
        kept = events.drop("log_partition", "log_offset").persist(StorageLevel.MEMORY_AND_DISK)
        kept.count()
    return kept


def run_batch(spark: SparkSession, args: argparse.Namespace, timer: StageTimer) -> dict[str, int]:
    span = sources.Range(args.starting_offsets, args.ending_offsets, args.since, args.until)
    events = decoded(sources.decoded_events(sources.read_topic(spark, args.bootstrap_server, args.events_topic,
                                                               span)), timer)
    with timer.stage("state_topic"):
        snapshots = _state_records(spark, args)
    inputs = select(events, snapshots, args.group, args.since, args.until)
    return write_all(inputs, Path(args.output), _title(args), timer)


def run_stream(spark: SparkSession, args: argparse.Namespace, timer: StageTimer) -> dict[str, int]:
    """Structured Streaming: each micro-batch writes its decoded events to OUTPUT/events/batch=N (the
    checkpoint says which batches are done; a replayed batch overwrites its own directory, so every event is
    kept once), then the tables are recomputed from all of them."""
    output = Path(args.output)
    events_path = output / "events"
    counts: dict[str, int] = {}

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        # One directory per micro-batch, overwritten: a batch replayed after a crash replaces its own rows.
        sources.write_parquet(batch, events_path / f"batch={batch_id}")
        events = decoded(batch.sparkSession.read.parquet(str(events_path)).drop("batch"), timer)
        snapshots = _state_records(batch.sparkSession, args)
        inputs = select(events, snapshots, args.group, args.since, args.until)
        counts.update(write_all(inputs, output, _title(args), timer))
        events.unpersist()
        snapshots.unpersist()
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
    timer = StageTimer()
    started = time.monotonic()
    with timer.stage("session"):
        spark = session.start("ksp-audit", args.master, shuffle_partitions=session.shuffle_partitions(args.master))
    try:
        counts = run_stream(spark, args, timer) if args.stream else run_batch(spark, args, timer)
    finally:
        spark.stop()
    for name, rows in counts.items():
        print(f"{name}: {rows} rows")
    print("stages: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timer.seconds.items()))
    print(f"audit wall time: {time.monotonic() - started:.1f} s")
    print(f"report: {Path(args.output) / 'report.html'}")
    return 0
