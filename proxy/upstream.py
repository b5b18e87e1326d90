"""Frame-level streams and connections to upstream brokers.

:class:`FramedStream` is the thin trio adapter around the sans-IO
:class:`codec.framing.FrameDecoder`: receive whole frames, send whole frames.
:func:`open_upstream` connects to a broker with a timeout -- over TLS when the
upstream security says so (SNI and verification against the broker's host name),
and, for the proxy's own connections (``authenticate=True``), authenticated with
the proxy's service credentials (SaslHandshake, then SaslAuthenticate frames
carrying PLAIN or SCRAM from :mod:`codec.sasl`). Clients' pass-through connections
are never authenticated here: a client's own SASL frames pass through byte for byte.
:class:`UpstreamClient` makes the few requests the proxy issues on its own
behalf (ApiVersions + Metadata for broker discovery).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import io
import os
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import trio
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from codec.errors import CodecError, SaslError
from codec.framing import FrameDecoder, ScatteredPayload, encode_size_prefix
from codec.headers import (
    RequestHeader,
    encode_request_header,
    parse_response_header,
    response_header_version,
)
from codec.sasl import ClientLogin
from proxy.config import HostPort
from proxy.errors import UpstreamAuthenticationError, UpstreamError, UpstreamTlsError
from proxy.security import ServiceCredentials, UpstreamSecurity

RECEIVE_CHUNK = 256 * 1024
# While a frame is in progress, one read asks for what it still misses, up to this: a large
# Produce request or Fetch response comes in a few reads, not one per RECEIVE_CHUNK. It is
# also what one read may allocate before the bytes arrive (a hostile prefix costs no more).
MAX_RECEIVE = 1024 * 1024
# Over TLS (no scatter write): below this size a prefix and payload are joined into one send;
# above it two sends are cheaper than copying a large (typically Fetch) response.
_JOIN_LIMIT = 64 * 1024
# trio's errnos for "this socket was already closed" (trio._highlevel_socket).
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})
# Unsent bytes a TCP socket may queue before it stops taking more (TCP_NOTSENT_LOWAT). trio
# sets 16 KiB, for latency; a proxy forwarding 1 MB frames to a reader slower than the wire
# then wrote one frame in ~20 pieces, each a wait and a trip round the loop (measured: a 3 MB
# frame to a reader parsing as it reads, 21 writes and 1.3 ms CPU at 16 KiB, 9 writes and
# 0.85 ms at 1 MiB). The kernel's own limit (the socket's send buffer) still applies.
NOTSENT_LOWAT = 1024 * 1024
# The same towards a broker, larger. A broker reads a connection's next request only once it has
# answered the one before, into a receive buffer of 100 KB by default (socket.receive.buffer.bytes);
# the rest of a large Produce waits in the sender's socket meanwhile. With 1 MiB the proxy could
# not leave a whole ~1 MB request there: it waited for the broker to read, woke and pushed the rest
# -- a wait and a wake-up per request (strace of a 1-connection produce run) -- where a producer
# talking to the broker directly (no limit; its send buffer autotuned up to net.ipv4.tcp_wmem's
# 4 MiB) leaves the kernel to it. 4 MiB lets a few requests' bytes queue in the kernel as they do
# for that producer, and the proxy goes on with the next request.
UPSTREAM_NOTSENT_LOWAT = 4 * 1024 * 1024


class StreamedFrame:
    """A frame handed over while it arrives (cut-through): its size, the payload received so far
    (``head``, at least the correlation id), and :meth:`receive_more` for the rest, which must be
    read to the end before the stream it came from is read again."""

    __slots__ = ("size", "head", "missing", "_stream")

    def __init__(self, size: int, head: bytes, missing: int, stream: trio.abc.Stream) -> None:
        self.size, self.head, self.missing, self._stream = size, head, missing, stream

    async def receive_more(self, max_bytes: int = MAX_RECEIVE) -> bytes:
        """The next piece of the payload, at most `max_bytes`; b"" once all of it was received.

        Raises :class:`EOFError` when the peer closes before the end of the frame."""
        if not self.missing:
            return b""
        data = await self._stream.receive_some(min(self.missing, max_bytes, MAX_RECEIVE))
        if not data:
            raise EOFError(f"stream closed inside a frame ({self.missing} bytes missing)")
        self.missing -= len(data)
        return data

    async def splice_to(self, target: FramedStream, pipe: SplicePipe) -> None:
        """Move the rest of the payload to `target` inside the kernel: socket -> `pipe` -> socket
        with splice(2), so its bytes are neither copied into the process nor out of it (only
        where :func:`can_splice` says so).

        Raises :class:`EOFError` or :class:`OSError` when the source fails (the peer closes
        before the end of the frame), and trio's BrokenResourceError / ClosedResourceError when
        the target does, as :meth:`FramedStream.send_bytes` would.
        """
        source, sink = self._stream.socket, target._socket
        source_fd, sink_fd = source.fileno(), sink.fileno()
        held = 0  # bytes in the pipe, taken from the source, not yet given to the target
        moves = 0
        while self.missing or held:
            moved = False
            if self.missing and held < pipe.capacity:
                try:
                    taken = os.splice(source_fd, pipe.write_fd, min(self.missing, pipe.capacity - held),
                                      flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    pass
                else:
                    if not taken:
                        raise EOFError(f"stream closed inside a frame ({self.missing} bytes missing)")
                    self.missing -= taken
                    held += taken
                    moved = True
            if held:
                try:
                    held -= os.splice(pipe.read_fd, sink_fd, held,
                                      flags=_SPLICE_FLAGS | (os.SPLICE_F_MORE if self.missing else 0))
                    moved = True
                except BlockingIOError:
                    pass
                except OSError as exc:
                    if exc.errno in _CLOSED_ERRNOS:
                        raise trio.ClosedResourceError("this socket was already closed") from None
                    raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            if moved:
                moves += 1
                if moves % _SPLICES_PER_YIELD == 0:
                    await trio.lowlevel.checkpoint()  # a fast pair of sockets must not hold the loop
            elif held:
                # The target is the slower side: the source's bytes wait in its socket meanwhile.
                await trio.lowlevel.wait_writable(sink)
            else:
                await trio.lowlevel.wait_readable(source)


#: splice(2) flags: move pages rather than copy where the kernel can, and never block on the
#: pipe (the sockets are non-blocking already, as trio keeps them).
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
#: A spliced frame goes through the scheduler at least once per this many moves without a wait.
_SPLICES_PER_YIELD = 16
#: What a splice pipe asks the kernel to hold (F_SETPIPE_SZ; capped by fs.pipe-max-size, 1 MiB by
#: default, and refused past fs.pipe-user-pages-soft, when the kernel's default size stays): as
#: much as one read of a frame in progress.
SPLICE_PIPE_BYTES = MAX_RECEIVE


class SplicePipe:
    """A kernel pipe through which one streamed frame is spliced (Linux): two file descriptors and
    up to :data:`SPLICE_PIPE_BYTES` of kernel buffer. A context manager: closed when the frame
    has passed (or failed)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # above pipe-max-size: the kernel's default size stays
            fcntl.fcntl(self.write_fd, fcntl.F_SETPIPE_SZ, SPLICE_PIPE_BYTES)
        self.capacity: int = fcntl.fcntl(self.write_fd, fcntl.F_GETPIPE_SZ)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> SplicePipe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def can_splice(source: FramedStream, target: FramedStream) -> bool:
    """Whether frames from `source` can be spliced to `target`: both plain sockets (no TLS, whose
    bytes the process must en- or decrypt) on a system with splice(2)."""
    return (hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
            and source._socket is not None and target._socket is not None)


