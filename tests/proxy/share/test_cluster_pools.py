"""Cluster's upstream connections: long polls cannot starve the prompt requests.

The upstream is a fake broker on in-memory streams (one task per connection, answering in
order like Kafka): Fetch is answered after its MaxWaitMs with no records, ListOffsets at once.
Virtual time (autojump) makes the 5 s long polls cost nothing.
"""

from __future__ import annotations

import uuid

import pytest
import trio
import trio.testing
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader
from kio.static.primitive import i32, i64

from codec.headers import parse_request_header
from codec.registry import nested_types
from proxy.config import HostPort
from proxy.share import cluster as cluster_module
from proxy.share.cluster import LATEST_TIMESTAMP, Cluster, ClusterSnapshot, PartitionInfo, TopicInfo
from proxy.upstream import FramedStream
from tests.proxy.kio_build import build, response_frame

TOPIC = TopicInfo("t", uuid.UUID(int=7), {p: PartitionInfo(leader_id=1, leader_epoch=0) for p in range(100)})


class FakeBroker:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.connections = 0
        self.opened_with: list[tuple[object, bool]] = []
        self.session_lifetime_s: float | None = None  # (security, authenticate) of every connection
        self.fetches: list[tuple[int, int, float]] = []  # (partition, offset, max wait s)

    async def connect(self, address: HostPort, *, timeout: float, max_frame_size: int, security=None,
                      authenticate: bool = False) -> FramedStream:
        proxy_end, broker_end = trio.testing.memory_stream_pair()
        self.connections += 1
        self.opened_with.append((security, authenticate))
        self.nursery.start_soon(self._serve, FramedStream(broker_end, 1 << 20))
        framed = FramedStream(proxy_end, max_frame_size)
        if self.session_lifetime_s is not None:  # as open_upstream marks a SASL session with a lifetime
            framed.session_expires_at = trio.current_time() + self.session_lifetime_s
        return framed

    async def _serve(self, stream: FramedStream) -> None:
        try:
            await self._answer(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the proxy side dropped the connection (a cancelled call)

    async def _answer(self, stream: FramedStream) -> None:
        while (frame := await stream.receive_frame()) is not None:
            header, offset = parse_request_header(frame)
            request, _ = entity_reader(load_request_schema(header.api_key, header.api_version))(frame, offset)
            if header.api_key == 1:
                part = request.topics[0].partitions[0]
                wait = request.max_wait.total_seconds()
                self.fetches.append((int(part.partition), int(part.fetch_offset), wait))
                await trio.sleep(wait)
                await stream.send_frame(self._fetch_response(header, int(part.partition)))
            elif header.api_key == 2:
                await stream.send_frame(self._list_offsets_response(header, request))
        await stream.aclose()

    @staticmethod
    def _fetch_response(header, partition: int) -> bytes:
        schema = load_response_schema(1, header.api_version)
        types = nested_types(schema)
        data = build(types["PartitionData"], partition_index=i32(partition), high_watermark=i64(0))
        entity = build(schema, responses=(build(types["FetchableTopicResponse"], topic_id=TOPIC.topic_id,
                                                partitions=(data,)),))
        return response_frame(entity, header.correlation_id)

    @staticmethod
    def _list_offsets_response(header, request) -> bytes:
        schema = load_response_schema(2, header.api_version)
        types = nested_types(schema)
        asked = request.topics[0].partitions[0]
        part = build(types["ListOffsetsPartitionResponse"], partition_index=asked.partition_index,
                     offset=i64(42), timestamp=i64(-1), leader_epoch=i32(0))
        entity = build(schema, topics=(build(types["ListOffsetsTopicResponse"], name=TOPIC.name, partitions=(part,)),))
        return response_frame(entity, header.correlation_id)


@pytest.fixture
def broker(nursery, monkeypatch) -> FakeBroker:
    fake = FakeBroker(nursery)
    monkeypatch.setattr(cluster_module, "open_upstream", fake.connect)
    return fake


def make_cluster(**kwargs) -> Cluster:
    cluster = Cluster([HostPort("fake", 1)], **kwargs)
    cluster.snapshot = ClusterSnapshot(brokers={1: HostPort("fake", 1)}, topics_by_name={"t": TOPIC},
                                       topics_by_id={TOPIC.topic_id: TOPIC})
    return cluster


async def long_poll(cluster: Cluster, partition: int, offset: int = 0, wait_ms: int = 5_000):
    return await cluster.fetch(TOPIC, partition, offset, max_bytes=1, max_wait_ms=wait_ms, read_committed=False)


async def test_long_polls_on_every_partition_do_not_delay_list_offsets_or_reads(broker, nursery, autojump_clock):
    cluster = make_cluster(connections_per_broker=4, long_poll_connections_per_broker=3)
    for partition in range(60):  # 60 long polls: far more than either pool holds
        nursery.start_soon(long_poll, cluster, partition)
    await trio.sleep(0.1)
    assert len(broker.fetches) == 3  # the long-poll pool's bound; the rest wait for a slot
    assert cluster.long_poll_connections_per_broker == 3  # the reader starts no more than that

    start = trio.current_time()
    assert await cluster.list_offset(TOPIC, 99, LATEST_TIMESTAMP) == 42
    read = await cluster.fetch(TOPIC, 98, 0, max_bytes=1024, max_wait_ms=0, read_committed=False)
    assert read.records == b""
    assert trio.current_time() - start < 0.01  # no wait at all behind the 5 s long polls
    assert broker.connections == 3 + 1  # three long-poll connections, one prompt one

    # Concurrent prompt requests use up to their own pool, still without waiting on long polls.
    start = trio.current_time()
    async with trio.open_nursery() as prompt:
        for partition in range(20):
            prompt.start_soon(cluster.list_offset, TOPIC, partition, LATEST_TIMESTAMP)
    assert trio.current_time() - start < 0.01
    assert broker.connections <= 3 + 4
    nursery.cancel_scope.cancel()


async def test_long_polls_for_the_same_partition_and_offset_share_one_upstream_fetch(broker, nursery, autojump_clock):
    cluster = make_cluster(long_poll_connections_per_broker=2)
    results = []

    async def member() -> None:
        results.append(await long_poll(cluster, 5, offset=10))

    async with trio.open_nursery() as members:
        for _ in range(50):
            members.start_soon(member)
    assert len(results) == 50 and all(r.records == b"" for r in results)
    assert broker.fetches == [(5, 10, 5.0)]
    assert broker.connections == 1
    # A different offset is a different long poll.
    await long_poll(cluster, 5, offset=11, wait_ms=100)
    assert broker.fetches[-1] == (5, 11, 0.1)


async def test_a_caller_joining_a_long_poll_is_answered_by_its_own_deadline(broker, nursery, autojump_clock):
    cluster = make_cluster()
    nursery.start_soon(long_poll, cluster, 4, 0, 5_000)
    await trio.sleep(0.01)
    start = trio.current_time()
    result = await long_poll(cluster, 4, 0, 1_000)  # joins the 5 s one, but waits only 1 s
    assert result.records == b""
    assert 0.99 <= trio.current_time() - start <= 1.01
    assert len(broker.fetches) == 1

    # Joined a poll that runs out before its own wait: it then polls on for the rest.
    await trio.sleep(5)
    nursery.start_soon(long_poll, cluster, 4, 0, 1_000)
    await trio.sleep(0.01)
    start = trio.current_time()
    await long_poll(cluster, 4, 0, 3_000)
    assert 2.99 <= trio.current_time() - start <= 3.05
    assert [round(f[2], 1) for f in broker.fetches] == [5.0, 1.0, 2.0]


async def test_a_cancelled_leader_hands_the_long_poll_to_a_waiting_caller(broker, nursery, autojump_clock):
    cluster = make_cluster()
    results = []

    async def leader() -> None:
        with trio.move_on_after(1):
            await long_poll(cluster, 3)

    async def follower() -> None:
        results.append(await long_poll(cluster, 3))

    nursery.start_soon(leader)
    await trio.sleep(0.01)
    start = trio.current_time()
    nursery.start_soon(follower)
    with trio.fail_after(20):
        while not results:
            await trio.sleep(0.1)
    # The leader gave up at 1 s; the follower then led a long poll for what was left of its own
    # 5 s, and was answered by its own deadline.
    assert [(f[0], round(f[2], 1)) for f in broker.fetches] == [(3, 5.0), (3, 4.0)]
    assert 4.99 <= trio.current_time() - start <= 5.2


async def test_pool_connections_are_the_proxys_own_secured_and_authenticated(broker, nursery, autojump_clock):
    security = object()  # stands for the UpstreamSecurity the runtime passes; handed through as is
    cluster = make_cluster(security=security)
    assert await cluster.list_offset(TOPIC, 0, LATEST_TIMESTAMP) == 42
    await long_poll(cluster, 1, wait_ms=10)
    assert broker.opened_with == [(security, True), (security, True)]  # prompt pool, long-poll pool
    nursery.cancel_scope.cancel()


async def test_a_connection_whose_sasl_session_is_ending_is_retired_not_reused(broker, nursery, autojump_clock):
    broker.session_lifetime_s = 60.0
    cluster = make_cluster()
    for _ in range(3):
        assert await cluster.list_offset(TOPIC, 0, LATEST_TIMESTAMP) == 42
    assert broker.connections == 1  # reused while the session lasts
    await trio.sleep(61)
    assert await cluster.list_offset(TOPIC, 0, LATEST_TIMESTAMP) == 42
    assert broker.connections == 2  # the broker would have closed the old one: a new one instead
    nursery.cancel_scope.cancel()
