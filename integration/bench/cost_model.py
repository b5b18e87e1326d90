"""A cost model for many share groups and partitions: memory, timer CPU and state replay.

What a user sizes a deployment with, measured at several shapes (groups x partitions per group;
10, 1,000 and 10,000 share-partitions by default):

* **memory** -- resident memory per idle share-partition as the proxy holds it (a
  :class:`~proxy.share.leaders.Leader` with its engine in the :class:`PartitionRegistry`, its group
  restored in the coordinator), per *parked* idle share-partition (``PartitionRegistry.park_idle``),
  and per in-flight record (acquired, not acknowledged): contiguous (log batches acquired whole, one
  state per batch) and fragmented (one record of every batch released, so every batch is tracked
  per offset). Each figure comes from a fresh process per shape and scenario, measured twice: with
  ``tracemalloc`` (bytes Python allocated, exact) and, in another fresh process without tracemalloc,
  as the RSS delta (/proc/self/statm: what the kernel charges, allocator overhead included);
* **timer CPU** -- ``ShareService._expire`` (the timer task's pass: the registry's deadline heap,
  engine lock expiry, the commit pipeline's record) with nothing due and with every share-partition's
  lock due at once, the snapshot writes that expiry causes (``CommitPipeline.write_once`` with a
  writer that drops the records: encoding and bookkeeping only), and ``ShareService._park_idle``
  (the 30 s idle sweep) over member-less groups that all hold records;
* **wake-ups** -- what one acknowledgement's settling costs the event loop while fetches wait: one
  member per group long-polls all its group's share-partitions, every window full (held by another
  member), and a busy group's share-partition fires (``WorkSignal.fire``, as
  ``ShareService._settled`` does) until every woken fetch waits again; CPU per fire and fetches
  woken per fire, with the signal that wakes only the fetches waiting on that share-partition and,
  side by side, with a broadcast that wakes every waiting fetch (the signal before stop 57);
* **state replay** -- real state records built with ``state_store``'s encoders (group metadata and
  partitions records, ShareSnapshots), folded by ``state_store.recover`` (decode included) and
  served by ``ShareService.restore`` (engines rebuilt), in process; steady snapshots (a few state
  batches), with ``--updated-records`` also each share-partition ending in a cumulative ShareUpdate,
  and fragmented ones (one state batch per few offsets) -- then one end-to-end replay:
  the same records written to a real LocalKafka state topic (created by the proxy's own
  ``ensure_state_topics``; a fresh topic per count of ``--e2e-records``, 20,000 and 1,000,000 by
  default, so a line separates start-up from the per-record cost) and ``share-proxy serve`` started
  against it, reading
  ``ksp_share_state_replay_seconds`` / ``_records`` from /metrics once /readyz answers 200, and the
  proxy's VmRSS / VmHWM from /proc, /healthz asked every ``--liveness-interval`` meanwhile.

Prints one table per part and the fitted coefficients of

    memory  ~ a + b * share-partitions + c * in-flight records
    replay  ~ d * state records            (+ d_batch * state batches for fragmented snapshots)
    timer   ~ e * share-partitions whose locks expire in the pass
    wake-up ~ f * fetches woken * share-partitions in each one's session

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.cost_model
    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.cost_model --shapes 1x10,10x100 --replay-records 100000 \\
        --e2e-records 0
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SCENARIOS = ("idle", "parked", "contiguous", "fragmented")
TOPIC_ID = uuid.UUID("c0570000-0000-4000-8000-000000000001")  # in-process runs: no cluster to ask
MEMBER = "cost-model-member-0000000000"  # 28 characters, like a member id a client sends
LOCK_MS = 30_000  # the default share.record.lock.duration.ms


# ----- pure helpers ---------------------------------------------------------------------------


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"1x10,100x100" -> [(1, 10), (100, 100)]: (groups, partitions per group)."""
    shapes = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", part)
        if match is None or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(f"shape {part!r} is not GROUPSxPARTITIONS (both >= 1)")
        shapes.append((int(match[1]), int(match[2])))
    return shapes


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = intercept + slope * x; one point: slope through 0."""
    if not points:
        raise ValueError("no points")
    n = len(points)
    if n == 1 or len({x for x, _ in points}) == 1:
        x, y = points[0]
        return 0.0, (y / x if x else 0.0)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample `name` in Prometheus text exposition, None if absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    return None


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts differing by at most one (the first ones larger)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def state_batches_for(start: int, batches: int, run: int) -> tuple:
    """`batches` PersistedBatch runs of `run` offsets from `start`: Acknowledged, Available
    (delivered once), Archived in turn -- a window as a partly acknowledged share-partition has it."""
    from proxy.share.partition import PersistedBatch
    from proxy.share.states import RecordState

    states = (RecordState.ACKNOWLEDGED, RecordState.AVAILABLE, RecordState.ARCHIVED)
    return tuple(PersistedBatch(start + i * run, start + (i + 1) * run - 1, states[i % 3], 1)
                 for i in range(batches))


def state_records(groups: int, partitions: int, records: int, *, topic_id: uuid.UUID = TOPIC_ID,
                  batches: int = 4, run: int = 5, create_timestamp: int = 1_700_000_000_000,
                  updated: bool = False) -> Iterator[tuple[bytes, bytes | None, bytes]]:
    """`records` state-topic records for groups x partitions share-partitions, in log order, as the
    proxy's writer takes them: (key, value, route).

    Per group its metadata and initialised-partitions records (so replay keeps its partitions);
    the rest are ShareSnapshots spread evenly over the share-partitions, each with the SPSO moved on
    and `batches` state batches of `run` offsets, snapshot epochs counting up per share-partition.
    With `updated`, the last record of each share-partition is a cumulative ShareUpdate over its
    newest snapshot instead (`--state-deltas on` after compaction): part of the window's second
    batch acknowledged, splitting it.
    """
    from proxy.share import state_store
    from proxy.share.partition import PartitionSnapshot

    keys = [(f"cost-group-{g:05d}", topic_id, p) for g in range(groups) for p in range(partitions)]
    group_records = 2 * groups
    if records < group_records + len(keys) * (2 if updated else 1):
        raise ValueError(f"{records} records cannot hold {groups} groups' 2 records and one snapshot "
                         f"{'and one update ' if updated else ''}for each of {len(keys)} share-partitions")
    for g in range(groups):
        group_id = f"cost-group-{g:05d}"
        yield state_store.group_metadata_record(group_id, 1, create_timestamp)
        yield state_store.group_partitions_record(group_id, [(topic_id, p) for p in range(partitions)], {})
    per_key = split_evenly(records - group_records - (len(keys) if updated else 0), len(keys))
    rounds = per_key[0]
    for epoch in range(1, rounds + 1):
        for key, count in zip(keys, per_key):
            if epoch > count:
                break  # split_evenly puts the larger counts first
            start = epoch * 1000
            snapshot = PartitionSnapshot(start, state_batches_for(start, batches, run))
            yield (*state_store.snapshot_record(key, snapshot, snapshot_epoch=epoch, state_epoch=0,
                                                create_timestamp=create_timestamp,
                                                write_timestamp=create_timestamp + epoch, clock_offset_ms=0),
                   state_store.share_partition_route(key))
    if updated:
        from proxy.share.partition import PersistedBatch, StateDelta
        from proxy.share.states import RecordState

        for key, epoch in zip(keys, per_key):
            first = epoch * 1000 + run  # the second batch of the newest snapshot's window
            delta = StateDelta(-1, (PersistedBatch(first, first + run // 2, RecordState.ACKNOWLEDGED, 1),))
            yield (*state_store.update_record(key, delta, snapshot_epoch=epoch, clock_offset_ms=0),
                   state_store.share_partition_route(key))


def state_partitions() -> int:
    """The partitions the proxy gives a new state topic (--state-topic-partitions' default)."""
    from proxy.config import ProxyConfig

    return next(f.default for f in dataclasses.fields(ProxyConfig) if f.name == "state_topic_partitions")


def placed(records: Iterable[tuple[bytes, bytes | None, bytes | int]], partitions: int,
           ) -> Iterator[tuple[int, bytes, bytes | None]]:
    """(partition, key, value): each record on the state-topic partition the proxy's writer puts it
    on, after the layout-2 marker -- a topic the proxy replays as it is, without migrating it first."""
    from proxy.share import state_store
    from proxy.share.persister import partition_of

    for record in itertools.chain([state_store.layout_record(partitions)], records):
        yield partition_of(record, partitions), record[0], record[1]


def replayed(rows: Iterable[tuple[int, bytes, bytes | None]], partitions: int) -> list:
    """``placed`` rows as the replay reads them back: each at the next offset of its partition."""
    from proxy.share.persister import ReplayedRecord

    next_offset = [0] * partitions
    records = []
    for partition, key, value in rows:
        records.append(ReplayedRecord(partition, next_offset[partition], key, value))
        next_offset[partition] += 1
    return records


# ----- measuring inside a child process ----------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class NullWriter:
    """A state writer that drops the records: write_once's CPU without the write itself."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0

    async def write(self, topic: str, records) -> None:
        self.records += len(records)
        self.bytes += sum(len(r[0]) + len(r[1] or b"") for r in records)


class NoCluster:
    """The cluster of an in-process service: knows no topics (a scrape names them by id)."""

    def topic_by_id(self, topic_id: uuid.UUID) -> None:
        return None


class OneTopicCluster:
    """The cluster of an in-process service whose fetches look at their share-partitions: one topic,
    TOPIC_ID, with `partitions` partitions."""

    def __init__(self, partitions: int) -> None:
        from proxy.share.cluster import PartitionInfo, TopicInfo

        self.topic = TopicInfo("cost-model", TOPIC_ID, {p: PartitionInfo(1, 0) for p in range(partitions)})

    def topic_by_id(self, topic_id: uuid.UUID):
        return self.topic if topic_id == TOPIC_ID else None


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def new_service(clock: Clock | None = None, cluster=None):
    from proxy.share.manager import ShareService

    clock = clock or Clock()
    return ShareService(cluster or NoCluster(), NullWriter(), clock=clock,
                        wall_clock=lambda: 1_700_000_000_000 + clock.now)


def add_group(service, group: int, partitions: int) -> list:
    """A member-less group with `partitions` fresh share-partitions led here, as
    PartitionRegistry.ensure leaves them (SPSO 0, initial state durable)."""
    from proxy.share.leaders import Leader
    from proxy.share.partition import SharePartition

    group_id = f"cost-group-{group:05d}"
    service.coordinator.restore_group(group_id, group_epoch=1, initialized=[(TOPIC_ID, p) for p in range(partitions)])
    config = service.leaders.config_for(group_id)
    leaders = []
    for p in range(partitions):
        leader = Leader((group_id, TOPIC_ID, p), SharePartition(config, 0), create_timestamp=service.wall_clock())
        leaders.append(service.leaders.add(leader))
    return leaders


def acquire(service, leader, records: int, batch: int, now: int) -> None:
    """Acquire `records` from the leader's next fetch offset in log batches of `batch`, as the reader
    does after a fetch (engine.acquire, then the lock deadline queued in the registry)."""
    from proxy.share.partition import BatchHeader

    first = leader.engine.next_fetch_offset()
    headers = [BatchHeader(o, min(o + batch, first + records) - 1) for o in range(first, first + records, batch)]
    leader.engine.acquire(MEMBER, headers, now=now, max_records=records)
    service.leaders.schedule(leader)


def fragment(leader, batch: int) -> None:
    """Release the first record of every in-flight batch (staged, then committed as after its write):
    every batch splits into per-offset state; the rest stay acquired."""
    from proxy.share.partition import AckRange
    from proxy.share.states import AcknowledgeType

    engine = leader.engine
    release = int(AcknowledgeType.RELEASE)
    ranges = [AckRange(o, o, (release,)) for o in range(engine.start_offset, engine.end_offset, batch)]
    change = engine.stage_acknowledge(MEMBER, ranges, now=0)
    if change is not None and change.change_id:
        engine.commit(change.change_id)


def child_memory(spec: dict) -> dict:
    """Memory of one scenario at one shape, in this (fresh) process."""
    import tracemalloc

    import trio

    groups, partitions, scenario, method = spec["groups"], spec["partitions"], spec["scenario"], spec["method"]
    in_flight, batch = spec["in_flight"], spec["batch"]
    out: dict = dict(spec)

    async def run() -> None:
        service = new_service()

        def measure() -> int:
            gc.collect()
            return tracemalloc.get_traced_memory()[0] if method == "tracemalloc" else rss_bytes()

        if method == "tracemalloc":
            tracemalloc.start()
        base = measure()
        all_leaders = []
        for g in range(groups):
            leaders = add_group(service, g, partitions)
            if scenario == "parked":
                parked = service.leaders.park_idle([f"cost-group-{g:05d}"])
                assert parked == partitions, parked
            else:
                all_leaders.extend(leaders)
            del leaders
        built = measure()
        out["share_partitions"] = groups * partitions
        out["idle_bytes"] = built - base
        if scenario in ("contiguous", "fragmented"):
            for leader in all_leaders:
                acquire(service, leader, in_flight, batch, now=0)
                if scenario == "fragmented":
                    fragment(leader, batch)
            after = measure()
            out["in_flight_records"] = groups * partitions * in_flight
            out["in_flight_bytes"] = after - built
            sample = all_leaders[0].engine
            out["acquired_per_partition"] = sum(1 for o in range(sample.start_offset, sample.end_offset)
                                                if sample.record_state(o)[2] is not None)
        out["active"], out["parked"] = len(service.leaders), service.leaders.parked_count

    trio.run(run)
    return out


def child_timer(spec: dict) -> dict:
    """CPU of the timer's passes over groups x partitions share-partitions holding acquired records."""
    import trio

    groups, partitions, in_flight, batch, repeat = (spec["groups"], spec["partitions"], spec["in_flight"],
                                                     spec["batch"], spec["repeat"])
    out: dict = dict(spec)
    n = groups * partitions

    async def run() -> None:
        clock = Clock()
        service = new_service(clock)
        leaders = [leader for g in range(groups) for leader in add_group(service, g, partitions)]
        idle_passes, all_due, writes, park = [], [], [], []
        written = 0
        for _ in range(repeat):
            for leader in leaders:
                acquire(service, leader, in_flight, batch, now=clock.now)
            # Nothing due: the pass the timer makes at least once a second.
            clock.now += 1
            passes = 1000
            started = time.perf_counter()
            for _ in range(passes):
                service._expire(clock.now)
            idle_passes.append((time.perf_counter() - started) / passes)
            # The idle sweep over member-less groups whose share-partitions all hold records (none parks).
            started = time.perf_counter()
            service._park_idle()
            park.append(time.perf_counter() - started)
            assert len(service.leaders) == n
            # Every lock due in one pass.
            clock.now += LOCK_MS
            started = time.perf_counter()
            service._expire(clock.now)
            all_due.append(time.perf_counter() - started)
            assert all(leader.engine.next_fetch_offset() == leader.engine.start_offset for leader in leaders[:3])
            # The snapshot writes those expiries cause (one ShareSnapshot per share-partition).
            before = service.commits.writer.records
            started = time.perf_counter()
            await service.commits.write_once()
            writes.append(time.perf_counter() - started)
            written = service.commits.writer.records - before
        out.update(share_partitions=n, idle_pass_s=min(idle_passes), park_idle_s=min(park),
                   expire_all_s=min(all_due), write_once_s=min(writes), snapshots_written=written,
                   snapshot_bytes=service.commits.writer.bytes // max(1, service.commits.writer.records))
        out.update(await scrape_costs(service, leaders))

    trio.run(run)
    return out


def child_wakeups(spec: dict) -> dict:
    """CPU per fire of one busy share-partition with a fetch of every one of `groups` groups waiting on
    its `partitions` full share-partitions, keyed (the service's WorkSignal) and broadcast."""
    import trio
    import trio.testing

    from proxy.share import metrics
    from proxy.share.partition import AcquireMode
    from proxy.share.reader import FetchParams, WorkSignal

    class Broadcast(WorkSignal):
        """Every fire wakes every waiting fetch, as the one signal for all did."""

        def fire(self, key=None) -> None:
            super().fire(None)

    groups, partitions, fires = spec["groups"], spec["partitions"], spec["fires"]
    out: dict = dict(spec)

    async def run(signal: WorkSignal) -> tuple[float, float]:
        clock = Clock()
        service = new_service(clock, OneTopicCluster(partitions))
        service.work = service.reader.work = signal
        for g in range(groups + 1):  # the last one is the busy group
            for leader in add_group(service, g, partitions):
                acquire(service, leader, leader.engine.config.max_record_locks, spec["batch"], now=0)
                assert not leader.engine.can_acquire()
        order = [(TOPIC_ID, p) for p in range(partitions)]
        params = FetchParams(max_records=500, max_bytes=1 << 20, batch_size=None, mode=AcquireMode(0),
                             deadline=trio.current_time() + 3600)
        busy = (f"cost-group-{groups:05d}", TOPIC_ID, 0)

        def wakeups() -> float:  # the proxy's own count of waiting fetches woken
            return sum(metrics.FETCH_WAKEUPS.labels(outcome=o)._value.get() for o in ("records", "nothing"))

        async with trio.open_nursery() as nursery:
            for g in range(groups):
                nursery.start_soon(service.reader.fetch_records, order, f"cost-group-{g:05d}", "waiter", params)
            await trio.testing.wait_all_tasks_blocked()
            woken = wakeups()
            started = time.process_time()
            for _ in range(fires):
                signal.fire(busy)
                await trio.testing.wait_all_tasks_blocked()
            spent = time.process_time() - started
            woken = wakeups() - woken
            nursery.cancel_scope.cancel()
        return spent / fires, woken / fires

    results = {}
    for name, signal in (("keyed", WorkSignal), ("broadcast", Broadcast)):
        results[name] = trio.run(run, signal(), clock=trio.testing.MockClock())
    out.update(keyed_s=results["keyed"][0], keyed_woken=results["keyed"][1],
               broadcast_s=results["broadcast"][0], broadcast_woken=results["broadcast"][1])
    return out


async def scrape_costs(service, leaders) -> dict:
    """One /metrics scrape of the share series: the reading of the engines (on the loop's thread, in
    slices) and the formatting (in a worker thread), group series only and per share-partition."""
    from prometheus_client import CollectorRegistry

    from proxy.exposition import exposition
    from proxy.share.observe import ShareCollector, ShareEventCounts
    from proxy.timeslice import TimeSlices

    out = {}
    for label, per_partition in (("scrape", False), ("scrape_per_partition", True)):
        events = ShareEventCounts(per_partition=per_partition)
        for leader in leaders:
            events.acquired(leader.key, [])  # counts kept for every group (and share-partition)
        collector = ShareCollector(service, events)
        registry = CollectorRegistry()
        registry.register(collector)
        reads, formats = [], []
        for _ in range(2):  # the faster of two: a collection of the cyclic collector can fall in either
            started = time.perf_counter()
            await collector.prepare(TimeSlices(float("inf")))  # read without pausing: its whole CPU
            read = time.perf_counter()
            body = exposition(registry)  # what the metrics endpoint formats with
            reads.append(read - started)
            formats.append(time.perf_counter() - read)
        out.update({f"{label}_read_s": min(reads), f"{label}_format_s": min(formats), f"{label}_bytes": len(body)})
    return out


def child_replay(spec: dict) -> dict:
    """state_store.recover + ShareService.restore of real state records, in this process."""
    import trio

    from proxy.share import state_store

    groups, partitions, records = spec["groups"], spec["partitions"], spec["records"]
    out: dict = dict(spec)
    started = time.perf_counter()
    state_topic_partitions = state_partitions()
    read_back = replayed(placed(state_records(groups, partitions, records, batches=spec["batches"], run=spec["run"],
                                              updated=spec.get("updated", False)),
                                state_topic_partitions), state_topic_partitions)
    out["build_s"] = time.perf_counter() - started
    out["value_bytes"] = sum(len(r.value or b"") for r in read_back) // len(read_back)
    gc.collect()
    started = time.perf_counter()
    recovered = state_store.recover(read_back, topic="cost-model", clock_offset_ms=0,
                                    partitions=state_topic_partitions)
    out["recover_s"] = time.perf_counter() - started
    assert len(recovered.partitions) == groups * partitions and not recovered.skipped, \
        (len(recovered.partitions), recovered.skipped)
    assert not recovered.needs_migration(state_topic_partitions)

    async def restore() -> None:
        service = new_service()
        started = time.perf_counter()
        await service.restore(recovered)
        out["restore_s"] = time.perf_counter() - started
        assert len(service.leaders) == groups * partitions

    trio.run(restore)
    updates = groups * partitions if spec.get("updated") else 0  # of one state batch each
    out["state_batches"] = spec["batches"] * (records - 2 * groups - updates) + updates
    return out


CHILDREN: dict[str, Callable[[dict], dict]] = {"memory": child_memory, "timer": child_timer, "replay": child_replay,
                                               "wakeups": child_wakeups}


def in_child(part: str, spec: dict) -> dict:
    """Run one measurement in a fresh interpreter (this module with --child)."""
    command = [sys.executable, "-m", "integration.bench.cost_model", "--child", json.dumps({"part": part, **spec})]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"child {part} {spec} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----- end-to-end replay against a real broker --------------------------------------------------


def write_state_topic(bootstrap: str, topic: str, records: Iterable[tuple[int, bytes, bytes | None]],
                      ) -> tuple[int, float]:
    """Append (partition, key, value) records with the state writer's producer settings; returns
    (records, seconds)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 20, "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    failures = []
    count = 0
    started = time.perf_counter()
    for partition, key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition,
                                 on_delivery=lambda err, _msg: failures.append(err) if err else None)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0 or failures:
        raise RuntimeError(f"state topic write failed: {failures[:3]}")
    return count, time.perf_counter() - started


def write_layout_2_state_topic(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes | None, bytes | int]],
                               ) -> tuple[int, float]:
    """Create ``topic`` as the proxy creates a new state topic and append ``records`` on their home
    partitions after the layout marker, so a proxy replays it as it is; returns (records, seconds)."""
    from proxy.share.persister import StateTopicSpec, ensure_state_topics

    partitions = state_partitions()
    ensure_state_topics(bootstrap, [StateTopicSpec(topic, partitions=partitions)])
    return write_state_topic(bootstrap, topic, placed(records, partitions))


def http_get(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


class LivenessPoller:
    """Asks `url` (/healthz) every `interval_s` (a second, as the chart's probe) from a thread while
    the block runs; summary() counts the answers from the first 200 on (before it the interpreter
    and the health server were starting, which the chart's startup probe covers) that were not 200
    or did not come within 5 s, and the slowest."""

    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.answers: list[tuple[float, bool]] = []  # (seconds to answer, 200)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            answer = http_get(self.url)
            self.answers.append((time.monotonic() - asked, answer is not None and answer[0] == 200))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LivenessPoller:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict:
        first = next((i for i, (_, ok) in enumerate(self.answers) if ok), len(self.answers))
        counted = self.answers[first:]
        return {"healthz_asked": len(counted), "healthz_failed": sum(1 for _, ok in counted if not ok),
                "healthz_slowest_s": max((seconds for seconds, _ in counted), default=0.0)}


def end_to_end(args: argparse.Namespace, groups: int, partitions: int, counts: Sequence[int], log_dir: Path) -> list[dict]:
    """One broker; per record count a fresh state topic, written, then a fresh proxy replaying it."""
    from integration.bench.procfs import proc_status_kib
    from integration.kafka_fixtures import ProxyProcess, create_topics, topic_id_of, unique_name
    from proxy.localkafka import LocalKafka
    from proxy.localkafka.broker import free_port

    rows = []
    with LocalKafka(version=args.kafka_version, share_groups=False, data_dir=log_dir / "kafka") as kafka:
        topic = create_topics(kafka.bootstrap, [unique_name("cost-model")], partitions=partitions)[0]
        topic_id = topic_id_of(kafka.bootstrap, topic)
        for records in counts:
            out: dict = {"groups": groups, "partitions": partitions, "records": records}
            state_topic = unique_name("__cost_model_state")
            out["written"], out["write_s"] = write_layout_2_state_topic(kafka.bootstrap, state_topic, state_records(
                groups, partitions, records, topic_id=topic_id, batches=args.snapshot_batches))
            port = free_port()
            extra = ("--state-topic", state_topic, "--metrics-port", str(port), "--log-level", "warning")
            out["load_before"] = os.getloadavg()
            started = time.monotonic()
            # Liveness while it replays, asked as the chart's probe asks (/healthz every --liveness-interval,
            # a second by default; 5 s timeout): an answer other than 200, or none, restarts a pod 3 in a row.
            with LivenessPoller(f"http://127.0.0.1:{port}/healthz", args.liveness_interval) as liveness, \
                    ProxyProcess(upstream=kafka.bootstrap, log_path=log_dir / f"proxy-{records}.log", extra_args=extra,
                                 startup_timeout=args.e2e_timeout) as proxy:
                while True:
                    answer = http_get(f"http://127.0.0.1:{port}/readyz")
                    if answer is not None and answer[0] == 200:
                        break
                    if time.monotonic() - started > args.e2e_timeout:
                        raise RuntimeError(f"/readyz not 200 after {args.e2e_timeout}s: {answer}")
                    time.sleep(0.2)
                out["ready_s"] = time.monotonic() - started
                out.update(liveness.summary())
                metrics = http_get(f"http://127.0.0.1:{port}/metrics")
                assert metrics is not None and metrics[0] == 200, metrics
                out["replay_seconds"] = metric_value(metrics[1], "ksp_share_state_replay_seconds")
                out["replay_records"] = metric_value(metrics[1], "ksp_share_state_replay_records")
                assert proxy.process is not None
                out["vm_rss_kib"] = proc_status_kib(proxy.process.pid, "VmRSS")
                out["vm_hwm_kib"] = proc_status_kib(proxy.process.pid, "VmHWM")
            out["load_after"] = os.getloadavg()
            rows.append(out)
            print(f"{groups}x{partitions}: wrote {out['written']:,} records in {out['write_s']:.1f}s; "
                  f"replay_seconds {out['replay_seconds']:.2f} for {out['replay_records']:,.0f} records; ready after "
                  f"{out['ready_s']:.1f}s; proxy VmRSS {out['vm_rss_kib'] / 1024:.0f} MiB, VmHWM "
                  f"{out['vm_hwm_kib'] / 1024:.0f} MiB; /healthz failed {out['healthz_failed']} of {out['healthz_asked']}, "
                  f"slowest answer {out['healthz_slowest_s']:.1f} s; "
                  f"load {out['load_before'][0]:.2f} -> {out['load_after'][0]:.2f}",
                  flush=True)
    return rows


# ----- the run ---------------------------------------------------------------------------------


def uptime() -> str:
    return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def memory_part(args: argparse.Namespace, shapes: list[tuple[int, int]]) -> dict:
    print(f"\n## Memory ({uptime()})")
    print(f"{'shape':>9} {'scenario':>10} {'method':>11} {'partitions':>10} {'B/partition':>12} "
          f"{'in-flight':>10} {'B/record':>9}")
    rows = []
    for groups, partitions in shapes:
        for scenario in args.scenarios:
            for method in ("tracemalloc", "rss"):
                row = in_child("memory", {"groups": groups, "partitions": partitions, "scenario": scenario,
                                          "method": method, "in_flight": args.in_flight, "batch": args.batch})
                rows.append(row)
                n = row["share_partitions"]
                per_record = (f"{row['in_flight_bytes'] / row['in_flight_records']:9.1f}"
                              if "in_flight_bytes" in row else f"{'':>9}")
                print(f"{groups:>4}x{partitions:<4} {scenario:>10} {method:>11} {n:>10,} "
                      f"{row['idle_bytes'] / n:12.0f} {row.get('in_flight_records', 0):>10,} {per_record}", flush=True)
    fits = {}
    for scenario in args.scenarios:
        for method in ("tracemalloc", "rss"):
            mine = [r for r in rows if r["scenario"] == scenario and r["method"] == method]
            fits[f"{scenario}/{method}/partition"] = fit_line([(r["share_partitions"], r["idle_bytes"]) for r in mine])
            if scenario in ("contiguous", "fragmented"):
                fits[f"{scenario}/{method}/record"] = fit_line(
                    [(r["in_flight_records"], r["in_flight_bytes"]) for r in mine])
    print("\nfitted bytes = a + b * count:")
    for name, (a, b) in fits.items():
        print(f"  {name:35s} a={a:12,.0f}  b={b:10.1f}")
    return {"rows": rows, "fits": fits}


def timer_part(args: argparse.Namespace, shapes: list[tuple[int, int]]) -> dict:
    print(f"\n## Timer passes ({uptime()}; {args.timer_in_flight} acquired records per share-partition)")
    print(f"{'shape':>9} {'partitions':>10} {'nothing due':>12} {'all due':>10} {'us/partition':>12} "
          f"{'write_once':>10} {'us/snapshot':>11} {'park_idle':>10} {'us/partition':>12}")
    rows = []
    for groups, partitions in shapes:
        row = in_child("timer", {"groups": groups, "partitions": partitions, "in_flight": args.timer_in_flight,
                                 "batch": args.batch, "repeat": args.timer_repeat})
        rows.append(row)
        n = row["share_partitions"]
        print(f"{groups:>4}x{partitions:<4} {n:>10,} {row['idle_pass_s'] * 1e6:10.1f}us "
              f"{row['expire_all_s'] * 1e3:8.2f}ms {row['expire_all_s'] / n * 1e6:12.1f} "
              f"{row['write_once_s'] * 1e3:8.2f}ms {row['write_once_s'] / row['snapshots_written'] * 1e6:11.1f} "
              f"{row['park_idle_s'] * 1e3:8.2f}ms {row['park_idle_s'] / n * 1e6:12.2f}", flush=True)
    print("\n/metrics scrape of the share series (reading on the loop in slices, formatting in a worker thread)")
    print(f"{'shape':>9} {'partitions':>10} {'read':>9} {'format':>9} {'bytes':>11} "
          f"{'per-partition read':>18} {'format':>9} {'bytes':>11}")
    for row in rows:
        print(f"{row['groups']:>4}x{row['partitions']:<4} {row['share_partitions']:>10,} "
              f"{row['scrape_read_s'] * 1e3:7.1f}ms {row['scrape_format_s'] * 1e3:7.1f}ms {row['scrape_bytes']:>11,} "
              f"{row['scrape_per_partition_read_s'] * 1e3:16.1f}ms {row['scrape_per_partition_format_s'] * 1e3:7.1f}ms "
              f"{row['scrape_per_partition_bytes']:>11,}", flush=True)
    fits = {name: fit_line([(r["share_partitions"], r[key]) for r in rows])
            for name, key in (("expire_all", "expire_all_s"), ("write_once", "write_once_s"),
                              ("park_idle", "park_idle_s"), ("nothing_due", "idle_pass_s"),
                              ("scrape_read", "scrape_read_s"), ("scrape_format", "scrape_format_s"),
                              ("scrape_pp_format", "scrape_per_partition_format_s"))}
    print("\nfitted seconds = a + e * share-partitions:")
    for name, (a, e) in fits.items():
        print(f"  {name:16s} a={a * 1e3:8.3f} ms  e={e * 1e6:8.2f} us/partition")
    return {"rows": rows, "fits": fits}


def wakeups_part(args: argparse.Namespace, shapes: list[tuple[int, int]]) -> dict:
    print(f"\n## Wake-ups ({uptime()}; a fetch of every group waiting on its full share-partitions, "
          f"{args.wakeup_fires} fires of another group's share-partition)")
    print(f"{'shape':>9} {'waiting':>8} {'woken per fire':>15} {'CPU per fire':>13} "
          f"{'broadcast: woken':>17} {'CPU per fire':>13} {'broadcast / keyed':>17}")
    rows = []
    for groups, partitions in shapes:
        row = in_child("wakeups", {"groups": groups, "partitions": partitions, "fires": args.wakeup_fires,
                                   "batch": args.batch})
        rows.append(row)
        print(f"{groups:>4}x{partitions:<4} {groups:>8,} {row['keyed_woken']:15.1f} {row['keyed_s'] * 1e6:11.1f}us "
              f"{row['broadcast_woken']:17.1f} {row['broadcast_s'] * 1e6:11.1f}us "
              f"{row['broadcast_s'] / row['keyed_s']:17.1f}", flush=True)
    per_look = fit_line([(r["groups"] * r["partitions"], r["broadcast_s"]) for r in rows])[1]
    print(f"\nfitted broadcast seconds per fire = a + f * fetches woken * share-partitions each: "
          f"f={per_look * 1e6:.2f} us")
    return {"rows": rows, "per_woken_partition_s": per_look}


def replay_part(args: argparse.Namespace, shapes: list[tuple[int, int]]) -> dict:
    print(f"\n## State replay in process ({uptime()})")
    print(f"{'shape':>9} {'snapshot':>10} {'records':>10} {'value B':>8} {'recover':>9} {'s/M records':>11} "
          f"{'restore':>9} {'us/partition':>12} {'us/state batch':>14}")
    rows = []
    kinds = [("steady", args.replay_records, args.snapshot_batches, 5)]
    if args.updated_records:
        kinds.append(("updated", args.updated_records, args.snapshot_batches, 5))
    if args.fragmented_records:
        kinds.append(("fragmented", args.fragmented_records, args.fragmented_batches, 1))
    for index, (groups, partitions) in enumerate(shapes):
        for kind, records, batches, run in kinds:
            if kind == "fragmented" and index:
                continue  # per state batch, whatever the shape: measured at the first shape only
            records = max(records, 3 * groups * partitions)
            row = in_child("replay", {"groups": groups, "partitions": partitions, "records": records,
                                      "batches": batches, "run": run, "updated": kind == "updated"})
            row["kind"] = kind
            rows.append(row)
            print(f"{groups:>4}x{partitions:<4} {kind:>10} {records:>10,} {row['value_bytes']:>8} "
                  f"{row['recover_s']:8.2f}s {row['recover_s'] / records * 1e6:11.2f} {row['restore_s']:8.3f}s "
                  f"{row['restore_s'] / (groups * partitions) * 1e6:12.1f} "
                  f"{row['recover_s'] / row['state_batches'] * 1e6:14.3f}", flush=True)
    return {"rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes("1x10,10x100,100x100"),
                        help="GROUPSxPARTITIONS per group, comma-separated (default 1x10,10x100,100x100)")
    parser.add_argument("--parts", default="memory,timer,wakeups,replay,e2e", help="which parts to run")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), type=lambda s: s.split(","))
    parser.add_argument("--in-flight", type=int, default=500, help="acquired records per share-partition (memory)")
    parser.add_argument("--batch", type=int, default=100, help="records per log batch acquired")
    parser.add_argument("--timer-in-flight", type=int, default=100, help="acquired records per share-partition (timer)")
    parser.add_argument("--timer-repeat", type=int, default=3, help="timer rounds per shape; the best is reported")
    parser.add_argument("--wakeup-fires", type=int, default=200, help="fires per wake-up measurement")
    parser.add_argument("--replay-records", type=int, default=1_000_000, help="state records per in-process replay")
    parser.add_argument("--snapshot-batches", type=int, default=4, help="state batches per steady snapshot")
    parser.add_argument("--updated-records", type=int, default=0,
                        help="state records of a replay whose share-partitions each end in a cumulative "
                             "ShareUpdate over their newest snapshot, at every shape (0: skip, the default)")
    parser.add_argument("--fragmented-records", type=int, default=1_000,
                        help="state records of the fragmented replay, at the first shape only (0: skip)")
    parser.add_argument("--fragmented-batches", type=int, default=2000,
                        help="state batches (one offset each) per fragmented snapshot")
    parser.add_argument("--e2e-shape", type=parse_shapes, default=parse_shapes("100x100"))
    parser.add_argument("--e2e-records", type=lambda s: [int(n) for n in s.split(",") if int(n)],
                        default=[20_000, 1_000_000], help="state records replayed by share-proxy serve, one fresh "
                        "state topic and proxy per count (0: skip)")
    parser.add_argument("--e2e-timeout", type=float, default=600.0)
    parser.add_argument("--liveness-interval", type=float, default=1.0,
                        help="seconds between the end-to-end part's /healthz asks (default 1, as a probe; "
                             "shorter catches shorter stalls)")
    parser.add_argument("--kafka-version", default=None)
    parser.add_argument("--json", type=Path, help="also write every number here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(CHILDREN[spec.pop("part")](spec)))
        return 0
    parts = set(args.parts.split(","))
    print(f"cost model: shapes {args.shapes}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {uptime()}")
    results: dict = {"load_start": os.getloadavg()}
    if "memory" in parts:
        results["memory"] = memory_part(args, args.shapes)
    if "timer" in parts:
        results["timer"] = timer_part(args, args.shapes)
    if "wakeups" in parts:
        results["wakeups"] = wakeups_part(args, args.shapes)
    if "replay" in parts:
        results["replay"] = replay_part(args, args.shapes)
    if "e2e" in parts and args.e2e_records:
        from proxy.localkafka import DEFAULT_VERSION

        args.kafka_version = args.kafka_version or DEFAULT_VERSION
        (groups, partitions), = args.e2e_shape
        print(f"\n## End-to-end replay: share-proxy serve on Kafka {args.kafka_version} ({uptime()})")
        with tempfile.TemporaryDirectory(prefix="cost-model-") as tmp:
            rows = end_to_end(args, groups, partitions, args.e2e_records, Path(tmp))
        results["e2e"] = rows
        if len(rows) > 1:
            fixed, per_record = fit_line([(r["replay_records"], r["replay_seconds"]) for r in rows])
            _, rss_per_record = fit_line([(r["replay_records"], r["vm_hwm_kib"] * 1024) for r in rows])
            print(f"fitted replay_seconds = {fixed:.2f} s + {per_record * 1e6:.2f} s per million records; "
                  f"proxy VmHWM + {rss_per_record:.0f} B per replayed record")
    results["load_end"] = os.getloadavg()
    print(f"\ndone, {uptime()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
