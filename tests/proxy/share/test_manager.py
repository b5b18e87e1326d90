"""ShareService driven on virtual time with an in-memory upstream log and a fake state writer.

The fake cluster serves Fetch from batches built with codec.records.encode_batch (long-polling
like a broker); the fake writer records what would go to the state topic and can hold or fail
writes on demand. Every test runs on trio's MockClock with autojump (pytest-trio only takes a
clock from the test's own arguments, hence `autojump_clock` in every signature), so lock expiry
and long polls take no real time.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import uuid
from dataclasses import dataclass, field

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from codec.headers import RequestHeader, encode_response_header, response_header_version
from codec.records import encode_batch
from codec.registry import encode
from codec.share_fetch import kio_share_fetch_response
from proxy.config import HostPort
from proxy.errors import UpstreamError
from proxy.share import state_store
from proxy.share.cluster import EARLIEST_TIMESTAMP, ClusterSnapshot, FetchedPartition, PartitionInfo, TopicInfo
from proxy.share.coordinator import CoordinatorConfig, ShareGroupConfig, ShareGroupLimits, parse_auto_offset_reset
from proxy.share.manager import ShareService, ShareServiceConfig
from proxy.share.partition import PartitionConfig, PartitionSnapshot, SharePartition
from proxy.share.persister import PersistError
from proxy.share.routes import share_acknowledge_response, share_fetch_body, share_fetch_payload
from proxy.share.states import AcknowledgeType, RecordState

TOPIC_ID = uuid.UUID("0b6c1f4e-0000-4000-8000-000000000001")
TP = (TOPIC_ID, 0)
GROUP = "queue"
ACCEPT, RELEASE, REJECT = int(AcknowledgeType.ACCEPT), int(AcknowledgeType.RELEASE), int(AcknowledgeType.REJECT)
LOCK_MS = 15_000


# ----- fakes ---------------------------------------------------------------------------------


class FakeCluster:
    """One topic on one broker; Fetch serves whole batches from an in-memory log."""

    long_poll_connections_per_broker = 8  # as the real cluster's default

    def __init__(self, partitions: int = 1) -> None:
        topic = TopicInfo("orders", TOPIC_ID, {p: PartitionInfo(leader_id=1, leader_epoch=0) for p in range(partitions)})
        self.snapshot = ClusterSnapshot(
            brokers={1: HostPort("127.0.0.1", 9092)},
            topics_by_name={"orders": topic},
            topics_by_id={TOPIC_ID: topic},
        )
        self.logs: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        self.appended = trio.Event()
        self.fail_fetch = False
        self.fetches = 0
        self.fetch_requests: list[list[tuple[int, int, int]]] = []  # (partition, offset, max bytes) per Fetch
        self.refreshes = 0
        self._created: list[TopicInfo] = []

    def append(self, values: list[bytes], partition: int = 0) -> bytes:
        log = self.logs[partition]
        base = self.end_offset(partition)
        batch = encode_batch(base, values)
        log.append((base + len(values) - 1, batch))
        self.appended.set()
        self.appended = trio.Event()
        return batch

    def end_offset(self, partition: int = 0) -> int:
        log = self.logs[partition]
        return log[-1][0] + 1 if log else 0

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self.snapshot.topics_by_id.get(topic_id)

    def create_topic(self, name: str, topic_id: uuid.UUID) -> None:
        """A topic created upstream: the proxy sees it at its next refresh()."""
        self._created.append(TopicInfo(name, topic_id, {0: PartitionInfo(leader_id=1, leader_epoch=0)}))

    async def refresh(self) -> ClusterSnapshot:
        self.refreshes += 1
        for topic in self._created:
            self.snapshot.topics_by_name[topic.name] = topic
            self.snapshot.topics_by_id[topic.topic_id] = topic
            self.logs.setdefault(0, [])
        return self.snapshot

    async def list_offset(self, topic: TopicInfo, partition: int, timestamp: int) -> int:
        return 0 if timestamp == EARLIEST_TIMESTAMP else self.end_offset(partition)

    async def upstream_group_type(self, group_id: str) -> str | None:
        return None  # no consumer group upstream shares a share group's id

    async def fetch(self, topic, partition, offset, *, max_bytes, max_wait_ms, read_committed) -> FetchedPartition:
        self.fetches += 1
        await trio.sleep(0)
        if self.fail_fetch:
            raise UpstreamError("broker went away")
        with trio.move_on_after(max_wait_ms / 1000):
            while offset >= self.end_offset(partition):
                await self.appended.wait()
        chunks, size = [], 0
        for last_offset, batch in self.logs[partition]:
            if last_offset >= offset and (not chunks or size + len(batch) <= max_bytes):
                chunks.append(batch)
                size += len(batch)
        # A view, as the real cluster answers a partition whose records are all its response carries.
        return FetchedPartition(error_code=0, log_start_offset=0, aborted_transactions=(),
                                records=memoryview(b"".join(chunks)), high_watermark=self.end_offset(partition))

    async def fetch_many(self, reads, *, read_committed):
        """One upstream Fetch for several partitions (one broker here): each served as `fetch` serves it."""
        self.fetch_requests.append([(read.partition, read.offset, read.max_bytes) for read in reads])
        answers = {}
        oversize_allowed = True  # as Kafka: only the first non-empty partition may exceed its max bytes
        for read in reads:
            try:
                answer = await self.fetch(read.topic, read.partition, read.offset, max_bytes=read.max_bytes,
                                          max_wait_ms=0, read_committed=read_committed)
            except UpstreamError as exc:
                answers[(read.topic.topic_id, read.partition)] = exc
                continue
            if len(answer.records) > read.max_bytes and not oversize_allowed:
                answer = dataclasses.replace(answer, records=b"")
            oversize_allowed = oversize_allowed and not answer.records
            answers[(read.topic.topic_id, read.partition)] = answer
        return answers

    async def aclose(self) -> None:
        pass


class FakeWriter:
    """Records state-topic writes; `hold` blocks writes until set, `fail` makes them fail."""

    def __init__(self) -> None:
        self.writes: list[list[tuple[bytes, bytes | None]]] = []  # (key, value); routes kept apart
        self.routes: list[list[bytes | None]] = []  # per record: what the writer would route it by
        self.fail = False
        self.hold: trio.Event | None = None
        self.closed = False

    async def write(self, topic: str, records) -> None:
        if self.hold is not None:
            await self.hold.wait()
        await trio.sleep(0)
        if self.fail:
            raise PersistError("injected write failure")
        self.writes.append([(record[0], record[1]) for record in records])
        self.routes.append([record[2] if len(record) == 3 else None for record in records])

    async def aclose(self) -> None:
        self.closed = True

    def replayed(self) -> list[tuple[bytes, bytes | None]]:
        return [record for write in self.writes for record in write]


# ----- harness -------------------------------------------------------------------------------


@dataclass
class Member:
    member_id: str
    connection: int
    epoch: int = 0
    closed: trio.Event = field(default_factory=trio.Event)
    joined: bool = False
    node: int = 1  # the broker id of the proxy listener the member's connection is on


@dataclass
class Partition:
    error: ErrorCode
    ack_error: ErrorCode
    acquired: list[tuple[int, int, int]]
    records: bytes


class Harness:
    def __init__(self, service: ShareService, cluster: FakeCluster, writer: FakeWriter) -> None:
        self.service = service
        self.cluster = cluster
        self.writer = writer
        self._connections = iter(range(1, 1_000))

    def member(self, name: str) -> Member:
        member = Member(member_id=f"{name}-{uuid.uuid4().hex[:8]}", connection=next(self._connections))
        self.service.watch_connection(member.connection, member.closed)
        return member

    def on_node(self, member: Member, node: int) -> Member:
        """The same member on its own connection to another proxy listener (broker `node`)."""
        elsewhere = Member(member_id=member.member_id, connection=next(self._connections), node=node,
                           joined=member.joined)
        self.service.watch_connection(elsewhere.connection, elsewhere.closed)
        return elsewhere

    async def join(self, member: Member, topics=("orders",)):
        request = load_request_schema(76, 1)(
            group_id=GROUP, member_id=member.member_id, member_epoch=0, rack_id=None,
            subscribed_topic_names=tuple(topics),
        )
        member.joined = True
        return await self.service.heartbeat(request, client_id="test", client_host="/127.0.0.1")

    async def fetch(self, member: Member, *, acks=(), max_wait_ms: int = 0, max_records: int = 500,
                    epoch: int | None = None, partitions=(TP,), version: int = 2, join: bool = True,
                    add=(), forget=(), max_bytes: int = 50 * 1024 * 1024) -> dict:
        if join and not member.joined:
            await self.join(member)  # share sessions are served to members of the group only
        schema = load_request_schema(78, version)
        module = _module(schema)
        by_topic: dict[uuid.UUID, list] = {}
        ack_by_tp: dict[tuple[uuid.UUID, int], list] = {}
        for tp, first, last, ack_type in acks:
            ack_by_tp.setdefault(tp, []).append(module.AcknowledgementBatch(
                first_offset=first, last_offset=last, acknowledge_types=(ack_type,)))
        send_partitions = set(partitions if member.epoch == 0 else ()) | set(add) | set(ack_by_tp)
        for tp in sorted(send_partitions, key=lambda k: (str(k[0]), k[1])):
            by_topic.setdefault(tp[0], []).append(module.FetchPartition(
                partition_index=tp[1], acknowledgement_batches=tuple(ack_by_tp.get(tp, ()))))
        extra = {"share_acquire_mode": 0, "is_renew_ack": False} if version >= 2 else {}
        request = schema(
            group_id=GROUP, member_id=member.member_id,
            share_session_epoch=member.epoch if epoch is None else epoch,
            max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=max_bytes,
            max_records=max_records, batch_size=max_records,
            topics=tuple(module.FetchTopic(topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
            forgotten_topics_data=tuple(module.ForgottenTopic(topic_id=tp[0], partitions=(tp[1],)) for tp in forget),
            **extra,
        )
        outcome = await self.service.share_fetch(request, version, member.connection, node_id=member.node)
        response = kio_share_fetch_response(
            version, share_fetch_body(outcome, self.cluster, self.service.advertised_endpoint))
        # The frame the proxy sends (hand-encoded) is kio's encoding of that response, byte for byte.
        header = RequestHeader(78, version, correlation_id=7)
        assert bytes(share_fetch_payload(header, outcome, self.cluster, self.service.advertised_endpoint)) == encode(
            response, header=encode_response_header(7, response_header_version(78, version)))
        if response.error_code == ErrorCode.none and epoch is None:
            member.epoch += 1
        return _partitions(response)

    async def long_poll_while(self, member: Member, after_s: float, trigger) -> tuple[dict, float]:
        """A 10 s long-poll fetch by `member` with `trigger()` run `after_s` into it (awaited if
        it returns an awaitable): the fetch result and the time the trigger ran."""
        results = []
        async with trio.open_nursery() as nursery:
            async def fetch():
                results.append(await self.fetch(member, max_wait_ms=10_000))

            nursery.start_soon(fetch)
            await trio.sleep(after_s)
            triggered_at = trio.current_time()
            outcome = trigger()
            if inspect.isawaitable(outcome):
                await outcome
        return results[0], triggered_at

    async def acknowledge(self, member: Member, acks, *, epoch: int | None = None, version: int = 2):
        schema = load_request_schema(79, version)
        module = _module(schema)
        by_tp: dict[tuple[uuid.UUID, int], list] = {}
        for tp, first, last, ack_type in acks:
            by_tp.setdefault(tp, []).append(module.AcknowledgementBatch(
                first_offset=first, last_offset=last, acknowledge_types=(ack_type,)))
        topics: dict[uuid.UUID, list] = {}
        for tp, batches in by_tp.items():
            topics.setdefault(tp[0], []).append(module.AcknowledgePartition(
                partition_index=tp[1], acknowledgement_batches=tuple(batches)))
        request = schema(
            group_id=GROUP, member_id=member.member_id,
            share_session_epoch=member.epoch if epoch is None else epoch,
            is_renew_ack=False,
            topics=tuple(module.AcknowledgeTopic(topic_id=t, partitions=tuple(ps)) for t, ps in topics.items()),
        )
        response = share_acknowledge_response(
            await self.service.share_acknowledge(request, version, member.connection, node_id=member.node), version)
        if response.error_code == ErrorCode.none and epoch is None:
            member.epoch += 1
        return response


def _module(schema: type):
    import sys

    return sys.modules[schema.__module__]


def _partitions(response) -> dict:
    """{(topic id, partition): Partition} plus the top-level error under the key 'error'."""
    result: dict = {"error": response.error_code}
    for topic in response.responses:
        for p in topic.partitions:
            result[(topic.topic_id, int(p.partition_index))] = Partition(
                error=p.error_code,
                ack_error=p.acknowledge_error_code,
                acquired=[(int(a.first_offset), int(a.last_offset), int(a.delivery_count))
                          for a in p.acquired_records],
                records=bytes(p.records or b""),
            )
    return result


def acquired(result: dict, tp=TP) -> list[tuple[int, int, int]]:
    partition = result.get(tp)
    return partition.acquired if partition else []


def service_config(*, max_record_locks: int = 2_000, delivery_count_limit: int = 5,
                   lock_ms: int = LOCK_MS) -> ShareServiceConfig:
    defaults = ShareGroupConfig(
        record_lock_duration_ms=lock_ms,
        delivery_count_limit=delivery_count_limit,
        partition_max_record_locks=max_record_locks,
        auto_offset_reset=parse_auto_offset_reset("earliest"),
    )
    return ShareServiceConfig(coordinator=CoordinatorConfig(group_defaults=defaults, limits=ShareGroupLimits()))


def durable_start_offset(writer: FakeWriter, key=(GROUP, *TP)) -> int:
    """The SPSO a restart would rebuild from what was written."""
    recovered = state_store.recover(writer.replayed()).partitions[key]
    return SharePartition.from_persisted(PartitionConfig(), recovered.snapshot, recovered.updates).start_offset


def virtual_ms() -> int:
    return int(trio.current_time() * 1000)


async def start_service(nursery, cluster=None, writer=None, config=None, recovered=None) -> Harness:
    cluster = cluster or FakeCluster()
    writer = writer or FakeWriter()
    service = ShareService(cluster, writer, config or service_config(), clock=virtual_ms)
    if recovered is not None:
        await service.restore(recovered)
    await nursery.start(service.run)
    return Harness(service, cluster, writer)


@pytest.fixture
async def harness(nursery) -> Harness:
    return await start_service(nursery)


# ----- fetch ---------------------------------------------------------------------------------


async def test_fetch_acquires_records_and_returns_the_broker_batches_unchanged(harness, autojump_clock):
    batch = harness.cluster.append([b"a", b"b", b"c"])
    member = harness.member("m")
    await harness.join(member)

    result = await harness.fetch(member)

    assert result["error"] == ErrorCode.none
    assert acquired(result) == [(0, 2, 1)]
    assert result[TP].records == batch


async def test_the_change_hook_hears_acquisitions_and_the_acknowledgements_once_durable(harness, autojump_clock):
    from codec.share_events import EventKind
    from proxy.share.commit import Cause

    heard = []
    harness.service.commits.subscribe(heard.append)
    harness.cluster.append([b"a", b"b", b"c"])
    member = harness.member("m")
    await harness.join(member)
    await harness.fetch(member)
    delivered = [c for c in heard if c.cause is Cause.DELIVERED]
    assert [(e.kind, e.first_offset, e.last_offset, e.delivery_count) for c in delivered for e in c.events] == [
        (EventKind.ACQUIRED, 0, 2, 1)]
    await harness.acknowledge(member, [(TP, 0, 2, int(AcknowledgeType.RENEW))])
    writes = len(harness.writer.writes)
    await harness.acknowledge(member, [(TP, 0, 2, int(AcknowledgeType.RENEW))])
    assert len(harness.writer.writes) == writes  # a renewal persists nothing
    await harness.acknowledge(member, [(TP, 0, 2, ACCEPT)])
    published = [(c.cause, e.kind) for c in heard for e in c.events]
    assert published[-1] == (Cause.COMMITTED, EventKind.ACCEPTED)
    assert published.count((Cause.ACKNOWLEDGED, EventKind.RENEWED)) == 2


async def test_members_acquire_disjoint_records(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    first, second = harness.member("one"), harness.member("two")
    assert acquired(await harness.fetch(first)) == [(0, 1, 1)]
    harness.cluster.append([b"c", b"d"])
    assert acquired(await harness.fetch(second)) == [(2, 3, 1)]
    assert acquired(await harness.fetch(first)) == []


async def test_max_records_limits_acquisition_at_batch_boundaries(harness, autojump_clock):
    for i in range(4):
        harness.cluster.append([b"x"] * 10)
    member = harness.member("m")
    result = await harness.fetch(member, max_records=15)
    # Batch-optimised acquisition: whole batches, stopping once max_records is covered.
    assert acquired(result) == [(0, 19, 1)]


async def test_unknown_topic_id_is_answered_per_partition(harness, autojump_clock):
    member = harness.member("m")
    unknown = (uuid.UUID(int=7), 0)
    result = await harness.fetch(member, partitions=(unknown,))
    assert result[unknown].error == ErrorCode.unknown_topic_id


async def test_upstream_failure_is_not_leader_or_follower(harness, autojump_clock):
    harness.cluster.append([b"a"])
    harness.cluster.fail_fetch = True
    member = harness.member("m")
    result = await harness.fetch(member)
    assert result[TP].error == ErrorCode.not_leader_or_follower
    assert acquired(result) == []


# ----- session epochs --------------------------------------------------------------------------


async def test_share_session_epochs_are_checked(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member = harness.member("m")
    stranger = harness.member("stranger")
    await harness.fetch(member)  # epoch 0 opens, next is 1
    assert (await harness.fetch(member, epoch=5))["error"] == ErrorCode.invalid_share_session_epoch
    assert (await harness.fetch(stranger, epoch=1))["error"] == ErrorCode.share_session_not_found
    assert (await harness.fetch(member))["error"] == ErrorCode.none


# ----- acknowledgements and durability ---------------------------------------------------------


async def test_acknowledgement_is_answered_only_after_its_state_write(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.join(member)
    await harness.fetch(member)
    await trio.sleep(1)  # let the writer settle the group records and the initialisation
    harness.writer.hold = trio.Event()
    answered = trio.Event()
    responses = []

    async def acknowledge():
        responses.append(await harness.acknowledge(member, [(TP, 0, 1, ACCEPT)]))
        answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(acknowledge)
        await trio.sleep(5)
        assert not answered.is_set(), "acknowledgement answered before the write was durable"
        writes_before = len(harness.writer.writes)
        harness.writer.hold.set()
        await answered.wait()

    assert [int(p.error_code) for t in responses[0].responses for p in t.partitions] == [0]
    assert len(harness.writer.writes) > writes_before
    # Both records acknowledged: the durable state puts the start offset past them (the write
    # carries them Acknowledged at the window's head; SPSO moved in memory once it was durable).
    assert durable_start_offset(harness.writer) == 2


async def test_failed_state_write_answers_a_retriable_error_never_success(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    await trio.sleep(1)
    harness.writer.fail = True
    response = await harness.acknowledge(member, [(TP, 0, 1, ACCEPT)])
    codes = [p.error_code for t in response.responses for p in t.partitions]
    assert codes == [ErrorCode.kafka_storage_error]


async def test_piggybacked_acknowledgement_write_failure_is_reported_on_the_fetch(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    await trio.sleep(1)
    harness.writer.fail = True
    result = await harness.fetch(member, acks=[(TP, 0, 1, ACCEPT)])
    assert result[TP].ack_error == ErrorCode.kafka_storage_error


async def test_acknowledgement_retried_after_a_failed_write_succeeds_and_becomes_durable(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.join(member)
    await harness.fetch(member)
    await trio.sleep(1)
    harness.writer.fail = True
    await harness.acknowledge(member, [(TP, 0, 1, ACCEPT)])
    harness.writer.fail = False
    response = await harness.acknowledge(member, [(TP, 0, 1, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]
    assert durable_start_offset(harness.writer) == 2


async def test_acknowledging_records_not_acquired_is_invalid_record_state(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member, other = harness.member("m"), harness.member("other")
    await harness.fetch(member)
    await harness.fetch(other)
    response = await harness.acknowledge(other, [(TP, 0, 1, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.invalid_record_state]


async def test_released_records_are_redelivered_with_the_next_delivery_count(harness, autojump_clock):
    harness.cluster.append([b"a", b"b", b"c"])
    member = harness.member("m")
    await harness.fetch(member)
    # Released records become acquirable once the release is durable (a staged change is not
    # acquired again before it commits): the long-polling fetch takes them after the write.
    result = await harness.fetch(member, acks=[(TP, 0, 0, ACCEPT), (TP, 1, 2, RELEASE)], max_wait_ms=5_000)
    assert result[TP].ack_error == ErrorCode.none
    assert acquired(result) == [(1, 2, 2)]


async def test_rejected_records_are_not_redelivered(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    await harness.acknowledge(member, [(TP, 0, 1, REJECT)])
    harness.cluster.append([b"c"])
    assert acquired(await harness.fetch(member)) == [(2, 2, 1)]


# ----- long polling ----------------------------------------------------------------------------


async def test_long_poll_waits_until_max_wait_when_nothing_arrives(harness, autojump_clock):
    member = harness.member("m")
    start = trio.current_time()
    result = await harness.fetch(member, max_wait_ms=3_000)
    assert acquired(result) == []
    assert trio.current_time() - start == pytest.approx(3.0, abs=0.6)


async def test_long_poll_wakes_when_records_arrive(harness, autojump_clock):
    member = harness.member("m")
    start = trio.current_time()
    result, _ = await harness.long_poll_while(member, 2, lambda: harness.cluster.append([b"late"]))
    assert acquired(result) == [(0, 0, 1)]
    assert trio.current_time() - start < 3


async def test_a_long_poll_is_answered_at_once_when_its_share_partition_is_handed_over(harness, autojump_clock):
    # Scale-out: the instance owns every state partition, then gives up the one homing TP mid-wait.
    from proxy.share.ownership import ServiceOwnership

    ownership = ServiceOwnership(3)
    ownership.owned = frozenset({0, 1, 2})
    harness.service.ownership, harness.service.reader.leads = ownership, ownership.leads
    member = harness.member("m")
    home = frozenset({ownership.home_of_partition(*TP)})
    result, handed_at = await harness.long_poll_while(
        member, 2, lambda: harness.service.give_up(home, flush=True))
    assert result[TP].error is ErrorCode.not_leader_or_follower
    assert trio.current_time() - handed_at < 0.1  # not at the end of the 10 s wait
    assert harness.service.leaders.active((GROUP, *TP)) is None  # and not initialised again


async def test_holders_are_listed_for_groups_another_instance_coordinates_only(harness, autojump_clock):
    # Scale-out's membership watch asks the coordinating instance about these members.
    from proxy.share.ownership import ServiceOwnership

    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    ownership = ServiceOwnership(3)
    harness.service.ownership = ownership
    group_home = ownership.home_of_group(GROUP)
    ownership.owned = frozenset({0, 1, 2}) - {group_home}
    assert harness.service.holders_of_groups_coordinated_elsewhere() == {GROUP: {member.member_id}}
    ownership.owned = frozenset({0, 1, 2})  # coordinated here: departures come as its own events
    assert harness.service.holders_of_groups_coordinated_elsewhere() == {}


async def test_long_poll_wakes_when_another_member_releases(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    holder, waiter = harness.member("holder"), harness.member("waiter")
    await harness.fetch(holder)
    start = trio.current_time()
    result, _ = await harness.long_poll_while(waiter, 1, lambda: harness.acknowledge(holder, [(TP, 0, 1, RELEASE)]))
    assert acquired(result) == [(0, 1, 2)]
    assert trio.current_time() - start < 2


async def test_acceptance_wakes_a_fetch_waiting_on_the_record_lock_limit(nursery, autojump_clock):
    harness = await start_service(nursery, config=service_config(max_record_locks=100))
    for _ in range(3):
        harness.cluster.append([b"x"] * 50)
    holder, waiter = harness.member("holder"), harness.member("waiter")
    assert acquired(await harness.fetch(holder)) == [(0, 99, 1)]  # all record locks taken
    # 1.2 s: off the 0.5 s grid of any periodic re-check.
    result, accepted_at = await harness.long_poll_while(
        waiter, 1.2, lambda: harness.acknowledge(holder, [(TP, 0, 99, ACCEPT)]))
    assert acquired(result) == [(100, 149, 1)]
    # Woken by the acceptance itself, not by a periodic re-check.
    assert trio.current_time() - accepted_at < 0.1


async def test_an_acknowledgement_wakes_waiting_fetches_once_durable_not_when_staged(nursery, autojump_clock):
    # Until its write is durable a staged acknowledgement frees nothing a fetch could acquire (the
    # SPSO stays, released records stay out): waking every waiting fetch then only had them look
    # and wait again, and the write's settling wakes them anyway.
    harness = await start_service(nursery, config=service_config(max_record_locks=100))
    for _ in range(3):
        harness.cluster.append([b"x"] * 50)
    holder = harness.member("holder")
    await harness.join(holder)
    assert acquired(await harness.fetch(holder)) == [(0, 99, 1)]  # all record locks taken
    await trio.sleep(1)  # let the writer settle the group records and the initialisation
    engine = harness.service.leaders.active((GROUP, *TP)).engine
    harness.writer.hold = trio.Event()
    work = harness.service.work
    mark = work.mark()  # what a fetch that looked now waits from

    async with trio.open_nursery() as acknowledging:
        acknowledging.start_soon(harness.acknowledge, holder, [(TP, 0, 49, RELEASE), (TP, 50, 99, ACCEPT)])
        await trio.sleep(1)
        assert not engine.can_acquire()
        assert work.fired == mark, "waiting fetches woken by an acknowledgement that freed nothing yet"
        harness.writer.hold.set()
    assert engine.can_acquire()
    assert work.fired > mark  # the durable write woke them


# ----- lock expiry and releases without a delivery ---------------------------------------------


async def test_expired_lock_makes_records_available_to_another_member(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    holder, other = harness.member("holder"), harness.member("other")
    assert acquired(await harness.fetch(holder)) == [(0, 1, 1)]
    start = trio.current_time()
    result = await harness.fetch(other, max_wait_ms=60_000)
    assert acquired(result) == [(0, 1, 2)]
    assert trio.current_time() - start == pytest.approx(LOCK_MS / 1000, abs=1.0)


async def test_expiry_at_the_delivery_limit_archives(nursery, autojump_clock):
    harness = await start_service(nursery, config=service_config(delivery_count_limit=2))
    harness.cluster.append([b"a"])
    member = harness.member("m")
    assert acquired(await harness.fetch(member)) == [(0, 0, 1)]
    assert acquired(await harness.fetch(member, max_wait_ms=60_000)) == [(0, 0, 2)]
    # The second lock expires at the limit: archived, so only new records come next.
    assert acquired(await harness.fetch(member, max_wait_ms=LOCK_MS + 5_000)) == []
    harness.cluster.append([b"b"])
    assert acquired(await harness.fetch(member, max_wait_ms=1_000)) == [(1, 1, 1)]


async def test_closed_connection_releases_records_without_counting_a_delivery(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    holder, other = harness.member("holder"), harness.member("other")
    await harness.fetch(holder)
    holder.closed.set()
    await trio.sleep(0.1)
    assert acquired(await harness.fetch(other)) == [(0, 1, 1)]


async def test_final_epoch_releases_the_members_records(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    holder, other = harness.member("holder"), harness.member("other")
    await harness.fetch(holder)
    result = await harness.fetch(holder, epoch=-1, partitions=())
    assert result["error"] == ErrorCode.none
    assert acquired(await harness.fetch(other)) == [(0, 1, 1)]


# ----- restart from the written state ----------------------------------------------------------


async def test_service_restored_from_its_writes_serves_only_what_was_not_done(nursery, autojump_clock):
    cluster = FakeCluster()
    first = await start_service(nursery, cluster=cluster)
    cluster.append([b"a", b"b", b"c", b"d"])
    member = first.member("m")
    await first.join(member)
    await first.fetch(member)
    await first.acknowledge(member, [(TP, 0, 0, ACCEPT), (TP, 1, 1, RELEASE), (TP, 2, 2, REJECT),
                                     (TP, 3, 3, ACCEPT)])
    await trio.sleep(1)  # the group records are written eventually, without waiters

    recovered = state_store.recover(first.writer.replayed())
    second = await start_service(nursery, cluster=cluster, recovered=recovered)
    member = second.member("m")
    assert acquired(await second.fetch(member)) == [(1, 1, 2)]


async def test_a_restore_lets_other_tasks_run_and_serves_its_share_partitions_all_at_once(nursery, autojump_clock):
    """Rebuilding engines takes ~0.1 ms each; at 10,000 share-partitions a restore in one go held the
    loop for over a second (no /healthz at start-up, every connection stalled when a scale-out
    instance gains partitions). In slices, with none of them served before the last is built."""
    service = ShareService(FakeCluster(), FakeWriter(), service_config(), clock=virtual_ms)
    keys = [(GROUP, TOPIC_ID, partition) for partition in range(50)]
    recovered = state_store.RecoveredState(partitions={
        key: state_store.PartitionRecovery(PartitionSnapshot(100 + key[2], ()), snapshot_epoch=1, state_epoch=0,
                                           create_timestamp=0)
        for key in keys})
    seen_while_restoring: list[int] = []
    restoring = True

    async def other_task() -> None:
        while restoring:
            seen_while_restoring.append(len(service.leaders))
            await trio.sleep(0)

    nursery.start_soon(other_task)
    await trio.sleep(0)
    await service.restore(recovered, slice_s=0.0)  # a slice per engine
    restoring = False
    assert len(seen_while_restoring) >= len(keys)  # the other task ran between the engines
    assert set(seen_while_restoring) == {0}  # and never saw part of the restored state
    assert [service.leaders.get(key).engine.start_offset for key in keys] == [100 + p for p in range(50)]


# ----- heartbeat -----------------------------------------------------------------------------


async def test_join_on_a_topic_created_just_after_a_refresh_is_assigned_at_once(harness, autojump_clock):
    await trio.sleep(0.2)  # within a second of the start-up refresh
    fresh_id = uuid.UUID(int=42)
    harness.cluster.create_topic("fresh", fresh_id)
    member = harness.member("m")
    start = trio.current_time()
    response = await harness.join(member, topics=("fresh",))
    assert response.error_code == ErrorCode.none
    assert harness.service.cluster.topic_by_id(fresh_id) is not None
    assert trio.current_time() - start <= 1.0
    # The next heartbeat (after the partitions are initialised) carries the assignment.
    await trio.sleep(0.1)
    request = load_request_schema(76, 1)(
        group_id=GROUP, member_id=member.member_id, member_epoch=response.member_epoch, rack_id=None,
        subscribed_topic_names=None,
    )
    assigned = (await harness.service.heartbeat(request, client_id="test", client_host="/127.0.0.1")).assignment
    assigned = assigned or response.assignment
    assert [(t.topic_id, tuple(t.partitions)) for t in assigned.topic_partitions] == [(fresh_id, (0,))]


async def test_member_session_timeout_releases_its_records_without_counting_a_delivery(nursery, autojump_clock):
    # Locks outlive the 45 s session timeout, so only the member's removal can free the records.
    harness = await start_service(nursery, config=service_config(lock_ms=60_000))
    harness.cluster.append([b"a", b"b"])
    silent, other = harness.member("silent"), harness.member("other")
    await harness.join(silent)
    assert acquired(await harness.fetch(silent)) == [(0, 1, 1)]
    await trio.sleep(50)  # no heartbeat from `silent`
    described = harness.service.describe(load_request_schema(77, 1)(group_ids=(GROUP,),
                                                                    include_authorized_operations=False))
    assert [m.member_id for m in described.groups[0].members] == []
    assert acquired(await harness.fetch(other)) == [(0, 1, 1)]


# ----- shutdown --------------------------------------------------------------------------------


async def test_aclose_finishes_pending_writes_before_closing_the_writer(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.join(member)
    await harness.fetch(member)
    await trio.sleep(1)
    harness.writer.hold = trio.Event()
    closed = trio.Event()

    async def close():
        await harness.service.aclose()
        closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(harness.acknowledge, member, [(TP, 0, 1, ACCEPT)])
        await trio.sleep(1)
        nursery.start_soon(close)
        await trio.sleep(5)
        assert not closed.is_set() and not harness.writer.closed, "closed with a write still pending"
        harness.writer.hold.set()
        await closed.wait()
    assert harness.writer.closed
    assert durable_start_offset(harness.writer) == 2


# ----- hardening: membership, time, live configs -----------------------------------------------


async def test_share_fetch_from_a_made_up_group_or_member_is_refused_and_creates_nothing(harness, autojump_clock):
    harness.cluster.append([b"a"])
    stranger = harness.member("stranger")
    result = await harness.fetch(stranger, join=False)
    assert result["error"] == ErrorCode.group_id_not_found
    member = harness.member("m")
    await harness.join(member)
    result = await harness.fetch(stranger, join=False)
    assert result["error"] == ErrorCode.unknown_member_id
    assert harness.service.sessions.get(stranger.node, GROUP, stranger.member_id) is None
    assert len(harness.service.leaders) <= 1  # only the member's own assignment initialised
    assert all(leader.group_id == GROUP for leader in harness.service.leaders.values())
    assert not any(m == stranger.member_id for lead in harness.service.leaders.values()
                   for m in lead.engine.members())


async def test_a_wall_clock_jump_of_an_hour_expires_no_lock(nursery, autojump_clock):
    wall = [1_700_000_000_000]
    cluster, writer = FakeCluster(), FakeWriter()
    service = ShareService(cluster, writer, service_config(), clock=virtual_ms, wall_clock=lambda: wall[0])
    await nursery.start(service.run)
    harness = Harness(service, cluster, writer)
    cluster.append([b"a", b"b"])
    member, other = harness.member("m"), harness.member("other")
    assert acquired(await harness.fetch(member)) == [(0, 1, 1)]
    wall[0] += 3_600_000  # NTP step / operator: the wall clock jumps an hour ahead
    await trio.sleep(1)
    assert acquired(await harness.fetch(other)) == [], "a wall-clock step expired the lock"
    await trio.sleep(LOCK_MS / 1000)  # the monotonic lock duration really elapses
    assert acquired(await harness.fetch(other)) == [(0, 1, 2)]


async def test_a_group_config_change_reaches_in_flight_share_partitions(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member, other = harness.member("m"), harness.member("other")
    assert acquired(await harness.fetch(member)) == [(0, 0, 1)]
    # A longer lock and a delivery limit of 2, set while the share-partition is in flight.
    harness.service.coordinator.set_group_config(GROUP, {"share.record.lock.duration.ms": "20000",
                                                        "share.delivery.count.limit": "2"})
    await trio.sleep(LOCK_MS / 1000 + 1)  # the first lock (taken under the old config) expires
    assert acquired(await harness.fetch(other)) == [(0, 0, 2)]
    await trio.sleep(16)
    assert acquired(await harness.fetch(member)) == [], "the second lock used the old duration"
    await trio.sleep(5)  # past the new 20 s lock: the second delivery reaches the new limit
    harness.cluster.append([b"b"])
    assert acquired(await harness.fetch(member)) == [(1, 1, 1)]
    assert harness.service.leaders.active((GROUP, *TP)).engine.record_state(0)[0] is RecordState.ARCHIVED


async def test_records_rolled_back_after_a_failed_write_still_expire_to_other_members(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member, other = harness.member("m"), harness.member("other")
    await harness.fetch(member)
    await trio.sleep(1)
    # The write hangs past the records' lock deadline (a frozen broker), then fails.
    harness.writer.hold, harness.writer.fail = trio.Event(), True
    responses = []
    async with trio.open_nursery() as nursery:
        async def acknowledge():
            responses.append(await harness.acknowledge(member, [(TP, 0, 1, ACCEPT)]))

        nursery.start_soon(acknowledge)
        await trio.sleep(LOCK_MS / 1000 + 5)
        harness.writer.hold.set()
    assert [p.error_code for t in responses[0].responses for p in t.partitions] == [ErrorCode.kafka_storage_error]
    harness.writer.hold, harness.writer.fail = None, False
    # Rolled back, the records hold their old, already expired lock: they come back at once
    # (the member never retries: it crashed) instead of staying locked forever.
    await trio.sleep(2)
    assert acquired(await harness.fetch(other)) == [(0, 1, 2)]


async def test_a_member_that_left_keeps_its_session_for_acknowledgements_but_acquires_nothing(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    assert acquired(await harness.fetch(member)) == [(0, 1, 1)]
    leave = load_request_schema(76, 1)(group_id=GROUP, member_id=member.member_id, member_epoch=-1, rack_id=None,
                                       subscribed_topic_names=None)
    await harness.service.heartbeat(leave, client_id="test", client_host="/127.0.0.1")
    harness.cluster.append([b"c"])
    result = await harness.fetch(member)  # its session still answers (e.g. a last acknowledgement)
    assert result["error"] == ErrorCode.none and acquired(result) == []


# ----- partitions dropped from a share session (Java clients before 4.4) -------------------------


TP1 = (TOPIC_ID, 1)


async def test_records_held_on_a_forgotten_partition_return_once_a_later_acquisition_is_acknowledged(
        nursery, autojump_clock):
    """A Java client before 4.4 drops the acknowledgements of a partition revoked while its records
    were buffered: once it acknowledges records acquired after it forgot the partition, the ones it
    still holds there come back at once (not after the lock), counted as a delivery."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    holder, other = harness.member("holder"), harness.member("other")
    assert acquired(await harness.fetch(holder)) == [(0, 1, 1)]
    # Revoked P0, assigned P1: the next fetch forgets P0 and acquires on P1.
    assert acquired(await harness.fetch(holder, add=[TP1], forget=[TP]), TP1) == [(0, 1, 1)]
    assert acquired(await harness.fetch(other)) == []  # P0's records are still the holder's
    # The holder acknowledges its P1 records; its P0 acknowledgements never come.
    await harness.acknowledge(holder, [(TP1, 0, 1, ACCEPT)])
    assert acquired(await harness.fetch(other)) == [(0, 1, 2)]


