"""confluent_kafka.ShareConsumer through the proxy, on a broker without share groups of its own.

Each test produces numbered records straight to the broker, consumes them through the proxy
with real share consumers, and checks what was delivered: exactly-once sharing, work for every
member, and KIP-932's acknowledgement outcomes (release, reject, lock timeout, delivery limit).
"""

from __future__ import annotations

import collections
import time

import pytest
from confluent_kafka import AcknowledgeType, Consumer, Producer, TopicPartition

from integration.share.conftest import (
    EXPLICIT,
    ConsumerThread,
    acknowledge_all,
    consumer_threads,
    describe_share_group,
    poll_until,
    produce,
    share_consumer,
    wait_until,
)

pytestmark = pytest.mark.integration

# Two-second locks and a delivery limit of 2 for the lock-timeout and delivery-limit tests.
STRICT_FLAGS = ("--share-record-lock-duration-ms", "2000", "--share-min-record-lock-duration-ms", "1000",
                "--share-delivery-count-limit", "2")


@pytest.fixture(scope="module")
def default_proxy(module_share_proxy):
    """A proxy with Kafka's default share-group settings (30 s locks, delivery limit 5)."""
    return module_share_proxy()


@pytest.fixture(scope="module")
def strict_proxy(module_share_proxy):
    return module_share_proxy(*STRICT_FLAGS)


def test_three_consumers_share_30000_records_each_processed_exactly_once(kafka, default_proxy, create_topic,
                                                                         names, record_property):
    proxy = default_proxy
    topic = create_topic(names.topic, partitions=1)
    with consumer_threads(proxy.bootstrap, names.group, topic, 3, processing_s=0.002) as consumers:
        produced = set(produce(kafka.bootstrap, topic, 30_000, batch_records=250))

        def seen() -> set[bytes]:
            return {d.value for c in consumers for d in c.deliveries}

        wait_until(lambda: len(seen()) >= len(produced), 90, "all 30,000 records")
        time.sleep(1.0)  # a late duplicate would show up here

    values = [d.value for c in consumers for d in c.deliveries]
    counts = collections.Counter(values)
    duplicates = sum(n - 1 for n in counts.values())
    missing = len(produced - counts.keys())
    split = {c.name: len(c.deliveries) for c in consumers}
    record_property("per_consumer_split", split)
    print(f"\nper-consumer split of 30,000 records: {split}, duplicates={duplicates}, missing={missing}")
    assert [c.errors for c in consumers] == [[], [], []]
    assert counts.keys() <= produced
    assert (duplicates, missing) == (0, 0)
    assert all(d.delivery_count == 1 for c in consumers for d in c.deliveries)
    assert all(n > 0 for n in split.values()), f"a consumer got no records: {split}"


def test_more_consumers_than_partitions_all_receive_work(kafka, default_proxy, create_topic, names):
    proxy = default_proxy
    topic = create_topic(names.topic, partitions=2)
    with consumer_threads(proxy.bootstrap, names.group, topic, 4, processing_s=0.02) as consumers:
        produced = set(produce(kafka.bootstrap, topic, 8_000, partitions=2, batch_records=250))
        wait_until(lambda: len({d.value for c in consumers for d in c.deliveries}) >= len(produced), 60,
                   "all 8,000 records")

        # Once the members' heartbeats have converged, each partition is shared by two members.
        def sharing() -> collections.Counter:
            described = describe_share_group(proxy.bootstrap, names.group)
            return collections.Counter(
                p for m in described.members for t in m.assignment.topic_partitions for p in t.partitions
            )

        wait_until(lambda: sharing() == {0: 2, 1: 2}, 20, "two members per partition", interval=0.5)

    split = {c.name: len(c.deliveries) for c in consumers}
    print(f"\nper-consumer split of 8,000 records on 2 partitions: {split}")
    assert all(n > 0 for n in split.values()), f"a consumer got no records: {split}"
    values = [d.value for c in consumers for d in c.deliveries]
    assert len(values) == len(set(values)) == len(produced)
    assert [c.errors for c in consumers] == [[], [], [], []]


def test_released_record_is_redelivered_with_delivery_count_2(kafka, default_proxy, create_topic, names):
    proxy = default_proxy
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 10)
    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        first = poll_until(consumer, 10)
        assert [(m.offset(), m.delivery_count()) for m in first] == [(o, 1) for o in range(10)]
        released = {3, 7}
        acknowledge_all(consumer, first,
                        lambda m: AcknowledgeType.RELEASE if m.offset() in released else AcknowledgeType.ACCEPT)

        again = poll_until(consumer, 2)
        assert sorted((m.offset(), m.delivery_count(), m.value()) for m in again) == [
            (3, 2, b"3"), (7, 2, b"7"),
        ]
        acknowledge_all(consumer, again)
    finally:
        consumer.close()


