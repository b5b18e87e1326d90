"""State-topic bytes per acknowledged record, and acknowledgement latency: the proxy vs Kafka's native share groups.

One run, Kafka 4.4.0 by default, brokers one after the other (never two at once on this small
machine), the same records on both sides:

* **proxy** -- `share-proxy serve` in front of a LocalKafka with share groups off; its state goes
  to ``--state-topic`` (default ``__share_proxy_state``, 3 partitions, compacted, lz4-compressed by
  the proxy's state producer);
* **native** -- a LocalKafka with Kafka's own share groups on (``share_groups=True``); its share
  coordinator writes ``__share_group_state`` (1 partition here, ``cleanup.policy=delete``, no
  compression, a ShareSnapshot every 500 ShareUpdates: Kafka's defaults).

Per side: an uncounted warm-up (1,000 records, so the state topics exist and the first writes and
connections are paid), then each workload on a fresh topic (``--records`` x ``--size`` B on
``--partitions`` partitions, flushed to disk and the machine idle before they are read:
``share_bench.settle_machine``) with a fresh group read from the earliest offset, one
confluent_kafka.ShareConsumer in **explicit** acknowledgement mode: poll, acknowledge every
record, ``commit_sync`` per poll batch (one ShareAcknowledge round trip, answered once the state
write is durable -- on both sides), the same on both sides:

* ``easy`` -- every record accepted, in the order delivered;
* ``fragmented`` -- ``--release-fraction`` (10%) of the records released on their first delivery
  (chosen by a hash of partition, offset and ``--seed``: the same records on both sides), then
  accepted when redelivered; the acknowledgements of each poll batch in a random order.
* ``window`` -- as fragmented, with polls of up to ``--window-poll-records`` (``max.poll.records``)
  and a ``commit_sync`` after every ``--commit-every`` acknowledgements instead of once per poll: the
  share-partition's in-flight window stays large and fragmented while it is acknowledged piecemeal
  (where a full snapshot per change is most expensive).

``--proxy-variant NAME=FLAGS`` (repeatable) runs the proxy side once per variant, each on a fresh
broker with ``FLAGS`` added to ``share-proxy serve`` (e.g. ``off=--state-deltas off`` and
``on=--state-deltas on``), in the order given, in one run beside the native side. ``--variant-tree
NAME=PATH`` runs that variant from another checkout (``python -m proxy.cli`` with PYTHONPATH=PATH),
e.g. the code before a change. Each proxy serves its metrics on a free port, and the report ends
with its garbage-collection pauses (``ksp_gc_pause_seconds``: collections, total pause, how many of
10 and 25 ms or more, per generation).

Measured per workload, as the difference before/after it (the group and topic are new, so nothing
else writes meanwhile; the run waits until the state topic stops growing):

1. **state bytes**: the on-disk size of the state topic's partition directories under the
   LocalKafka data directory (the .log segment files), and the records written (end offsets, from
   the segment files and, as a check, from the broker). Segments roll at 1 GiB (proxy) / 100 MiB
   (native) and the cleaner only compacts rolled segments, so with one segment per partition
   nothing was compacted or deleted: the script reports the segment count. Per acknowledged
   (accepted) record: bytes and state records, and proxy / native.
2. **acknowledgement latency**: p50 / p99 of the ``commit_sync`` round trip; proxy - native in ms.
3. for each proxy side, the **log bytes its upstream Fetches read** (``ksp_share_upstream_fetch_bytes``)
   against the workload topic's log: redeliveries are read back from the broker; and what its
   read-cache budget dropped to make room meanwhile (``ksp_share_read_cache_evicted_bytes``).
4. the state records by type (the segments are decoded with the codec), and an **estimate of a
   delta-per-change scheme** computed from the proxy's own snapshots: for every snapshot after a
   share-partition's first, the ShareUpdate that carries only the offset ranges whose state or
   delivery count changed (plus the SPSO when it moved), with a full snapshot every
   ``--snapshot-every`` changes (Kafka's 500), encoded with the codec; per-record framing taken from
   the native log (uncompressed, as the proxy's bytes would be without lz4).

Not a test: it prints a table (``--json`` writes the numbers). About 3-5 minutes at the defaults.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.state_bench --records 100000 --size 1024 --partitions 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import struct
import sys
import tempfile
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import AcknowledgeType, Consumer, ShareConsumer, TopicPartition

from codec.batch_records import decode_records
from codec.records import iter_batches
from codec.share_state import (
    RecordType,
    ShareSnapshotKey,
    ShareUpdateKey,
    ShareUpdateValue,
    decode_key,
    decode_value,
    encode_record,
)
from integration.bench.passthrough import Target, produce
from integration.bench.share_bench import proxy_samples, set_native_share_reset_earliest, settle_machine
from integration.kafka_fixtures import ProxyProcess, create_topics, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka
from proxy.localkafka.broker import free_port

NATIVE_STATE_TOPIC = "__share_group_state"
IDLE_STOP_S = 10.0
WARMUP_RECORDS = 1000
KAFKA_SNAPSHOT_EVERY = 500  # share.coordinator.snapshot.update.records.per.snapshot's default
_INT16 = struct.Struct(">h")


# ----- which records the fragmented workload releases ---------------------------------------------------


def released_once(partition: int, offset: int, fraction: float, seed: int) -> bool:
    """Whether the fragmented workload releases this record on its first delivery.

    A hash of (seed, partition, offset): the same records on both sides and in every run, about
    ``fraction`` of them, independent of how the records are batched into polls."""
    if fraction <= 0:
        return False
    digest = zlib.crc32(f"{seed}:{partition}:{offset}".encode())
    return digest < fraction * 2**32


# ----- the state topic on disk ------------------------------------------------------------------------


@dataclass
class TypeUsage:
    records: int = 0
    key_bytes: int = 0
    value_bytes: int = 0
    max_value_bytes: int = 0


@dataclass
class LogUsage:
    """A state topic's partitions on disk: what the segment files hold (from ``start`` offsets on)."""

    disk_bytes: int = 0  # sum of the .log segment file sizes (the whole files)
    segments: int = 0  # .log files over all partitions
    max_segments: int = 0  # .log files of the partition that has most: 1 = never rolled, so never cleaned
    end_offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    batch_bytes: int = 0  # sizes of the batches at or after ``start`` (header included)
    # ...of which batches holding only group records (the proxy's PROXY_GROUP_*): native share groups
    # keep theirs in __consumer_offsets, so a like-for-like comparison leaves these out.
    group_batch_bytes: int = 0
    batches: int = 0
    records: int = 0  # records at or after ``start``
    by_type: dict[str, TypeUsage] = field(default_factory=dict)
    snapshots: list[tuple[bytes, bytes]] = field(default_factory=list)  # (key, value) in offset order per key

    @property
    def end_offset(self) -> int:
        return sum(self.end_offsets.values())


