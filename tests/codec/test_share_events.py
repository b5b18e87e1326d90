import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.static.primitive import i8, i16, i32, i64

from codec.errors import CodecError, ShareEventError
from codec.registry import decode_entity, encode
from codec.share_events import (
    EVENT_KEY_VERSION,
    EVENT_VALUE_VERSION,
    ArchiveReason,
    EventKind,
    ShareEvent,
    ShareEventBatch,
    UnsupportedEventVersion,
    decode_event_batch,
    decode_event_key,
    decode_event_rows,
    encode_event_batch,
    encode_event_rows,
    schema_classes,
)

from .test_fuzz import FUZZ, mutated

ShareEventKey, ShareEventValue = schema_classes()
_ints = lambda bits: st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)  # noqa: E731

# Kinds and reasons a newer proxy might write are plain ints; decoding must keep them.
_kinds = st.one_of(st.sampled_from(list(EventKind)), _ints(8))
_reasons = st.one_of(st.sampled_from(list(ArchiveReason)), _ints(8))

events = st.builds(
    ShareEvent,
    kind=_kinds,
    first_offset=_ints(64),
    last_offset=_ints(64),
    member_id=st.one_of(st.none(), st.text(max_size=40)),
    delivery_count=_ints(16),
    reason=_reasons,
    timestamp_ms=_ints(64),
)
batches = st.builds(
    ShareEventBatch,
    group_id=st.text(max_size=20),
    topic_id=st.uuids(),
    topic=st.text(max_size=20),
    partition=_ints(32),
    events=st.lists(events, max_size=6).map(tuple),
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _normalize_ids(batch):
    """Known ids as their enum members, as decoding returns them."""
    def member(enum, value):
        try:
            return enum(value)
        except ValueError:
            return value

    return ShareEventBatch(
        batch.group_id, batch.topic_id, batch.topic, batch.partition,
        tuple(
            ShareEvent(member(EventKind, e.kind), e.first_offset, e.last_offset, e.member_id, e.delivery_count,
                       member(ArchiveReason, e.reason), e.timestamp_ms)
            for e in batch.events
        ),
    )


@SETTINGS
@given(batches)
def test_every_batch_round_trips(batch):
    key, value = encode_event_batch(batch)
    assert decode_event_batch(key, value) == _normalize_ids(batch)


def _reference_entities(batch):
    key = ShareEventKey(group_id=batch.group_id, topic_id=batch.topic_id if batch.topic_id.int else None,
                        partition=i32(batch.partition))
    value = ShareEventValue(topic_name=batch.topic, events=tuple(
        ShareEventValue.Event(kind=i8(e.kind), first_offset=i64(e.first_offset), last_offset=i64(e.last_offset),
                              member_id=e.member_id, delivery_count=i16(e.delivery_count), reason=i8(e.reason),
                              timestamp=i64(e.timestamp_ms))
        for e in batch.events))
    return key, value


@given(batches)
def test_rows_encode_to_the_same_bytes_as_events(batch):
    rows = [(e.kind, e.first_offset, e.last_offset, e.member_id, e.delivery_count, e.reason, e.timestamp_ms)
            for e in batch.events]
    assert encode_event_rows(batch.topic, rows) == encode_event_batch(batch)[1]


@SETTINGS
@given(batches)
def test_the_hand_written_writer_produces_the_schemas_bytes(batch):
    key_entity, value_entity = _reference_entities(batch)
    key, value = encode_event_batch(batch)
    assert key == struct.pack(">h", EVENT_KEY_VERSION) + encode(key_entity)
    assert value == struct.pack(">h", EVENT_VALUE_VERSION) + encode(value_entity)


UNKNOWN_TAGS = "unknown tagged fields"


def _schema_reading(key, value):
    """What the schema-built (kio) classes read from the bytes, in the fast reader's terms; None: refused.

    UNKNOWN_TAGS: the bytes carry tagged fields this version does not define. Kafka's rule for flexible
    versions, and the fast reader, skip them (a later version's fields); kio refuses them, so such
    bytes have no reference reading to compare with.
    """
    try:
        if key[:2] != b"\x00\x00" or value[:2] != b"\x00\x00":
            return None
        key_entity = decode_entity(ShareEventKey, memoryview(key)[2:])
        value_entity = decode_entity(ShareEventValue, memoryview(value)[2:])
    except CodecError as error:
        return UNKNOWN_TAGS if "Unknown tagged field" in str(error) else None
    if key_entity.group_id is None or value_entity.topic_name is None:
        return None
    return (
        key_entity.group_id, key_entity.topic_id or uuid.UUID(int=0), key_entity.partition, value_entity.topic_name,
        [(e.kind, e.first_offset, e.last_offset, e.member_id, e.delivery_count, e.reason, e.timestamp)
         for e in value_entity.events],
    )


def _fast_reading(key, value):
    try:
        group_id, topic_id, partition = decode_event_key(key)
        topic, rows = decode_event_rows(value)
    except ShareEventError:
        return None
    return group_id, topic_id, partition, topic, [tuple(int(x) if isinstance(x, int) else x for x in row) for row in rows]


_encoded = batches.map(encode_event_batch)


@FUZZ
@given(_encoded, mutated(_encoded.map(lambda kv: kv[1])))
def test_the_fast_reader_agrees_with_the_schema_on_damaged_values(encoded, damaged_value):
    key = encoded[0]
    fast = _fast_reading(key, damaged_value)
    if fast is not None:  # whatever the fast reader accepts, the schema reads the same way
        reference = _schema_reading(key, damaged_value)
        assume(reference != UNKNOWN_TAGS)
        assert reference == fast


@FUZZ
@given(mutated(_encoded.map(lambda kv: kv[0])), st.binary(max_size=80))
def test_bad_bytes_raise_only_codec_errors(damaged_key, junk_value):
    for key, value in ((damaged_key, encode_event_batch(ShareEventBatch("g", uuid.UUID(int=1), "t", 0, ()))[1]),
                       (damaged_key, junk_value)):
        try:
            decode_event_batch(key, value)
        except CodecError:
            pass


@SETTINGS
@given(batches.filter(lambda b: b.events))
def test_every_truncation_is_refused(batch):
    key, value = encode_event_batch(batch)
    for cut in range(len(value)):
        with pytest.raises(ShareEventError):
            decode_event_batch(key, value[:cut])
    for cut in range(len(key)):
        with pytest.raises(ShareEventError):
            decode_event_key(key[:cut])


def test_trailing_bytes_are_refused():
    key, value = encode_event_batch(ShareEventBatch("g", uuid.UUID(int=1), "t", 0, ()))
    with pytest.raises(ShareEventError, match="trailing"):
        decode_event_batch(key, value + b"\x00")
    with pytest.raises(ShareEventError, match="trailing"):
        decode_event_batch(key + b"\x00", value)


def test_an_unknown_version_names_itself():
    key, value = encode_event_batch(ShareEventBatch("g", uuid.UUID(int=1), "t", 0, ()))
    with pytest.raises(UnsupportedEventVersion, match="value version 1") as raised:
        decode_event_batch(key, b"\x00\x01" + value[2:])
    assert raised.value.version == 1
    with pytest.raises(UnsupportedEventVersion, match="key version 7"):
        decode_event_batch(b"\x00\x07" + key[2:], value)


TOPIC_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
GOLDEN_BATCH = ShareEventBatch(
    group_id="g1",
    topic_id=TOPIC_ID,
    topic="orders",
    partition=2,
    events=(
        ShareEvent(EventKind.ACQUIRED, 10, 12, "m1", 1, ArchiveReason.NONE, 1000),
        ShareEvent(EventKind.ARCHIVED, 13, 13, None, 5, ArchiveReason.DELIVERY_LIMIT, 1001),
    ),
)
GOLDEN_KEY = bytes.fromhex(
    "0000"  # key version 0
    "03" "6731"  # GroupId: compact string, length + 1 = 3, "g1"
    "00112233445566778899aabbccddeeff"  # TopicId
    "00000002"  # Partition
    "00"  # no tagged fields
)
GOLDEN_VALUE = bytes.fromhex(
    "0000"  # value version 0
    "07" "6f7264657273"  # TopicName "orders"
    "03"  # Events: compact array, 2 + 1
    "01" "000000000000000a" "000000000000000c" "03" "6d31" "0001" "00" "00000000000003e8" "00"
    "07" "000000000000000d" "000000000000000d" "00" "0005" "02" "00000000000003e9" "00"
    "00"  # no tagged fields
)


def test_version_0_bytes_are_fixed():
    assert encode_event_batch(GOLDEN_BATCH) == (GOLDEN_KEY, GOLDEN_VALUE)
    assert decode_event_batch(GOLDEN_KEY, GOLDEN_VALUE) == GOLDEN_BATCH


def test_a_later_versions_tagged_fields_are_skipped():
    # An event with tagged field 0 (2 bytes) and a value-level tagged field 5 (1 byte): what a newer
    # proxy might add without changing the version.
    value = bytes.fromhex(
        "0000" "07" "6f7264657273" "02"
        "02" "000000000000000a" "000000000000000a" "00" "0001" "00" "00000000000003e8" "01" "00" "02" "beef"
        "01" "05" "01" "ff"
    )
    assert decode_event_rows(value) == ("orders", [(EventKind.ACCEPTED, 10, 10, None, 1, ArchiveReason.NONE, 1000)])


def test_unknown_kind_and_reason_ids_decode_as_plain_ints():
    batch = ShareEventBatch("g", TOPIC_ID, "t", 0, (ShareEvent(99, 1, 1, None, 0, 77, 5),))  # type: ignore[arg-type]
    decoded = decode_event_batch(*encode_event_batch(batch)).events[0]
    assert (decoded.kind, decoded.reason) == (99, 77)
    assert not isinstance(decoded.kind, EventKind)


def test_every_key_of_a_share_partition_is_the_same_bytes():
    first = encode_event_batch(GOLDEN_BATCH)[0]
    later = encode_event_batch(ShareEventBatch("g1", TOPIC_ID, "renamed", 2, ()))[0]
    assert first == later


@pytest.mark.parametrize("bad", [
    ShareEvent(EventKind.ACQUIRED, 0, 0, None, 2**15, ArchiveReason.NONE, 0),  # delivery count past int16
    ShareEvent(EventKind.ACQUIRED, 2**63, 0, None, 1, ArchiveReason.NONE, 0),  # offset past int64
    ShareEvent(300, 0, 0, None, 1, ArchiveReason.NONE, 0),  # type: ignore[arg-type]
])
def test_values_out_of_range_are_refused_when_encoding(bad):
    with pytest.raises(ShareEventError):
        encode_event_batch(ShareEventBatch("g", TOPIC_ID, "t", 0, (bad,)))


def test_decoding_keeps_pace_with_a_spark_job():
    """A floor well below the measured rate (docs/event-log.md), so a slow machine passes but a
    reader that builds objects per field does not."""
    batch = ShareEventBatch("g", TOPIC_ID, "t", 0, tuple(
        ShareEvent(EventKind.ACCEPTED, i, i + 3, f"member-{i % 7:030d}", 1, ArchiveReason.NONE, 1_700_000_000_000 + i)
        for i in range(1000)))
    _, value = encode_event_batch(batch)
    started = time.perf_counter()
    for _ in range(50):
        topic, rows = decode_event_rows(value)
    rate = 50 * len(rows) / (time.perf_counter() - started)
    assert rate > 100_000, f"{rate:.0f} events/s"


def test_a_string_past_kafkas_limit_is_refused_and_one_at_it_written():
    from codec.share_events import encode_event_key

    at_limit = "é" * (0x7FFF // 2)  # 2 UTF-8 bytes a character: 32,766 bytes
    assert at_limit in encode_event_key(at_limit, uuid.UUID(int=1), 0).decode("utf-8", "ignore")
    with pytest.raises(ShareEventError, match="32768 bytes is longer than 32767"):
        encode_event_key("é" * 0x4000, uuid.UUID(int=1), 0)
