"""One client connection: read requests, route them, answer in request order.

Theory of operation
-------------------
A Kafka client may pipeline: send several requests before reading any response
(``max.in.flight.requests.per.connection``), and it expects the responses in the
order of its requests. A broker achieves this by answering one connection's
requests strictly in order; the proxy keeps the same promise with three tasks:

* the **reader** reads a frame, parses only the request header, looks the API
  key up in the route table and *starts* the request. Starting puts a
  :class:`PendingResponse` slot into the bounded ``order`` channel (the bound,
  ``max_in_flight``, is the back-pressure: a client that never reads stops
  being read) and then either sends the frame bytes unchanged to the upstream
  broker, answers at once, or spawns a local handler.
* the **upstream reader** reads the broker's responses. A broker answers one
  connection in order too, so the oldest slot still waiting on upstream is the
  one a response belongs to; its correlation id is checked, an optional
  transform (endpoint rewriting, ApiVersions narrowing) is applied, and the
  slot completes.
* the **writer** takes slots from ``order`` in request order, waits for each to
  complete and writes it back. A slow local handler therefore holds back later
  responses exactly as a broker would, and nothing is reordered.

Slots enter the order channel *before* their frame is sent upstream, so a fast
broker response always finds its slot. Produce with acks=0 gets no slot: the
broker never answers it. Bytes that are only forwarded are never decoded.

**Cut-through** (``stream_from`` > 0, ``--stream-responses-from``; by default on where both sides
are plaintext sockets). A large upstream response (typically a Fetch) that
the writer is already waiting for, and that needs no transform, is not gathered whole: the
upstream reader writes its prefix and its pieces to the client as they arrive, then completes
the slot with nothing left to write. Between two plain sockets the pieces never enter the
process: they are spliced socket -> pipe -> socket (:class:`proxy.upstream.SplicePipe`); over TLS
they are received and written as copies (measured mixed against gathering, docs/benchmarks.md). Only the writer writes to the client otherwise, and it is
parked on exactly this slot, so the two never write at once. Gathering first (store and forward)
makes every large Fetch wait for its last byte before its first goes out; streaming instead costs
more writes per response. Any other response, and one that arrives while the writer is still
busy with earlier ones, is gathered as before.

**Cut-through for requests** (``stream_requests_from`` > 0, ``--stream-requests-from``; on by
default where both sides are plaintext). A large request still arriving when the reader gets to it
(in practice a Produce) is read only so far (:data:`REQUEST_PEEK_BYTES`: the header and the topic
names in front of the records), then offered to its route's ``start_streamed``. A route that takes
it (forwarding; the state-topic guard once the first bytes show one topic that is not the state
topic) sends those bytes upstream and splices the rest socket -> pipe -> socket under the send lock,
so nothing interleaves with it; otherwise the rest is read and the request gathered whole. Only
where it can be spliced (plain sockets on both sides, the upstream connection already open): a
copied stream would save nothing. A client that closes inside such a request closes the connection,
the upstream one with its half-sent frame included.

Bytes held are bounded too (:class:`ByteBudget`, ``max_connection_bytes``): a request
frame counts from the moment it is read until it has been passed on (sent upstream,
or answered by a local handler); a response counts from the moment it exists until
it has been written to the client. While the connection holds its budget or more,
the reader reads no further request and the upstream reader reads no further
response, so a client that pipelines large requests without reading its answers
stops being read (TCP pushes back on it) instead of growing the process. Two
exceptions keep it live and in order: the reader always resumes once the bytes fall
below the budget, so a single frame larger than the budget still passes (alone);
and the upstream reader always reads the response the writer is waiting for next,
because only writing that response can free bytes. At worst a connection therefore
holds its budget plus one request frame and one response frame (and what the frame
decoders have buffered of the next frames: at most one read per side, 256 KiB, or
1 MiB while the rest of a large frame is read),
plus the answers of local handlers that were already running (``max_in_flight``
bounds how many).

The upstream connection (one per client connection, to the broker the listener
stands for) is opened on the first forwarded request, so a client that only
uses locally served APIs never needs one.

**The proxy's own requests on the client's connection** (:meth:`ClientConnection.call_upstream`,
the authorization probes of :mod:`proxy.share.authorization`): the cluster authenticated the
client on this connection, so only here does it answer for the client's principal. Such a call
takes a slot in the same upstream queue as forwarded requests (a send lock keeps a forwarded
frame and a call from interleaving, and slot order = send order), under a correlation id of the
proxy's own; its response wakes the caller instead of going to the writer, and its bytes count
against the budget only while the caller decodes them. While the client is in the middle of a
SASL exchange (it forwarded SaslHandshake or SaslAuthenticate and sent nothing else since) a
call waits: a broker closes a connection that sends other requests mid-authentication, KIP-368
re-authentication included. Any error on either side closes this
connection only; shutdown stops the reader first so responses already owed are
still written within the grace period.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog
import trio

from codec.errors import CodecError, FrameError, HeaderError
from codec.framing import encode_size_prefix
from codec.headers import API_VERSIONS_KEY, RequestHeader, parse_request_header, request_expects_response
from proxy import metrics
from proxy.apiversions import ApiVersionTable
from proxy.errors import ClientProtocolError, ProxyError, UpstreamError
from proxy.upstream import (
    FramedStream,
    SplicePipe,
    StreamedFrame,
    can_splice,
    decode_call_response,
    encode_call,
)

_connection_ids = itertools.count(1)

#: The node id of a bootstrap-listener connection: it forwards to whichever ``--upstream`` address
#: answers first, so it stands for no fixed broker (Kafka's clients call their first bootstrap
#: server node -1 as well).
BOOTSTRAP_NODE_ID = -1

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
_SASL_KEYS = frozenset({SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})
#: The client id of the proxy's own calls before the client has sent one of its own.
CALL_CLIENT_ID = "kafka-share-proxy"
#: How long a call waits for the client to finish a SASL exchange. A client that re-authenticates
#: (KIP-368) while a request whose call waits is unanswered would wait for that answer forever;
#: past this bound the call fails and the connection closes (the client reconnects).
SASL_WAIT_TIMEOUT_S = 30.0
#: The reader and the writer go through the scheduler at least once per this many frames. Most
#: frames pass none at all (a frame already buffered, a send the socket takes at once, a slot
#: the channel has room for: each a trip round trio's run loop saved), so without this a client
#: that pipelines a burst (acks=0 Produce has no max_in_flight bound) could hold the loop.
FRAMES_PER_YIELD = 32
#: A streamed response that cannot be spliced (TLS; see the theory of operation) is written out
#: whenever this much of it has arrived, and at its end.
STREAM_SEND_BYTES = 512 * 1024
#: A streamed request (cut-through, ``stream_requests_from``) is read this far into the process
#: before its route decides: the header and, for Produce, the topic names in front of the records.
REQUEST_PEEK_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    frame: bytes
    body_offset: int
    # perf_counter() when the frame was read off the client: ksp_request_seconds starts here.
    received_at: float = 0.0


ResponseTransform = Callable[[Request, bytes], Awaitable[bytes]]
"""Turns an upstream response frame payload into the one the client gets.

