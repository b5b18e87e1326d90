"""Bad input on one connection closes that connection only.

Given the proxy in front of a real broker and a confluent_kafka producer and
consumer working through it on their own connections, when other connections
send random garbage, a truncated frame, an oversized size prefix or a header
with an unknown API key, then the proxy closes each of those connections, logs
and counts it, and the producer and consumer carry on without an error.
"""

from __future__ import annotations

import random
import socket
import threading
import time

from confluent_kafka import Consumer, KafkaError, Producer

from integration.kafka_fixtures import ProxyProcess

CLOSE_TIMEOUT = 10.0


def connect(proxy: ProxyProcess, port: int | None = None) -> socket.socket:
    sock = socket.create_connection((proxy.host, port or proxy.port), timeout=CLOSE_TIMEOUT)
    return sock


def closed_by_proxy(sock: socket.socket) -> bool:
    """True if the proxy closes the connection (EOF or reset) within the timeout."""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
            # The proxy must never answer bad input.
            return False
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def send_random_garbage(proxy: ProxyProcess) -> bool:
    sock = connect(proxy)
    sock.sendall(random.Random(932).randbytes(4096))
    sock.shutdown(socket.SHUT_WR)
    return closed_by_proxy(sock)


def send_truncated_frame(proxy: ProxyProcess) -> bool:
    # A Metadata v12 request announced as 100 bytes, cut off after 14, then the client goes away.
    sock = connect(proxy)
    sock.sendall((100).to_bytes(4, "big") + b"\x00\x03\x00\x0c\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00")
    sock.shutdown(socket.SHUT_WR)
    return closed_by_proxy(sock)


def send_oversized_prefix(proxy: ProxyProcess) -> bool:
    # 2 GiB announced: refused as soon as the four prefix bytes arrive, nothing buffered for it.
    sock = connect(proxy)
    sock.sendall(b"\x7f\xff\xff\xff" + b"\x00" * 64)
    return closed_by_proxy(sock)


def send_unknown_api_key(proxy: ProxyProcess) -> bool:
    sock = connect(proxy)
    body = b"\x7f\x00\x00\x00\x00\x00\x00\x01\xff\xff"
    sock.sendall(len(body).to_bytes(4, "big") + body)
    return closed_by_proxy(sock)


class Traffic(threading.Thread):
    """Produces one keyed record at a time through the proxy until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.sent = 0
        self.errors: list[KafkaError] = []

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "compression.type": "zstd"})

        def on_delivery(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                self.errors.append(error)

        while not self.stop.is_set() or self.sent < 200:
            producer.produce(self.topic, key=b"k%d" % self.sent, value=b"v%d" % self.sent, on_delivery=on_delivery)
            self.sent += 1
            producer.poll(0.005)
        if producer.flush(30):
            self.errors.append(KafkaError(KafkaError._MSG_TIMED_OUT))


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> set[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bad-input-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    keys: set[bytes] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(keys) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            keys.add(message.key())
    finally:
        consumer.close()
    return keys


def test_bad_input_closes_only_its_own_connection(proxy: ProxyProcess, topic: str) -> None:
    traffic = Traffic(proxy.bootstrap, topic)
    traffic.start()
    try:
        time.sleep(1.0)  # the producer has connected and is mid-stream
        outcomes = {
            "random garbage": send_random_garbage(proxy),
            "truncated frame": send_truncated_frame(proxy),
            "oversized size prefix": send_oversized_prefix(proxy),
            "unknown api key": send_unknown_api_key(proxy),
        }
        time.sleep(0.5)
    finally:
        traffic.stop.set()
        traffic.join(timeout=60)

    assert outcomes == dict.fromkeys(outcomes, True), "the proxy must close every bad connection"
    assert not traffic.errors
    assert proxy.process is not None and proxy.process.poll() is None, "the proxy must stay up"
    assert len(consume_all(proxy.bootstrap, topic, traffic.sent)) == traffic.sent
    log = proxy.log_text()
    for reason in ("bad_size_prefix", "truncated_frame", "bad_header"):
        assert reason in log


def test_bad_input_on_a_broker_port_leaves_the_proxy_serving(proxy: ProxyProcess, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=10)
    broker_ports = [broker.port for broker in metadata.brokers.values()]
    assert broker_ports and proxy.port not in broker_ports
    for port in broker_ports:
        sock = connect(proxy, port)
        sock.sendall(b"\xff\xff\xff\xf0garbage")
        assert closed_by_proxy(sock)
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    producer.produce(topic, key=b"after", value=b"attack")
    assert producer.flush(30) == 0
    assert b"after" in consume_all(proxy.bootstrap, topic, expected=1)
