"""A share consumer whose partitions are led by two brokers, through the proxy.

The cluster: node 1 (combined controller + broker) and node 2 (broker only, joining node 1's
controller); a four-partition topic has leaders on both. A share consumer keeps one share
session per node it fetches from (Kafka: one ShareSessionCache per broker), so through the
proxy it opens two sessions, one on each broker listener. Each must live on its own: before
sessions were per node, the second node's epoch-0 ShareFetch replaced the first node's session
(SHARE_SESSION_NOT_FOUND / INVALID_SHARE_SESSION_EPOCH on its next request) and released the
member's records in the whole group, so records came back and were delivered again.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType
from confluent_kafka.admin import AdminClient, NewTopic

from integration.kafka_fixtures import kafka_version
from integration.share.conftest import (
    EXPLICIT,
    Names,
    ProxyStarter,
    metric,
    produce,
    scrape_metrics,
    share_consumer,
)
from proxy.localkafka import LocalKafka, free_port

pytestmark = pytest.mark.integration

PARTITIONS = 4
RECORDS = 400
SESSION_ERRORS = ("SHARE_SESSION_NOT_FOUND", "INVALID_SHARE_SESSION_EPOCH", "SHARE_SESSION_LIMIT_REACHED")


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalKafka, LocalKafka]]:
    version = kafka_version()
    with LocalKafka(version=version, data_dir=tmp_path_factory.mktemp("kafka-node1")) as one:
        with LocalKafka(version=version, data_dir=tmp_path_factory.mktemp("kafka-node2"), node_id=2,
                        join=one) as two:
            yield one, two


@pytest.fixture
def proxies(two_brokers, tmp_path: Path) -> Iterator[ProxyStarter]:
    starter = ProxyStarter(two_brokers[0].bootstrap, tmp_path)
    yield starter
    starter.stop_all()


def create_topic_on_both(bootstrap: str, name: str) -> dict[int, int]:
    """Create `name` with PARTITIONS single-replica partitions; returns partition -> leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == PARTITIONS \
                and all(p.leader >= 0 for p in topic.partitions.values()):
            return {p: info.leader for p, info in topic.partitions.items()}
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} has no leaders yet")


def test_a_share_consumer_on_partitions_of_two_brokers_gets_every_record_exactly_once(
        two_brokers, proxies: ProxyStarter, names: Names) -> None:
    one, _ = two_brokers
    leaders = create_topic_on_both(one.bootstrap, names.topic)
    assert set(leaders.values()) == {1, 2}, f"both brokers lead partitions: {leaders}"
    port = free_port()
    proxy = proxies("--metrics-port", str(port))
    values = produce(one.bootstrap, names.topic, RECORDS, partitions=PARTITIONS, batch_records=20)

    consumer = share_consumer(proxy.bootstrap, names.group, names.topic, EXPLICIT)
    accepted: collections.Counter[bytes] = collections.Counter()
    deliveries: collections.Counter[int] = collections.Counter()
    by_partition: collections.Counter[int] = collections.Counter()
    sessions_seen = 0  # the most share sessions the proxy held at once
    try:
        deadline = time.monotonic() + 60
        while len(accepted) < RECORDS and time.monotonic() < deadline:
            messages = consumer.poll(0.5)
            for message in messages:
                assert message.error() is None, message.error()
                accepted[message.value()] += 1
                deliveries[message.delivery_count()] += 1
                by_partition[message.partition()] += 1
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
            if messages:
                results = consumer.commit_sync(30)
                failed = {tp: error for tp, error in results.items() if error is not None}
                assert not failed, f"acknowledgement failed: {failed}"
            sessions_seen = max(sessions_seen, metric(scrape_metrics(port), "ksp_share_sessions") or 0)
        # A while longer: nothing may come back (a released record would be delivered again).
        quiet_until = time.monotonic() + 5
        while time.monotonic() < quiet_until:
            for message in consumer.poll(0.5):
                accepted[message.value()] += 1
                deliveries[message.delivery_count()] += 1
    finally:
        consumer.close()

    assert set(accepted) == set(values), f"missing: {len(set(values) - set(accepted))} of {RECORDS}"
    assert [value for value, count in accepted.items() if count > 1] == []
    assert deliveries == {1: RECORDS}
    assert set(by_partition) == set(range(PARTITIONS))  # fetched from both brokers' partitions
    samples = scrape_metrics(port)
    errors = {(labels, value) for (name, labels), value in samples.items()
              if name == "ksp_response_errors_total" and dict(labels).get("error") in SESSION_ERRORS and value}
    assert errors == set(), f"share-session errors answered: {errors}"
    assert metric(samples, "ksp_requests_total", api="ShareFetch"), "the consumer fetched through the proxy"
    log = proxy.log_tail(lines=100_000)
    assert not [name for name in SESSION_ERRORS if name in log], "session errors in the proxy log"
    assert sessions_seen == 2, "one member, one share session on each broker's listener"
