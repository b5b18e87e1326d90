"""Share-group configs through the proxy: Kafka's tools set them, the proxy applies, keeps and describes them.

Kafka's VerifiableShareConsumer and kafka-configs (ConfigCommand) come from the 4.4.0 jars whatever
broker is upstream: they talk to the proxy, which serves group configs of share groups itself.
Raw DescribeConfigs / IncrementalAlterConfigs requests (kio) check exact codes and sources.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import trio
from confluent_kafka import AcknowledgeType, Producer
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from integration.kafka_fixtures import kafka_tools_jar, maven_jar
from integration.share.conftest import (
    EXPLICIT,
    acknowledge_all,
    metric,
    poll_until,
    produce,
    scrape_metrics,
    share_consumer,
    wait_for_assigned_members,
    wire_call,
)
from proxy.localkafka import fetch_kafka, free_port

from kio.schema.describe_configs.v4.request import DescribeConfigsResource
from kio.schema.incremental_alter_configs.v1.request import AlterableConfig, AlterConfigsResource

TOOLS_KAFKA = "4.4.0"
GROUP = 32  # ConfigResource.Type.GROUP
TOPIC = 2
SET, DELETE = 0, 1
GROUP_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 8, 4, 5


def java_tool(main_class: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    classpath = f"{kafka_tools_jar(TOOLS_KAFKA)}:{fetch_kafka(TOOLS_KAFKA)}/*"
    return subprocess.run(["java", "-cp", classpath, main_class, *args], capture_output=True, text=True,
                          timeout=timeout)


# kafka-configs: Kafka 4.4's core jar no longer carries kafka.admin.ConfigCommand and no 4.4 tools
# jar is published, so the 4.3 command runs (its core jar first on the class path).
CONFIG_COMMAND_KAFKA = "4.3.0"


def kafka_configs(*args: str) -> subprocess.CompletedProcess[str]:
    core = maven_jar("kafka_2.13", CONFIG_COMMAND_KAFKA)
    if core is None:
        pytest.skip(f"kafka_2.13 {CONFIG_COMMAND_KAFKA} (kafka-configs) not available from Maven")
    classpath = f"{core}:{kafka_tools_jar(CONFIG_COMMAND_KAFKA)}:{fetch_kafka(TOOLS_KAFKA)}/*"
    return subprocess.run(["java", "-cp", classpath, "kafka.admin.ConfigCommand", *args], capture_output=True,
                          text=True, timeout=120)


def call(bootstrap: str, request):
    return trio.run(wire_call, bootstrap, request)


def alter(bootstrap: str, resources: list[tuple[int, str, list[tuple[str, int, str | None]]]],
          validate_only: bool = False):
    """IncrementalAlterConfigs v1; returns {(type, name): (error code, message)}."""
    schema = load_request_schema(44, 1)
    request = schema(
        resources=tuple(AlterConfigsResource(resource_type=t, resource_name=n, configs=tuple(
            AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops)) for t, n, ops in resources),
        validate_only=validate_only,
    )
    response = call(bootstrap, request)
    return {(int(r.resource_type), r.resource_name): (r.error_code, r.error_message) for r in response.responses}


def describe(bootstrap: str, group: str, keys: tuple[str, ...] | None = None):
    """DescribeConfigs v4 of one group: {name: (value, source, [(synonym name, value, source)])}."""
    request = load_request_schema(32, 4)(
        resources=(DescribeConfigsResource(resource_type=GROUP, resource_name=group, configuration_keys=keys),),
        include_synonyms=True, include_documentation=True)
    result = call(bootstrap, request).results[0]
    assert result.error_code == ErrorCode.none, result.error_message
    return {c.name: (c.value, int(c.config_source), [(s.name, s.value, int(s.source)) for s in c.synonyms])
            for c in result.configs}


# ----- Kafka's VerifiableShareConsumer ------------------------------------------------------------------


@pytest.mark.java
def test_verifiable_share_consumer_offset_reset_earliest_reads_records_produced_before_it(
        kafka, share_proxy, create_topic, names):
    # The proxy's default is Kafka's: latest. Only the group config can make this group read old records.
    proxy = share_proxy("--share-auto-offset-reset", "latest")
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 25)
    result = java_tool(
        "org.apache.kafka.tools.VerifiableShareConsumer", "--bootstrap-server", proxy.bootstrap,
        "--topic", topic, "--group-id", names.group, "--offset-reset-strategy", "earliest",
        "--max-messages", "25", "--acknowledgement-mode", "sync", timeout=180)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    kinds = [e["name"] for e in events]
    assert "offset_reset_strategy_set" in kinds, (result.stdout[-2000:], result.stderr[-2000:])
    consumed = sum(e["count"] for e in events if e["name"] == "records_consumed")
    acknowledged = [e for e in events if e["name"] == "offsets_acknowledged"]
    assert consumed == 25, result.stdout[-3000:]
    assert sum(e["count"] for e in acknowledged) == 25 and all(e["success"] for e in acknowledged)
    # A clean close: shutdown_complete, after which the tool may only report its own shutdown hook
    # (kafka-tools 4.4.0 prints shutdown_requested from the hook after a consumer that stopped at
    # --max-messages has closed; 4.3.0 printed it before).
    assert "shutdown_complete" in kinds, (result.stdout[-3000:], result.stderr[-3000:])
    assert set(kinds[kinds.index("shutdown_complete") + 1:]) <= {"shutdown_requested"}, result.stdout[-3000:]
    # The proxy holds the config (source GROUP_CONFIG); the broker never saw it.
    assert describe(proxy.bootstrap, names.group)["share.auto.offset.reset"][:2] == ("earliest", GROUP_CONFIG)
    if kafka_groups_have_configs(kafka):
        upstream = describe(kafka.bootstrap, names.group, ("share.auto.offset.reset",))
        assert upstream["share.auto.offset.reset"][:2] == ("latest", DEFAULT_CONFIG)


def kafka_groups_have_configs(kafka) -> bool:
    """Group configs (ConfigResource type GROUP) exist from Kafka 4.0 on."""
    return int(kafka.version.split(".")[0]) >= 4


# ----- live effect ----------------------------------------------------------------------------------------


def test_shorter_lock_duration_set_live_brings_an_unacknowledged_record_back_sooner(
        kafka, share_proxy, create_topic, names):
    proxy = share_proxy("--share-min-record-lock-duration-ms", "1000")  # default lock stays 30 s
    topic = create_topic(names.topic)
    holder = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    other = None
    try:
        holder.poll(0.5)
        wait_for_assigned_members(proxy.bootstrap, names.group, 1)
        assert alter(proxy.bootstrap, [(GROUP, names.group, [("share.record.lock.duration.ms", SET, "2000")])]) == {
            (GROUP, names.group): (ErrorCode.none, None)}
        produce(kafka.bootstrap, topic, 5)
        held = poll_until(holder, 5)
        acquired_at = time.monotonic()
        assert [m.delivery_count() for m in held] == [1] * 5
        other = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
        redelivered = poll_until(other, 5, timeout=25)
        waited = time.monotonic() - acquired_at
        assert sorted((m.offset(), m.delivery_count()) for m in redelivered) == [(o, 2) for o in range(5)]
        assert 1.5 <= waited < 15, f"redelivered after {waited:.1f}s: the group's 2 s lock was not applied"
        acknowledge_all(other, redelivered)
    finally:
        if other is not None:
            other.close()
        holder.close()


def test_lower_delivery_count_limit_set_live_archives_sooner(kafka, share_proxy, create_topic, names):
    proxy = share_proxy()  # proxy default: 5 deliveries
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 3)
    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        first = poll_until(consumer, 3)
        assert alter(proxy.bootstrap, [(GROUP, names.group, [("share.delivery.count.limit", SET, "2")])]) == {
            (GROUP, names.group): (ErrorCode.none, None)}
        acknowledge_all(consumer, first, lambda m: AcknowledgeType.RELEASE)
        second = poll_until(consumer, 3)
        assert sorted((m.offset(), m.delivery_count()) for m in second) == [(o, 2) for o in range(3)]
        acknowledge_all(consumer, second, lambda m: AcknowledgeType.RELEASE)
        # Released at the group's limit of 2 (not the proxy's 5): archived, never delivered again.
        produce(kafka.bootstrap, topic, 2, start=3)
        later = poll_until(consumer, 2)
        assert sorted((m.offset(), m.delivery_count()) for m in later) == [(3, 1), (4, 1)]
        acknowledge_all(consumer, later)
        assert not consumer.poll(1.0)
    finally:
        consumer.close()


def test_a_read_committed_group_waits_out_an_open_transaction_without_spinning_upstream(
        kafka, share_proxy, create_topic, names):
    """share.isolation.level read_committed on a real broker: records of an open transaction are not
    handed out, the consumer waiting at the last stable offset costs a few upstream Fetches a second
    (the long poll waits at read_committed: a read_uncommitted one ended at the open transaction's
    first record and the reads and long polls went round as fast as the broker answered), and the
    records come once the transaction commits."""
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    topic, group = create_topic(names.topic), names.group
    assert alter(proxy.bootstrap, [(GROUP, group, [("share.isolation.level", SET, "read_committed")])]) == {
        (GROUP, group): (ErrorCode.none, None)}
    produce(kafka.bootstrap, topic, 10)
    consumer = share_consumer(proxy.bootstrap, group, topic, EXPLICIT)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{names.topic}-txn"})
    try:
        acknowledge_all(consumer, poll_until(consumer, 10))
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=b"open-%d" % i)
        assert producer.flush(30) == 0  # in the log, past the last stable offset

        def upstream_fetches() -> float:
            samples = scrape_metrics(port)
            return sum(metric(samples, "ksp_share_upstream_fetches_total", kind=kind) or 0.0
                       for kind in ("read", "long_poll"))

        before, started = upstream_fetches(), time.monotonic()
        waited = []
        while time.monotonic() - started < 3.0:
            waited.extend(consumer.poll(0.5))
        fetches_per_second = (upstream_fetches() - before) / (time.monotonic() - started)
        assert waited == []  # nothing of the open transaction
        assert fetches_per_second < 30, f"{fetches_per_second:.0f} upstream Fetches a second while waiting"

        producer.commit_transaction(30)
        committed_at = time.monotonic()
        records = poll_until(consumer, 5, timeout=15)
        assert sorted(m.value() for m in records) == [b"open-%d" % i for i in range(5)]
        assert time.monotonic() - committed_at < 5
        acknowledge_all(consumer, records)
    finally:
        consumer.close()


# ----- validation, sources, splitting -----------------------------------------------------------------


def test_values_outside_the_proxys_bounds_are_refused_and_validate_only_changes_nothing(
        kafka, share_proxy, create_topic, names):
    proxy = share_proxy("--share-max-delivery-count-limit", "6", "--share-record-lock-duration-ms", "20000")
    group = names.group
    # The proxy holds this group's configs from now on (a share.* key on a new id).
    assert alter(proxy.bootstrap, [(GROUP, group, [("share.isolation.level", SET, "read_committed")])]) == {
        (GROUP, group): (ErrorCode.none, None)}
    refused = alter(proxy.bootstrap, [(GROUP, group, [("share.delivery.count.limit", SET, "7")])])
    code, message = refused[(GROUP, group)]
    assert code == ErrorCode.invalid_config
    assert "group.share.max.delivery.count.limit (6)" in message
    code, message = alter(proxy.bootstrap, [(GROUP, group, [("share.record.lock.duration.ms", SET, "500")])])[
        (GROUP, group)]
    assert code == ErrorCode.invalid_config and "group.share.min.record.lock.duration.ms" in message
    code, message = alter(proxy.bootstrap, [(GROUP, group, [("share.isolation.level", 2, "read_committed")])])[
        (GROUP, group)]
    assert code == ErrorCode.invalid_config and "not LIST" in message
    assert alter(proxy.bootstrap, [(GROUP, group, [("share.delivery.count.limit", SET, "3")])],
                 validate_only=True) == {(GROUP, group): (ErrorCode.none, None)}
    described = describe(proxy.bootstrap, group)
    assert described["share.isolation.level"][:2] == ("read_committed", GROUP_CONFIG)
    # Nothing else was set: the proxy's flag (20000) and Kafka's defaults, with their sources.
    assert described["share.delivery.count.limit"][:2] == ("5", DEFAULT_CONFIG)
    assert described["share.record.lock.duration.ms"] == (
        "20000", STATIC_BROKER_CONFIG,
        [("group.share.record.lock.duration.ms", "20000", STATIC_BROKER_CONFIG),
         ("group.share.record.lock.duration.ms", "30000", DEFAULT_CONFIG)])
    assert sorted(described) == sorted([
        "share.auto.offset.reset", "share.delivery.count.limit", "share.heartbeat.interval.ms",
        "share.isolation.level", "share.partition.max.record.locks", "share.record.lock.duration.ms",
        "share.session.timeout.ms",
        # The draft KIP's IN_PROGRESS configs (docs/in-progress.md).
        "share.in.progress.staleness.threshold.ms", "share.in.progress.max.lock.extension.ms",
        "share.in.progress.rebalance.grace.ms",
        # KIP-1191's dead-letter configs (docs/dead-letters.md).
        "errors.deadletterqueue.topic.name", "errors.deadletterqueue.copy.record.enable"])
    assert described["share.in.progress.staleness.threshold.ms"][:2] == ("90000", DEFAULT_CONFIG)
    assert described["errors.deadletterqueue.topic.name"][:2] == ("", DEFAULT_CONFIG)
    assert described["errors.deadletterqueue.copy.record.enable"][:2] == ("false", DEFAULT_CONFIG)


def test_one_request_naming_the_state_topic_a_share_group_and_a_topic_gets_all_three_right(
        kafka, share_proxy, create_topic, names):
    proxy = share_proxy()
    topic = create_topic(names.topic)
    answers = alter(proxy.bootstrap, [
        (TOPIC, proxy.state_topic, [("retention.ms", SET, "1000")]),
        (GROUP, names.group, [("share.heartbeat.interval.ms", SET, "6000")]),
        (TOPIC, topic, [("retention.ms", SET, "123456")]),
    ])
    assert answers[(TOPIC, proxy.state_topic)][0] == ErrorCode.topic_authorization_failed
    assert answers[(GROUP, names.group)] == (ErrorCode.none, None)
    assert answers[(TOPIC, topic)][0] == ErrorCode.none
    assert describe(proxy.bootstrap, names.group)["share.heartbeat.interval.ms"][:2] == ("6000", GROUP_CONFIG)
    described = call(kafka.bootstrap, load_request_schema(32, 4)(
        resources=(DescribeConfigsResource(resource_type=TOPIC, resource_name=topic,
                                           configuration_keys=("retention.ms",)),),
        include_synonyms=False, include_documentation=False)).results[0]
    assert [(c.name, c.value) for c in described.configs] == [("retention.ms", "123456")]


def test_legacy_alter_configs_on_a_share_group_is_the_proxys_and_replaces_its_config(
        kafka, share_proxy, names):
    """Kafka accepts the legacy AlterConfigs (33) on GROUP resources as well (it replaces the whole
    config); through the proxy it must set the share group's config, not the broker's."""
    from kio.schema.alter_configs.v2.request import AlterableConfig as LegacyConfig
    from kio.schema.alter_configs.v2.request import AlterConfigsResource as LegacyResource

    proxy = share_proxy()
    assert alter(proxy.bootstrap, [(GROUP, names.group, [("share.record.lock.duration.ms", SET, "20000")])]) == {
        (GROUP, names.group): (ErrorCode.none, None)}
    legacy = call(proxy.bootstrap, load_request_schema(33, 2)(
        resources=(LegacyResource(resource_type=GROUP, resource_name=names.group, configs=(
            LegacyConfig(name="share.auto.offset.reset", value="earliest"),)),),
        validate_only=False))
    assert [(r.resource_name, r.error_code) for r in legacy.responses] == [(names.group, ErrorCode.none)]
    described = describe(proxy.bootstrap, names.group)
    assert described["share.auto.offset.reset"][:2] == ("earliest", GROUP_CONFIG)
    assert described["share.record.lock.duration.ms"][1] != GROUP_CONFIG  # not named: back to its default
    # The broker never saw it: its own describe of the group has Kafka's default (4.x) or nothing (3.9).
    broker = call(kafka.bootstrap, load_request_schema(32, 4)(
        resources=(DescribeConfigsResource(resource_type=GROUP, resource_name=names.group,
                                           configuration_keys=("share.auto.offset.reset",)),),
        include_synonyms=False, include_documentation=False)).results[0]
    assert [(c.name, c.value) for c in broker.configs] in ([("share.auto.offset.reset", "latest")], [])


# ----- Kafka's kafka-configs tool, consumer groups, restart ---------------------------------------------


@pytest.mark.java
def test_kafka_configs_tool_alters_and_describes_share_group_configs_that_survive_a_restart(
        kafka, share_proxy, create_topic, names):
    proxy = share_proxy("--share-auto-offset-reset", "latest")
    result = kafka_configs("--bootstrap-server", proxy.bootstrap, "--entity-type", "groups",
                       "--entity-name", names.group, "--alter", "--add-config",
                       "share.record.lock.duration.ms=20000,share.auto.offset.reset=earliest")
    assert result.returncode == 0, result.stderr[-2000:]
    if kafka_groups_have_configs(kafka):
        # A consumer group's config set through the proxy still reaches the cluster.
        consumer_group = names.another("consumer")
        result = kafka_configs("--bootstrap-server", proxy.bootstrap, "--entity-type", "groups",
                           "--entity-name", consumer_group, "--alter", "--add-config",
                           "consumer.session.timeout.ms=50000")
        assert result.returncode == 0, result.stderr[-2000:]
        assert describe(kafka.bootstrap, consumer_group, ("consumer.session.timeout.ms",))[
            "consumer.session.timeout.ms"][:2] == ("50000", GROUP_CONFIG)

    proxy.restart()
    result = kafka_configs("--bootstrap-server", proxy.bootstrap, "--entity-type", "groups",
                       "--entity-name", names.group, "--describe")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = {line.split("=", 1)[0].strip(): line for line in result.stdout.splitlines() if "=" in line}
    assert set(lines) == {"share.record.lock.duration.ms", "share.auto.offset.reset"}, (result.stdout, result.stderr)
    assert "share.record.lock.duration.ms=20000 " in lines["share.record.lock.duration.ms"], result.stdout
    assert "share.auto.offset.reset=earliest " in lines["share.auto.offset.reset"], result.stdout
    assert "DYNAMIC_GROUP_CONFIG:share.record.lock.duration.ms=20000" in lines["share.record.lock.duration.ms"]
    # Only the group's own settings are listed without --all, as Kafka does for group configs.

    # The restored config is applied: the group's first consumer starts from the earliest offset.
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 4)
    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        messages = poll_until(consumer, 4, timeout=30)
        assert sorted(m.offset() for m in messages) == [0, 1, 2, 3]
        acknowledge_all(consumer, messages)
    finally:
        consumer.close()

    result = kafka_configs("--bootstrap-server", proxy.bootstrap, "--entity-type", "groups",
                       "--entity-name", names.group, "--alter", "--delete-config", "share.record.lock.duration.ms")
    assert result.returncode == 0, result.stderr[-2000:]
    assert describe(proxy.bootstrap, names.group)["share.record.lock.duration.ms"][:2] == ("30000", DEFAULT_CONFIG)
