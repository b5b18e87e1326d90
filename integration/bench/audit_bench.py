"""Throughput of `share-proxy spark audit` in local mode on a generated event log.

One local broker (share groups off), one event topic filled with --events events encoded by the
codec (--per-record events per event-topic record, realistic histories: acquired, then accepted, or
released and acquired again, or rejected and archived), then `share-proxy spark audit` as a
subprocess on local[*]. Prints the events/s of the audit (wall time of the CLI, JVM start included).
Not a test; numbers go to docs/benchmarks.md.

    .venv/bin/python -m integration.bench.audit_bench --events 10000000 --per-record 100
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from codec.share_events import ArchiveReason, EventKind, ShareEvent, ShareEventBatch, encode_event_batch
from proxy.localkafka import DEFAULT_VERSION, LocalKafka

SHARE_PROXY = str(Path(sys.executable).with_name("share-proxy"))


def histories(first_offset: int, start_ms: int, rng: random.Random) -> list[ShareEvent]:
    """The events of a 10-offset range: acquired, then mostly accepted, sometimes released and
    redelivered, rejected and archived."""
    last = first_offset + 9
    member = f"member-{rng.randrange(8)}"
    t = start_ms
    events = [ShareEvent(EventKind.ACQUIRED, first_offset, last, member, 1, timestamp_ms=t)]
    t += rng.randrange(1, 500)
    roll = rng.random()
    if roll < 0.8:
        events.append(ShareEvent(EventKind.ACCEPTED, first_offset, last, member, 1, timestamp_ms=t))
    elif roll < 0.9:
        events += [ShareEvent(EventKind.RELEASED, first_offset, last, member, 1, timestamp_ms=t),
                   ShareEvent(EventKind.ACQUIRED, first_offset, last, member, 2, timestamp_ms=t + 5),
                   ShareEvent(EventKind.ACCEPTED, first_offset, last, member, 2, timestamp_ms=t + 50)]
    else:
        events += [ShareEvent(EventKind.REJECTED, first_offset, last, member, 1, timestamp_ms=t),
                   ShareEvent(EventKind.ARCHIVED, first_offset, last, None, 1, ArchiveReason.REJECTED, t)]
    return events


def generate(bootstrap: str, topic: str, total_events: int, per_record: int, partitions: int) -> int:
    """Produce about ``total_events`` events; returns the exact count."""
    rng = random.Random(11)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4",
                         "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_000_000})
    try:
        return _produce(producer, topic, total_events, per_record, partitions, rng)
    finally:
        producer.close()  # before the broker stops: a live producer would log connection failures


def _produce(producer: Producer, topic: str, total_events: int, per_record: int, partitions: int,
             rng: random.Random) -> int:
    topic_id = uuid.uuid4()
    produced = 0
    next_offset = [0] * partitions
    start_ms = int(time.time() * 1000) - 3_600_000
    while produced < total_events:
        partition = rng.randrange(partitions)
        events: list[ShareEvent] = []
        while len(events) < per_record:
            events += histories(next_offset[partition], start_ms + produced // 100, rng)
            next_offset[partition] += 10
        batch = ShareEventBatch("bench-group", topic_id, "bench-topic", partition, tuple(events))
        key, value = encode_event_batch(batch)
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        produced += len(events)
    assert producer.flush(120) == 0
    return produced


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    # The admin client lives only here (librdkafka keeps connecting while it lives, past the broker's stop).
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--per-record", type=int, default=100, help="events per event-topic record")
    parser.add_argument("--partitions", type=int, default=4, help="event-topic partitions")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as scratch, \
            LocalKafka(version=args.kafka_version, share_groups=False, data_dir=Path(scratch) / "kafka") as kafka:
        topic = "__share_group_events_bench"
        create_topic(kafka.bootstrap, topic, args.partitions)
        started = time.monotonic()
        events = generate(kafka.bootstrap, topic, args.events, args.per_record, args.partitions)
        print(f"generated {events} events in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        result = subprocess.run([SHARE_PROXY, "spark", "audit", "--bootstrap-server", kafka.bootstrap,
                                 "--output", str(Path(scratch) / "audit"), "--events-topic", topic,
                                 "--state-topic", "__share_proxy_state_absent", "--master", args.master],
                                capture_output=True, text=True)
        wall = time.monotonic() - started
        if result.returncode != 0:
            print(result.stdout[-2000:], result.stderr[-4000:], file=sys.stderr)
            return 1
        print(result.stdout)
        print(f"audit: {events} events in {wall:.1f} s wall ({events / wall:,.0f} events/s, JVM start included), "
              f"master {args.master}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
