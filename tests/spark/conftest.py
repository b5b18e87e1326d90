"""One local SparkSession for all Spark unit tests (no Kafka, no connector jars), and event-row builders."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from spark import decode, session  # noqa: E402

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
TOPIC_ID = uuid.UUID(int=7)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    spark_session = session.start("ksp-unit-tests", "local[2]", kafka=False, ship_code=False, shuffle_partitions=2)
    yield spark_session
    spark_session.stop()


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def event(kind: str, first: int, last: int | None = None, *, seconds: float = 0.0, count: int = 1,
          member: str | None = "m1", reason: str = "none", group: str = "g", topic: str = "t",
          partition: int = 0) -> tuple:
    """One decoded event row (decode.EVENT_DDL order)."""
    last = first if last is None else last
    return (group, topic, str(TOPIC_ID), partition, kind, first, last, last - first + 1, member, count, reason,
            at(seconds), 0, 0)


def events_frame(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, decode.EVENT_DDL)


def collect(frame: DataFrame, *order: str) -> list[dict]:
    """Rows as dicts, sorted by ``order`` columns (nulls first) so comparisons do not depend on partitions."""
    rows = [row.asDict() for row in frame.collect()]
    return sorted(rows, key=lambda row: tuple((row[c] is not None, row[c]) for c in order))
