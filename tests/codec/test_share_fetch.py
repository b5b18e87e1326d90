"""The hand-written ShareFetch response encoder against kio's encoding of the same response."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from codec.registry import encode
from codec.share_fetch import (
    NodeEndpointAnswer,
    PartitionAnswer,
    ShareFetchBody,
    encode_share_fetch_response,
    kio_share_fetch_response,
    share_fetch_response_parts,
)
from proxy.share.partition import AcquiredRecords

SERVED = (1, 2)
INT32 = st.integers(-(2**31), 2**31 - 1)
CODES = st.sampled_from([code.value for code in ErrorCode])
TEXT = st.none() | st.text(max_size=200)  # past 127 bytes a compact length takes two bytes


acquired_ranges = st.lists(st.builds(
    AcquiredRecords, first_offset=st.integers(0, 2**63 - 1), last_offset=st.integers(0, 2**63 - 1),
    delivery_count=st.integers(-(2**15), 2**15 - 1)), max_size=4)

partition_answers = st.builds(
    PartitionAnswer, partition_index=INT32, error_code=CODES, error_message=TEXT, acknowledge_error_code=CODES,
    acknowledge_error_message=TEXT, leader_id=INT32, leader_epoch=INT32,
    records=st.binary(max_size=300) | st.binary(max_size=300).map(memoryview),
    acquired=acquired_ranges)

endpoints = st.builds(NodeEndpointAnswer, node_id=INT32, host=st.text(min_size=1, max_size=40), port=INT32,
                      rack=st.none() | st.text(max_size=10))


def kio_encoding(version, header, body):
    return encode(kio_share_fetch_response(version, body), header=header)


@pytest.mark.parametrize("version", SERVED)
@settings(max_examples=150, deadline=None)
@given(
    header=st.binary(max_size=12),
    error_code=CODES,
    error_message=TEXT,
    lock_ms=INT32,
    throttle_ms=st.integers(0, 2**31 - 1),
    topics=st.lists(st.tuples(st.uuids(), st.lists(partition_answers, max_size=3)), max_size=3),
    node_endpoints=st.lists(endpoints, max_size=2),
)
def test_every_response_is_kios_encoding_byte_for_byte(version, header, error_code, error_message, lock_ms,
                                                        throttle_ms, topics, node_endpoints):
    body = ShareFetchBody(error_code, error_message, lock_ms, topics, node_endpoints, throttle_ms)
    expected = kio_encoding(version, header, body)
    assert encode_share_fetch_response(header, body) == expected
    with mock.patch("codec.share_fetch.SCATTER_MIN_BYTES", 100):  # records as pieces of their own too
        assert bytes(share_fetch_response_parts(header, body)) == expected


def test_a_megabyte_of_records_lands_whole_after_a_three_byte_length():
    records = bytes(range(256)) * 4096
    topic = uuid.uuid4()
    view = memoryview(records)
    body = ShareFetchBody(0, None, 30_000, [(topic, [PartitionAnswer(5, 0, None, 0, None, 1, 0, view,
                                                                     [AcquiredRecords(0, 99, 1)])])])
    payload = encode_share_fetch_response(b"", body)
    # throttle 4 + error 2 + message 1 + lock 4 + topics 1 + uuid 16 + partitions 1 + index 4 + error 2
    # + message 1 + ack error 2 + ack message 1 + leader 9, then the records' compact length
    at = 4 + 2 + 1 + 4 + 1 + 16 + 1 + 4 + 2 + 1 + 2 + 1 + 9
    assert payload[at:at + 3] == bytes([0x81, 0x80, 0x40])  # 1 MiB + 1 as an unsigned varint
    assert payload[at + 3:at + 3 + len(records)] == records
    # As pieces, the records are the caller's view itself, not a copy.
    parts = share_fetch_response_parts(b"", body).parts
    assert [part is view for part in parts] == [False, True, False] and bytes(parts[0])[-3:] == bytes([0x81, 0x80, 0x40])
    assert payload == kio_encoding(2, b"", body)
