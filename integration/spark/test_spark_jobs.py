"""The Spark jobs against a real broker and proxy (docs/spark.md), run as `share-proxy spark ...`.

Two groups on one proxy (delivery count limit 2): in each a share consumer accepts offsets 0-9, rejects
10-14 and releases 15-19 twice, reaching the limit. The second group has the proxy's own dead-letter
queue on (group config errors.deadletterqueue.topic.name). Five CLI runs (a Spark JVM start costs
seconds): without the proxy's DLQ, the dead-letter export (Parquet and --to-topic) holds exactly 10-19
with their payloads and reasons, run again it adds nothing, and the batch audit counts what the consumer
did; with it, the export still lists exactly the archived records, and the streaming audit
(--stream --available-now, with a checkpoint) counts them dead-lettered too.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import trio
from confluent_kafka import AcknowledgeType, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1.request import AlterableConfig, AlterConfigsResource

from codec.share_events import EventKind
from integration.share.conftest import (
    EXPLICIT,
    acknowledge_all,
    poll_until,
    share_consumer,
    wait_for_assigned_members,
    wire_call,
)
from integration.share.test_event_log import per_offset, read_events

pytest.importorskip("pyspark", reason="the spark extra is not installed")

pytestmark = pytest.mark.integration

SHARE_PROXY = str(Path(sys.executable).with_name("share-proxy"))
RECORDS = 20
ACCEPTED = range(0, 10)
REJECTED = range(10, 15)
AT_LIMIT = range(15, 20)  # released at delivery 1 and 2: archived at the limit
CLI_TIMEOUT_S = 600


@dataclass(frozen=True)
class Scenario:
    bootstrap: str
    topic: str
    group: str
    events_topic: str
    state_topic: str
    dlq_topic: str


@dataclass(frozen=True)
class Proxy:
    bootstrap: str  # the proxy's
    events_topic: str
    state_topic: str


def create_topics(bootstrap: str, *specs: tuple[str, int, dict[str, str]]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
                                   for name, partitions, config in specs])
    for future in futures.values():
        future.result(timeout=30)


def is_kafka_44(kafka) -> bool:
    return tuple(int(x) for x in kafka.version.split(".")[:2]) >= (4, 4)


def set_dead_letter_topic(proxy_bootstrap: str, group: str, dlq_topic: str) -> None:
    """IncrementalAlterConfigs SET errors.deadletterqueue.topic.name on the group, through the proxy (the
    wire request, which reads the same on Kafka 3.9 and 4.4)."""
    request = load_request_schema(44, 1)(
        resources=(AlterConfigsResource(resource_type=32, resource_name=group, configs=(
            AlterableConfig(name="errors.deadletterqueue.topic.name", config_operation=0, value=dlq_topic),)),),
        validate_only=False)
    (result,) = trio.run(wire_call, proxy_bootstrap, request).responses
    assert (result.error_code, result.error_message) == (ErrorCode.none, None)


def produce_payloads(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0,
                         headers=[("source", f"h{i}".encode())])
    assert producer.flush(60) == 0


def act(consumer, messages) -> None:
    def kind(message):
        if message.offset() in ACCEPTED:
            return AcknowledgeType.ACCEPT
        return AcknowledgeType.REJECT if message.offset() in REJECTED else AcknowledgeType.RELEASE

    acknowledge_all(consumer, messages, kind)


@pytest.fixture(scope="module")
def proxy(kafka, module_share_proxy) -> Proxy:
    events_topic = f"__share_group_events_{uuid.uuid4().hex[:8]}"
    running = module_share_proxy("--share-events-topic", events_topic, "--share-events-linger-ms", "100",
                                 "--share-delivery-count-limit", "2")
    return Proxy(running.bootstrap, events_topic, running.state_topic)


def play(kafka, proxy: Proxy, *, proxy_dead_letters: bool) -> Scenario:
    """The consumer's script on a fresh topic and group; returns once every offset's end is in the event log."""
    suffix = uuid.uuid4().hex[:8]
    topic, group, dlq_topic = f"t-spark-{suffix}", f"g-spark-{suffix}", f"dlq.spark-{suffix}"
    # A topic the proxy dead-letters into must say so where the broker knows the config (Kafka 4.4).
    dlq_config = {"errors.deadletterqueue.group.enable": "true"} if proxy_dead_letters and is_kafka_44(kafka) else {}
    create_topics(kafka.bootstrap, (topic, 1, {}), (dlq_topic, 2, dlq_config))
    if proxy_dead_letters:
        set_dead_letter_topic(proxy.bootstrap, group, dlq_topic)
    consumer = share_consumer(proxy.bootstrap, group, topic, EXPLICIT)
    try:
        consumer.poll(0.5)
        wait_for_assigned_members(proxy.bootstrap, group, 1)
        produce_payloads(kafka.bootstrap, topic)
        first = poll_until(consumer, RECORDS)
        assert sorted(m.offset() for m in first) == list(range(RECORDS))
        act(consumer, first)
        second = poll_until(consumer, len(AT_LIMIT))
        assert sorted((m.offset(), m.delivery_count()) for m in second) == [(o, 2) for o in AT_LIMIT]
        act(consumer, second)
    finally:
        consumer.close()

    def settled(batches) -> bool:
        history = per_offset(batches, group)
        return all(any(e.kind in (EventKind.ACCEPTED, EventKind.ARCHIVED) for e in history[o]) for o in range(RECORDS))

    assert settled(read_events(kafka.bootstrap, proxy.events_topic, enough=settled, settle_s=0.5)), "events missing"
    return Scenario(kafka.bootstrap, topic, group, proxy.events_topic, proxy.state_topic, dlq_topic)


@pytest.fixture(scope="module")
def scenario(kafka, proxy) -> Scenario:
    return play(kafka, proxy, proxy_dead_letters=False)


@pytest.fixture(scope="module")
def dead_letter_scenario(kafka, proxy) -> Scenario:
    return play(kafka, proxy, proxy_dead_letters=True)


def spark_cli(*args: str) -> str:
    result = subprocess.run([SHARE_PROXY, "spark", *args, "--master", "local[2]"], capture_output=True, text=True,
                            timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout


def dlq_records(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-reader-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    try:
        records = []
        for partition in range(2):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high > low:
                consumer.assign([TopicPartition(topic, partition, low)])
                while len([r for r in records if r.partition() == partition]) < high - low:
                    records += [m for m in consumer.consume(100, timeout=1) if m.error() is None]
        return records
    finally:
        consumer.close()


def expected_dead_letters(group: str, topic: str) -> list[tuple]:
    return [(group, topic, 0, offset, 1 if offset in REJECTED else 2,
             "rejected" if offset in REJECTED else "delivery_limit", f"k{offset}".encode(), f"v{offset}".encode(),
             [("source", f"h{offset}".encode())]) for offset in [*REJECTED, *AT_LIMIT]]


def exported(output: Path) -> list[tuple]:
    frame = pd.read_parquet(output)
    rows = [(r.group, r.topic, r.partition, r.offset, r.delivery_count, r.reason, r.key, r.value,
             [(h["key"], h["value"]) for h in r.headers]) for r in frame.itertuples()]
    assert frame["archived_at"].notna().all()
    return sorted(rows, key=lambda row: row[3])


def test_dead_letter_export_holds_exactly_the_archived_records_and_a_rerun_adds_nothing(scenario, tmp_path):
    output = tmp_path / "dead-letters"
    args = ("dead-letters", "--bootstrap-server", scenario.bootstrap, "--group", scenario.group,
            "--output", str(output), "--events-topic", scenario.events_topic, "--to-topic", scenario.dlq_topic)
    first = spark_cli(*args)
    assert f"dead letters of group {scenario.group}: 10, new in {output}: 10" in first
    assert f"written to {scenario.dlq_topic}: 10" in first
    assert exported(output) == expected_dead_letters(scenario.group, scenario.topic)

    records = dlq_records(scenario.bootstrap, scenario.dlq_topic)
    by_offset = {int(dict(m.headers())["__dlq.errors.offset"]): m for m in records}
    assert sorted(by_offset) == [*REJECTED, *AT_LIMIT] and len(records) == 10
    for offset, message in by_offset.items():
        assert message.partition() == 0  # source partition 0 mod 2 partitions
        assert (message.key(), message.value()) == (f"k{offset}".encode(), f"v{offset}".encode())
        assert {k: v.decode() for k, v in message.headers()} == {
            "__dlq.errors.topic": scenario.topic, "__dlq.errors.partition": "0",
            "__dlq.errors.offset": str(offset), "__dlq.errors.group": scenario.group,
            "__dlq.errors.delivery.count": "1" if offset in REJECTED else "2",
            "__dlq.errors.message": ("Offset rejected by client." if offset in REJECTED
                                     else "Offset delivery count exceeded the threshold."),
        }

    again = spark_cli(*args)
    assert f"new in {output}: 0" in again and f"written to {scenario.dlq_topic}: 0" in again
    assert exported(output) == expected_dead_letters(scenario.group, scenario.topic)
    assert len(dlq_records(scenario.bootstrap, scenario.dlq_topic)) == 10


def assert_tables_count_what_the_consumer_did(output: Path, scenario: Scenario, *, dead_lettered: bool) -> None:
    summary = pd.read_parquet(output / "summary")
    records = {(r.kind, r.reason): r.records for r in summary.itertuples()}
    expected = {
        ("acquired", "none"): RECORDS + len(AT_LIMIT),
        ("accepted", "none"): len(ACCEPTED),
        ("rejected", "none"): len(REJECTED),
        ("released", "none"): 2 * len(AT_LIMIT),
        ("archived", "rejected"): len(REJECTED),
        ("archived", "delivery_limit"): len(AT_LIMIT),
    }
    if dead_lettered:  # ARCHIVING first, the proxy's dead-letter write, then ARCHIVED
        expected |= {("archiving", "rejected"): len(REJECTED), ("archiving", "delivery_limit"): len(AT_LIMIT),
                     ("dead_lettered", "rejected"): len(REJECTED), ("dead_lettered", "delivery_limit"): len(AT_LIMIT)}
    assert records == expected
    throughput = pd.read_parquet(output / "throughput")
    assert throughput[["acquired", "accepted", "released", "rejected", "archived"]].sum().to_dict() == {
        "acquired": 25, "accepted": 10, "released": 10, "rejected": 5, "archived": 10}
    reasons = pd.read_parquet(output / "dead_letters_by_reason")
    dead_letters = 5 if dead_lettered else 0
    assert {(r.reason, r.archived_records, r.dead_lettered_records) for r in reasons.itertuples()} == {
        ("rejected", 5, dead_letters), ("delivery_limit", 5, dead_letters)}
    counts = pd.read_parquet(output / "delivery_counts")
    assert {(r.delivery_count, r.accepted, r.archived) for r in counts.itertuples()} == {(1, 10, 5), (2, 0, 5)}
    redelivery = pd.read_parquet(output / "redelivery")
    assert [(r.delivered, r.redelivered) for r in redelivery.itertuples()] == [(25, 5)]
    latency = pd.read_parquet(output / "ack_latency_summary")
    assert list(latency["records"]) == [len(ACCEPTED)]
    assert pd.read_parquet(output / "ack_latency")["records"].sum() == len(ACCEPTED)
    spso = pd.read_parquet(output / "spso")
    assert spso["spso"].max() == RECORDS and spso["topic"].eq(scenario.topic).all()
    assert "<svg" in (output / "report.html").read_text()


def test_audit_tables_count_what_the_consumer_did(scenario, tmp_path):
    output = tmp_path / "audit"
    spark_cli("audit", "--bootstrap-server", scenario.bootstrap, "--group", scenario.group, "--output", str(output),
              "--events-topic", scenario.events_topic, "--state-topic", scenario.state_topic)
    assert_tables_count_what_the_consumer_did(output, scenario, dead_lettered=False)


def test_with_the_proxys_dead_letter_queue_the_export_still_lists_exactly_the_archived_records(
        dead_letter_scenario, tmp_path):
    scenario = dead_letter_scenario
    output = tmp_path / "dead-letters"
    printed = spark_cli("dead-letters", "--bootstrap-server", scenario.bootstrap, "--group", scenario.group,
                        "--output", str(output), "--events-topic", scenario.events_topic)
    assert f"dead letters of group {scenario.group}: 10, new in {output}: 10" in printed
    assert exported(output) == expected_dead_letters(scenario.group, scenario.topic)
    # The proxy wrote the same records to the group's DLQ topic (the export only read it, never wrote).
    assert len(dlq_records(scenario.bootstrap, scenario.dlq_topic)) == 10


def test_streaming_audit_runs_to_the_end_of_the_log_and_counts_the_proxys_dead_letters(
        dead_letter_scenario, tmp_path):
    scenario = dead_letter_scenario
    output, checkpoint = tmp_path / "audit", tmp_path / "checkpoint"
    printed = spark_cli("audit", "--bootstrap-server", scenario.bootstrap, "--group", scenario.group,
                        "--output", str(output), "--events-topic", scenario.events_topic,
                        "--state-topic", scenario.state_topic, "--stream", "--checkpoint", str(checkpoint),
                        "--available-now")
    assert "summary:" in printed
    assert_tables_count_what_the_consumer_did(output, scenario, dead_lettered=True)
    assert list((output / "events").glob("batch=*"))  # the micro-batches' decoded events
    assert list((checkpoint / "commits").iterdir())  # the checkpoint recorded a finished batch
