"""The persister against a real broker: state-topic creation, durable writes, replay, failures."""

from __future__ import annotations

import collections
import signal
import time
import uuid

import pytest
import trio
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from proxy.localkafka import free_port
from proxy.share import state_store
from proxy.share.partition import PartitionSnapshot, PersistedBatch
from proxy.share.persister import (
    PersistError,
    StateLogWriter,
    StateTopicSpec,
    ensure_state_topics,
    replay_state_topic,
    route_partition,
)
from proxy.share.states import RecordState

pytestmark = pytest.mark.integration


@pytest.fixture
def state_topic(kafka) -> str:
    """A new state topic whose partitions have leaders (readable to the end)."""
    name = f"__share_state_test_{uuid.uuid4().hex[:10]}"
    ensure_state_topics(kafka.bootstrap, [StateTopicSpec(name)])
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "unused"})
    try:
        deadline = time.monotonic() + 30
        for partition in range(StateTopicSpec(name).partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=5)
                    break
                except KafkaException:  # NOT_LEADER_FOR_PARTITION until the leader is elected
                    assert time.monotonic() < deadline, f"{name}-{partition} has no leader"
                    time.sleep(0.1)
    finally:
        consumer.close()
    return name


async def replay(bootstrap: str, topic: str, **kwargs):
    return await trio.to_thread.run_sync(lambda: replay_state_topic(bootstrap, topic, **kwargs))


def describe_topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {name: entry.value for name, entry in admin.describe_configs([resource])[resource].result(30).items()}


