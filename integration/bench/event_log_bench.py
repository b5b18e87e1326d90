"""Acknowledgement latency and throughput with the share-group event log on vs off, side by side.

One broker (share groups off), two `share-proxy serve` in front of it: one with the event log on
(the default), one with ``--share-events-enable false``. Rounds alternate between them so machine
noise hits both alike; each run is a confluent_kafka.ShareConsumer in explicit mode, alone in a fresh
group, consuming a fresh topic: poll, acknowledge every record (ACCEPT), commit_sync (one
ShareAcknowledge round trip, answered once the acceptance is durable). Reported per proxy: records/s
from the first record to the last, and the commit_sync p50 / p99 over all rounds; then the ratios
on/off and the events the event-log proxy published.

Not a test: it prints a table (and --json writes the numbers). Keeps under ~3 minutes by default.

    .venv/bin/python -m integration.bench.event_log_bench --records 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import AcknowledgeType, ShareConsumer

from integration.bench.passthrough import Target, produce
from integration.kafka_fixtures import ProxyProcess, create_topics, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka
from proxy.localkafka.broker import free_port

IDLE_STOP_S = 5.0


def consume_and_acknowledge(bootstrap: str, topic: str, records: int,
                            release_every: int = 0) -> tuple[float, int, list[float]]:
    """(seconds first record -> last commit, records accepted, commit_sync round trips in seconds).

    ``release_every`` N > 0: every Nth offset is released on its first delivery (accepted when it
    comes back), so acknowledgements alternate types and the events no longer merge into one range
    per poll -- the event log's worst case, about one event per record."""
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": unique_name("bench-events"),
                              "share.acknowledgement.mode": "explicit"})
    consumer.subscribe([topic])
    round_trips: list[float] = []
    got = 0
    first = last = None
    idle_since = time.monotonic()
    try:
        while got < records and time.monotonic() - idle_since < IDLE_STOP_S:
            batch = [m for m in consumer.poll(1.0) if m.error() is None]
            if not batch:
                continue
            first = first or time.monotonic()
            accepted = 0
            for message in batch:
                if release_every and message.offset() % release_every == 0 and message.delivery_count() == 1:
                    consumer.acknowledge(message, AcknowledgeType.RELEASE)
                else:
                    consumer.acknowledge(message)
                    accepted += 1
            started = time.perf_counter()
            results = consumer.commit_sync(30)
            round_trips.append(time.perf_counter() - started)
            failed = [tp for tp, error in results.items() if error is not None]
            if failed:
                raise RuntimeError(f"acknowledgement failed: {failed}")
            got += accepted
            last = idle_since = time.monotonic()
    finally:
        consumer.close()
    return ((last - first) if first and last else 0.0), got, round_trips


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def published_events(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("ksp_share_events_published_total "):
                return float(line.split()[1])
    return 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="records per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per proxy, alternating")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--release-every", type=int, default=0,
                        help="release every Nth offset once (many small events: the event log's worst case)")
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    common = ("--share-auto-offset-reset", "earliest")
    metrics_port = free_port()
    results: dict[str, dict] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="event-log-bench-") as scratch:
        log_dir = Path(scratch)
        with LocalKafka(version=args.kafka_version, share_groups=False, data_dir=log_dir / "kafka") as kafka, \
                ProxyProcess(upstream=kafka.bootstrap, log_path=log_dir / "on.log",
                             extra_args=(*common, "--metrics-port", str(metrics_port))) as on, \
                ProxyProcess(upstream=kafka.bootstrap, log_path=log_dir / "off.log",
                             extra_args=(*common, "--share-events-enable", "false")) as off:
            for proxy in (on, off):  # warm-up (connections, the first group's set-up): not counted
                topic = unique_name("event-log-bench-warmup")
                create_topics(kafka.bootstrap, [topic], partitions=1)
                produce(Target("direct", kafka.bootstrap), topic, 1, 1000, args.size, "none")
                consume_and_acknowledge(proxy.bootstrap, topic, 1000)
            runs = {"on": {"seconds": 0.0, "records": 0, "trips": []}, "off": {"seconds": 0.0, "records": 0, "trips": []}}
            for round_number in range(args.rounds):
                order = (("on", on), ("off", off)) if round_number % 2 == 0 else (("off", off), ("on", on))
                for name, proxy in order:
                    topic = unique_name("event-log-bench")
                    create_topics(kafka.bootstrap, [topic], partitions=1)
                    produce(Target("direct", kafka.bootstrap), topic, 1, args.records, args.size, "none")
                    seconds, got, trips = consume_and_acknowledge(proxy.bootstrap, topic, args.records,
                                                                  args.release_every)
                    runs[name]["seconds"] += seconds
                    runs[name]["records"] += got
                    runs[name]["trips"] += trips
            time.sleep(0.5)  # the last linger
            events = published_events(metrics_port)
    for name, run in runs.items():
        results[name] = {
            "records": run["records"], "records_per_s": round(run["records"] / run["seconds"]) if run["seconds"] else 0,
            "commits": len(run["trips"]),
            "commit_p50_ms": round(percentile(run["trips"], 0.5) * 1000, 2),
            "commit_p99_ms": round(percentile(run["trips"], 0.99) * 1000, 2),
        }
    ratios = {
        "throughput_on_over_off": round(results["on"]["records_per_s"] / results["off"]["records_per_s"], 3),
        "commit_p50_on_over_off": round(results["on"]["commit_p50_ms"] / results["off"]["commit_p50_ms"], 3),
        "commit_p99_on_over_off": round(results["on"]["commit_p99_ms"] / results["off"]["commit_p99_ms"], 3),
    }
    releasing = f", every {args.release_every}th offset released once" if args.release_every else ""
    print(f"\n{args.rounds} rounds x {args.records} records x {args.size} B per proxy{releasing}, alternating, one broker "
          f"(Apache Kafka {args.kafka_version}); {time.monotonic() - started:.0f} s in all")
    print(f"{'event log':10} {'records':>8} {'records/s':>10} {'commits':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for name in ("on", "off"):
        r = results[name]
        print(f"{name:10} {r['records']:8d} {r['records_per_s']:10d} {r['commits']:8d} "
              f"{r['commit_p50_ms']:8.2f} {r['commit_p99_ms']:8.2f}")
    print(f"ratio on/off: throughput {ratios['throughput_on_over_off']}, commit p50 {ratios['commit_p50_on_over_off']}, "
          f"p99 {ratios['commit_p99_on_over_off']}")
    print(f"events published by the event-log proxy: {events:.0f}")
    if args.json:
        args.json.write_text(json.dumps({**results, **ratios, "events_published": events}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
