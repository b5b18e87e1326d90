"""The audit and dead-letter computations: plain functions DataFrame -> DataFrame, no I/O.

Inputs are the decoded rows of ``spark.decode`` (EVENT_DDL, SNAPSHOT_DDL) and Kafka-source
records; every output table's columns are defined in docs/spark.md. Event ranges are matched by range
arithmetic (range_buckets); they are exploded to single offsets only where the output has a row per record
(in_progress marks, dead letters).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from codec.share_events import DEAD_LETTER_MESSAGES, DEAD_LETTER_REASONS, ArchiveReason, EventKind

from .decode import UNDECODABLE, kind_name, reason_name

ACQUIRED = kind_name(EventKind.ACQUIRED)
ACCEPTED = kind_name(EventKind.ACCEPTED)
RELEASED = kind_name(EventKind.RELEASED)
REJECTED = kind_name(EventKind.REJECTED)
ARCHIVED = kind_name(EventKind.ARCHIVED)
DEAD_LETTERED = kind_name(EventKind.DEAD_LETTERED)
MARKED_IN_PROGRESS = kind_name(EventKind.MARKED_IN_PROGRESS)

#: The kinds the throughput table counts, in its column order.
THROUGHPUT_KINDS = (ACQUIRED, ACCEPTED, RELEASED, REJECTED, ARCHIVED)

#: Events that end an IN_PROGRESS stretch of a record (for the in_progress table's ``outcome``).
IN_PROGRESS_ENDINGS = tuple(kind_name(kind) for kind in (
    EventKind.ACCEPTED, EventKind.RELEASED, EventKind.REJECTED, EventKind.LOCK_EXPIRED,
    EventKind.MEMBER_RELEASED, EventKind.STALE_RELEASED, EventKind.MAX_EXTENSION_RELEASED,
    EventKind.GRACE_EXPIRED,
))

#: Upper bounds (ms, inclusive) of the ack-latency histogram buckets; a last bucket (null bound) holds the rest.
#: Offsets per bucket when ranges are joined by overlap (range_buckets), unless the audit sizes it from
#: the data (range_bucket_size): a range touches at most length/bucket + 2 buckets, and a bucket holds
#: about bucket/length ranges of each side, so a bucket near the typical range length keeps both small.
RANGE_BUCKET = 4096
MAX_RANGE_BUCKET = 1 << 20

LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000)

DEAD_LETTER_REASON_NAMES = tuple(sorted(reason_name(reason) for reason in DEAD_LETTER_REASONS))

#: The dead-letter export's columns, in order (docs/spark.md).
DEAD_LETTER_COLUMNS = ("group", "topic", "partition", "offset", "delivery_count", "reason", "key", "value",
                       "headers", "archived_at")
DEAD_LETTER_DDL = (
    "`group` string, topic string, `partition` int, offset bigint, delivery_count int, reason string, key binary, "
    "value binary, headers array<struct<key:string,value:binary>>, archived_at timestamp"
)
DEAD_LETTER_KEY = ("group", "topic", "partition", "offset")

SHARE_PARTITION = ("group", "topic", "partition")

# Kafka's dead-letter headers (KIP-1191), the same the proxy's writer sets.
DLQ_TOPIC_HEADER = "__dlq.errors.topic"
DLQ_PARTITION_HEADER = "__dlq.errors.partition"
DLQ_OFFSET_HEADER = "__dlq.errors.offset"
DLQ_GROUP_HEADER = "__dlq.errors.group"
DLQ_DELIVERY_COUNT_HEADER = "__dlq.errors.delivery.count"
DLQ_MESSAGE_HEADER = "__dlq.errors.message"


def valid_events(events: DataFrame) -> DataFrame:
    """The decoded events, without the rows standing for records that did not decode."""
    return events.filter(F.col("kind") != UNDECODABLE)


def explode_offsets(events: DataFrame) -> DataFrame:
    """One row per offset of each event's range (column ``offset``)."""
    return events.withColumn("offset", F.explode(F.sequence("first_offset", "last_offset")))


def _millis_between(start: Column, end: Column) -> Column:
    return ((F.unix_micros(end) - F.unix_micros(start)) / 1000).cast("double")


def summary(events: DataFrame) -> DataFrame:
    """Records and events per (group, topic, kind, reason): the totals the report opens with."""
    return (valid_events(events)
            .groupBy("group", "topic", "kind", "reason")
            .agg(F.sum("records").alias("records"), F.count("*").alias("events")))


