"""The Python client (client.ShareConsumer) against the real broker, through the proxy.

Each test consumes real records produced by confluent-kafka or Kafka's Java producer and checks
what came back (values, offsets, delivery counts, headers), what the proxy holds durably, and what
the group looks like afterwards.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time

import pytest
from confluent_kafka import Producer

import client
from client import AcknowledgeType, KafkaException
from integration.client.conftest import PythonClientThread, consumer, log_ends, poll_until, set_group_configs
from integration.java.build import driver_command, run_driver
from integration.share.conftest import (
    ConsumerThread,
    describe_share_group,
    finished_durably,
    produce,
    wait_for_assigned_members,
    wait_until,
)

pytestmark = pytest.mark.integration

EXPLICIT = {"share.acknowledgement.mode": "explicit"}


@pytest.fixture(scope="module")
def proxy(module_share_proxy):
    """Kafka's default share-group settings (30 s record locks)."""
    return module_share_proxy()


# ----- consuming ------------------------------------------------------------------------------


def test_consumes_a_topic_fully_alone_each_record_accepted_once(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=3)
    produced = produce(kafka.bootstrap, topic, 3000, partitions=3, batch_records=100)
    with consumer(proxy, names.group, topic, **{"max.poll.records": 200}) as share:
        got = poll_until(share, 3000)
        assert share.poll(1.0) == []  # this poll also accepts the previous poll's records
        assert share.acquisition_lock_timeout_ms == 30_000
    values = collections.Counter(m.value() for m in got)
    assert values.keys() == set(produced) and max(values.values()) == 1
    assert {m.delivery_count() for m in got} == {1}
    by_partition = collections.Counter(m.partition() for m in got)
    assert by_partition == {0: 1000, 1: 1000, 2: 1000}
    wait_until(lambda: finished_durably(kafka.bootstrap, proxy.state_topic, names.group,
                                        log_ends(kafka.bootstrap, topic, 3)),
               20, "every record acknowledged durably")


def test_poll_returns_at_most_max_poll_records(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 500, batch_records=500)
    with consumer(proxy, names.group, topic, **{"max.poll.records": 37}) as share:
        sizes = []
        total = 0
        deadline = time.monotonic() + 30
        while total < 500 and time.monotonic() < deadline:
            batch = share.poll(0.5)
            sizes.append(len(batch))
            total += len(batch)
        assert total == 500 and max(sizes) <= 37


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_topics_produced_by_confluent_kafka(kafka, proxy, create_topic, names, compression):
    topic = create_topic(names.topic)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": compression, "linger.ms": 20})
    for i in range(400):
        producer.produce(topic, key=b"k%d" % i, value=(b"v%d-" % i) * 50, headers=[("i", str(i).encode())])
    assert producer.flush(30) == 0
    with consumer(proxy, names.group, topic) as share:
        got = poll_until(share, 400)
    assert [m.offset() for m in got] == list(range(400))
    assert [m.value() for m in got] == [(b"v%d-" % i) * 50 for i in range(400)]
    assert [m.key() for m in got] == [b"k%d" % i for i in range(400)]
    assert [m.headers() for m in got] == [[("i", str(i).encode())] for i in range(400)]
    assert {m.timestamp()[0] for m in got} == {client.TIMESTAMP_CREATE_TIME}


@pytest.mark.java
@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_topics_produced_by_kafkas_java_producer(kafka, proxy, create_topic, names, compression):
    """Java's snappy is snappy-java's xerial framing; its lz4 and zstd are the frame formats."""
    topic = create_topic(names.topic)
    summary = run_driver("produce", bootstrap=kafka.bootstrap, topic=topic, count=300, compression=compression)
    assert summary["produced"] == 300
    with consumer(proxy, names.group, topic) as share:
        got = poll_until(share, 300)
    assert [(m.key(), m.value()) for m in got] == [(b"key-%d" % i, b"value-%d" % i) for i in range(300)]
    assert [m.headers() for m in got] == [[("index", str(i).encode()), ("source", b"java-driver")] for i in range(300)]


