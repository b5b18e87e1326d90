"""The dead-letter writer's rules: Kafka's topic checks, headers, partitioning, rounds."""

from __future__ import annotations

import uuid

import pytest
import trio

from codec.share_events import ArchiveReason
from proxy.share.cluster import PartitionInfo, TopicInfo
from proxy.share.commit import Cause
from proxy.share.dead_letters import (
    DeadLetterSettings,
    DeadLetterWriter,
    TopicFacts,
    TopicProblem,
    _first_records,
    check_topic,
    dead_letter_headers,
    dead_letter_reason,
    dead_letters,
    is_transient,
    offset_ranges,
)
from proxy.share.leaders import Leader
from proxy.share.manager import ShareService
from proxy.share.partition import AckRange, ArchivingRun, BatchHeader, SharePartition
from proxy.share.states import AcknowledgeType, RecordState
from tests.proxy.share.test_manager import TOPIC_ID, FakeCluster, FakeWriter

ENABLED = TopicFacts(exists=True, partitions=2, dlq_enabled=True)


@pytest.mark.parametrize(("topic", "facts", "prefix", "auto_create", "expected"), [
    ("", TopicFacts(False), "dlq.", True, TopicProblem.NOT_CONFIGURED),
    ("__consumer_offsets", ENABLED, "", True, TopicProblem.INTERNAL_NAME),
    ("dlq.x", TopicFacts(True, 2, dlq_enabled=False), "dlq.", True, TopicProblem.NOT_ENABLED),
    ("dlq.x", TopicFacts(False), "dlq.", False, TopicProblem.MISSING),
    ("orders-dlq", ENABLED, "dlq.", False, TopicProblem.PREFIX),
    ("orders-dlq", TopicFacts(False), "dlq.", True, TopicProblem.PREFIX),
    # Kafka's order: a topic without the mark fails on the mark before the prefix.
    ("orders-dlq", TopicFacts(True, 1, dlq_enabled=False), "dlq.", True, TopicProblem.NOT_ENABLED),
    ("dlq.x", ENABLED, "dlq.", False, None),
    ("anything", ENABLED, "", False, None),
    ("dlq.x", TopicFacts(False), "dlq.", True, None),  # created on first use
    # A broker without the topic config (Kafka 3.9): the mark cannot be checked, so it is not.
    ("dlq.x", TopicFacts(True, 1, dlq_enabled=None), "dlq.", False, None),
])
def test_topic_checks_are_kafkas_in_kafkas_order(topic, facts, prefix, auto_create, expected):
    assert check_topic(topic, facts, prefix=prefix, auto_create=auto_create) is expected


def test_failure_messages_are_kafkas_wording():
    assert TopicProblem.PREFIX.message("g", "orders-dlq", "dlq.") == (
        "Configured DLQ topic name does not comply with the DLQ topic prefix in share group: g, topic: orders-dlq, "
        "prefix: dlq..")  # Kafka ends every message with a period
    assert TopicProblem.NOT_ENABLED.message("g", "dlq.x", "dlq.") == (
        "DLQ is not enabled on configured DLQ topic for share group: g, topic: dlq.x.")
    assert TopicProblem.MISSING.label == "topic_missing"


def test_headers_are_kafkas_six_as_utf8_strings():
    assert dead_letter_headers("orders", 2, 1234, "billing", 3, ArchiveReason.DELIVERY_LIMIT) == [
        ("__dlq.errors.topic", b"orders"),
        ("__dlq.errors.partition", b"2"),
        ("__dlq.errors.offset", b"1234"),
        ("__dlq.errors.group", b"billing"),
        ("__dlq.errors.delivery.count", b"3"),
        ("__dlq.errors.message", b"Offset delivery count exceeded the threshold."),
    ]
    rejected = dict(dead_letter_headers("t", 0, 0, "g", 1, ArchiveReason.REJECTED))
    assert rejected["__dlq.errors.message"] == b"Offset rejected by client."


