"""In-process cost of one state write of a fragmented share-partition (a script, not a test).

What an acknowledgement waits for in the proxy before its state record reaches the producer:
``CommitPipeline.write_once`` building the record (the engine's snapshot, the cumulative update
over the durable base with ``--state-deltas on``, the encoding). This drives the real pipeline
with an in-memory writer (every write durable at once, no Kafka) and times each write from
``write_once`` being called to the writer receiving the records ("build"). The engine's staging
of the acknowledgement before it (``stage_acknowledge``, also on the acknowledgement's path, in
the connection's task) is timed on its own ("stage"), and so is what ``write_once`` does once the
writer returned ("commit": the engine keeping the staged change, SPSO moves, settling), which the
acknowledgement's answer waits for as well.

Workloads, one share-partition, one member, acknowledgements staged as the share service stages them:

* ``window`` -- up to ``--window`` records in flight (the default record-lock limit, 2,000), fetched
  100 at a time; each acknowledgement covers 50 acquired offsets picked at random, one AckRange per
  offset, 10% released (redelivered later), the rest accepted; a write per acknowledgement (as
  ``partition_bench``'s fragmented window);
* ``polls`` -- state_bench's fragmented workload on one share-partition: polls of ``--poll`` records,
  10% of the records released on their first delivery (redelivered by a later poll), everything a
  poll delivered acknowledged at once, one AckRange per run of adjacent offsets of one type (the
  shape confluent_kafka's ShareConsumer sends, as logged in the proxy); a write per poll.

It uses only what both sides of a change have (``CommitPipeline``, ``Leader``, the engine's public
calls), so it runs against an older checkout too: ``PYTHONPATH=/path/to/other/checkout python
integration/bench/state_write_bench.py``.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.state_write_bench [--writes 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from pathlib import Path

import trio

from proxy.share.commit import Cause, CommitPipeline
from proxy.share.leaders import Leader
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, SharePartition
from proxy.share.state_delta import DeltaPolicy
from proxy.share.states import AcknowledgeType

ACCEPT = int(AcknowledgeType.ACCEPT)
RELEASE = int(AcknowledgeType.RELEASE)
KEY = ("bench-group", uuid.UUID("b0000000-0000-4000-8000-000000000001"), 0)


class TimingWriter:
    """Takes every write at once and notes how long the pipeline took to hand it over."""

    def __init__(self) -> None:
        self.called_at = 0.0
        self.build_ms: list[float] = []
        self.stage_ms: list[float] = []
        self.commit_ms: list[float] = []
        self.written_at = 0.0
        self.bytes = 0

    async def write(self, topic, records) -> None:
        self.build_ms.append((time.perf_counter() - self.called_at) * 1e3)
        self.bytes += sum(len(key) + len(value or b"") for key, value, _ in records)
        self.written_at = time.perf_counter()


async def _run(workload: str, writes: int, window: int, poll: int, seed: int) -> TimingWriter:
    writer = TimingWriter()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, clock=lambda: 0, deltas=DeltaPolicy())
    leader = Leader(KEY, SharePartition(PartitionConfig(max_record_locks=window), 0), create_timestamp=0)
    engine = leader.engine
    rng = random.Random(seed)

    async def write(ranges: list[AckRange]) -> None:
        started = time.perf_counter()
        staged = engine.stage_acknowledge("m", ranges, now=0)
        writer.stage_ms.append((time.perf_counter() - started) * 1e3)
        if staged is None:
            return
        pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
        writer.called_at = time.perf_counter()
        assert await pipeline.write_once()
        writer.commit_ms.append((time.perf_counter() - writer.written_at) * 1e3)

    fetch = 100 if workload == "window" else poll
    log = [BatchHeader(o, o + fetch - 1) for o in range(0, (writes + 10) * max(fetch, 100) * 2, fetch)]
    delivered_once: set[int] = set()
    held: list[int] = []
    while len(writer.build_ms) < writes:
        if workload == "window":
            while len(held) < window // 2 or (engine.can_acquire() and len(held) < window):
                start = engine.next_fetch_offset()
                got = engine.acquire("m", log[start // fetch:start // fetch + window // fetch], now=0,
                                     max_records=fetch).acquired
                if not got:
                    break
                held.extend(o for a in got for o in range(a.first_offset, a.last_offset + 1))
            picked = sorted(held.pop(rng.randrange(len(held))) for _ in range(min(50, len(held))))
            await write([AckRange(o, o, (RELEASE if rng.random() < 0.1 else ACCEPT,)) for o in picked])
        else:
            start = engine.next_fetch_offset()
            got = engine.acquire("m", log[start // fetch:start // fetch + 2], now=0, max_records=poll).acquired
            offsets = [o for a in got for o in range(a.first_offset, a.last_offset + 1)]
            types = []
            for o in offsets:
                first_delivery = o not in delivered_once
                delivered_once.add(o)
                types.append(RELEASE if first_delivery and rng.random() < 0.1 else ACCEPT)
            runs: list[list[int]] = []  # [first, last, type]
            for o, t in zip(offsets, types):
                if runs and runs[-1][1] + 1 == o and runs[-1][2] == t:
                    runs[-1][1] = o
                else:
                    runs.append([o, o, t])
            await write([AckRange(first, last, (t,)) for first, last, t in runs])
    return writer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["window", "polls"])
    parser.add_argument("--writes", type=int, default=2000, help="writes timed per workload")
    parser.add_argument("--window", type=int, default=2000, help="window: records in flight at most")
    parser.add_argument("--poll", type=int, default=250, help="polls: records per poll")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    numbers = {}
    for workload in args.workloads:
        writer = trio.run(_run, workload, args.writes, args.window, args.poll, args.seed)
        ms = sorted(writer.build_ms)
        stage = statistics.mean(writer.stage_ms)
        commit = statistics.mean(writer.commit_ms)
        numbers[workload] = {"writes": len(ms), "mean_ms": statistics.mean(ms), "p50_ms": ms[len(ms) // 2],
                             "p99_ms": ms[int(len(ms) * 0.99)], "bytes_per_write": writer.bytes / len(ms),
                             "stage_mean_ms": stage, "commit_mean_ms": commit}
        print(f"{workload:8s} {len(ms):6,} writes: build mean {statistics.mean(ms):.3f} ms, "
              f"p50 {ms[len(ms) // 2]:.3f} ms, p99 {ms[int(len(ms) * 0.99)]:.3f} ms; "
              f"{writer.bytes / len(ms):,.0f} B per write; stage mean {stage:.3f} ms; commit mean {commit:.3f} ms",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
