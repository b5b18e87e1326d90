"""The hand-written Fetch response reader against kio's reader and encoder."""

from __future__ import annotations

import datetime
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from codec.errors import MessageDecodeError
from codec.fetch import FIRST_VERSION, LAST_VERSION, PartitionFetch, decode_fetch_response, encode_fetch_request
from codec.registry import encode, nested_types

from .strategies import entities

VERSIONS = range(FIRST_VERSION, LAST_VERSION + 1)
ZERO_UUID = uuid.UUID(int=0)  # kio reads it as None; no topic the proxy reads has it


def as_kio_reads_it(response) -> tuple:
    return (int(response.error_code), int(response.session_id), [
        (topic.topic_id or ZERO_UUID, int(p.partition_index), int(p.error_code), int(p.high_watermark), int(p.last_stable_offset),
         int(p.log_start_offset),
         None if p.aborted_transactions is None
         else tuple((int(a.producer_id), int(a.first_offset)) for a in p.aborted_transactions),
         None if p.records is None else bytes(p.records))
        for topic in response.responses for p in topic.partitions])


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=150, deadline=None)
@given(data=st.data(), prefix=st.binary(max_size=8))
def test_every_field_the_reader_uses_is_what_kio_reads(version, data, prefix):
    """Random responses, tagged fields (diverging epoch, current leader, snapshot id, node
    endpoints) included: skipped, never misread."""
    response = data.draw(entities(load_response_schema(1, version)))
    body = prefix + encode(response)
    decoded = decode_fetch_response(body, len(prefix))
    assert (decoded.error_code, decoded.session_id, [tuple(p) for p in decoded.partitions]) == as_kio_reads_it(response)


@pytest.mark.parametrize("version", [FIRST_VERSION, LAST_VERSION])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_cut_or_padded_body_is_refused(version, data):
    body = encode(data.draw(entities(load_response_schema(1, version))))
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(MessageDecodeError):
        decode_fetch_response(body[:cut])
    with pytest.raises(MessageDecodeError, match="after its body"):
        decode_fetch_response(body + b"\x00")


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=100, deadline=None)
@given(
    max_wait_ms=st.integers(0, 2**31 - 1), min_bytes=st.integers(0, 2**31 - 1), max_bytes=st.integers(0, 2**31 - 1),
    isolation_level=st.sampled_from([0, 1]), rack_id=st.text(max_size=150),
    topics=st.lists(st.tuples(st.uuids().filter(lambda u: u.int != 0), st.lists(st.builds(
        PartitionFetch, partition=st.integers(0, 2**31 - 1), current_leader_epoch=st.integers(-1, 2**31 - 1),
        fetch_offset=st.integers(0, 2**63 - 1), partition_max_bytes=st.integers(0, 2**31 - 1)), max_size=3)),
        max_size=3),
)
def test_a_consumers_fetch_request_is_kios_encoding_byte_for_byte(version, max_wait_ms, min_bytes, max_bytes,
                                                                   isolation_level, rack_id, topics):
    schema = load_request_schema(1, version)
    types = nested_types(schema)
    expected = encode(schema(
        max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes, max_bytes=max_bytes,
        isolation_level=isolation_level, session_id=0, session_epoch=-1,
        topics=tuple(types["FetchTopic"](topic_id=topic_id, partitions=tuple(types["FetchPartition"](
            partition=p.partition, current_leader_epoch=p.current_leader_epoch, fetch_offset=p.fetch_offset,
            log_start_offset=-1, partition_max_bytes=p.partition_max_bytes) for p in partitions))
            for topic_id, partitions in topics),
        forgotten_topics_data=(), rack_id=rack_id))
    assert encode_fetch_request(version, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                                isolation_level=isolation_level, topics=topics, rack_id=rack_id) == expected


def test_versions_it_does_not_write_are_refused():
    with pytest.raises(ValueError, match="v12"):
        encode_fetch_request(12, max_wait_ms=0, min_bytes=1, max_bytes=1, isolation_level=0, topics=[])