async def test_records_of_a_forgotten_partition_acknowledged_later_are_not_released(nursery, autojump_clock):
    """A client that does acknowledge a revoked partition's records (Kafka's Java client 4.4) keeps them."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    holder, other = harness.member("holder"), harness.member("other")
    await harness.fetch(holder, max_records=1)  # holds P0 0-1 (a whole batch)
    await harness.fetch(holder, add=[TP1], forget=[TP])  # holds P1 0-1
    response = await harness.acknowledge(holder, [(TP, 0, 0, ACCEPT)])  # P0 acknowledged after the forget
    assert response.error_code == ErrorCode.none
    result = await harness.fetch(holder, acks=[(TP1, 0, 1, ACCEPT), (TP, 1, 1, ACCEPT)])
    assert result[TP].ack_error == ErrorCode.none and result[TP1].ack_error == ErrorCode.none
    harness.cluster.append([b"e"], partition=0)
    assert acquired(await harness.fetch(other)) == [(2, 2, 1)]  # nothing of 0-1 came back


async def test_records_handed_out_on_a_partition_forgotten_earlier_are_released_like_the_first(
        nursery, autojump_clock):
    """Acknowledging a forgotten partition's records puts it back in the session (as in Kafka), so
    the member is handed more there although its client does not fetch it; a Java client before
    4.4 may drop those acknowledgements too. They come back once it acknowledges records of a
    later ShareFetch."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=0)
    harness.cluster.append([b"e", b"f"], partition=1)
    holder, other = harness.member("holder"), harness.member("other")
    assert acquired(await harness.fetch(holder, max_records=2)) == [(0, 1, 1)]
    await harness.fetch(holder, add=[TP1], forget=[TP], max_records=2)  # P1 0-1
    # Its P0 acknowledgements ride on a ShareFetch: P0 is back in the session and 2-3 handed out.
    result = await harness.fetch(holder, acks=[(TP, 0, 1, ACCEPT)], max_records=2)
    assert result[TP].ack_error == ErrorCode.none and acquired(result) == [(2, 3, 1)]
    harness.cluster.append([b"g", b"h"], partition=1)
    # P1 0-1 (an earlier ShareFetch) acknowledged, P1 2-3 handed out; P0 2-3's acknowledgement never comes.
    assert acquired(await harness.fetch(holder, acks=[(TP1, 0, 1, ACCEPT)], max_records=2), TP1) == [(2, 3, 1)]
    assert acquired(await harness.fetch(other, max_records=2)) == []  # P0 2-3 still the holder's
    await harness.acknowledge(holder, [(TP1, 2, 3, ACCEPT)])
    assert acquired(await harness.fetch(other, max_records=2)) == [(2, 3, 2)]


