"""ClientConnection.call_upstream: the proxy's own requests on a client's upstream connection.

The same in-memory harness as test_connection.py: a fake broker on the far end of a memory
stream. Calls must keep their place in the upstream order, never interleave with a forwarded
frame, wait out a client's SASL exchange, and fail (closing the connection) when upstream does.
"""

from __future__ import annotations

import datetime
import io

import pytest
import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from codec.headers import encode_response_header, parse_request_header, response_header_version
from proxy import connection as connection_module
from proxy.connection import ClientConnection, Request, ServeLocally
from proxy.errors import UpstreamError
from tests.proxy.test_connection import LOCAL_API, Harness, correlation_of, request, response

HEARTBEAT = 12
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


def heartbeat_request(group_id: str = "g"):
    return load_request_schema(HEARTBEAT, 4)(group_id=group_id, generation_id=-1, member_id="",
                                             group_instance_id=None)


def heartbeat_response(correlation_id: int, error_code: int) -> bytes:
    entity = load_response_schema(HEARTBEAT, 4)(throttle_time=datetime.timedelta(0), error_code=ErrorCode(error_code))
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return encode_response_header(correlation_id, response_header_version(HEARTBEAT, 4)) + buffer.getvalue()


def is_call(frame: bytes) -> bool:
    return parse_request_header(frame)[0].api_key == HEARTBEAT


class Recorded:
    """A local route whose handler makes one call upstream and answers with the error code it got."""

    def __init__(self, before_call: trio.Event | None = None) -> None:
        self.before_call = before_call
        self.errors: list[Exception] = []
        self.results: list[int] = []

    async def handler(self, req: Request, connection: ClientConnection) -> bytes:
        if self.before_call is not None:
            await self.before_call.wait()
        try:
            answer = await connection.call_upstream(heartbeat_request())
        except UpstreamError as exc:
            self.errors.append(exc)
            raise
        self.results.append(int(answer.error_code))
        return response(req.header.correlation_id, b"code=%d" % int(answer.error_code))


async def answer_calls(h: Harness, frame: bytes, error_code: int = 30) -> None:
    if is_call(frame):
        await h.broker.send_frame(heartbeat_response(correlation_of(frame), error_code))
    else:
        await h.broker.send_frame(response(correlation_of(frame), b"fwd"))


async def test_a_call_takes_its_place_among_pipelined_forwarded_requests():
    route = Recorded()
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))
        await h.client.send_frame(request(2, LOCAL_API, 1))
        await h.client.send_frame(request(3))
        received = [await h.broker_receive() for _ in range(3)]
        # The broker sees the two forwarded frames byte for byte and one call, each whole.
        assert [f for f in received if not is_call(f)] == [request(1), request(3)]
        calls = [f for f in received if is_call(f)]
        assert len(calls) == 1
        header, _ = parse_request_header(calls[0])
        assert header.client_id == "test"  # the client's own client id
        for frame in received:  # answered in the order sent, as a broker does
            await answer_calls(h, frame)
        answers = [await h.client.receive_frame() for _ in range(3)]
        assert answers == [response(1, b"fwd"), response(2, b"code=30"), response(3, b"fwd")]
        await h.client_side.aclose()
    assert route.results == [30]
    assert h.connection.budget.held == 0  # the call's response was released once decoded


async def test_a_call_never_interleaves_with_a_large_forwarded_frame():
    # lockstep: each send blocks until the broker reads; a large frame is sent in two writes
    # (prefix, payload), between which an unlocked call could slip in.
    release = trio.Event()
    route = Recorded(before_call=release)
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)}, lockstep=True, max_frame_size=1 << 20)
    big = request(2, body=b"x" * (200 * 1024))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        nursery.start_soon(h.client.send_frame, big)
        await trio.sleep(0.01)
        release.set()
        frames = [await h.broker_receive() for _ in range(2)]
        # Both arrive whole: an interleaved call would have corrupted the big frame or itself.
        assert big in frames and sum(map(is_call, frames)) == 1
        for frame in frames:
            await answer_calls(h, frame, error_code=0)
        assert await h.client.receive_frame() == response(1, b"code=0")
        assert await h.client.receive_frame() == response(2, b"fwd")
        await h.client_side.aclose()


async def test_a_response_with_the_wrong_correlation_id_fails_the_call_and_closes_the_connection():
    route = Recorded()
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        call = await h.broker_receive()
        await h.broker.send_frame(heartbeat_response(correlation_of(call) + 1, 0))
        with trio.fail_after(5):
            assert await h.client_side.receive_some(100) == b""
            await h.connection.closed.wait()
    assert len(route.errors) == 1 and "correlation id" in str(route.errors[0])


async def test_an_upstream_failure_fails_the_call_and_closes_the_connection():
    route = Recorded()
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        await h.broker_receive()
        await h.broker.aclose()
        with trio.fail_after(5):
            assert await h.client_side.receive_some(100) == b""
            await h.connection.closed.wait()
    assert len(route.errors) == 1 and "upstream" in str(route.errors[0])


async def test_an_unreachable_upstream_fails_the_call():
    route = Recorded()
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)}, upstream_fails=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        with trio.fail_after(5):
            assert await h.client_side.receive_some(100) == b""
    assert len(route.errors) == 1 and "broker down" in str(route.errors[0])