def throughput(events: DataFrame, window: str = "1 minute") -> DataFrame:
    """Records per share-partition and time window for each of THROUGHPUT_KINDS (0 when none)."""
    counted = valid_events(events).filter(F.col("kind").isin(*THROUGHPUT_KINDS))
    table = (counted
             .groupBy(*SHARE_PARTITION, F.window("event_time", window).start.alias("window_start"))
             .pivot("kind", list(THROUGHPUT_KINDS))
             .agg(F.sum("records")))
    return table.na.fill(0, list(THROUGHPUT_KINDS)).select(*SHARE_PARTITION, "window_start", *THROUGHPUT_KINDS)


def range_bucket_size(events: DataFrame) -> int:
    """A bucket size for range_buckets from the data: the smallest power of two at or above the median
    length of the ranges the audit joins (acquisitions and what ends them). Never worse than exploding to
    offsets (a range then touches at most length + 1 buckets); an action over the events (one aggregate)."""
    joined = valid_events(events).filter(F.col("kind").isin(ACQUIRED, *IN_PROGRESS_ENDINGS))
    median = joined.agg(F.percentile_approx("records", 0.5, 1000).alias("median")).first()
    length = int(median["median"]) if median is not None and median["median"] is not None else 1
    size = 1
    while size < length and size < MAX_RANGE_BUCKET:
        size *= 2
    return size


def range_buckets(events: DataFrame, bucket: int = RANGE_BUCKET) -> DataFrame:
    """Each event once per RANGE_BUCKET-offset bucket its range touches (column ``bucket``).

    Joining ranges on (share-partition, delivery count, bucket) with an overlap condition keeps each join
    small and linear, where exploding ranges to offsets would multiply the rows by the range length.
    """
    first_bucket = F.floor(F.col("first_offset") / bucket)
    last_bucket = F.floor(F.col("last_offset") / bucket)
    return events.withColumn("bucket", F.explode(F.sequence(first_bucket, last_bucket)))


def _share_partition_key() -> Column:
    """A 64-bit hash standing for (group, topic, partition) in joins: sorting and hashing one long is far
    cheaper than two strings and an int on millions of rows (a collision would need 2^32 share-partitions)."""
    return F.xxhash64(*SHARE_PARTITION)


def ack_latencies(events: DataFrame, bucket: int = RANGE_BUCKET) -> DataFrame:
    """Accepted records with the time from their acquisition (same delivery count) to their acceptance.

    One row per overlap of an acquired range with an accepted range within one bucket (columns group, topic,
    partition, first_offset, last_offset, delivery_count, records, acquired_at, accepted_at, latency_ms):
    every record of the overlap has that latency, so tables weight it by ``records``. Ranges are matched by
    arithmetic (range_buckets), never exploded to offsets. An event seen twice (the event log is at least
    once) counts once, with its earliest time.

    One shuffle per side: each kind is partitioned once by (share-partition key, delivery count, bucket);
    its de-duplication and the join then need no further exchange.
    """
    keys = ["sp_key", "delivery_count", "bucket"]
    valid = valid_events(events)

    def earliest(kind: str) -> DataFrame:
        of_kind = valid.filter(F.col("kind") == kind).select(
            _share_partition_key().alias("sp_key"), *SHARE_PARTITION, "first_offset", "last_offset",
            "delivery_count", "event_time")
        return (range_buckets(of_kind, bucket).repartition(*keys)
                .groupBy(*keys, "first_offset", "last_offset")
                .agg(*[F.first(column).alias(column) for column in SHARE_PARTITION],
                     F.min("event_time").alias("at")))

    acquired = earliest(ACQUIRED).alias("acq")
    accepted = earliest(ACCEPTED).alias("acc")
    bucket_first = F.col("acc.bucket") * bucket
    first = F.greatest(F.col("acq.first_offset"), F.col("acc.first_offset"), bucket_first)
    last = F.least(F.col("acq.last_offset"), F.col("acc.last_offset"), bucket_first + bucket - 1)
    overlaps = acquired.join(accepted, [F.col(f"acq.{key}") == F.col(f"acc.{key}") for key in keys]
                             + [F.col("acq.first_offset") <= F.col("acc.last_offset"),
                                F.col("acc.first_offset") <= F.col("acq.last_offset")])
    pieces = (overlaps.select(*[F.col(f"acc.{column}").alias(column) for column in SHARE_PARTITION],
                              first.alias("first_offset"), last.alias("last_offset"),
                              F.col("acc.delivery_count").alias("delivery_count"),
                              F.col("acq.at").alias("acquired_at"), F.col("acc.at").alias("accepted_at"))
              .filter(F.col("first_offset") <= F.col("last_offset")))  # the overlap outside this bucket
    return pieces.select(*SHARE_PARTITION, "first_offset", "last_offset", "delivery_count",
                         (F.col("last_offset") - F.col("first_offset") + 1).alias("records"),
                         "acquired_at", "accepted_at",
                         _millis_between(F.col("acquired_at"), F.col("accepted_at")).alias("latency_ms"))


