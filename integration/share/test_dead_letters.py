"""KIP-1191 dead-letter queues through the proxy, on a real broker (docs/dead-letters.md).

Share consumers (confluent_kafka's ShareConsumer and Kafka's Java KafkaShareConsumer) reject a known
set of records and release others until they reach a delivery count limit of 2; the group's DLQ
topic must then hold exactly those records, with Kafka's six headers, in partition = source
partition mod DLQ partitions, and with the original key and value when copy is on. Kafka's topic
checks archive regardless (counted); a proxy killed with SIGKILL between ARCHIVING and the DLQ
write (the DLQ topic's broker down, on this module's own two-broker cluster) loses none of them.

Kafka 3.9 has no topic config ``errors.deadletterqueue.group.enable``: there the documented
behaviour is asserted instead (the check is skipped, auto-created topics do not carry it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from confluent_kafka import AcknowledgeType, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1.request import AlterableConfig, AlterConfigsResource

from integration.kafka_fixtures import kafka_version
from integration.share.conftest import (
    EXPLICIT,
    ProxyStarter,
    durable_state,
    metric,
    scrape_metrics,
    share_consumer,
    wait_until,
    wire_call,
)
from proxy.localkafka import LocalKafka, free_port
from proxy.share.states import RecordState

pytestmark = pytest.mark.integration

SOURCE_PARTITIONS = 3
DLQ_PARTITIONS = 2
RECORDS_PER_PARTITION = 10
LIMIT = 2
REJECTED_MESSAGE = "Offset rejected by client."
LIMIT_MESSAGE = "Offset delivery count exceeded the threshold."
# (partition, offset): rejected on first delivery / released on every delivery until the limit.
REJECT = {(0, 1), (0, 2), (1, 5), (2, 9)}
RELEASE_ALWAYS = {(0, 7), (1, 0), (2, 3)}


def is_kafka_44(kafka) -> bool:
    return tuple(int(x) for x in kafka.version.split(".")[:2]) >= (4, 4)


def key_of(partition: int, offset: int) -> bytes:
    return f"k-{partition}-{offset}".encode()


def value_of(partition: int, offset: int) -> bytes:
    return f"v-{partition}-{offset}".encode()


def produce_keyed(bootstrap: str, topic: str, partitions: int = SOURCE_PARTITIONS,
                  per_partition: int = RECORDS_PER_PARTITION) -> None:
    """Offsets 0..per_partition-1 in each partition, key k-P-O and value v-P-O (checked in the copies)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for partition in range(partitions):
        for offset in range(per_partition):
            producer.produce(topic, key=key_of(partition, offset), value=value_of(partition, offset),
                             partition=partition)
    assert producer.flush(30) == 0


def alter_group(bootstrap: str, group: str, configs: dict[str, str]) -> tuple[ErrorCode, str | None]:
    """IncrementalAlterConfigs SET on the GROUP resource through the proxy (the wire request Kafka's
    admin tools send; kio, so it reads the same on 3.9 and 4.4); returns (error code, message)."""
    request = load_request_schema(44, 1)(
        resources=(AlterConfigsResource(resource_type=32, resource_name=group, configs=tuple(
            AlterableConfig(name=k, config_operation=0, value=v) for k, v in configs.items())),),
        validate_only=False)
    (result,) = trio.run(wire_call, bootstrap, request).responses
    return result.error_code, result.error_message


def dlq_group(bootstrap: str, group: str, dlq_topic: str, *, copy: bool) -> None:
    assert alter_group(bootstrap, group, {"share.delivery.count.limit": str(LIMIT), "share.auto.offset.reset": "earliest",
                                   "errors.deadletterqueue.topic.name": dlq_topic,
                                   "errors.deadletterqueue.copy.record.enable": str(copy).lower()}) == (
        ErrorCode.none, None)


def create_dlq_topic(create_topic, kafka, name: str, partitions: int = DLQ_PARTITIONS,
                     config: dict[str, str] | None = None) -> str:
    """A DLQ topic, marked errors.deadletterqueue.group.enable=true where the broker knows the config."""
    marked = {"errors.deadletterqueue.group.enable": "true"} if is_kafka_44(kafka) else {}
    return create_topic(name, partitions=partitions, config={**marked, **(config or {})})