It sees the request's header only: the request frame was released once forwarded
(``request.frame`` is empty by the time the response arrives)."""

LocalHandler = Callable[[Request, "ClientConnection"], Awaitable[bytes | None]]
"""Serves a request inside the proxy; returns the response payload (header included) or None."""

UpstreamOpener = Callable[[], Awaitable[FramedStream]]


class ByteBudget:
    """Bytes one connection holds (requests not yet passed on, responses not yet written).

    Not a hard cap on what is charged (a frame is charged after it was read, and a local
    handler's answer when it exists): the connection's tasks consult :attr:`exhausted`
    before taking in more, which bounds the total at the limit plus one frame per reader.
    """

    __slots__ = ("limit", "held", "peak", "_changed")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("the byte budget must be positive")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._changed = trio.Event()

    @property
    def exhausted(self) -> bool:
        return self.held >= self.limit

    def charge(self, size: int) -> None:
        self.held += size
        if self.held > self.peak:
            self.peak = self.held

    def release(self, size: int) -> None:
        self.held -= size
        self.notify()

    def notify(self) -> None:
        """Wake the waiters: bytes were released or what they wait on changed."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()


class PendingResponse:
    """A response owed to the client, in request order."""

    __slots__ = ("request", "transform", "ready", "payload", "close_reason", "streamed")

    def __init__(self, request: Request, transform: ResponseTransform | None = None) -> None:
        self.request = request
        self.transform = transform
        self.ready = trio.Event()
        self.payload: bytes | None = None
        self.close_reason: str | None = None  # set: close the connection here instead of answering
        self.streamed = False  # written to the client by the upstream reader as it arrived (cut-through)

    def complete(self, payload: bytes | None) -> None:
        self.payload = payload
        self.ready.set()


class UpstreamCall(PendingResponse):
    """A slot for the proxy's own request on the client's upstream connection: its response
    wakes the caller (:meth:`ClientConnection.call_upstream`), never the writer."""

    __slots__ = ("error",)

    def __init__(self, header: RequestHeader) -> None:
        super().__init__(Request(header, b"", 0))
        self.error: str | None = None

    def fail(self, reason: str) -> None:
        self.error = reason
        self.ready.set()


class Route(Protocol):
    """How one API is handled. ``start`` must not wait for the response itself.

    A route may also offer ``start_streamed(request, rest, connection) -> bool`` for a large request
    whose ``request.frame`` holds only its first bytes and `rest` the remainder still in the client's
    socket (cut-through, see the theory of operation): it returns False, having read nothing of
    `rest`, when those first bytes do not let it decide; the request is then gathered whole and
    ``start`` handles it.
    """

    async def start(self, request: Request, connection: ClientConnection) -> None: ...


async def start_streamed(route: Route, request: Request, rest: StreamedFrame, connection: ClientConnection) -> bool:
    """Hand a request still arriving to `route` if it takes requests that way (``start_streamed``)."""
    start = getattr(route, "start_streamed", None)
    return start is not None and await start(request, rest, connection)


@dataclass(frozen=True, slots=True)
class Forward:
    """The default route: bytes to the upstream broker, its bytes back (optionally transformed)."""

    transform: ResponseTransform | None = None

    async def start(self, request: Request, connection: ClientConnection) -> None:
        await connection.forward(request, self.transform)

    async def start_streamed(self, request: Request, rest: StreamedFrame, connection: ClientConnection) -> bool:
        await connection.forward(request, self.transform, rest)
        return True


@dataclass(frozen=True, slots=True)
class ServeLocally:
    """Route for APIs the proxy answers itself (the seam for the share APIs)."""

    handler: LocalHandler

    async def start(self, request: Request, connection: ClientConnection) -> None:
        await connection.serve_locally(request, self.handler)


FORWARD = Forward()


class ClientConnection:
    def __init__(
        self,
        client: FramedStream,
        *,
        open_upstream: UpstreamOpener,
        routes: Mapping[int, Route],
        api_versions: ApiVersionTable,
        max_in_flight: int,
        max_bytes: int = 16 * 1024 * 1024,
        listener: str = "",
        node_id: int = BOOTSTRAP_NODE_ID,
        peer: str = "",
        stream_from: int = 0,
        stream_requests_from: int = 0,
    ) -> None:
        self.client = client
        self._stream_from = stream_from
        self._stream_requests_from = stream_requests_from
        self.id = next(_connection_ids)
        self.peer = peer  # "host:port" of the client, reported by ShareGroupDescribe
        self.listener = listener  # "bootstrap" or "broker-<id>": ListGroups adds share groups on one only
        # The broker id the listener stands for: share sessions are per node, as in Kafka.
        self.node_id = node_id
        self.log = structlog.get_logger("proxy.connection").bind(conn=self.id, listener=listener, peer=peer)
        self._open_upstream = open_upstream
        self._routes = routes
        self._api_versions = api_versions
        self._order_send, self._order_receive = trio.open_memory_channel[PendingResponse](max_in_flight)
        self._awaiting_upstream: deque[PendingResponse] = deque()
        self.budget = ByteBudget(max_bytes)
        self._writer_waits_for: PendingResponse | None = None
        self._upstream: FramedStream | None = None
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self._receive_scope: trio.CancelScope | None = None
        self.closed = trio.Event()
        # call_upstream: a forwarded frame and a call never interleave on the upstream stream.
        self._send_lock = trio.Lock()
        self._call_ids = itertools.count(1)
        self._call_client_id = CALL_CLIENT_ID
        self._in_sasl = False
        self._sasl_done = trio.Event()
        self._sasl_done.set()
        self._calls_failed: str | None = None
        self._calls_waiting = 0
        self._upstream_closed = False
        #: Per-connection state of the authorization module (proxy.share.authorization), created
        #: on first use and dropped with the connection: a reconnect starts with nothing cached.
        self.authorization = None

    def authorizer(self, create: Callable[[], Any]) -> Any:
        """The connection's authorization state (proxy.share.authorization), created on first use."""
        if self.authorization is None:
            self.authorization = create()
        return self.authorization

    # -- lifecycle ------------------------------------------------------------

    def stop_reading(self) -> None:
        """Graceful shutdown: accept no further requests, finish the ones owed."""
        self._stopping = True
        if self._receive_scope is not None:
            self._receive_scope.cancel()

    async def serve(self) -> None:
        """Serve until the client leaves, breaks the protocol, or shutdown; never raises an Exception."""
        metrics.CONNECTIONS_OPEN.inc()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._read_requests)
                await self._write_responses()
                # Everything owed has been written; stop the upstream reader and any handlers.
                nursery.cancel_scope.cancel()
        except* FrameError as group:
            self._bad_input("bad_size_prefix", group)
        except* HeaderError as group:
            self._bad_input("bad_header", group)
        except* EOFError as group:
            self._bad_input("truncated_frame", group)
        except* ClientProtocolError as group:
            self._bad_input("unsupported_request", group)
        except* CodecError as group:
            self._bad_input("bad_request", group)
        except* UpstreamError as group:
            metrics.UPSTREAM_FAILURES.inc()
            self.log.warning("closing connection: upstream failed", error=_first(group))
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            self.log.debug("connection lost", error=_first(group))
        except* ProxyError as group:
            self.log.warning("closing connection", error=_first(group))
        except* Exception as group:
            # A bug must cost one connection, never the listener.
            self.log.error("unexpected error; closing connection", error=_first(group), exc_info=group)
        finally:
            metrics.CONNECTIONS_OPEN.dec()
            self._fail_calls("the client connection closed")
            # Shielded so that an outer cancellation cannot skip the second close;
            # forceful closes do not block, so the shield is bounded.
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.client)
                if self._upstream is not None:
                    await trio.aclose_forcefully(self._upstream)
            self.closed.set()

    def _bad_input(self, reason: str, group: BaseExceptionGroup) -> None:
        metrics.BAD_FRAMES.labels(reason=reason).inc()
        self.log.warning("closing connection: bad input", reason=reason, error=_first(group))

    # -- the three tasks ------------------------------------------------------

    async def _receive_request_frame(self) -> bytes | StreamedFrame | None:
        # Only the wait for the next request is cancelled on shutdown, never the
        # forwarding of one: a half-sent frame would wedge the upstream connection.
        if self._stopping:
            return None
        with trio.CancelScope() as self._receive_scope:
            budget = self.budget
            if budget.exhausted:
                metrics.CONNECTION_BACKPRESSURE.inc()
                await budget.wait_until(lambda: not budget.exhausted)
            frame = await self.client.receive_frame(self._may_stream_request if self._stream_requests_from else None)
            if isinstance(frame, StreamedFrame):
                budget.charge(len(frame.head))
            elif frame is not None:
                budget.charge(len(frame))
            return frame
        return None

    async def _read_requests(self) -> None:
        for handled in itertools.count(1):
            frame = await self._receive_request_frame()
            if frame is None:
                break
            if handled % FRAMES_PER_YIELD == 0:
                # Frames already buffered and sends the socket takes at once pass no
                # scheduling point: a burst must still let other connections run.
                await trio.lowlevel.checkpoint()
            if isinstance(frame, StreamedFrame):
                request = await self._start_streamed(frame)
                if request is None:
                    continue
            else:
                request = self._parse_request(frame)
                self._note_request(request.header)
            # Locals dropped before the next frame is awaited: once passed on, a request's
            # bytes are released and must not stay alive here.
            del frame
            await self._routes.get(request.header.api_key, FORWARD).start(request, self)
            del request
        # The client is done (or shutdown): the writer drains what is owed, then stops.
        await self._order_send.aclose()

    def _parse_request(self, frame: bytes) -> Request:
        received_at = time.perf_counter()
        header, body_offset = parse_request_header(frame)
        return self._accept(header, frame, body_offset, received_at)

    def _accept(self, header: RequestHeader, frame: bytes, body_offset: int, received_at: float) -> Request:
        metrics.instruments(header.api_key).requests.inc()
        if header.api_key != API_VERSIONS_KEY and not self._api_versions.accepts(header.api_key, header.api_version):
            raise ClientProtocolError(f"api {header.api_key} v{header.api_version} is not supported by the proxy")
        return Request(header, frame, body_offset, received_at)

    def _may_stream_request(self, size: int) -> bool:
        """Whether a client request of `size` bytes, now arriving, is handed to its route before the
        rest of it has arrived: large, and spliceable to an upstream connection already open."""
        upstream = self._upstream
        return (size >= self._stream_requests_from and upstream is not None and not self._upstream_closed
                and can_splice(self.client, upstream))

    async def _start_streamed(self, rest: StreamedFrame) -> Request | None:
        """A large request still arriving: its first bytes are read, and its route either takes it as
        it is (None is returned) or it is gathered whole and returned, to be routed as any other."""
        received_at = time.perf_counter()
        head = rest.head
        wanted = min(REQUEST_PEEK_BYTES, rest.size)
        while len(head) < wanted:
            more = await rest.receive_more(wanted - len(head))
            self.budget.charge(len(more))
            head += more
        try:
            header, body_offset = parse_request_header(head)
        except CodecError:  # a header longer than the peek (or a bad one): decided on the whole frame
            request = self._parse_request(await self._gather(head, rest))
            self._note_request(request.header)
            return request
        request = self._accept(header, head, body_offset, received_at)
        self._note_request(header)
        if await start_streamed(self._routes.get(header.api_key, FORWARD), request, rest, self):
            return None
        return replace(request, frame=await self._gather(head, rest))

    async def _gather(self, head: bytes, rest: StreamedFrame) -> bytes:
        """The whole payload of a streamed request, its rest read into the process after all."""
        pieces = [head]
        while piece := await rest.receive_more():
            self.budget.charge(len(piece))
            pieces.append(piece)
        return b"".join(pieces)

    def _note_request(self, header: RequestHeader) -> None:
        """Track whether the client is mid-SASL (calls must wait) and its client id (calls use it)."""
        if header.api_key in _SASL_KEYS:
            if not self._in_sasl:
                self._in_sasl = True
                self._sasl_done = trio.Event()
            return
        if self._in_sasl:
            self._in_sasl = False
            self._sasl_done.set()
        if header.client_id:
            self._call_client_id = header.client_id

    async def _write_responses(self) -> None:
        async with self._order_receive:
            for written in itertools.count(1):
                if (pending := await _next_in_order(self._order_receive)) is None:
                    break
                if written % FRAMES_PER_YIELD == 0:
                    await trio.lowlevel.checkpoint()  # as in the reader
                self._writer_waits_for = pending
                self.budget.notify()  # the upstream reader may owe exactly this response
                if not pending.ready.is_set():
                    await pending.ready.wait()
                if pending.close_reason is not None:
                    # Logged here, not raised: leaving this block lets the reader run into the
                    # closed channel, and its error would then be the only one reported.
                    self.log.warning("closing connection: request refused without a response",
                                     reason=pending.close_reason)
                    return
                payload, pending.payload = pending.payload, None
                answered = pending.streamed  # already written by the upstream reader
                if payload is not None:
                    await self.client.send_frame(payload)
                    self.budget.release(len(payload))
                    del payload
                    answered = True
                if answered:
                    started = pending.request.received_at
                    if started:
                        metrics.instruments(pending.request.header.api_key).latency.observe(
                            time.perf_counter() - started)

    def _may_read_upstream(self) -> bool:
        # Over budget, only the response the writer waits for is read: writing it is what
        # frees bytes, and it is necessarily the oldest one awaited from upstream.
        if not self.budget.exhausted:
            return True
        if not self._awaiting_upstream:
            return False
        # While a call waits, read on: its caller may be what the writer waits for (a local
        # handler asking the cluster), and responses queued before the call must come off first.
        return self._awaiting_upstream[0] is self._writer_waits_for or self._calls_waiting > 0

    def _fail_calls(self, reason: str) -> None:
        """Wake every call still waiting on upstream with an error (the connection is going)."""
        self._calls_failed = reason
        for pending in self._awaiting_upstream:
            if isinstance(pending, UpstreamCall):
                pending.fail(reason)

    async def _read_upstream(self, upstream: FramedStream) -> None:
        try:
            await self._read_upstream_frames(upstream)
        except BaseException as exc:
            self._fail_calls(f"upstream connection failed: {exc!r}")
            raise

    async def _read_upstream_frames(self, upstream: FramedStream) -> None:
        budget = self.budget
        while True:
            if not self._may_read_upstream():
                metrics.CONNECTION_BACKPRESSURE.inc()
                await budget.wait_until(self._may_read_upstream)
            try:
                frame = await upstream.receive_frame(self._may_stream if self._stream_from else None)
            except (CodecError, EOFError, OSError, trio.BrokenResourceError) as exc:
                raise UpstreamError(f"upstream connection broke: {exc}") from exc
            if isinstance(frame, StreamedFrame):
                await self._pass_on(frame)
                continue
            if frame is None:
                if self._awaiting_upstream:
                    raise UpstreamError("upstream closed the connection")
                # Closed after answering everything asked (a broker does this after a failed
                # SaslAuthenticate): the answers owed, that one included, are still written, then
                # the connection closes. Raising here would cancel the writer before it wrote them.
                metrics.UPSTREAM_FAILURES.inc()
                self.log.warning("upstream closed the connection; closing after the responses owed")
                self._calls_failed = "upstream closed the connection"
                self._upstream_closed = True
                self.stop_reading()
                return
            pending = self._answered(frame)
            budget.charge(len(frame))  # a call's caller releases it once decoded
            if pending.transform is not None:
                raw_size = len(frame)
                frame = await pending.transform(pending.request, frame)
                budget.charge(len(frame))
                budget.release(raw_size)
            pending.complete(frame)
            del frame, pending

    def _answered(self, frame: bytes) -> PendingResponse:
        """The oldest slot awaiting upstream, taken off the queue, once `frame` (a response payload
        or its first bytes) carries its correlation id."""
        if not self._awaiting_upstream:
            raise UpstreamError("upstream sent a response nobody asked for")
        pending = self._awaiting_upstream[0]
        correlation_id = int.from_bytes(frame[:4], "big", signed=True)
        if len(frame) < 4 or correlation_id != pending.request.header.correlation_id:
            # Still queued, so a waiting call learns why (see _read_upstream).
            raise UpstreamError(
                f"upstream answered correlation id {correlation_id}, "
                f"expected {pending.request.header.correlation_id}"
            )
        self._awaiting_upstream.popleft()
        return pending

    def _may_stream(self, size: int) -> bool:
        """Whether an upstream response of `size` bytes, now arriving, is passed on as it arrives:
        large, untransformed, and the very response the writer is parked on (so nothing else writes
        to the client meanwhile)."""
        if size < self._stream_from or not self._awaiting_upstream:
            return False
        pending = self._awaiting_upstream[0]
        return (pending is self._writer_waits_for and pending.transform is None
                and not isinstance(pending, UpstreamCall))

    async def _pass_on(self, frame: StreamedFrame) -> None:
        """Write a response to the client as it arrives (cut-through), then complete its slot."""
        pending = self._answered(frame.head)
        metrics.RESPONSES_STREAMED.inc()
        pipe = None
        if self._upstream is not None and can_splice(self._upstream, self.client):
            try:
                # A pipe per response, not per connection: pipes then exist only while bytes pass,
                # and the kernel's per-user pipe budget (fs.pipe-user-pages-soft) covers as many
                # responses in flight as possible.
                pipe = SplicePipe()
            except OSError as exc:  # out of file descriptors: copy this one
                self.log.warning("cannot open a splice pipe; copying the response", error=str(exc))
        if pipe is not None:
            with pipe:
                metrics.RESPONSES_SPLICED.inc()
                await self.client.send_bytes(encode_size_prefix(frame.size), frame.head)
                try:
                    await frame.splice_to(self.client, pipe)
                except (EOFError, OSError) as exc:
                    raise UpstreamError(f"upstream connection broke: {exc}") from exc
        else:
            await self._copy_on(frame)
        pending.streamed = True
        pending.complete(None)

    async def _copy_on(self, frame: StreamedFrame) -> None:
        """The rest of a streamed response through the process (TLS on either side)."""
        # Pieces go out in one scatter write per STREAM_SEND_BYTES gathered (no copy): a send per
        # piece read (often 64 KiB) cost more CPU than the gathering it replaces.
        pieces, held = [encode_size_prefix(frame.size), frame.head], len(frame.head)
        while True:
            try:
                piece = await frame.receive_more()
            except (EOFError, OSError, trio.BrokenResourceError) as exc:
                raise UpstreamError(f"upstream connection broke: {exc}") from exc
            if piece:
                pieces.append(piece)
                held += len(piece)
            if held >= STREAM_SEND_BYTES or not piece:
                await self.client.send_bytes(*pieces)
                pieces, held = [], 0
            if not piece:
                break

    # -- what routes call -----------------------------------------------------

    async def forward(self, request: Request, transform: ResponseTransform | None = None,
                      rest: StreamedFrame | None = None) -> None:
        """Send the request bytes upstream; its response is delivered in order.

        With `rest`, ``request.frame`` is only the request's first bytes and the remainder is
        spliced from the client's socket to the upstream one as it arrives."""
        pending = None
        if request_expects_response(request.header, request.frame, request.body_offset):
            # The slot keeps only the header: the frame's bytes are released once sent.
            pending = PendingResponse(_header_only(request), transform)
            # Outside the send lock: this waits for the writer, which may wait for a handler
            # whose call needs the lock.
            await self._enqueue(pending)
        lock = self._send_lock
        # Uncontended (the common case) the lock is taken without a trip through the scheduler.
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            upstream = self._upstream or await self._ensure_upstream()
            if self._upstream_closed:
                # Its answer could never come: nobody reads the closed upstream any more.
                raise UpstreamError("upstream closed the connection")
            if pending is not None:
                self._awaiting_upstream.append(pending)
                self.budget.notify()
            if rest is None:
                await _send(upstream, request.frame)
            else:
                await self._send_streamed(upstream, request.frame, rest)
        finally:
            lock.release()
        self.budget.release(len(request.frame))

    async def _send_streamed(self, upstream: FramedStream, head: bytes, rest: StreamedFrame) -> None:
        """A request's first bytes, then its rest socket -> pipe -> socket inside the kernel."""
        try:
            pipe = SplicePipe()
        except OSError as exc:  # out of file descriptors: this one goes through the process
            self.log.warning("cannot open a splice pipe; gathering the request", error=str(exc))
            whole = await self._gather(head, rest)
            await _send(upstream, whole)
            self.budget.release(len(whole) - len(head))
            return
        with pipe:
            metrics.REQUESTS_STREAMED.inc()
            try:
                await upstream.send_bytes(encode_size_prefix(rest.size), head)
                # The client's failures (EOFError: it closed inside the frame; OSError) pass as
                # they are: the connection closes, the upstream one with its half-sent frame too.
                await rest.splice_to(upstream, pipe)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise UpstreamError(f"cannot send to upstream: {exc}") from exc

    async def _enqueue(self, pending: PendingResponse) -> None:
        """A slot into the order channel: waits only when it is full (max_in_flight)."""
        try:
            self._order_send.send_nowait(pending)
        except trio.WouldBlock:
            await self._order_send.send(pending)

    async def call_upstream(self, request: Any, response_type: type | None = None) -> Any:
        """The proxy's own request (a kio entity) on this client's upstream connection; its response.

        Ordered with the forwarded requests (opened if needed). Waits while the client is in the
        middle of a SASL exchange. :class:`UpstreamError` when the upstream connection fails or
        answers out of turn -- the connection then closes, as for a forwarded request.
        """
        if self._calls_failed is not None or self._nursery is None:
            raise UpstreamError(f"no upstream call possible: {self._calls_failed or 'the connection is not serving'}")
        header = RequestHeader(int(request.__api_key__), int(request.__version__), next(self._call_ids) & 0x7FFFFFFF,
                               self._call_client_id)
        call = UpstreamCall(header)
        while True:
            if self._in_sasl:
                with trio.move_on_after(SASL_WAIT_TIMEOUT_S):
                    await self._sasl_done.wait()
                if self._in_sasl:
                    raise UpstreamError("the client stayed in a SASL exchange while a call waited")
            async with self._send_lock:
                if self._in_sasl:
                    continue
                upstream = await self._ensure_upstream()
                if self._calls_failed is not None:
                    raise UpstreamError(f"no upstream call possible: {self._calls_failed}")
                payload = encode_call(request, header.correlation_id, header.client_id)
                self._awaiting_upstream.append(call)
                self._calls_waiting += 1
                self.budget.notify()
                try:
                    await _send(upstream, payload)
                except BaseException:
                    self._calls_waiting -= 1
                    raise
                break
        try:
            await call.ready.wait()
        finally:
            self._calls_waiting -= 1
        if call.error is not None:
            raise UpstreamError(call.error)
        frame, call.payload = call.payload, None
        assert frame is not None
        try:
            return decode_call_response(frame, request, header.correlation_id, response_type)
        finally:
            self.budget.release(len(frame))

    async def respond(self, request: Request, payload: bytes) -> None:
        """Answer with a ready-made response payload (header included), in order."""
        pending = PendingResponse(_header_only(request))
        self.budget.charge(len(payload))
        self.budget.release(len(request.frame))
        pending.complete(payload)
        await self._enqueue(pending)

    async def close_in_order(self, request: Request, reason: str) -> None:
        """Close the connection once every response owed before `request` is written.

        Kafka's answer to a failed request that expects no response (Produce with acks=0): the
        client learns of the failure from the closed connection and refreshes its metadata.
        """
        pending = PendingResponse(request)
        pending.close_reason = reason
        pending.complete(None)
        await self._enqueue(pending)

    async def serve_locally(self, request: Request, handler: LocalHandler) -> None:
        """Run ``handler`` concurrently; its response is delivered in order."""
        pending = PendingResponse(_header_only(request))
        await self._enqueue(pending)
        assert self._nursery is not None
        budget = self.budget

        async def run() -> None:
            payload = await handler(request, self)
            if payload is not None:
                budget.charge(len(payload))
            budget.release(len(request.frame))
            pending.complete(payload)

        self._nursery.start_soon(run)

    async def _ensure_upstream(self) -> FramedStream:
        if self._upstream is None:
            self._upstream = await self._open_upstream()
            assert self._nursery is not None
            self._nursery.start_soon(self._read_upstream, self._upstream)
        return self._upstream


async def _send(upstream: FramedStream, payload: bytes) -> None:
    try:
        await upstream.send_frame(payload)
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise UpstreamError(f"cannot send to upstream: {exc}") from exc


async def _next_in_order(channel: trio.MemoryReceiveChannel[PendingResponse]) -> PendingResponse | None:
    """The next slot, None once the reader closed the channel; without a trip through the
    scheduler when one is already waiting (the writer still yields at every send)."""
    try:
        return channel.receive_nowait()
    except trio.WouldBlock:
        try:
            return await channel.receive()
        except trio.EndOfChannel:
            return None
    except trio.EndOfChannel:
        return None


def _header_only(request: Request) -> Request:
    """What a pending slot keeps of its request once the frame has been passed on."""
    return Request(request.header, b"", 0, request.received_at)


def _first(group: BaseExceptionGroup) -> str:
    leaves = list(_leaves(group))
    return "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3])


def _leaves(error: BaseException):
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error
