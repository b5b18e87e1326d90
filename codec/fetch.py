"""Fetch responses (v13-v17) read straight from bytes: what the share path's reads need, no more.

Every record a share consumer gets arrived in an upstream Fetch response the proxy decoded. kio's
generic reader builds an entity per partition, per tagged struct and per aborted transaction;
this reads the fields the reader uses and skips the rest (tagged fields: the diverging epoch,
the current leader, the snapshot id, node endpoints). The layout is that of
``FetchResponse.json``, the same for v13 (the first addressed by topic id) to v17;
``tests/codec/test_fetch.py`` checks it against kio's reader on kio-encoded responses.
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

from codec.bounds import read_uvarint
from codec.errors import MessageDecodeError

FIRST_VERSION = 13
LAST_VERSION = 17

_TOP = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error_code, high_watermark, last_stable, log_start
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_INT32 = struct.Struct(">i")


class FetchedPartitionData(NamedTuple):
    topic_id: uuid.UUID
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[tuple[int, int], ...] | None  # (producer_id, first_offset)
    records: bytes | None


class FetchResponseData(NamedTuple):
    error_code: int
    session_id: int
    partitions: list[FetchedPartitionData]


def decode_fetch_response(frame: bytes | bytearray | memoryview, offset: int = 0) -> FetchResponseData:
    """The Fetch response body at `offset` of `frame`; :class:`MessageDecodeError` if malformed."""
    view = memoryview(frame)
    end = len(view)
    try:
        _, error_code, session_id = _TOP.unpack_from(view, offset)
        position = offset + _TOP.size
        topics, position = _array_length(view, position, end)
        partitions: list[FetchedPartitionData] = []
        for _ in range(topics):
            _need(position, 16, end)
            topic_id = uuid.UUID(bytes=bytes(view[position:position + 16]))
            count, position = _array_length(view, position + 16, end)
            for _ in range(count):
                index, code, high_watermark, last_stable, log_start = _PARTITION_HEAD.unpack_from(view, position)
                position += _PARTITION_HEAD.size
                aborted_count, position = read_uvarint(view, position, end)
                aborted = None
                if aborted_count:
                    entries = []
                    for _ in range(aborted_count - 1):
                        entries.append(_ABORTED.unpack_from(view, position))
                        position = _skip_tags(view, position + _ABORTED.size, end)
                    aborted = tuple(entries)
                position += _INT32.size  # preferred_read_replica
                size, position = read_uvarint(view, position, end)
                records = None
                if size:
                    _need(position, size - 1, end)
                    records = bytes(view[position:position + size - 1])
                    position += size - 1
                position = _skip_tags(view, position, end)
                partitions.append(FetchedPartitionData(topic_id, index, code, high_watermark, last_stable,
                                                       log_start, aborted, records))
            position = _skip_tags(view, position, end)
        position = _skip_tags(view, position, end)
    except struct.error as exc:
        raise MessageDecodeError(f"Fetch response runs past the end of the body: {exc}") from None
    if position != end:
        raise MessageDecodeError(f"Fetch response has {end - position} bytes after its body")
    return FetchResponseData(error_code, session_id, partitions)


def _need(position: int, size: int, end: int) -> None:
    if position + size > end:
        raise MessageDecodeError("Fetch response runs past the end of the body")


def _array_length(view: memoryview, position: int, end: int) -> tuple[int, int]:
    """A compact array's length (null read as empty: no Fetch response array is nullable but
    aborted_transactions, which is read apart)."""
    count, position = read_uvarint(view, position, end)
    return max(count - 1, 0), position


def _skip_tags(view: memoryview, position: int, end: int) -> int:
    count, position = read_uvarint(view, position, end)
    for _ in range(count):
        _, position = read_uvarint(view, position, end)  # the tag
        size, position = read_uvarint(view, position, end)
        _need(position, size, end)
        position += size
    return position


__all__ = ["FIRST_VERSION", "LAST_VERSION", "FetchResponseData", "FetchedPartitionData", "decode_fetch_response"]
