"""The metrics port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

Served by a small HTTP/1.1 server on the proxy's own trio loop, so an answer from ``/healthz``
proves the loop runs (a thread-based server, like prometheus_client's, answers even while the
loop is wedged).

* ``/healthz``: 200 while the loop runs; 503 when its heartbeat (a task ticking every
  :data:`HEARTBEAT_INTERVAL_S`) was late by more than :data:`STALL_LIMIT_S` -- the loop was blocked
  (the probe got an answer only once the stall ended).
* ``/readyz``: 200 only when every readiness check passes, else 503. The body is JSON:
  ``{"ready": bool, "checks": {name: bool}, "not_ready": [names]}``. Checks (see docs/metrics.md):
  ``upstream_reachable`` (the last probe of the upstream cluster -- a connection to a bootstrap
  broker answering ApiVersions, every :data:`PROBE_INTERVAL_S` -- succeeded), and with share groups
  ``share_state_replayed`` (the state topic was replayed into the engines; until then no share API
  is routed) and ``share_state_writable`` (the last state-topic write did not fail).
* ``/metrics``: the Prometheus text exposition of the default registry. Collectors that read the
  loop's state (the share groups', ~10 us per share-partition) read it first, on the loop in time
  slices (:data:`proxy.metrics.SCRAPE_PREPARERS`); the text is then formatted in a worker thread, one
  scrape at a time (:func:`proxy.exposition.exposition`). A scrape of 10,000 share-partitions used
  to hold the loop for 0.15-0.4 s, and for seconds with ``--metrics-per-partition``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog
import trio
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY

from proxy.config import HostPort
from proxy.errors import UpstreamError
from proxy.exposition import exposition
from proxy.metrics import SCRAPE_PREPARERS
from proxy.security import UpstreamSecurity
from proxy.upstream import UpstreamClient, open_first_upstream

log = structlog.get_logger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
STALL_LIMIT_S = 5.0
PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 3.0
MAX_REQUEST_HEAD = 8192
REQUEST_TIMEOUT_S = 5.0


@dataclass
class Readiness:
    """Named readiness checks; the proxy is ready when all pass."""

    checks: dict[str, Callable[[], bool]] = field(default_factory=dict)

    def set_check(self, name: str, check: Callable[[], bool]) -> None:
        self.checks[name] = check

    def set(self, name: str, value: bool) -> None:
        self.checks[name] = (lambda: value)

    def report(self) -> dict[str, bool]:
        out = {}
        for name, check in sorted(self.checks.items()):
            try:
                out[name] = bool(check())
            except Exception:  # noqa: BLE001 - a broken check reports not ready, never a 500
                log.exception("readiness check failed", check=name)
                out[name] = False
        return out


READINESS = Readiness()
"""The process's readiness checks (serve.py and the share runtime add theirs)."""


@dataclass
class Liveness:
    """The loop's heartbeat: when the last tick ran, and the longest gap seen since the last answer."""

    clock: Callable[[], float] = trio.current_time
    last_tick: float = -math.inf
    worst_gap: float = 0.0

    def tick(self) -> None:
        now = self.clock()
        if self.last_tick != -math.inf:
            self.worst_gap = max(self.worst_gap, now - self.last_tick - HEARTBEAT_INTERVAL_S)
        self.last_tick = now

    def alive(self) -> bool:
        """False when the loop stalled longer than STALL_LIMIT_S since the previous question."""
        stalled = max(self.worst_gap, self.clock() - self.last_tick - HEARTBEAT_INTERVAL_S) > STALL_LIMIT_S
        self.worst_gap = 0.0
        return not stalled

    async def run(self) -> None:
        while True:
            self.tick()
            await trio.sleep(HEARTBEAT_INTERVAL_S)