def test_missing_state_topic_is_created_compacted_with_the_requested_partitions(kafka):
    name = f"__share_state_test_{uuid.uuid4().hex[:10]}"
    ensure_state_topics(kafka.bootstrap, [StateTopicSpec(name, partitions=2)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 2
    assert describe_topic_config(kafka.bootstrap, name)["cleanup.policy"] == "compact"
    ensure_state_topics(kafka.bootstrap, [StateTopicSpec(name)])  # existing and compacted: accepted


def test_new_state_topic_replication_follows_the_cluster_unless_configured(kafka):
    name = f"__share_state_test_{uuid.uuid4().hex[:10]}"
    ensure_state_topics(kafka.bootstrap, [StateTopicSpec(name)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    partitions = admin.list_topics(name, timeout=10).topics[name].partitions
    assert {len(p.replicas) for p in partitions.values()} == {1}  # one broker: min(3, 1)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([resource])[resource].result(30)
    # Set on the topic itself (not the broker default of the same value): min(2, RF 1).
    assert configs["min.insync.replicas"].value == "1"
    assert configs["min.insync.replicas"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "compact"

    # A configured replication factor wins over the cluster size: the single broker refuses 2.
    other = f"__share_state_test_{uuid.uuid4().hex[:10]}"
    with pytest.raises(PersistError, match="INVALID_REPLICATION_FACTOR|replication factor"):
        ensure_state_topics(kafka.bootstrap, [StateTopicSpec(other, replication_factor=2)])


def test_existing_topic_that_is_not_compacted_is_refused(kafka, create_topic, names):
    topic = create_topic(names.topic, config={"cleanup.policy": "delete"})
    with pytest.raises(PersistError, match="cleanup.policy=delete"):
        ensure_state_topics(kafka.bootstrap, [StateTopicSpec(topic)])


async def test_written_records_and_tombstones_replay_in_log_order(kafka, state_topic):
    writer = StateLogWriter(kafka.bootstrap)
    writer.start()
    try:
        # One key: every record lands on the same partition, so log order is write order.
        await writer.write(state_topic, [(b"k", b"v1"), (b"k", b"v2")])
        await writer.write(state_topic, [(b"k", None), (b"other", b"x")])
    finally:
        await writer.aclose()

    replayed = await replay(kafka.bootstrap, state_topic)
    by_partition: dict[int, list] = {}
    for record in replayed:
        by_partition.setdefault(record.partition, []).append(record)
    assert collections.Counter((r.key, r.value) for r in replayed) == collections.Counter(
        [(b"k", b"v1"), (b"k", b"v2"), (b"k", None), (b"other", b"x")]
    )
    k_partition = next(r.partition for r in replayed if r.key == b"k")
    assert [r.value for r in by_partition[k_partition] if r.key == b"k"] == [b"v1", b"v2", None]
    for records in by_partition.values():
        assert [r.offset for r in records] == sorted(r.offset for r in records)


async def test_librdkafkas_partitioner_puts_a_key_where_route_partition_says_and_routed_records_land_beside_it(
        kafka, state_topic):
    # Existing state topics hold snapshots where librdkafka's default partitioner put them; routed
    # records (a share-partition's update and tombstones, --state-deltas) must land on that partition.
    partitions = StateTopicSpec(state_topic).partitions
    keys = [state_store.share_partition_route(("group-a", uuid.UUID(int=i), i % 5)) for i in range(24)]
    update_keys = [b"update-" + key for key in keys]
    writer = StateLogWriter(kafka.bootstrap)
    writer.start()
    try:
        await writer.write(state_topic, [(key, b"by the partitioner") for key in keys])
        await writer.write(state_topic, [(update, b"routed", key) for update, key in zip(update_keys, keys)])
        await writer.write(state_topic, [(update, None, key) for update, key in zip(update_keys, keys)])
    finally:
        await writer.aclose()

    replayed = await replay(kafka.bootstrap, state_topic)
    placed = {r.key: r.partition for r in replayed if r.value == b"by the partitioner"}
    assert placed == {key: route_partition(key, partitions) for key in keys}
    assert len(set(placed.values())) == partitions  # every partition was used: the check means something
    for update, key in zip(update_keys, keys):
        assert {r.partition for r in replayed if r.key == update} == {placed[key]}


async def test_writes_spread_over_several_producers_land_on_their_partitions_in_submission_order(kafka, state_topic):
    # --state-producers: each partition is written by one of the producers; its records keep the
    # order they were submitted in, with several writes in flight at once, as the commit pipeline has them.
    partitions = StateTopicSpec(state_topic).partitions
    routes = [state_store.share_partition_route(("group-a", uuid.UUID(int=i), 0)) for i in range(24)]
    writer = StateLogWriter(kafka.bootstrap, producers=3)
    writer.start()
    try:
        deliveries = [await writer.submit(state_topic, [(b"key-%d" % i, b"%d" % round_, route)
                                                        for i, route in enumerate(routes)]) for round_ in range(5)]
        await writer.write(state_topic, [(b"unrouted-key", b"placed by the writer")])
        for delivery in deliveries:
            await delivery.wait()
    finally:
        await writer.aclose()

    replayed = await replay(kafka.bootstrap, state_topic)
    for i, route in enumerate(routes):
        landed = [r for r in replayed if r.key == b"key-%d" % i]
        assert {r.partition for r in landed} == {route_partition(route, partitions)}
        assert [r.value for r in sorted(landed, key=lambda r: r.offset)] == [b"%d" % n for n in range(5)]
    assert len({route_partition(route, partitions) % 3 for route in routes}) == 3  # all three producers wrote
    unrouted = [r for r in replayed if r.key == b"unrouted-key"]
    assert [r.partition for r in unrouted] == [route_partition(b"unrouted-key", partitions)]


async def test_replay_of_an_empty_state_topic_is_empty(kafka, state_topic):
    assert await replay(kafka.bootstrap, state_topic) == []


async def test_replay_of_a_missing_topic_is_a_persist_error(kafka):
    with pytest.raises(PersistError):
        await replay(kafka.bootstrap, f"missing-{uuid.uuid4().hex[:8]}", timeout_s=10)


async def test_share_state_records_round_trip_through_the_topic(kafka, state_topic):
    key = ("group-a", uuid.uuid4(), 3)
    snapshot = PartitionSnapshot(100, (
        PersistedBatch(100, 104, RecordState.ACKNOWLEDGED, 1),
        PersistedBatch(105, 109, RecordState.AVAILABLE, 2),
        PersistedBatch(110, 110, RecordState.ARCHIVED, 5),
    ))
    newer = PartitionSnapshot(110, (PersistedBatch(110, 110, RecordState.ARCHIVED, 5),))
    gone = ("group-b", uuid.uuid4(), 0)
    writer = StateLogWriter(kafka.bootstrap)
    writer.start()
    try:
        await writer.write(state_topic, [
            state_store.group_metadata_record("group-a", 4, 1_000),
            state_store.group_metadata_record("group-b", 1, 1_000),
            state_store.snapshot_record(key, snapshot, snapshot_epoch=1, state_epoch=0,
                                        create_timestamp=1_000, write_timestamp=2_000),
            state_store.snapshot_record(gone, snapshot, snapshot_epoch=1, state_epoch=0,
                                        create_timestamp=1_000, write_timestamp=2_000),
        ])
        await writer.write(state_topic, [
            state_store.snapshot_record(key, newer, snapshot_epoch=2, state_epoch=0,
                                        create_timestamp=1_000, write_timestamp=3_000),
            state_store.partition_tombstone(gone),
        ])
    finally:
        await writer.aclose()

    replayed = await replay(kafka.bootstrap, state_topic)
    recovered = state_store.recover((r.key, r.value) for r in replayed)
    assert set(recovered.partitions) == {key}
    assert recovered.partitions[key].snapshot == newer
    assert recovered.partitions[key].snapshot_epoch == 2
    assert recovered.groups["group-a"].group_epoch == 4
    assert recovered.skipped == 0


async def test_write_to_a_missing_topic_is_a_persist_error(kafka):
    writer = StateLogWriter(kafka.bootstrap, client_config={"allow.auto.create.topics": "false"},
                            delivery_timeout_ms=3_000)
    writer.start()
    try:
        with pytest.raises(PersistError, match="failed"):
            await writer.write(f"missing-{uuid.uuid4().hex[:8]}", [(b"k", b"v")])
    finally:
        await writer.aclose(timeout_s=1)


async def test_write_with_no_reachable_broker_is_a_persist_error():
    writer = StateLogWriter(f"127.0.0.1:{free_port()}", delivery_timeout_ms=2_000)
    writer.start()
    try:
        with pytest.raises(PersistError):
            await writer.write("__share_state", [(b"k", b"v")])
    finally:
        await writer.aclose(timeout_s=1)


async def test_write_fails_when_the_broker_goes_away(kafka, share_proxy, state_topic):
    """The writer talks to the cluster through a pass-through proxy, which is then killed.

    From the writer's side every broker it knows disappears, as when the cluster stops, without
    stopping the session's broker that other tests use.
    """
    gateway = share_proxy("--disable-share-groups")
    writer = StateLogWriter(gateway.bootstrap, delivery_timeout_ms=3_000)
    writer.start()
    try:
        await writer.write(state_topic, [(b"k", b"before")])  # reachable: durable
        gateway.stop(signal.SIGKILL)
        with pytest.raises(PersistError):
            await writer.write(state_topic, [(b"k", b"after")])
    finally:
        await writer.aclose(timeout_s=1)
    replayed = await replay(kafka.bootstrap, state_topic)
    assert [(r.key, r.value) for r in replayed] == [(b"k", b"before")]