def consume_rejecting(bootstrap: str, group: str, topic: str, reject: set, release_always: set,
                      total: int, timeout: float = 60.0) -> dict[tuple[int, int], list[int]]:
    """confluent_kafka ShareConsumer, explicit mode: reject `reject`, release `release_always` every
    time (until the limit archives them), accept the rest; until every record is finished.
    Returns (partition, offset) -> delivery counts seen."""
    consumer = share_consumer(bootstrap, group, topic, EXPLICIT)
    seen: dict[tuple[int, int], list[int]] = {}
    finished: set[tuple[int, int]] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(finished) < total:
            assert time.monotonic() < deadline, f"finished {len(finished)} of {total}: {sorted(seen.items())}"
            messages = consumer.poll(0.5)
            for message in messages:
                assert message.error() is None, message.error()
                record = (message.partition(), message.offset())
                count = message.delivery_count()
                seen.setdefault(record, []).append(count)
                if record in reject:
                    consumer.acknowledge(message, AcknowledgeType.REJECT)
                    finished.add(record)
                elif record in release_always:
                    consumer.acknowledge(message, AcknowledgeType.RELEASE)
                    if count >= LIMIT:
                        finished.add(record)
                else:
                    consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                    finished.add(record)
            if messages:
                failed = {tp: e for tp, e in consumer.commit_sync(30).items() if e is not None}
                assert not failed, failed
    finally:
        consumer.close()
    return seen


def read_topic(bootstrap: str, topic: str, partitions: int) -> list:
    """Every record of `topic` now (from the beginning to the end offsets), as confluent Messages."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        ends = {}
        for partition in range(partitions):
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got, deadline = [], time.monotonic() + 30
        positions = {p: 0 for p in range(partitions)}
        while any(positions[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"read {len(got)} of {sum(ends.values())}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
            positions[message.partition()] = message.offset() + 1
        return got
    finally:
        consumer.close()


def dead_letter_rows(messages) -> set[tuple]:
    """(DLQ partition, key, value, headers as a dict-tuple) of each dead letter."""
    rows = set()
    for message in messages:
        headers = tuple(sorted((k, v.decode()) for k, v in (message.headers() or [])))
        rows.add((message.partition(), message.key(), message.value(), headers))
    return rows


def expected_rows(topic: str, group: str, *, copy: bool, reject=REJECT, release_always=RELEASE_ALWAYS) -> set:
    rows = set()
    for records, count, message in ((reject, 1, REJECTED_MESSAGE), (release_always, LIMIT, LIMIT_MESSAGE)):
        for partition, offset in records:
            headers = tuple(sorted({
                "__dlq.errors.topic": topic, "__dlq.errors.partition": str(partition),
                "__dlq.errors.offset": str(offset), "__dlq.errors.group": group,
                "__dlq.errors.delivery.count": str(count), "__dlq.errors.message": message,
            }.items()))
            rows.add((partition % DLQ_PARTITIONS, key_of(partition, offset) if copy else None,
                      value_of(partition, offset) if copy else None, headers))
    return rows


def wait_for_dead_letters(bootstrap: str, dlq_topic: str, count: int, timeout: float = 60.0) -> list:
    messages: list = []

    def enough() -> bool:
        nonlocal messages
        messages = read_topic(bootstrap, dlq_topic, DLQ_PARTITIONS)
        return len(messages) >= count

    wait_until(enough, timeout, lambda: f"{count} dead letters in {dlq_topic}, have {len(messages)}", interval=0.5)
    time.sleep(1.0)  # nothing more may follow
    return read_topic(bootstrap, dlq_topic, DLQ_PARTITIONS)


def all_finished(bootstrap: str, state_topic: str, group: str) -> bool:
    """Every source partition's durable SPSO at its end with nothing in flight (ARCHIVING passed)."""
    state = durable_state(bootstrap, state_topic, group)
    return all(p in state and state[p].start_offset == RECORDS_PER_PARTITION and not state[p].state_batches
               for p in range(SOURCE_PARTITIONS))


