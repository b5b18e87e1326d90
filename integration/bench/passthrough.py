"""Pass-through throughput: confluent-kafka directly against the broker vs through the proxy.

Starts a local Kafka (LocalKafka) and `share-proxy serve` in front of it, then, in the same
run, produces N records of S bytes directly and through the proxy (each to its own topic),
and consumes one topic both ways (assigned partitions, no group, from the beginning).
Prints records/s, MB/s and the proxy/direct ratio per operation (median of --repeat runs).

    .venv/bin/python -m integration.bench.passthrough --records 200000 --size 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from integration.kafka_fixtures import ProxyProcess, create_topics, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka


@dataclass(frozen=True, slots=True)
class Measurement:
    path: str
    operation: str
    records: int
    payload_bytes: int
    seconds: float

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        return self.payload_bytes / self.seconds / 1e6


def produce(bootstrap: str, topic: str, records: int, size: int, compression: str) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": compression,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
        }
    )
    value = os.urandom(size)
    failures = 0

    def on_delivery(error: object, _message: object) -> None:
        nonlocal failures
        if error is not None:
            failures += 1

    started = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=str(index).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if index % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0 or failures:
        raise RuntimeError(f"produce to {topic} via {bootstrap}: {failures} failed deliveries")
    return time.perf_counter() - started


def consume(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("bench-unused"),  # required by the client; offsets are not committed
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in range(partitions)])
    received = 0
    started = time.perf_counter()
    deadline = started + 300
    try:
        while received < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"consumed only {received}/{records} from {topic} via {bootstrap}")
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error() is None:
                    received += 1
        return time.perf_counter() - started
    finally:
        consumer.close()


def run(args: argparse.Namespace) -> list[Measurement]:
    measurements: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="ksp-bench-") as scratch:
        with LocalKafka(version=args.kafka_version, heap=args.heap) as kafka:
            proxy_args = ("--log-level", "warning")
            with ProxyProcess(upstream=kafka.bootstrap, log_path=Path(scratch) / "proxy.log", extra_args=proxy_args) as proxy:
                paths = {"direct": kafka.bootstrap, "proxy": proxy.bootstrap}
                print(f"Kafka {kafka.version} at {kafka.bootstrap}; proxy at {proxy.bootstrap}", flush=True)
                warmup = min(args.records, 20_000)
                for name, bootstrap in paths.items():
                    [topic] = create_topics(kafka.bootstrap, [unique_name(f"warmup-{name}")], args.partitions)
                    produce(bootstrap, topic, warmup, args.size, args.compression)
                    consume(bootstrap, topic, args.partitions, warmup)
                for round_number in range(args.repeat):
                    topics = dict(
                        zip(
                            paths,
                            create_topics(
                                kafka.bootstrap,
                                [unique_name(f"bench-{name}") for name in paths],
                                args.partitions,
                            ),
                        )
                    )
                    # Alternate which path goes first so neither always meets a warmer broker.
                    order = list(paths) if round_number % 2 == 0 else list(reversed(paths))
                    for name in order:
                        seconds = produce(paths[name], topics[name], args.records, args.size, args.compression)
                        measurements.append(Measurement(name, "produce", args.records, args.records * args.size, seconds))
                    # Both paths read the same records: the topic produced directly.
                    for name in order:
                        seconds = consume(paths[name], topics["direct"], args.partitions, args.records)
                        measurements.append(Measurement(name, "consume", args.records, args.records * args.size, seconds))
                    print(f"round {round_number + 1}/{args.repeat} done", flush=True)
    return measurements


def report(measurements: list[Measurement], args: argparse.Namespace) -> str:
    lines = [
        f"{args.records} records x {args.size} B, {args.partitions} partitions, compression={args.compression}, "
        f"median of {args.repeat} run(s), Kafka {args.kafka_version}",
        "",
        "| operation | path | records/s | MB/s | runs (records/s) |",
        "|---|---|---:|---:|---|",
    ]
    medians: dict[tuple[str, str], float] = {}
    for operation in ("produce", "consume"):
        for path in ("direct", "proxy"):
            runs = [m for m in measurements if m.operation == operation and m.path == path]
            rate = statistics.median(m.records_per_second for m in runs)
            throughput = statistics.median(m.megabytes_per_second for m in runs)
            medians[(operation, path)] = rate
            each = ", ".join(f"{m.records_per_second:,.0f}" for m in runs)
            lines.append(f"| {operation} | {path} | {rate:,.0f} | {throughput:,.1f} | {each} |")
    lines.append("")
    for operation in ("produce", "consume"):
        ratio = medians[(operation, "proxy")] / medians[(operation, "direct")]
        lines.append(f"{operation}: proxy/direct = {ratio:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kafka-version", default=os.environ.get("KSP_KAFKA_VERSION", DEFAULT_VERSION))
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="value size in bytes")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--heap", default="1g", help="broker -Xmx")
    args = parser.parse_args()
    print(report(run(args), args))


if __name__ == "__main__":
    main()
