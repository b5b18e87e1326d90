"""The Python client (client.ShareConsumer) beside confluent_kafka.ShareConsumer, through the proxy.

One run, one broker (share groups off), one `share-proxy serve` in front of it, one topic
(default 100,000 x 1 KiB over 4 partitions, produced once):

* **records/s** of each consumer consuming the whole topic alone in a fresh group (implicit
  acknowledgement: each poll accepts the previous one's records), measured from the first record
  to the last; the ratio python/confluent is printed;
* **cost of marking progress**: the Python client again, explicit mode, without and with a
  mark_in_progress + flush_progress per record batch returned by poll (every record of the poll
  marked, then accepted), and the MarkInProgress round trip (flush_progress) p50 / p99.

Not a test: it prints a table (and --json writes the numbers).

    .venv/bin/python -m integration.bench.client_bench --records 100000 --size 1024 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import ShareConsumer as ConfluentShareConsumer

import client
from integration.bench.passthrough import Target, produce
from integration.kafka_fixtures import ProxyProcess, create_topics, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka

IDLE_STOP_S = 5.0


def consume_confluent(bootstrap: str, topic: str, records: int) -> tuple[float, int]:
    """(seconds from first to last record, records) for a confluent_kafka.ShareConsumer."""
    share = ConfluentShareConsumer({"bootstrap.servers": bootstrap, "group.id": unique_name("bench-confluent")})
    share.subscribe([topic])
    return _drain(lambda: [m for m in share.poll(1.0) if m.error() is None], records, share.close)


def consume_python(bootstrap: str, topic: str, records: int) -> tuple[float, int]:
    share = client.ShareConsumer({"bootstrap.servers": bootstrap, "group.id": unique_name("bench-python")})
    share.subscribe([topic])
    return _drain(lambda: share.poll(1.0), records, share.close)


def _drain(poll, records: int, close) -> tuple[float, int]:
    got = 0
    first = last = None
    idle_since = time.monotonic()
    try:
        while got < records and time.monotonic() - idle_since < IDLE_STOP_S:
            batch = poll()
            if batch:
                now = time.monotonic()
                first = first or now
                last = now
                got += len(batch)
                idle_since = now
    finally:
        close()
    return ((last - first) if first and last else 0.0), got


def consume_python_marking(bootstrap: str, topic: str, records: int, mark: bool) -> tuple[float, int, list[float]]:
    """Explicit mode; with ``mark`` every record is marked and the marks flushed once per poll,
    before the records are accepted. Returns (seconds, records, flush round trips in seconds)."""
    share = client.ShareConsumer({"bootstrap.servers": bootstrap, "group.id": unique_name("bench-mark"),
                                  "share.acknowledgement.mode": "explicit"})
    share.subscribe([topic])
    round_trips: list[float] = []
    got = 0
    first = last = None
    idle_since = time.monotonic()
    try:
        while got < records and time.monotonic() - idle_since < IDLE_STOP_S:
            batch = share.poll(1.0)
            if not batch:
                continue
            now = time.monotonic()
            first = first or now
            if mark:
                for message in batch:
                    share.mark_in_progress(message)
                started = time.perf_counter()
                share.flush_progress()
                round_trips.append(time.perf_counter() - started)
            for message in batch:
                share.acknowledge(message)
            got += len(batch)
            last = idle_since = time.monotonic()
    finally:
        share.close()
    return ((last - first) if first and last else 0.0), got, round_trips


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    results: dict[str, object] = {"records": args.records, "size": args.size, "partitions": args.partitions}
    with tempfile.TemporaryDirectory(prefix="client-bench-") as scratch:
        log_dir = Path(scratch)
        with LocalKafka(version=args.kafka_version, share_groups=False, data_dir=log_dir / "kafka") as kafka, \
                ProxyProcess(upstream=kafka.bootstrap, log_path=log_dir / "proxy.log",
                             extra_args=("--share-auto-offset-reset", "earliest")) as proxy:
            topic = unique_name("client-bench")
            create_topics(kafka.bootstrap, [topic], partitions=args.partitions)
            produce(Target("direct", kafka.bootstrap), topic, args.partitions, args.records, args.size, "none")
            rows = []
            for name, run in (("confluent_kafka.ShareConsumer", consume_confluent),
                              ("client.ShareConsumer", consume_python)):
                seconds, got = run(proxy.bootstrap, topic, args.records)
                rows.append((name, got, seconds, got / seconds if seconds else 0.0))
                results[name] = {"records": got, "seconds": round(seconds, 3), "records_per_s": round(got / seconds)}
            ratio = rows[1][3] / rows[0][3] if rows[0][3] else float("nan")
            results["ratio_python_to_confluent"] = round(ratio, 3)
            plain_s, plain_got, _ = consume_python_marking(proxy.bootstrap, topic, args.records, mark=False)
            mark_s, mark_got, trips = consume_python_marking(proxy.bootstrap, topic, args.records, mark=True)
            results["explicit_no_marks"] = {"records": plain_got, "records_per_s": round(plain_got / plain_s)}
            results["explicit_mark_every_record"] = {
                "records": mark_got, "records_per_s": round(mark_got / mark_s), "flushes": len(trips),
                "mark_round_trip_p50_ms": round(percentile(trips, 0.5) * 1000, 2),
                "mark_round_trip_p99_ms": round(percentile(trips, 0.99) * 1000, 2),
                "mark_round_trip_mean_ms": round(statistics.fmean(trips) * 1000, 2) if trips else None}

    print(f"\n{args.records} records x {args.size} B, {args.partitions} partitions, through share-proxy "
          f"(Apache Kafka {args.kafka_version})")
    print(f"{'consumer':34} {'records':>8} {'seconds':>8} {'records/s':>10}")
    for name, got, seconds, rate in rows:
        print(f"{name:34} {got:8d} {seconds:8.2f} {rate:10.0f}")
    print(f"ratio client / confluent_kafka: {ratio:.2f}")
    marked = results["explicit_mark_every_record"]
    print(f"client explicit, no marks:          {results['explicit_no_marks']['records_per_s']:>8} records/s")
    print(f"client explicit, mark every record: {marked['records_per_s']:>8} records/s "
          f"({marked['flushes']} MarkInProgress, p50 {marked['mark_round_trip_p50_ms']} ms, "
          f"p99 {marked['mark_round_trip_p99_ms']} ms)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