def _bucket_bound(latency_ms: Column) -> Column:
    bound: Column = F.lit(None).cast("bigint")
    for upper in reversed(LATENCY_BUCKETS_MS):
        bound = F.when(latency_ms <= upper, F.lit(upper).cast("bigint")).otherwise(bound)
    return bound


def ack_latency_histogram(latencies: DataFrame) -> DataFrame:
    """Accepted records per group and latency bucket (``le_ms``: inclusive upper bound; null: beyond the last)."""
    return (latencies.groupBy("group", _bucket_bound(F.col("latency_ms")).alias("le_ms"))
            .agg(F.sum("records").alias("records")))


LATENCY_PERCENTILES = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99}


def ack_latency_summary(latencies: DataFrame) -> DataFrame:
    """Per group: accepted records matched to their acquisition, p50/p90/p99 and max latency (ms).

    Percentiles are exact nearest-rank over records (the smallest latency at or below which at least that
    share of records lies), computed from per-latency record counts, so a latency piece weighs its records.
    """
    per_latency = latencies.groupBy("group", "latency_ms").agg(F.sum("records").alias("records"))
    so_far = Window.partitionBy("group").orderBy("latency_ms").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = (per_latency.withColumn("at_or_below", F.sum("records").over(so_far))
              .withColumn("total", F.sum("records").over(Window.partitionBy("group"))))
    percentiles = [F.min(F.when(F.col("at_or_below") >= share * F.col("total"), F.col("latency_ms"))).alias(name)
                   for name, share in LATENCY_PERCENTILES.items()]
    return (ranked.groupBy("group")
            .agg(F.max("total").alias("records"), *percentiles, F.max("latency_ms").alias("max_ms"))
            .select("group", "records", *LATENCY_PERCENTILES, "max_ms"))


def redelivery(events: DataFrame) -> DataFrame:
    """Per share-partition: records delivered, of them redelivered (delivery count > 1), and the rate."""
    acquired = valid_events(events).filter(F.col("kind") == ACQUIRED)
    return (acquired.groupBy(*SHARE_PARTITION)
            .agg(F.sum("records").alias("delivered"),
                 F.sum(F.when(F.col("delivery_count") > 1, F.col("records")).otherwise(0)).alias("redelivered"))
            .withColumn("redelivery_rate", F.col("redelivered") / F.col("delivered")))


def delivery_counts(events: DataFrame) -> DataFrame:
    """Histogram of the final delivery count of finished records (accepted or archived), per group."""
    finished = valid_events(events).filter(F.col("kind").isin(ACCEPTED, ARCHIVED))
    return (finished.groupBy("group", "delivery_count")
            .agg(F.sum(F.when(F.col("kind") == ACCEPTED, F.col("records")).otherwise(0)).alias("accepted"),
                 F.sum(F.when(F.col("kind") == ARCHIVED, F.col("records")).otherwise(0)).alias("archived"))
            .withColumn("records", F.col("accepted") + F.col("archived")))


def dead_letters_by_reason(events: DataFrame) -> DataFrame:
    """Per group, topic and archive reason: records archived, and of them written to a dead-letter topic."""
    archived = valid_events(events).filter(F.col("kind").isin(ARCHIVED, DEAD_LETTERED))
    table = (archived.groupBy("group", "topic", "reason")
             .pivot("kind", [ARCHIVED, DEAD_LETTERED]).agg(F.sum("records"))
             .na.fill(0, [ARCHIVED, DEAD_LETTERED]))
    return table.select("group", "topic", "reason", F.col(ARCHIVED).alias("archived_records"),
                        F.col(DEAD_LETTERED).alias("dead_lettered_records"))


