"""`share-proxy spark dead-letters`: archived records of a group with their payloads, to Parquet and
optionally to a dead-letter topic with the proxy's (Kafka's) headers. Idempotent on re-run."""

from __future__ import annotations

import argparse
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import session, sources, transforms


def payload_ranges(candidates: DataFrame) -> dict[str, dict[int, tuple[int, int]]]:
    """{topic: {partition: (lowest, highest offset)}} of the candidates: what the source read must cover."""
    ranges: dict[str, dict[int, tuple[int, int]]] = {}
    for row in candidates.groupBy("topic", "partition").agg(F.min("offset").alias("low"),
                                                              F.max("offset").alias("high")).collect():
        ranges.setdefault(row["topic"], {})[row["partition"]] = (row["low"], row["high"])
    return ranges


def export(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The group's dead letters with payloads (all of them, not only new ones)."""
    events = sources.decoded_events(sources.read_topic(spark, args.bootstrap_server, args.events_topic))
    candidates = transforms.dead_letter_candidates(events, args.group).localCheckpoint()
    ranges = payload_ranges(candidates)
    if not ranges:
        return spark.createDataFrame([], transforms.DEAD_LETTER_DDL)
    originals = sources.read_offsets(spark, args.bootstrap_server, ranges)
    return transforms.with_payloads(candidates, originals).localCheckpoint()


def append_new(dead_letters: DataFrame, output: Path) -> int:
    """Append the rows not yet in ``output`` (by group, topic, partition, offset); returns how many."""
    if sources.parquet_exists(output):
        existing = dead_letters.sparkSession.read.parquet(str(output))
        fresh = transforms.not_yet_exported(dead_letters, existing).localCheckpoint()
    else:
        fresh = dead_letters
    added = fresh.count()
    if added or not sources.parquet_exists(output):
        sources.write_parquet(fresh, output, mode="append")
    return added


def topic_partitions(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (it must exist: the job does not create dead-letter topics)."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise SystemExit(f"dead-letter topic {topic} not found on {bootstrap}: create it first")
    return len(found.partitions)


def produce_missing(spark: SparkSession, dead_letters: DataFrame, args: argparse.Namespace) -> int:
    """Write to --to-topic the dead letters it does not hold yet (read from its headers); returns how many."""
    partitions = topic_partitions(args.bootstrap_server, args.to_topic)
    present = transforms.dead_letters_present(sources.read_topic(spark, args.bootstrap_server, args.to_topic))
    missing = transforms.not_yet_exported(dead_letters, present)
    records = transforms.dead_letter_records(missing, partitions).localCheckpoint()
    count = records.count()
    if count:
        sources.write_kafka(records.select(F.col("kafka_partition").alias("partition"), "key", "value", "headers"),
                            args.bootstrap_server, args.to_topic)
    return count


def run(args: argparse.Namespace) -> int:
    spark = session.start("ksp-dead-letters", args.master)
    try:
        dead_letters = export(spark, args)
        total = dead_letters.count()
        added = append_new(dead_letters, Path(args.output))
        print(f"dead letters of group {args.group}: {total}, new in {args.output}: {added}")
        if args.to_topic:
            produced = produce_missing(spark, dead_letters, args)
            print(f"written to {args.to_topic}: {produced}")
    finally:
        spark.stop()
    return 0