def test_one_letter_per_offset_partitioned_by_source_partition_mod_dlq_partitions_with_copies_where_found():
    runs = [ArchivingRun(10, 11, 1, ArchiveReason.REJECTED), ArchivingRun(14, 14, 2, ArchiveReason.DELIVERY_LIMIT)]
    letters = dead_letters("g", "orders", 5, runs, dlq_partitions=2, delivery_count_limit=2,
                           originals={10: (b"k10", b"v10"), 14: (None, b"v14")})
    assert [(x.offset, x.partition, x.key, x.value, x.reason) for x in letters] == [
        (10, 1, b"k10", b"v10", ArchiveReason.REJECTED),
        (11, 1, None, None, ArchiveReason.REJECTED),  # gone from the log, or copy off: headers only
        (14, 1, None, b"v14", ArchiveReason.DELIVERY_LIMIT),
    ]
    assert dict(letters[2].headers)["__dlq.errors.delivery.count"] == b"2"
    assert dict(letters[1].headers)["__dlq.errors.offset"] == b"11"


@pytest.mark.parametrize(("count", "expected"), [(1, ArchiveReason.REJECTED), (3, ArchiveReason.DELIVERY_LIMIT),
                                                 (4, ArchiveReason.DELIVERY_LIMIT)])
def test_an_unknown_reason_is_derived_from_the_count_as_kafka_does(count, expected):
    assert dead_letter_reason(ArchivingRun(0, 0, count, ArchiveReason.NONE), delivery_count_limit=3) is expected
    assert dead_letter_reason(ArchivingRun(0, 0, count, ArchiveReason.REJECTED), 3) is ArchiveReason.REJECTED


def test_offsets_coalesce_into_ranges_and_rounds_are_bounded():
    assert offset_ranges([5, 3, 4, 9, 7, 8]) == [(3, 5), (7, 9)]
    assert offset_ranges([]) == []
    runs = [ArchivingRun(0, 3, 1, ArchiveReason.REJECTED), ArchivingRun(10, 20, 2, ArchiveReason.DELIVERY_LIMIT)]
    assert _first_records(runs, 6) == [runs[0], ArchivingRun(10, 11, 2, ArchiveReason.DELIVERY_LIMIT)]
    assert _first_records(runs, 100) == runs


def test_retriable_produce_errors_are_told_from_those_no_retry_fixes():
    assert is_transient("NOT_ENOUGH_REPLICAS") and is_transient("_MSG_TIMED_OUT")
    assert not is_transient("TOPIC_AUTHORIZATION_FAILED") and not is_transient("MSG_SIZE_TOO_LARGE")


# ----- the writer over a share service (fake cluster, fake state writer, fake DLQ cluster) ---------

GROUP = "billing"
REJECT_TYPE = int(AcknowledgeType.REJECT)


class FakeDeadLetterCluster:
    """The DLQ side in memory: topics with their partitions and mark; `fail_next` transient rounds."""

    def __init__(self, topics: dict[str, tuple[int, bool | None]]) -> None:
        self.topics = topics
        self.written: list[tuple[str, object]] = []
        self.fail_next = 0
        self.created: list[str] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    async def dlq_enabled(self, topic: str) -> bool | None:
        return self.topics[topic][1]

    async def create_topic(self, topic: str) -> None:
        self.created.append(topic)

    async def produce(self, topic: str, letters) -> list[str | None]:
        await trio.sleep(0)
        if self.fail_next:
            self.fail_next -= 1
            return ["NOT_ENOUGH_REPLICAS"] * len(letters)
        self.written.extend((topic, letter) for letter in letters)
        return [None] * len(letters)


def service_with(dlq_topic: str, dlq_partitions: int = 2, *, copy: bool = True, marked: bool | None = True):
    cluster = FakeCluster(partitions=3)
    for partition in range(3):
        cluster.append([f"v{partition}-{i}".encode() for i in range(5)], partition=partition)
    if dlq_partitions:
        info = TopicInfo(dlq_topic, uuid.uuid4(), {p: PartitionInfo(1, 0) for p in range(dlq_partitions)})
        cluster.snapshot.topics_by_name[dlq_topic] = info
    writer = FakeWriter()
    service = ShareService(cluster, writer)
    service.coordinator.set_group_config(GROUP, {"errors.deadletterqueue.topic.name": dlq_topic,
                                                 "errors.deadletterqueue.copy.record.enable": str(copy).lower()})
    dlq = FakeDeadLetterCluster({dlq_topic: (dlq_partitions, marked)} if dlq_partitions else {})
    return service, writer, dlq


