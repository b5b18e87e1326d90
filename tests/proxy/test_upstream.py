"""FramedStream: whole frames over trio streams (scatter writes on TCP, reads sized by the frame)."""

from __future__ import annotations

import os
import socket
import struct

import pytest
import trio
import trio.testing

from codec.framing import encode_frame
from proxy.config import HostPort
from proxy.upstream import (
    MAX_RECEIVE,
    NOTSENT_LOWAT,
    RECEIVE_CHUNK,
    UPSTREAM_NOTSENT_LOWAT,
    FramedStream,
    StreamedFrame,
    open_upstream,
)


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    for listener in listeners:
        await listener.aclose()
    return client, server


class CountingWritev:
    """Stands in for os.writev, counting the calls and what each one wrote."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, fd, buffers):
        written = REAL_WRITEV(fd, buffers)
        self.calls.append(written)
        return written


REAL_WRITEV = os.writev


@pytest.fixture
def writev(monkeypatch) -> CountingWritev:
    spy = CountingWritev()
    monkeypatch.setattr("proxy.upstream.os.writev", spy)
    return spy


async def test_frames_of_every_size_cross_tcp_intact():
    client, server = await tcp_pair()
    sender, receiver = FramedStream(client, 8 << 20), FramedStream(server, 8 << 20)
    payloads = [b"", b"x", os.urandom(70_000), os.urandom(3_000_000), b"tail"]
    received = []

    async def receive_all() -> None:
        for _ in payloads:
            received.append(await receiver.receive_frame())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_all)
        for payload in payloads:
            await sender.send_frame(payload)
    assert received == payloads
    await client.aclose()
    assert await receiver.receive_frame() is None
    await server.aclose()


async def test_on_tcp_a_frame_is_one_scatter_write_of_prefix_and_payload(writev):
    client, server = await tcp_pair()
    sender = FramedStream(client, 1 << 20)
    payload = os.urandom(100_000)  # above the size where prefix and payload used to go apart
    await sender.send_frame(payload)
    # The prefix never goes alone: the first call carries it and (part of) the payload.
    assert writev.calls[0] > 4 and sum(writev.calls) == 4 + len(payload)
    assert await FramedStream(server, 1 << 20).receive_frame() == payload
    await client.aclose()
    await server.aclose()


async def test_a_scatter_write_the_peer_cannot_take_at_once_is_finished_in_pieces(writev):
    client, server = await tcp_pair()
    sender = FramedStream(client, 64 << 20)
    payload = os.urandom(32 << 20)  # far more than loopback buffers hold
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.send_frame, payload)
        await trio.sleep(0.05)  # let the sender fill the buffers before anyone reads
        assert await FramedStream(server, 64 << 20).receive_frame() == payload
    assert len(writev.calls) > 1 and sum(writev.calls) == 4 + len(payload)
    await client.aclose()
    await server.aclose()


async def test_a_send_the_socket_takes_at_once_does_not_go_through_the_scheduler():
    client, server = await tcp_pair()
    sender = FramedStream(client, 1 << 20)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()  # the ticker is running
        before = ticks
        for _ in range(50):
            await sender.send_frame(b"x" * 100)
        assert ticks == before  # no send yielded
        nursery.cancel_scope.cancel()
    await client.aclose()
    await server.aclose()


async def test_closing_the_socket_while_a_send_waits_raises_closed_resource_error():
    client, server = await tcp_pair()
    sender = FramedStream(client, 64 << 20)
    raised: list[BaseException] = []

    async def send() -> None:
        try:
            await sender.send_frame(os.urandom(32 << 20))  # fills the buffers, then waits
        except trio.ClosedResourceError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.sleep(0.05)
        await client.aclose()
    assert len(raised) == 1
    await server.aclose()


async def test_sending_on_a_closed_tcp_stream_raises_closed_resource_error():
    client, server = await tcp_pair()
    framed = FramedStream(client, 1 << 20)
    client.socket.close()
    with pytest.raises(trio.ClosedResourceError):
        await framed.send_frame(b"hello")
    await server.aclose()


async def test_sending_to_a_peer_that_reset_raises_broken_resource_error():
    client, server = await tcp_pair()
    framed = FramedStream(client, 64 << 20)
    server.socket.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, struct.pack("ii", 1, 0))
    await server.aclose()  # linger 0: the peer answers with RST
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):
            await framed.send_frame(os.urandom(1 << 20))
            await trio.sleep(0.01)
    await client.aclose()


class RecordingStream(trio.abc.Stream):
    """Serves prepared bytes, as much as each receive_some asks for, recording what it asked."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.asked: list[int] = []

    async def receive_some(self, max_bytes=None):
        self.asked.append(max_bytes)
        chunk, self.data = bytes(self.data[:max_bytes]), self.data[max_bytes:]
        return chunk

    async def send_all(self, data) -> None:
        raise NotImplementedError

    async def wait_send_all_might_not_block(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


async def test_a_large_frame_is_read_in_reads_sized_by_what_it_still_misses():
    payload = os.urandom(3 * MAX_RECEIVE)
    stream = RecordingStream(encode_frame(payload) + encode_frame(b"next"))
    framed = FramedStream(stream, 8 << 20)
    assert await framed.receive_frame() == payload
    assert await framed.receive_frame() == b"next"
    # The first read cannot know the size; the next ones ask for the rest of the frame (capped).
    rest = len(payload) - (RECEIVE_CHUNK - 4) - 2 * MAX_RECEIVE
    assert stream.asked == [RECEIVE_CHUNK, MAX_RECEIVE, MAX_RECEIVE, rest, RECEIVE_CHUNK]


async def test_over_a_non_socket_stream_frames_still_go_whole():
    left, right = trio.testing.memory_stream_pair()
    sender, receiver = FramedStream(left, 1 << 20), FramedStream(right, 1 << 20)
    big = os.urandom(200_000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.send_frame, b"small")
        assert await receiver.receive_frame() == b"small"
        nursery.start_soon(sender.send_frame, big)
        assert await receiver.receive_frame() == big


async def test_a_tcp_stream_may_queue_more_unsent_bytes_than_trios_default():
    client, server = await tcp_pair()
    # trio sets 16 KiB; a large frame to a slow reader would go out in many small writes.
    FramedStream(client, 1 << 20)
    assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == NOTSENT_LOWAT
    await client.aclose()
    await server.aclose()


async def test_a_connection_to_a_broker_may_queue_a_few_large_requests_unsent():
    # A broker reads the next request only after answering the last: a whole ~1 MB Produce must
    # fit in the kernel behind it, or the proxy waits and wakes once per request to push its rest.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    upstream = await open_upstream(HostPort("127.0.0.1", port), timeout=5, max_frame_size=1 << 20)
    server = await listeners[0].accept()
    try:
        unsent_limit = upstream.stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)
    finally:
        for resource in (upstream, server, *listeners):
            await resource.aclose()
    assert unsent_limit == UPSTREAM_NOTSENT_LOWAT > 2 * NOTSENT_LOWAT


