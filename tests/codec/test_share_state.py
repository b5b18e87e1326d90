import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import i8, i16, i32, i64

from codec import share_state
from codec.errors import StateRecordError
from codec.share_state import (
    DeliveryState,
    RecordType,
    ShareSnapshotKey,
    ShareSnapshotValue,
    ShareUpdateKey,
    ShareUpdateValue,
    UnknownStateRecordType,
    decode_record,
    encode_record,
)

from .strategies import entities

PAIRS = [
    (share_state._KEYS[record_type], share_state._VALUES[record_type], record_type) for record_type in RecordType
]


@pytest.mark.parametrize(("key_type", "value_type", "record_type"), PAIRS, ids=[p[2].name for p in PAIRS])
def test_every_state_record_type_round_trips(key_type, value_type, record_type):
    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(entities(key_type), st.one_of(st.none(), entities(value_type)))
    def round_trip(key, value):
        key_bytes, value_bytes = encode_record(key, value)
        assert key_bytes[:2] == int(record_type).to_bytes(2, "big")
        assert (value_bytes is None) == (value is None)
        record = decode_record(key_bytes, value_bytes)
        assert (record.record_type, record.key, record.value) == (record_type, key, value)
        assert record.is_tombstone == (value is None)

    round_trip()


def _snapshot(**batch_extras):
    batch = ShareSnapshotValue.StateBatch(
        first_offset=i64(10), last_offset=i64(12), delivery_state=i8(DeliveryState.ACKNOWLEDGED),
        delivery_count=i16(1), **batch_extras,
    )
    return ShareSnapshotValue(
        snapshot_epoch=i32(1), state_epoch=i32(2), leader_epoch=i32(3), start_offset=i64(10),
        create_timestamp=i64(5), write_timestamp=i64(6), state_batches=(batch,),
    )


def test_snapshot_bytes_follow_kafkas_layout():
    key = ShareSnapshotKey(group_id="g", topic_id=uuid.UUID(int=5), partition=i32(3))
    key_bytes, value_bytes = encode_record(key, _snapshot())
    assert key_bytes == bytes.fromhex("0000" "0001" "67" + "00" * 15 + "05" "00000003")
    assert value_bytes == bytes.fromhex(
        "0000" "00000001" "00000002" "00000003" "000000000000000a"  # version, epochs, start offset
        "0000000000000005" "0000000000000006"  # create / write timestamps
        "02" "000000000000000a" "000000000000000c" "02" "0001" "00"  # one state batch, no tagged fields
        "00"  # no tagged fields (DeliveryCompleteCount at its default -1 is left out)
    )


def test_in_progress_fields_travel_as_high_tagged_fields_of_the_state_batch():
    plain = encode_record(ShareUpdateKey(group_id="g", topic_id=None, partition=i32(0)), None)[0]
    _, value_bytes = encode_record(
        ShareSnapshotKey(group_id="g", topic_id=None, partition=i32(0)),
        _snapshot(in_progress_start_timestamp=i64(100), last_progress_timestamp=i64(200)),
    )
    # tagged field count 2, tag 100 (1 byte varint), size 8, value, tag 101, size 8, value
    assert bytes.fromhex("02" "64" "08" "0000000000000064" "65" "08" "00000000000000c8") in value_bytes
    assert plain[:2] == b"\x00\x01"


def test_update_value_carries_delivery_complete_count_as_tag_zero():
    value = ShareUpdateValue(snapshot_epoch=i32(1), leader_epoch=i32(0), start_offset=i64(-1), delivery_complete_count=i32(9))
    _, value_bytes = encode_record(ShareUpdateKey(group_id="g", topic_id=None, partition=i32(0)), value)
    assert value_bytes.endswith(bytes.fromhex("01" "01" "00" "04" "00000009"))


def test_unknown_record_type_is_reported_so_replay_can_skip_it():
    with pytest.raises(UnknownStateRecordType) as caught:
        decode_record(b"\x00\x07rest", None)
    assert caught.value.record_type == 7


