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
    }
    config = share_state.ProxyShareGroupConfigValue(
        configs=(share_state.ProxyShareGroupConfigValue.Config(name="group.share.record.lock.duration.ms", value="15000"),)
    )
    key = share_state.ProxyShareGroupConfigKey(group_id="g")
    assert decode_record(*encode_record(key, config)).value == config
