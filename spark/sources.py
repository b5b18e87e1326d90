"""Reading Kafka (batch over offset or time ranges, or a stream) and writing Parquet."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from . import decode


@dataclass(frozen=True)
class Range:
    """Which part of a topic a batch read covers: Kafka-source offsets (``earliest``/``latest`` or the
    source's JSON per partition) or epoch-millisecond timestamps (which win over offsets)."""

    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    since_ms: int | None = None
    until_ms: int | None = None


def _kafka_options(bootstrap: str, options: Mapping[str, str] | None) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, **(options or {})}


def read_topic(spark: SparkSession, bootstrap: str, topic: str, span: Range = Range(), *,
               options: Mapping[str, str] | None = None) -> DataFrame:
    """A batch read of ``topic`` (Kafka-source columns, headers included)."""
    reader = (spark.read.format("kafka").options(**_kafka_options(bootstrap, options))
              .option("subscribe", topic).option("includeHeaders", "true")
              .option("failOnDataLoss", "false"))
    if span.since_ms is not None:
        reader = reader.option("startingTimestamp", str(span.since_ms))
    else:
        reader = reader.option("startingOffsets", span.starting_offsets)
    if span.until_ms is not None:
        reader = reader.option("endingTimestamp", str(span.until_ms))
    else:
        reader = reader.option("endingOffsets", span.ending_offsets)
    return reader.load()


def read_offsets(spark: SparkSession, bootstrap: str, ranges: Mapping[str, Mapping[int, tuple[int, int]]], *,
                 options: Mapping[str, str] | None = None) -> DataFrame:
    """The records of exactly these offset ranges: {topic: {partition: (first, last)}} (inclusive)."""
    starting = {topic: {str(p): first for p, (first, _last) in parts.items()} for topic, parts in ranges.items()}
    ending = {topic: {str(p): last + 1 for p, (_first, last) in parts.items()} for topic, parts in ranges.items()}
    return (spark.read.format("kafka").options(**_kafka_options(bootstrap, options))
            .option("assign", json.dumps({topic: sorted(parts) for topic, parts in ranges.items()}))
            .option("startingOffsets", json.dumps(starting)).option("endingOffsets", json.dumps(ending))
            .option("includeHeaders", "true").option("failOnDataLoss", "false")
            .load())


def stream_topic(spark: SparkSession, bootstrap: str, topic: str, *,
                 options: Mapping[str, str] | None = None) -> DataFrame:
    """A streaming read of ``topic`` from its earliest offset (the checkpoint remembers where it got to)."""
    return (spark.readStream.format("kafka").options(**_kafka_options(bootstrap, options))
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false").load())


def decoded_events(records: DataFrame) -> DataFrame:
    """Event-topic records -> event rows (decode.EVENT_DDL)."""
    return records.select(*decode.SOURCE_COLUMNS).mapInArrow(decode.decode_events, decode.EVENT_DDL)


def decoded_snapshots(records: DataFrame) -> DataFrame:
    """State-topic records -> snapshot rows (decode.SNAPSHOT_DDL)."""
    return records.select(*decode.SOURCE_COLUMNS).mapInArrow(decode.decode_snapshots, decode.SNAPSHOT_DDL)


def write_parquet(table: DataFrame, path: Path, mode: str = "overwrite") -> None:
    table.write.mode(mode).parquet(str(path))


def parquet_exists(path: Path) -> bool:
    return (path / "_SUCCESS").exists() or any(path.glob("*.parquet"))


def write_kafka(records: DataFrame, bootstrap: str, topic: str, *,
                options: Mapping[str, str] | None = None) -> None:
    """Produce ``records`` (columns key, value, headers, partition) to ``topic``, acks=all, idempotent."""
    (records.write.format("kafka").options(**_kafka_options(bootstrap, options))
     .option("kafka.acks", "all").option("kafka.enable.idempotence", "true")
     .option("topic", topic).option("includeHeaders", "true").save())
