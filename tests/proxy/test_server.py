"""The whole proxy in-process, in front of fake brokers on loopback TCP."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from kio.index import load_payload_module
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32

from codec.headers import RequestHeader, encode_request_header, parse_request_header
from proxy import metrics
from proxy.config import HostPort, ProxyConfig
from proxy.localkafka import free_port
from proxy.rewrite import decode_response
from proxy.server import Proxy
from proxy.upstream import FramedStream
from tests.proxy.kio_build import build, response_frame

API_VERSIONS, METADATA, ECHO_API = 18, 3, 32  # DescribeConfigs stands for "anything forwarded"


@dataclass
class FakeCluster:
    """Brokers that answer ApiVersions, Metadata (listing `brokers`) and echo anything else."""

    brokers: dict[int, int] = field(default_factory=dict)  # node id -> port

    async def start(self, nursery: trio.Nursery, node_id: int) -> None:
        async def handler(stream: trio.SocketStream) -> None:
            async with stream:
                framed = FramedStream(stream, 1 << 20)
                while (frame := await framed.receive_frame()) is not None:
                    header, _ = parse_request_header(frame)
                    await framed.send_frame(self.answer(node_id, header))

        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        self.brokers[node_id] = listener.socket.getsockname()[1]

    def answer(self, node_id: int, header: RequestHeader) -> bytes:
        cid, version = header.correlation_id, header.api_version
        m = load_payload_module(header.api_key, version, EntityType.response) if header.api_key in (18, 3) else None
        if header.api_key == API_VERSIONS:
            keys = [(API_VERSIONS, 0, 4), (METADATA, 0, 12), (ECHO_API, 1, 4)]
            entity = build(
                m.ApiVersionsResponse,
                api_keys=tuple(m.ApiVersion(api_key=i16(k), min_version=i16(a), max_version=i16(b)) for k, a, b in keys),
            )
            return response_frame(entity, cid)
        if header.api_key == METADATA:
            entity = build(
                m.MetadataResponse,
                brokers=tuple(
                    build(m.MetadataResponseBroker, node_id=i32(n), host="127.0.0.1", port=i32(p))
                    for n, p in sorted(self.brokers.items())
                ),
            )
            return response_frame(entity, cid)
        return cid.to_bytes(4, "big") + b"from-broker-%d" % node_id


async def call(address: HostPort, api_key: int, version: int, correlation_id: int = 1) -> bytes | None:
    stream = await trio.open_tcp_stream(address.host, address.port)
    async with stream:
        framed = FramedStream(stream, 1 << 20)
        await framed.send_frame(encode_request_header(RequestHeader(api_key, version, correlation_id, "t")))
        return await framed.receive_frame()


async def metadata_brokers(address: HostPort) -> dict[int, int]:
    frame = await call(address, METADATA, 12)
    _, entity = decode_response(METADATA, 12, frame)
    assert {b.host for b in entity.brokers} == {"127.0.0.1"}
    return {int(b.node_id): int(b.port) for b in entity.brokers}


def config(upstream: list[int], **kwargs) -> ProxyConfig:
    return ProxyConfig(
        upstream=tuple(HostPort("127.0.0.1", p) for p in upstream),
        listen=HostPort("127.0.0.1", 0),
        connect_timeout=2,
        shutdown_grace=1,
        **kwargs,
    )


@dataclass
class Running:
    cluster: FakeCluster
    nursery: trio.Nursery
    proxy: Proxy
    bootstrap: HostPort


@asynccontextmanager
async def proxy_in_front_of(*node_ids: int, **kwargs) -> AsyncIterator[Running]:
    """Fake brokers `node_ids` and a proxy bootstrapping from the first; all stopped on exit."""
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        for node_id in node_ids:
            await cluster.start(nursery, node_id)
        proxy = Proxy(config([cluster.brokers[node_ids[0]]], **kwargs))
        yield Running(cluster, nursery, proxy, await nursery.start(proxy.run))
        nursery.cancel_scope.cancel()


async def test_brokers_are_served_on_their_own_proxy_ports():
    async with proxy_in_front_of(1, 5) as running:
        cluster, bootstrap = running.cluster, running.bootstrap
        ports = await metadata_brokers(bootstrap)
        assert set(ports) == {1, 5}
        assert not set(ports.values()) & set(cluster.brokers.values())  # no upstream port leaks
        assert await call(HostPort("127.0.0.1", ports[5]), ECHO_API, 1, 9) == (9).to_bytes(4, "big") + b"from-broker-5"
        assert await call(bootstrap, ECHO_API, 1, 8) == (8).to_bytes(4, "big") + b"from-broker-1"
        # The mapping is stable within the process.
        assert await metadata_brokers(HostPort("127.0.0.1", ports[1])) == ports
        running.proxy.shutdown()


async def test_a_connection_knows_the_broker_id_its_listener_stands_for():
    """Share sessions are per node: a connection carries its listener's broker id (-1: bootstrap)."""
    async with proxy_in_front_of(1, 5) as running:
        ports = await metadata_brokers(running.bootstrap)
        with trio.fail_after(5):  # the Metadata call's connection is gone
            while running.proxy.open_connections:
                await trio.sleep(0.01)
        streams = []
        for port in (ports[5], running.bootstrap.port, ports[1]):
            streams.append(FramedStream(await trio.open_tcp_stream("127.0.0.1", port), 1 << 20))
            assert await echo_on(streams[-1], 1) is not None  # accepted and served
        seen = sorted((c.listener, c.node_id) for c in running.proxy._connections)
        assert seen == [("bootstrap", -1), ("broker-1", 1), ("broker-5", 5)]
        for stream in streams:
            await stream.aclose()
        running.proxy.shutdown()


