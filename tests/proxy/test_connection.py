"""The connection loop on in-memory streams (and loopback TCP where the kernel's part matters):
ordering, pipelining, bad input, cut-through."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from codec.framing import encode_frame
from codec.headers import RequestHeader, encode_request_header
from proxy import metrics
from proxy.apiversions import ApiVersionTable, VersionRange
from proxy.connection import STREAM_SEND_BYTES, ClientConnection, Forward, Request, ServeLocally
from proxy.errors import UpstreamError
from proxy.upstream import FramedStream, SplicePipe

METADATA, PRODUCE, FETCH, LOCAL_API = 3, 0, 1, 78


def request(correlation_id: int, api_key: int = METADATA, version: int = 12, body: bytes = b"") -> bytes:
    return encode_request_header(RequestHeader(api_key, version, correlation_id, "test")) + body


def response(correlation_id: int, body: bytes = b"") -> bytes:
    return correlation_id.to_bytes(4, "big", signed=True) + b"\x00" + body


class Harness:
    """A ClientConnection between an in-memory client and an in-memory fake broker."""

    def __init__(
        self,
        routes=None,
        upstream_fails: bool = False,
        max_in_flight: int = 8,
        max_bytes: int = 16 << 20,
        max_frame_size: int = 1024,
        lockstep: bool = False,
        api_versions: ApiVersionTable | None = None,
        stream_from: int = 0,
        stream_requests_from: int = 0,
        tcp: bool = False,
    ):
        # lockstep: a send blocks until the other side reads, as a full TCP window does.
        # tcp: real loopback sockets on both sides, so cut-through splices (proxy.upstream.SplicePipe).
        self._pair = tcp_stream_pair if tcp else (
            trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair)
        self.client_side, proxy_side = self._pair()
        self.client = FramedStream(self.client_side, 1 << 20)
        self.broker: FramedStream | None = None
        self.broker_connected = trio.Event()
        self.upstream_fails = upstream_fails
        table = api_versions or ApiVersionTable()
        table.register_local(LOCAL_API, VersionRange(1, 2))
        self.connection = ClientConnection(
            FramedStream(proxy_side, max_frame_size=max_frame_size),
            open_upstream=self._open_upstream,
            routes=routes or {},
            api_versions=table,
            max_in_flight=max_in_flight,
            max_bytes=max_bytes,
            stream_from=stream_from,
            stream_requests_from=stream_requests_from,
        )

    async def _open_upstream(self) -> FramedStream:
        if self.upstream_fails:
            raise UpstreamError("broker down")
        proxy_end, broker_end = self._pair()
        self.broker = FramedStream(broker_end, 1 << 20)
        self.broker_connected.set()
        return FramedStream(proxy_end, 1 << 20)

    async def aclose(self) -> None:
        """Close the test's ends (the connection closes its own): sockets must not leak."""
        await self.client_side.aclose()
        if self.broker is not None:
            await self.broker.aclose()

    async def broker_receive(self) -> bytes:
        await self.broker_connected.wait()
        frame = await self.broker.receive_frame()
        assert frame is not None
        return frame