def partition_dirs(log_dir: Path, topic: str) -> dict[int, Path]:
    """{partition: directory} of ``topic`` under a broker's log.dirs (deleted ``-delete`` dirs skipped)."""
    pattern = re.compile(rf"^{re.escape(topic)}-(\d+)$")
    found = {}
    for path in log_dir.iterdir() if log_dir.is_dir() else ():
        if (match := pattern.match(path.name)) and path.is_dir():
            found[int(match.group(1))] = path
    return found


def _type_name(key: bytes | None) -> str:
    if key is None or len(key) < 2:
        return "no key"
    number = _INT16.unpack_from(key)[0]
    try:
        return RecordType(number).name
    except ValueError:
        return f"type {number}"


def read_state_log(dirs: dict[int, Path], start: dict[int, int] | None = None, *,
                   keep_snapshots: bool = False) -> LogUsage:
    """What the segment files of a state topic hold, counting records from ``start`` (partition ->
    offset) on: pass a previous :class:`LogUsage`'s ``end_offsets`` to measure what came since."""
    usage = LogUsage()
    start = start or {}
    for partition, directory in sorted(dirs.items()):
        end = start.get(partition, 0)
        segments = sorted(directory.glob("*.log"))
        usage.max_segments = max(usage.max_segments, len(segments))
        for segment in segments:
            usage.segments += 1
            data = segment.read_bytes()
            usage.disk_bytes += len(data)
            view = memoryview(data)
            for batch in iter_batches(view):
                end = max(end, batch.last_offset + 1)
                if batch.last_offset < start.get(partition, 0):
                    continue
                usage.batch_bytes += batch.size
                usage.batches += 1
                group_only = True
                for record in decode_records(view[batch.position:batch.position + batch.size], verify_crc=False):
                    if record.offset < start.get(partition, 0):
                        continue
                    usage.records += 1
                    name = _type_name(record.key)
                    group_only = group_only and name.startswith("PROXY_GROUP")
                    kind = usage.by_type.setdefault(name, TypeUsage())
                    value_size = len(record.value) if record.value is not None else 0
                    kind.records += 1
                    kind.key_bytes += len(record.key or b"")
                    kind.value_bytes += value_size
                    kind.max_value_bytes = max(kind.max_value_bytes, value_size)
                    if keep_snapshots and name == RecordType.SHARE_SNAPSHOT.name and record.value is not None:
                        usage.snapshots.append((record.key, record.value))
                if group_only:
                    usage.group_batch_bytes += batch.size
        usage.end_offsets[partition] = end
    return usage


