"""The proxy server: listeners, the broker directory, the route table, shutdown.

Port-per-broker: one bootstrap listener (forwarding to the first reachable
``--upstream`` address) plus one listener per upstream broker id. Clients learn
the per-broker ports from rewritten Metadata / FindCoordinator / DescribeCluster
responses. Broker ``N`` is served on ``broker_port_base + N`` when a base is
configured (or implied by a fixed ``--listen`` port), so restarts and replicas
agree; with ``--listen HOST:0`` and no base, free ports are picked, stable for
the life of the process. A broker id seen for the first time in any response
gets its listener before that response reaches the client.

TLS: with ``listener_ssl_certificate_location`` every listener serves TLS (no mixed mode).
The handshake runs in the connection's own task, never in the accept loop, under
``listener_ssl_handshake_timeout_ms``: garbage or a stalled handshake costs only that
connection (closed, logged once, counted in ``ksp_tls_handshake_failures_total``), and the
connection counts against ``max_connections`` from the moment it is accepted. Upstream,
clients' pass-through connections get TLS per ``upstream_security_protocol`` but no SASL
from the proxy (a client authenticates itself, byte for byte); broker discovery, the
proxy's own connection, authenticates with the service credentials.
"""

from __future__ import annotations

import errno
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from codec.headers import API_VERSIONS_KEY, FLEXIBILITY, parse_response_header
from codec.registry import DEFAULT_REGISTRY
from proxy import metrics
from proxy.apiversions import (
    UNSUPPORTED_VERSION,
    ApiVersionTable,
    narrow_response,
    unsupported_version_response,
)
from proxy.config import HostPort, ProxyConfig
from proxy.connection import BOOTSTRAP_NODE_ID, ClientConnection, Forward, Request, Route
from proxy.errors import ProxyError, UpstreamAuthenticationError, UpstreamError, UpstreamTlsError
from proxy.route_cluster import DESCRIBE_TOPIC_PARTITIONS
from proxy.rewrite import (
    DESCRIBE_CLUSTER,
    FIND_COORDINATOR,
    METADATA,
    Endpoint,
    decode_response,
    encode_response,
    locate_metadata_brokers,
    rewrite_endpoints,
    upstream_endpoints,
)
from proxy.security import ListenerTls, UpstreamSecurity
from proxy.upstream import FramedStream, UpstreamClient, open_first_upstream, open_upstream

log = structlog.get_logger("proxy.server")

BOOTSTRAP = "bootstrap"


class BrokerDirectory:
    """Upstream broker id -> upstream address and the proxy port that stands for it."""

    def __init__(self, advertised_host: str, port_base: int | None, open_listener) -> None:
        self.advertised_host = advertised_host
        self.port_base = port_base
        self._open_listener = open_listener
        self.upstream: dict[int, HostPort] = {}
        self.ports: dict[int, int] = {}
        self._lock = trio.Lock()

    def port_for(self, node_id: int) -> int:
        """The port planned for a broker id (0 = pick a free one)."""
        return 0 if self.port_base is None else self.port_base + node_id

    async def learn(self, endpoints: Iterable[Endpoint]) -> None:
        """Record upstream addresses; start a listener for every broker id not yet served."""
        async with self._lock:
            for endpoint in endpoints:
                address = HostPort(endpoint.host, endpoint.port)
                if self.upstream.get(endpoint.node_id) != address:
                    log.info("upstream broker", node_id=endpoint.node_id, address=str(address))
                self.upstream[endpoint.node_id] = address
                if endpoint.node_id not in self.ports:
                    planned = self.port_for(endpoint.node_id)
                    if not 0 <= planned <= 65535:
                        raise ProxyError(f"port {planned} for broker {endpoint.node_id} is out of range")
                    self.ports[endpoint.node_id] = await self._open_listener(endpoint.node_id, planned)

    def advertised(self, node_id: int) -> tuple[str, int]:
        return self.advertised_host, self.ports[node_id]