class FramedStream:
    """Whole Kafka frames over a trio stream. Not safe for concurrent senders.

    On a plain TCP stream a frame goes out as one scatter write (``sendmsg`` of its prefix and
    payload: one system call, one TCP segment train, no copy); over TLS it takes the stream's
    ``send_all``.
    """

    def __init__(self, stream: trio.abc.Stream, max_frame_size: int, *, notsent_lowat: int = NOTSENT_LOWAT) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(max_frame_size)
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        if self._socket is not None and hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):  # not a TCP socket (a Unix socket in tests)
                self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, notsent_lowat)
        # trio time after which the broker ends this connection's SASL session (KIP-368
        # connections.max.reauth.ms); None: no limit. Pools stop reusing a connection before then.
        self.session_expires_at: float | None = None

    async def receive_frame(self, stream_if: Callable[[int], bool] | None = None) -> bytes | StreamedFrame | None:
        """Next frame payload; None at a clean end of stream.

        ``stream_if(size)``: asked once a frame is known to be incomplete after a read (its first
        4 payload bytes, the correlation id, received); if it says yes the frame is returned as a
        :class:`StreamedFrame` to be passed on as it arrives, instead of gathered whole.

        Raises :class:`codec.errors.FrameError` on a bad prefix and
        :class:`EOFError` when the peer closes in the middle of a frame.
        """
        decoder = self._decoder
        while (frame := decoder.next_frame()) is None:
            if (stream_if is not None and decoder.missing and decoder.frame_received >= 4
                    and stream_if(decoder.frame_received + decoder.missing)):
                head, missing = decoder.detach_frame()
                return StreamedFrame(len(head) + missing, head, missing, self.stream)
            data = await self.stream.receive_some(max(RECEIVE_CHUNK, min(decoder.missing, MAX_RECEIVE)))
            if not data:
                if decoder.buffered:
                    raise EOFError(f"stream closed inside a frame ({decoder.buffered} bytes pending)")
                return None
            decoder.feed(data)
        return frame

    async def send_frame(self, payload: bytes | ScatteredPayload) -> None:
        prefix = encode_size_prefix(len(payload))
        parts = payload.parts if isinstance(payload, ScatteredPayload) else (payload,)
        if self._socket is not None:
            await _send_scattered(self._socket, prefix, *parts)
        elif len(payload) <= _JOIN_LIMIT:
            await self.stream.send_all(b"".join((prefix, *parts)))
        else:
            await self.stream.send_all(prefix)
            for part in parts:
                await self.stream.send_all(part)

    async def send_bytes(self, *buffers: bytes) -> None:
        """Raw bytes, in order (a streamed frame's prefix and pieces): no framing added."""
        if self._socket is not None:
            await _send_scattered(self._socket, *buffers)
        else:
            for buffer in buffers:
                await self.stream.send_all(buffer)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _send_scattered(sock: trio.socket.SocketType, *buffers: bytes) -> None:
    """All of `buffers` in order with one writev (sendmsg) whenever the socket takes them at once.

    Unlike trio's socket methods, a write the kernel takes at once does not also go through the
    scheduler (trio yields after every successful send: per forwarded frame that was two trips
    round the run loop, a measurable part of a small request's cost); only a full socket waits.
    Errors as :meth:`trio.SocketStream.send_all` raises them: ClosedResourceError for a closed
    socket, BrokenResourceError for any other OSError.
    """
    views = [memoryview(buffer) for buffer in buffers]
    try:
        while True:
            try:
                sent = os.writev(sock.fileno(), views)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            while views and sent >= len(views[0]):
                sent -= len(views.pop(0))
            if not views:
                return
            if sent:
                views[0] = views[0][sent:]
    except OSError as exc:
        if exc.errno in _CLOSED_ERRNOS:
            raise trio.ClosedResourceError("this socket was already closed") from None
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