def in_progress(events: DataFrame, bucket: int = RANGE_BUCKET) -> DataFrame:
    """Per record marked IN_PROGRESS: when (first mark of that delivery), how it ended and how long it took.

    ``outcome`` is the first ending event (IN_PROGRESS_ENDINGS) at or after the mark with the same delivery
    count; null with null ``finished_at`` while the record was still in progress at the end of the data.
    Only the marks are exploded to offsets (the table has a row per marked record); each is matched to the
    ending ranges that contain it through range_buckets, so acknowledgements are never exploded.
    """
    valid = valid_events(events)
    record = [*SHARE_PARTITION, "offset", "delivery_count"]
    marks = (explode_offsets(valid.filter(F.col("kind") == MARKED_IN_PROGRESS))
             .groupBy(*record)
             .agg(F.min_by("member_id", "event_time").alias("member_id"), F.min("event_time").alias("marked_at"))
             .withColumn("bucket", F.floor(F.col("offset") / bucket))
             .alias("mark"))
    endings = (range_buckets(valid.filter(F.col("kind").isin(*IN_PROGRESS_ENDINGS)), bucket)
               .select(*SHARE_PARTITION, "delivery_count", "bucket", "first_offset", "last_offset",
                       F.col("event_time").alias("finished_at"), F.col("kind").alias("outcome"))
               .alias("end"))
    keys = [*SHARE_PARTITION, "delivery_count", "bucket"]
    joined = marks.join(endings, [F.col(f"mark.{key}") == F.col(f"end.{key}") for key in keys]
                        + [F.col("mark.offset").between(F.col("end.first_offset"), F.col("end.last_offset")),
                           F.col("end.finished_at") >= F.col("mark.marked_at")], "left")
    first_ending = (joined.groupBy(*[F.col(f"mark.{column}").alias(column) for column in record])
                    .agg(F.first("mark.member_id").alias("member_id"), F.first("mark.marked_at").alias("marked_at"),
                         F.min("end.finished_at").alias("finished_at"),
                         F.min_by("end.outcome", "end.finished_at").alias("outcome")))
    return first_ending.select(*record, "member_id", "marked_at", "finished_at",
                               _millis_between(F.col("marked_at"), F.col("finished_at")).alias("duration_ms"),
                               "outcome")


