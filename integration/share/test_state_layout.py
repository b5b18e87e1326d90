"""A state topic an earlier proxy left in layout 1 is migrated to layout 2 when the proxy starts
(issue 15, step 1; docs/scale-out.md "Migration"), and serves exactly the same share state.

Layout 1 is built the way the earlier proxy wrote it: a proxy runs, acknowledges, is killed; its
records are then written to a second state topic with layout 1's placement (a share-partition's
records on librdkafka's partition for its snapshot key, group records where the partitioner puts
their own keys). A proxy started on that topic must migrate it -- copies at home, tombstones of the
old copies, the marker -- before it serves, and the consumer must find accepted and rejected
records done and released ones redelivered with their delivery counts.
"""

from __future__ import annotations

import signal
import uuid

import pytest
from confluent_kafka import AcknowledgeType, Producer

from codec.share_state import ProxyStateLayoutValue, RecordType, decode_key, decode_value
from integration.kafka_fixtures import topic_id_of
from integration.share.conftest import (
    EXPLICIT,
    acknowledge_all,
    durable_state,
    poll_until,
    produce,
    share_consumer,
)
from proxy.config import ProxyConfig
from proxy.share import state_store
from proxy.share.persister import replay_state_topic, route_partition

pytestmark = pytest.mark.integration

RECORDS_PER_PARTITION = 30
STATE_PARTITIONS = 3


def first_outcome(offset: int) -> AcknowledgeType:
    return {7: AcknowledgeType.RELEASE, 9: AcknowledgeType.REJECT}.get(offset % 10, AcknowledgeType.ACCEPT)


def copy_as_layout1(bootstrap: str, source: str, target: str) -> int:
    """Write `source`'s records (its layout marker left out) to `target` placed as layout 1 placed them."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failures: list[str] = []
    copied = 0
    for record in replay_state_topic(bootstrap, source, timeout_s=20):
        kind, key = decode_key(record.key)
        if kind is RecordType.PROXY_STATE_LAYOUT:
            continue
        on_delivery = (lambda err, _msg: failures.append(str(err)) if err is not None else None)
        if kind in (RecordType.SHARE_SNAPSHOT, RecordType.SHARE_UPDATE):
            route = state_store.layout1_share_partition_route((key.group_id, key.topic_id, int(key.partition)))
            producer.produce(target, key=record.key, value=record.value,
                             partition=route_partition(route, STATE_PARTITIONS), on_delivery=on_delivery)
        else:  # librdkafka's default partitioner on the record's own key
            producer.produce(target, key=record.key, value=record.value, on_delivery=on_delivery)
        copied += 1
    assert producer.flush(30) == 0 and not failures, failures
    return copied


def off_home_live(replayed) -> list:
    """Records that are the newest of their key on a partition other than the key's home, and live."""
    newest = {}
    for record in replayed:
        newest[(record.key, record.partition)] = record
    stray = []
    for (key_bytes, partition), record in newest.items():
        kind, key = decode_key(key_bytes)
        if kind is RecordType.PROXY_STATE_LAYOUT:
            continue
        route = (state_store.share_partition_route((key.group_id, key.topic_id, int(key.partition)))
                 if kind in (RecordType.SHARE_SNAPSHOT, RecordType.SHARE_UPDATE) else state_store.group_route(key.group_id))
        if partition != route_partition(route, STATE_PARTITIONS) and record.value is not None:
            stray.append((kind.name, partition))
    return stray


def markers(bootstrap: str, state_topic: str) -> list:
    return [(r.partition, decode_value(RecordType.PROXY_STATE_LAYOUT, r.value))
            for r in replay_state_topic(bootstrap, state_topic, timeout_s=20)
            if decode_key(r.key)[0] is RecordType.PROXY_STATE_LAYOUT]


