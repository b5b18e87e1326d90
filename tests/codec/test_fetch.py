"""The hand-written Fetch response reader against kio's reader and encoder."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema

from codec.errors import MessageDecodeError
from codec.fetch import FIRST_VERSION, LAST_VERSION, decode_fetch_response
from codec.registry import encode

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
