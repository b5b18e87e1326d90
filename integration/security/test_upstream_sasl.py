"""The proxy in front of a SASL_SSL cluster (SCRAM-SHA-512, StandardAuthorizer, ACLs).

The proxy connects as `admin` (its service credentials, password from a file) over TLS and
serves TLS itself with a certificate from the cluster's CA. Clients authenticate themselves, to
the cluster, through the proxy: alice's SCRAM and an OAUTHBEARER token pass through byte for
byte, and the cluster's ACLs apply to them as to direct clients. Wrong service credentials or a
CA that does not verify the brokers end `share-proxy serve` at once with one clear line.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from integration.security.tls_fixtures import Pki, listener_flags
from integration.security_fixtures import grant
from integration.share.conftest import SHARE_PROXY, EXPLICIT, ProxyStarter, acknowledge_all, poll_until, share_consumer

pytestmark = pytest.mark.integration

SERVICE_PASSWORD = "admin-secret"  # the secured local Kafka's admin (super user) password


def service_flags(kafka, password_file: Path, *, ca: str | None = None) -> tuple[str, ...]:
    return ("--upstream-security-protocol", "SASL_SSL", "--upstream-ssl-ca-location", ca or str(kafka.ca_path),
            "--upstream-sasl-mechanism", "SCRAM-SHA-512", "--upstream-sasl-username", "admin")


@pytest.fixture(scope="module")
def password_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secrets") / "service-password"
    path.write_text(SERVICE_PASSWORD + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def secured_proxy(secured_kafka, password_file, tmp_path_factory):
    """share-proxy serve in front of the SASL_SSL cluster, as admin, with a TLS listener."""
    starter = ProxyStarter(secured_kafka.bootstrap, tmp_path_factory.mktemp("secured-proxy"))
    certificate, key = secured_kafka.certificates.issue("proxy")
    proxy = starter(*service_flags(secured_kafka, password_file), *listener_flags(str(certificate), str(key)),
                    env={"KSP_UPSTREAM_SASL_PASSWORD_FILE": str(password_file)})
    yield proxy
    starter.stop_all()


def through_proxy(kafka, proxy, user: str) -> dict[str, str]:
    """`user`'s SCRAM settings for the cluster, pointed at the proxy (same CA for both)."""
    return kafka.client_config(user) | {"bootstrap.servers": proxy.bootstrap}


def oauthbearer_through_proxy(kafka, proxy, principal: str) -> dict[str, str]:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(kafka.ca_path),
            "sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": "true",
            "sasl.oauthbearer.config": f"principal={principal}"}


def new_topic(kafka, name: str) -> str:
    admin = AdminClient(kafka.client_config("admin"))
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if topic is not None and topic.error is None and topic.partitions:
            return name
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} did not appear")


def produce(config: dict, topic: str, count: int, prefix: str) -> list[bytes]:
    """Produce `count` values; raises KafkaException with the first delivery error."""
    producer = Producer({**config, "linger.ms": 5, "message.timeout.ms": 15000})
    errors: list[KafkaError] = []
    values = [f"{prefix}-{i}".encode() for i in range(count)]
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, _m: err is not None and errors.append(err))
    remaining = producer.flush(30)
    if errors:
        raise KafkaException(errors[0])
    assert remaining == 0
    return values