def tcp_stream_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """Two ends of a loopback TCP connection as trio streams."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return tuple(trio.SocketStream(trio.socket.from_stdlib_socket(end)) for end in (near, far))


def correlation_of(request_frame: bytes) -> int:
    return int.from_bytes(request_frame[4:8], "big", signed=True)


async def test_pipelined_requests_are_forwarded_unchanged_and_answered_in_order():
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        sent = [request(cid, body=b"body-%d" % cid) for cid in (1, 2, 3)]
        for frame in sent:
            await h.client.send_frame(frame)
        forwarded = [await h.broker_receive() for _ in sent]
        assert forwarded == sent  # byte for byte
        for cid in (1, 2, 3):
            await h.broker.send_frame(response(cid, b"answer-%d" % cid))
        answers = [await h.client.receive_frame() for _ in sent]
        assert answers == [response(cid, b"answer-%d" % cid) for cid in (1, 2, 3)]
        await h.client_side.aclose()
    assert h.connection.closed.is_set()


async def test_a_slow_local_answer_holds_back_later_forwarded_ones(autojump_clock):
    async def slow_local(req: Request, connection: ClientConnection) -> bytes:
        await trio.sleep(5)
        return response(req.header.correlation_id, b"local")

    h = Harness(routes={LOCAL_API: ServeLocally(slow_local)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        await h.client.send_frame(request(2))
        assert correlation_of(await h.broker_receive()) == 2
        await h.broker.send_frame(response(2, b"forwarded"))
        first = await h.client.receive_frame()
        second = await h.client.receive_frame()
        assert (first, second) == (response(1, b"local"), response(2, b"forwarded"))
        await h.client_side.aclose()


async def test_transform_applies_to_its_own_response_only():
    async def upper(req: Request, payload: bytes) -> bytes:
        return payload[:4] + payload[4:].upper()

    h = Harness(routes={METADATA: Forward(upper)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, FETCH, 12))
        await h.client.send_frame(request(2, METADATA, 12))
        for _ in range(2):
            frame = await h.broker_receive()
            await h.broker.send_frame(response(correlation_of(frame), b"abc"))
        assert await h.client.receive_frame() == response(1, b"abc")
        assert await h.client.receive_frame() == response(2, b"ABC")
        await h.client_side.aclose()


def produce_request(correlation_id: int, acks: int) -> bytes:
    # Produce v9 (flexible): compact transactional id (null) then acks.
    return request(correlation_id, PRODUCE, 9, b"\x00" + acks.to_bytes(2, "big", signed=True) + b"rest")


async def test_produce_with_acks_zero_expects_no_response():
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(produce_request(1, acks=0))
        await h.client.send_frame(produce_request(2, acks=1))
        assert correlation_of(await h.broker_receive()) == 1
        assert correlation_of(await h.broker_receive()) == 2
        await h.broker.send_frame(response(2))  # the broker never answers acks=0
        assert await h.client.receive_frame() == response(2)
        await h.client_side.aclose()


async def test_close_in_order_first_writes_the_responses_owed_before_it(autojump_clock):
    class CloseAfterLocal:
        async def start(self, req: Request, connection: ClientConnection) -> None:
            await connection.close_in_order(req, "refused")

    async def slow_local(req: Request, connection: ClientConnection) -> bytes:
        await trio.sleep(5)
        return response(req.header.correlation_id, b"local")

    with capture_logs() as logged:
        h = Harness(routes={LOCAL_API: ServeLocally(slow_local), FETCH: CloseAfterLocal()})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.connection.serve)
            await h.client.send_frame(request(1, LOCAL_API, 1))
            await h.client.send_frame(request(2, FETCH, 12))
            await h.client.send_frame(request(3))  # after the close: never answered
            assert await h.client.receive_frame() == response(1, b"local")
            await assert_closed_by_proxy(h)
    # Reported whatever the reader was doing when the connection closed (request 3 raced it).
    assert [e["reason"] for e in logged if e["event"].startswith("closing connection: request refused")] == ["refused"]


async def assert_closed_by_proxy(h: Harness) -> None:
    with trio.fail_after(5):
        assert await h.client_side.receive_some(100) == b""
        await h.connection.closed.wait()


async def run_bad_input(raw: bytes, reason: str) -> None:
    h = Harness()
    before = metrics.BAD_FRAMES.labels(reason=reason)._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client_side.send_all(raw)
        if reason == "truncated_frame":
            await h.client_side.send_eof()
        await assert_closed_by_proxy(h)
    assert metrics.BAD_FRAMES.labels(reason=reason)._value.get() == before + 1


async def test_oversized_size_prefix_closes_the_connection():
    await run_bad_input((1 << 30).to_bytes(4, "big"), "bad_size_prefix")


async def test_negative_size_prefix_closes_the_connection():
    await run_bad_input(b"\xff\xff\xff\xff", "bad_size_prefix")


async def test_garbage_header_closes_the_connection():
    await run_bad_input(encode_frame(b"\x27\x0f\x00\x01garbage!"), "bad_header")


async def test_truncated_frame_closes_the_connection():
    await run_bad_input(encode_frame(request(1))[:-3], "truncated_frame")


async def test_version_the_proxy_does_not_advertise_closes_the_connection():
    await run_bad_input(encode_frame(request(1, FETCH, 16)), "unsupported_request")


async def test_unreachable_upstream_closes_the_connection():
    h = Harness(upstream_fails=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))
        await assert_closed_by_proxy(h)


async def test_upstream_answering_the_wrong_correlation_id_closes_the_connection():
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))
        await h.broker_receive()
        await h.broker.send_frame(response(99))
        await assert_closed_by_proxy(h)


async def test_stop_reading_still_delivers_responses_already_owed():
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))
        await h.broker_receive()
        h.connection.stop_reading()
        await h.broker.send_frame(response(1, b"owed"))
        assert await h.client.receive_frame() == response(1, b"owed")
        await assert_closed_by_proxy(h)


async def test_max_in_flight_stops_reading_a_client_that_never_reads(autojump_clock):
    h = Harness(max_in_flight=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        for cid in range(1, 6):
            await h.client.send_frame(request(cid))
        forwarded = []
        with trio.move_on_after(1):
            while True:
                forwarded.append(correlation_of(await h.broker_receive()))
        # Two slots in the order channel, one held by the writer waiting for its answer.
        assert forwarded == [1, 2, 3]
        nursery.cancel_scope.cancel()


# -- the byte budget (--max-connection-bytes) ---------------------------------------------

KIB = 1024


async def echo_broker(h: Harness, response_size: int, received: list[int]) -> None:
    """Answers every forwarded request with `response_size` bytes, recording what it got."""
    await h.broker_connected.wait()
    while (frame := await h.broker.receive_frame()) is not None:
        received.append(correlation_of(frame))
        await h.broker.send_frame(response(correlation_of(frame), b"r" * response_size))


async def test_a_client_that_never_reads_is_held_to_the_byte_budget():
    """500 pipelined 64 KiB requests with 64 KiB answers, none read: the proxy stops reading.

    max_in_flight (1000) would allow all 500 to be held (~64 MB); the budget (256 KiB) holds the
    connection to at most the budget plus one request and one response frame, measured both by
    the connection's own account and by tracemalloc, and every answer still arrives, in order,
    once the client reads.
    """
    import tracemalloc

    count, size, budget = 500, 64 * KIB, 256 * KIB
    h = Harness(max_in_flight=1000, max_bytes=budget, max_frame_size=1 << 20, lockstep=True)
    received: list[int] = []
    tracemalloc.start()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.connection.serve)
            baseline = tracemalloc.get_traced_memory()[0]

            async def flood() -> None:
                for cid in range(1, count + 1):
                    await h.client.send_frame(request(cid, PRODUCE, 9, b"\x00\x00\x01" + b"p" * size))

            nursery.start_soon(flood)
            nursery.start_soon(echo_broker, h, size, received)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            held_memory = tracemalloc.get_traced_memory()[0] - baseline
            stalled_at = len(received)
            assert stalled_at < 10, f"the proxy kept forwarding ({stalled_at} requests) to a client that never reads"
            assert h.connection.budget.peak <= budget + 2 * (size + 64)
            assert held_memory < 2 * 1024 * KIB, f"{held_memory} bytes held"

            answers = [await h.client.receive_frame() for _ in range(count)]
            assert [correlation_of(b"\0\0\0\0" + a) for a in answers] == list(range(1, count + 1))
            assert all(len(a) == 5 + size for a in answers)
            assert received == list(range(1, count + 1))
            await h.client_side.aclose()
    finally:
        tracemalloc.stop()


async def test_a_frame_larger_than_the_budget_still_passes_alone():
    budget, size = 4 * KIB, 40 * KIB
    h = Harness(max_bytes=budget, max_frame_size=1 << 20, lockstep=True)
    received: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        nursery.start_soon(echo_broker, h, size, received)

        async def send_three() -> None:
            for cid in (1, 2, 3):
                await h.client.send_frame(request(cid, body=b"q" * size))

        nursery.start_soon(send_three)
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        # The first answer (40 KiB) is held for the client; nothing else is read meanwhile
        # beyond one more request (forwarded, so released) and no second answer.
        assert h.connection.budget.held <= budget + 2 * (size + 64)
        for cid in (1, 2, 3):
            assert await h.client.receive_frame() == response(cid, b"r" * size)
        assert received == [1, 2, 3]
        await h.client_side.aclose()


async def test_local_requests_are_held_until_answered_and_count_against_the_budget():
    release = trio.Event()
    started: list[int] = []

    async def waiting_local(req: Request, connection: ClientConnection) -> bytes:
        started.append(req.header.correlation_id)
        await release.wait()
        return response(req.header.correlation_id, b"done")

    budget, size = 32 * KIB, 8 * KIB
    h = Harness(routes={LOCAL_API: ServeLocally(waiting_local)}, max_in_flight=1000, max_bytes=budget,
                max_frame_size=1 << 20, lockstep=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)

        async def flood() -> None:
            for cid in range(1, 101):
                await h.client.send_frame(request(cid, LOCAL_API, 1, b"x" * size))

        nursery.start_soon(flood)
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert len(started) == budget // size  # 4 requests of 8 KiB (+ header) reach 32 KiB
        release.set()
        answers = [await h.client.receive_frame() for _ in range(100)]
        assert answers == [response(cid, b"done") for cid in range(1, 101)]
        await h.client_side.aclose()


async def test_over_budget_the_response_the_writer_waits_for_is_still_read():
    """A later local answer fills the budget; the earlier forwarded answer must not deadlock."""

    async def big_local(req: Request, connection: ClientConnection) -> bytes:
        return response(req.header.correlation_id, b"L" * (64 * KIB))

    h = Harness(routes={LOCAL_API: ServeLocally(big_local)}, max_bytes=16 * KIB, max_frame_size=1 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))  # forwarded
        await h.client.send_frame(request(2, LOCAL_API, 1))  # answered at once, 64 KiB
        assert correlation_of(await h.broker_receive()) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert h.connection.budget.exhausted
        await h.broker.send_frame(response(1, b"forwarded"))
        with trio.fail_after(5):
            assert await h.client.receive_frame() == response(1, b"forwarded")
            assert await h.client.receive_frame() == response(2, b"L" * (64 * KIB))
        await h.client_side.aclose()


async def test_a_burst_of_buffered_requests_still_lets_other_tasks_run():
    """Forwarding on TCP passes no scheduling point; the reader yields every FRAMES_PER_YIELD frames."""
    from proxy.connection import FRAMES_PER_YIELD

    ticks = 0
    seen: list[int] = []  # the tick count when each request was handled

    class Recording:
        async def start(self, req: Request, connection: ClientConnection) -> None:
            seen.append(ticks)
            await connection.forward(req)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    async def drain(stream: trio.SocketStream) -> None:
        while await stream.receive_some(1 << 20):
            pass

    async with trio.open_nursery() as nursery:
        (broker,) = await nursery.start(functools.partial(trio.serve_tcp, drain, 0, host="127.0.0.1"))
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        client = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
        proxy_side = await listener.accept()

        async def open_upstream() -> FramedStream:
            return FramedStream(await trio.open_tcp_stream("127.0.0.1", broker.socket.getsockname()[1]), 1 << 20)

        connection = ClientConnection(FramedStream(proxy_side, 1 << 20), open_upstream=open_upstream,
                                      routes={PRODUCE: Recording()}, api_versions=ApiVersionTable(), max_in_flight=8)
        nursery.start_soon(connection.serve)
        await client.send_all(encode_frame(produce_request(0, acks=0)))  # opens the upstream connection
        while len(seen) < 1:
            await trio.sleep(0.01)
        nursery.start_soon(ticker)
        frames = 2000  # acks=0: no slot, so max_in_flight does not bound the burst
        await client.send_all(b"".join(encode_frame(produce_request(cid, acks=0)) for cid in range(1, frames + 1)))
        while len(seen) < frames + 1:
            await trio.sleep(0.01)
        runs = [len(list(group)) for _, group in itertools.groupby(seen[1:])]
        # The ticker and the reader run once each per scheduler batch, in either order.
        assert max(runs) <= 2 * FRAMES_PER_YIELD
        await client.aclose()
        await listener.aclose()
        nursery.cancel_scope.cancel()


# -- cut-through (--stream-responses-from): large responses passed on as they arrive -------------

STREAM = 128 * KIB


async def receive_at_least(stream, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = await stream.receive_some()
        assert chunk, "the proxy closed the connection"
        data += chunk
    return data


async def fetch_answered_in_part(h: Harness, size: int) -> bytes:
    """Send a Fetch, let the broker send a first part of a `size`-byte answer (enough for one
    streamed write); returns the whole answer frame."""
    await h.client.send_frame(request(1, FETCH, 12))
    await h.broker_receive()
    answer = encode_frame(response(1, os.urandom(size)))
    await h.broker.stream.send_all(answer[:STREAM_SEND_BYTES + 100 * KIB])
    return answer


@pytest.mark.parametrize("tcp", [False, True], ids=["memory", "tcp-spliced"])
async def test_a_large_response_the_writer_waits_for_reaches_the_client_before_its_last_byte_arrives(tcp):
    size = 1000 * KIB
    h = Harness(max_frame_size=1 << 20, stream_from=STREAM, tcp=tcp)
    streamed_before = metrics.RESPONSES_STREAMED._value.get()
    spliced_before = metrics.RESPONSES_SPLICED._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        answer = await fetch_answered_in_part(h, size)
        # The client gets a first part while the broker has not sent the rest.
        with trio.fail_after(5):  # gathered whole (store and forward), nothing would come
            early = await receive_at_least(h.client_side, STREAM_SEND_BYTES)
        await h.broker.stream.send_all(answer[STREAM_SEND_BYTES + 100 * KIB:])
        rest = await receive_at_least(h.client_side, len(answer) - len(early))
        assert early + rest == answer
        # The connection goes on: the next (small) response comes whole and in order.
        await h.client.send_frame(request(2))
        await h.broker_receive()
        await h.broker.send_frame(response(2, b"small"))
        assert await h.client.receive_frame() == response(2, b"small")
        await h.client_side.aclose()
    await h.aclose()
    assert metrics.RESPONSES_STREAMED._value.get() == streamed_before + 1
    # Between two plain sockets the kernel moved the bytes (splice), never the process.
    assert metrics.RESPONSES_SPLICED._value.get() == spliced_before + (1 if tcp else 0)
    assert h.connection.budget.held == 0


@pytest.mark.parametrize("tcp", [False, True], ids=["memory", "tcp-spliced"])
async def test_pipelined_large_responses_arrive_whole_and_in_order_streamed_or_not(tcp):
    h = Harness(max_frame_size=1 << 20, stream_from=STREAM, tcp=tcp)
    bodies = {cid: os.urandom(size) for cid, size in ((1, 300 * KIB), (2, 10), (3, 500 * KIB), (4, 200 * KIB))}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        for cid in bodies:
            await h.client.send_frame(request(cid, FETCH, 12))
        for cid in bodies:
            assert correlation_of(await h.broker_receive()) == cid
        for cid, body in bodies.items():
            await h.broker.send_frame(response(cid, body))
        assert [await h.client.receive_frame() for _ in bodies] == [response(cid, b) for cid, b in bodies.items()]
        await h.client_side.aclose()
    await h.aclose()


async def test_a_large_response_with_a_transform_is_gathered_and_transformed():
    async def upper(req: Request, frame: bytes) -> bytes:
        return frame[:5] + frame[5:].upper()

    h = Harness(routes={METADATA: Forward(transform=upper)}, max_frame_size=1 << 20, stream_from=STREAM)
    body = b"abc" * (100 * KIB)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))
        await h.broker_receive()
        await h.broker.send_frame(response(1, body))
        assert await h.client.receive_frame() == response(1, body.upper())
        await h.client_side.aclose()


@pytest.mark.parametrize("tcp", [False, True], ids=["memory", "tcp-spliced"])
async def test_upstream_closing_inside_a_streamed_response_closes_the_client_connection(tcp):
    h = Harness(max_frame_size=1 << 20, stream_from=STREAM, tcp=tcp)
    failures_before = metrics.UPSTREAM_FAILURES._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await fetch_answered_in_part(h, 1000 * KIB)
        with trio.fail_after(5):
            await receive_at_least(h.client_side, STREAM_SEND_BYTES)
        await h.broker.stream.aclose()
        with trio.fail_after(5):
            await h.connection.closed.wait()
    await h.aclose()
    assert metrics.UPSTREAM_FAILURES._value.get() == failures_before + 1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_client_closing_inside_a_spliced_response_closes_its_connection_and_the_pipe():
    fds_before = open_fds()
    h = Harness(max_frame_size=1 << 20, stream_from=STREAM, tcp=True)
    failures_before = metrics.UPSTREAM_FAILURES._value.get()
    spliced_before = metrics.RESPONSES_SPLICED._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        answer = await fetch_answered_in_part(h, 1000 * KIB)
        with trio.fail_after(5):
            await receive_at_least(h.client_side, STREAM_SEND_BYTES)
        await h.client_side.aclose()
        # The broker goes on sending what the client will never read.
        with trio.move_on_after(1):
            await h.broker.stream.send_all(answer[STREAM_SEND_BYTES + 100 * KIB:])
        with trio.fail_after(5):
            await h.connection.closed.wait()
    await h.aclose()
    assert metrics.RESPONSES_SPLICED._value.get() == spliced_before + 1
    assert metrics.UPSTREAM_FAILURES._value.get() == failures_before  # the client left; upstream was fine
    assert open_fds() == fds_before  # both sockets and the splice pipe's two ends


async def test_a_splice_pipe_holds_what_one_large_read_does_and_closes_both_ends():
    fds_before = open_fds()
    with SplicePipe() as pipe:
        # The kernel may refuse the size (fs.pipe-max-size, fs.pipe-user-pages-soft); then its
        # own stays, 2 pages at the least.
        assert 8 * KIB <= pipe.capacity <= 1 << 20
        assert open_fds() == fds_before + 2
    assert open_fds() == fds_before


async def test_without_stream_from_a_large_response_is_gathered_whole():
    h = Harness(max_frame_size=1 << 20)  # the default: off
    streamed_before = metrics.RESPONSES_STREAMED._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        answer = await fetch_answered_in_part(h, 900 * KIB)
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.2):
            assert not await h.client_side.receive_some(), "part of an incomplete response was passed on"
        await h.broker.stream.send_all(answer[STREAM_SEND_BYTES + 100 * KIB:])
        assert await receive_at_least(h.client_side, len(answer)) == answer
        await h.client_side.aclose()
    assert metrics.RESPONSES_STREAMED._value.get() == streamed_before


# -- cut-through for requests (--stream-requests-from): large Produce spliced upstream ---------------

PEEK_TOO = 64 * KIB  # the first part a test client sends: more than the proxy reads to decide


def large_produce(correlation_id: int, size: int, acks: int = 1) -> bytes:
    """A Produce v9 frame payload of about `size` bytes (only its header and acks are read here)."""
    return produce_request(correlation_id, acks) + os.urandom(size)


async def open_upstream_with_a_small_request(h: Harness) -> None:
    """Requests are streamed only to an upstream connection that is already open."""
    await h.client.send_frame(request(1))
    await h.broker_receive()
    await h.broker.send_frame(response(1, b"opened"))
    assert await h.client.receive_frame() == response(1, b"opened")


async def send_a_large_produce_in_part(h: Harness) -> tuple[bytes, bytes]:
    """Open the upstream connection, send the first part of a 1 MB Produce (correlation id 2) and
    wait until the broker has got well past the proxy's peek; returns (the whole frame with its
    size prefix, what the broker received so far)."""
    sent = encode_frame(large_produce(2, 1000 * KIB))
    await open_upstream_with_a_small_request(h)
    await h.client_side.send_all(sent[:PEEK_TOO + 200 * KIB])
    with trio.fail_after(5):  # gathered whole (store and forward), nothing would come
        early = await receive_at_least(h.broker.stream, PEEK_TOO + 100 * KIB)
    return sent, early


async def test_a_large_produce_reaches_the_broker_before_its_last_byte_leaves_the_client():
    h = Harness(max_frame_size=2 << 20, stream_requests_from=STREAM, tcp=True)
    streamed_before = metrics.REQUESTS_STREAMED._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        # The broker gets well past the proxy's peek while the client has not sent the rest.
        sent, early = await send_a_large_produce_in_part(h)
        await h.client_side.send_all(sent[PEEK_TOO + 200 * KIB:])
        rest = await receive_at_least(h.broker.stream, len(sent) - len(early))
        assert early + rest == sent  # byte for byte
        await h.broker.send_frame(response(2, b"written"))
        assert await h.client.receive_frame() == response(2, b"written")
        # The connection goes on: the next (small) request is forwarded whole and in order.
        await h.client.send_frame(request(3))
        assert correlation_of(await h.broker_receive()) == 3
        await h.broker.send_frame(response(3))
        assert await h.client.receive_frame() == response(3)
        await h.client_side.aclose()
    await h.aclose()
    assert metrics.REQUESTS_STREAMED._value.get() == streamed_before + 1
    assert h.connection.budget.held == 0


@pytest.mark.parametrize("tcp", [False, True], ids=["memory", "tcp-spliced"])
async def test_pipelined_large_and_small_requests_arrive_whole_and_in_order_streamed_or_not(tcp):
    h = Harness(max_frame_size=2 << 20, stream_requests_from=STREAM, tcp=tcp)
    streamed_before = metrics.REQUESTS_STREAMED._value.get()
    sent = {2: large_produce(2, 300 * KIB), 3: produce_request(3, acks=0) + os.urandom(500 * KIB),
            4: request(4), 5: large_produce(5, 200 * KIB), 6: large_produce(6, 129 * KIB)}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await open_upstream_with_a_small_request(h)

        async def client_sends() -> None:
            for frame in sent.values():
                await h.client.send_frame(frame)

        nursery.start_soon(client_sends)
        assert [await h.broker_receive() for _ in sent] == list(sent.values())
        for cid in (2, 4, 5, 6):  # 3 is acks=0: the broker never answers it
            await h.broker.send_frame(response(cid, b"answer-%d" % cid))
        assert [await h.client.receive_frame() for _ in range(4)] == [
            response(cid, b"answer-%d" % cid) for cid in (2, 4, 5, 6)]
        await h.client_side.aclose()
    await h.aclose()
    # Only between two plain sockets are requests streamed (spliced); in memory they are gathered.
    # A large frame the proxy's read already holds whole is not streamed either: which ones are
    # depends on how the kernel hands the bytes over.
    streamed = metrics.REQUESTS_STREAMED._value.get() - streamed_before
    assert 1 <= streamed <= 4 if tcp else streamed == 0
    assert h.connection.budget.held == 0


async def test_a_large_request_to_a_route_that_does_not_stream_is_gathered_whole():
    seen: list[bytes] = []

    async def local(req: Request, connection: ClientConnection) -> bytes:
        seen.append(req.frame)
        return response(req.header.correlation_id, b"%d" % len(req.frame))

    h = Harness(routes={LOCAL_API: ServeLocally(local)}, max_frame_size=2 << 20, stream_requests_from=STREAM,
                tcp=True)
    streamed_before = metrics.REQUESTS_STREAMED._value.get()
    big = request(2, LOCAL_API, 1, os.urandom(700 * KIB))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await open_upstream_with_a_small_request(h)
        await h.client.send_frame(big)
        assert await h.client.receive_frame() == response(2, b"%d" % len(big))
        await h.client_side.aclose()
    await h.aclose()
    assert seen == [big]
    assert metrics.REQUESTS_STREAMED._value.get() == streamed_before
    assert h.connection.budget.held == 0


async def test_before_the_upstream_connection_is_open_a_large_request_is_gathered_and_forwarded():
    h = Harness(max_frame_size=2 << 20, stream_requests_from=STREAM, tcp=True)
    streamed_before = metrics.REQUESTS_STREAMED._value.get()
    sent = large_produce(1, 600 * KIB)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        await h.broker.send_frame(response(1))
        assert await h.client.receive_frame() == response(1)
        await h.client_side.aclose()
    await h.aclose()
    assert metrics.REQUESTS_STREAMED._value.get() == streamed_before


async def test_a_client_closing_inside_a_spliced_request_closes_both_connections_and_the_pipe():
    fds_before = open_fds()
    h = Harness(max_frame_size=2 << 20, stream_requests_from=STREAM, tcp=True)
    failures_before = metrics.UPSTREAM_FAILURES._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await send_a_large_produce_in_part(h)
        await h.client_side.aclose()
        with trio.fail_after(5):
            await h.connection.closed.wait()
        # The broker's side sees the connection end: a half-sent request is never completed.
        with trio.fail_after(5):
            while await h.broker.stream.receive_some():
                pass
    await h.aclose()
    assert metrics.UPSTREAM_FAILURES._value.get() == failures_before  # the client left; upstream was fine
    assert open_fds() == fds_before  # all four sockets and the splice pipe's two ends


async def test_a_large_request_with_an_unsupported_version_closes_the_connection_without_going_upstream():
    h = Harness(max_frame_size=2 << 20, stream_requests_from=STREAM, tcp=True,
                api_versions=ApiVersionTable({PRODUCE: VersionRange(3, 8), METADATA: VersionRange(0, 12)}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await open_upstream_with_a_small_request(h)
        await h.client.send_frame(large_produce(2, 400 * KIB))  # v9: above what the proxy serves
        with trio.fail_after(5):
            await h.connection.closed.wait()
            # Closed with the request's rest unread, so the kernel may reset instead of ending.
            with contextlib.suppress(trio.BrokenResourceError):
                assert await h.client_side.receive_some(100) == b""
            # Nothing of it went upstream: the broker's side just ends.
            assert await h.broker.stream.receive_some(100) == b""
    await h.aclose()