class UpstreamProbe:
    """Is the upstream cluster reachable? A bootstrap broker answering ApiVersions, checked periodically."""

    def __init__(self, upstream: Sequence[HostPort], *, max_frame_size: int, interval_s: float = PROBE_INTERVAL_S,
                 timeout_s: float = PROBE_TIMEOUT_S, security: UpstreamSecurity | None = None) -> None:
        self.upstream = list(upstream)
        self.security = security  # TLS and the service credentials: "reachable" means usable by the proxy
        self.max_frame_size = max_frame_size
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.reachable = False
        self.last_error = "not probed yet"

    async def probe_once(self) -> bool:
        try:
            with trio.fail_after(self.timeout_s):
                _, stream = await open_first_upstream(self.upstream, timeout=self.timeout_s,
                                                      max_frame_size=self.max_frame_size,
                                                      security=self.security, authenticate=True)
                client = UpstreamClient(stream, client_id="kafka-share-proxy-health")
                try:
                    await client.api_versions()
                finally:
                    await client.aclose()
        except (UpstreamError, OSError, trio.TooSlowError) as exc:
            self._set(False, str(exc) or type(exc).__name__)
            return False
        self._set(True, "")
        return True

    def _set(self, reachable: bool, error: str) -> None:
        if reachable != self.reachable:
            if reachable:
                log.info("upstream reachable")
            else:
                log.warning("upstream NOT reachable", error=error)
        self.reachable, self.last_error = reachable, error

    async def run(self) -> None:
        while True:
            await self.probe_once()
            await trio.sleep(self.interval_s)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


METRICS_PATHS = ("/metrics", "/")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthEndpoints:
    """What each path answers (no sockets: tests call :meth:`answer` or :meth:`respond` directly)."""

    def __init__(self, readiness: Readiness = READINESS, liveness: Liveness | None = None,
                 registry=REGISTRY, scrape_preparers: Sequence[Callable[[], Awaitable[None]]] = SCRAPE_PREPARERS
                 ) -> None:
        self.readiness = readiness
        self.liveness = liveness
        self.registry = registry
        self.scrape_preparers = scrape_preparers
        self._scrape_lock = trio.Lock()  # a preparer keeps one reading for the scrape that follows

    async def respond(self, method: str, target: str) -> Response:
        """The answer to a request: :meth:`answer`, or a scrape (formatted off the loop's thread)."""
        if method not in ("GET", "HEAD") or target.split("?", 1)[0] not in METRICS_PATHS:
            return self.answer(method, target)
        async with self._scrape_lock:
            for prepare in self.scrape_preparers:
                await prepare()
            body = await trio.to_thread.run_sync(exposition, self.registry)
        return Response(200, body, CONTENT_TYPE_LATEST)

    def answer(self, method: str, target: str) -> Response:
        """The answer to any request but a scrape (those need :meth:`respond`)."""
        if method not in ("GET", "HEAD"):
            return Response(405, b"only GET and HEAD\n")
        path = target.split("?", 1)[0]
        if path == "/healthz":
            alive = self.liveness is None or self.liveness.alive()
            return Response(200, b"ok\n") if alive else Response(503, b"event loop stalled\n")
        if path == "/readyz":
            checks = self.readiness.report()
            not_ready = [name for name, ok in checks.items() if not ok]
            body = json.dumps({"ready": not not_ready, "checks": checks, "not_ready": not_ready}).encode() + b"\n"
            return Response(503 if not_ready else 200, body, "application/json")
        return Response(404, b"not found: try /metrics, /healthz or /readyz\n")


def parse_request_line(head: bytes) -> tuple[str, str] | None:
    """(method, target) from an HTTP request head, None when it is not HTTP/1.x."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    return parts[0], parts[1]


def render(response: Response, *, head_only: bool = False) -> bytes:
    header = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return header if head_only else header + response.body


async def handle(stream: trio.abc.Stream, endpoints: HealthEndpoints) -> None:
    """One HTTP exchange, then close (probes and scrapers open a connection per request)."""
    try:
        head = b""
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_HEAD:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                head += chunk
        parsed = parse_request_line(head) if b"\r\n\r\n" in head else None
        if parsed is None:
            await stream.send_all(render(Response(400, b"bad request\n")))
            return
        method, target = parsed
        await stream.send_all(render(await endpoints.respond(method, target), head_only=method == "HEAD"))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:  # noqa: BLE001 - a bad probe must never take the proxy down
        log.exception("health endpoint failed")
    finally:
        await trio.aclose_forcefully(stream)


async def serve_health(host: str, port: int, endpoints: HealthEndpoints, *,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on host:port until cancelled; reports the bound port to ``nursery.start``."""
    listeners = await trio.open_tcp_listeners(port, host=host or None)
    bound = listeners[0].socket.getsockname()[1]
    log.info("metrics and health endpoints", port=bound)
    task_status.started(bound)

    async def handler(stream: trio.abc.Stream) -> None:
        await handle(stream, endpoints)

    await trio.serve_listeners(handler, listeners)


__all__ = ["READINESS", "HealthEndpoints", "Liveness", "Readiness", "UpstreamProbe", "serve_health"]