def kafka_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """{partition: (log start offset, end offset)} as the broker reports them (a check on the files)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("state-bench-offsets")})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                for p in metadata.partitions}
    finally:
        consumer.close()


# ----- what a delta-per-change scheme would write -------------------------------------------------------

# A state batch as (first, last, attributes): attributes are every field but the offsets.
Range = tuple[int, int, tuple]


def _ranges(batches: Iterable[object]) -> list[Range]:
    return [(b.first_offset, b.last_offset, (b.delivery_state, b.delivery_count, b.in_progress_start_timestamp,
                                             b.last_progress_timestamp, b.in_progress_member_id, b.archive_reason))
            for b in batches]


def changed_ranges(old: Sequence[Range], new: Sequence[Range]) -> list[Range]:
    """The parts of ``new`` (sorted, non-overlapping ranges) whose attributes differ from ``old``
    at the same offsets (or that ``old`` does not cover): what a ShareUpdate would have to carry."""
    out: list[Range] = []
    index = 0
    for first, last, attributes in new:
        while index < len(old) and old[index][1] < first:
            index += 1
        cursor = first
        scan = index
        while scan < len(old) and old[scan][0] <= last:
            old_first, old_last, old_attributes = old[scan]
            if old_attributes == attributes and old_last >= cursor:
                if old_first > cursor:
                    out.append((cursor, old_first - 1, attributes))
                cursor = max(cursor, old_last + 1)
            scan += 1
        if cursor <= last:
            out.append((cursor, last, attributes))
    return out


@dataclass
class DeltaEstimate:
    changes: int = 0  # snapshots after a share-partition's first: state changes written
    updates: int = 0
    snapshots: int = 0
    update_bytes: int = 0  # key + value of the ShareUpdates
    snapshot_bytes: int = 0  # key + value of the snapshots kept (the first, then every Nth change)
    update_ranges: int = 0  # state batches carried by the updates
    snapshot_encode_s: float = 0.0  # encoding every change as the full snapshot (what the proxy does)
    update_encode_s: float = 0.0  # encoding every change as its ShareUpdate

    @property
    def records(self) -> int:
        return self.updates + self.snapshots

    @property
    def logical_bytes(self) -> int:
        return self.update_bytes + self.snapshot_bytes


def delta_scheme(snapshots: Iterable[tuple[bytes, bytes]], snapshot_every: int = KAFKA_SNAPSHOT_EVERY) -> DeltaEstimate:
    """Replays full snapshots (key, value bytes, in offset order per key) as a delta scheme would
    write them: each share-partition's first snapshot as it is, then per change a ShareUpdate of
    the changed ranges, except every ``snapshot_every``-th change, written as the full snapshot."""
    estimate = DeltaEstimate()
    previous: dict[bytes, tuple[list[Range], int]] = {}
    since_snapshot: Counter[bytes] = Counter()
    for key_bytes, value_bytes in snapshots:
        _, key = decode_key(key_bytes)
        value = decode_value(RecordType.SHARE_SNAPSHOT, value_bytes)
        assert isinstance(key, ShareSnapshotKey)
        ranges = _ranges(value.state_batches)
        before = previous.get(key_bytes)
        previous[key_bytes] = (ranges, value.start_offset)
        if before is None:
            estimate.snapshots += 1
            estimate.snapshot_bytes += len(key_bytes) + len(value_bytes)
            continue
        estimate.changes += 1
        started = time.perf_counter()
        encode_record(key, value)
        estimate.snapshot_encode_s += time.perf_counter() - started
        since_snapshot[key_bytes] += 1
        if snapshot_every and since_snapshot[key_bytes] >= snapshot_every:
            since_snapshot[key_bytes] = 0
            estimate.snapshots += 1
            estimate.snapshot_bytes += len(key_bytes) + len(value_bytes)
            continue
        old_ranges, old_start = before
        changed = changed_ranges([r for r in old_ranges if r[1] >= value.start_offset], ranges)
        update_key = ShareUpdateKey(group_id=key.group_id, topic_id=key.topic_id, partition=key.partition)
        update = ShareUpdateValue(
            snapshot_epoch=value.snapshot_epoch, leader_epoch=value.leader_epoch,
            start_offset=value.start_offset if value.start_offset != old_start else -1,
            delivery_complete_count=value.delivery_complete_count,
            state_batches=tuple(
                ShareUpdateValue.StateBatch(
                    first_offset=first, last_offset=last, delivery_state=attrs[0], delivery_count=attrs[1],
                    in_progress_start_timestamp=attrs[2], last_progress_timestamp=attrs[3],
                    in_progress_member_id=attrs[4], archive_reason=attrs[5])
                for first, last, attrs in changed),
        )
        started = time.perf_counter()
        encoded_key, encoded_value = encode_record(update_key, update)
        estimate.update_encode_s += time.perf_counter() - started
        estimate.updates += 1
        estimate.update_ranges += len(changed)
        estimate.update_bytes += len(encoded_key) + len(encoded_value or b"")
    return estimate


# ----- the workloads -------------------------------------------------------------------------------------


@dataclass
class WorkloadRun:
    accepted: int = 0
    released: int = 0
    polls: int = 0
    partition_commits: int = 0  # (poll, partition) pairs: the share-partitions each poll's commits acknowledged
    poll_records: int = 0  # records returned by the polls (redeliveries included)
    seconds: float = 0.0  # first record to the last commit
    round_trips: list[float] = field(default_factory=list)  # commit_sync, seconds


def consume(bootstrap: str, topic: str, group: str, records: int, *, fragmented: bool,
            release_fraction: float, seed: int, commit_every: int = 0, max_poll_records: int = 0) -> WorkloadRun:
    """One explicit-mode ShareConsumer until ``records`` distinct records are accepted; a commit per poll,
    or after every ``commit_every`` acknowledgements (and at the end of the poll)."""
    config = {"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"}
    if max_poll_records:
        config["max.poll.records"] = str(max_poll_records)
    consumer = ShareConsumer(config)
    consumer.subscribe([topic])
    run = WorkloadRun()
    order = random.Random(seed)
    accepted: set[tuple[int, int]] = set()
    first = last = None
    idle_since = time.monotonic()
    try:
        while len(accepted) < records and time.monotonic() - idle_since < IDLE_STOP_S:
            batch = [m for m in consumer.poll(1.0) if m.error() is None]
            if not batch:
                continue
            first = first or time.monotonic()
            run.polls += 1
            run.partition_commits += len({m.partition() for m in batch})
            if fragmented:
                order.shuffle(batch)
            run.poll_records += len(batch)
            for number, message in enumerate(batch, 1):
                where = (message.partition(), message.offset())
                if fragmented and message.delivery_count() == 1 and released_once(*where, release_fraction, seed):
                    consumer.acknowledge(message, AcknowledgeType.RELEASE)
                    run.released += 1
                else:
                    consumer.acknowledge(message)
                    accepted.add(where)
                if commit_every and number % commit_every == 0 and number < len(batch):
                    commit(consumer, run)
            commit(consumer, run)
            last = idle_since = time.monotonic()
    finally:
        consumer.close()
    run.accepted = len(accepted)
    run.seconds = (last - first) if first and last else 0.0
    if run.accepted < records:
        raise RuntimeError(f"only {run.accepted} of {records} records accepted before {IDLE_STOP_S} s without records")
    return run


def commit(consumer: ShareConsumer, run: WorkloadRun) -> None:
    """One commit_sync (a ShareAcknowledge round trip), timed; raises if a partition failed."""
    started = time.perf_counter()
    results = consumer.commit_sync(30)
    run.round_trips.append(time.perf_counter() - started)
    failed = {f"{tp.topic}[{tp.partition}]": str(error) for tp, error in results.items() if error is not None}
    if failed:
        raise RuntimeError(f"acknowledgement failed: {failed}")


def log_bytes(directories: Iterable[Path]) -> int:
    """The size of the .log segment files in these partition directories."""
    return sum(f.stat().st_size for d in directories for f in d.glob("*.log"))


def wait_quiet(dirs_of: Callable[[], dict[int, Path]], quiet_s: float = 2.0, limit_s: float = 30.0) -> None:
    """Until the state topic's files stop growing for ``quiet_s`` (the last linger, a leave)."""
    def size() -> int:
        return log_bytes(dirs_of().values())
    deadline = time.monotonic() + limit_s
    last, since = size(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = size()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


@dataclass
class Measured:
    side: str
    workload: str
    run: WorkloadRun
    state: LogUsage  # what the workload added (records decoded from its first state offset)
    disk_bytes: int  # growth of the .log files
    records_written: int  # growth of the end offsets (segment files)
    kafka_records_written: int  # growth of the end offsets (the broker's watermarks)
    segments: int  # the most .log files of one partition
    log_start_offsets: dict[int, int]
    delta: DeltaEstimate | None = None
    # Proxy sides: the bytes its upstream Fetches brought back during the workload, and the
    # workload topic's log bytes (its .log files): how often each log byte was read.
    upstream_read_bytes: float | None = None
    topic_log_bytes: int = 0
    # ... and what its read-cache budget dropped to make room meanwhile (None: not measured).
    read_cache_evicted_bytes: float | None = None

    def per_accepted(self, amount: float) -> float:
        return amount / self.run.accepted if self.run.accepted else float("nan")

    @property
    def share_partition_bytes(self) -> int:
        """Disk growth less the batches of group records only (what native writes to __share_group_state)."""
        return self.disk_bytes - self.state.group_batch_bytes


def deltas_on(flags: Sequence[str]) -> bool:
    """Whether these serve flags turn cumulative ShareUpdates on (--state-deltas on)."""
    return any(flag == "--state-deltas" and value.lower() == "on" for flag, value in zip(flags, flags[1:]))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


UPSTREAM_READ = "ksp_share_upstream_fetch_bytes_total"
EVICTED = "ksp_share_read_cache_evicted_bytes_total"


def proxy_counters(metrics_port: int, *names: str) -> tuple[float | None, ...]:
    """Unlabelled counters of the proxy's so far, from one scrape (None: an older tree without one;
    share_bench.proxy_counter reads 0 there, which would pass for nothing read or dropped)."""
    samples = proxy_samples(f"http://127.0.0.1:{metrics_port}/metrics")
    return tuple(samples.get((name, ())) for name in names)


def gc_pauses(metrics_port: int) -> str:
    """The proxy's collections so far, per generation: how many, their total pause, how many
    paused 25 ms or more (a proxy without ``ksp_gc_pause_seconds``, e.g. an older tree: says so)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    per: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "ksp_gc_pause_seconds":
            continue
        for sample in family.samples:
            generation = per.setdefault(sample.labels["generation"], {})
            if sample.name.endswith("_count"):
                generation["count"] = sample.value
            elif sample.name.endswith("_sum"):
                generation["sum"] = sample.value
            elif sample.name.endswith("_bucket") and sample.labels["le"] == "0.01":
                generation["under_10ms"] = sample.value
            elif sample.name.endswith("_bucket") and sample.labels["le"] == "0.025":
                generation["under_25ms"] = sample.value
    if not per:
        return "not measured (no ksp_gc_pause_seconds)"
    return "; ".join(
        f"generation {g}: {int(v.get('count', 0))} collections, {v.get('sum', 0) * 1e3:.1f} ms in all, "
        f"{int(v.get('count', 0) - v.get('under_10ms', 0))} of 10 ms or more, "
        f"{int(v.get('count', 0) - v.get('under_25ms', 0))} of 25 ms or more"
        for g, v in sorted(per.items()))


def run_side(side: str, args: argparse.Namespace, kafka: LocalKafka, bootstrap: str, state_topic: str,
             prepare_group: Callable[[str], None], metrics_port: int | None = None) -> list[Measured]:
    """Each workload on this side; with the proxy's `metrics_port`, also what its upstream reads
    brought back (``ksp_share_upstream_fetch_bytes_total``) against the workload topic's log."""
    assert kafka.data_dir is not None
    log_dir = kafka.data_dir / "kraft"

    def dirs() -> dict[int, Path]:
        return partition_dirs(log_dir, state_topic)

    def counters() -> tuple[float | None, float | None]:
        """What the proxy read upstream and what its read-cache budget dropped, so far."""
        return proxy_counters(metrics_port, UPSTREAM_READ, EVICTED) if metrics_port else (None, None)

    def workload(name: str, records: int) -> tuple[WorkloadRun, str, float | None, float | None, int]:
        topic = create_topics(kafka.bootstrap, [unique_name(f"state-bench-{name}")], partitions=args.partitions)[0]
        produce(Target("direct", kafka.bootstrap), topic, args.partitions, records, args.size, "none")
        # Unless flushed first, the records just produced are written back by the kernel while they
        # are consumed, on whichever side that falls (vmstat in a goals run, 2026-11-28: ~200 MB/s
        # written and up to 27 % iowait during the workloads).
        settle_machine(max_wait_s=30.0)
        group = unique_name(f"state-bench-{name}")
        prepare_group(group)
        window = name == "window"
        before = counters()
        run = consume(bootstrap, topic, group, records, fragmented=name in ("fragmented", "window"),
                      release_fraction=args.release_fraction, seed=args.seed,
                      commit_every=args.commit_every if window else 0,
                      max_poll_records=args.window_poll_records if window else 0)
        read, evicted = (None if b is None or a is None else a - b for b, a in zip(before, counters()))
        return run, group, read, evicted, log_bytes(partition_dirs(log_dir, topic).values())

    workload("warmup", WARMUP_RECORDS)
    wait_quiet(dirs)
    results = []
    for name in args.workloads:
        before = read_state_log(dirs())
        kafka_before = kafka_offsets(kafka.bootstrap, state_topic)
        print(f"  {side} {name}: load {load()} before", file=sys.stderr, flush=True)
        run, _, upstream_read, evicted, topic_log = workload(name, args.records)
        wait_quiet(dirs)
        estimate = side.startswith("proxy") and not deltas_on(args.variant_flags.get(side, ()))
        after = read_state_log(dirs(), before.end_offsets, keep_snapshots=estimate)
        kafka_after = kafka_offsets(kafka.bootstrap, state_topic)
        measured = Measured(
            side, name, run, after,
            disk_bytes=after.disk_bytes - before.disk_bytes,
            records_written=after.end_offset - before.end_offset,
            kafka_records_written=sum(high for _, high in kafka_after.values())
            - sum(high for _, high in kafka_before.values()),
            segments=after.max_segments, log_start_offsets={p: low for p, (low, _) in kafka_after.items()},
            upstream_read_bytes=upstream_read, topic_log_bytes=topic_log, read_cache_evicted_bytes=evicted,
        )
        if estimate:
            measured.delta = delta_scheme(after.snapshots, args.snapshot_every)
        after.snapshots = []
        results.append(measured)
        print(f"  {side} {name}: {run.accepted:,} accepted, {run.released:,} released, {len(run.round_trips)} commits, "
              f"{run.poll_records / max(run.polls, 1):,.0f} records per poll, "
              f"{measured.disk_bytes:,} state bytes, {measured.records_written:,} state records, "
              f"commit p50 {percentile(run.round_trips, 0.5) * 1000:.2f} ms; load {load()} after",
              file=sys.stderr, flush=True)
    return results


# ----- the report ----------------------------------------------------------------------------------------


def report(results: Sequence[Measured], args: argparse.Namespace) -> tuple[str, dict]:
    by = {(m.side, m.workload): m for m in results}
    lines = [
        "| workload | side | accepted | released | commits | share-partition acks | state bytes (disk) | state records | "
        "bytes / accepted | share-partition bytes / accepted | records / accepted | records / share-partition ack | "
        "commit p50 ms | commit p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    numbers: dict = {"workloads": {}}
    sides = list(dict.fromkeys(m.side for m in results))
    for name in args.workloads:
        for side in sides:
            m = by.get((side, name))
            if m is None:
                continue
            trips = m.run.round_trips
            lines.append(
                f"| {name} | {side} | {m.run.accepted:,} | {m.run.released:,} | {len(trips):,} | "
                f"{m.run.partition_commits:,} | {m.disk_bytes:,} | {m.records_written:,} | "
                f"{m.per_accepted(m.disk_bytes):.2f} | {m.per_accepted(m.share_partition_bytes):.2f} | "
                f"{m.per_accepted(m.records_written):.4f} | "
                f"{m.records_written / max(m.run.partition_commits, 1):.2f} | "
                f"{percentile(trips, 0.5) * 1000:.2f} | {percentile(trips, 0.99) * 1000:.2f} |")
            numbers["workloads"].setdefault(name, {})[side] = {
                "accepted": m.run.accepted, "released": m.run.released, "polls": m.run.polls,
                "partition_commits": m.run.partition_commits,
                "commits": len(trips), "seconds": round(m.run.seconds, 2),
                "records_per_poll": m.run.poll_records / max(m.run.polls, 1),
                "disk_bytes": m.disk_bytes, "batch_bytes": m.state.batch_bytes, "batches": m.state.batches,
                "records_written": m.records_written, "kafka_records_written": m.kafka_records_written,
                "segments": m.segments, "log_start_offsets": m.log_start_offsets,
                "bytes_per_accepted": m.per_accepted(m.disk_bytes),
                "group_batch_bytes": m.state.group_batch_bytes,
                "share_partition_bytes_per_accepted": m.per_accepted(m.share_partition_bytes),
                "records_per_accepted": m.per_accepted(m.records_written),
                "commit_p50_ms": percentile(trips, 0.5) * 1000, "commit_p99_ms": percentile(trips, 0.99) * 1000,
                # Every round trip, in order: a p99 of ~130 commits is the second slowest, worth seeing whole.
                "commit_ms": [round(t * 1000, 3) for t in trips],
                "by_type": {k: dataclasses.asdict(v) for k, v in m.state.by_type.items()},
                "delta_estimate": dataclasses.asdict(m.delta) if m.delta else None,
            }
    lines += ["", "| workload | proxy side | bytes / accepted proxy / native | share-partition bytes proxy / native | "
                  "records / accepted proxy / native | commit p50 proxy - native ms | commit p99 proxy - native ms |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name in args.workloads:
        native = by.get(("native", name))
        for side in sides:
            proxy = by.get((side, name))
            if not side.startswith("proxy") or not proxy or not native:
                continue
            ratios = {
                "bytes": proxy.per_accepted(proxy.disk_bytes) / native.per_accepted(native.disk_bytes),
                "share_partition_bytes": proxy.share_partition_bytes / native.share_partition_bytes
                * native.run.accepted / proxy.run.accepted,
                "records": proxy.per_accepted(proxy.records_written) / native.per_accepted(native.records_written),
                "p50_ms": (percentile(proxy.run.round_trips, 0.5) - percentile(native.run.round_trips, 0.5)) * 1000,
                "p99_ms": (percentile(proxy.run.round_trips, 0.99) - percentile(native.run.round_trips, 0.99)) * 1000,
            }
            numbers["workloads"][name][side]["vs_native"] = ratios
            if side == "proxy":
                numbers["workloads"][name]["proxy_vs_native"] = ratios
            lines.append(f"| {name} | {side} | {ratios['bytes']:.2f} | {ratios['share_partition_bytes']:.2f} | "
                         f"{ratios['records']:.2f} | "
                         f"{ratios['p50_ms']:+.2f} | {ratios['p99_ms']:+.2f} |")
    variants = [side for side in sides if side.startswith("proxy-")]
    if len(variants) >= 2:
        first = variants[0]
        lines += ["", f"Proxy variants against {first} (same workload, one run):", "",
                  "| workload | variant | bytes / accepted, variant / " + first + " | commit p50 ms, variant − " + first
                  + " | commit p99 ms, variant − " + first + " |", "|---|---|---:|---:|---:|"]
        for name in args.workloads:
            base = by.get((first, name))
            for side in variants[1:]:
                m = by.get((side, name))
                if not base or not m:
                    continue
                ratio = m.per_accepted(m.disk_bytes) / base.per_accepted(base.disk_bytes)
                p50 = (percentile(m.run.round_trips, 0.5) - percentile(base.run.round_trips, 0.5)) * 1000
                p99 = (percentile(m.run.round_trips, 0.99) - percentile(base.run.round_trips, 0.99)) * 1000
                numbers["workloads"][name][side][f"vs_{first}"] = {"bytes": ratio, "p50_ms": p50, "p99_ms": p99}
                lines.append(f"| {name} | {side} | {ratio:.2f} | {p50:+.2f} | {p99:+.2f} |")
    read = [m for m in results if m.upstream_read_bytes is not None]
    if read:
        lines += ["", "What each proxy side read upstream while consuming (its Fetches' log bytes, "
                      "ksp_share_upstream_fetch_bytes_total) against the workload topic's log (.log files):", ""]
        for m in read:
            times = m.upstream_read_bytes / m.topic_log_bytes if m.topic_log_bytes else float("nan")
            numbers["workloads"][m.workload][m.side] |= {
                "upstream_read_bytes": m.upstream_read_bytes, "topic_log_bytes": m.topic_log_bytes,
                "upstream_read_per_log_byte": times, "read_cache_evicted_bytes": m.read_cache_evicted_bytes}
            evicted = "" if m.read_cache_evicted_bytes is None else \
                f"; the read-cache budget dropped {m.read_cache_evicted_bytes / (1 << 20):,.1f} MiB to make room"
            lines.append(f"- {m.workload}, {m.side}: {m.upstream_read_bytes / (1 << 20):,.1f} MiB read for a "
                         f"{m.topic_log_bytes / (1 << 20):,.1f} MiB log ({times:.2f} x){evicted}")
    lines += ["", "State records by type (key + value bytes, uncompressed; the largest value):", ""]
    for m in results:
        kinds = ", ".join(f"{k} {v.records:,} x {(v.key_bytes + v.value_bytes) / max(v.records, 1):,.0f} B "
                          f"(max {v.max_value_bytes:,})" for k, v in sorted(m.state.by_type.items()))
        check = "" if m.records_written == m.kafka_records_written else \
            f"; NOTE the broker's end offsets say {m.kafka_records_written:,}"
        lines.append(f"- {m.workload}, {m.side}: {kinds}; {m.state.batches:,} batches; at most {m.segments} segment file(s) per partition, "
                     f"log start offsets {m.log_start_offsets}{check}")
    lines += ["", f"Delta-per-change estimate from the proxy's snapshots (a full snapshot every {args.snapshot_every} "
                  "changes per share-partition; framing per record as measured on the native log):", ""]
    for m in results:
        if m.delta is None:
            continue
        native = by.get(("native", m.workload))
        logical = sum(v.key_bytes + v.value_bytes for v in m.state.by_type.values())
        framing = None
        if native and native.records_written:
            native_logical = sum(v.key_bytes + v.value_bytes for v in native.state.by_type.values())
            framing = (native.disk_bytes - native_logical) / native.records_written
        snapshot_logical = m.state.by_type.get(RecordType.SHARE_SNAPSHOT.name, TypeUsage())
        d = m.delta
        estimate_disk = d.logical_bytes + framing * d.records if framing is not None else float("nan")
        numbers["workloads"][m.workload][m.side]["delta_estimate"] |= {
            "framing_per_record": framing, "estimated_disk_bytes": estimate_disk,
            "estimated_bytes_per_accepted": m.per_accepted(estimate_disk)}
        native_per = native.per_accepted(native.disk_bytes) if native else float("nan")
        lines.append(
            f"- {m.workload}: the proxy wrote {snapshot_logical.records:,} snapshots, "
            f"{snapshot_logical.key_bytes + snapshot_logical.value_bytes:,} B uncompressed ({logical:,} B with its group "
            f"records; {m.disk_bytes:,} B on disk with lz4). As deltas: {d.updates:,} updates carrying {d.update_ranges:,} "
            f"ranges ({d.update_bytes:,} B) + {d.snapshots:,} snapshots ({d.snapshot_bytes:,} B) = {d.logical_bytes:,} B, "
            f"~{estimate_disk:,.0f} B on disk uncompressed (framing {framing or 0:.0f} B/record): "
            f"{m.per_accepted(estimate_disk):.2f} B per accepted record vs native {native_per:.2f}. Encoding every "
            f"change: as snapshots {d.snapshot_encode_s * 1000:,.1f} ms, as updates {d.update_encode_s * 1000:,.1f} ms "
            f"(codec, this process)")
    return "\n".join(lines), numbers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per workload")
    parser.add_argument("--size", type=int, default=1024, help="record value size in bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["easy", "fragmented"],
                        help="comma separated: easy, fragmented, window")
    parser.add_argument("--commit-every", type=int, default=50,
                        help="window: a commit_sync after every N acknowledgements")
    parser.add_argument("--window-poll-records", type=int, default=2000,
                        help="window: max.poll.records of the consumer")
    parser.add_argument("--proxy-variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="run the proxy side once per variant with these extra serve flags (repeatable), "
                             "e.g. 'off=--state-deltas off'")
    parser.add_argument("--variant-tree", action="append", default=[], metavar="NAME=PATH",
                        help="run --proxy-variant NAME from the checkout at PATH (repeatable)")
    parser.add_argument("--release-fraction", type=float, default=0.1,
                        help="fragmented: fraction of records released once, then accepted")
    parser.add_argument("--seed", type=int, default=14, help="which records are released, and the ack order")
    parser.add_argument("--snapshot-every", type=int, default=KAFKA_SNAPSHOT_EVERY,
                        help="the delta estimate's full snapshot every N changes (Kafka's default 500)")
    parser.add_argument("--sides", type=lambda s: s.split(","), default=["proxy", "native"])
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--keep-logs", action="store_true", help="keep the broker data and proxy logs")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    unknown = set(args.workloads) - {"easy", "fragmented", "window"}
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}")
    args.variant_flags = {}
    for variant in args.proxy_variant:
        name, _, flags = variant.partition("=")
        if not name:
            parser.error(f"--proxy-variant {variant!r}: NAME=FLAGS")
        args.variant_flags[f"proxy-{name}"] = tuple(shlex.split(flags))
    if not args.variant_flags:
        args.variant_flags["proxy"] = ()
    args.variant_trees = {}
    for variant in args.variant_tree:
        name, _, tree = variant.partition("=")
        if f"proxy-{name}" not in args.variant_flags or not tree:
            parser.error(f"--variant-tree {variant!r}: NAME=PATH for a --proxy-variant NAME")
        args.variant_trees[f"proxy-{name}"] = str(Path(tree).resolve())

    work = Path(tempfile.mkdtemp(prefix="state-bench-"))
    started = time.monotonic()
    loads = [f"start {load()}"]
    print(f"Apache Kafka {args.kafka_version}, {args.records:,} records x {args.size} B on {args.partitions} "
          f"partitions per workload; work directory {work}; load {load()}", file=sys.stderr, flush=True)
    results: list[Measured] = []
    pauses: list[str] = []  # the proxy sides' garbage-collection pauses
    try:
        if "proxy" in args.sides:
            for side, flags in args.variant_flags.items():
                with LocalKafka(version=args.kafka_version, share_groups=False, data_dir=work / side) as kafka:
                    state_topic = "__share_proxy_state"
                    metrics_port = free_port()
                    extra = ("--share-auto-offset-reset", "earliest", "--state-topic", state_topic,
                             "--log-level", "warning", "--metrics-port", str(metrics_port), *flags)
                    tree = args.variant_trees.get(side)
                    launcher = (sys.executable, "-P", "-m", "proxy.cli") if tree else ()
                    with ProxyProcess(upstream=kafka.bootstrap, log_path=work / f"{side}.log", extra_args=extra,
                                      launcher=launcher, env={"PYTHONPATH": tree} if tree else None) as proxy:
                        results += run_side(side, args, kafka, proxy.bootstrap, state_topic, lambda group: None,
                                            metrics_port)
                        pauses.append(f"- {side}: {gc_pauses(metrics_port)}")
                loads.append(f"after {side} {load()}")
        if "native" in args.sides:
            with LocalKafka(version=args.kafka_version, share_groups=True, data_dir=work / "native-kafka") as kafka:
                results += run_side("native", args, kafka, kafka.bootstrap, NATIVE_STATE_TOPIC,
                                    lambda group: set_native_share_reset_earliest(kafka.bootstrap, group))
            loads.append(f"after the native side {load()}")
    finally:
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    text, numbers = report(results, args)
    print(text)
    if pauses:
        print("\nGarbage-collection pauses of each proxy (its whole life, start-up included; "
              "ksp_gc_pause_seconds):\n")
        print("\n".join(pauses))
    print(f"\n{args.records:,} records x {args.size} B, {args.partitions} partitions, one explicit-mode "
          f"confluent_kafka.ShareConsumer, commit_sync per poll; fragmented: {args.release_fraction:.0%} released once "
          f"(seed {args.seed}), acks shuffled per poll; Apache Kafka {args.kafka_version}; "
          f"{time.monotonic() - started:.0f} s in all; load average {'; '.join(loads)}")
    if args.json:
        numbers |= {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "loads": loads}
        args.json.write_text(json.dumps(numbers, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
