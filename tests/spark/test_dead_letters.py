"""spark/dead_letters.py: the Parquet export appends only what it does not hold yet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from spark import dead_letters, transforms

from .conftest import at


def dead_letter_rows(spark: SparkSession, offsets: list[int], *, payload: str = "v") -> DataFrame:
    rows = [("g", "t", 0, offset, 1, "rejected", f"k{offset}".encode(), f"{payload}{offset}".encode(),
             [("h", b"1")], at(offset)) for offset in offsets]
    return spark.createDataFrame(rows, transforms.DEAD_LETTER_DDL)


def exported(output: Path) -> list[tuple[int, bytes]]:
    frame = pd.read_parquet(output)
    return sorted((int(r.offset), r.value) for r in frame.itertuples())


def test_append_new_adds_only_rows_not_exported_yet(spark: SparkSession, tmp_path: Path) -> None:
    output = tmp_path / "dead-letters"
    assert dead_letters.append_new(dead_letter_rows(spark, [1, 2]), output) == 2
    assert exported(output) == [(1, b"v1"), (2, b"v2")]
    # A later run sees 1 and 2 again (with other bytes: the first export wins) and a new 3.
    assert dead_letters.append_new(dead_letter_rows(spark, [1, 2, 3], payload="w"), output) == 1
    assert exported(output) == [(1, b"v1"), (2, b"v2"), (3, b"w3")]


def test_append_new_run_again_adds_nothing(spark: SparkSession, tmp_path: Path) -> None:
    output = tmp_path / "dead-letters"
    dead_letters.append_new(dead_letter_rows(spark, [5, 6, 7]), output)
    assert dead_letters.append_new(dead_letter_rows(spark, [5, 6, 7]), output) == 0
    assert exported(output) == [(5, b"v5"), (6, b"v6"), (7, b"v7")]


def test_append_new_without_dead_letters_still_leaves_a_readable_table(spark: SparkSession, tmp_path: Path) -> None:
    output = tmp_path / "dead-letters"
    assert dead_letters.append_new(dead_letter_rows(spark, []), output) == 0
    assert list(pd.read_parquet(output).columns) == list(transforms.DEAD_LETTER_COLUMNS)
    assert dead_letters.append_new(dead_letter_rows(spark, [1]), output) == 1
    assert exported(output) == [(1, b"v1")]


def test_payload_ranges_cover_each_partitions_lowest_to_highest_offset(spark: SparkSession) -> None:
    candidates = spark.createDataFrame([("t", 0, 5), ("t", 0, 9), ("t", 1, 2), ("u", 0, 7)],
                                       "topic string, `partition` int, offset bigint")
    assert dead_letters.payload_ranges(candidates) == {"t": {0: (5, 9), 1: (2, 2)}, "u": {0: (7, 7)}}
