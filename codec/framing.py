"""Kafka's size-prefixed framing, sans-IO.

Every Kafka request and response travels as a frame: a signed big-endian int32
length followed by that many bytes. :class:`FrameDecoder` takes bytes as they
arrive (``feed``) and hands out whole frames (``next_frame``), or ``None`` while
it needs more data, in the style of h11's ``receive_data`` / ``next_event``.
It never does I/O and never allocates on the word of a length field: a hostile
prefix is rejected as soon as its four bytes are seen, before anything is
buffered for it.

Copies (the proxy forwards every byte, so they are its cost per byte): a fed
chunk is kept as it is, not appended to a buffer; a frame wholly inside it is
copied out once. A frame that is not complete yet is gathered as the pieces
that arrive and joined once when its last byte comes -- one copy whatever its
size, and no buffer that grows by reallocation and is freed again per frame
(on this project's VMs, growing a bytearray to a 1 MB frame and freeing it cost
about 1.5 ms per frame in page faults: more than everything else the proxy
does with it). :attr:`FrameDecoder.missing` tells the reader how much to ask the
socket for, so a large frame comes in a few large reads.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from codec.errors import FrameError

SIZE_PREFIX_BYTES = 4

_SIZE = struct.Struct(">i")


def encode_frame(payload: bytes) -> bytes:
    """Return ``payload`` with its int32 size prefix."""
    return len(payload).to_bytes(SIZE_PREFIX_BYTES, "big", signed=True) + payload


def encode_size_prefix(size: int) -> bytes:
    """Return just the int32 prefix for a payload of ``size`` bytes (for scatter writes)."""
    return size.to_bytes(SIZE_PREFIX_BYTES, "big", signed=True)


class ScatteredPayload:
    """A frame payload in pieces (bytes, and views of large record bytes held elsewhere), sent
    with one scatter write: the records reach the socket without first being copied into one
    buffer. ``len()`` is its size in bytes; ``bytes()`` joins it."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: Sequence[bytes | memoryview]) -> None:
        self.parts = tuple(parts)
        self.size = sum(memoryview(part).nbytes for part in self.parts)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


class FrameDecoder:
    """Turns a byte stream into frames; raises :class:`FrameError` on a bad prefix.

    After a :class:`FrameError` the stream cannot be re-synchronised: the caller
    must drop the connection. The decoder stays in the failed state and raises
    again on every call.

    ``feed`` keeps a reference to ``bytes`` it is given (immutable, so nothing is
    copied); a mutable buffer is copied first.
    """

    __slots__ = ("max_frame_size", "_data", "_start", "_parts", "_missing", "_received", "_error")

    def __init__(self, max_frame_size: int) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        # Bytes not yet framed: _data[_start:]. Holds whole frames and at most the start of one
        # more only between a feed and the next_frame calls that drain it.
        self._data: bytes | bytearray | memoryview = b""
        self._start = 0
        # The frame in progress (its prefix seen, its payload not complete): the pieces received,
        # the bytes still missing, and how many were received. None: no frame in progress.
        self._parts: list[bytes | memoryview] | None = None
        self._missing = 0
        self._received = 0
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame (a frame in progress counts its prefix)."""
        pending = len(self._data) - self._start
        if self._parts is not None:
            pending += SIZE_PREFIX_BYTES + self._received
        return pending

    @property
    def missing(self) -> int:
        """Bytes still to come of the frame in progress (0 when none is): what to read next."""
        return self._missing

    @property
    def frame_received(self) -> int:
        """Payload bytes received of the frame in progress (0 when none is)."""
        return self._received if self._parts is not None else 0

    def detach_frame(self) -> tuple[bytes, int]:
        """Hand the frame in progress over to be passed on as it arrives (cut-through): returns
        (its payload received so far, the bytes still missing) and forgets it.

        The caller takes those missing bytes from the stream itself, no more, before it feeds this
        decoder again: while a frame is in progress nothing beyond it has been fed (see ``feed``).
        """
        if self._error is not None:
            raise self._error
        if self._parts is None or not self._missing:
            raise ValueError("no incomplete frame in progress")
        head, missing = b"".join(self._parts), self._missing
        self._parts, self._missing, self._received = None, 0, 0
        return head, missing

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer."""
        if self._error is not None:
            raise self._error
        if not data:
            return
        if not isinstance(data, bytes):
            data = bytes(data)  # the caller may reuse its buffer
        if self._missing:
            # The frame in progress takes what it is missing first; only the rest is new data.
            take = min(self._missing, len(data))
            self._parts.append(data if take == len(data) else memoryview(data)[:take])  # type: ignore[union-attr]
            self._missing -= take
            self._received += take
            if take == len(data):
                return
            data = memoryview(data)[take:]
        if self._start == len(self._data):
            self._data, self._start = data, 0
        else:
            # Only when fed twice without draining (or after a split prefix): join what is left.
            rest = bytearray(memoryview(self._data)[self._start :])
            rest += data
            self._data, self._start = rest, 0

    def next_frame(self) -> bytes | None:
        """Return the next complete frame payload (without its prefix), or ``None`` if more data is needed."""
        if self._error is not None:
            raise self._error
        if self._parts is not None:
            if self._missing:
                return None
            parts, self._parts, self._received = self._parts, None, 0
            # The one copy of a frame that came in pieces.
            return b"".join(parts)
        data, start = self._data, self._start
        available = len(data) - start
        if available < SIZE_PREFIX_BYTES:
            if start:
                # Keep the few bytes of a split prefix, not the whole chunk they came in.
                self._data, self._start = bytes(memoryview(data)[start:]), 0
            return None
        (size,) = _SIZE.unpack_from(data, start)
        if size < 0 or size > self.max_frame_size:
            self._error = FrameError(
                f"frame size {size} outside the allowed range 0..{self.max_frame_size}"
            )
            raise self._error
        payload_start = start + SIZE_PREFIX_BYTES
        end = payload_start + size
        with memoryview(data) as view:
            if end <= len(data):
                frame = bytes(view[payload_start:end])  # one copy straight out of the chunk
                if end == len(data):
                    self._data, self._start = b"", 0  # do not keep the chunk alive
                else:
                    self._start = end
                return frame
            # Incomplete: the frame goes on in pieces; what arrived of it is copied off the
            # chunk (which may be far larger, holding earlier frames) so the chunk can go.
            partial = bytes(view[payload_start:])
        self._parts = [partial] if partial else []
        self._received = len(partial)
        self._missing = size - len(partial)
        self._data, self._start = b"", 0
        return None