class ApiVersionsRoute:
    """Forward ApiVersions and narrow the answer; answer unknown versions locally, as Kafka does."""

    #: Narrowed answers kept (every client of a cluster gets the same few broker answers).
    CACHE_ENTRIES = 16

    def __init__(self, table: ApiVersionTable) -> None:
        self.table = table
        # (request version, the broker's body bytes, table generation) -> the narrowed body.
        # Decoding, narrowing and encoding ~90 API ranges cost ~2.5 ms per connection.
        self._narrowed: dict[tuple[int, bytes, int], bytes] = {}

    async def start(self, request: Request, connection: ClientConnection) -> None:
        header = request.header
        if header.api_version not in self.table.api_versions_range:
            await connection.respond(
                request, unsupported_version_response(header.correlation_id, self.table.api_versions_range)
            )
            return
        await connection.forward(request, self.narrow)

    async def narrow(self, request: Request, payload: bytes) -> bytes:
        # The response header is v0 (the correlation id alone) in every version: the body after
        # it is the same for every client, so it is narrowed once.
        key = (request.header.api_version, bytes(payload[4:]), self.table.generation)
        body = self._narrowed.get(key)
        if body is None:
            body = self._narrow(request.header.api_version, payload)[4:]
            if len(self._narrowed) >= self.CACHE_ENTRIES:
                self._narrowed.clear()
            self._narrowed[key] = body
        return bytes(payload[:4]) + body

    def _narrow(self, version: int, payload: bytes) -> bytes:
        # A broker that does not know this version answers with a v0 body (header is always v0).
        _, body_offset = parse_response_header(payload, 0)
        if payload[body_offset : body_offset + 2] == UNSUPPORTED_VERSION.to_bytes(2, "big"):
            version = 0
        header, entity = decode_response(API_VERSIONS_KEY, version, payload)
        return encode_response(header, narrow_response(entity, self.table))


class EndpointRewrite:
    """Response transform: learn the brokers a response names, then rewrite them to the proxy.

    With ``routing`` (scale-out, proxy/share/routing.py) the brokers are still learned -- this
    instance listens for each of them -- but the answer names virtual nodes: every instance's
    listener per broker, each partition at the instance that leads it, each group's coordinator
    at the instance that coordinates it."""

    def __init__(self, directory: BrokerDirectory) -> None:
        self.directory = directory
        self.routing = None  # proxy.share.routing.InstanceRouting with --instance-id

    async def _routed(self, request: Request, payload: bytes, asked=None) -> bytes:
        api_key, api_version = request.header.api_key, request.header.api_version
        routing = self.routing
        if api_key == METADATA:
            endpoints = locate_metadata_brokers(api_version, payload).endpoints()
            if endpoints:
                await self.directory.learn(endpoints)
            routed = routing.metadata(api_version, payload)
        elif api_key == DESCRIBE_TOPIC_PARTITIONS:
            routed = routing.describe_topic_partitions(api_version, payload)
        else:
            header, entity = decode_response(api_key, api_version, payload)
            endpoints = upstream_endpoints(api_key, entity)
            if endpoints:
                await self.directory.learn(endpoints)
            if api_key == FIND_COORDINATOR:
                # The request frame is released once forwarded: its keys were read on the way out
                # (FindCoordinatorForward) and travel with the request.
                routed = routing.find_coordinator(api_version, payload, asked)
            elif api_key == DESCRIBE_CLUSTER:
                routed = routing.describe_cluster(api_version, payload)
            else:
                return encode_response(header, rewrite_endpoints(api_key, entity, self.directory.advertised))
        metrics.REWRITES.labels(api_key=str(api_key)).inc()
        return routed

    async def __call__(self, request: Request, payload: bytes) -> bytes:
        api_key, api_version = request.header.api_key, request.header.api_version
        if self.routing is not None:
            return await self._routed(request, payload)
        if api_key == DESCRIBE_TOPIC_PARTITIONS:
            return payload  # node ids are the upstream's own without routing
        if api_key == METADATA:
            # Only its brokers array is read and written (proxy.rewrite): the topics pass as bytes.
            brokers = locate_metadata_brokers(api_version, payload)
            endpoints = brokers.endpoints()
            if not endpoints:
                return payload
            await self.directory.learn(endpoints)
            metrics.REWRITES.labels(api_key=str(api_key)).inc()
            return brokers.rewritten(self.directory.advertised)
        header, entity = decode_response(api_key, api_version, payload)
        endpoints = upstream_endpoints(api_key, entity)
        if not endpoints:
            return payload
        await self.directory.learn(endpoints)
        metrics.REWRITES.labels(api_key=str(api_key)).inc()
        return encode_response(header, rewrite_endpoints(api_key, entity, self.directory.advertised))