def test_rejected_record_is_never_redelivered(kafka, default_proxy, create_topic, names):
    proxy = default_proxy
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 10)
    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        first = poll_until(consumer, 10)
        rejected = {2, 5}
        acknowledge_all(consumer, first,
                        lambda m: AcknowledgeType.REJECT if m.offset() in rejected else AcknowledgeType.ACCEPT)
        # Records produced after the rejection: anything still available would come before them.
        produce(kafka.bootstrap, topic, 5, start=10)
        later = poll_until(consumer, 5)
        acknowledge_all(consumer, later)
        assert [m.offset() for m in later] == [10, 11, 12, 13, 14]
        assert not consumer.poll(1.0)
    finally:
        consumer.close()
    # A new member of the group finds nothing either.
    newcomer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert not [m.offset() for m in newcomer.poll(0.5)]
    finally:
        newcomer.close()


def test_lock_timeout_redelivers_to_another_consumer(kafka, strict_proxy, create_topic, names):
    proxy = strict_proxy
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 10)
    holder = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    other = None
    try:
        held = poll_until(holder, 10)
        acquired_at = time.monotonic()
        assert [m.delivery_count() for m in held] == [1] * 10
        # The holder never acknowledges; after the 2 s lock the records go to another member.
        other = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
        redelivered = poll_until(other, 10, timeout=30)
        waited = time.monotonic() - acquired_at
        assert sorted((m.offset(), m.delivery_count()) for m in redelivered) == [(o, 2) for o in range(10)]
        assert waited >= 1.5, f"redelivered after {waited:.2f}s, before the 2 s lock expired"
        acknowledge_all(other, redelivered)
    finally:
        if other is not None:
            other.close()
        holder.close()


def test_record_reaching_delivery_limit_is_archived_not_redelivered(kafka, strict_proxy, create_topic, names):
    proxy = strict_proxy
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 4)
    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        first = poll_until(consumer, 4)
        acknowledge_all(consumer, first, lambda m: AcknowledgeType.RELEASE)
        second = poll_until(consumer, 4)
        assert sorted((m.offset(), m.delivery_count()) for m in second) == [(o, 2) for o in range(4)]
        acknowledge_all(consumer, second, lambda m: AcknowledgeType.RELEASE)
        # Released at the limit -> archived: the next records produced are what comes next.
        produce(kafka.bootstrap, topic, 3, start=4)
        later = poll_until(consumer, 3)
        assert sorted((m.offset(), m.delivery_count()) for m in later) == [(4, 1), (5, 1), (6, 1)]
        acknowledge_all(consumer, later)
        assert not consumer.poll(1.0)
    finally:
        consumer.close()


def test_consumer_group_and_producer_work_beside_a_share_group(kafka, default_proxy, create_topic, names):
    proxy = default_proxy
    topic = create_topic(names.topic, partitions=2)
    sharer = ConsumerThread(proxy.bootstrap, names.group, topic, name="share-consumer")
    sharer.start()
    classic_group = names.another("classic")
    classic = Consumer({
        "bootstrap.servers": proxy.bootstrap,
        "group.id": classic_group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    try:
        classic.subscribe([topic])
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True})
        values = [f"v{i}".encode() for i in range(2_000)]
        for i, value in enumerate(values):
            producer.produce(topic, value=value, partition=i % 2)
        assert producer.flush(30) == 0

        received: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(received) < len(values) and time.monotonic() < deadline:
            for message in classic.consume(500, 0.5):
                assert message.error() is None, message.error()
                received.append(message.value())
        classic.commit(asynchronous=False)
        committed = classic.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        wait_until(lambda: len({d.value for d in sharer.deliveries}) >= len(values), 60,
                   lambda: f"the share consumer ({len(sharer.deliveries)} of {len(values)} records, "
                           f"errors {sharer.errors[:3]})")
    finally:
        classic.close()
        sharer.finish()

    assert sorted(received) == sorted(values)
    assert sorted(tp.offset for tp in committed) == [1_000, 1_000]
    assert sorted(d.value for d in sharer.deliveries) == sorted(values)
    assert sharer.errors == []