async def test_a_frame_the_caller_wants_streamed_comes_in_pieces_and_the_next_one_whole():
    payload = os.urandom(3 * MAX_RECEIVE)
    stream = RecordingStream(encode_frame(payload) + encode_frame(b"next"))
    framed = FramedStream(stream, 8 << 20)
    sizes: list[int] = []
    streamed = await framed.receive_frame(lambda size: sizes.append(size) or True)
    assert isinstance(streamed, StreamedFrame)
    assert sizes == [len(payload)] and streamed.size == len(payload)
    pieces = [streamed.head]
    while piece := await streamed.receive_more():
        pieces.append(piece)
    assert b"".join(pieces) == payload
    # The pieces never read past the frame: the next one is intact.
    assert await framed.receive_frame(lambda size: True) == b"next"


async def test_a_frame_the_caller_declines_to_stream_is_gathered_whole():
    payload = os.urandom(2 * MAX_RECEIVE)
    framed = FramedStream(RecordingStream(encode_frame(payload)), 8 << 20)
    assert await framed.receive_frame(lambda size: False) == payload


async def test_a_streamed_frame_cut_short_raises_eof():
    payload = os.urandom(2 * MAX_RECEIVE)
    framed = FramedStream(RecordingStream(encode_frame(payload)[:MAX_RECEIVE]), 8 << 20)
    streamed = await framed.receive_frame(lambda size: True)
    assert isinstance(streamed, StreamedFrame)
    with pytest.raises(EOFError):
        while await streamed.receive_more():
            pass


async def test_a_scattered_payload_goes_in_one_scatter_write_and_arrives_as_one_frame(writev):
    from codec.framing import ScatteredPayload

    client, server = await tcp_pair()
    records = os.urandom(300_000)
    payload = ScatteredPayload([b"head", memoryview(records)[1000:], b"", b"tail"])
    assert len(payload) == 8 + len(records) - 1000
    await FramedStream(client, 1 << 20).send_frame(payload)
    assert writev.calls[0] > 4 and sum(writev.calls) == 4 + len(payload)
    assert await FramedStream(server, 1 << 20).receive_frame() == bytes(payload)
    await client.aclose()
    await server.aclose()


async def test_over_a_non_socket_stream_scattered_payloads_still_go_whole():
    from codec.framing import ScatteredPayload

    left, right = trio.testing.memory_stream_pair()
    sender, receiver = FramedStream(left, 1 << 20), FramedStream(right, 1 << 20)
    for payload in (ScatteredPayload([b"small ", b"pieces"]), ScatteredPayload([b"big", os.urandom(200_000)])):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.send_frame, payload)
            assert await receiver.receive_frame() == bytes(payload)
