"""Cluster.fetch_many: every partition a ShareFetch needs, one upstream Fetch per leader broker.

Two fake brokers on in-memory streams answer Fetch by topic id with one record batch per
partition (from the offset asked), or the error a test sets for a partition; a broker can be
made to drop its connections.
"""

from __future__ import annotations

import uuid

import pytest
import trio
import trio.testing
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.primitive import i32, i64

from codec.headers import parse_request_header
from codec.records import encode_batch, iter_batches
from codec.registry import nested_types
from proxy.config import HostPort
from proxy.errors import UpstreamError
from proxy.share import cluster as cluster_module
from proxy.share.cluster import (
    OFFSET_OUT_OF_RANGE,
    Cluster,
    ClusterSnapshot,
    PartitionInfo,
    PartitionRead,
    TopicInfo,
)
from proxy.upstream import FramedStream
from tests.proxy.kio_build import build, response_frame

ORDERS = TopicInfo("orders", uuid.UUID(int=7), {p: PartitionInfo(leader_id=1 + p % 2, leader_epoch=3) for p in range(4)})
AUDIT = TopicInfo("audit", uuid.UUID(int=8), {0: PartitionInfo(leader_id=1, leader_epoch=0)})
NAMES = {ORDERS.topic_id: ORDERS.name, AUDIT.topic_id: AUDIT.name}


