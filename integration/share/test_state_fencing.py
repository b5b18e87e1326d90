"""Fenced state writes against a real broker (--state-fencing transactional; issue 15 step 2).

A lane is a transactional producer per state-topic partition whose transactional.id is the same
for every instance. Taking it over (``init_transactions``) fences whoever had it: the broker
refuses the old owner's writes from then on. Shown here for the writer alone, and for a second
proxy started by mistake on the same state topic: the first one's acknowledgements then fail
instead of overwriting the state the second one now serves.
"""

from __future__ import annotations

import uuid

import pytest
import trio
from confluent_kafka import AcknowledgeType, Consumer, TopicPartition

from integration.share.conftest import (
    EXPLICIT,
    acknowledge_all,
    durable_state,
    metric,
    poll_until,
    produce,
    scrape_metrics,
    share_consumer,
)
from proxy.localkafka.broker import free_port
from proxy.share.persister import replay_state_topic
from proxy.share.state_lanes import StateFenced, TransactionalStateWriter

pytestmark = pytest.mark.integration


def read_all(bootstrap: str, topic: str, isolation: str) -> list[tuple[int, bytes, bytes | None]]:
    """(partition, key, value) of every record, read with `isolation` (read_committed / read_uncommitted)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found, quiet = [], 0
        while quiet < 4:
            batch = consumer.consume(500, timeout=0.5)
            quiet = 0 if batch else quiet + 1
            found += [(m.partition(), m.key(), m.value()) for m in batch if m.error() is None]
        return found
    finally:
        consumer.close()


def test_taking_a_lane_over_fences_its_old_owner_and_only_that_lane(kafka, create_topic):
    topic = create_topic(f"__state_fencing_{uuid.uuid4().hex[:12]}", partitions=3, config={"cleanup.policy": "compact"})
    prefix = f"test-{uuid.uuid4().hex[:8]}"

    async def scenario() -> dict[str, object]:
        old = TransactionalStateWriter(kafka.bootstrap, transactional_id_prefix=prefix, delivery_timeout_ms=15_000)
        new = TransactionalStateWriter(kafka.bootstrap, transactional_id_prefix=prefix, delivery_timeout_ms=15_000)
        old.start()
        new.start()
        await old.fence(topic)
        await old.write(topic, [(b"a", b"old-1", 0), (b"b", b"old-1", 1)])
        await new.fence(topic, [0])  # the new owner of partition 0 only
        outcome: dict[str, object] = {}
        try:
            await old.write(topic, [(b"a", b"old-2", 0)])
        except StateFenced as fenced:
            outcome["fenced_partition"] = fenced.partition
        try:
            await old.write(topic, [(b"a", b"old-3", 0)])
        except StateFenced:
            outcome["still_fenced"] = True
        await old.write(topic, [(b"b", b"old-2", 1)])  # partition 1 is still the old owner's
        await new.write(topic, [(b"a", b"new-1", 0)])
        await old.aclose()
        await new.aclose()
        return outcome

    outcome = trio.run(scenario)
    assert outcome == {"fenced_partition": 0, "still_fenced": True}
    committed = [(p, k, v) for p, k, v in read_all(kafka.bootstrap, topic, "read_committed")]
    assert sorted(committed) == [(0, b"a", b"new-1"), (0, b"a", b"old-1"), (1, b"b", b"old-1"), (1, b"b", b"old-2")]
    # Replay (read_committed) sees the same, and nothing the fenced owner tried after the fence.
    replayed = [(r.partition, r.key, r.value) for r in replay_state_topic(kafka.bootstrap, topic, timeout_s=20)]
    assert sorted(replayed) == sorted(committed)
    uncommitted = read_all(kafka.bootstrap, topic, "read_uncommitted")
    assert (0, b"a", b"old-2") not in uncommitted and (0, b"a", b"old-3") not in uncommitted


def test_a_second_proxy_on_the_same_state_topic_fences_the_first(kafka, share_proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 20)
    first_metrics = free_port()
    fencing = ("--state-fencing", "transactional", "--state-transactional-id-prefix", f"t-{uuid.uuid4().hex[:8]}")
    first = share_proxy(*fencing, "--metrics-port", str(first_metrics))
    consumer = share_consumer(first.bootstrap, names.group, topic, EXPLICIT)
    try:
        records = sorted(poll_until(consumer, 20), key=lambda m: m.offset())
        acknowledge_all(consumer, records[:10])  # confirmed: 0-9 accepted, through the first proxy

        second = share_proxy(*fencing, state_topic=first.state_topic)  # started by mistake: takes every lane

        for message in records[10:]:
            consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        results = consumer.commit_sync(30)
        assert [error for error in results.values() if error is not None], results  # refused, not overwritten
    finally:
        consumer.close()
    samples = scrape_metrics(first_metrics)
    assert metric(samples, "ksp_share_state_lanes_fenced_total") >= 1
    assert metric(samples, "ksp_share_state_writable") == 0

    # The second proxy serves what the first confirmed: 0-9 done, 10-19 delivered again.
    assert durable_state(kafka.bootstrap, first.state_topic, names.group)[0].start_offset == 10
    consumer = share_consumer(second.bootstrap, names.group, topic, EXPLICIT)
    try:
        again = poll_until(consumer, 10)
        assert sorted(m.offset() for m in again) == list(range(10, 20))
        acknowledge_all(consumer, again)
    finally:
        consumer.close()
    assert durable_state(kafka.bootstrap, first.state_topic, names.group)[0].start_offset == 20
