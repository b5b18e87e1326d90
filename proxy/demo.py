"""`make demo`: a queue on a Kafka cluster that has no share groups of its own.

Starts a local single-node Apache Kafka (share groups disabled) and the proxy in front of it,
then, through the proxy only:

1. runs three share consumers on ONE partition: records are spread over them, each record is
   delivered to one consumer; one record is released (redelivered with delivery count 2), one is
   rejected (never delivered again);
2. reads the same topic with an ordinary consumer group (pass-through traffic is untouched);
3. restarts the proxy: the share group's state survives (nothing accepted or rejected comes
   back), and new records continue the queue.

Everything is shut down at the end; the exit code is 0 only if every check held.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from confluent_kafka import Consumer, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.localkafka import LocalKafka

TOPIC = "orders"
GROUP = "order-workers"
QUIET = {"log_level": 0}  # librdkafka: keep its connection chatter out of the demo output


def say(text: str = "") -> None:
    print(text, flush=True)


class ProxyProcess:
    """`share-proxy serve` as a child process (the way an operator runs it)."""

    def __init__(self, upstream: str, state_topic: str, log_path: Path, port: int = 0) -> None:
        self.args = [
            str(Path(sys.executable).with_name("share-proxy")), "serve",
            "--upstream", upstream,
            "--listen", f"127.0.0.1:{port}",
            "--state-topic", state_topic,
            "--share-auto-offset-reset", "earliest",
        ]
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.bootstrap = ""

    def start(self) -> str:
        log = open(self.log_path, "a")
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line.startswith("ready bootstrap="):
            raise RuntimeError(f"proxy did not start (see {self.log_path})")
        self.bootstrap = line.split("=", 1)[1].strip()
        return self.bootstrap

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def share_consumer(bootstrap: str, name: str) -> ShareConsumer:
    consumer = ShareConsumer({
        "bootstrap.servers": bootstrap,
        "group.id": GROUP,
        "client.id": name,
        "share.acknowledgement.mode": "explicit",
        **QUIET,
    })
    consumer.subscribe([TOPIC])
    return consumer


def run_queue(bootstrap: str, expected: int, decide, produce) -> dict[str, list[tuple[int, int, str]]]:
    """Three consumers (one thread each) on one partition while `produce()` trickles records in.

    ``decide(offset, delivery_count)`` picks ACCEPT, RELEASE or REJECT for each delivery.
    """
    from confluent_kafka import AcknowledgeType

    seen: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    finished: set[int] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def work(name: str) -> None:
        consumer = share_consumer(bootstrap, name)
        try:
            while not stop.is_set():
                for message in consumer.poll(0.5) or []:
                    if message.error():
                        continue
                    action = decide(message.offset(), message.delivery_count())
                    consumer.acknowledge(message, getattr(AcknowledgeType, action))
                    with lock:
                        seen[name].append((message.offset(), message.delivery_count(), action))
                        if action != "RELEASE":
                            finished.add(message.offset())
                consumer.commit_sync()
        finally:
            consumer.close()

    workers = [threading.Thread(target=work, args=(name,)) for name in ("worker-a", "worker-b", "worker-c")]
    for worker in workers:
        worker.start()
    try:
        time.sleep(3)  # let the three members join before records arrive
        produce()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(finished) >= expected:
                    break
            time.sleep(0.2)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    return seen


def trickle(bootstrap: str, first: int, count: int) -> None:
    """Produce one record at a time, so waiting consumers take turns."""
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for i in range(first, first + count):
        producer.produce(TOPIC, key=f"order-{i}", value=f"order #{i}".encode(), headers={"source": b"demo"})
        producer.flush(30)
        time.sleep(0.15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kafka-version", default=os.environ.get("KSP_KAFKA_VERSION", "4.4.0"))
    args = parser.parse_args(argv)
    checks: list[tuple[str, bool]] = []
    work = Path(tempfile.mkdtemp(prefix="share-proxy-demo-"))

    say(f"== Starting Apache Kafka {args.kafka_version} (KRaft, single node, share groups disabled)")
    with LocalKafka(version=args.kafka_version) as kafka:
        say(f"   broker at {kafka.bootstrap}")
        proxy = ProxyProcess(kafka.bootstrap, "__demo_share_state", work / "proxy.log")
        try:
            bootstrap = proxy.start()
            say(f"== Proxy ready at {bootstrap} (log: {proxy.log_path})")

            admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
            admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(30)
            metadata = admin.list_topics(timeout=10)
            brokers = sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values())
            say(f"   topic '{TOPIC}' created through the proxy; clients see brokers {brokers} (all proxy ports)")
            checks.append(("metadata names only proxy endpoints", f":{kafka.port}" not in " ".join(brokers)))

            say(f"\n== 1. A queue: three share consumers in group '{GROUP}' on ONE partition")
            say("   12 orders arrive one by one; offset 3 is released on its first delivery,")
            say("   offset 7 is rejected, the rest accepted")

            def decide(offset: int, delivery_count: int) -> str:
                if offset == 3 and delivery_count == 1:
                    return "RELEASE"
                if offset == 7:
                    return "REJECT"
                return "ACCEPT"

            seen = run_queue(bootstrap, 12, decide, lambda: trickle(bootstrap, 0, 12))
            for name in sorted(seen):
                rows = ", ".join(f"{o}{'(x%d)' % d if d > 1 else ''}:{a.lower()}" for o, d, a in seen[name])
                say(f"   {name}: {rows}")
            deliveries = [(o, d, a) for rows in seen.values() for o, d, a in rows]
            redelivered = [d for o, d, a in deliveries if o == 3 and a == "ACCEPT"]
            say(f"   offset 3 came back with delivery count {redelivered[0] if redelivered else '-'}")
            checks.append(("released record redelivered with delivery count 2", redelivered == [2]))
            checks.append(("rejected record delivered once", sum(1 for o, _, _ in deliveries if o == 7) == 1))
            checks.append(("every record finished exactly once",
                           sorted(o for o, _, a in deliveries if a != "RELEASE") == list(range(12))))
            checks.append(("more than one consumer got work", sum(1 for rows in seen.values() if rows) >= 2))

            say("\n== 2. Pass-through: an ordinary consumer group reads the same topic")
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "audit", "auto.offset.reset": "earliest",
                                 **QUIET})
            consumer.subscribe([TOPIC])
            plain = []
            until = time.monotonic() + 30
            while len(plain) < 12 and time.monotonic() < until:
                message = consumer.poll(0.5)
                if message is not None and not message.error():
                    plain.append(message.offset())
            consumer.close()
            say(f"   consumer group 'audit' read {len(plain)} records")
            checks.append(("consumer group read all 12", len(plain) == 12))

            say("\n== 3. Restart the proxy: share state lives in Kafka, so nothing finished comes back")
            proxy.stop()
            bootstrap = proxy.start()
            say(f"   proxy restarted at {bootstrap}")
            seen = run_queue(bootstrap, 3, lambda offset, count: "ACCEPT", lambda: trickle(bootstrap, 12, 3))
            after = sorted(o for rows in seen.values() for o, _, _ in rows)
            say(f"   after the restart the group received offsets {after} (the 3 new orders only)")
            checks.append(("restart kept the state (only new records delivered)", after == [12, 13, 14]))
        finally:
            code = proxy.stop()
            say(f"\n== Proxy stopped (exit code {code}); stopping Kafka")

    say("\n== Checks")
    for description, ok in checks:
        say(f"   [{'ok' if ok else 'FAILED'}] {description}")
    failed = [d for d, ok in checks if not ok]
    say("\nDemo finished: " + ("all checks held." if not failed else f"{len(failed)} check(s) failed."))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