@dataclass(frozen=True, slots=True)
class FindCoordinatorForward:
    """FindCoordinator's route: forwarded and rewritten like the other endpoint answers; with
    scale-out routing the request is read first, because answers before v4 do not repeat the key
    that decides which instance coordinates it."""

    rewrite: EndpointRewrite

    async def start(self, request: Request, connection) -> None:
        if self.rewrite.routing is None:
            await connection.forward(request, self.rewrite)
            return
        header = request.header
        asked = DEFAULT_REGISTRY.decode_request(header.api_key, header.api_version,
                                                memoryview(request.frame)[request.body_offset:])

        async def transform(answered: Request, payload: bytes) -> bytes:
            return await self.rewrite._routed(answered, payload, asked)

        await connection.forward(request, transform)


class Proxy:
    def __init__(self, config: ProxyConfig, api_versions: ApiVersionTable | None = None) -> None:
        self.config = config
        # Built once, here: a certificate, key or CA that does not load is a ConfigError naming it.
        self.listener_tls: ListenerTls | None = ListenerTls(config) if config.listener_tls else None
        self.upstream_security: UpstreamSecurity | None = UpstreamSecurity.from_config(config)
        self._tls_failures_unlogged = 0
        self._tls_failure_logged_at = float("-inf")
        self.api_versions = api_versions or ApiVersionTable()
        self.directory = BrokerDirectory(
            config.effective_advertised_host, config.effective_broker_port_base, self._open_broker_listener
        )
        self.endpoint_rewrite = EndpointRewrite(self.directory)
        rewrite = Forward(self.endpoint_rewrite)
        # The dispatch table. APIs not listed are forwarded byte for byte; later
        # issues add `ServeLocally(...)` entries (ShareFetch & co.) here, together
        # with `api_versions.register_local(...)`.
        self.routes: dict[int, Route] = {
            API_VERSIONS_KEY: ApiVersionsRoute(self.api_versions),
            METADATA: rewrite,
            FIND_COORDINATOR: FindCoordinatorForward(self.endpoint_rewrite),
            DESCRIBE_CLUSTER: rewrite,
            # Node ids only, no endpoints: rewritten in scale-out (virtual nodes), else passed on.
            DESCRIBE_TOPIC_PARTITIONS: rewrite,
        }
        self.bootstrap: HostPort | None = None
        self._shutdown = trio.Event()
        self._listener_nursery: trio.Nursery | None = None
        self._connection_nursery: trio.Nursery | None = None
        self._connections: set[ClientConnection] = set()
        # Counted in the accept loop itself (not in the spawned task), so that a burst of
        # accepts cannot overshoot --max-connections before the tasks start.
        self.open_connections = 0
        self.refused_connections = 0
        self._refusals_unlogged = 0
        self._refusal_logged_at = float("-inf")
        self._all_closed = trio.Event()
        self._all_closed.set()

    def shutdown(self) -> None:
        """Begin graceful shutdown (idempotent)."""
        self._shutdown.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen until :meth:`shutdown`; ``task_status.started(bootstrap HostPort)`` when ready."""
        config = self.config
        async with trio.open_nursery() as connection_nursery:
            self._connection_nursery = connection_nursery
            async with trio.open_nursery() as listener_nursery:
                self._listener_nursery = listener_nursery
                listener = await self._bind(config.listen.host, config.listen.port)
                bound_port = listener.socket.getsockname()[1]
                self.bootstrap = HostPort(config.effective_advertised_host, bound_port)
                listener_nursery.start_soon(self._accept_loop, listener, BOOTSTRAP, self._open_bootstrap_upstream,
                                            BOOTSTRAP_NODE_ID)
                await self._discover_brokers()
                log.info("listening", bootstrap=str(self.bootstrap), brokers=dict(self.directory.ports))
                task_status.started(self.bootstrap)
                await self._shutdown.wait()
                log.info("shutting down", open_connections=len(self._connections))
                listener_nursery.cancel_scope.cancel()
            for connection in list(self._connections):
                connection.stop_reading()
            with trio.move_on_after(config.shutdown_grace):
                # Loop: a connection accepted just before the listeners closed may
                # register after this wait began.
                while self._connections:
                    await self._all_closed.wait()
                    await trio.sleep(0)
            connection_nursery.cancel_scope.cancel()
        log.info("stopped")

    # -- listeners --------------------------------------------------------------

    async def _bind(self, host: str, port: int) -> trio.SocketListener:
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ProxyError(f"port {port} on {host} is already in use") from exc
            raise ProxyError(f"cannot listen on {host}:{port}: {exc}") from exc
        for extra in listeners[1:]:
            await extra.aclose()
        return listeners[0]

    async def _open_broker_listener(self, node_id: int, port: int) -> int:
        assert self._listener_nursery is not None
        listener = await self._bind(self.config.listen.host, port)
        bound = listener.socket.getsockname()[1]

        async def open_broker() -> FramedStream:
            address = self.directory.upstream[node_id]
            # The client's own connection: TLS as configured, no SASL (the client sends its own).
            return await open_upstream(
                address, timeout=self.config.connect_timeout, max_frame_size=self.config.max_upstream_frame_size,
                security=self.upstream_security,
            )

        self._listener_nursery.start_soon(self._accept_loop, listener, f"broker-{node_id}", open_broker, node_id)
        log.info("broker listener", node_id=node_id, port=bound)
        return bound

    async def _accept_loop(self, listener: trio.SocketListener, name: str, open_upstream, node_id: int) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    # Out of file descriptors and the like: back off, keep serving.
                    log.error("accept failed", listener=name, error=str(exc))
                    await trio.sleep(0.1)
                    continue
                if self.open_connections >= self.config.max_connections:
                    await self._refuse(stream, name)
                    continue
                self.open_connections += 1
                assert self._connection_nursery is not None
                self._connection_nursery.start_soon(self._serve_connection, stream, name, open_upstream, node_id)

    async def _refuse(self, stream: trio.SocketStream, name: str) -> None:
        """Close a connection beyond --max-connections at once: it costs nothing more."""
        await trio.aclose_forcefully(stream)
        metrics.CONNECTIONS_REFUSED.labels(listener=name).inc()
        self.refused_connections += 1
        self._refusals_unlogged += 1
        # A flood of refusals must not become a flood of log lines: at most one every 10 s.
        now = time.monotonic()
        if now - self._refusal_logged_at >= 10.0:
            log.warning(
                "connection refused: max connections open",
                listener=name,
                max_connections=self.config.max_connections,
                refused_since_last_log=self._refusals_unlogged,
            )
            self._refusal_logged_at = now
            self._refusals_unlogged = 0

    async def _serve_connection(self, stream: trio.SocketStream, name: str, open_upstream, node_id: int) -> None:
        try:
            await self._serve_client(stream, name, open_upstream, node_id)
        finally:
            self.open_connections -= 1  # counted by the accept loop

    async def _serve_client(self, stream: trio.SocketStream, name: str, open_upstream, node_id: int) -> None:
        metrics.CONNECTIONS_ACCEPTED.labels(listener=name).inc()
        try:
            peer = "%s:%s" % stream.socket.getpeername()[:2]
        except OSError:
            peer = "?"
        client_stream: trio.abc.Stream = stream
        if self.listener_tls is not None:
            secured = await self._tls_accept(stream, name, peer)
            if secured is None:
                return
            client_stream = secured
        connection = ClientConnection(
            FramedStream(client_stream, self.config.max_frame_size),
            open_upstream=open_upstream,
            routes=self.routes,
            api_versions=self.api_versions,
            max_in_flight=self.config.max_in_flight,
            max_bytes=self.config.max_connection_bytes,
            stream_from=self.config.effective_stream_responses_from,
            stream_requests_from=self.config.effective_stream_requests_from,
            listener=name,
            node_id=node_id,
            peer=peer,
        )
        self._connections.add(connection)
        self._all_closed = trio.Event()
        if self._shutdown.is_set():
            connection.stop_reading()
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            if not self._connections:
                self._all_closed.set()

    async def _tls_accept(self, stream: trio.SocketStream, name: str, peer: str) -> trio.SSLStream | None:
        """The server side of the TLS handshake, bounded by the handshake timeout; None (the
        connection closed, the failure logged and counted) when it does not complete."""
        assert self.listener_tls is not None
        self.listener_tls.maybe_reload()  # cheap: looks at the files at most once per interval
        # https_compatible: a client closing without close_notify is an ordinary end of stream
        # (Kafka frames are length-prefixed, so truncation is detected anyway).
        tls = trio.SSLStream(stream, self.listener_tls.context, server_side=True, https_compatible=True)
        detail = ""
        try:
            with trio.fail_after(self.config.listener_ssl_handshake_timeout_ms / 1000):
                await tls.do_handshake()
            return tls
        except trio.TooSlowError:
            reason = "timeout"
        except trio.BrokenResourceError as exc:
            reason, detail = handshake_failure_reason(exc.__cause__)
        except OSError as exc:
            reason, detail = "closed", exc.strerror or str(exc)
        await trio.aclose_forcefully(stream)
        metrics.TLS_HANDSHAKE_FAILURES.labels(listener=name, reason=reason).inc()
        self._log_tls_failure(name, peer, reason, detail)
        return None

    def _log_tls_failure(self, name: str, peer: str, reason: str, detail: str) -> None:
        # One line per failed connection, but a flood (a scanner, a misconfigured fleet) must not
        # become a flood of lines: at most 10 a second, the rest summed into the next line.
        self._tls_failures_unlogged += 1
        now = time.monotonic()
        if now - self._tls_failure_logged_at < 0.1:
            return
        log.info("TLS handshake failed; connection closed", listener=name, peer=peer, reason=reason,
                 detail=detail or None, failures_since_last_log=self._tls_failures_unlogged)
        self._tls_failure_logged_at = now
        self._tls_failures_unlogged = 0

    # -- upstream ---------------------------------------------------------------

    async def _open_bootstrap_upstream(self) -> FramedStream:
        _, stream = await open_first_upstream(
            self.config.upstream,
            timeout=self.config.connect_timeout,
            max_frame_size=self.config.max_upstream_frame_size,
            security=self.upstream_security,
        )
        return stream

    async def _discover_brokers(self) -> None:
        """Ask the upstream cluster for its brokers and start their listeners.

        If the cluster cannot be reached now, start anyway: listeners are added
        as soon as a client's Metadata response names the brokers.
        """
        try:
            address, stream = await open_first_upstream(
                self.config.upstream,
                timeout=self.config.connect_timeout,
                max_frame_size=self.config.max_upstream_frame_size,
                security=self.upstream_security,
                authenticate=True,
            )
        except (UpstreamAuthenticationError, UpstreamTlsError):
            raise  # a configuration problem, not an outage: start-up fails with it
        except UpstreamError as exc:
            log.warning("upstream unreachable at start; brokers will be learned later", error=str(exc))
            return
        client = UpstreamClient(stream)
        try:
            versions = await client.api_versions()
            version = _common_max(versions.get(METADATA), FLEXIBILITY[METADATA])
            brokers = await client.metadata_brokers(version)
        except Exception as exc:  # discovery is best effort; clients' Metadata fills in later
            log.warning("broker discovery failed; brokers will be learned later", error=str(exc))
            return
        finally:
            await trio.aclose_forcefully(stream)
        log.info("discovered brokers", via=str(address), count=len(brokers))
        await self.directory.learn(Endpoint(node_id, host, port) for node_id, host, port in brokers)


def handshake_failure_reason(error: BaseException | None) -> tuple[str, str]:
    """(metric reason, detail for the log) of a failed server-side handshake."""
    if not isinstance(error, ssl.SSLError) or isinstance(error, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        # The client went away mid-handshake (or a reset): nothing it sent was wrong as such.
        return "closed", "" if error is None else str(error)
    code = (error.reason or "").upper()
    text = str(error)
    if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in code:
        return "no_certificate", "client sent no certificate (mTLS required)"
    if isinstance(error, ssl.SSLCertVerificationError) or "CERTIFICATE" in code or "UNKNOWN_CA" in code:
        detail = getattr(error, "verify_message", None) or code.lower().replace("_", " ")
        return "bad_certificate", f"client certificate refused: {detail}"
    detail = code.lower().replace("_", " ") or text
    return "protocol", detail


def _common_max(broker: tuple[int, int] | None, known: Any) -> int:
    if broker is None:
        raise UpstreamError("upstream does not offer Metadata")
    version = min(broker[1], known.max_version)
    if version < max(broker[0], known.min_version):
        raise UpstreamError("no Metadata version in common with the upstream")
    return version