@pytest.mark.parametrize(("key", "value"), [(b"", None), (b"\x00", None), (b"\x00\x00\x01", None)])
def test_short_or_bad_keys_are_state_record_errors(key, value):
    with pytest.raises(StateRecordError):
        decode_record(key, value)


def test_unknown_value_version_and_mismatched_types_are_errors():
    key = ShareSnapshotKey(group_id="g", topic_id=None, partition=i32(0))
    key_bytes, value_bytes = encode_record(key, _snapshot())
    with pytest.raises(StateRecordError, match="version 1"):
        decode_record(key_bytes, b"\x00\x01" + value_bytes[2:])
    with pytest.raises(StateRecordError):
        encode_record(key, ShareUpdateValue())
    with pytest.raises(StateRecordError):
        share_state.encode_key(_snapshot())


def test_proxy_metadata_record_types_do_not_collide_with_kafkas():
    assert {t for t in RecordType if t >= 32000} == {
        RecordType.PROXY_GROUP_METADATA, RecordType.PROXY_GROUP_PARTITIONS, RecordType.PROXY_GROUP_CONFIG,
        RecordType.PROXY_STATE_LAYOUT,
    }
    config = share_state.ProxyShareGroupConfigValue(
        configs=(share_state.ProxyShareGroupConfigValue.Config(name="group.share.record.lock.duration.ms", value="15000"),)
    )
    key = share_state.ProxyShareGroupConfigKey(group_id="g")
    assert decode_record(*encode_record(key, config)).value == config


def test_the_layout_marker_has_one_fixed_key_and_round_trips():
    marker = share_state.ProxyStateLayoutValue(layout=2, partitions=12)
    key, value = encode_record(share_state.ProxyStateLayoutKey(), marker)
    assert key == (32004).to_bytes(2, "big")  # no fields: one marker per topic, compaction keeps the newest
    assert decode_record(key, value).value == marker


# ----- the replay fast path (read_share_value) ------------------------------------------------

SHARE_VALUES = [(ShareSnapshotValue, RecordType.SHARE_SNAPSHOT), (ShareUpdateValue, RecordType.SHARE_UPDATE)]


def _generic_view(record_type, data):
    """What the generic decoder makes of ``data``: its view, or the StateRecordError it raises."""
    try:
        return share_state.share_value_view(share_state.decode_value(record_type, data))
    except StateRecordError as error:
        return error


def _damaged(data: bytes, how: str, at: int, byte: int) -> bytes:
    at %= len(data) + 1
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([byte]) + data[at + 1:] if at < len(data) else data
    if how == "insert":
        return data[:at] + bytes([byte]) + data[at:]
    return data[:at] + data[at + 1:]  # delete a byte


