"""The proxy's TLS listeners with real clients, in front of the plain session broker.

confluent-kafka's Producer, classic Consumer and ShareConsumer speak SSL to the proxy (the
broker behind it is PLAINTEXT: client-side TLS is independent of the upstream side). Bad input
on the TLS listener -- garbage, a handshake that never finishes -- costs only that connection;
with mTLS required, a client without a trusted certificate cannot connect.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from integration.security.tls_fixtures import Pki, listener_flags, tls_client
from integration.share import conftest as share_fixtures
from integration.share.conftest import (
    EXPLICIT,
    ProxyStarter,
    acknowledge_all,
    metric,
    poll_until,
    scrape_metrics,
    share_consumer,
    wait_until,
)
from proxy.localkafka import free_port

pytestmark = pytest.mark.integration

# The share-group fixtures, used here by name.
create_topic = share_fixtures.create_topic
names = share_fixtures.names

HANDSHAKE_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def starter(kafka, tmp_path_factory):
    starter = ProxyStarter(kafka.bootstrap, tmp_path_factory.mktemp("tls-proxy"))
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def tls_proxy(starter, pki):
    """A proxy whose listeners serve TLS (certificate for 127.0.0.1), with metrics."""
    metrics_port = free_port()
    proxy = starter(*listener_flags(*pki.issue("proxy", "127.0.0.1", "localhost"),
                                    "--listener-ssl-handshake-timeout-ms", str(HANDSHAKE_TIMEOUT_MS),
                                    "--metrics-port", str(metrics_port)))
    proxy.metrics_port = metrics_port
    return proxy


def produce_through(config: dict, topic: str, count: int, prefix: str = "v") -> list[bytes]:
    producer = Producer({**config, "linger.ms": 5})
    values = [f"{prefix}{i}".encode() for i in range(count)]
    failures: list[str] = []
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, _m: err and failures.append(str(err)))
    assert producer.flush(30) == 0 and not failures, failures[:3]
    return values


def test_producer_consumer_group_and_share_consumer_work_through_a_tls_proxy(tls_proxy, pki, create_topic, names):
    topic = create_topic(names.topic)
    client = tls_client(tls_proxy.bootstrap, pki.ca_path)
    produced = produce_through(client, topic, 200)

    consumer = Consumer({**client, "group.id": names.another("classic"), "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(seen) < len(produced) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            seen.append(message.value())
    consumer.close()
    assert seen == produced

    sharer = share_consumer(tls_proxy.bootstrap, names.group, topic,
                            {"security.protocol": "SSL", "ssl.ca.location": pki.ca_path, **EXPLICIT})
    try:
        messages = poll_until(sharer, len(produced), timeout=30)
        acknowledge_all(sharer, messages)
    finally:
        sharer.close()
    assert sorted(m.value() for m in messages) == sorted(produced)
    assert {m.delivery_count() for m in messages} == {1}


def _raw(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):  # a TLS alert may come before the close
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_garbage_and_a_stalled_handshake_cost_only_their_connection(tls_proxy, pki, create_topic, names):
    topic = create_topic(names.topic)
    before = scrape_metrics(tls_proxy.metrics_port)

    def failures(samples, reason: str) -> float:
        return metric(samples, "ksp_tls_handshake_failures_total", listener="bootstrap", reason=reason) or 0.0

    silent = _raw(tls_proxy.bootstrap)  # connects and never says a word
    stalled = _raw(tls_proxy.bootstrap)
    stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello that stops
    started = time.monotonic()
    for garbage in (b"\x00\x00\x00\x15\x00\x12\x00\x00\x00\x00\x00\x01\x00\x03abc",  # plaintext Kafka
                    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 8):
        bad = _raw(tls_proxy.bootstrap)
        bad.sendall(garbage)
        assert _closed_by_peer(bad, 10), "the proxy kept a connection that sent garbage"
        bad.close()

    # Served while the two handshakes hang: TLS clients, a share consumer included.
    client = tls_client(tls_proxy.bootstrap, pki.ca_path)
    produced = produce_through(client, topic, 20)
    sharer = share_consumer(tls_proxy.bootstrap, names.group, topic,
                            {"security.protocol": "SSL", "ssl.ca.location": pki.ca_path, **EXPLICIT})
    try:
        messages = poll_until(sharer, len(produced), timeout=30)
        acknowledge_all(sharer, messages)
    finally:
        sharer.close()

    for hanging in (silent, stalled):
        assert _closed_by_peer(hanging, HANDSHAKE_TIMEOUT_MS / 1000 + 10)
        hanging.close()
    assert time.monotonic() - started >= HANDSHAKE_TIMEOUT_MS / 1000 - 0.1
    wait_until(lambda: failures(scrape_metrics(tls_proxy.metrics_port), "timeout") >= failures(before, "timeout") + 2,
               10, "two handshake timeouts counted")
    after = scrape_metrics(tls_proxy.metrics_port)
    assert failures(after, "protocol") >= failures(before, "protocol") + 3
    assert tls_proxy.process is not None and tls_proxy.process.poll() is None  # still running
    log = tls_proxy.log_tail(lines=400)
    assert "TLS handshake failed; connection closed" in log


def test_mtls_required_refuses_clients_without_a_trusted_certificate(starter, pki, create_topic, names, tmp_path):
    topic = create_topic(names.topic)
    metrics_port = free_port()
    proxy = starter(*listener_flags(*pki.issue("mtls-proxy", "127.0.0.1"),
                                    "--listener-ssl-client-auth", "required", "--listener-ssl-ca-location",
                                    pki.ca_path, "--metrics-port", str(metrics_port)))
    stranger = Pki(tmp_path)  # another CA entirely
    anonymous = tls_client(proxy.bootstrap, pki.ca_path)
    untrusted = tls_client(proxy.bootstrap, pki.ca_path, stranger.issue("stranger"))
    for refused in (anonymous, untrusted):
        admin = AdminClient({**refused, "socket.timeout.ms": 3000})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)
    samples = scrape_metrics(metrics_port)
    assert (metric(samples, "ksp_tls_handshake_failures_total", listener="bootstrap", reason="no_certificate") or 0) >= 1
    assert (metric(samples, "ksp_tls_handshake_failures_total", listener="bootstrap", reason="bad_certificate") or 0) >= 1

    trusted = tls_client(proxy.bootstrap, pki.ca_path, pki.issue("app"))
    assert len(produce_through(trusted, topic, 5)) == 5
    assert topic in AdminClient(trusted).list_topics(timeout=10).topics


def test_sighup_reloads_the_listener_certificate_for_new_connections(starter, pki, create_topic, names, tmp_path):
    topic = create_topic(names.topic)
    certificate, key = pki.issue("sighup-proxy", "127.0.0.1")
    metrics_port = free_port()
    proxy = starter(*listener_flags(certificate, key, "--listener-ssl-reload-interval-ms", "0",
                                    "--metrics-port", str(metrics_port)))
    old_ca = tls_client(proxy.bootstrap, pki.ca_path)
    assert len(produce_through(old_ca, topic, 3, "before")) == 3

    renewed = Pki(tmp_path)  # a renewal from another CA, written over the configured files
    new_certificate, new_key = renewed.issue("renewed", "127.0.0.1")
    Path(certificate).write_bytes(Path(new_certificate).read_bytes())
    Path(key).write_bytes(Path(new_key).read_bytes())
    # Interval 0: nothing is reloaded until SIGHUP.
    assert topic in AdminClient(old_ca).list_topics(timeout=10).topics

    proxy.process.send_signal(signal.SIGHUP)
    new_ca = tls_client(proxy.bootstrap, renewed.ca_path)
    wait_until(lambda: (metric(scrape_metrics(metrics_port), "ksp_tls_reloads_total", result="success") or 0) >= 1,
               10, "the reload after SIGHUP")
    assert len(produce_through(new_ca, topic, 3, "after")) == 3
    with pytest.raises(KafkaException):  # the old CA no longer verifies the proxy
        AdminClient({**old_ca, "socket.timeout.ms": 3000}).list_topics(timeout=5)
    assert proxy.process.poll() is None  # SIGHUP does not stop the proxy
