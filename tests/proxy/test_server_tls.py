"""TLS listeners in-process: a proxy with a TLS listener in front of fake brokers on loopback TCP.

Bad input on the TLS listener -- garbage before the handshake, a handshake that never finishes,
a client certificate that does not verify -- costs only that connection, while other clients
are served.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme
from prometheus_client import REGISTRY

from codec.headers import RequestHeader, encode_request_header
from proxy.config import HostPort
from proxy.server import Proxy
from proxy.upstream import FramedStream
from proxy.rewrite import decode_response
from tests.proxy.test_server import ECHO_API, METADATA, FakeCluster, config


class Pki:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_path = self.write("ca.pem", self.ca.cert_pem.bytes())
        self.server_cert, self.server_key = self.issue("server", "127.0.0.1", "localhost")

    def write(self, name: str, data: bytes) -> str:
        (self.directory / name).write_bytes(data)
        return str(self.directory / name)

    def issue(self, name: str, *hosts: str, ca: trustme.CA | None = None) -> tuple[str, str]:
        issued = (ca or self.ca).issue_cert(*hosts)
        return (self.write(f"{name}.pem", b"".join(b.bytes() for b in issued.cert_chain_pems)),
                self.write(f"{name}.key", issued.private_key_pem.bytes()))

    def client_context(self, cert: tuple[str, str] | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_path)
        if cert is not None:
            context.load_cert_chain(*cert)
        return context


@pytest.fixture
def pki(tmp_path) -> Pki:
    return Pki(tmp_path)


def failures(reason: str, listener: str = "bootstrap") -> float:
    return REGISTRY.get_sample_value("ksp_tls_handshake_failures_total",
                                     {"listener": listener, "reason": reason}) or 0.0


@asynccontextmanager
async def tls_proxy(pki: Pki, **kwargs) -> AsyncIterator[tuple[Proxy, HostPort]]:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        await cluster.start(nursery, 1)
        values = {"listener_ssl_certificate_location": pki.server_cert, "listener_ssl_key_location": pki.server_key,
                  **kwargs}
        proxy = Proxy(config([cluster.brokers[1]], **values))
        yield proxy, await nursery.start(proxy.run)
        nursery.cancel_scope.cancel()


async def tls_connect(address: HostPort, context: ssl.SSLContext) -> FramedStream:
    tcp = await trio.open_tcp_stream(address.host, address.port)
    stream = trio.SSLStream(tcp, context, server_hostname=address.host)
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return FramedStream(stream, 1 << 20)


async def refused_on_first_request(address: HostPort, context: ssl.SSLContext) -> None:
    """Connect and send a request; the proxy must break the connection (at the handshake or,
    with TLS 1.3, where the client's handshake completes before the server has checked its
    certificate, on the first read)."""
    framed = None
    try:
        with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
            framed = await tls_connect(address, context)
            await echo(framed, 1)
    finally:
        if framed is not None:
            await trio.aclose_forcefully(framed.stream)


async def echo(framed: FramedStream, correlation_id: int) -> bytes | None:
    await framed.send_frame(encode_request_header(RequestHeader(ECHO_API, 1, correlation_id, "tls-test")))
    return await framed.receive_frame()


async def assert_served(address: HostPort, context: ssl.SSLContext, correlation_id: int = 7) -> None:
    with trio.fail_after(5):
        framed = await tls_connect(address, context)
        assert await echo(framed, correlation_id) == correlation_id.to_bytes(4, "big") + b"from-broker-1"
        await framed.aclose()


async def wait_for(predicate, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_a_tls_client_is_served_on_the_bootstrap_and_the_broker_listeners(pki):
    async with tls_proxy(pki) as (proxy, bootstrap):
        await assert_served(bootstrap, pki.client_context())
        # Metadata over TLS is decoded and rewritten as on plain listeners; the broker listener it
        # names serves TLS too (no mixed mode).
        ports = await _metadata_over_tls(bootstrap, pki.client_context())
        assert set(ports) == {1}
        await assert_served(HostPort("127.0.0.1", ports[1]), pki.client_context())
        proxy.shutdown()


async def test_a_plaintext_kafka_client_on_a_tls_listener_costs_only_its_connection(pki):
    async with tls_proxy(pki) as (proxy, bootstrap):
        before = failures("protocol")
        plain = FramedStream(await trio.open_tcp_stream(bootstrap.host, bootstrap.port), 1 << 20)
        with trio.fail_after(5):
            assert await echo(plain, 1) is None  # closed without an answer
        await plain.aclose()
        await wait_for(lambda: failures("protocol") == before + 1)
        await assert_served(bootstrap, pki.client_context())
        await wait_for(lambda: proxy.open_connections == 0)


async def test_garbage_before_the_handshake_costs_only_that_connection(pki):
    async with tls_proxy(pki) as (proxy, bootstrap):
        good = await tls_connect(bootstrap, pki.client_context())  # open before, served after
        before = failures("protocol")
        for garbage in (b"\x16\x03\x01\xff\xff" + b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", bytes(range(256)) * 4):
            bad = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
            await bad.send_all(garbage)
            with trio.fail_after(5):
                while await bad.receive_some(4096):  # an alert may come first; then the close
                    pass
            await bad.aclose()
        await wait_for(lambda: failures("protocol") == before + 3)
        with trio.fail_after(5):
            assert await echo(good, 11) == (11).to_bytes(4, "big") + b"from-broker-1"
        await good.aclose()
        await assert_served(bootstrap, pki.client_context())


async def test_a_handshake_that_never_finishes_times_out_without_holding_up_others(pki):
    async with tls_proxy(pki, listener_ssl_handshake_timeout_ms=300) as (proxy, bootstrap):
        before = failures("timeout")
        silent = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)  # connects, sends nothing
        half = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
        await half.send_all(b"\x16\x03\x01\x02\x00\x01")  # the first bytes of a ClientHello, then nothing
        started = trio.current_time()
        await assert_served(bootstrap, pki.client_context())  # served while both hang
        assert trio.current_time() - started < 0.3
        with trio.fail_after(5):
            assert await silent.receive_some(100) == b""  # closed by the proxy
            assert await half.receive_some(100) == b""
        assert trio.current_time() - started >= 0.25
        await wait_for(lambda: failures("timeout") == before + 2)
        await silent.aclose()
        await half.aclose()
        await wait_for(lambda: proxy.open_connections == 0)


async def test_a_stalled_handshake_counts_against_max_connections(pki):
    async with tls_proxy(pki, max_connections=1, listener_ssl_handshake_timeout_ms=1_000) as (proxy, bootstrap):
        silent = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
        await wait_for(lambda: proxy.open_connections == 1)
        refused = proxy.refused_connections
        with pytest.raises((trio.BrokenResourceError, OSError)):
            await tls_connect(bootstrap, pki.client_context())
        assert proxy.refused_connections == refused + 1
        await wait_for(lambda: proxy.open_connections == 0)  # the stalled one timed out
        await assert_served(bootstrap, pki.client_context())
        await silent.aclose()


async def test_mtls_required_refuses_clients_without_a_trusted_certificate(pki):
    mtls = {"listener_ssl_client_auth": "required", "listener_ssl_ca_location": pki.ca_path}
    async with tls_proxy(pki, **mtls) as (proxy, bootstrap):
        no_cert, bad_cert = failures("no_certificate"), failures("bad_certificate")
        await refused_on_first_request(bootstrap, pki.client_context())
        await wait_for(lambda: failures("no_certificate") == no_cert + 1)
        stranger = pki.issue("stranger", "client.example", ca=trustme.CA())
        await refused_on_first_request(bootstrap, pki.client_context(stranger))
        await wait_for(lambda: failures("bad_certificate") == bad_cert + 1)
        trusted = pki.issue("client", "client.example")
        await assert_served(bootstrap, pki.client_context(trusted))
        await wait_for(lambda: proxy.open_connections == 0)


async def test_mtls_requested_serves_clients_with_and_without_a_certificate(pki):
    mtls = {"listener_ssl_client_auth": "requested", "listener_ssl_ca_location": pki.ca_path}
    async with tls_proxy(pki, **mtls) as (_, bootstrap):
        await assert_served(bootstrap, pki.client_context())
        await assert_served(bootstrap, pki.client_context(pki.issue("client", "client.example")))


async def test_a_reloaded_certificate_is_served_to_new_connections_while_open_ones_keep_theirs(pki):
    async with tls_proxy(pki, listener_ssl_reload_interval_ms=1) as (proxy, bootstrap):
        old = await tls_connect(bootstrap, pki.client_context())
        old_cert = old.stream.getpeercert(binary_form=True)
        # A new CA and certificate, written over the configured paths (as cert-manager would).
        new_ca = trustme.CA()
        new_cert, new_key = pki.issue("new", "127.0.0.1", ca=new_ca)
        Path(pki.server_cert).write_bytes(Path(new_cert).read_bytes())
        Path(pki.server_key).write_bytes(Path(new_key).read_bytes())
        await trio.sleep(0.01)  # past the reload interval
        new_context = ssl.create_default_context(cadata=new_ca.cert_pem.bytes().decode())
        with trio.fail_after(5):
            fresh = await tls_connect(bootstrap, new_context)  # verifies only against the new CA
        assert fresh.stream.getpeercert(binary_form=True) != old_cert
        assert proxy.listener_tls is not None and proxy.listener_tls.reloads == 1
        with trio.fail_after(5):
            assert await echo(fresh, 5) == (5).to_bytes(4, "big") + b"from-broker-1"
            assert await echo(old, 6) == (6).to_bytes(4, "big") + b"from-broker-1"  # still open, old cert
        with pytest.raises(trio.BrokenResourceError):  # the old CA no longer verifies new connections
            await tls_connect(bootstrap, pki.client_context())
        await fresh.aclose()
        await old.aclose()


async def _metadata_over_tls(address: HostPort, context: ssl.SSLContext) -> dict[int, int]:
    framed = await tls_connect(address, context)
    await framed.send_frame(encode_request_header(RequestHeader(METADATA, 12, 1, "t")))
    _, entity = decode_response(METADATA, 12, await framed.receive_frame())
    await framed.aclose()
    assert {b.host for b in entity.brokers} == {"127.0.0.1"}
    return {int(b.node_id): int(b.port) for b in entity.brokers}