def test_alice_shares_and_consumes_her_records_through_a_tls_proxy_from_a_sasl_ssl_cluster(
        secured_kafka, secured_proxy, request):
    stem = request.node.name[:30]
    topic = new_topic(secured_kafka, f"alice-{stem}-{time.monotonic_ns()}")
    share_group, classic_group = f"share-{topic}", f"classic-{topic}"
    for operation in ("write", "read", "describe"):
        grant(secured_kafka, "User:alice", "topic", topic, operation)
    for group in (share_group, classic_group):
        grant(secured_kafka, "User:alice", "group", group, "read")

    alice = through_proxy(secured_kafka, secured_proxy, "alice")
    produced = produce(alice, topic, 100, "alice")

    sharer = share_consumer(secured_proxy.bootstrap, share_group, topic,
                            {k: v for k, v in alice.items() if k != "bootstrap.servers"} | EXPLICIT)
    try:
        messages = poll_until(sharer, len(produced), timeout=40)
        acknowledge_all(sharer, messages)
    finally:
        sharer.close()
    assert sorted(m.value() for m in messages) == sorted(produced)

    # A consumer group beside the share group: forwarded, alice authenticated by the cluster.
    consumer = Consumer(alice | {"group.id": classic_group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen: list[bytes] = []
    deadline = time.monotonic() + 40
    while len(seen) < len(produced) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            seen.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == produced
    log = secured_proxy.log_tail(lines=100_000)
    assert "share groups served" in log
    # The proxy's own password and the clients' never reach its log (SCRAM never sends them at all).
    assert SERVICE_PASSWORD not in log and "alice-secret" not in log


def test_the_cluster_decides_what_a_client_may_do_not_the_proxys_service_user(secured_kafka, secured_proxy):
    """bob has no ACLs: through the proxy (which itself connects as the super user) he is refused."""
    topic = new_topic(secured_kafka, f"bob-refused-{time.monotonic_ns()}")
    with pytest.raises(KafkaException) as refused:
        produce(through_proxy(secured_kafka, secured_proxy, "bob"), topic, 1, "bob")
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_oauthbearer_passes_through_and_its_subject_is_the_principal(secured_kafka, secured_proxy):
    topic = new_topic(secured_kafka, f"oauth-{time.monotonic_ns()}")
    grant(secured_kafka, "User:alice", "topic", topic, "write")
    assert len(produce(oauthbearer_through_proxy(secured_kafka, secured_proxy, "alice"), topic, 5, "token")) == 5
    with pytest.raises(KafkaException) as refused:  # same token kind, a principal without the ACL
        produce(oauthbearer_through_proxy(secured_kafka, secured_proxy, "bob"), topic, 1, "token")
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def run_serve_expecting_exit(kafka, *flags: str, env: dict[str, str], timeout: float = 30.0):
    command = [SHARE_PROXY, "serve", "--upstream", kafka.bootstrap, "--listen", "127.0.0.1:0", "--log-level", "debug",
               *flags]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env},
                            stdin=subprocess.DEVNULL)
    return result, time.monotonic() - started


def test_a_wrong_service_password_ends_start_up_with_one_clear_line_and_no_secret(secured_kafka, tmp_path):
    wrong = "Wr0ng-service-password-7c1"
    secret_file = tmp_path / "wrong-password"
    secret_file.write_text(wrong)
    result, seconds = run_serve_expecting_exit(secured_kafka, *service_flags(secured_kafka, secret_file),
                                               env={"KSP_UPSTREAM_SASL_PASSWORD_FILE": str(secret_file)})
    assert result.returncode == 2, result.stderr[-3000:]
    assert seconds < 20  # fails at once, not after retrying (a loaded CI machine needed 11 s)
    lines = [line for line in result.stderr.splitlines() if line.startswith("share-proxy:")]
    address = secured_kafka.bootstrap
    assert lines == [f"share-proxy: upstream authentication failed as user 'admin' (SCRAM-SHA-512) at {address}: "
                     "Authentication failed during authentication due to invalid credentials with SASL mechanism "
                     "SCRAM-SHA-512"], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # never ready
    assert wrong not in result.stderr and wrong not in result.stdout


def test_a_ca_that_does_not_verify_the_brokers_is_a_clear_tls_error_at_start_up(secured_kafka, password_file,
                                                                                tmp_path):
    other_ca = Pki(tmp_path).ca_path
    result, seconds = run_serve_expecting_exit(secured_kafka, *service_flags(secured_kafka, password_file, ca=other_ca),
                                               env={"KSP_UPSTREAM_SASL_PASSWORD_FILE": str(password_file)})
    assert result.returncode == 2, result.stderr[-3000:]
    assert seconds < 20  # fails at once, not after retrying (a loaded CI machine needed 11 s)
    lines = [line for line in result.stderr.splitlines() if line.startswith("share-proxy:")]
    # The broker sends its CA with its certificate, so OpenSSL finds a root it does not trust
    # ("unable to get local issuer certificate" is what a broker sending only its leaf gives).
    assert lines == [f"share-proxy: TLS handshake with upstream {secured_kafka.bootstrap} failed: certificate verify "
                     "failed: self-signed certificate in certificate chain"], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and SERVICE_PASSWORD not in result.stderr