@pytest.fixture
def source(kafka, create_topic, names) -> str:
    topic = create_topic(names.topic, partitions=SOURCE_PARTITIONS)
    produce_keyed(kafka.bootstrap, topic)
    return topic


# ----- the records reach the DLQ with Kafka's headers ---------------------------------------------


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "headers-only"])
def test_rejected_and_delivery_limit_records_are_dead_lettered_exactly(kafka, share_proxy, create_topic, source,
                                                                       names, copy):
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    dlq = create_dlq_topic(create_topic, kafka, f"dlq.{names.topic}")
    dlq_group(proxy.bootstrap, names.group, dlq, copy=copy)
    seen = consume_rejecting(proxy.bootstrap, names.group, source, REJECT, RELEASE_ALWAYS,
                             SOURCE_PARTITIONS * RECORDS_PER_PARTITION)
    assert {r: seen[r] for r in RELEASE_ALWAYS} == {r: [1, 2] for r in RELEASE_ALWAYS}
    letters = wait_for_dead_letters(kafka.bootstrap, dlq, len(REJECT) + len(RELEASE_ALWAYS))
    assert len(letters) == len(REJECT) + len(RELEASE_ALWAYS)
    assert dead_letter_rows(letters) == expected_rows(source, names.group, copy=copy)
    assert all(m.timestamp()[0] == 1 for m in letters)  # CreateTime, stamped by the writer
    wait_until(lambda: all_finished(kafka.bootstrap, proxy.state_topic, names.group), 30,
               "SPSO past the dead-lettered records")
    samples = scrape_metrics(port)
    assert metric(samples, "ksp_share_dead_letter_records_total", group=names.group, reason="rejected") == len(REJECT)
    assert metric(samples, "ksp_share_dead_letter_records_total", group=names.group,
                  reason="delivery_limit") == len(RELEASE_ALWAYS)
    assert metric(samples, "ksp_share_records_archiving") == 0


@pytest.mark.java
def test_the_java_share_consumer_rejecting_and_releasing_fills_the_dlq_the_same(kafka, share_proxy, create_topic,
                                                                                 source, names):
    from integration.java.build import run_driver

    proxy = share_proxy()
    dlq = create_dlq_topic(create_topic, kafka, f"dlq.{names.topic}")
    dlq_group(proxy.bootstrap, names.group, dlq, copy=True)
    summary = run_driver(
        "share-consume", timeout=120, bootstrap=proxy.bootstrap, group=names.group, topic=source,
        timeout_ms=60_000, count=SOURCE_PARTITIONS * RECORDS_PER_PARTITION, ack_mode="explicit", commit="sync",
        reject=",".join(f"{p}:{o}" for p, o in sorted(REJECT)),
        release_always=",".join(f"{p}:{o}" for p, o in sorted(RELEASE_ALWAYS)), delivery_limit=LIMIT)
    assert "error" not in summary, summary
    assert summary["ack_errors"] == [] and summary["duplicates"] == 0
    letters = wait_for_dead_letters(kafka.bootstrap, dlq, len(REJECT) + len(RELEASE_ALWAYS))
    assert dead_letter_rows(letters) == expected_rows(source, names.group, copy=True)
    wait_until(lambda: all_finished(kafka.bootstrap, proxy.state_topic, names.group), 30,
               "SPSO past the dead-lettered records")


# ----- Kafka's checks: archived regardless, counted ------------------------------------------------


def reject_all_and_expect_no_dead_letters(kafka, proxy, port: int, source: str, group: str, reason: str) -> None:
    everything = {(p, o) for p in range(SOURCE_PARTITIONS) for o in range(RECORDS_PER_PARTITION)}
    consume_rejecting(proxy.bootstrap, group, source, everything, set(), len(everything))
    wait_until(lambda: all_finished(kafka.bootstrap, proxy.state_topic, group), 30,
               "records archived regardless of the failed DLQ check")
    samples = scrape_metrics(port)
    assert metric(samples, "ksp_share_dead_letter_failures_total", group=group, reason=reason) == len(everything)
    assert metric(samples, "ksp_share_dead_letter_records_total", group=group, reason="rejected") in (None, 0)
    assert "Failed to write to DLQ, proceeding to ARCHIVED regardless" in proxy.log_tail(lines=400)