@pytest.mark.parametrize(("value_type", "record_type"), SHARE_VALUES, ids=["snapshot", "update"])
def test_fast_reader_agrees_with_the_generic_decoder_on_any_value_damaged_or_not(value_type, record_type):
    """Whenever the fast reader answers, the generic decoder decodes the same bytes to the same
    values; when it does not (None), the generic decoder decides. Damage of every kind included."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(entities(value_type), st.lists(st.tuples(st.sampled_from(["truncate", "flip", "insert", "delete"]),
                                                    st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
    def agree(value, damage):
        data = share_state.encode_value(value)
        for how, at, byte in damage:
            data = _damaged(data, how, at, byte)
        fast = share_state.read_share_value(record_type, data)
        generic = _generic_view(record_type, data)
        if fast is not None:
            assert fast == generic
        elif not damage and all(len((b.in_progress_member_id or "").encode()) < 127 for b in value.state_batches):
            raise AssertionError("the fast reader refused a canonical value the proxy could have written")

    agree()


def test_a_value_whose_state_batches_are_null_is_a_state_record_error():
    """Found by the property test above: one flipped byte made the batch array null, which the
    generic decoder read as None and the view then failed on with a TypeError -- replay skips a
    StateRecordError but would have stopped on that."""
    value = ShareSnapshotValue(snapshot_epoch=i32(0), state_epoch=i32(0), leader_epoch=i32(0), start_offset=i64(0))
    data = bytearray(share_state.encode_value(value))
    data[-2] = 0  # the batch count (compact array: count + 1) before the empty tagged fields
    with pytest.raises(StateRecordError, match="not nullable"):
        share_state.decode_value(RecordType.SHARE_SNAPSHOT, bytes(data))


def test_fast_reader_reads_what_the_proxy_writes_including_every_extension_tag():
    batch = ShareSnapshotValue.StateBatch
    value = ShareSnapshotValue(
        snapshot_epoch=i32(7), state_epoch=i32(2), leader_epoch=i32(-1), start_offset=i64(100),
        delivery_complete_count=i32(3), create_timestamp=i64(5), write_timestamp=i64(6),
        state_batches=(
            batch(first_offset=i64(100), last_offset=i64(109), delivery_state=i8(2), delivery_count=i16(1)),
            batch(first_offset=i64(110), last_offset=i64(110), delivery_state=i8(5), delivery_count=i16(2),
                  in_progress_start_timestamp=i64(1_000), last_progress_timestamp=i64(2_000),
                  in_progress_member_id="member-ü"),
            batch(first_offset=i64(111), last_offset=i64(111), delivery_state=i8(3), delivery_count=i16(5),
                  archive_reason=i8(2)),
        ),
    )
    view = share_state.read_share_value(RecordType.SHARE_SNAPSHOT, share_state.encode_value(value))
    assert view == share_state.ShareValueView(7, 2, 100, 5, (
        (100, 109, 2, 1, -1, -1, None, 0),
        (110, 110, 5, 2, 1_000, 2_000, "member-ü", 0),
        (111, 111, 3, 5, -1, -1, None, 2),
    ))


@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\x00\x00" + b"\x00" * 30,  # short
    b"\x00\x00" + b"\x00" * 34 + b"\xff\xff\xff\x0f",  # a batch count of 2**28 in 4 bytes
    b"\x00\x00" + b"\x00" * 34 + b"\xff\x7f",  # 16,382 batches announced, none there
    b"\x00\x01" + b"\x00" * 34 + b"\x01\x00",  # value version 1
])
def test_fast_reader_declines_short_hostile_or_unknown_values_without_raising(data):
    assert share_state.read_share_value(RecordType.SHARE_SNAPSHOT, data) is None
    with pytest.raises(StateRecordError):
        share_state.decode_value(RecordType.SHARE_SNAPSHOT, data)


@pytest.mark.parametrize(("value_type", "record_type"), SHARE_VALUES, ids=["snapshot", "update"])
def test_fast_writer_gives_the_generic_encoders_bytes_for_any_value(value_type, record_type):
    """encode_share_value writes what encode_value writes for the same entity (tags, long member
    ids, DeliveryCompleteCount and empty batch lists included), so the fast reader and Kafka read it."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(entities(value_type))
    def same(value):
        fields = {"state_epoch": int(value.state_epoch), "create_timestamp": int(value.create_timestamp),
                  "write_timestamp": int(value.write_timestamp)} if record_type is RecordType.SHARE_SNAPSHOT else {}
        fast = share_state.encode_share_value(
            record_type, snapshot_epoch=int(value.snapshot_epoch), leader_epoch=int(value.leader_epoch),
            start_offset=int(value.start_offset), delivery_complete_count=int(value.delivery_complete_count),
            state_batches=share_state.share_value_view(value).state_batches, **fields)
        assert fast == share_state.encode_value(value)

    same()


def test_fast_writer_refuses_other_record_types():
    with pytest.raises(StateRecordError):
        share_state.encode_share_value(RecordType.PROXY_GROUP_METADATA, snapshot_epoch=0, leader_epoch=0,
                                       start_offset=0, state_batches=())
