"""Event-log and state-topic records -> flat rows (the codec does the decoding).

Both decoders run inside executors through ``mapInArrow``: Kafka-source columns in, one row per
event (or per share-partition snapshot) out. Records that do not decode are counted as rows of
kind ``undecodable`` rather than failing the job: one bad record must not stop an audit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from codec.errors import CodecError
from codec.share_events import ArchiveReason, EventKind, ShareEventBatch, decode_event_key, decode_event_rows
from codec.share_state import DeliveryState, RecordType, decode_record

#: Column name of each Kafka-source column the decoders read.
SOURCE_COLUMNS = ("key", "value", "partition", "offset", "timestamp")

UNDECODABLE = "undecodable"

EVENT_SCHEMA = pa.schema([
    ("group", pa.string()),
    ("topic", pa.string()),
    ("topic_id", pa.string()),
    ("partition", pa.int32()),
    ("kind", pa.string()),
    ("first_offset", pa.int64()),
    ("last_offset", pa.int64()),
    ("records", pa.int64()),
    ("member_id", pa.string()),
    ("delivery_count", pa.int32()),
    ("reason", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("log_partition", pa.int32()),
    ("log_offset", pa.int64()),
])

#: The same schema as a Spark DDL string, for ``mapInArrow``.
EVENT_DDL = (
    "`group` string, topic string, topic_id string, `partition` int, kind string, first_offset bigint, "
    "last_offset bigint, records bigint, member_id string, delivery_count int, reason string, "
    "event_time timestamp, log_partition int, log_offset bigint"
)

SNAPSHOT_SCHEMA = pa.schema([
    ("group", pa.string()),
    ("topic_id", pa.string()),
    ("partition", pa.int32()),
    ("record_type", pa.string()),
    ("spso", pa.int64()),
    ("state_epoch", pa.int32()),
    ("written_at", pa.timestamp("us", tz="UTC")),
    ("in_flight_batches", pa.int32()),
    ("log_partition", pa.int32()),
    ("log_offset", pa.int64()),
])

SNAPSHOT_DDL = (
    "`group` string, topic_id string, `partition` int, record_type string, spso bigint, state_epoch int, "
    "written_at timestamp, in_flight_batches int, log_partition int, log_offset bigint"
)


def kind_name(kind: EventKind | int) -> str:
    """The lower-case name used in rows and tables (``accepted``, ``lock_expired`` ...); an id a newer
    proxy wrote, unknown here, stays visible as ``kind_<id>``."""
    return kind.name.lower() if isinstance(kind, EventKind) else f"kind_{kind}"


def reason_name(reason: ArchiveReason | int) -> str:
    return reason.name.lower() if isinstance(reason, ArchiveReason) else f"reason_{reason}"


def _ms_to_us(timestamp_ms: int | None) -> int | None:
    return None if timestamp_ms is None or timestamp_ms < 0 else timestamp_ms * 1000


def event_rows(batch: ShareEventBatch, log_partition: int, log_offset: int,
               log_timestamp_ms: int | None = None) -> Iterator[tuple[Any, ...]]:
    """One tuple per event of ``batch``, in EVENT_SCHEMA's column order.

    An event without its own timestamp takes the event-topic record's timestamp.
    """
    for event in batch.events:
        timestamp_ms = event.timestamp_ms if event.timestamp_ms >= 0 else log_timestamp_ms
        yield (
            batch.group_id, batch.topic, str(batch.topic_id), batch.partition,
            kind_name(event.kind), event.first_offset, event.last_offset, event.records,
            event.member_id, event.delivery_count, reason_name(event.reason),
            _ms_to_us(timestamp_ms), log_partition, log_offset,
        )


def record_rows(key: bytes, value: bytes, log_partition: int, log_offset: int,
                log_timestamp_ms: int | None = None) -> Iterator[tuple[Any, ...]]:
    """The rows of one event-topic record (the codec's bulk path: tuples, no event objects).

    Decodes the whole record before yielding anything, so a bad record yields no partial rows."""
    group_id, topic_id, partition = decode_event_key(key)
    topic, events = decode_event_rows(value)
    share_partition = (group_id, topic, str(topic_id), partition)
    rows = []
    for kind, first_offset, last_offset, member_id, delivery_count, reason, timestamp_ms in events:
        if timestamp_ms < 0:
            timestamp_ms = log_timestamp_ms
        rows.append((*share_partition, kind_name(kind), first_offset, last_offset, last_offset - first_offset + 1,
                     member_id, delivery_count, reason_name(reason), _ms_to_us(timestamp_ms),
                     log_partition, log_offset))
    return iter(rows)


def _undecodable_row(log_partition: int, log_offset: int, log_timestamp_ms: int | None) -> tuple[Any, ...]:
    return (None, None, None, None, UNDECODABLE, None, None, 0, None, None, None,
            _ms_to_us(log_timestamp_ms), log_partition, log_offset)


def _timestamp_ms(value: Any) -> int | None:
    """Kafka-source timestamps arrive as datetimes (or None)."""
    if value is None:
        return None
    return int(value.timestamp() * 1000)


def _source_columns(record_batch: pa.RecordBatch) -> Iterable[tuple[Any, ...]]:
    columns = [record_batch.column(record_batch.schema.get_field_index(name)).to_pylist() for name in SOURCE_COLUMNS]
    return zip(*columns)


def _to_batch(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.RecordBatch.from_arrays([pa.array(column, type=field.type) for column, field in zip(columns, schema)],
                                      schema=schema)


# Kind and reason ids are int8 on the wire: a name for every possible id (index = id + 128), plus one
# past the end for records that did not decode, so ids become names in one vectorised take().
_ID_SHIFT = 128
_UNDECODABLE_ID = 128  # -> index 256
KIND_NAMES = pa.array([kind_name(EventKind(i)) if i in EventKind._value2member_map_ else kind_name(i)
                       for i in range(-128, 128)] + [UNDECODABLE])
REASON_NAMES = pa.array([reason_name(ArchiveReason(i)) if i in ArchiveReason._value2member_map_ else reason_name(i)
                         for i in range(-128, 128)] + [None])


class _EventColumns:
    """The rows of a batch of event-topic records, gathered column by column: the Python work per event is
    one tuple from the codec and list appends; names, counts and times are computed by Arrow per column."""

    def __init__(self) -> None:
        self.record_index: list[int] = []  # row -> which record (for the per-record columns)
        self.kinds: list[int] = []
        self.firsts: list[int | None] = []
        self.lasts: list[int | None] = []
        self.members: list[str | None] = []
        self.counts: list[int | None] = []
        self.reasons: list[int] = []
        self.times: list[int] = []  # ms; < 0 = take the record's timestamp
        # Per record (indexed by record_index).
        self.share_partitions: list[tuple[Any, ...]] = []
        self.log_positions: list[tuple[int, int, int | None]] = []

    def add_record(self, key: bytes | None, value: bytes | None, log_partition: int, log_offset: int,
                   log_timestamp_ms: int | None) -> None:
        index = len(self.log_positions)
        try:
            if key is None or value is None:
                raise CodecError("event record without key or value")
            group_id, topic_id, partition = decode_event_key(key)
            topic, events = decode_event_rows(value)  # whole record first: a bad one adds no partial rows
        except CodecError:
            self.share_partitions.append((None, None, None, None))
            self._add_undecodable(index)
        else:
            self.share_partitions.append((group_id, topic, str(topic_id), partition))
            if events:
                kinds, firsts, lasts, members, counts, reasons, times = zip(*events)
                self.kinds += [kind + _ID_SHIFT for kind in kinds]
                self.reasons += [reason + _ID_SHIFT for reason in reasons]
                self.firsts += firsts
                self.lasts += lasts
                self.members += members
                self.counts += counts
                self.times += times
                self.record_index += [index] * len(events)
        self.log_positions.append((log_partition, log_offset, log_timestamp_ms))

    def _add_undecodable(self, index: int) -> None:
        self.record_index.append(index)
        self.kinds.append(_UNDECODABLE_ID + _ID_SHIFT)
        self.reasons.append(_UNDECODABLE_ID + _ID_SHIFT)
        self.firsts.append(None)
        self.lasts.append(None)
        self.members.append(None)
        self.counts.append(None)
        self.times.append(-1)

    def batch(self) -> pa.RecordBatch:
        rows = pa.array(self.record_index, pa.int32())

        def per_record(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
            return pc.take(pa.array(values, arrow_type), rows)

        group, topic, topic_id, partition = (list(column) for column in zip(*self.share_partitions)) \
            if self.share_partitions else ([], [], [], [])
        log_partition, log_offset, log_time = (list(column) for column in zip(*self.log_positions)) \
            if self.log_positions else ([], [], [])
        firsts, lasts = pa.array(self.firsts, pa.int64()), pa.array(self.lasts, pa.int64())
        own_time = pa.array(self.times, pa.int64())
        record_time = per_record(log_time, pa.int64())
        time_ms = pc.if_else(pc.less(own_time, 0), record_time, own_time)
        time_us = pc.if_else(pc.less(time_ms, 0), pa.scalar(None, pa.int64()), pc.multiply(time_ms, 1000))
        columns = [
            per_record(group, pa.string()), per_record(topic, pa.string()), per_record(topic_id, pa.string()),
            per_record(partition, pa.int32()),
            pc.take(KIND_NAMES, pa.array(self.kinds, pa.int32())),
            firsts, lasts, pc.fill_null(pc.add(pc.subtract(lasts, firsts), 1), 0),
            pa.array(self.members, pa.string()), pa.array(self.counts, pa.int32()),
            pc.take(REASON_NAMES, pa.array(self.reasons, pa.int32())),
            time_us.cast(pa.timestamp("us", tz="UTC")),
            per_record(log_partition, pa.int32()), per_record(log_offset, pa.int64()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=EVENT_SCHEMA)


def decode_events(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: event-topic records -> EVENT_SCHEMA rows (an undecodable record -> one
    ``undecodable`` row with its log position and time)."""
    for record_batch in batches:
        columns = _EventColumns()
        for key, value, partition, offset, timestamp in _source_columns(record_batch):
            columns.add_record(key, value, partition, offset, _timestamp_ms(timestamp))
        yield columns.batch()


FINISHED_STATES = frozenset((DeliveryState.ACKNOWLEDGED, DeliveryState.ARCHIVED))


def effective_spso(start_offset: int, state_batches: Iterable[Any]) -> int | None:
    """The SPSO a restart would take from this state record: the written start offset, moved past the
    finished (acknowledged / archived) records at its head. The proxy writes an acknowledgement's records
    before the SPSO move they allow (that is written with the partition's next change), so the written
    value alone lags. None when the record leaves the SPSO unchanged (-1)."""
    if start_offset < 0:
        return None
    spso = start_offset
    for batch in sorted(state_batches, key=lambda batch: batch.first_offset):
        if batch.last_offset < spso:
            continue
        if batch.first_offset > spso or batch.delivery_state not in FINISHED_STATES:
            break
        spso = batch.last_offset + 1
    return spso


def snapshot_row(key: bytes, value: bytes | None, log_partition: int, log_offset: int,
                 log_timestamp_ms: int | None = None) -> tuple[Any, ...] | None:
    """A state-topic ShareSnapshot/ShareUpdate record as a row; None for other records and tombstones.

    A ShareUpdate has no write time (the state-topic record's timestamp stands in) and may leave the
    SPSO unchanged (-1: spso null).
    """
    record = decode_record(key, value)
    if record.record_type not in (RecordType.SHARE_SNAPSHOT, RecordType.SHARE_UPDATE) or record.value is None:
        return None
    state_key: Any = record.key
    state: Any = record.value
    written_ms = getattr(state, "write_timestamp", log_timestamp_ms)
    return (
        state_key.group_id, str(state_key.topic_id), state_key.partition,
        "snapshot" if record.record_type is RecordType.SHARE_SNAPSHOT else "update",
        effective_spso(state.start_offset, state.state_batches), getattr(state, "state_epoch", None),
        _ms_to_us(written_ms), len(state.state_batches), log_partition, log_offset,
    )


def decode_snapshots(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: state-topic records -> SNAPSHOT_SCHEMA rows (others are left out)."""
    for record_batch in batches:
        rows: list[tuple[Any, ...]] = []
        for key, value, partition, offset, timestamp in _source_columns(record_batch):
            if key is None:
                continue
            try:
                row = snapshot_row(key, value, partition, offset, _timestamp_ms(timestamp))
            except CodecError:
                continue  # an unknown record type or bad bytes: not state this audit can use
            if row is not None:
                rows.append(row)
        yield _to_batch(rows, SNAPSHOT_SCHEMA)
