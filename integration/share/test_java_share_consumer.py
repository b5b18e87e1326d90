"""Apache Kafka's Java KafkaShareConsumer (kafka-clients 4.4) through the proxy.

The Maven-built driver (`share-consume` in integration/java) consumes a topic and reports every
delivery (partition, offset, delivery count, value), each poll's size, and what the acknowledgement
commit callback said. Each test checks the topic was consumed fully with nothing lost and nothing
delivered twice unless the test asked for it (release), for each acknowledgement mode
(implicit, explicit), acquire mode (batch_optimized, record_limit) and lock renewal, and with a
confluent_kafka.ShareConsumer sharing the group.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time

import pytest

from integration.java.build import driver_command, run_driver
from integration.share.conftest import ConsumerThread, produce, wait_for_assigned_members, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.java]

RECORDS = 3000
PARTITIONS = 3
PRODUCER_BATCH = 100  # records per producer batch: batch_optimized acquires whole batches
LOCK_MS = 3000
PROCESS_MS = 1700  # each leg under the lock with room to spare; both together well over it


@pytest.fixture(scope="module")
def default_proxy(module_share_proxy):
    """Kafka's default share-group settings (30 s record locks)."""
    return module_share_proxy()


@pytest.fixture(scope="module")
def short_lock_proxy(module_share_proxy):
    """Three-second record locks: slow processing outlives a lock unless it is renewed."""
    return module_share_proxy("--share-record-lock-duration-ms", str(LOCK_MS),
                              "--share-min-record-lock-duration-ms", "1000")


@pytest.fixture
def loaded_topic(kafka, create_topic, names) -> tuple[str, set[str]]:
    """A three-partition topic holding RECORDS records; returns (name, produced values)."""
    name = create_topic(names.topic, partitions=PARTITIONS)
    values = produce(kafka.bootstrap, name, RECORDS, partitions=PARTITIONS, batch_records=PRODUCER_BATCH)
    return name, {v.decode() for v in values}


def share_consume(proxy, group: str, topic: str, **flags: object) -> dict:
    summary = run_driver("share-consume", timeout=120, bootstrap=proxy.bootstrap, group=group, topic=topic,
                         timeout_ms=60_000, **flags)
    assert "error" not in summary, summary
    return summary


def deliveries(summary: dict) -> list[tuple[int, int, int, str]]:
    """(partition, offset, delivery count, value) for every record the driver's polls returned."""
    return [tuple(d) for d in summary["deliveries"]]


def assert_consumed_once(summary: dict, produced: set[str]) -> None:
    """Every produced record delivered exactly once, first time round, every acknowledgement ok."""
    values = collections.Counter(d[3] for d in deliveries(summary))
    assert values.keys() == produced, f"missing {len(produced - values.keys())}, unexpected {values.keys() - produced}"
    assert [v for v, n in values.items() if n > 1] == []
    assert {d[2] for d in deliveries(summary)} == {1}
    assert summary["duplicates"] == 0
    assert summary["ack_errors"] == []
    assert summary["callback_acknowledged"] == summary["received"], "an acknowledgement was never confirmed"
    assert summary["per_partition"] == [f"{p}={RECORDS // PARTITIONS}" for p in range(PARTITIONS)]
    assert summary["acquisition_lock_timeout_ms"] == 30_000  # the proxy's record lock, as the client saw it


def test_implicit_acknowledgement_consumes_topic_fully(default_proxy, loaded_topic, names):
    """Implicit mode: each poll accepts the previous one's records (riding on the next ShareFetch)."""
    name, produced = loaded_topic
    summary = share_consume(default_proxy, names.group, name, count=RECORDS, ack_mode="implicit", commit="none")
    assert_consumed_once(summary, produced)


def test_explicit_acknowledgement_consumes_topic_fully_with_release_and_reject(default_proxy, loaded_topic, names):
    """Explicit mode, ShareAcknowledge after every poll: accept all but a released and a rejected few."""
    name, produced = loaded_topic
    released, rejected = {(0, 5), (1, 700)}, {(2, 9), (2, 10)}
    summary = share_consume(
        default_proxy, names.group, name, count=RECORDS, ack_mode="explicit", commit="sync",
        release=",".join(f"{p}:{o}" for p, o in released), reject=",".join(f"{p}:{o}" for p, o in rejected),
    )
    got = deliveries(summary)
    by_record = collections.defaultdict(list)
    for partition, offset, delivery_count, _value in got:
        by_record[(partition, offset)].append(delivery_count)
    # Released records come back once more, with delivery count 2; rejected ones never do.
    assert {r: counts for r, counts in by_record.items() if counts != [1]} == {r: [1, 2] for r in released}
    assert {d[3] for d in got} == produced
    assert (summary["released"], summary["rejected"], summary["finished"]) == (2, 2, RECORDS)
    assert summary["duplicates"] == 0
    assert summary["ack_errors"] == []
    assert summary["callback_acknowledged"] == summary["received"]


def test_batch_optimized_acquires_whole_batches(default_proxy, loaded_topic, names):
    """batch_optimized returns more than max.poll.records (10) to end on a producer-batch boundary."""
    name, produced = loaded_topic
    summary = share_consume(default_proxy, names.group, name, count=RECORDS, acquire_mode="batch_optimized",
                            max_poll_records=10)
    assert_consumed_once(summary, produced)
    assert summary["max_poll_size"] > 10, summary["poll_sizes"]