async def open_upstream(
    address: HostPort,
    *,
    timeout: float,
    max_frame_size: int,
    security: UpstreamSecurity | None = None,
    authenticate: bool = False,
) -> FramedStream:
    """Connect to one broker: TCP, then TLS when `security` has a context (the handshake within
    the same `timeout`), then, with `authenticate`, SASL with the service credentials.

    Raises :class:`UpstreamError` if the broker cannot be reached in time,
    :class:`UpstreamTlsError` if the TLS handshake fails (certificate, host name, protocol),
    :class:`UpstreamAuthenticationError` if the broker refuses the credentials.
    """
    context = security.ssl_context if security is not None else None
    stream: trio.abc.Stream | None = None
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(address.host, address.port)
            if context is not None:
                stream = await _tls_handshake(stream, context, address)
    except (OSError, trio.TooSlowError) as exc:
        if stream is not None:
            await trio.aclose_forcefully(stream)
        raise UpstreamError(f"cannot connect to upstream {address}: {exc or 'timed out'}") from exc
    framed = FramedStream(stream, max_frame_size, notsent_lowat=UPSTREAM_NOTSENT_LOWAT)
    if authenticate and security is not None and security.sasl is not None:
        try:
            with trio.fail_after(timeout):
                lifetime_ms = await sasl_authenticate(framed, security.sasl, address)
            if lifetime_ms > 0:
                # Re-authentication is not implemented: retire the connection well before the
                # broker would close it (at 85% of the session lifetime).
                framed.session_expires_at = trio.current_time() + 0.85 * lifetime_ms / 1000
        except trio.TooSlowError:
            await trio.aclose_forcefully(framed.stream)
            raise UpstreamError(f"upstream {address}: SASL authentication as user "
                                f"'{security.sasl.username}' timed out") from None
        except BaseException:
            await trio.aclose_forcefully(framed.stream)
            raise
    return framed