def group_off_home_in_layout1(stem: str, topic_id: uuid.UUID) -> str:
    """A group id whose share-partition 0 of `topic_id` layout 1 placed off its layout-2 home.

    With random ids every live record of the test landed on its home by chance once in 81 runs
    (each of its 4 live keys -- two snapshots, two group records -- one time in 3): the migration then had nothing to move, and the
    test failed on its own precondition (Kafka 3.9.2 suite, stop 54)."""
    for attempt in range(100):
        group = f"{stem}-{attempt}"
        key = (group, topic_id, 0)
        if (route_partition(state_store.layout1_share_partition_route(key), STATE_PARTITIONS)
                != route_partition(state_store.share_partition_route(key), STATE_PARTITIONS)):
            return group
    raise AssertionError("no group id in 100 is placed off home in layout 1")  # (2/3 each: never)


def test_a_layout1_state_topic_is_migrated_on_start_and_serves_the_same_state(kafka, share_proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=2)
    group = group_off_home_in_layout1(names.group, topic_id_of(kafka.bootstrap, topic))
    produce(kafka.bootstrap, topic, 2 * RECORDS_PER_PARTITION, partitions=2)
    first_proxy = share_proxy()
    # A new state topic: the default partition count, marked layout 2.
    assert markers(kafka.bootstrap, first_proxy.state_topic) == [
        (0, ProxyStateLayoutValue(layout=2, partitions=ProxyConfig(upstream=kafka.bootstrap).state_topic_partitions))]
    consumer = share_consumer(first_proxy.bootstrap, group, topic, EXPLICIT)
    try:
        first = poll_until(consumer, 2 * RECORDS_PER_PARTITION)
        acknowledge_all(consumer, first, lambda m: first_outcome(m.offset()))
    finally:
        consumer.close()
    first_proxy.stop(signal.SIGKILL)

    layout1 = create_topic(f"__share_proxy_state_layout1_{uuid.uuid4().hex[:12]}", partitions=STATE_PARTITIONS,
                           config={"cleanup.policy": "compact"})
    assert copy_as_layout1(kafka.bootstrap, first_proxy.state_topic, layout1) > 0
    assert off_home_live(replay_state_topic(kafka.bootstrap, layout1, timeout_s=20))  # layout 1 is off home
    before = durable_state(kafka.bootstrap, layout1, group)
    assert before == durable_state(kafka.bootstrap, first_proxy.state_topic, group)
    assert set(before) == {0, 1}

    proxy = share_proxy(state_topic=layout1)  # migrates before it is ready
    replayed = replay_state_topic(kafka.bootstrap, layout1, timeout_s=20)
    assert markers(kafka.bootstrap, layout1) == [(0, ProxyStateLayoutValue(layout=2, partitions=STATE_PARTITIONS))]
    assert off_home_live(replayed) == []  # every old copy tombstoned
    strict = state_store.recover(replayed, partitions=STATE_PARTITIONS, skip_misplaced=True)
    assert strict.misplaced > 0 and not strict.needs_migration(STATE_PARTITIONS)
    assert durable_state(kafka.bootstrap, layout1, group) == before

    consumer = share_consumer(proxy.bootstrap, group, topic, EXPLICIT)
    try:
        released = [(p, o) for p in (0, 1) for o in range(RECORDS_PER_PARTITION) if o % 10 == 7]
        second = poll_until(consumer, len(released))
        assert sorted((m.partition(), m.offset(), m.delivery_count()) for m in second) == [
            (p, o, 2) for p, o in released]
        acknowledge_all(consumer, second)
        # Accepted and rejected records stayed done: next come the records produced now.
        produce(kafka.bootstrap, topic, 2, partitions=2, start=2 * RECORDS_PER_PARTITION)
        later = poll_until(consumer, 2)
        assert sorted((m.partition(), m.offset(), m.delivery_count()) for m in later) == [
            (0, RECORDS_PER_PARTITION, 1), (1, RECORDS_PER_PARTITION, 1)]
        acknowledge_all(consumer, later)
    finally:
        consumer.close()

    # A restart finds the topic in layout 2: nothing is migrated again.
    proxy.stop(signal.SIGKILL)
    proxy.start()
    assert len(markers(kafka.bootstrap, layout1)) == 1
    after = durable_state(kafka.bootstrap, layout1, group)
    assert {p: s.start_offset for p, s in after.items()} == {0: RECORDS_PER_PARTITION + 1, 1: RECORDS_PER_PARTITION + 1}