async def test_forgotten_partition_records_listed_before_acknowledged_ones_in_a_response_are_released(
        nursery, autojump_clock):
    """The records a response lists first are handed to the application first: acknowledging P1's
    records of a response shows P0's in the same response were dropped, without a later ShareFetch
    (a member whose own partition ran dry never sends another acknowledgement)."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    for partition in (0, 1):
        harness.cluster.append([b"a", b"b"], partition=partition)
        harness.cluster.append([b"c", b"d"], partition=partition)
    holder, other = harness.member("holder"), harness.member("other")
    await harness.fetch(holder, max_records=2)  # P0 0-1
    await harness.fetch(holder, add=[TP1], forget=[TP], max_records=2)  # P1 0-1
    result = await harness.fetch(holder, acks=[(TP, 0, 1, ACCEPT), (TP1, 0, 1, ACCEPT)], max_records=4)
    assert acquired(result) == [(2, 3, 1)] and acquired(result, TP1) == [(2, 3, 1)]
    await harness.acknowledge(holder, [(TP1, 2, 3, ACCEPT)])  # P0 2-3's acknowledgement never comes
    assert acquired(await harness.fetch(other, max_records=2)) == [(2, 3, 2)]


def watched(harness: Harness, member: Member) -> bool:
    [session] = harness.service.sessions.sessions_of_member(GROUP, member.member_id)
    return harness.service.forgotten.watching(session.key)


async def test_a_forgotten_partition_where_the_member_holds_nothing_is_no_longer_watched(nursery, autojump_clock):
    """A group's first member is handed every partition and forgets most at the next rebalance;
    once it holds nothing on them, acknowledging requests stop scanning them for abandoned records."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    holder = harness.member("holder")
    await harness.fetch(holder)  # P0 0-1
    await harness.fetch(holder, add=[TP1], forget=[TP], acks=[(TP, 0, 1, ACCEPT)])  # P1 0-1; P0 left empty-handed
    assert watched(harness, holder)
    await harness.acknowledge(holder, [(TP1, 0, 1, ACCEPT)])
    assert not watched(harness, holder)


