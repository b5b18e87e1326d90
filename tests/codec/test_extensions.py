import dataclasses
import uuid

from kio.schema.share_acknowledge.v2.request import ShareAcknowledgeRequest
from kio.static.primitive import i8, i16, i32, i64

from codec import extensions
from codec.extensions import (
    DescribeShareGroupInFlightRequest,
    DescribeShareGroupInFlightResponse,
    MarkInProgressRequest,
    MarkInProgressResponse,
)
from codec.registry import DEFAULT_REGISTRY, encode


def _names(entity_type):
    return [field.name for field in dataclasses.fields(entity_type)]


def test_mark_in_progress_request_has_the_exact_wire_layout():
    request = MarkInProgressRequest(
        group_id="g",
        member_id="m",
        share_session_epoch=i32(1),
        topics=(
            MarkInProgressRequest.ProgressTopic(
                topic_id=uuid.UUID(int=1),
                partitions=(
                    MarkInProgressRequest.ProgressPartition(
                        partition_index=i32(0),
                        progress_batches=(MarkInProgressRequest.ProgressBatch(first_offset=i64(5), last_offset=i64(7)),),
                    ),
                ),
            ),
        ),
    )
    expected = bytes.fromhex(
        "0267" "026d" "00000001"  # group, member (compact strings), session epoch
        "02" + "00" * 15 + "01"  # one topic; topic id
        "02" "00000000"  # one partition; index 0
        "02" "0000000000000005" "0000000000000007" "00"  # one progress batch + its tagged fields
        "00" "00" "00"  # tagged fields of partition, topic, request
    )
    assert encode(request) == expected
    assert DEFAULT_REGISTRY.decode_request(81, 0, expected) == request


def test_mark_in_progress_mirrors_share_acknowledge_v2():
    assert _names(MarkInProgressRequest) == [n for n in _names(ShareAcknowledgeRequest) if n != "is_renew_ack"]
    assert _names(MarkInProgressRequest.ProgressBatch) == ["first_offset", "last_offset"]
    assert MarkInProgressRequest.__flexible__ and MarkInProgressRequest.__version__ == 0
    assert _names(MarkInProgressResponse) == [
        "throttle_time_ms", "error_code", "error_message", "acquisition_lock_timeout_ms", "responses", "node_endpoints",
    ]


def test_describe_in_flight_defaults_mean_no_filter():
    request = DescribeShareGroupInFlightRequest(group_id="g")
    assert request.topics is None
    assert request.held_longer_than_ms == -1 and request.progress_staleness_ms == -1
    assert request.states == ()
    assert DEFAULT_REGISTRY.decode_request(82, 0, encode(request)) == request


def test_describe_in_flight_response_carries_per_range_state_and_times():
    records = DescribeShareGroupInFlightResponse.InFlightRecords(
        first_offset=i64(10), last_offset=i64(19), state=i8(5), delivery_count=i16(2), member_id="member-1",
        acquired_timestamp=i64(1_000), in_progress_start_timestamp=i64(1_500), last_progress_timestamp=i64(2_000),
        lock_deadline_timestamp=i64(32_000), stale=True,
    )
    response = DescribeShareGroupInFlightResponse(
        group_id="g",
        topics=(
            DescribeShareGroupInFlightResponse.InFlightTopic(
                topic_id=uuid.uuid4(), topic_name="t",
                partitions=(
                    DescribeShareGroupInFlightResponse.InFlightPartition(
                        partition_index=i32(3), start_offset=i64(10), end_offset=i64(20), records=(records,)
                    ),
                ),
            ),
        ),
    )
    assert DEFAULT_REGISTRY.decode_response(82, 0, encode(response)) == response
    assert DEFAULT_REGISTRY.decode_response(82, 0, encode(response)).topics[0].partitions[0].records[0].stale is True
    assert DescribeShareGroupInFlightResponse.InFlightRecords(
        first_offset=i64(0), last_offset=i64(0), state=i8(1), delivery_count=i16(1), member_id=None).stale is False


def test_moving_the_keys_changes_only_the_api_key():
    moved = extensions.mark_in_progress(10081)
    assert moved.api_key == 10081 and moved.requests[0].__api_key__ == 10081
    assert _names(moved.requests[0]) == _names(MarkInProgressRequest)
    assert extensions.mark_in_progress() is extensions.mark_in_progress(81)
    assert 81 in extensions.KAFKA_APIS_SHADOWED