def sasl_handshake(correlation_id: int) -> bytes:
    return request(correlation_id, SASL_HANDSHAKE, 1, b"\x00\x05PLAIN")


async def test_a_call_waits_while_the_client_is_in_a_sasl_exchange(autojump_clock):
    release = trio.Event()
    route = Recorded(before_call=release)
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))  # its handler will call upstream...
        await h.client.send_frame(sasl_handshake(2))  # ...but the client starts re-authenticating
        assert await h.broker_receive() == sasl_handshake(2)
        release.set()
        await h.client.send_frame(request(3, SASL_AUTHENTICATE, 2, b"\x01token"))
        assert correlation_of(await h.broker_receive()) == 3
        with trio.move_on_after(5) as idle:
            await h.broker_receive()  # nothing else may arrive mid-SASL
        assert idle.cancelled_caught
        await h.client.send_frame(request(4))  # the first non-SASL request ends the exchange
        frames = [await h.broker_receive() for _ in range(2)]
        assert sum(map(is_call, frames)) == 1 and request(4) in frames
        await h.broker.send_frame(response(2, b"hs"))
        await h.broker.send_frame(response(3, b"auth"))
        for frame in frames:
            await answer_calls(h, frame, error_code=0)
        assert [await h.client.receive_frame() for _ in range(4)] == [
            response(1, b"code=0"), response(2, b"hs"), response(3, b"auth"), response(4, b"fwd")]
        await h.client_side.aclose()


async def test_a_call_stuck_behind_a_sasl_exchange_gives_up_and_closes_the_connection(autojump_clock, monkeypatch):
    monkeypatch.setattr(connection_module, "SASL_WAIT_TIMEOUT_S", 10.0)
    release = trio.Event()
    route = Recorded(before_call=release)
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        await h.client.send_frame(sasl_handshake(2))
        await h.broker_receive()
        release.set()
        with trio.fail_after(30):
            assert await h.client_side.receive_some(100) == b""
            await h.connection.closed.wait()
    assert len(route.errors) == 1 and "SASL" in str(route.errors[0])


async def test_a_call_on_a_connection_that_is_not_serving_fails():
    h = Harness()
    with pytest.raises(UpstreamError):
        await h.connection.call_upstream(heartbeat_request())


def test_call_response_decodes_with_kio():
    # The fake broker's answer is a real Heartbeat v4 response (guards the helper above).
    frame = heartbeat_response(7, 30)
    entity, _ = entity_reader(load_response_schema(HEARTBEAT, 4))(frame, 5)
    assert int(entity.error_code) == 30


async def test_over_budget_a_call_behind_forwarded_responses_still_completes(autojump_clock):
    # The writer waits for the local answer, which waits for its call, which is queued upstream
    # behind a forwarded response while the connection holds more than its byte budget.
    release = trio.Event()
    route = Recorded(before_call=release)
    h = Harness(routes={LOCAL_API: ServeLocally(route.handler)}, max_bytes=1000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1, LOCAL_API, 1))
        await h.client.send_frame(request(2))
        await h.client.send_frame(request(3))
        assert [correlation_of(await h.broker_receive()) for _ in range(2)] == [2, 3]
        await h.broker.send_frame(response(2, b"x" * 2000))  # now over budget
        await trio.sleep(1)
        assert h.connection.budget.exhausted
        release.set()
        call = await h.broker_receive()
        assert is_call(call)
        await h.broker.send_frame(response(3, b"small"))
        await h.broker.send_frame(heartbeat_response(correlation_of(call), 0))
        with trio.fail_after(10):
            assert await h.client.receive_frame() == response(1, b"code=0")
            assert await h.client.receive_frame() == response(2, b"x" * 2000)
            assert await h.client.receive_frame() == response(3, b"small")
        await h.client_side.aclose()


async def test_a_response_the_broker_sends_just_before_closing_still_reaches_the_client():
    # A broker answers a failed SaslAuthenticate and closes the connection at once: the answer is
    # what tells the client why, so it must be written before the connection closes. (The writer
    # and the upstream reader's end-of-stream race; many rounds make a lost answer show up.)
    for _ in range(40):
        h = Harness()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.connection.serve)
            await h.client.send_frame(request(1, SASL_AUTHENTICATE, 2, b"\x01token"))
            await h.broker_receive()
            await h.broker.send_frame(response(1, b"authentication failed"))
            await h.broker.aclose()
            with trio.fail_after(5):
                assert await h.client.receive_frame() == response(1, b"authentication failed")
                assert await h.client.receive_frame() is None  # then the proxy closes too
                await h.connection.closed.wait()


async def test_after_the_broker_closes_the_proxy_closes_the_client_connection_too():
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(request(1))
        await h.broker_receive()
        await h.broker.send_frame(response(1, b"last"))
        await h.broker.aclose()
        with trio.fail_after(5):
            assert await h.client.receive_frame() == response(1, b"last")
            await h.connection.closed.wait()
    # Nothing read after the close: a request sent now finds the connection closed.
    with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
        for _ in range(10):
            await h.client.send_frame(request(2))
            await trio.sleep(0)
