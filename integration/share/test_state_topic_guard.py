"""The state topic belongs to the proxy: clients going through it cannot write, delete or reconfigure it.

Every request is a stock confluent-kafka client's, sent to the proxy; what the broker then holds
is checked directly at the broker. Other topics in the same requests are served normally.
"""

from __future__ import annotations

import datetime
import typing

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)

from kio.index import load_request_schema
from kio.static.primitive import Records, i16, i32

from codec.records import encode_batch
from integration.share.conftest import produce, wait_until, wire_call

pytestmark = pytest.mark.integration

AUTH_FAILED = KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.fixture(scope="module")
def proxy(module_share_proxy):
    return module_share_proxy()


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (low, high), read at `bootstrap`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "guard-watermarks"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
    finally:
        consumer.close()


def error_code(future) -> int | None:
    try:
        future.result(timeout=30)
    except KafkaException as exc:
        return exc.args[0].code()
    return None


def test_produce_to_the_state_topic_is_refused_and_other_topics_in_the_same_batch_land(
    kafka, proxy, create_topic, names
):
    other = create_topic(names.topic)
    state_before = watermarks(kafka.bootstrap, proxy.state_topic)
    # One producer, both topics in flight together: librdkafka puts them in one Produce request.
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 200})
    outcomes: dict[str, list[int | None]] = {}

    def record(err, message) -> None:
        outcomes.setdefault(message.topic(), []).append(None if err is None else err.code())

    for i in range(3):
        producer.produce(proxy.state_topic, key=b"forged", value=b"state %d" % i, partition=i % 3, on_delivery=record)
        producer.produce(other, value=b"ordinary %d" % i, on_delivery=record)
    assert producer.flush(30) == 0

    assert outcomes == {proxy.state_topic: [AUTH_FAILED] * 3, other: [None] * 3}
    assert watermarks(kafka.bootstrap, proxy.state_topic) == state_before
    assert watermarks(kafka.bootstrap, other) == {0: (0, 3)}


def test_large_produce_requests_pass_for_other_topics_and_are_refused_for_the_state_topic(
    kafka, proxy, create_topic, names
):
    """Requests far above the 128 KiB from which the proxy passes a Produce on as it arrives: one
    to another topic is spliced upstream and lands whole; one to the state topic is gathered, its
    topic read, and refused -- nothing of it reaches the broker."""
    other = create_topic(names.topic)
    state_before = watermarks(kafka.bootstrap, proxy.state_topic)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 100, "batch.size": 1 << 20})
    outcomes: dict[str, list[int | None]] = {}

    def record(err, message) -> None:
        outcomes.setdefault(message.topic(), []).append(None if err is None else err.code())

    values = [bytes([i % 256]) * 2048 for i in range(300)]  # ~600 KB per topic
    for value in values:
        producer.produce(other, value=value, on_delivery=record)
    assert producer.flush(30) == 0
    for value in values:
        producer.produce(proxy.state_topic, key=b"forged", value=value, partition=0, on_delivery=record)
    assert producer.flush(30) == 0

    assert outcomes == {other: [None] * len(values), proxy.state_topic: [AUTH_FAILED] * len(values)}
    assert watermarks(kafka.bootstrap, proxy.state_topic) == state_before
    assert watermarks(kafka.bootstrap, other) == {0: (0, len(values))}
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": names.group})
    try:
        consumer.assign([TopicPartition(other, 0, 0)])
        landed: list[bytes] = []
        wait_until(lambda: landed.extend(m.value() for m in consumer.consume(300, timeout=0.5)) or
                   len(landed) >= len(values), 30, "the records read back")
    finally:
        consumer.close()
    assert landed == values


def raw_produce(bootstrap: str, version: int, topics: list[tuple[str, int, list[bytes]]]):
    """One Produce request (acks=all) naming several topics, as the Java producer sends them
    (librdkafka sends one partition per request); returns {(topic, partition): (error, base offset)}."""

    cls = load_request_schema(0, version)
    data_cls = typing.get_args(typing.get_type_hints(cls)["topic_data"])[0]
    part_cls = typing.get_args(typing.get_type_hints(data_cls)["partition_data"])[0]
    request = cls(transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=30), topic_data=tuple(
        data_cls(name=name, partition_data=(part_cls(index=i32(partition), records=Records(encode_batch(0, values))),))
        for name, partition, values in topics))
    response = trio.run(wire_call, bootstrap, request)
    return {(t.name, int(p.index)): (p.error_code.value, int(p.base_offset))
            for t in response.responses for p in t.partition_responses}


@pytest.mark.parametrize("version", [3, 7, 9])
def test_one_produce_request_naming_both_is_split(kafka, proxy, create_topic, names, version):
    other = create_topic(names.topic, partitions=2)
    state_before = watermarks(kafka.bootstrap, proxy.state_topic)
    answer = raw_produce(proxy.bootstrap, version, [(other, 0, [b"a", b"b"]), (proxy.state_topic, 1, [b"forged"]),
                                                    (other, 1, [b"c"])])
    assert answer == {(other, 0): (0, 0), (proxy.state_topic, 1): (AUTH_FAILED, -1), (other, 1): (0, 0)}
    assert watermarks(kafka.bootstrap, other) == {0: (0, 2), 1: (0, 1)}
    assert watermarks(kafka.bootstrap, proxy.state_topic) == state_before


