"""The topics a Produce request names, read without decoding it.

Produce is the proxy's hot path: its body is mostly record batches the proxy never looks at. To
know whether a request writes to a topic the proxy guards, only the fields in front of the
topic names are read (``TransactionalId``, ``Acks``, ``TimeoutMs``) and, between two names, the
lengths of each partition's records are skipped -- never decoded, never copied.

Layout (``ProduceRequest.json``; kio knows v3-v13, flexible from v9)::

    [v3+] TransactionalId  nullable string
          Acks             int16
          TimeoutMs        int32
          TopicData        [ Name string (v0-12) | TopicId uuid (v13+),
                             PartitionData [ Index int32, Records nullable bytes, <tags v9+> ],
                             <tags v9+> ]
          <tags v9+>

Non-flexible versions use int16 string lengths, int32 array counts and byte lengths; flexible
ones unsigned varints holding length + 1 (0: null). ``names_any`` answers "is any of these topics
named?" and stops at the first hit; ``produce_layout`` (only called when one is) returns every
topic entry's byte span, so a request can be forwarded without some topics, byte for byte.
Malformed input raises :class:`~codec.errors.MessageDecodeError`.
"""

from __future__ import annotations

import struct
from collections.abc import Container
from dataclasses import dataclass

from .bounds import read_uvarint
from .errors import MessageDecodeError
from .headers import is_flexible

PRODUCE_KEY = 0
FIRST_TOPIC_ID_VERSION = 13  # Produce v13 names topics by id (KIP-516)

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INDEX_AND_LENGTH = struct.Struct(">ii")


@dataclass(frozen=True, slots=True)
class ProduceTopic:
    """One TopicData entry: bytes [start, end) of the frame; `key` is the encoded name or the id."""

    start: int
    end: int
    key: bytes
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProduceLayout:
    """Where a Produce request's topic array is: the count at `array_offset`, entries up to `array_end`."""

    version: int
    acks: int
    array_offset: int
    array_end: int
    topics: tuple[ProduceTopic, ...]

    def without(self, frame: bytes, dropped: Container[int]) -> bytes:
        """The frame with the topic entries whose positions are in `dropped` left out."""
        kept = [topic for i, topic in enumerate(self.topics) if i not in dropped]
        count = _encode_count(len(kept), is_flexible(PRODUCE_KEY, self.version))
        return b"".join(
            [frame[: self.array_offset], count, *(frame[t.start : t.end] for t in kept), frame[self.array_end :]]
        )


def names_any(frame: bytes, body_offset: int, version: int, keys: Container[bytes]) -> bool:
    """Whether the Produce request in `frame` names a topic whose encoded name (or id) is in `keys`."""
    return _walk(frame, body_offset, version, keys, collect=False) is _FOUND


def names_any_in_head(head: bytes, body_offset: int, version: int, keys: Container[bytes]) -> bool | None:
    """:func:`names_any` for the first bytes of a Produce request whose rest has not arrived yet;
    None when they do not decide it: a request's second topic is named only after its first
    topic's records, and a name may be cut off. (A malformed request gives None too: it is
    gathered whole and refused as it would have been.)"""
    try:
        return names_any(head, body_offset, version, keys)
    except MessageDecodeError:
        return None


def produce_layout(frame: bytes, body_offset: int, version: int) -> ProduceLayout:
    """Every topic entry of the Produce request in `frame`, with its partition indexes."""
    layout = _walk(frame, body_offset, version, (), collect=True)
    assert layout is not None
    return layout