def test_read_committed_group_never_gets_aborted_records_or_markers(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    set_group_configs(proxy.bootstrap, names.group, {"share.isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": names.another("tx")})
    producer.init_transactions(30)
    for outcome, start in (("commit", 0), ("abort", 100), ("commit", 200)):
        producer.begin_transaction()
        for i in range(start, start + 10):
            producer.produce(topic, value=str(i).encode())
        producer.flush(30)
        (producer.commit_transaction if outcome == "commit" else producer.abort_transaction)(30)
    with consumer(proxy, names.group, topic) as share:
        got = poll_until(share, 20)
        assert share.poll(1.0) == []
    assert [int(m.value()) for m in got] == [*range(0, 10), *range(200, 210)]


# ----- acknowledgement modes --------------------------------------------------------------------


def test_explicit_mode_release_is_redelivered_and_reject_is_not(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 30)
    results = []
    with consumer(proxy, names.group, topic, **EXPLICIT) as share:
        share.set_acknowledgement_commit_callback(lambda offsets, error: results.append((offsets, error)))
        first = poll_until(share, 30)
        kinds = {m.offset(): (AcknowledgeType.RELEASE if m.offset() < 5 else
                              AcknowledgeType.REJECT if m.offset() < 10 else AcknowledgeType.ACCEPT) for m in first}
        for message in first:
            share.acknowledge(message, kinds[message.offset()])
        committed = share.commit_sync(10)
        assert list(committed.values()) == [None]
        again = poll_until(share, 5)
        assert sorted((m.offset(), m.delivery_count()) for m in again) == [(o, 2) for o in range(5)]
        for message in again:
            share.acknowledge(message)
        assert share.poll(1.0) == []
    assert all(error is None for _, error in results)
    acknowledged = sorted(o for offsets, _ in results for tp_offsets in offsets.values() for o in tp_offsets)
    assert acknowledged == sorted([*range(30), *range(5)])


def test_explicit_mode_refuses_to_poll_past_unacknowledged_records(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 3)
    with consumer(proxy, names.group, topic, **EXPLICIT) as share:
        got = poll_until(share, 3)
        with pytest.raises(KafkaException) as refused:
            share.poll(0.1)
        assert refused.value.args[0].code() == client.KafkaError.STATE
        for message in got:
            share.acknowledge(message)
        assert share.poll(0.2) == []
        with pytest.raises(KafkaException):
            share.acknowledge(got[0])  # no longer in flight


def test_implicit_mode_commit_sync_accepts_the_last_poll(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 50)
    share = consumer(proxy, names.group, topic)
    got = poll_until(share, 50)
    with pytest.raises(KafkaException):
        share.acknowledge(got[0])  # implicit mode
    assert list(share.commit_sync(10).values()) == [None]
    share.close()
    with consumer(proxy, names.group, topic) as other:
        assert other.poll(2.0) == []
    wait_until(lambda: finished_durably(kafka.bootstrap, proxy.state_topic, names.group, {0: 50}), 20,
               "50 records acknowledged durably")


def test_commit_async_reports_through_the_callback(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 20)
    results = []
    with consumer(proxy, names.group, topic, **EXPLICIT) as share:
        share.set_acknowledgement_commit_callback(lambda offsets, error: results.append((offsets, error)))
        for message in poll_until(share, 20):
            share.acknowledge(message)
        share.commit_async()
        wait_until(lambda: share.poll(0.1) == [] and results, 10, "the async commit's callback")
    assert [(sorted(o for s in offsets.values() for o in s), error) for offsets, error in results] == [(list(range(20)), None)]


# ----- membership ---------------------------------------------------------------------------------


def test_close_leaves_the_group_and_releases_unacknowledged_records(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 10)
    share = consumer(proxy, names.group, topic, **EXPLICIT)
    held = poll_until(share, 10)
    for message in held[:4]:
        share.acknowledge(message)
    member = share.memberid()
    assert [m.member_id for m in describe_share_group(proxy.bootstrap, names.group).members] == [member]
    share.close()
    assert describe_share_group(proxy.bootstrap, names.group).members in ((), None)
    with pytest.raises(KafkaException):
        share.poll(0.1)
    with consumer(proxy, names.group, topic, **EXPLICIT) as other:
        again = poll_until(other, 6)
        assert sorted(m.offset() for m in again) == list(range(4, 10))
        for message in again:
            other.acknowledge(message)


def test_heartbeat_keeps_membership_and_rejoins_with_the_same_member_id(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=2)
    with consumer(proxy, names.group, topic) as share:
        described = wait_for_assigned_members(proxy.bootstrap, names.group, 1)
        assert described.members[0].member_id == share.memberid()
        assert sorted(share.assignment()) == [(topic, 0), (topic, 1)]
        time.sleep(3)  # several heartbeat intervals
        assert [m.member_id for m in describe_share_group(proxy.bootstrap, names.group).members] == [share.memberid()]


# ----- beside stock clients -------------------------------------------------------------------------


@pytest.mark.java
def test_consumes_beside_java_and_librdkafka_share_consumers(kafka, proxy, create_topic, names):
    """Three clients in one group: every record accepted exactly once across them, each got some."""
    total = 6000
    topic = create_topic(names.topic, partitions=3)
    java = subprocess.Popen(
        driver_command("share-consume", bootstrap=proxy.bootstrap, group=names.group, topic=topic,
                       ack_mode="explicit", commit="sync", max_poll_records=100, process_ms=5,
                       idle_stop_ms=4000, timeout_ms=90_000),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    librdkafka = ConsumerThread(proxy.bootstrap, names.group, topic, name="confluent", processing_s=0.005)
    python = PythonClientThread(proxy, names.group, topic, processing_s=0.005)
    librdkafka.start()
    python.start()
    try:
        wait_for_assigned_members(proxy.bootstrap, names.group, 3, timeout=60)
        produced = {v.decode() for v in produce(kafka.bootstrap, topic, total, partitions=3, batch_records=100)}
        stdout, stderr = java.communicate(timeout=120)
        assert java.returncode == 0, stderr[-4000:]
        java_summary = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
        java_values = [d[3] for d in java_summary["deliveries"]]

        def all_seen() -> bool:
            seen = set(java_values) | {d.value.decode() for d in librdkafka.deliveries} | {
                d[3].decode() for d in python.deliveries}
            return len(seen) >= total

        wait_until(all_seen, 60, "the three consumers to take every record")
        time.sleep(1.0)  # a late redelivery would show up here
    finally:
        if java.poll() is None:
            java.kill()
            java.wait()
        librdkafka.finish()
        python.finish()
    split = {"java": len(java_values), "librdkafka": len(librdkafka.deliveries), "python": len(python.deliveries)}
    print(f"\nsplit of {total} records: {split}")
    everything = collections.Counter(java_values + [d.value.decode() for d in librdkafka.deliveries]
                                     + [d[3].decode() for d in python.deliveries])
    assert everything.keys() == produced
    assert [v for v, n in everything.items() if n > 1] == []
    assert all(n > 0 for n in split.values()), split
    assert {d[2] for d in python.deliveries} == {1}
    assert python.errors == [] and librdkafka.errors == [] and java_summary["ack_errors"] == []
    wait_until(lambda: finished_durably(kafka.bootstrap, proxy.state_topic, names.group,
                                        log_ends(kafka.bootstrap, topic, 3)),
               20, "every record acknowledged durably")


# ----- the admin call ---------------------------------------------------------------------------------


def test_describe_share_group_in_flight_lists_the_records_a_member_holds(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 10, batch_records=10)
    with consumer(proxy, names.group, topic, **EXPLICIT) as share:
        held = poll_until(share, 10)
        for message in held[:3]:
            share.acknowledge(message)
        assert share.commit_sync(10)
        time.sleep(0.3)
        everything = client.describe_share_group_in_flight(proxy.bootstrap, names.group)
        assert [(r.topic, r.partition, r.first_offset, r.last_offset, r.state, r.member_id, r.delivery_count)
                for r in everything] == [(topic, 0, 3, 9, "ACQUIRED", share.memberid(), 1)]
        [run] = everything
        assert run.acquired_at_ms > 0 and run.in_progress_start_ms == -1 and run.last_progress_ms == -1
        assert run.stale is False
        assert client.describe_share_group_in_flight(proxy.bootstrap, names.group, only_state="IN_PROGRESS") == []
        assert client.describe_share_group_in_flight(proxy.bootstrap, names.group, held_longer_than_ms=600_000) == []
        for message in held[3:]:
            share.acknowledge(message)
    with pytest.raises(KafkaException) as unknown:
        client.describe_share_group_in_flight(proxy.bootstrap, names.another("no-such-group"))
    assert unknown.value.args[0].name() == "GROUP_ID_NOT_FOUND"
    with pytest.raises(KafkaException):
        client.describe_share_group_in_flight(proxy.bootstrap, names.group, only_state="BUSY")
