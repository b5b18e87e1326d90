"""Kafka's unsigned varint writer (compact lengths, tag numbers) and compact string writer, shared
by every encoder in codec/.

Kept free of kio so the event-log codec (and through it the pure engine and Spark workers) can
use it without loading kio's schema index.
"""

from __future__ import annotations

from .errors import CodecError


_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))


def write_uvarint(value: int) -> bytes:
    """An unsigned varint of at most 32 bits (Kafka's UNSIGNED_VARINT)."""
    if 0 <= value < 0x80:  # most lengths and counts: no loop, no new object
        return _ONE_BYTE[value]
    if not 0 <= value <= 0xFFFFFFFF:
        raise CodecError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_compact_string(text: str | None) -> bytes:
    """A (nullable) COMPACT_STRING: its UTF-8 length + 1 as an unsigned varint, 0 for null."""
    if text is None:
        return b"\x00"
    data = text.encode("utf-8")
    return write_uvarint(len(data) + 1) + data
