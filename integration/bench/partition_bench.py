"""Micro-benchmark of the share-partition engine's hot path (a script, not a test).

Scenario 1: acquire + accept N records, one log batch of 500 records per fetch.
Scenario 2: the same, but 10% of each batch's records are released (spread over the batch, so
the batch splits into per-offset state) and redelivered before being accepted.
Each runs twice: acknowledgements applied in one call, and staged then committed as the share
service does (two-phase: the commit follows the state write, which is not part of this benchmark).

With persistence (``--persist``, the default, and ``--persist-only``), the staged path also pays
for what the commit pipeline does before each commit: ``engine.snapshot()`` and the ShareSnapshot
record ``state_store.snapshot_record`` encodes (the bytes the state writer hands to Kafka; no
Kafka here), one write per acknowledgement -- the share service's worst case, a write per
ShareAcknowledge:

* easy window: scenario 1 with a snapshot written per acknowledgement;
* fragmented window: up to ``--window`` records in flight (the default record-lock limit 2,000),
  fetched 100 at a time; each acknowledgement covers 50 acquired offsets picked at random, one
  AckRange per offset, 10% released (redelivered later), the rest accepted, so the window stays
  tiled with small state batches. Run with and without the snapshot encoding, so the difference
  is the snapshot's cost.

Both windows also run with what ``--state-deltas on`` writes instead (``+deltas``): per write the
diff against the last snapshot (``state_delta.plan``) and the cumulative ShareUpdate or, when the
policy says so, the snapshot, every write taken as durable (skipped against a checkout without
``proxy.share.state_delta``).

    .venv/bin/python -m integration.bench.partition_bench [--records 1000000] [--batch 500] [--json out.json]

The script uses only the engine's public calls and state_store's encoder, so it also runs against
an older checkout (see integration.bench.side_by_side).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from pathlib import Path

from proxy.share import state_store
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, SharePartition
from proxy.share.states import AcknowledgeType

try:
    from proxy.share.state_delta import DeltaBase, DeltaPolicy, plan
except ImportError:  # an older checkout (side_by_side --bench-from-after)
    DeltaPolicy = None

ACCEPT = int(AcknowledgeType.ACCEPT)
RELEASE = int(AcknowledgeType.RELEASE)
KEY = ("bench-group", uuid.UUID("b0000000-0000-4000-8000-000000000001"), 0)


def one_call(p: SharePartition, member: str, ranges: list[AckRange]) -> None:
    p.acknowledge(member, ranges, now=0)


def staged(p: SharePartition, member: str, ranges: list[AckRange]) -> None:
    change = p.stage_acknowledge(member, ranges, now=0)
    if change is not None and change.change_id:
        p.commit(change.change_id)


class Persisting:
    """Staged + commit, with the snapshot record the commit pipeline encodes before each commit."""

    def __init__(self) -> None:
        self.writes = 0
        self.bytes = 0
        self.epoch = 0

    def __call__(self, p: SharePartition, member: str, ranges: list[AckRange]) -> None:
        change = p.stage_acknowledge(member, ranges, now=0)
        if change is None or not change.change_id:
            return
        self.epoch += 1
        key, value = state_store.snapshot_record(KEY, p.snapshot(), snapshot_epoch=self.epoch, state_epoch=0,
                                                 create_timestamp=0, write_timestamp=self.epoch, clock_offset_ms=0)
        self.writes += 1
        self.bytes += len(key) + len(value)
        p.commit(change.change_id)


class PersistingDeltas(Persisting):
    """Staged + commit, with what the commit pipeline writes with --state-deltas on (every write durable)."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = DeltaPolicy()
        self.base = None
        self.updates = 0

    def __call__(self, p: SharePartition, member: str, ranges: list[AckRange]) -> None:
        change = p.stage_acknowledge(member, ranges, now=0)
        if change is None or not change.change_id:
            return
        current = p.snapshot()
        delta = plan(self.base, current, self.policy)
        if delta is None:
            self.epoch += 1
            key, value = state_store.snapshot_record(KEY, current, snapshot_epoch=self.epoch, state_epoch=0,
                                                     create_timestamp=0, write_timestamp=self.epoch, clock_offset_ms=0)
            self.base = DeltaBase(current, self.epoch, 0, 0)
        else:
            key, value = state_store.update_record(KEY, delta, snapshot_epoch=self.base.epoch, clock_offset_ms=0)
            self.base = self.base.after(delta)
            self.updates += 1
        self.writes += 1
        self.bytes += len(key) + len(value)
        p.commit(change.change_id)


def accept_all(records: int, batch: int, acknowledge=one_call) -> float:
    p = SharePartition(PartitionConfig(), 0)
    log = [BatchHeader(o, o + batch - 1) for o in range(0, records, batch)]
    started = time.perf_counter()
    for header in log:
        acquired = p.acquire("m", [header], now=0, max_records=batch).acquired
        acknowledge(p, "m", [AckRange(a.first_offset, a.last_offset, (ACCEPT,)) for a in acquired])
    elapsed = time.perf_counter() - started
    assert p.start_offset == records, p.start_offset
    return records / elapsed