def _walk(frame: bytes, offset: int, version: int, keys: Container[bytes], *, collect: bool) -> ProduceLayout | None:
    flexible = is_flexible(PRODUCE_KEY, version)
    by_id = version >= FIRST_TOPIC_ID_VERSION
    size = len(frame)
    try:
        if version >= 3:  # TransactionalId
            if flexible:
                length, offset = _uvarint(frame, offset)
                offset += max(length - 1, 0)
            else:
                (length,) = _INT16.unpack_from(frame, offset)
                offset += 2 + max(length, 0)
        (acks,) = _INT16.unpack_from(frame, offset)
        offset += 6  # Acks, TimeoutMs
        array_offset = offset
        count, offset = _count(frame, offset, flexible)
        topics: list[ProduceTopic] = []
        for index in range(count):
            start = offset
            if by_id:
                end = offset + 16
            elif flexible:
                length, offset = _uvarint(frame, offset)
                if length == 0:
                    raise MessageDecodeError("Produce topic name is null")
                end = offset + length - 1
            else:
                (length,) = _INT16.unpack_from(frame, offset)
                if length < 0:
                    raise MessageDecodeError("Produce topic name is null")
                offset += 2
                end = offset + length
            if end > size:
                raise MessageDecodeError("Produce request truncated in a topic name")
            key = frame[offset:end]
            offset = end
            if not collect:
                if key in keys:
                    return _FOUND
                if index == count - 1:
                    return None  # the last topic's partitions need not be walked
            partitions, offset = _skip_partitions(frame, offset, flexible, collect)
            if flexible:
                offset = _skip_tags(frame, offset)
            if offset > size:
                raise MessageDecodeError("Produce request truncated in a topic's records")
            if collect:
                topics.append(ProduceTopic(start, offset, bytes(key), partitions))
    except (struct.error, IndexError) as error:
        raise MessageDecodeError(f"Produce v{version} request truncated: {error}") from None
    if not collect:
        return None
    return ProduceLayout(version, acks, array_offset, offset, tuple(topics))


# Returned by _walk(collect=False) on a hit; only its truthiness matters.
_FOUND = ProduceLayout(0, 0, 0, 0, ())


def _skip_partitions(frame: bytes, offset: int, flexible: bool, collect: bool) -> tuple[tuple[int, ...], int]:
    # The per-partition loop is the whole cost of a many-partition request: kept flat.
    count, offset = _count(frame, offset, flexible)
    indexes: list[int] = []
    if not flexible:
        unpack = _INDEX_AND_LENGTH.unpack_from
        for _ in range(count):
            index, length = unpack(frame, offset)
            if length < -1:
                raise MessageDecodeError(f"Produce records length {length}")
            offset += 8 + length if length > 0 else 8
            if collect:
                indexes.append(index)
        return tuple(indexes), offset
    for _ in range(count):
        if collect:
            indexes.append(_INT32.unpack_from(frame, offset)[0])
        # Records: compact nullable bytes whose length+1 is a varint, 2-3 bytes for real batches.
        low, high = frame[offset + 4], frame[offset + 5]
        if low < 0x80:
            offset += 5 + (low - 1 if low else 0)
        elif high < 0x80:
            offset += 6 + ((low & 0x7F) | (high << 7)) - 1
        elif (top := frame[offset + 6]) < 0x80:
            offset += 7 + ((low & 0x7F) | ((high & 0x7F) << 7) | (top << 14)) - 1
        else:
            length, offset = _uvarint(frame, offset + 4)
            offset += length - 1
        if frame[offset]:  # tagged fields: almost always none (a single 0)
            offset = _skip_tags(frame, offset)
        else:
            offset += 1
    return tuple(indexes), offset


def _count(frame: bytes, offset: int, flexible: bool) -> tuple[int, int]:
    """An array count (null counts as empty)."""
    if flexible:
        value, offset = _uvarint(frame, offset)
        return max(value - 1, 0), offset
    (value,) = _INT32.unpack_from(frame, offset)
    if value < -1:
        raise MessageDecodeError(f"Produce array count {value}")
    return max(value, 0), offset + 4


def _encode_count(count: int, flexible: bool) -> bytes:
    if not flexible:
        return _INT32.pack(count)
    value, out = count + 1, bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uvarint(frame: bytes, offset: int) -> tuple[int, int]:
    return read_uvarint(memoryview(frame), offset, len(frame))


def _skip_tags(frame: bytes, offset: int) -> int:
    count, offset = _uvarint(frame, offset)
    for _ in range(count):
        _, offset = _uvarint(frame, offset)
        size, offset = _uvarint(frame, offset)
        offset += size
        if offset > len(frame):
            raise MessageDecodeError("Produce request truncated in a tagged field")
    return offset

