"""The fixed inputs of the golden driver (Golden.java), built with our codec's classes."""

from __future__ import annotations

import dataclasses
import datetime
import uuid

from kio.schema.errors import ErrorCode
from kio.static.primitive import Records, i8, i16, i32, i64

from codec.registry import DEFAULT_REGISTRY
from codec.share_state import ShareSnapshotKey, ShareSnapshotValue, ShareUpdateKey, ShareUpdateValue

TOPIC = uuid.UUID(int=1)
OTHER_TOPIC = uuid.UUID(int=2)
GROUP = "golden-group"
SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _make(cls, **values):
    """Build ``cls`` from the values it has fields for (so one description serves v1 and v2)."""
    names = {field.name for field in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in values.items() if name in names})


def _nested(entity_type: type, name: str) -> type:
    module = __import__(entity_type.__module__, fromlist=[name])
    return getattr(module, name)


def share_fetch_request(version: int):
    cls = DEFAULT_REGISTRY.request_type(SHARE_FETCH, version)
    topic, partition, batch, forgotten = (
        _nested(cls, n) for n in ("FetchTopic", "FetchPartition", "AcknowledgementBatch", "ForgottenTopic")
    )
    return _make(
        cls, group_id=GROUP, member_id="member-1", share_session_epoch=i32(3), max_wait=_ms(500), min_bytes=i32(1),
        max_bytes=i32(1_048_576), max_records=i32(500), batch_size=i32(100), share_acquire_mode=i8(1), is_renew_ack=True,
        topics=(
            topic(topic_id=TOPIC, partitions=(
                partition(partition_index=i32(0), acknowledgement_batches=(
                    batch(first_offset=i64(10), last_offset=i64(12), acknowledge_types=(i8(1), i8(2), i8(3))),
                )),
                partition(partition_index=i32(1), acknowledgement_batches=()),
            )),
        ),
        forgotten_topics_data=(forgotten(topic_id=OTHER_TOPIC, partitions=(i32(4), i32(5))),),
    )


def share_fetch_response(version: int, records: bytes):
    cls = DEFAULT_REGISTRY.response_type(SHARE_FETCH, version)
    topic, partition, leader, acquired, endpoint = (
        _nested(cls, n)
        for n in ("ShareFetchableTopicResponse", "PartitionData", "LeaderIdAndEpoch", "AcquiredRecords", "NodeEndpoint")
    )
    return cls(
        throttle_time=_ms(7), error_code=ErrorCode.none, error_message=None, acquisition_lock_timeout=_ms(30_000),
        responses=(
            topic(topic_id=TOPIC, partitions=(
                partition(
                    partition_index=i32(0), error_code=ErrorCode.none, acknowledge_error_code=i16(0),
                    current_leader=leader(leader_id=i32(1), leader_epoch=i32(5)), records=Records(records),
                    acquired_records=(acquired(first_offset=i64(10), last_offset=i64(11), delivery_count=i16(1)),),
                ),
            )),
        ),
        node_endpoints=(endpoint(node_id=i32(1), host="localhost", port=i32(9092), rack=None),),
    )


def share_acknowledge_request(version: int):
    cls = DEFAULT_REGISTRY.request_type(SHARE_ACKNOWLEDGE, version)
    topic, partition, batch = (_nested(cls, n) for n in ("AcknowledgeTopic", "AcknowledgePartition", "AcknowledgementBatch"))
    return _make(
        cls, group_id=GROUP, member_id="member-1", share_session_epoch=i32(4), is_renew_ack=False,
        topics=(
            topic(topic_id=TOPIC, partitions=(
                partition(partition_index=i32(0), acknowledgement_batches=(
                    batch(first_offset=i64(10), last_offset=i64(12), acknowledge_types=(i8(1),)),
                    batch(first_offset=i64(13), last_offset=i64(13), acknowledge_types=(i8(0),)),
                )),
            )),
        ),
    )


def share_acknowledge_response(version: int):
    cls = DEFAULT_REGISTRY.response_type(SHARE_ACKNOWLEDGE, version)
    topic, partition, leader = (_nested(cls, n) for n in ("ShareAcknowledgeTopicResponse", "PartitionData", "LeaderIdAndEpoch"))
    return _make(
        cls, throttle_time=_ms(0), error_code=ErrorCode.none, error_message=None, acquisition_lock_timeout=_ms(15_000),
        responses=(
            topic(topic_id=TOPIC, partitions=(
                partition(partition_index=i32(0), error_code=ErrorCode.none,
                          current_leader=leader(leader_id=i32(1), leader_epoch=i32(5))),
            )),
        ),
        node_endpoints=(),
    )


def share_snapshot(last_state: int = 0, **batch_extras):
    key = ShareSnapshotKey(group_id=GROUP, topic_id=TOPIC, partition=i32(0))
    batch = ShareSnapshotValue.StateBatch
    value = ShareSnapshotValue(
        snapshot_epoch=i32(2), state_epoch=i32(1), leader_epoch=i32(5), start_offset=i64(10),
        delivery_complete_count=i32(3), create_timestamp=i64(1_700_000_000_000), write_timestamp=i64(1_700_000_001_000),
        state_batches=(
            batch(first_offset=i64(10), last_offset=i64(12), delivery_state=i8(2), delivery_count=i16(1)),
            batch(first_offset=i64(13), last_offset=i64(20), delivery_state=i8(last_state), delivery_count=i16(2),
                  **batch_extras),
        ),
    )
    return key, value


def share_update(last_state: int = 4, **batch_extras):
    key = ShareUpdateKey(group_id=GROUP, topic_id=TOPIC, partition=i32(0))
    value = ShareUpdateValue(
        snapshot_epoch=i32(2), leader_epoch=i32(5), start_offset=i64(-1),
        state_batches=(
            ShareUpdateValue.StateBatch(first_offset=i64(13), last_offset=i64(13), delivery_state=i8(last_state),
                                        delivery_count=i16(3), **batch_extras),
        ),
    )
    return key, value
