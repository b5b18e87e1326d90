"""Fetch requests written and Fetch responses (v13-v17) read straight from bytes: the share
path's upstream reads, without kio's entity walk.

Every record a share consumer gets arrived in an upstream Fetch response the proxy decoded. kio's
generic reader builds an entity per partition, per tagged struct and per aborted transaction;
this reads the fields the reader uses and skips the rest (tagged fields: the diverging epoch,
the current leader, the snapshot id, node endpoints). Requests carry only what a consumer's
Fetch does (no session, no forgotten topics, the replica and epoch fields at their defaults).
The layouts are those of ``FetchRequest.json`` / ``FetchResponse.json`` for v13 (the first
addressed by topic id) to v17; ``tests/codec/test_fetch.py`` checks both against kio.
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

from collections.abc import Sequence

from codec.bounds import advance, read_uvarint, skip_tagged_fields
from codec.errors import MessageDecodeError
from codec.varint import write_uvarint

FIRST_VERSION = 13
LAST_VERSION = 17

_TOP = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error_code, high_watermark, last_stable, log_start
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_INT32 = struct.Struct(">i")
_NO_TAGS = b"\x00"
_EMPTY_ARRAY = b"\x01"  # a compact array's length + 1

# max_wait_ms, min_bytes, max_bytes, isolation_level, session_id, session_epoch
_REQUEST_HEAD = struct.Struct(">iiibii")
# partition, current leader epoch, fetch offset, last fetched epoch, log start offset, max bytes, no tags
_REQUEST_PARTITION = struct.Struct(">iiqiqib")
_CONSUMER_REPLICA_ID = _INT32.pack(-1)  # before v15 the body starts with it; v15 made it a tagged field


class PartitionFetch(NamedTuple):
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    partition_max_bytes: int


def encode_fetch_request(version: int, *, max_wait_ms: int, min_bytes: int, max_bytes: int, isolation_level: int,
                         topics: Sequence[tuple[uuid.UUID, Sequence[PartitionFetch]]], rack_id: str = "") -> bytes:
    """A consumer's sessionless Fetch request body (`version` 13-17)."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Fetch v{version} is not written here (v{FIRST_VERSION}-v{LAST_VERSION} are)")
    parts = [_CONSUMER_REPLICA_ID] if version < 15 else []
    parts.append(_REQUEST_HEAD.pack(max_wait_ms, min_bytes, max_bytes, isolation_level, 0, -1))
    parts.append(write_uvarint(len(topics) + 1))
    for topic_id, partitions in topics:
        parts.append(topic_id.bytes)
        parts.append(write_uvarint(len(partitions) + 1))
        for p in partitions:
            parts.append(_REQUEST_PARTITION.pack(p.partition, p.current_leader_epoch, p.fetch_offset, -1, -1,
                                                 p.partition_max_bytes, 0))
        parts.append(_NO_TAGS)
    parts.append(_EMPTY_ARRAY)  # forgotten_topics_data
    rack = rack_id.encode()
    parts.append(write_uvarint(len(rack) + 1))
    parts.append(rack)
    parts.append(_NO_TAGS)
    return b"".join(parts)


class FetchedPartitionData(NamedTuple):
    topic_id: uuid.UUID
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[tuple[int, int], ...] | None  # (producer_id, first_offset)
    records: memoryview | None  # a view of the frame: nothing copied


class FetchResponseData(NamedTuple):
    error_code: int
    session_id: int
    partitions: list[FetchedPartitionData]


def decode_fetch_response(frame: bytes | bytearray | memoryview, offset: int = 0) -> FetchResponseData:
    """The Fetch response body at `offset` of `frame`; :class:`MessageDecodeError` if malformed.
    Each partition's records are a view of `frame` (keeping it alive; copy what must outlive it)."""
    view = memoryview(frame)
    end = len(view)
    try:
        _, error_code, session_id = _TOP.unpack_from(view, offset)
        position = offset + _TOP.size
        topics, position = _array_length(view, position, end)
        partitions: list[FetchedPartitionData] = []
        for _ in range(topics):
            topic_end = advance(position, 16, end)
            topic_id = uuid.UUID(bytes=bytes(view[position:topic_end]))
            count, position = _array_length(view, topic_end, end)
            for _ in range(count):
                index, code, high_watermark, last_stable, log_start = _PARTITION_HEAD.unpack_from(view, position)
                position += _PARTITION_HEAD.size
                aborted_count, position = read_uvarint(view, position, end)
                aborted = None
                if aborted_count:
                    entries = []
                    for _ in range(aborted_count - 1):
                        entries.append(_ABORTED.unpack_from(view, position))
                        position = skip_tagged_fields(view, position + _ABORTED.size, end)
                    aborted = tuple(entries)
                position += _INT32.size  # preferred_read_replica
                size, position = read_uvarint(view, position, end)
                records = None
                if size:
                    records_end = advance(position, size - 1, end)
                    records = view[position:records_end]
                    position = records_end
                position = skip_tagged_fields(view, position, end)
                partitions.append(FetchedPartitionData(topic_id, index, code, high_watermark, last_stable,
                                                       log_start, aborted, records))
            position = skip_tagged_fields(view, position, end)
        position = skip_tagged_fields(view, position, end)
    except struct.error as exc:
        raise MessageDecodeError(f"Fetch response runs past the end of the body: {exc}") from None
    if position != end:
        raise MessageDecodeError(f"Fetch response has {end - position} bytes after its body")
    return FetchResponseData(error_code, session_id, partitions)


def _array_length(view: memoryview, position: int, end: int) -> tuple[int, int]:
    """A compact array's length (null read as empty: no Fetch response array is nullable but
    aborted_transactions, which is read apart)."""
    count, position = read_uvarint(view, position, end)
    return max(count - 1, 0), position


__all__ = ["FIRST_VERSION", "LAST_VERSION", "FetchResponseData", "FetchedPartitionData", "PartitionFetch",
           "decode_fetch_response", "encode_fetch_request"]