async def _tls_handshake(stream: trio.abc.Stream, context: ssl.SSLContext, address: HostPort) -> trio.SSLStream:
    # https_compatible: a broker that closes without close_notify ends the stream like EOF
    # (Kafka frames are length-prefixed, so a truncation cannot go unnoticed).
    tls = trio.SSLStream(stream, context, server_hostname=address.host, https_compatible=True)
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(stream)
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLError) and not isinstance(cause, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            raise UpstreamTlsError(f"TLS handshake with upstream {address} failed: {tls_failure_reason(cause)}") from None
        # The broker closed the connection mid-handshake: a restart, or a listener that does not
        # speak TLS. Not conclusive, so not a TLS error: retried like an unreachable broker.
        raise UpstreamError(f"upstream {address} closed the connection during the TLS handshake "
                            f"({cause or exc}; is it a TLS listener?)") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls


def tls_failure_reason(error: ssl.SSLError) -> str:
    """A TLS failure as a person reads it, e.g. ``certificate verify failed: unable to get local
    issuer certificate`` or ``certificate verify failed: hostname mismatch, certificate is not
    valid for 'x'``."""
    if isinstance(error, ssl.SSLCertVerificationError):
        detail = (error.verify_message or "").rstrip(".")
        if detail.lower().startswith("hostname mismatch"):
            detail = "hostname mismatch" + detail[len("hostname mismatch"):]
        return f"certificate verify failed: {detail}" if detail else "certificate verify failed"
    reason = error.reason or ""
    text = str(error)
    if "] " in text:
        text = text.split("] ", 1)[1].split(" (_ssl.c", 1)[0]
    return text or reason.lower().replace("_", " ") or type(error).__name__


async def open_first_upstream(
    addresses: Sequence[HostPort],
    *,
    timeout: float,
    max_frame_size: int,
    security: UpstreamSecurity | None = None,
    authenticate: bool = False,
) -> tuple[HostPort, FramedStream]:
    """Connect to the first reachable address of a bootstrap list.

    When none can be used and one of them refused the TLS handshake or the credentials, that
    error is raised (its type kept): it is a configuration problem, not an outage.
    """
    errors: list[UpstreamError] = []
    for address in addresses:
        try:
            return address, await open_upstream(address, timeout=timeout, max_frame_size=max_frame_size,
                                                security=security, authenticate=authenticate)
        except UpstreamError as exc:
            errors.append(exc)
    for error in errors:
        if isinstance(error, (UpstreamAuthenticationError, UpstreamTlsError)):
            raise error
    raise UpstreamError("; ".join(str(error) for error in errors) or "no upstream addresses")


SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_SASL_HANDSHAKE_MAX = 1  # v1: the SASL tokens travel in SaslAuthenticate frames (KIP-152)
_SASL_AUTHENTICATE_MAX = 2
_UNSUPPORTED_SASL_MECHANISM = 33


async def sasl_authenticate(stream: FramedStream, credentials: ServiceCredentials, address: HostPort) -> int:
    """Authenticate `stream` with the proxy's service credentials (Kafka's SASL framing, KIP-152:
    SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate requests). Returns the
    session lifetime the broker granted in ms (0: unlimited; KIP-368).

    :class:`UpstreamAuthenticationError` names the broker, mechanism, user and Kafka's message.
    """
    mechanism, user = credentials.mechanism, credentials.username

    def failure(message: str) -> UpstreamAuthenticationError:
        return UpstreamAuthenticationError(
            f"upstream authentication failed as user '{user}' ({mechanism}) at {address}: {message}")

    client = UpstreamClient(stream, client_id="kafka-share-proxy")
    versions = await client.api_versions()
    handshake_version = _highest_common(versions.get(SASL_HANDSHAKE), _SASL_HANDSHAKE_MAX, minimum=1)
    authenticate_version = _highest_common(versions.get(SASL_AUTHENTICATE), _SASL_AUTHENTICATE_MAX, minimum=0)
    if handshake_version is None or authenticate_version is None:
        raise failure("the broker offers no SaslHandshake v1 / SaslAuthenticate (Kafka 1.0 or newer is needed)")
    handshake = await client.call(load_request_schema(SASL_HANDSHAKE, handshake_version)(mechanism=mechanism))
    code = int(handshake.error_code)
    if code == _UNSUPPORTED_SASL_MECHANISM:
        offered = ", ".join(handshake.mechanisms) or "none"
        raise failure(f"mechanism not enabled on this listener (it offers: {offered})")
    if code:
        raise failure(f"SaslHandshake refused: {_error_name(code)} (is this listener SASL_PLAINTEXT/SASL_SSL?)")
    request_type = load_request_schema(SASL_AUTHENTICATE, authenticate_version)

    lifetime_ms = 0

    async def exchange(token: bytes) -> bytes:
        nonlocal lifetime_ms
        response = await client.call(request_type(auth_bytes=token))
        if int(response.error_code):
            raise failure(response.error_message or _error_name(int(response.error_code)))
        lifetime = getattr(response, "session_lifetime", None)  # v1+
        if lifetime is not None:
            lifetime_ms = int(lifetime.total_seconds() * 1000)
        return bytes(response.auth_bytes)

    try:
        login = ClientLogin(mechanism, user, credentials.password.value)
        token = login.first_token()
        while token is not None:
            token = login.next_token(await exchange(token))
    except SaslError as exc:
        raise failure(str(exc)) from None
    return lifetime_ms


def _highest_common(broker: tuple[int, int] | None, known_max: int, *, minimum: int) -> int | None:
    if broker is None:
        return None
    version = min(broker[1], known_max)
    return version if version >= max(broker[0], minimum) else None


def _error_name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request whose body is already written (the share path's Fetch: codec.fetch), sent as it is."""

    api_key: int
    version: int
    body: bytes

    @property
    def __api_key__(self) -> int:  # read as kio's request entities are
        return self.api_key

    @property
    def __version__(self) -> int:
        return self.version


def encode_call(request: Any, correlation_id: int, client_id: str) -> bytes:
    """The frame payload (header + body) of a request the proxy sends on its own behalf: a kio
    entity, or an :class:`EncodedRequest`."""
    api_key, api_version = int(request.__api_key__), int(request.__version__)
    header = encode_request_header(RequestHeader(api_key, api_version, correlation_id, client_id))
    if isinstance(request, EncodedRequest):
        return header + request.body
    buffer = io.BytesIO()
    buffer.write(header)
    entity_writer(type(request))(buffer, request)
    return buffer.getvalue()


def decode_call_response(frame: bytes, request: Any, correlation_id: int, response_type: type | None = None, *,
                         read: Callable[[bytes, int], Any] | None = None) -> Any:
    """The response of `request` in `frame`: read by `read` (frame, body offset) when given, else
    kio's entity; :class:`UpstreamError` if it is not that response."""
    api_key, api_version = int(request.__api_key__), int(request.__version__)
    try:
        header, offset = parse_response_header(frame, response_header_version(api_key, api_version))
        if header.correlation_id != correlation_id:
            raise UpstreamError(f"correlation id {header.correlation_id} != {correlation_id}")
        if read is not None:
            return read(frame, offset)
        response, _ = entity_reader(response_type or _response_schema(api_key, api_version))(frame, offset)
    except UpstreamError:
        raise
    except Exception as exc:
        raise UpstreamError(f"cannot decode upstream response: {exc}") from exc
    return response


# kio resolves a schema by import path on every call (pkgutil, the import lock): ~3 % of a
# share run's proxy CPU before it was cached (py-spy, 2026-11-27).
_response_schema = functools.cache(load_response_schema)


class UpstreamClient:
    """Sequential request/response calls the proxy makes itself (not client traffic)."""

    def __init__(self, stream: FramedStream, client_id: str = "kafka-share-proxy") -> None:
        self._stream = stream
        self._client_id = client_id
        self._next_correlation_id = 1

    async def call(self, request: Any, response_type: type | None = None, *,
                   read: Callable[[bytes, int], Any] | None = None) -> Any:
        """Send `request`, read its response; `response_type` decodes APIs kio does not know
        under their key (the extension RPCs), kio's schema for the key otherwise; `read`
        (frame, body offset) replaces kio's reader (the share path's Fetch responses)."""
        correlation_id = self._next_correlation_id
        self._next_correlation_id += 1
        try:
            await self._stream.send_frame(encode_call(request, correlation_id, self._client_id))
            frame = await self._stream.receive_frame()
        except (OSError, trio.BrokenResourceError, EOFError, CodecError) as exc:
            raise UpstreamError(f"upstream call failed: {exc}") from exc
        if frame is None:
            raise UpstreamError("upstream closed the connection")
        return decode_call_response(frame, request, correlation_id, response_type, read=read)

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

    def session_expired(self) -> bool:
        """True once the broker's SASL session lifetime for this connection is (nearly) over."""
        expires_at = self._stream.session_expires_at
        return expires_at is not None and trio.current_time() >= expires_at

    async def aclose(self) -> None:
        await self._stream.aclose()