class Brokers:
    """Brokers 1 and 2 (ports 1 and 2); records what each Fetch asked."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.fetches: list[tuple[int, int, list[tuple[str, int, int, int, int]]]] = []  # broker, max bytes, parts
        self.errors: dict[tuple[str, int], int] = {}
        self.down: set[int] = set()

    async def connect(self, address: HostPort, **_kwargs) -> FramedStream:
        proxy_end, broker_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, address.port, FramedStream(broker_end, 1 << 20))
        return FramedStream(proxy_end, 1 << 20)

    async def _serve(self, broker: int, stream: FramedStream) -> None:
        try:
            while (frame := await stream.receive_frame()) is not None:
                if broker in self.down:
                    break
                header, offset = parse_request_header(frame)
                request, _ = entity_reader(load_request_schema(header.api_key, header.api_version))(frame, offset)
                asked = [(NAMES[t.topic_id], int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes),
                          int(p.current_leader_epoch)) for t in request.topics for p in t.partitions]
                self.fetches.append((broker, int(request.max_bytes), asked))
                await stream.send_frame(self._response(header, request))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await stream.aclose()

    def _response(self, header, request) -> bytes:
        schema = load_response_schema(1, header.api_version)
        types = nested_types(schema)
        topics = []
        for topic in request.topics:
            partitions = []
            for part in topic.partitions:
                name, index = NAMES[topic.topic_id], int(part.partition)
                error = self.errors.get((name, index), 0)
                records = b"" if error else encode_batch(int(part.fetch_offset), [f"{name}-{index}".encode()])
                partitions.append(build(types["PartitionData"], partition_index=i32(index), error_code=ErrorCode(error),
                                        high_watermark=i64(int(part.fetch_offset) + 1), log_start_offset=i64(0),
                                        records=records))
            topics.append(build(types["FetchableTopicResponse"], topic_id=topic.topic_id, partitions=tuple(partitions)))
        return response_frame(build(schema, responses=tuple(topics)), header.correlation_id)


@pytest.fixture
def brokers(nursery, monkeypatch) -> Brokers:
    fake = Brokers(nursery)
    monkeypatch.setattr(cluster_module, "open_upstream", fake.connect)
    return fake


def make_cluster() -> Cluster:
    cluster = Cluster([HostPort("fake", 1)])
    cluster.snapshot = ClusterSnapshot(
        brokers={1: HostPort("fake", 1), 2: HostPort("fake", 2)},
        topics_by_name={t.name: t for t in (ORDERS, AUDIT)},
        topics_by_id={t.topic_id: t for t in (ORDERS, AUDIT)},
    )
    return cluster


def value(answer) -> tuple[int, int]:
    (batch,) = list(iter_batches(answer.records))
    return batch.base_offset, answer.high_watermark


async def test_one_fetch_per_leader_carries_all_its_partitions(brokers, autojump_clock):
    reads = [PartitionRead(ORDERS, p, 10 * p, 1000 + p) for p in range(4)] + [PartitionRead(AUDIT, 0, 5, 2000)]

    answers = await make_cluster().fetch_many(reads, read_committed=False)

    assert sorted(brokers.fetches) == [
        (1, 1000 + 1002 + 2000, [("orders", 0, 0, 1000, 3), ("orders", 2, 20, 1002, 3), ("audit", 0, 5, 2000, 0)]),
        (2, 1001 + 1003, [("orders", 1, 10, 1001, 3), ("orders", 3, 30, 1003, 3)]),
    ]
    assert {key: value(answer) for key, answer in answers.items()} == {
        (ORDERS.topic_id, p): (10 * p, 10 * p + 1) for p in range(4)} | {(AUDIT.topic_id, 0): (5, 6)}


async def test_the_upstream_fetches_their_partitions_and_bytes_are_counted(brokers, autojump_clock):
    from proxy.share import metrics

    def counted():
        return (metrics.UPSTREAM_FETCHES.labels(kind="read")._value.get(),
                metrics.UPSTREAM_FETCH_PARTITIONS._value.get(), metrics.UPSTREAM_FETCH_BYTES._value.get())

    before = counted()
    reads = [PartitionRead(ORDERS, p, 10 * p, 1000 + p) for p in range(4)] + [PartitionRead(AUDIT, 0, 5, 2000)]
    answers = await make_cluster().fetch_many(reads, read_committed=False)
    after = counted()
    assert after[0] - before[0] == 2  # one per leader
    assert after[1] - before[1] == 5
    assert after[2] - before[2] == sum(len(answer.records) for answer in answers.values()) > 0


async def test_errors_stay_with_their_partition_and_a_failed_leader_with_its_own(brokers, autojump_clock):
    brokers.errors[("orders", 2)] = OFFSET_OUT_OF_RANGE
    brokers.down.add(2)
    reads = [PartitionRead(ORDERS, p, 0, 1000) for p in range(4)] + [PartitionRead(AUDIT, 0, 0, 1000)]

    answers = await make_cluster().fetch_many(reads, read_committed=True)

    assert answers[(ORDERS.topic_id, 2)].error_code == OFFSET_OUT_OF_RANGE
    assert answers[(ORDERS.topic_id, 0)].error_code == 0 and answers[(AUDIT.topic_id, 0)].records
    assert isinstance(answers[(ORDERS.topic_id, 1)], UpstreamError)
    assert isinstance(answers[(ORDERS.topic_id, 3)], UpstreamError)


async def test_a_partition_the_topic_lacks_is_an_error_without_a_request(brokers, autojump_clock):
    answers = await make_cluster().fetch_many([PartitionRead(AUDIT, 9, 0, 1000)], read_committed=False)
    assert isinstance(answers[(AUDIT.topic_id, 9)], UpstreamError)
    assert brokers.fetches == []


async def test_records_are_a_view_of_the_response_only_when_they_are_all_it_carries(brokers, autojump_clock):
    """One partition with records: a view of the frame (no copy). Several: each copied out, so a
    small remainder cached for one cannot keep the whole response alive."""
    cluster = make_cluster()
    alone = await cluster.fetch_many([PartitionRead(ORDERS, 1, 0, 1000)], read_committed=False)
    assert isinstance(alone[(ORDERS.topic_id, 1)].records, memoryview)
    brokers.errors[("orders", 2)] = OFFSET_OUT_OF_RANGE  # no records: it does not count
    with_empty = await cluster.fetch_many([PartitionRead(ORDERS, p, 0, 1000) for p in (0, 2)], read_committed=False)
    assert isinstance(with_empty[(ORDERS.topic_id, 0)].records, memoryview)
    assert with_empty[(ORDERS.topic_id, 2)].records == b""
    several = await cluster.fetch_many([PartitionRead(ORDERS, 0, 0, 1000), PartitionRead(AUDIT, 0, 5, 2000)],
                                       read_committed=False)
    assert {type(answer.records) for answer in several.values()} == {bytes}
    assert {key: value(answer) for key, answer in several.items()} == {(ORDERS.topic_id, 0): (0, 1),
                                                                        (AUDIT.topic_id, 0): (5, 6)}