def test_record_limit_never_exceeds_max_poll_records(default_proxy, loaded_topic, names):
    name, produced = loaded_topic
    summary = share_consume(default_proxy, names.group, name, count=RECORDS, acquire_mode="record_limit",
                            max_poll_records=37, ack_mode="explicit", commit="async")
    assert_consumed_once(summary, produced)
    assert max(summary["poll_sizes"]) <= 37, summary["poll_sizes"]
    assert len(summary["poll_sizes"]) >= RECORDS // 37


def test_renewed_records_are_accepted_and_never_redelivered(default_proxy, loaded_topic, names):
    """RENEW every record once (riding on ShareFetch with IsRenewAck), accept it when handed back."""
    name, produced = loaded_topic
    summary = share_consume(default_proxy, names.group, name, count=RECORDS, ack_mode="explicit", renew="true")
    got = deliveries(summary)
    # The client hands each renewed record back once (same delivery count): not a redelivery.
    assert collections.Counter(collections.Counter(d[3] for d in got).values()) == {2: RECORDS}
    assert {d[3] for d in got} == produced
    assert {d[2] for d in got} == {1}
    assert (summary["renew_returns"], summary["renew_confirmed"], summary["finished"]) == (RECORDS, RECORDS, RECORDS)
    assert summary["duplicates"] == 0
    assert summary["ack_errors"] == []
    assert summary["callback_acknowledged"] == 2 * RECORDS  # each renewal and each acceptance


def test_renew_keeps_records_locked_past_the_lock_duration(kafka, short_lock_proxy, create_topic, names):
    """Slow work (1.7 s before renewing, 1.7 s more before accepting) outlives a 3 s lock only by renewing.

    Renewals go by ShareAcknowledge (IsRenewAck) here, as commitSync follows every poll.
    """
    name = create_topic(names.topic, partitions=1)
    produced = {v.decode() for v in produce(kafka.bootstrap, name, 1000, batch_records=PRODUCER_BATCH)}
    # One poll takes everything, so no record waits in the client's buffer while another is processed.
    summary = share_consume(short_lock_proxy, names.group, name, count=1000, ack_mode="explicit", renew="true",
                            commit="sync", process_ms=PROCESS_MS, max_poll_records=1000)
    got = deliveries(summary)
    assert {d[3] for d in got} == produced
    assert {d[2] for d in got} == {1}, "a lock expired: the record was redelivered"
    assert summary["acquisition_lock_timeout_ms"] == LOCK_MS
    assert summary["max_hold_ms"] > LOCK_MS
    assert (summary["renew_returns"], summary["renew_confirmed"], summary["finished"]) == (1000, 1000, 1000)
    assert summary["duplicates"] == 0
    assert summary["ack_errors"] == []


def test_records_left_unacknowledged_at_close_go_to_the_next_consumer(default_proxy, loaded_topic, names):
    """Closing with records unacknowledged (explicit mode) hands them to the group's next consumer.

    Their delivery count stays 1: Kafka does not count records released by a closing share session.
    """
    name, produced = loaded_topic
    leaver = share_consume(default_proxy, names.group, name, ack_mode="explicit", max_poll_records=100,
                           abandon_after_polls=2)
    accepted = {d[3] for d in leaver["deliveries"]}
    abandoned = {d[3] for d in leaver["abandoned"]}
    assert len(accepted) == len(abandoned) == 100 and leaver["ack_errors"] == []
    follower = share_consume(default_proxy, names.group, name, ack_mode="explicit", commit="sync",
                             count=RECORDS - len(accepted))
    got = deliveries(follower)
    assert collections.Counter(d[3] for d in got) == collections.Counter(produced - accepted)
    assert abandoned <= {d[3] for d in got}
    assert {d[2] for d in got} == {1}
    assert follower["duplicates"] == 0 and follower["ack_errors"] == []


def test_java_and_confluent_consumers_split_a_topic(kafka, default_proxy, create_topic, names):
    """A KafkaShareConsumer and a confluent_kafka.ShareConsumer in one group share a topic without overlap."""
    total = 4000
    name = create_topic(names.topic, partitions=2)
    java = subprocess.Popen(
        driver_command("share-consume", bootstrap=default_proxy.bootstrap, group=names.group, topic=name,
                       ack_mode="explicit", commit="sync", max_poll_records=100, process_ms=5,
                       idle_stop_ms=3000, timeout_ms=60_000),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    python = ConsumerThread(default_proxy.bootstrap, names.group, name, name="confluent", processing_s=0.005)
    python.start()
    try:
        wait_for_assigned_members(default_proxy.bootstrap, names.group, 2)
        produced = {v.decode() for v in produce(kafka.bootstrap, name, total, partitions=2,
                                                batch_records=PRODUCER_BATCH)}
        stdout, stderr = java.communicate(timeout=90)
        assert java.returncode == 0, stderr[-4000:]
        java_summary = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
        java_values = [d[3] for d in java_summary["deliveries"]]
        wait_until(lambda: len(set(java_values) | {d.value.decode() for d in python.deliveries}) >= total, 30,
                   "the confluent consumer to take the rest")
        time.sleep(1.0)  # a late redelivery would show up here
    finally:
        if java.poll() is None:
            java.kill()
            java.wait()
        python.finish()

    python_values = [d.value.decode() for d in python.deliveries]
    split = {"java": len(java_values), "confluent": len(python_values)}
    print(f"\njava/confluent split of {total} records: {split}")
    both = collections.Counter(java_values + python_values)
    assert both.keys() == produced
    assert [v for v, n in both.items() if n > 1] == []
    assert all(n > 0 for n in split.values()), split
    assert {d[2] for d in java_summary["deliveries"]} | {d.delivery_count for d in python.deliveries} == {1}
    assert java_summary["ack_errors"] == [] and python.errors == []
