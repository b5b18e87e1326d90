"""The secured local Kafka (`security="sasl_ssl"`) against real clients: SCRAM users, ACLs
enforced by the StandardAuthorizer, OAUTHBEARER's test validator, Kafka's own CLI with the
generated client-config file, and `share-proxy local-kafka --security ...`'s ready line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from integration.kafka_fixtures import (
    create_topic,
    kafka_tools_jar,
    kafka_version,
    maven_jar,
    share_proxy_executable,
    terminate,
    unique_name,
    wait_for_ready_line,
)
from integration.security_fixtures import grant, revoke
from proxy.localkafka import LocalKafka, fetch_kafka

# Kafka's CLI tools are not on the broker's classpath; the newest ones (as the other tool tests
# use) talk to both broker versions.
TOOLS_KAFKA = "4.4.0"


def produce(kafka: LocalKafka, user: str, topic: str, count: int) -> list[KafkaError | None]:
    """Produce `count` records as `user`; each record's delivery error (None when delivered)."""
    outcomes: list[KafkaError | None] = []
    producer = Producer(kafka.client_config(user) | {"message.timeout.ms": "10000", "retries": "0"})
    for index in range(count):
        producer.produce(topic, value=f"value-{index}".encode(), on_delivery=lambda error, _: outcomes.append(error))
    assert producer.flush(20) == 0
    return outcomes


def consume(kafka: LocalKafka, user: str, topic: str, group: str, count: int, timeout: float = 20.0) -> tuple[list[bytes], list[KafkaError]]:
    """Poll as `user` in `group` until `count` records or the first error; (values, errors)."""
    consumer = Consumer(
        kafka.client_config(user) | {"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": "false"}
    )
    values: list[bytes] = []
    errors: list[KafkaError] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(values) < count and not errors and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                errors.append(message.error())
            else:
                values.append(message.value())
    finally:
        consumer.close()
    return values, errors


def fresh_topic(kafka: LocalKafka, request: pytest.FixtureRequest) -> str:
    name = unique_name(re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name)[:40])
    return create_topic(kafka.bootstrap, name, client_config=kafka.client_config())


def test_alice_is_refused_without_acls_and_produces_and_consumes_once_granted(
    secured_kafka: LocalKafka, request: pytest.FixtureRequest
) -> None:
    topic = fresh_topic(secured_kafka, request)
    group = unique_name("alice-group")

    refused = produce(secured_kafka, "alice", topic, 1)
    assert [error.code() if error else None for error in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    grant(secured_kafka, "User:alice", "topic", topic, "write")
    assert produce(secured_kafka, "alice", topic, 5) == [None] * 5

    values, errors = consume(secured_kafka, "alice", topic, group, 5)
    assert values == [] and errors, "alice read without READ ACLs"
    assert errors[0].code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED), errors

    grant(secured_kafka, "User:alice", "topic", topic, "read")
    values, errors = consume(secured_kafka, "alice", topic, group, 5)
    assert errors and errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, errors

    grant(secured_kafka, "User:alice", "group", group, "read")
    values, errors = consume(secured_kafka, "alice", topic, group, 5)
    assert errors == []
    assert values == [f"value-{index}".encode() for index in range(5)]

    # bob holds no ACL on either: the grants were alice's alone.
    assert [error.code() if error else None for error in produce(secured_kafka, "bob", topic, 1)] == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]
    revoke(secured_kafka, "User:alice", "topic", topic, "write")
    assert [error.code() if error else None for error in produce(secured_kafka, "alice", topic, 1)] == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]