@pytest.mark.java
def test_java_share_consumer_as_alice_through_the_tls_proxy(secured_kafka, secured_proxy, request):
    """Apache Kafka's KafkaShareConsumer (Java, SASL_SSL with SCRAM, PEM truststore) beside a Java
    producer-consumer: all through the proxy, alice authenticated by the cluster."""
    from integration.java.build import run_driver

    topic = new_topic(secured_kafka, f"java-alice-{time.monotonic_ns()}")
    share_group, classic_group = f"share-{topic}", f"classic-{topic}"
    for operation in ("write", "read", "describe"):
        grant(secured_kafka, "User:alice", "topic", topic, operation)
    for group in (share_group, classic_group):
        grant(secured_kafka, "User:alice", "group", group, "read")
    alice = secured_kafka.java_properties("alice")  # security settings only: bootstrap is the proxy's

    produced = run_driver("produce-consume", bootstrap=secured_proxy.bootstrap, topic=topic, count=60,
                          group=classic_group, timeout_ms=30000, property=alice)
    assert produced["produced"] == 60 and produced["produce_errors"] == 0, produced
    assert produced["consume"]["unique"] == 60 and produced["consume"]["committed"], produced

    summary = run_driver("share-consume", timeout=120, bootstrap=secured_proxy.bootstrap, group=share_group,
                         topic=topic, count=60, timeout_ms=60_000, ack_mode="explicit", commit="sync", property=alice)
    assert "error" not in summary, summary
    assert summary["received"] == 60 and summary["duplicates"] == 0 and summary["ack_errors"] == [], summary
    assert summary["callback_acknowledged"] == 60, summary


def alice_for_python_client(kafka, proxy, group: str, password: str = "alice-secret") -> dict[str, object]:
    """The project's Python client (client/) as alice, SCRAM over TLS to the proxy, passed through."""
    return {"bootstrap.servers": proxy.bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
            "security.protocol": "sasl_ssl", "ssl.ca.location": str(kafka.ca_path),
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": password}


def test_python_client_marks_progress_as_alice_and_groups_cli_sees_it_with_a_command_config(
        secured_kafka, secured_proxy, tmp_path):
    import json

    import client

    topic = new_topic(secured_kafka, f"alice-python-{time.monotonic_ns()}")
    group = f"share-{topic}"
    for operation in ("write", "read", "describe"):
        grant(secured_kafka, "User:alice", "topic", topic, operation)
    grant(secured_kafka, "User:alice", "group", group, "read")
    produced = produce(through_proxy(secured_kafka, secured_proxy, "alice"), topic, 5, "python")

    consumer = client.ShareConsumer(alice_for_python_client(secured_kafka, secured_proxy, group))
    try:
        consumer.subscribe([topic])
        messages: list = []
        deadline = time.monotonic() + 40
        while len(messages) < len(produced) and time.monotonic() < deadline:
            messages += consumer.poll(1.0)
        assert sorted(m.value() for m in messages) == sorted(produced)
        for message in messages:
            consumer.mark_in_progress(message)
        consumer.flush_progress(timeout=15)

        # Kafka's own kind of --command-config (Java properties, PEM truststore, JAAS line) as alice.
        properties = tmp_path / "alice.properties"
        properties.write_text(
            "security.protocol=SASL_SSL\nssl.truststore.type=PEM\n"
            f"ssl.truststore.location={secured_kafka.ca_path}\nsasl.mechanism=SCRAM-SHA-512\n"
            'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="alice" password="alice-secret";\n')
        described = subprocess.run(
            [SHARE_PROXY, "groups", "--bootstrap-server", secured_proxy.bootstrap, "--describe", "--group", group,
             "--in-flight", "--state", "IN_PROGRESS", "--format", "json", "--command-config", str(properties)],
            capture_output=True, text=True, timeout=60)
        assert described.returncode == 0, described.stderr
        ranges = json.loads(described.stdout)["ranges"]
        assert sum(r["records"] for r in ranges) == len(produced)
        assert "alice-secret" not in described.stdout + described.stderr

        for message in messages:
            consumer.acknowledge(message)
        results = consumer.commit_sync(timeout=15)
        assert results and all(error is None for error in results.values()), results
    finally:
        consumer.close()


def test_python_client_with_a_wrong_password_gets_a_non_retriable_authentication_error(secured_kafka, secured_proxy):
    import client

    with pytest.raises(client.KafkaException) as refused:
        client.ShareConsumer(alice_for_python_client(secured_kafka, secured_proxy, "any-group", password="guess-42"))
    error = refused.value.args[0]
    assert error.name() == "_AUTHENTICATION" and not error.retriable(), error.str()
    assert "alice" in error.str() and "guess-42" not in error.str()
