"""ShareFetch responses written straight to bytes: the share path's hot encoder.

A ShareFetch response is the proxy's most frequent answer and carries the records, so it is
written here field by field instead of through kio's generic entity walk: no entity objects
are built, and records of ``SCATTER_MIN_BYTES`` or more are not copied at all -- they stay
separate pieces of a :class:`~codec.framing.ScatteredPayload`, written to the socket with the
rest in one scatter write. The layout is that of
``ShareFetchResponse.json`` for the flexible versions the proxy serves (1 and 2 are the same);
``tests/codec/test_share_fetch.py`` checks it byte for byte against kio's encoding of the same
response (:func:`kio_share_fetch_response`, the form the tests read), so kio stays the
specification.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from codec.framing import ScatteredPayload
from codec.registry import nested_types
from codec.varint import write_compact_string, write_uvarint

# Records at least this large go out as a piece of their own; smaller ones are copied in with the
# fields around them (one more iovec costs more than copying a few KiB).
SCATTER_MIN_BYTES = 64 * 1024

_TOP = struct.Struct(">ih")  # throttle_time_ms, error_code
_INT32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ih")  # partition_index, error_code
_INT16 = struct.Struct(">h")
_LEADER = struct.Struct(">iib")  # leader_id, leader_epoch, no tagged fields
_ACQUIRED = struct.Struct(">qqhb")  # first_offset, last_offset, delivery_count, no tagged fields
_NO_TAGS = b"\x00"


class AcquiredRange(Protocol):
    first_offset: int
    last_offset: int
    delivery_count: int


class PartitionAnswer(NamedTuple):
    """One ``PartitionData`` entry; codes are plain ints."""

    partition_index: int
    error_code: int
    error_message: str | None
    acknowledge_error_code: int
    acknowledge_error_message: str | None
    leader_id: int
    leader_epoch: int
    records: bytes | memoryview  # never null: kio writes none either
    acquired: Sequence[AcquiredRange]


class NodeEndpointAnswer(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None


class ShareFetchBody(NamedTuple):
    """What a ShareFetch response says; codes are plain ints."""

    error_code: int
    error_message: str | None
    lock_ms: int
    topics: Sequence[tuple[uuid.UUID, Sequence[PartitionAnswer]]]  # by topic, in response order
    node_endpoints: Sequence[NodeEndpointAnswer] = ()
    throttle_ms: int = 0


def share_fetch_response_parts(header: bytes, body: ShareFetchBody) -> ScatteredPayload:
    """The frame payload in pieces: `header` (the response header's bytes) then `body`."""
    error_code, error_message, lock_ms, topics, node_endpoints, throttle_ms = body
    pieces: list[bytes | memoryview] = []  # runs of small fields joined, and large records as they are
    run: list[bytes | memoryview] = [header, _TOP.pack(throttle_ms, error_code), write_compact_string(error_message),
                                       _INT32.pack(lock_ms), write_uvarint(len(topics) + 1)]
    append = run.append
    for topic_id, partitions in topics:
        append(topic_id.bytes)
        append(write_uvarint(len(partitions) + 1))
        for answer in partitions:
            append(_PARTITION_HEAD.pack(answer.partition_index, answer.error_code))
            append(write_compact_string(answer.error_message))
            append(_INT16.pack(answer.acknowledge_error_code))
            append(write_compact_string(answer.acknowledge_error_message))
            append(_LEADER.pack(answer.leader_id, answer.leader_epoch, 0))
            records = answer.records
            append(write_uvarint(len(records) + 1))
            if len(records) >= SCATTER_MIN_BYTES:
                pieces.append(b"".join(run))
                pieces.append(records)
                run.clear()
            else:
                append(records)
            append(write_uvarint(len(answer.acquired) + 1))
            for acquired in answer.acquired:
                append(_ACQUIRED.pack(acquired.first_offset, acquired.last_offset, acquired.delivery_count, 0))
            append(_NO_TAGS)
        append(_NO_TAGS)
    append(write_uvarint(len(node_endpoints) + 1))
    for endpoint in node_endpoints:
        append(_INT32.pack(endpoint.node_id))
        append(write_compact_string(endpoint.host))
        append(_INT32.pack(endpoint.port))
        append(write_compact_string(endpoint.rack))
        append(_NO_TAGS)
    append(_NO_TAGS)
    pieces.append(b"".join(run))
    return ScatteredPayload(pieces)


def encode_share_fetch_response(header: bytes, body: ShareFetchBody) -> bytes:
    """The frame payload as one buffer (:func:`share_fetch_response_parts` joined)."""
    return bytes(share_fetch_response_parts(header, body))


def kio_share_fetch_response(version: int, body: ShareFetchBody):
    """The same response as kio's ShareFetch response entity of `version`: what tests read and
    compare the hand-written bytes with, and the way the proxy built it before (codec_bench)."""
    error_code, error_message, lock_ms, topics, node_endpoints, throttle_ms = body
    response_type = load_response_schema(78, version)
    types = nested_types(response_type)
    topic_type, partition_type = types["ShareFetchableTopicResponse"], types["PartitionData"]
    leader_type, acquired_type, endpoint_type = types["LeaderIdAndEpoch"], types["AcquiredRecords"], types["NodeEndpoint"]
    return response_type(
        throttle_time=datetime.timedelta(milliseconds=throttle_ms),
        error_code=ErrorCode(error_code),
        error_message=error_message,
        acquisition_lock_timeout=datetime.timedelta(milliseconds=lock_ms),
        responses=tuple(topic_type(topic_id=topic_id, partitions=tuple(
            partition_type(
                partition_index=a.partition_index, error_code=ErrorCode(a.error_code), error_message=a.error_message,
                acknowledge_error_code=a.acknowledge_error_code, acknowledge_error_message=a.acknowledge_error_message,
                current_leader=leader_type(leader_id=a.leader_id, leader_epoch=a.leader_epoch),
                records=a.records,
                acquired_records=tuple(acquired_type(first_offset=r.first_offset, last_offset=r.last_offset,
                                                     delivery_count=r.delivery_count) for r in a.acquired),
            ) for a in answers)) for topic_id, answers in topics),
        node_endpoints=tuple(endpoint_type(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
                             for e in node_endpoints),
    )


__all__ = ["SCATTER_MIN_BYTES", "AcquiredRange", "NodeEndpointAnswer", "PartitionAnswer", "ShareFetchBody",
           "encode_share_fetch_response",
           "kio_share_fetch_response", "share_fetch_response_parts"]
