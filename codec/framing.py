"""Kafka's size-prefixed framing, sans-IO.

Every Kafka request and response travels as a frame: a signed big-endian int32
length followed by that many bytes. :class:`FrameDecoder` takes bytes as they
arrive (``feed``) and hands out whole frames (``next_frame``), or ``None`` while
it needs more data, in the style of h11's ``receive_data`` / ``next_event``.
It never does I/O and never allocates on the word of a length field: a hostile
prefix is rejected as soon as its four bytes are seen, before anything is
buffered for it.
"""

from __future__ import annotations

from codec.errors import FrameError

SIZE_PREFIX_BYTES = 4

# Compact the buffer only once this much consumed data sits at its front, so that
# many small frames in one read do not each pay for a memmove.
_COMPACT_THRESHOLD = 64 * 1024


def encode_frame(payload: bytes) -> bytes:
    """Return ``payload`` with its int32 size prefix."""
    return len(payload).to_bytes(SIZE_PREFIX_BYTES, "big", signed=True) + payload


def encode_size_prefix(size: int) -> bytes:
    """Return just the int32 prefix for a payload of ``size`` bytes (for scatter writes)."""
    return size.to_bytes(SIZE_PREFIX_BYTES, "big", signed=True)


class FrameDecoder:
    """Turns a byte stream into frames; raises :class:`FrameError` on a bad prefix.

    After a :class:`FrameError` the stream cannot be re-synchronised: the caller
    must drop the connection. The decoder stays in the failed state and raises
    again on every call.
    """

    __slots__ = ("max_frame_size", "_buffer", "_start", "_error")

    def __init__(self, max_frame_size: int) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._start = 0
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buffer) - self._start

    def feed(self, data: bytes) -> None:
        """Append bytes received from the peer."""
        if self._error is not None:
            raise self._error
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """Return the next complete frame payload (without its prefix), or ``None`` if more data is needed."""
        if self._error is not None:
            raise self._error
        available = len(self._buffer) - self._start
        if available < SIZE_PREFIX_BYTES:
            return None
        start = self._start
        size = int.from_bytes(self._buffer[start : start + SIZE_PREFIX_BYTES], "big", signed=True)
        if size < 0 or size > self.max_frame_size:
            self._error = FrameError(
                f"frame size {size} outside the allowed range 0..{self.max_frame_size}"
            )
            raise self._error
        if available - SIZE_PREFIX_BYTES < size:
            return None
        payload_start = start + SIZE_PREFIX_BYTES
        # One copy straight out of the buffer (slicing the bytearray first would copy twice).
        with memoryview(self._buffer) as view:
            frame = bytes(view[payload_start : payload_start + size])
        self._start = payload_start + size
        self._compact()
        return frame

    def _compact(self) -> None:
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        elif self._start >= _COMPACT_THRESHOLD:
            del self._buffer[: self._start]
            self._start = 0