def test_produce_with_acks_0_to_the_state_topic_writes_nothing(kafka, proxy, create_topic, names):
    other = create_topic(names.topic)
    state_before = watermarks(kafka.bootstrap, proxy.state_topic)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": 0, "linger.ms": 0})
    producer.produce(proxy.state_topic, key=b"forged", value=b"acks=0", partition=0)
    assert producer.flush(30) == 0  # acks=0: reported delivered once sent
    # The proxy closed that connection (as Kafka does for a failed acks=0 Produce); the producer
    # reconnects and its next records to an ordinary topic land.
    producer.produce(other, value=b"after")
    assert producer.flush(30) == 0
    wait_until(lambda: watermarks(kafka.bootstrap, other) == {0: (0, 1)}, 30, "the record after the refusal")
    assert watermarks(kafka.bootstrap, proxy.state_topic) == state_before
    wait_until(lambda: "request refused without a response" in proxy.log_tail(lines=400), 10,
               "the proxy closing the acks=0 producer's connection")


def test_delete_records_of_the_state_topic_is_refused_other_topics_are_trimmed(kafka, proxy, create_topic, names):
    other = create_topic(names.topic)
    produce(kafka.bootstrap, other, 5)
    state_before = watermarks(kafka.bootstrap, proxy.state_topic)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    # One DeleteRecords request (a single broker leads everything) naming both topics.
    futures = admin.delete_records([TopicPartition(proxy.state_topic, 0, -1), TopicPartition(proxy.state_topic, 1, -1),
                                    TopicPartition(other, 0, 3)])
    codes = {(tp.topic, tp.partition): error_code(future) for tp, future in futures.items()}
    assert codes == {(proxy.state_topic, 0): AUTH_FAILED, (proxy.state_topic, 1): AUTH_FAILED, (other, 0): None}
    assert watermarks(kafka.bootstrap, proxy.state_topic) == state_before
    assert watermarks(kafka.bootstrap, other) == {0: (3, 5)}


def test_delete_topics_of_the_state_topic_is_refused(kafka, proxy, create_topic, names):
    other = create_topic(names.topic)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    futures = admin.delete_topics([proxy.state_topic, other], operation_timeout=30)
    assert {topic: error_code(future) for topic, future in futures.items()} == {proxy.state_topic: AUTH_FAILED,
                                                                               other: None}
    broker_topics = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics
    assert proxy.state_topic in broker_topics
    wait_until(lambda: other not in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics,
               30, f"{other} deleted")


def test_create_partitions_of_the_state_topic_is_refused(kafka, proxy, create_topic, names):
    other = create_topic(names.topic)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    partitions_before = len(watermarks(kafka.bootstrap, proxy.state_topic))
    futures = admin.create_partitions([NewPartitions(proxy.state_topic, partitions_before + 3), NewPartitions(other, 2)])
    assert {topic: error_code(future) for topic, future in futures.items()} == {proxy.state_topic: AUTH_FAILED,
                                                                               other: None}
    assert len(watermarks(kafka.bootstrap, proxy.state_topic)) == partitions_before
    wait_until(lambda: len(watermarks(kafka.bootstrap, other)) == 2, 30, f"{other} with 2 partitions")


def topic_config(bootstrap: str, topic: str, name: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    return admin.describe_configs([resource])[resource].result(30)[name].value


def test_incremental_alter_configs_of_the_state_topic_is_refused(kafka, proxy, create_topic, names):
    other = create_topic(names.topic)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    change = [ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)]
    resources = [ConfigResource(ConfigResource.Type.TOPIC, proxy.state_topic, incremental_configs=change),
                 ConfigResource(ConfigResource.Type.TOPIC, other, incremental_configs=change)]
    futures = admin.incremental_alter_configs(resources)
    assert {r.name: error_code(f) for r, f in futures.items()} == {proxy.state_topic: AUTH_FAILED, other: None}
    assert topic_config(kafka.bootstrap, proxy.state_topic, "cleanup.policy") == "compact"
    assert topic_config(kafka.bootstrap, other, "cleanup.policy") == "delete"


def test_alter_configs_of_the_state_topic_is_refused(kafka, proxy):
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, proxy.state_topic, set_config={"cleanup.policy": "delete"})
    with pytest.warns(DeprecationWarning, match="alter_configs"):  # the legacy API is what is tested
        future = admin.alter_configs([resource])[resource]
    assert error_code(future) == AUTH_FAILED
    assert topic_config(kafka.bootstrap, proxy.state_topic, "cleanup.policy") == "compact"


def test_clients_can_still_read_the_state_topic(kafka, proxy):
    # Reads pass: metadata and watermarks of the state topic come back through the proxy.
    assert watermarks(proxy.bootstrap, proxy.state_topic) == watermarks(kafka.bootstrap, proxy.state_topic)