async def test_a_forgotten_partition_stays_watched_while_records_released_there_or_back_in_the_session(
        nursery, autojump_clock):
    """Released abandoned records leave the watch for the next acknowledgement to settle; a partition
    back in the session stays watched although the member holds nothing there (an acknowledgement
    puts a partition back as well, and records handed out there may be dropped by the client too)."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    holder, other = harness.member("holder"), harness.member("other")
    await harness.fetch(holder, max_records=2)  # P0 0-1
    await harness.fetch(holder, add=[TP1], forget=[TP], max_records=2)  # P1 0-1
    await harness.acknowledge(holder, [(TP1, 0, 1, ACCEPT)])  # P0 0-1 abandoned: released
    assert watched(harness, holder)
    # P0 is fetched again (0-1 redelivered), then acknowledged.
    harness.cluster.append([b"e", b"f"], partition=1)
    await harness.fetch(holder, partitions=(TP,), add=[TP], max_records=2)
    result = await harness.fetch(holder, acks=[(TP, 0, 1, ACCEPT)], max_records=2)  # P1 2-3
    assert acquired(result, TP1) == [(2, 3, 1)]
    await harness.acknowledge(holder, [(TP1, 2, 3, ACCEPT)])  # holds nothing on P0, but P0 is fetched
    assert watched(harness, holder)
    harness.cluster.append([b"g", b"h"], partition=0)
    harness.cluster.append([b"i", b"j"], partition=1)
    result = await harness.fetch(holder, max_records=4)  # P0 2-3 and P1 4-5
    assert acquired(result) == [(2, 3, 1)] and acquired(result, TP1) == [(4, 5, 1)]
    await harness.acknowledge(holder, [(TP1, 4, 5, ACCEPT)])  # P0 2-3's acknowledgement never comes
    assert acquired(await harness.fetch(other, max_records=2)) == [(2, 3, 2)]


# ----- one share session per node ----------------------------------------------------------------
# A consumer whose partitions are led by two brokers keeps a share session on each (Kafka: one
# ShareSessionCache per broker). Here the member fetches P0 through the listener of broker 1 and
# P1 through that of broker 2.


async def two_node_worker(nursery) -> tuple[Harness, Member, Member]:
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    on_one = harness.member("worker")
    on_two = harness.on_node(on_one, 2)
    assert acquired(await harness.fetch(on_one, partitions=(TP,))) == [(0, 1, 1)]
    on_two.joined = True
    assert acquired(await harness.fetch(on_two, partitions=(TP1,)), TP1) == [(0, 1, 1)]
    return harness, on_one, on_two


def holders(harness: Harness, tp) -> list[tuple[int, int, RecordState, int, str | None]]:
    engine = harness.service.leaders.active((GROUP, *tp)).engine
    return [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in engine.in_flight_locked()]


async def test_a_second_nodes_initial_share_fetch_leaves_the_first_nodes_session_alone(nursery, autojump_clock):
    harness, on_one, on_two = await two_node_worker(nursery)
    sessions = harness.service.sessions
    assert [(s.key.node_id, s.epoch, s.partitions) for s in sessions.sessions_of_member(GROUP, on_one.member_id)] == [
        (1, 1, {TP}), (2, 1, {TP1})]
    # Node 1's session continues at its own epoch; its acknowledgement and node 2's both succeed.
    result = await harness.fetch(on_one, acks=[(TP, 0, 1, ACCEPT)])
    assert (result["error"], result[TP].ack_error) == (ErrorCode.none, ErrorCode.none)
    response = await harness.acknowledge(on_two, [(TP1, 0, 1, ACCEPT)])
    assert response.error_code == ErrorCode.none
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]
    assert (sessions.get(1, GROUP, on_one.member_id).epoch, sessions.get(2, GROUP, on_one.member_id).epoch) == (2, 2)
    assert [leader.engine.start_offset for leader in harness.service.leaders.of_group(GROUP)] == [2, 2]


async def test_closing_one_nodes_connection_releases_only_that_sessions_partitions(nursery, autojump_clock):
    harness, on_one, on_two = await two_node_worker(nursery)
    on_one.closed.set()
    await trio.sleep(0.1)
    assert harness.service.sessions.get(1, GROUP, on_one.member_id) is None
    assert holders(harness, TP) == [(0, 1, RecordState.AVAILABLE, 0, None)]  # released, no delivery counted
    assert holders(harness, TP1) == [(0, 1, RecordState.ACQUIRED, 1, on_one.member_id)]
    other = harness.member("other")
    result = await harness.fetch(other, partitions=(TP, TP1))
    assert (acquired(result), acquired(result, TP1)) == ([(0, 1, 1)], [])
    # Node 2's session lives on: its records are still the worker's to acknowledge.
    response = await harness.acknowledge(on_two, [(TP1, 0, 1, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]
    assert harness.service.leaders.active((GROUP, *TP1)).engine.start_offset == 2


async def test_final_and_replaced_sessions_release_only_their_own_partitions(nursery, autojump_clock):
    harness, on_one, on_two = await two_node_worker(nursery)
    # Node 1's session starts over (epoch 0): P0's records come back to it, P1's stay held.
    on_one.epoch = 0
    assert acquired(await harness.fetch(on_one, partitions=(TP,))) == [(0, 1, 1)]
    assert holders(harness, TP1) == [(0, 1, RecordState.ACQUIRED, 1, on_one.member_id)]
    # Node 2's final ShareFetch releases P1 only.
    assert (await harness.fetch(on_two, epoch=-1, partitions=()))["error"] == ErrorCode.none
    assert holders(harness, TP1) == [(0, 1, RecordState.AVAILABLE, 0, None)]
    assert holders(harness, TP) == [(0, 1, RecordState.ACQUIRED, 1, on_one.member_id)]
    assert [s.key.node_id for s in harness.service.sessions.sessions_of_member(GROUP, on_one.member_id)] == [1]


async def test_a_partition_both_sessions_fetch_is_not_released_with_one_of_them(nursery, autojump_clock):
    """The engine knows records by member, not by session: a partition the other node's session
    fetches too keeps the member's records when one session ends (its lock still bounds them)."""
    harness, on_one, on_two = await two_node_worker(nursery)
    await harness.fetch(on_two, add=[TP])  # node 2 now fetches P0 as well (nothing left to acquire)
    on_one.closed.set()
    await trio.sleep(0.1)
    assert holders(harness, TP) == [(0, 1, RecordState.ACQUIRED, 1, on_one.member_id)]


async def test_a_member_leaving_the_group_releases_what_it_holds_through_every_node(nursery, autojump_clock):
    harness, on_one, _ = await two_node_worker(nursery)
    leave = load_request_schema(76, 1)(group_id=GROUP, member_id=on_one.member_id, member_epoch=-1, rack_id=None,
                                       subscribed_topic_names=None)
    await harness.service.heartbeat(leave, client_id="test", client_host="/127.0.0.1")
    assert holders(harness, TP) == holders(harness, TP1) == [(0, 1, RecordState.AVAILABLE, 0, None)]