def release_tenth(records: int, batch: int, acknowledge=one_call) -> float:
    p = SharePartition(PartitionConfig(), 0)
    log = [BatchHeader(o, o + batch - 1) for o in range(0, records, batch)]
    started = time.perf_counter()
    for header in log:
        first = header.base_offset
        p.acquire("m", [header], now=0, max_records=batch)
        # Every tenth record released, the rest accepted: one range with a type per offset.
        types = tuple(RELEASE if i % 10 == 0 else ACCEPT for i in range(batch))
        acknowledge(p, "m", [AckRange(first, header.last_offset, types)])
        # The caller re-reads from next_fetch_offset(); the released records are redelivered.
        redelivered = p.acquire("m", [header], now=0, max_records=batch).acquired
        acknowledge(p, "m", [AckRange(a.first_offset, a.last_offset, (ACCEPT,)) for a in redelivered])
    elapsed = time.perf_counter() - started
    assert p.start_offset == records, p.start_offset
    return records / elapsed


def fragmented_window(records: int, window: int, acknowledge=staged, *, seed: int = 14) -> float:
    """Accepted records per second with a window of up to ``window`` records in flight, acknowledged
    50 at a time in random order (10% released and redelivered)."""
    rng = random.Random(seed)
    p = SharePartition(PartitionConfig(max_record_locks=window), 0)
    fetch_size = 100
    log = [BatchHeader(o, o + fetch_size - 1) for o in range(0, records + window + fetch_size, fetch_size)]
    held: list[int] = []
    accepted = 0
    started = time.perf_counter()
    while accepted < records:
        while len(held) < window // 2 or (p.can_acquire() and len(held) < window):
            start = p.next_fetch_offset()
            index = start // fetch_size
            got = p.acquire("m", log[index:index + window // fetch_size], now=0, max_records=fetch_size).acquired
            if not got:
                break
            held.extend(o for a in got for o in range(a.first_offset, a.last_offset + 1))
        picked = sorted(held.pop(rng.randrange(len(held))) for _ in range(min(50, len(held))))
        types = [RELEASE if rng.random() < 0.1 else ACCEPT for _ in picked]
        acknowledge(p, "m", [AckRange(o, o, (t,)) for o, t in zip(picked, types)])
        accepted += types.count(ACCEPT)
    elapsed = time.perf_counter() - started
    return accepted / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--window", type=int, default=2000, help="in-flight records of the fragmented window")
    parser.add_argument("--window-records", type=int, default=100_000,
                        help="records accepted in the fragmented-window scenarios")
    parser.add_argument("--repeat", type=int, default=3, help="report the best of this many runs")
    parser.add_argument("--no-persist", dest="persist", action="store_false",
                        help="only the engine scenarios (no snapshot encoding)")
    parser.add_argument("--persist-only", action="store_true", help="only the scenarios with persistence")
    parser.add_argument("--json", type=Path, help="also write {scenario: records/s} here")
    args = parser.parse_args()
    results: dict[str, float] = {}
    scenarios = []
    if not args.persist_only:
        for name, scenario in (("acquire+accept", accept_all),
                               ("acquire+accept, 10% released+redelivered", release_tenth)):
            for mode, acknowledge in (("one call", one_call), ("staged+commit", staged)):
                scenarios.append((f"{name}, {mode}", lambda s=scenario, a=acknowledge: s(args.records, args.batch, a),
                                  f"{args.records:,} records, batches of {args.batch}", None))
        scenarios.append(("fragmented window, staged+commit",
                          lambda: fragmented_window(args.window_records, args.window, staged),
                          f"{args.window_records:,} accepted, {args.window} in flight", None))
    if args.persist or args.persist_only:
        for name, run, what in (
            ("acquire+accept, staged+commit+snapshot", lambda w: accept_all(args.records, args.batch, w),
             f"{args.records:,} records, batches of {args.batch}"),
            ("fragmented window, staged+commit+snapshot",
             lambda w: fragmented_window(args.window_records, args.window, w),
             f"{args.window_records:,} accepted, {args.window} in flight"),
        ):
            writer = Persisting()
            scenarios.append((name, lambda r=run, w=writer: r(w), what, writer))
            if DeltaPolicy is not None:
                deltas = PersistingDeltas()
                scenarios.append((name.replace("+snapshot", "+deltas"), lambda r=run, w=deltas: r(w), what, deltas))
    for name, run, what, writer in scenarios:
        best = max(run() for _ in range(args.repeat))
        results[name] = best
        extra = ""
        if writer is not None and writer.writes:
            results[name + " bytes/snapshot"] = writer.bytes / writer.writes
            extra = f", {writer.bytes / writer.writes:,.0f} B per state record"
            if isinstance(writer, PersistingDeltas):
                results[name + " update share"] = writer.updates / writer.writes
                extra += f", {writer.updates / writer.writes:.0%} of them updates"
        print(f"{name:60s} {best:14,.0f} records/s  ({what}{extra})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
