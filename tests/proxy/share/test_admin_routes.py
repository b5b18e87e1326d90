"""The admin routes' request/response shapes: encode, decode, merge with the broker's answer."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from codec.headers import RequestHeader, encode_response_header, parse_response_header, response_header_version
from codec.registry import DEFAULT_REGISTRY, decode_entity, encode, nested_types
from proxy.apiversions import FORWARDABLE, ApiVersionTable
from proxy.connection import Request
from proxy.route_split import MergeEntries, constant
from proxy.share.admin_routes import (
    alter_offsets_response,
    delete_offsets_response,
    describe_offsets_response,
    lists_share_groups,
    register_admin_versions,
)
from proxy.share.group_admin import (
    AdminOutcome,
    GroupOffsets,
    PartitionOffset,
    PartitionResult,
    TopicOffsets,
    TopicResult,
)

TOPIC_ID = uuid.UUID("0b6c1f4e-0000-4000-8000-000000000001")


def roundtrip(api_key: int, version: int, response: object) -> object:
    return DEFAULT_REGISTRY.decode_response(api_key, version, encode(response))


def test_share_groups_are_listed_on_the_bootstrap_and_the_lowest_broker_listener_only():
    assert lists_share_groups("bootstrap", {3, 1, 2})
    assert lists_share_groups("broker-1", {3, 1, 2})
    assert not lists_share_groups("broker-2", {3, 1, 2})
    assert not lists_share_groups("broker-1", set())
    assert lists_share_groups("bootstrap", set())


@pytest.mark.parametrize("api_key", [15, 16, 42, 69])
def test_forwarded_versions_of_decoded_group_apis_are_ones_the_proxy_decodes(api_key):
    forwarded = FORWARDABLE[api_key]
    if DEFAULT_REGISTRY.serves(api_key):
        low, high = DEFAULT_REGISTRY.supported_versions(api_key)
        assert low <= forwarded.min_version and forwarded.max_version <= high
    for version in range(forwarded.min_version, forwarded.max_version + 1):
        load_response_schema(api_key, version)  # decodable (kio) for the merge transforms


def test_offsets_apis_are_advertised_whatever_the_broker_offers():
    table = ApiVersionTable()
    register_admin_versions(table)
    advertised = {key: (low, high) for key, low, high in table.narrow([(18, 0, 3)])}
    assert advertised[90] == (0, 1) and advertised[91] == (0, 0) and advertised[92] == (0, 0)


def test_describe_offsets_response_v1_carries_lag_v0_does_not():
    groups = [GroupOffsets("g", (
        TopicOffsets("orders", TOPIC_ID, (PartitionOffset(0, 5, 2, 7), PartitionOffset(1))),
    ))]
    v1 = roundtrip(90, 1, describe_offsets_response(1, groups))
    (group,) = v1.groups
    assert (group.group_id, group.error_code) == ("g", ErrorCode.none)
    assert [(p.partition_index, p.start_offset, p.leader_epoch, p.lag) for p in group.topics[0].partitions] == [
        (0, 5, 2, 7), (1, -1, 0, -1)]
    v0 = roundtrip(90, 0, describe_offsets_response(0, groups))
    assert not hasattr(v0.groups[0].topics[0].partitions[0], "lag")
    assert v0.groups[0].topics[0].topic_id == TOPIC_ID


def test_alter_and_delete_offsets_responses_carry_group_and_topic_errors():
    refused = roundtrip(91, 0, alter_offsets_response(0, AdminOutcome(ErrorCode.non_empty_group, "The group is not empty.")))
    assert (refused.error_code, refused.error_message, refused.responses) == (
        ErrorCode.non_empty_group, "The group is not empty.", ())
    altered = roundtrip(91, 0, alter_offsets_response(0, AdminOutcome(topics=(
        TopicResult("orders", TOPIC_ID, (PartitionResult(0), PartitionResult(9, ErrorCode.unknown_topic_or_partition))),
    ))))
    assert [(p.partition_index, p.error_code) for p in altered.responses[0].partitions] == [
        (0, ErrorCode.none), (9, ErrorCode.unknown_topic_or_partition)]
    deleted = roundtrip(92, 0, delete_offsets_response(0, AdminOutcome(topics=(
        TopicResult("orders", TOPIC_ID), TopicResult("gone", uuid.UUID(int=0), error=ErrorCode.unknown_topic_or_partition,
                                                     message="x")))))
    assert [(t.topic_name, t.error_code) for t in deleted.responses] == [
        ("orders", ErrorCode.none), ("gone", ErrorCode.unknown_topic_or_partition)]


async def test_merge_puts_the_proxys_entries_in_request_order():
    version = 6
    response_type = DEFAULT_REGISTRY.response_type(15, version)
    group_type = nested_types(response_type)["DescribedGroup"]

    def described(group_id: str, code: ErrorCode) -> object:
        return group_type(error_code=code, error_message=None, group_id=group_id, group_state="Dead",
                          protocol_type="", protocol_data="", members=())

    upstream = response_type(throttle_time=datetime.timedelta(0), groups=(described("b", ErrorCode.group_id_not_found),))
    header_version = response_header_version(15, version)
    payload = encode_response_header(7, header_version) + encode(upstream)
    request = Request(RequestHeader(15, version, 7, "t"), b"", 0)

    merged = await MergeEntries("groups", constant([described("a", ErrorCode.group_id_not_found)]),
                                order=("a", "b"))(request, payload)

    header, offset = parse_response_header(merged, header_version)
    assert header.correlation_id == 7
    body = decode_entity(response_type, memoryview(merged)[offset:])
    assert [g.group_id for g in body.groups] == ["a", "b"]
