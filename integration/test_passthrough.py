"""Ordinary Kafka traffic through the proxy, against a real broker, with real clients.

Given a broker (fixture `kafka`) and the proxy in front of it (fixture `proxy`), stock
clients pointed at the proxy produce, consume, administer and read metadata exactly as
they would against the broker, and never learn the broker's own address.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic

from integration.java.build import run_driver
from integration.kafka_fixtures import (
    ProxyProcess,
    admin_client,
    create_topic,
    unique_name,
    wait_for_leaders,
)
from proxy.localkafka import LocalKafka
from proxy.localkafka.config import supports_share_groups

MESSAGES = 10_000
PARTITIONS = 3


def produce_numbered(bootstrap: str, topic: str, count: int, compression: str) -> int:
    """Produce records key-i / value-i (padded, so compression has work) with headers; errors seen."""
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            errors.append(error)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    for index in range(count):
        producer.produce(
            topic,
            key=f"key-{index}".encode(),
            value=f"value-{index}-".encode() + b"x" * (index % 200),
            headers=[("index", str(index).encode()), ("codec", compression.encode())],
            on_delivery=on_delivery,
        )
        if index % 1000 == 999:
            producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} records still queued after flush"
    return len(errors)


def consume_numbered(bootstrap: str, topic: str, group: str, count: int, timeout: float = 60.0) -> dict[int, tuple]:
    """Consume with a consumer group until `count` distinct indexes arrived; commit; index -> record."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    received: dict[int, tuple] = {}
    last_offset: dict[int, int] = {}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(received) < count and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                assert message.error() is None, message.error()
                headers = dict(message.headers() or [])
                index = int(headers["index"])
                assert message.offset() > last_offset.get(message.partition(), -1), "offsets go backwards"
                last_offset[message.partition()] = message.offset()
                received[index] = (message.key(), message.value(), headers, message.partition())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return received


@pytest.mark.parametrize("compression", ["lz4", "zstd", "gzip"])
def test_confluent_round_trip_through_proxy_keeps_keys_headers_and_compression(
    kafka: LocalKafka, proxy: ProxyProcess, compression: str
) -> None:
    topic = create_topic(kafka.bootstrap, unique_name(f"roundtrip-{compression}"), partitions=PARTITIONS)
    group = unique_name(f"group-{compression}")

    assert produce_numbered(proxy.bootstrap, topic, MESSAGES, compression) == 0
    received = consume_numbered(proxy.bootstrap, topic, group, MESSAGES)

    assert sorted(received) == list(range(MESSAGES))
    for index, (key, value, headers, _partition) in received.items():
        assert key == f"key-{index}".encode()
        assert value == f"value-{index}-".encode() + b"x" * (index % 200)
        assert headers == {"index": str(index).encode(), "codec": compression.encode()}
    assert len({partition for *_, partition in received.values()}) == PARTITIONS

    # The broker itself holds exactly those records, and the group's commit reached it.
    direct = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        high_watermarks = [direct.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions]
        committed = direct.committed(partitions, timeout=10)
    finally:
        direct.close()
    assert sum(high_watermarks) == MESSAGES
    assert [tp.offset for tp in committed] == high_watermarks


def test_admin_creates_and_describes_a_topic_through_proxy(kafka: LocalKafka, proxy: ProxyProcess) -> None:
    admin = admin_client(proxy.bootstrap)
    topic = unique_name("admin")

    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=4, replication_factor=1, config={"retention.ms": "3600000"})],
        operation_timeout=30,
    )
    futures[topic].result(timeout=30)
    wait_for_leaders(admin, [topic], 4)

    description = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    assert description.name == topic
    assert len(description.partitions) == 4
    for partition in description.partitions:
        assert (partition.leader.host, partition.leader.port) != ("127.0.0.1", kafka.port)
        assert partition.leader.port not in (kafka.port, kafka.controller_port)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["retention.ms"].value == "3600000"

    # The topic really exists on the broker.
    direct_topics = admin_client(kafka.bootstrap).list_topics(timeout=10).topics
    assert len(direct_topics[topic].partitions) == 4


def test_metadata_names_only_proxy_endpoints(kafka: LocalKafka, proxy: ProxyProcess, topic: str) -> None:
    upstream_ports = {kafka.port, kafka.controller_port}
    admin = admin_client(proxy.bootstrap)

    metadata = admin.list_topics(timeout=10)
    brokers = {broker.id: (broker.host, broker.port) for broker in metadata.brokers.values()}
    assert set(brokers) == {kafka.broker_id}
    for host, port in brokers.values():
        assert host == proxy.host
        assert port not in upstream_ports
    assert metadata.topics[topic].partitions[0].leader in brokers

    cluster = admin.describe_cluster().result(timeout=10)
    endpoints = {(node.host, node.port) for node in cluster.nodes}
    assert endpoints == set(brokers.values())
    assert (cluster.controller.host, cluster.controller.port) in endpoints

    # FindCoordinator (used by every consumer group) must also point at the proxy.
    group = unique_name("coordinator")
    assert produce_numbered(proxy.bootstrap, topic, 1, "none") == 0
    assert list(consume_numbered(proxy.bootstrap, topic, group, count=1)) == [0]
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    assert (described.coordinator.host, described.coordinator.port) in endpoints


@pytest.fixture
def group_protocol(request: pytest.FixtureRequest, kafka: LocalKafka) -> Iterator[str]:
    protocol = request.param
    if protocol == "consumer" and not supports_share_groups(kafka.version):
        # KIP-848's consumer protocol is generally available from Kafka 4.0.
        pytest.skip(f"the consumer group protocol needs Kafka 4.x, the broker is {kafka.version}")
    yield protocol


