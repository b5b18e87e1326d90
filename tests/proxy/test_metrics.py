"""Per-API instrumentation: request counts, latency from read to written, error codes by name."""

from __future__ import annotations

import datetime
import uuid

import trio
from kio.schema.errors import ErrorCode
from prometheus_client import REGISTRY

from codec.registry import DEFAULT_REGISTRY, nested_types
from proxy import metrics
from proxy.connection import ServeLocally
from tests.proxy.test_connection import LOCAL_API, METADATA, Harness, request, response


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_api_labels_are_kafka_names_and_unknown_keys_are_other():
    assert metrics.api_name(3) == "Metadata"
    assert metrics.api_name(78) == "ShareFetch"
    assert metrics.api_name(90) == "DescribeShareGroupOffsets"
    assert metrics.api_name(82) == "DescribeShareGroupInFlight"  # the proxy's extension on this key
    assert metrics.api_name(1000) == "other"
    assert metrics.api_name(-1) == "other"
    assert metrics.instruments(1000) is metrics.instruments(5000)  # one bounded "other" series


async def test_forwarded_requests_are_counted_and_timed_until_the_response_is_written():
    before_count = sample("ksp_requests_total", api="Metadata")
    before_timed = sample("ksp_request_seconds_count", api="Metadata")
    before_sum = sample("ksp_request_seconds_sum", api="Metadata")
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, METADATA))
        await h.broker_receive()
        assert sample("ksp_requests_total", api="Metadata") == before_count + 1
        assert sample("ksp_request_seconds_count", api="Metadata") == before_timed  # not answered yet
        await trio.sleep(0.05)  # the broker takes its time (real time: latency uses perf_counter)
        await h.broker.send_frame(response(1))
        await h.client.receive_frame()
        await h.client_side.aclose()
    assert sample("ksp_request_seconds_count", api="Metadata") == before_timed + 1
    assert sample("ksp_request_seconds_sum", api="Metadata") - before_sum >= 0.05


async def test_locally_served_requests_are_counted_and_timed():
    async def local(req, connection) -> bytes:
        return response(req.header.correlation_id, b"local")

    before = sample("ksp_request_seconds_count", api="ShareFetch")
    h = Harness(routes={LOCAL_API: ServeLocally(local)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        for cid in (1, 2):
            await h.client.send_frame(request(cid, LOCAL_API, 1))
        for _ in (1, 2):
            await h.client.receive_frame()
        await h.client_side.aclose()
    assert sample("ksp_request_seconds_count", api="ShareFetch") == before + 2


def _acknowledge_response(top: ErrorCode, partition_codes: list[ErrorCode]):
    response_type = DEFAULT_REGISTRY.response_type(79, 1)
    types = nested_types(response_type)
    partitions = tuple(
        types["PartitionData"](partition_index=i, error_code=code, error_message=None,
                               current_leader=types["LeaderIdAndEpoch"](leader_id=-1, leader_epoch=-1))
        for i, code in enumerate(partition_codes))
    return response_type(throttle_time=datetime.timedelta(0), error_code=top, error_message=None,
                         responses=(types["ShareAcknowledgeTopicResponse"](topic_id=uuid.uuid4(), partitions=partitions),),
                         node_endpoints=())


def test_error_codes_are_counted_top_level_and_per_partition_by_name():
    def errors(name: str) -> float:
        return sample("ksp_response_errors_total", api="ShareAcknowledge", error=name)

    before = {name: errors(name) for name in ("INVALID_RECORD_STATE", "UNKNOWN_MEMBER_ID", "NONE")}
    metrics.count_response_errors(79, _acknowledge_response(
        ErrorCode.none, [ErrorCode.none, ErrorCode.invalid_record_state, ErrorCode.invalid_record_state]))
    metrics.count_response_errors(79, _acknowledge_response(ErrorCode.unknown_member_id, []))
    assert errors("INVALID_RECORD_STATE") == before["INVALID_RECORD_STATE"] + 2
    assert errors("UNKNOWN_MEMBER_ID") == before["UNKNOWN_MEMBER_ID"] + 1
    assert errors("NONE") == before["NONE"] == 0  # success is not an error


def test_error_names_are_kafkas():
    assert metrics.error_name(ErrorCode.unknown_member_id) == "UNKNOWN_MEMBER_ID"
    assert metrics.error_name(56) == "KAFKA_STORAGE_ERROR"
    assert metrics.error_name(31999) == "31999"