def spso_progress(snapshots: DataFrame, events: DataFrame) -> DataFrame:
    """The SPSO of each share-partition at every state record that sets it (every ShareSnapshot, and each
    ShareUpdate that moved it), with the lag behind the event log.

    ``highest_offset_seen`` is the highest offset any event of the share-partition named at or before the
    snapshot's write time; ``lag`` = max(0, highest_offset_seen + 1 - spso), null before any event.
    Topic names come from the events (the state topic has only topic ids).
    """
    share_partition = ["group", "topic_id", "partition"]
    states = (snapshots.filter(F.col("spso").isNotNull())  # a snapshot, or an update that moved the SPSO
              .select(*share_partition, F.col("written_at").alias("at"), F.lit(None).cast("bigint").alias("seen"),
                      "spso", F.lit(1).alias("is_snapshot")))
    # Only share-partitions with snapshots matter, and of their events only the highest offset per instant:
    # the window below then sorts far fewer rows than there are events.
    valid = valid_events(events).join(F.broadcast(states.select(*share_partition).distinct()), share_partition,
                                      "left_semi")
    per_instant = valid.groupBy(*share_partition, "event_time").agg(F.max("last_offset").alias("seen"),
                                                                     F.max("topic").alias("topic"))
    names = per_instant.groupBy(*share_partition).agg(F.max("topic").alias("topic"))
    seen = per_instant.select(*share_partition, F.col("event_time").alias("at"), "seen",
                              F.lit(None).cast("bigint").alias("spso"), F.lit(0).alias("is_snapshot"))
    so_far = (Window.partitionBy(*share_partition).orderBy("at", "is_snapshot")
              .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    timeline = seen.unionByName(states).withColumn("highest_offset_seen", F.max("seen").over(so_far))
    return (timeline.filter(F.col("is_snapshot") == 1)
            .join(names, share_partition, "left")
            .select("group", "topic", "topic_id", "partition", F.col("at").alias("written_at"), "spso",
                    "highest_offset_seen",
                    F.when(F.col("highest_offset_seen").isNotNull(),  # greatest() would skip the null
                           F.greatest(F.col("highest_offset_seen") + 1 - F.col("spso"), F.lit(0))).alias("lag"))
            .dropDuplicates(["group", "topic_id", "partition", "written_at", "spso"]))


# -- dead letters ---------------------------------------------------------------------------------


def dead_letter_candidates(events: DataFrame, group: str) -> DataFrame:
    """Records of ``group`` archived as rejected or at the delivery limit, one row per offset.

    Columns group, topic, topic_id, partition, offset, delivery_count, reason, archived_at. A record archived
    more than once (an at-least-once event log, or offsets reset and consumed again) keeps its latest archiving.
    """
    archived = valid_events(events).filter(
        (F.col("group") == group) & (F.col("kind") == ARCHIVED) & F.col("reason").isin(*DEAD_LETTER_REASON_NAMES))
    rows = explode_offsets(archived).select(
        "group", "topic", "topic_id", "partition", "offset", "delivery_count", "reason",
        F.col("event_time").alias("archived_at"))
    latest = Window.partitionBy(*DEAD_LETTER_KEY).orderBy(F.col("archived_at").desc())
    return rows.withColumn("rank", F.row_number().over(latest)).filter(F.col("rank") == 1).drop("rank")


def with_payloads(candidates: DataFrame, source_records: DataFrame) -> DataFrame:
    """The candidates joined with their original records (Kafka-source columns topic, partition, offset,
    key, value, headers); key, value and headers are null for a record no longer in the log."""
    originals = source_records.select("topic", "partition", "offset", "key", "value", "headers")
    return (candidates.join(originals, ["topic", "partition", "offset"], "left")
            .select(*DEAD_LETTER_COLUMNS))


def not_yet_exported(dead_letters: DataFrame, existing: DataFrame) -> DataFrame:
    """The rows of ``dead_letters`` whose (group, topic, partition, offset) is not in ``existing``."""
    return dead_letters.join(existing.select(*DEAD_LETTER_KEY), list(DEAD_LETTER_KEY), "left_anti")


def _header(name: str, value: Column) -> Column:
    return F.struct(F.lit(name).alias("key"), F.encode(value.cast("string"), "UTF-8").alias("value"))


def _dead_letter_message(reason: Column) -> Column:
    message = F.lit(None).cast("string")
    for archive_reason, text in DEAD_LETTER_MESSAGES.items():
        message = F.when(reason == reason_name(ArchiveReason(archive_reason)), F.lit(text)).otherwise(message)
    return message


def dead_letter_records(dead_letters: DataFrame, dlq_partitions: int) -> DataFrame:
    """Kafka-DLQ-style records (columns partition, key, value, headers) for the Kafka sink: the original key
    and value, Kafka's six ``__dlq.errors.*`` headers, partition = source partition mod ``dlq_partitions``."""
    headers = F.array(
        _header(DLQ_TOPIC_HEADER, F.col("topic")),
        _header(DLQ_PARTITION_HEADER, F.col("partition")),
        _header(DLQ_OFFSET_HEADER, F.col("offset")),
        _header(DLQ_GROUP_HEADER, F.col("group")),
        _header(DLQ_DELIVERY_COUNT_HEADER, F.col("delivery_count")),
        _header(DLQ_MESSAGE_HEADER, _dead_letter_message(F.col("reason"))),
    )
    return dead_letters.select(
        *DEAD_LETTER_KEY,
        F.pmod(F.col("partition"), F.lit(dlq_partitions)).cast("int").alias("kafka_partition"),
        "key", "value", headers.alias("headers"))


def _header_text(name: str) -> Column:
    return F.expr(f"decode(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value, 'UTF-8')")


def dead_letters_present(dlq_records: DataFrame) -> DataFrame:
    """(group, topic, partition, offset) of the dead letters already in a topic, read from Kafka's headers
    (Kafka-source rows); records without them are left out."""
    present = dlq_records.select(
        _header_text(DLQ_GROUP_HEADER).alias("group"),
        _header_text(DLQ_TOPIC_HEADER).alias("topic"),
        _header_text(DLQ_PARTITION_HEADER).try_cast("int").alias("partition"),
        _header_text(DLQ_OFFSET_HEADER).try_cast("bigint").alias("offset"))
    return present.dropna().dropDuplicates()