def reject(service: ShareService, partition: int, first: int, last: int) -> Leader:
    """A member acquires offsets 0-4 of `partition` and rejects [first, last] (ARCHIVING follows)."""
    key = (GROUP, TOPIC_ID, partition)
    leader = service.leaders.get(key) or service.leaders.add(
        Leader(key, SharePartition(service.leaders.config_for(GROUP), 0), create_timestamp=0))
    service.leaders.refresh_config(leader)
    result = leader.engine.acquire("m", [BatchHeader(0, 4)], now=0, max_records=100)
    assert result.count == 5
    delta = leader.engine.acknowledge("m", [AckRange(first, last, (REJECT_TYPE,))], now=0)
    service.commits.record(leader, delta, Cause.ACKNOWLEDGED)
    return leader


async def run_until(service, writer_task, condition, timeout: float = 5.0) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.commits.run)
        nursery.start_soon(writer_task)
        with trio.fail_after(timeout):
            while not condition():
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_rejected_records_are_written_once_durable_then_archived_with_copies():
    service, writer, dlq = service_with("dlq.billing")
    leader = reject(service, partition=1, first=2, last=3)
    assert leader.engine.archiving_count == 2
    dead_letters = DeadLetterWriter(service, dlq, DeadLetterSettings(initial_backoff_s=0.01))
    await run_until(service, dead_letters.run, lambda: leader.engine.archiving_count == 0)
    assert [(topic, x.offset, x.partition, x.key, x.value) for topic, x in dlq.written] == [
        ("dlq.billing", 2, 1, None, b"v1-2"), ("dlq.billing", 3, 1, None, b"v1-3")]
    assert dict(dlq.written[0][1].headers)["__dlq.errors.message"] == b"Offset rejected by client."
    assert [leader.engine.record_state(o)[0] for o in (2, 3)] == [RecordState.ARCHIVED] * 2
    assert writer.writes, "the ARCHIVING state was written before the dead letters"


async def test_transient_failures_are_retried_until_written_and_nothing_is_lost():
    service, _writer, dlq = service_with("dlq.billing")
    dlq.fail_next = 3
    leader = reject(service, partition=0, first=0, last=4)
    dead_letters = DeadLetterWriter(service, dlq, DeadLetterSettings(initial_backoff_s=0.01, max_backoff_s=0.02))
    await run_until(service, dead_letters.run, lambda: leader.engine.archiving_count == 0)
    assert sorted(x.offset for _, x in dlq.written) == [0, 1, 2, 3, 4]
    assert dlq.fail_next == 0


@pytest.mark.parametrize(("topic", "dlq_partitions", "marked"), [
    ("elsewhere.billing", 2, True),  # prefix
    ("dlq.billing", 2, False),  # not marked as a DLQ topic
    ("dlq.billing", 0, None),  # missing, auto-create off
])
async def test_a_failed_check_archives_regardless_without_writing(topic, dlq_partitions, marked):
    service, _writer, dlq = service_with(topic, dlq_partitions, marked=marked)
    leader = reject(service, partition=2, first=1, last=1)
    dead_letters = DeadLetterWriter(service, dlq, DeadLetterSettings(initial_backoff_s=0.01))
    await run_until(service, dead_letters.run, lambda: leader.engine.archiving_count == 0)
    assert dlq.written == []
    assert leader.engine.record_state(1)[0] == RecordState.ARCHIVED


async def test_a_hand_over_stops_a_drain_and_archives_nothing_here(nursery):
    """Scale-out: a share-partition handed to another instance mid-round writes no more letters and
    finishes nothing here (its new owner finds the records ARCHIVING and dead-letters them)."""
    service, _writer, dlq = service_with("dlq.billing")
    leader = reject(service, partition=1, first=0, last=4)
    producing = trio.Event()
    release = trio.Event()
    produce = dlq.produce

    async def held_produce(topic, letters):
        producing.set()
        await release.wait()
        return await produce(topic, letters)

    dlq.produce = held_produce
    dead_letters = DeadLetterWriter(service, dlq, DeadLetterSettings(initial_backoff_s=0.01))
    service.hand_over_listeners.append(dead_letters.cancel)
    nursery.start_soon(service.commits.run)
    nursery.start_soon(dead_letters.run)
    with trio.fail_after(5):
        await producing.wait()
    assert dead_letters._scopes  # a drain is in its round
    key = leader.key
    for listener in service.hand_over_listeners:  # what give_up does first
        listener([key])
    service.leaders.remove(key)
    release.set()
    with trio.fail_after(5):
        while dead_letters._scopes:
            await trio.sleep(0.01)
    assert dlq.written == []
    assert leader.engine.archiving_count == 5  # left ARCHIVING for the new owner