def test_a_wrong_password_fails_authentication(secured_kafka: LocalKafka) -> None:
    errors: list[KafkaError] = []
    admin = AdminClient(
        secured_kafka.client_config("alice") | {"sasl.password": "not-alices-password", "error_cb": errors.append}
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(0)
    assert any(error.code() == KafkaError._AUTHENTICATION for error in errors), errors
    assert any("Authentication failed" in error.str() for error in errors), errors


def test_the_ca_is_required_to_connect(secured_kafka: LocalKafka, tmp_path: Path) -> None:
    """TLS is real: a client trusting another CA fails the handshake."""
    from proxy.localkafka.certs import Certificates

    other_ca = Certificates(tmp_path / "other").ca_cert
    errors: list[KafkaError] = []
    admin = AdminClient(secured_kafka.client_config() | {"ssl.ca.location": str(other_ca), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(0)
    assert any(error.code() == KafkaError._SSL for error in errors), errors


def test_oauthbearer_unsecured_tokens_authenticate_as_their_subject(
    secured_kafka: LocalKafka, request: pytest.FixtureRequest
) -> None:
    """The test-only validator takes an unsigned JWT; its `sub` is the principal ACLs apply to."""
    topic = fresh_topic(secured_kafka, request)
    config = {
        key: value for key, value in secured_kafka.client_config().items() if not key.startswith("sasl.")
    } | {
        "sasl.mechanism": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": "principal=bob",
    }
    admin = AdminClient(config)
    assert topic not in admin.list_topics(timeout=10).topics  # bob may not even describe it

    grant(secured_kafka, "User:bob", "topic", topic, "describe")
    assert topic in admin.list_topics(timeout=10).topics


def tools_classpath() -> str:
    """kafka-tools with the kafka-clients of its own release (4.4.0's tools are not on Maven
    Central, and the 4.3 tools need 4.3's clients); the rest from the newest broker's jars."""
    tools = kafka_tools_jar(TOOLS_KAFKA)
    clients = maven_jar("kafka-clients", tools.parent.name)
    if clients is None:
        pytest.fail(f"kafka-clients {tools.parent.name} is not on Maven Central")
    others = sorted(str(jar) for jar in fetch_kafka(TOOLS_KAFKA).glob("*.jar") if not jar.name.startswith("kafka-clients-"))
    return os.pathsep.join([str(tools), str(clients), *others])


def kafka_topics(kafka: LocalKafka, *args: str) -> subprocess.CompletedProcess[str]:
    classpath = tools_classpath()
    return subprocess.run(
        ["java", "-cp", classpath, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", kafka.bootstrap, *args],
        capture_output=True, text=True, timeout=120,
    )


def test_kafkas_cli_works_with_the_generated_command_config(secured_kafka: LocalKafka) -> None:
    assert secured_kafka.client_config_path is not None
    topic = unique_name("cli-topic")

    created = kafka_topics(
        secured_kafka, "--command-config", str(secured_kafka.client_config_path),
        "--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1",
    )
    assert created.returncode == 0, created.stderr[-2000:]
    listed = kafka_topics(secured_kafka, "--command-config", str(secured_kafka.client_config_path), "--list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert topic in listed.stdout.split()


READY_SECURED = re.compile(
    r"ready bootstrap=127\.0\.0\.1:(?P<port>\d+) version=(?P<version>\S+)"
    r"(?: ca=(?P<ca>\S+))? client-config=(?P<config>\S+)"
)


@pytest.mark.parametrize("security", ["sasl_ssl", "sasl_plaintext"])
def test_local_kafka_command_prints_the_extended_ready_line(tmp_path: Path, security: str) -> None:
    version = kafka_version()
    data_dir = tmp_path / "kafka-data"
    process = subprocess.Popen(
        [share_proxy_executable(), "local-kafka", "--kafka-version", version, "--security", security,
         "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = wait_for_ready_line(process, 120, "share-proxy local-kafka --security", data_dir / "server.log")
        line = ready.string.strip()
        match = READY_SECURED.fullmatch(line)
        assert match, line
        assert match["version"] == version
        if security == "sasl_ssl":
            assert match["ca"] == str(data_dir / "tls" / "ca.pem")
            assert Path(match["ca"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
        else:
            assert match["ca"] is None, "sasl_plaintext has no TLS and prints no CA"
        config_text = Path(match["config"]).read_text()
        assert f"security.protocol={security.upper()}\n" in config_text
        assert 'username="admin" password="admin-secret"' in config_text

        # What the line names is enough to log in as admin.
        client = {
            "bootstrap.servers": f"127.0.0.1:{match['port']}",
            "security.protocol": security.upper(),
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": "admin-secret",
        }
        if match["ca"]:
            client["ssl.ca.location"] = match["ca"]
        assert 1 in AdminClient(client).list_topics(timeout=10).brokers

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert process.stderr is not None
        assert "local-kafka: broker stopped" in process.stderr.read()
    finally:
        terminate(process)
        if process.stderr is not None:
            process.stderr.close()


@pytest.mark.java
def test_java_drivers_take_security_settings_as_properties_and_command_config(
    secured_kafka: LocalKafka, request: pytest.FixtureRequest
) -> None:
    from integration.java.build import run_driver

    topic = fresh_topic(secured_kafka, request)
    group = unique_name("java-alice")
    for resource_type, name, operation in (("topic", topic, "write"), ("topic", topic, "read"), ("group", group, "read")):
        grant(secured_kafka, "User:alice", resource_type, name, operation)

    summary = run_driver(
        "produce-consume", bootstrap=secured_kafka.bootstrap, topic=topic, count=50, group=group,
        timeout_ms=30000, property=secured_kafka.java_properties("alice"),
    )
    assert summary["produced"] == 50 and summary["produce_errors"] == 0, summary
    assert summary["consume"]["unique"] == 50 and summary["consume"]["committed"], summary

    cluster = run_driver(
        "describe-cluster", bootstrap=secured_kafka.bootstrap, command_config=secured_kafka.client_config_path,
    )
    assert cluster["nodes"] == [f"1@127.0.0.1:{secured_kafka.port}"], cluster