async def test_a_broker_appearing_later_gets_a_listener_before_clients_hear_of_it():
    async with proxy_in_front_of(1) as running:
        assert set(await metadata_brokers(running.bootstrap)) == {1}
        await running.cluster.start(running.nursery, 2)
        ports = await metadata_brokers(running.bootstrap)
        assert await call(HostPort("127.0.0.1", ports[2]), ECHO_API, 1) == (1).to_bytes(4, "big") + b"from-broker-2"


async def test_configured_port_base_maps_broker_ids_deterministically():
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        await cluster.start(nursery, 3)
        # Find a free block by asking the OS for a port and building from it.
        base = free_port() - 3
        proxy = Proxy(config([cluster.brokers[3]], broker_port_base=base))
        bootstrap = await nursery.start(proxy.run)
        assert await metadata_brokers(bootstrap) == {3: base + 3}
        nursery.cancel_scope.cancel()


async def test_garbage_on_one_connection_leaves_others_and_the_proxy_running():
    async with proxy_in_front_of(1, max_frame_size=1000) as running:
        bootstrap = running.bootstrap
        good = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
        good_framed = FramedStream(good, 1 << 20)
        for garbage in (b"\xde\xad\xbe\xef" * 8, (5000).to_bytes(4, "big"), b"\x00\x00\x00\x10abc"):
            bad = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
            await bad.send_all(garbage)
            await bad.send_eof()
            with trio.fail_after(5):
                assert await bad.receive_some(100) == b""
            await bad.aclose()
            await good_framed.send_frame(encode_request_header(RequestHeader(ECHO_API, 1, 7, "good")))
            assert await good_framed.receive_frame() == (7).to_bytes(4, "big") + b"from-broker-1"
        await good.aclose()


async def test_unreachable_upstream_closes_the_client_but_not_the_proxy():
    async with trio.open_nursery() as nursery:
        proxy = Proxy(config([free_port()]))
        bootstrap = await nursery.start(proxy.run)
        for _ in range(2):
            assert await call(bootstrap, ECHO_API, 1) is None
        nursery.cancel_scope.cancel()


async def test_unsupported_api_versions_version_is_answered_like_kafka():
    async with proxy_in_front_of(1) as running:
        answer = await call(running.bootstrap, API_VERSIONS, 9, 5)
        assert answer == bytes.fromhex("00000005" "0023" "00000001" "0012" "0000" "0004")


async def test_shutdown_stops_listening_and_returns():
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        await cluster.start(nursery, 1)
        proxy = Proxy(config([cluster.brokers[1]]))
        done = trio.Event()

        async def run_proxy(task_status=trio.TASK_STATUS_IGNORED):
            await proxy.run(task_status=task_status)
            done.set()

        bootstrap = await nursery.start(run_proxy)
        idle = await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
        proxy.shutdown()
        with trio.fail_after(5):
            await done.wait()
            assert await idle.receive_some(10) == b""
        await idle.aclose()
        try:
            await trio.open_tcp_stream(bootstrap.host, bootstrap.port)
        except OSError:
            pass
        else:
            raise AssertionError("proxy still accepting after shutdown")
        nursery.cancel_scope.cancel()


async def echo_on(stream: FramedStream, correlation_id: int) -> bytes | None:
    await stream.send_frame(encode_request_header(RequestHeader(ECHO_API, 1, correlation_id, "t")))
    return await stream.receive_frame()


async def closed_at_once(address: HostPort) -> bool:
    """Connect and see whether the proxy closes the connection without any request sent."""
    stream = await trio.open_tcp_stream(address.host, address.port)
    try:
        with trio.fail_after(5):
            return await stream.receive_some(100) == b""
    except trio.BrokenResourceError:  # reset by the peer counts as closed
        return True
    finally:
        await stream.aclose()


async def test_connections_beyond_the_maximum_are_closed_and_the_first_ones_keep_working():
    async with proxy_in_front_of(1, max_connections=3) as running:
        proxy, bootstrap = running.proxy, running.bootstrap
        broker_port = (await metadata_brokers(bootstrap))[1]
        broker = HostPort("127.0.0.1", broker_port)
        with trio.fail_after(5):  # the Metadata call's connection is gone
            while proxy.open_connections:
                await trio.sleep(0.01)
        # The bound is over all listeners: two on the bootstrap listener, one on broker 1's.
        admitted = []
        for address in (bootstrap, bootstrap, broker):
            stream = FramedStream(await trio.open_tcp_stream(address.host, address.port), 1 << 20)
            assert await echo_on(stream, 1) == (1).to_bytes(4, "big") + b"from-broker-1"
            admitted.append(stream)
        assert proxy.open_connections == 3
        refused_before = metrics.CONNECTIONS_REFUSED.labels(listener="bootstrap")._value.get()

        results = []
        for i in range(20):
            results.append(await closed_at_once(bootstrap if i % 2 else broker))
        assert results == [True] * 20
        assert proxy.refused_connections == 20
        assert metrics.CONNECTIONS_REFUSED.labels(listener="bootstrap")._value.get() == refused_before + 10
        assert proxy.open_connections == 3

        for cid, stream in enumerate(admitted, start=10):
            assert await echo_on(stream, cid) == cid.to_bytes(4, "big") + b"from-broker-1"

        # A slot freed is a slot for the next client.
        await admitted.pop().aclose()
        with trio.fail_after(5):
            while proxy.open_connections > 2:
                await trio.sleep(0.01)
        late = FramedStream(await trio.open_tcp_stream(bootstrap.host, bootstrap.port), 1 << 20)
        assert await echo_on(late, 99) == (99).to_bytes(4, "big") + b"from-broker-1"
        for stream in (*admitted, late):
            await stream.aclose()
