"""The metrics port's endpoints: readiness checks, liveness, HTTP handling, the upstream probe."""

from __future__ import annotations

import json
import threading
import time

import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter

from proxy.health import (
    STALL_LIMIT_S,
    HealthEndpoints,
    Liveness,
    Readiness,
    UpstreamProbe,
    handle,
    parse_request_line,
)


def ready_body(response) -> dict:
    return json.loads(response.body)


def test_readyz_lists_what_is_not_ready_and_is_200_only_when_all_pass():
    readiness = Readiness()
    readiness.set("share_state_replayed", False)
    writable = {"value": True}
    readiness.set_check("share_state_writable", lambda: writable["value"])
    endpoints = HealthEndpoints(readiness)
    answer = endpoints.answer("GET", "/readyz")
    assert answer.status == 503
    assert ready_body(answer) == {"ready": False, "not_ready": ["share_state_replayed"],
                                  "checks": {"share_state_replayed": False, "share_state_writable": True}}
    readiness.set("share_state_replayed", True)
    assert endpoints.answer("GET", "/readyz").status == 200
    writable["value"] = False
    assert ready_body(endpoints.answer("GET", "/readyz"))["not_ready"] == ["share_state_writable"]


def test_a_check_that_raises_reports_not_ready_instead_of_failing_the_endpoint():
    readiness = Readiness()
    readiness.set_check("broken", lambda: 1 / 0)
    answer = HealthEndpoints(readiness).answer("GET", "/readyz")
    assert (answer.status, ready_body(answer)["not_ready"]) == (503, ["broken"])


async def test_metrics_unknown_paths_and_methods():
    registry = CollectorRegistry()
    Counter("ksp_example", "example", registry=registry).inc(3)
    endpoints = HealthEndpoints(Readiness(), registry=registry, scrape_preparers=[])
    metrics = await endpoints.respond("GET", "/metrics")
    assert metrics.status == 200 and b"ksp_example_total 3.0" in metrics.body
    assert metrics.content_type.startswith("text/plain; version=")
    assert endpoints.answer("GET", "/nope").status == 404
    assert endpoints.answer("POST", "/healthz").status == 405
    assert endpoints.answer("GET", "/healthz?verbose").status == 200


class SlowCollector:
    """A collector whose formatting takes ``seconds`` and reports what prepared it and where it ran."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.prepared = 0
        self.collected_on: list[int] = []

    async def prepare(self) -> None:
        self.prepared += 1

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        self.collected_on.append(threading.get_ident())
        time.sleep(self.seconds)  # a big registry's formatting
        yield GaugeMetricFamily("ksp_prepared", "scrapes prepared before formatting", value=self.prepared)


async def test_a_scrape_is_prepared_on_the_loop_then_formatted_off_it_while_the_loop_runs():
    registry = CollectorRegistry()
    slow = SlowCollector(0.3)
    registry.register(slow)
    endpoints = HealthEndpoints(Readiness(), registry=registry, scrape_preparers=[slow.prepare])
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.sleep(0.02)
        before = ticks
        scraped = await endpoints.respond("GET", "/metrics")
        during = ticks - before
        nursery.cancel_scope.cancel()
    assert scraped.status == 200 and b"ksp_prepared 1.0" in scraped.body  # prepared, then formatted
    assert slow.collected_on != [threading.get_ident()]  # not formatted on the loop's thread
    assert during >= 10  # ~30 ticks of 10 ms while a 0.3 s formatting ran
    assert (await endpoints.respond("GET", "/healthz")).status == 200
    assert (await endpoints.respond("GET", "/nope")).status == 404
    assert slow.prepared == 1  # only scrapes are prepared


def test_healthz_is_503_once_after_the_loop_stalled():
    now = {"t": 100.0}
    liveness = Liveness(clock=lambda: now["t"])
    liveness.tick()
    now["t"] += 1.0
    liveness.tick()
    endpoints = HealthEndpoints(Readiness(), liveness)
    assert endpoints.answer("GET", "/healthz").status == 200
    now["t"] += 1.0 + STALL_LIMIT_S + 1  # the heartbeat task could not run: the loop was blocked
    liveness.tick()
    assert endpoints.answer("GET", "/healthz").status == 503
    now["t"] += 1.0
    liveness.tick()
    assert endpoints.answer("GET", "/healthz").status == 200  # reported once, then healthy again


def test_request_line_parsing():
    assert parse_request_line(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n") == ("GET", "/readyz")
    assert parse_request_line(b"\x16\x03\x01 garbage") is None
    assert parse_request_line(b"GET /readyz\r\n\r\n") is None


async def exchange(raw: bytes, endpoints: HealthEndpoints) -> bytes:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle, server, endpoints)
        await client.send_all(raw)
        received = b""
        while chunk := await client.receive_some():
            received += chunk
    return received


async def test_http_exchange_answers_and_closes():
    readiness = Readiness()
    readiness.set("upstream_reachable", False)
    answer = await exchange(b"GET /readyz HTTP/1.1\r\nHost: proxy\r\n\r\n", HealthEndpoints(readiness))
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert b"Connection: close" in head and f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body)["not_ready"] == ["upstream_reachable"]
    head_only = await exchange(b"HEAD /healthz HTTP/1.1\r\n\r\n", HealthEndpoints(readiness))
    assert head_only.startswith(b"HTTP/1.1 200 OK") and head_only.endswith(b"\r\n\r\n")


async def test_garbage_gets_400_and_a_silent_client_is_dropped(autojump_clock):
    assert (await exchange(b"\x00\x01garbage\r\n\r\n", HealthEndpoints(Readiness()))).startswith(b"HTTP/1.1 400")
    client, server = trio.testing.memory_stream_pair()
    with trio.fail_after(60):
        await handle(server, HealthEndpoints(Readiness()))  # nothing sent: gives up after its timeout
    assert (await client.receive_some()).startswith(b"HTTP/1.1 400")


async def test_upstream_probe_reports_an_unreachable_cluster():
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there now
    from proxy.config import HostPort

    probe = UpstreamProbe([HostPort("127.0.0.1", port)], max_frame_size=1 << 20, timeout_s=2)
    assert await probe.probe_once() is False
    assert probe.reachable is False and probe.last_error