def test_a_name_outside_the_prefix_archives_regardless(kafka, share_proxy, create_topic, source, names):
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    dlq = create_dlq_topic(create_topic, kafka, f"elsewhere.{names.topic}")
    dlq_group(proxy.bootstrap, names.group, dlq, copy=False)
    reject_all_and_expect_no_dead_letters(kafka, proxy, port, source, names.group, "prefix_mismatch")
    assert read_topic(kafka.bootstrap, dlq, DLQ_PARTITIONS) == []


def test_an_internal_topic_name_is_refused_at_alter_time(share_proxy, names):
    proxy = share_proxy()
    assert alter_group(proxy.bootstrap, names.group, {"errors.deadletterqueue.topic.name": "__consumer_offsets"}) == (
        ErrorCode.invalid_config, "errors.deadletterqueue.topic.name: DLQ topic name must not start with '__'")


def test_a_missing_topic_without_auto_create_archives_regardless(kafka, share_proxy, source, names):
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    dlq = f"dlq.{names.topic}"
    dlq_group(proxy.bootstrap, names.group, dlq, copy=False)
    reject_all_and_expect_no_dead_letters(kafka, proxy, port, source, names.group, "topic_missing")
    assert dlq not in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics


def test_an_existing_topic_not_marked_as_a_dlq(kafka, share_proxy, create_topic, source, names):
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    dlq = create_topic(f"dlq.{names.topic}", partitions=DLQ_PARTITIONS)  # no errors.deadletterqueue.group.enable
    dlq_group(proxy.bootstrap, names.group, dlq, copy=False)
    if is_kafka_44(kafka):
        reject_all_and_expect_no_dead_letters(kafka, proxy, port, source, names.group, "topic_not_enabled")
        assert read_topic(kafka.bootstrap, dlq, DLQ_PARTITIONS) == []
    else:
        # Kafka 3.9 has no such topic config: the check cannot be made and is skipped (documented).
        consume_rejecting(proxy.bootstrap, names.group, source, REJECT, set(), SOURCE_PARTITIONS * RECORDS_PER_PARTITION)
        letters = wait_for_dead_letters(kafka.bootstrap, dlq, len(REJECT))
        assert dead_letter_rows(letters) == expected_rows(source, names.group, copy=False, release_always=set())
        assert "errors.deadletterqueue.group.enable" in proxy.log_tail(lines=400)


def test_auto_create_makes_the_topic_marked_and_uses_it(kafka, share_proxy, source, names):
    proxy = share_proxy("--errors-deadletterqueue-auto-create-topics-enable")
    dlq = f"dlq.{names.topic}"
    dlq_group(proxy.bootstrap, names.group, dlq, copy=True)
    consume_rejecting(proxy.bootstrap, names.group, source, REJECT, set(), SOURCE_PARTITIONS * RECORDS_PER_PARTITION)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    wait_until(lambda: dlq in admin.list_topics(timeout=10).topics, 30, f"{dlq} created")
    partitions = len(admin.list_topics(dlq, timeout=10).topics[dlq].partitions)  # the broker's default
    resource = ConfigResource(ConfigResource.Type.TOPIC, dlq)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["message.timestamp.type"].value == "CreateTime"
    if is_kafka_44(kafka):
        assert configs["errors.deadletterqueue.group.enable"].value == "true"
    else:
        assert "errors.deadletterqueue.group.enable" not in configs  # Kafka 3.9 refuses the config
    wait_until(lambda: len(read_topic(kafka.bootstrap, dlq, partitions)) >= len(REJECT), 30, "dead letters")
    letters = read_topic(kafka.bootstrap, dlq, partitions)
    assert sorted((int(dict(m.headers())["__dlq.errors.partition"]), int(dict(m.headers())["__dlq.errors.offset"]))
                  for m in letters) == sorted(REJECT)
    assert {(m.partition(), m.key(), m.value()) for m in letters} == {
        (p % partitions, key_of(p, o), value_of(p, o)) for p, o in REJECT}