@pytest.mark.java
@pytest.mark.parametrize("group_protocol", ["classic", "consumer"], indirect=True)
def test_java_client_produces_and_consumes_through_proxy(
    kafka: LocalKafka, proxy: ProxyProcess, group_protocol: str
) -> None:
    topic = create_topic(kafka.bootstrap, unique_name(f"java-{group_protocol}"), partitions=PARTITIONS)
    count = 5_000

    summary = run_driver(
        "produce-consume",
        bootstrap=proxy.bootstrap,
        topic=topic,
        count=count,
        compression="zstd",
        group=unique_name("java-group"),
        group_protocol=group_protocol,
    )

    assert summary["produced"] == count and summary["produce_errors"] == 0, summary
    consumed = summary["consume"]
    assert consumed["unique"] == count, summary
    assert (consumed["missing"], consumed["bad_records"], consumed["order_violations"]) == (0, 0, 0), summary
    assert consumed["committed"] is True


@pytest.mark.java
def test_java_client_sees_only_proxy_endpoints(kafka: LocalKafka, proxy: ProxyProcess) -> None:
    summary = run_driver("describe-cluster", bootstrap=proxy.bootstrap)

    assert summary["nodes"], summary
    for node in summary["nodes"] + [summary["controller"]]:
        host, port = node.split("@")[-1].rsplit(":", 1)
        assert host == proxy.host
        assert int(port) not in (kafka.port, kafka.controller_port)


def test_serve_prints_ready_and_exits_zero_on_sigterm(kafka: LocalKafka, tmp_path) -> None:
    running = ProxyProcess(upstream=kafka.bootstrap, log_path=tmp_path / "serve.log").start()
    try:
        metadata = admin_client(running.bootstrap).list_topics(timeout=10)
        assert metadata.brokers
    finally:
        exit_code = running.stop()
    assert exit_code == 0, running.log_text()[-3000:]



def read_keyed(bootstrap: str, topic: str, count: int) -> dict[int, bytes]:
    """Every partition of `topic` read from offset 0 at `bootstrap`: key (an int) -> value, until
    `count` records or 60 s; a key read twice fails."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("read-keyed"),
                         "enable.auto.commit": False})
    received: dict[int, bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while len(received) < count and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                assert message.error() is None, message.error()
                assert int(message.key()) not in received, "a record read twice"
                received[int(message.key())] = message.value()
    finally:
        consumer.close()
    return received


def test_large_fetch_responses_are_spliced_through_and_arrive_intact(kafka: LocalKafka, tmp_path) -> None:
    """Default settings, plaintext: Fetch responses of 128 KiB or more pass socket to socket
    inside the kernel (splice) -- and every byte of every record arrives as the broker has it."""
    from integration.share.conftest import metric, scrape_metrics
    from proxy.localkafka.broker import free_port

    topic = create_topic(kafka.bootstrap, unique_name("spliced"), partitions=PARTITIONS)
    count, size = 8_000, 2048
    values = {index: hashlib.sha256(str(index).encode()).digest() * (size // 32) for index in range(count)}
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    for index, value in values.items():
        producer.produce(topic, key=str(index).encode(), value=value)
        if index % 1000 == 999:
            producer.poll(0)
    assert producer.flush(60) == 0
    port = free_port()
    with ProxyProcess(upstream=kafka.bootstrap, log_path=tmp_path / "serve.log",
                      extra_args=("--metrics-port", str(port))) as proxy:
        before = metric(scrape_metrics(port), "ksp_responses_spliced_total") or 0.0
        received = read_keyed(proxy.bootstrap, topic, count)
        spliced = (metric(scrape_metrics(port), "ksp_responses_spliced_total") or 0.0) - before
    assert received == values
    # 16 MB in Fetch responses of up to 1 MiB per partition (the client's default): many spliced.
    assert spliced >= 5, spliced


def test_large_produce_requests_are_spliced_upstream_and_land_intact(kafka: LocalKafka, tmp_path) -> None:
    """Default settings, plaintext: a Produce of 128 KiB or more goes upstream as it arrives, its
    records socket to socket inside the kernel (splice) -- and the broker stores every byte the
    client sent (read back from the broker directly, not through the proxy)."""
    from integration.share.conftest import metric, scrape_metrics
    from proxy.localkafka.broker import free_port

    topic = create_topic(kafka.bootstrap, unique_name("spliced-produce"), partitions=PARTITIONS)
    count, size = 8_000, 2048
    values = {index: hashlib.sha256(b"p%d" % index).digest() * (size // 32) for index in range(count)}
    port = free_port()
    with ProxyProcess(upstream=kafka.bootstrap, log_path=tmp_path / "serve.log",
                      extra_args=("--metrics-port", str(port))) as proxy:
        before = metric(scrape_metrics(port), "ksp_requests_streamed_total") or 0.0
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                             "acks": "all"})
        failed: list[KafkaError] = []
        for index, value in values.items():
            producer.produce(topic, key=str(index).encode(), value=value,
                             on_delivery=lambda error, _: failed.append(error) if error else None)
            if index % 1000 == 999:
                producer.poll(0)
        assert producer.flush(60) == 0
        streamed = (metric(scrape_metrics(port), "ksp_requests_streamed_total") or 0.0) - before
    assert failed == []
    assert read_keyed(kafka.bootstrap, topic, count) == values
    # 16 MB produced in requests of up to 1 MiB per partition (batch.size): several streamed.
    assert streamed >= 3, streamed
