"""Frame-level streams and connections to upstream brokers.

:class:`FramedStream` is the thin trio adapter around the sans-IO
:class:`codec.framing.FrameDecoder`: receive whole frames, send whole frames.
:func:`open_upstream` connects to a broker with a timeout, and
:class:`UpstreamClient` makes the few requests the proxy issues on its own
behalf (ApiVersions + Metadata for broker discovery).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any

import trio
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from codec.errors import CodecError
from codec.framing import FrameDecoder, encode_frame, encode_size_prefix
from codec.headers import (
    RequestHeader,
    encode_request_header,
    parse_response_header,
    response_header_version,
)
from proxy.config import HostPort
from proxy.errors import UpstreamError

RECEIVE_CHUNK = 256 * 1024
# Below this size a prefix and payload are joined into one send; above it two
# sends are cheaper than copying a large (typically Fetch) response.
_JOIN_LIMIT = 64 * 1024


class FramedStream:
    """Whole Kafka frames over a trio stream. Not safe for concurrent senders."""

    def __init__(self, stream: trio.abc.Stream, max_frame_size: int) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(max_frame_size)

    async def receive_frame(self) -> bytes | None:
        """Next frame payload; None at a clean end of stream.

        Raises :class:`codec.errors.FrameError` on a bad prefix and
        :class:`EOFError` when the peer closes in the middle of a frame.
        """
        while (frame := self._decoder.next_frame()) is None:
            data = await self.stream.receive_some(RECEIVE_CHUNK)
            if not data:
                if self._decoder.buffered:
                    raise EOFError(f"stream closed inside a frame ({self._decoder.buffered} bytes pending)")
                return None
            self._decoder.feed(data)
        return frame

    async def send_frame(self, payload: bytes) -> None:
        if len(payload) <= _JOIN_LIMIT:
            await self.stream.send_all(encode_frame(payload))
        else:
            await self.stream.send_all(encode_size_prefix(len(payload)))
            await self.stream.send_all(payload)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def open_upstream(address: HostPort, *, timeout: float, max_frame_size: int) -> FramedStream:
    """Connect to one broker; :class:`UpstreamError` if it cannot be reached in time."""
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(address.host, address.port)
    except (OSError, trio.TooSlowError) as exc:
        raise UpstreamError(f"cannot connect to upstream {address}: {exc or 'timed out'}") from exc
    return FramedStream(stream, max_frame_size)


async def open_first_upstream(
    addresses: Sequence[HostPort], *, timeout: float, max_frame_size: int
) -> tuple[HostPort, FramedStream]:
    """Connect to the first reachable address of a bootstrap list."""
    errors = []
    for address in addresses:
        try:
            return address, await open_upstream(address, timeout=timeout, max_frame_size=max_frame_size)
        except UpstreamError as exc:
            errors.append(str(exc))
    raise UpstreamError("; ".join(errors) or "no upstream addresses")


def encode_call(request: Any, correlation_id: int, client_id: str) -> bytes:
    """The frame payload (header + body) of a request entity the proxy sends on its own behalf."""
    api_key, api_version = int(request.__api_key__), int(request.__version__)
    buffer = io.BytesIO()
    buffer.write(encode_request_header(RequestHeader(api_key, api_version, correlation_id, client_id)))
    entity_writer(type(request))(buffer, request)
    return buffer.getvalue()


def decode_call_response(frame: bytes, request: Any, correlation_id: int, response_type: type | None = None) -> Any:
    """The response entity of `request` in `frame`; :class:`UpstreamError` if it is not that response."""
    api_key, api_version = int(request.__api_key__), int(request.__version__)
    try:
        header, offset = parse_response_header(frame, response_header_version(api_key, api_version))
        if header.correlation_id != correlation_id:
            raise UpstreamError(f"correlation id {header.correlation_id} != {correlation_id}")
        response, _ = entity_reader(response_type or load_response_schema(api_key, api_version))(frame, offset)
    except UpstreamError:
        raise
    except Exception as exc:
        raise UpstreamError(f"cannot decode upstream response: {exc}") from exc
    return response


class UpstreamClient:
    """Sequential request/response calls the proxy makes itself (not client traffic)."""

    def __init__(self, stream: FramedStream, client_id: str = "kafka-share-proxy") -> None:
        self._stream = stream
        self._client_id = client_id
        self._next_correlation_id = 1

    async def call(self, request: Any, response_type: type | None = None) -> Any:
        """Send `request`, read its response; `response_type` decodes APIs kio does not know
        under their key (the extension RPCs), kio's schema for the key otherwise."""
        correlation_id = self._next_correlation_id
        self._next_correlation_id += 1
        try:
            await self._stream.send_frame(encode_call(request, correlation_id, self._client_id))
            frame = await self._stream.receive_frame()
        except (OSError, trio.BrokenResourceError, EOFError, CodecError) as exc:
            raise UpstreamError(f"upstream call failed: {exc}") from exc
        if frame is None:
            raise UpstreamError("upstream closed the connection")
        return decode_call_response(frame, request, correlation_id, response_type)

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        """Broker's (min, max) per API, asked with ApiVersions v0 (which every broker answers)."""
        request = load_request_schema(18, 0)()
        response = await self.call(request)
        if int(response.error_code):
            raise UpstreamError(f"ApiVersions failed with error {response.error_code}")
        return {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in response.api_keys}

    async def metadata_brokers(self, version: int) -> list[tuple[int, str, int]]:
        """(node_id, host, port) of every broker, from a Metadata request for no topics."""
        schema = load_request_schema(3, version)
        # An empty topic list asks for brokers only (v0 has no "null = all topics");
        # every flag (auto-create, authorized operations) is off.
        request = schema(**{f.name: () if f.name == "topics" else False for f in dataclasses.fields(schema)})
        response = await self.call(request)
        return [(int(b.node_id), b.host, int(b.port)) for b in response.brokers]

    async def aclose(self) -> None:
        await self._stream.aclose()