# ----- kill -9 between ARCHIVING and the DLQ write -------------------------------------------------
#
# A real transient failure of the dead-letter write, the same on every Kafka version: the DLQ topic
# lives only on broker 2 of a two-broker cluster, and broker 2 is down. (A DLQ topic with
# min.insync.replicas=2 on one broker is no such failure: Kafka 4.4 accepts acks=all writes to it.)
# The cluster is this module's own, so stopping a broker disturbs no other test.


@pytest.fixture(scope="module")
def node_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """Broker 1 of this module's own cluster (combined controller + broker)."""
    with LocalKafka(version=kafka_version(), data_dir=tmp_path_factory.mktemp("dlq-node1")) as one:
        yield one


@pytest.fixture(scope="module")
def node_two(node_one: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """Broker 2, joining `node_one`, NOT started: each test starts and stops it. A fixed port and data
    directory, so a restart is the same broker at the same address."""
    two = LocalKafka(version=node_one.version, data_dir=tmp_path_factory.mktemp("dlq-node2"), node_id=2,
                     join=node_one, port=free_port())
    yield two
    two.stop()


@pytest.fixture
def node_one_proxies(node_one: LocalKafka, tmp_path: Path) -> Iterator[ProxyStarter]:
    starter = ProxyStarter(node_one.bootstrap, tmp_path)
    yield starter
    starter.stop_all()


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader node (-1: none) of `topic`, from the cluster's metadata."""
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics.get(topic)
    if found is None or found.error is not None:
        return {}
    return {partition: info.leader for partition, info in found.partitions.items()}


def create_topic_on(bootstrap: str, name: str, nodes: list[list[int]], config: dict[str, str] | None = None) -> str:
    """`name` with an explicit replica assignment (one list of nodes per partition); waits for the leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=len(nodes), replica_assignment=nodes,
                                  config=config or {})])[name].result(timeout=30)
    wanted = {partition: replicas[0] for partition, replicas in enumerate(nodes)}
    wait_until(lambda: leaders(bootstrap, name) == wanted, 30, lambda: f"{name} led by {wanted}: {leaders(bootstrap, name)}")
    return name


def wait_for_leader(bootstrap: str, topic: str, leader: int) -> None:
    wait_until(lambda: set(leaders(bootstrap, topic).values()) == {leader}, 60,
               lambda: f"{topic} led by {leader}: {leaders(bootstrap, topic)}", interval=0.2)


def archiving_durably(bootstrap: str, state_topic: str, group: str) -> set[tuple[int, int]]:
    """The (partition, offset)s the state topic has ARCHIVING for `group`."""
    state = durable_state(bootstrap, state_topic, group)
    return {(p, offset) for p, snapshot in state.items() for batch in snapshot.state_batches
            if batch.delivery_state == RecordState.ARCHIVING
            for offset in range(batch.first_offset, batch.last_offset + 1)}


def dlq_on_broker_two_stopped(node_one: LocalKafka, node_two: LocalKafka, proxy_bootstrap: str, names) -> str:
    """The group's DLQ topic (copying records), created on broker 2 only, broker 2 then stopped:
    every dead-letter write fails until it is started again."""
    node_two.start()
    dlq = create_topic_on(node_one.bootstrap, f"dlq.{names.topic}", [[2]] * DLQ_PARTITIONS,
                          {"errors.deadletterqueue.group.enable": "true"} if is_kafka_44(node_one) else {})
    dlq_group(proxy_bootstrap, names.group, dlq, copy=True)
    node_two.stop()
    wait_for_leader(node_one.bootstrap, dlq, -1)
    return dlq


def rejected_while_the_dlq_broker_is_down(node_one: LocalKafka, node_two: LocalKafka, proxies: ProxyStarter,
                                          names, metrics_port: int):
    """A proxy whose group rejected REJECT while the DLQ topic's only broker (2) is down, the records
    durably ARCHIVING and the writer seen failing (delivery timeout 5 s) and retrying; returns
    (proxy, source topic, DLQ topic). Broker 2 is left stopped."""
    bootstrap = node_one.bootstrap
    node_two.stop()  # (a previous test's restart) -- the proxy's state topic must be created on broker 1
    proxy = proxies("--state-write-timeout-ms", "5000", "--metrics-port", str(metrics_port))
    source = create_topic_on(bootstrap, names.topic, [[1]] * SOURCE_PARTITIONS)
    produce_keyed(bootstrap, source)
    read_topic(bootstrap, source, SOURCE_PARTITIONS)  # __consumer_offsets (the readers' coordinator) on broker 1 too
    dlq = dlq_on_broker_two_stopped(node_one, node_two, proxy.bootstrap, names)

    consume_rejecting(proxy.bootstrap, names.group, source, REJECT, set(), SOURCE_PARTITIONS * RECORDS_PER_PARTITION)
    wait_until(lambda: archiving_durably(bootstrap, proxy.state_topic, names.group) == REJECT, 30,
               lambda: f"ARCHIVING on the state topic: {archiving_durably(bootstrap, proxy.state_topic, names.group)}")
    wait_until(lambda: "dead-letter write not done; retrying" in proxy.log_tail(lines=2000), 30,
               lambda: f"a failed dead-letter write in the proxy log:\n{proxy.log_tail()}", interval=0.5)
    samples = scrape_metrics(metrics_port)
    assert metric(samples, "ksp_share_records_archiving") == len(REJECT)
    assert metric(samples, "ksp_share_dead_letter_records_total", group=names.group, reason="rejected") in (None, 0)
    return proxy, source, dlq


def assert_dead_lettered_once(bootstrap: str, source: str, dlq: str, state_topic: str, group: str) -> None:
    letters = wait_for_dead_letters(bootstrap, dlq, len(REJECT))
    offsets = [(int(dict(m.headers())["__dlq.errors.partition"]), int(dict(m.headers())["__dlq.errors.offset"]))
               for m in letters]
    assert set(offsets) == REJECT  # none missing
    assert len(offsets) - len(set(offsets)) == 0  # no write succeeded during the outage: no duplicates
    assert dead_letter_rows(letters) == expected_rows(source, group, copy=True, release_always=set())
    wait_until(lambda: all_finished(bootstrap, state_topic, group), 30, "ARCHIVED with the SPSO past them")


def test_a_dlq_broker_outage_holds_the_records_archiving_until_it_returns(node_one, node_two, node_one_proxies,
                                                                          names):
    """The running proxy learns of broker 2's return and writes every letter once."""
    port = free_port()
    proxy, source, dlq = rejected_while_the_dlq_broker_is_down(node_one, node_two, node_one_proxies, names, port)
    node_two.start()  # the same node id, data directory and port
    assert_dead_lettered_once(node_one.bootstrap, source, dlq, proxy.state_topic, names.group)
    samples = scrape_metrics(port)
    assert metric(samples, "ksp_share_dead_letter_records_total", group=names.group, reason="rejected") == len(REJECT)
    assert metric(samples, "ksp_share_records_archiving") == 0


def test_a_proxy_killed_between_archiving_and_the_dlq_write_loses_none(node_one, node_two, node_one_proxies, names):
    """The DLQ broker is down, the records ARCHIVING; the proxy dies with SIGKILL; broker 2 comes back;
    a proxy on the same state topic writes every one of them, once."""
    bootstrap = node_one.bootstrap
    proxy, source, dlq = rejected_while_the_dlq_broker_is_down(node_one, node_two, node_one_proxies, names,
                                                               free_port())
    proxy.kill()
    node_two.start()  # the same node id, data directory and port
    wait_for_leader(bootstrap, dlq, 2)
    assert read_topic(bootstrap, dlq, DLQ_PARTITIONS) == []  # no write got through before the kill
    restarted = node_one_proxies(state_topic=proxy.state_topic)
    assert_dead_lettered_once(bootstrap, source, dlq, restarted.state_topic, names.group)



def test_records_archiving_at_an_instance_are_dead_lettered_once_after_their_partitions_move(
        node_one, node_two, node_one_proxies, names):
    """Scale-out hand-over (issue 15) with the old owner alive: the DLQ broker is down and one
    rejected record per source partition is ARCHIVING at the only instance. A second instance
    joins and takes some state partitions over. When broker 2 returns each letter is written
    once: by the new owner for the records that moved (its replay finds them ARCHIVING), by the
    first for the rest. (This does not catch a missing cancel of the first's drains on hand-over:
    its round in flight fails at the delivery time-out long before broker 2 is back, and its next
    round finds the share-partition gone. That window is unit-tested, tests/proxy/share.)
    Letters the first had already handed to its producer before the hand-over stay queued there
    until their delivery time-out (--state-write-timeout-ms): a cancelled round cannot take them
    back, so a broker back sooner gets them too -- at least once, as DeadLetterWriter.cancel says.
    The test starts broker 2 only after that time-out, so each letter is written once."""
    from integration.kafka_fixtures import topic_id_of
    from integration.share.test_scale_out import STATE_PARTITIONS, Instances, port_base_flags
    from proxy.share.ownership import ServiceOwnership

    partitions, homes = 6, ServiceOwnership(STATE_PARTITIONS)
    bootstrap = node_one.bootstrap
    node_two.stop()  # (a previous test's restart) -- state and transaction topics on broker 1
    write_timeout_s = 5.0
    deployment = Instances(node_one, node_one_proxies, 1,
                           extra=("--state-write-timeout-ms", str(int(write_timeout_s * 1000))))
    first = deployment.proxies["ksp-0"]
    # Source partitions homed on at least 4 of the 6 state partitions: whichever 3 the second
    # instance takes, at least one holds a rejected record.
    for attempt in range(20):
        source = create_topic_on(bootstrap, f"{names.topic}-{attempt}", [[1]] * partitions)
        topic_id = topic_id_of(bootstrap, source)
        if len({homes.home_of_partition(topic_id, p) for p in range(partitions)}) >= 4:
            break
    produce_keyed(bootstrap, source, partitions)
    read_topic(bootstrap, source, partitions)
    dlq = dlq_on_broker_two_stopped(node_one, node_two, first.bootstrap, names)

    reject = {(p, 1) for p in range(partitions)}
    consume_rejecting(first.bootstrap, names.group, source, reject, set(), partitions * RECORDS_PER_PARTITION)
    wait_until(lambda: archiving_durably(bootstrap, deployment.state_topic, names.group) == reject, 30,
               lambda: f"ARCHIVING: {archiving_durably(bootstrap, deployment.state_topic, names.group)}")
    wait_until(lambda: "dead-letter write not done; retrying" in first.log_tail(lines=3000), 30,
               lambda: f"a failed dead-letter write:\n{first.log_tail()}", interval=0.5)

    node_one_proxies(*deployment.common, "--instance-id", "ksp-1", "--metrics-port", str(free_port()),
                     *port_base_flags(node_one), state_topic=deployment.state_topic)
    wait_until(lambda: set(deployment.owners().values()) == {"ksp-0", "ksp-1"}, 45, "the second instance to own some")
    owners = deployment.owners()
    moved = {r for r in reject if owners[homes.home_of_partition(topic_id, r[0])] == "ksp-1"}
    assert moved, owners  # guaranteed by the homes chosen above

    # Letters the first instance produced before it let go expire in its producer by then (a run
    # against 3.9.2 had broker 2 back within that window: the moved records lettered twice).
    time.sleep(write_timeout_s + 1.0)
    node_two.start()
    wait_for_leader(bootstrap, dlq, 2)
    wait_for_dead_letters(bootstrap, dlq, len(reject))
    wait_until(lambda: all_finished(bootstrap, deployment.state_topic, names.group), 30,
               "ARCHIVED with the SPSO past them")
    letters = read_topic(bootstrap, dlq, DLQ_PARTITIONS)  # after both instances settled: duplicates show here
    offsets = sorted((int(dict(m.headers())["__dlq.errors.partition"]), int(dict(m.headers())["__dlq.errors.offset"]))
                     for m in letters)
    assert offsets == sorted(reject), (offsets, moved)
