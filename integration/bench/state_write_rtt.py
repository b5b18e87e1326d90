"""One state write's round trip on a local broker, by the state producer's linger.ms (a script,
not a test; docs/benchmarks.md, "... the state producer sends at once").

The real :class:`proxy.share.persister.StateLogWriter`, as the share service runs it: each write
(one record, or three to three partitions) is produced and awaited until durable before the next,
as the commit pipeline writes one write at a time. Settings alternate round by round.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.state_write_rtt [--writes 400] [--rounds 3] [--lingers 1,0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import trio
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.localkafka.broker import DEFAULT_VERSION, LocalKafka
from proxy.share.persister import StateLogWriter

TOPIC = "state-write-rtt"


async def timed_writes(bootstrap: str, linger_ms: int, writes: int, records: int) -> list[float]:
    writer = StateLogWriter(bootstrap, linger_ms=linger_ms)
    writer.start()
    batch = [(b"key-%d" % i, b"v" * 120, i % 3) for i in range(records)]
    try:
        await writer.write(TOPIC, batch)  # warm-up: connections, metadata
        ms = []
        for _ in range(writes):
            started = time.perf_counter()
            await writer.write(TOPIC, batch)
            ms.append((time.perf_counter() - started) * 1e3)
        return sorted(ms)
    finally:
        await writer.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lingers", type=lambda s: [int(v) for v in s.split(",")], default=[1, 0])
    parser.add_argument("--kafka-version", default=os.environ.get("KSP_KAFKA_VERSION", DEFAULT_VERSION))
    args = parser.parse_args()
    with LocalKafka(version=args.kafka_version) as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})  # kept alive until the topic exists
        admin.create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result()
        print(f"Kafka {args.kafka_version}, {args.writes} writes per setting and round, load {os.getloadavg()}")
        for round_number in range(1, args.rounds + 1):
            for records in (1, 3):
                for linger in args.lingers:
                    ms = trio.run(timed_writes, kafka.bootstrap, linger, args.writes, records)
                    print(f"round {round_number}, {records} record(s), linger.ms {linger}: "
                          f"p50 {ms[len(ms) // 2]:.2f} ms, p90 {ms[int(len(ms) * 0.9)]:.2f} ms, "
                          f"mean {statistics.mean(ms):.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
