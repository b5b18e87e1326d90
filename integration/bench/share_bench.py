"""Share-consumption throughput: the proxy's share groups vs Kafka's native share groups.

One run measures, with the same record count and size:

* **plain consumer group, direct** -- Kafka's ConsumerPerformance against the broker;
* **plain consumer group, proxy** -- the same tool through `share-proxy serve`;
* **share group, proxy** -- Kafka's ShareConsumerPerformance (KafkaShareConsumer, implicit
  acknowledgement) through the proxy, with 1, 4 and 16 consumers (the tool's --threads);
* **share group, native** -- the same tool against the broker itself, with Kafka's own share
  groups (KIP-932), with 1, 4 and 16 consumers.

One broker, started with Kafka's share groups enabled, serves both: the proxy in front of it
serves share groups itself (its state on a topic of its own), the native runs go to the broker
directly. Each measurement's sides run back to back, the side that goes first rotating from cell
to cell and from repeat to repeat (so with as many repeats as sides every cell runs each side in
every position; until stop 35 a cell kept its order in every repeat, and a side run second in a
pair measured a few percent faster), so the machine's speed, which drifts by tens of percent over
minutes here, hits both alike (``--no-native`` leaves native out, for ``--proxy-trees`` alone; before
2026-11-27 the proxied runs had a broker of their own and the native runs a second one after it,
minutes apart: ``--separate-brokers``). Every measurement consumes a fresh group from the earliest
offset (share groups via share.auto.offset.reset=earliest: the proxy's --share-auto-offset-reset
flag, the native group's config).

Before the measured repeats each share side runs once, unmeasured (``--no-warm-up`` skips it): in a
freshly started broker the first repeat measured every side, the plain consumer group included, at
about half the rate of the later ones while the broker's JIT compiled its fetch and share paths.

The perf tools come from the kafka-tools jar, which the broker's classpath lacks: it is fetched
from Maven Central into ~/.m2 with `mvn dependency:get` (the broker's own version when published,
else the newest published 4.x listed below) and run on the broker's jar cache (kafka-clients of the
broker's version).

Two rates per measurement, from the tools' own output (their MB are MiB): the **whole run**, from
the tool's start (before the group join) to the last record, and **after the first record**, from
the first record any consumer received to the last (the share tool's progress rows tell when each
consumer got its first record; ConsumerPerformance reports its post-join fetch time). The proxy's
`ksp_share_records_acquired` counter is read around each proxied share run: acquisitions beyond the
record count would mean redeliveries inflated the tool's count.

Each share run also reports what its consumers saw (the tool's ``--print-metrics``, the Java
client's own share-fetch metrics): their ShareFetch requests, the round trip of each (request sent
to response received, the transfer included) and the records in each. A consumer's cycle while
records stream is that round trip plus its own time with the records before it asks again; a
table per shape sets proxy against native on both, so a gap in the rate shows where it comes from.
And what each share run's streaming (first record to last) cost the machine, sampled every 50 ms:
CPU seconds per million records of the consumers' JVM, the broker, the proxy and the whole machine
(/proc/stat, the kernel's loopback work included), and how busy its cores were -- on a machine
whose cores are all busy, two sides' rates go roughly as the inverse of their machine totals.

    .venv/bin/python -m integration.bench.share_bench --records 200000 --size 1024 --repeat 2

``--partitions 4,32`` measures several topic shapes in one run (a topic per shape on each broker,
a table per shape). ``--proxy-trees before=/tmp/base,after=.`` runs one proxy per source tree
(``PYTHONPATH`` set to the tree, so an older checkout's code serves), all in front of the same
broker, and measures each tree's share runs side by side in alternating order (which tree goes
first rotates every measurement), so a load that comes and goes hits all trees alike; a table of
each tree against the first follows.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.share_bench --partitions 4,32 \\
        --proxy-trees before=/tmp/reads-before,after=$PWD --repeat 2

``--variant glibc-arenas="--malloc-arenas 0"`` (repeatable) adds a proxy from the current tree
started with those extra ``serve`` arguments, measured in the same rounds: a setting against the
defaults without a second checkout. Without ``--proxy-trees`` the current tree's own proxy is
named ``default``, and the variants are compared with it.

With ``--share-authorization off,cluster`` it measures instead what enforcing the cluster's ACLs
costs (proxy/share/authorization.py): the proxied share runs only, once per mode, each with a
proxy started with that ``--share-authorization`` mode on a broker without an authorizer (so
``cluster`` sends every probe and finds everything allowed), and the ratio of each mode to the
first. ``cluster:0`` is cluster mode without the cache (``--share-authorization-cache-ms 0``: every
request probes), the worst case.

    .venv/bin/python -m integration.bench.share_bench --share-authorization off,cluster,cluster:0 --consumers 1,4

Where the proxy's Python time goes, three ways, each per proxied share run: ``--py-spy`` samples
the thread holding Python's lock; ``--perf`` records every thread, kernel included, by library and
symbol; ``--cprofile`` runs the proxy under cProfile (``cprofiled.py``, switched on and off by
signals around the run) timed by the trio thread's own CPU clock, and lists its functions with
their CPU and calls per ShareFetch the consumers sent -- exact call counts, at a third to a half of
the unprofiled rate.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.share_bench --records 1000000 \\
        --consumers 1,16 --no-native --cprofile --profile-top 30

``--hop`` adds one more side to every cell: Kafka's native share groups reached through a bare TCP
hop (``integration.bench.hop``: splice threads, no Kafka spoken, nothing per byte in Python; the
broker gets a second listener that advertises the hop, as in ``passthrough --hop``). What it
measures against native is what one more process on the path costs share consumption on this
machine before any proxy does work of its own; its row carries the hop's CPU in the proxy column.

Native hands out whole log batches, so a topic's batches shape its ShareFetches (stop 55). Topics
are filled one partition after another in full 1 MB batches (about 960 records of 1 KiB), the
same cut every run, and each topic's batches are printed when it is made. ``--fill round-robin``
fills as goal runs 11-41 did: round robin with linger.ms 5, whose batches on 32 partitions came
out at a median of 52 to 960 records from topic to topic.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import itertools
import json
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from prometheus_client.parser import text_string_to_metric_families

from codec.records import RecordBatchHeader, iter_batches
from integration.bench.passthrough import Target, parse_variant, produce, split, start_kafka_behind_a_hop
from integration.bench.procfs import proc_status_kib, process_cpu_seconds
from integration.kafka_fixtures import ProxyProcess, admin_client, create_topics, kafka_tools_jar, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka
from proxy.localkafka.broker import find_java, free_port
from proxy.localkafka.jars import fetch_kafka

TOOL_PACKAGE = "org.apache.kafka.tools"
# The tools print a header line ("start.time, end.time, data.consumed.in.MB, MB.sec, ...") and one
# line of values; the column order differs between ConsumerPerformance and ShareConsumerPerformance.
TOOL_DATE_FORMAT = "%Y-%m-%d %H:%M:%S:%f"


@dataclass(frozen=True, slots=True)
class ClientFetches:
    """ShareFetch as the Java consumers saw it: their own share-fetch-manager metrics, summed over
    the run's consumers (the round trip and records per fetch weighted by each one's fetches)."""

    fetches: int  # ShareFetch requests sent (fetch-total), the closing empty long polls included
    round_trip_ms: float  # fetch-latency-avg: request sent to response received, transfer included
    records_per_fetch: float  # records-per-request-avg

    def cycle_ms(self, measurement: Measurement) -> float:
        """Mean time from one ShareFetch of a consumer to its next while records streamed: the
        round trip plus the consumer's own time with the records."""
        per_consumer = self.fetches / max(measurement.consumers, 1)
        return (measurement.seconds - measurement.first_record_s) * 1000 / max(per_consumer, 1)

    def own_time_ms(self, measurement: Measurement) -> float:
        """The consumer's time with the records in each cycle: the cycle less the round trip."""
        return self.cycle_ms(measurement) - self.round_trip_ms


_CLIENT_METRIC = re.compile(
    r"^consumer-share-fetch-manager-metrics:(fetch-total|fetch-latency-avg|records-per-request-avg):"
    r"\{client-id=([^}]*)\}\s*:\s*([-+0-9.eE]+|NaN)\s*$")


def parse_client_fetches(output: str) -> ClientFetches | None:
    """The share consumers' fetch metrics from ShareConsumerPerformance --print-metrics output."""
    per_client: dict[str, dict[str, float]] = {}
    for line in output.splitlines():
        if (match := _CLIENT_METRIC.match(line.strip())) and match[3] != "NaN":
            per_client.setdefault(match[2], {})[match[1]] = float(match[3])
    counted = [m for m in per_client.values() if m.get("fetch-total") and len(m) == 3]
    if not counted:
        return None
    fetches = sum(m["fetch-total"] for m in counted)
    return ClientFetches(
        fetches=int(fetches),
        round_trip_ms=sum(m["fetch-latency-avg"] * m["fetch-total"] for m in counted) / fetches,
        records_per_fetch=sum(m["records-per-request-avg"] * m["fetch-total"] for m in counted) / fetches,
    )


@dataclass(frozen=True, slots=True)
class Measurement:
    label: str
    path: str  # "direct", "proxy", "native" or "native-hop"
    kind: str  # "consumer group" or "share group"
    consumers: int
    records: int
    megabytes: float  # MiB, as the Kafka tools count
    seconds: float  # the tool's whole run: group join, assignment, consumption
    first_record_s: float  # from the tool's start to the first record
    acquired: int | None = None  # records the proxy acquired during the run (its metrics)
    partitions: int = 0  # of the topic consumed (one topic per --partitions shape)
    proxy_cpu_s: float | None = None  # CPU the proxy process used during the run (all its threads)
    client: ClientFetches | None = None  # the share consumers' own fetch metrics (--print-metrics)
    cpu: CpuUse | None = None  # what the streaming part cost the whole machine, by whom (share runs)
    started_at: float | None = None  # the tool's start.time, seconds since the epoch (share runs)
    proxy_rss_kib: int | None = None  # the proxy's resident memory after the run (/proc VmRSS)
    proxy_peak_rss_kib: int | None = None  # its peak so far, the proxy's life until then (VmHWM)

    @classmethod
    def from_json(cls, numbers: dict) -> Measurement:
        """A measurement from the --json file (its derived rates dropped)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in numbers.items() if k in fields}
        if kept.get("client") is not None:
            kept["client"] = ClientFetches(**kept["client"])
        if kept.get("cpu") is not None:
            kept["cpu"] = CpuUse(**kept["cpu"])
        return cls(**kept)

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        return self.megabytes / self.seconds

    @property
    def streaming_records_per_second(self) -> float:
        """From the first record to the last: the rate once the group has settled."""
        return self.records / max(self.seconds - self.first_record_s, 1e-3)

    @property
    def streaming_megabytes_per_second(self) -> float:
        return self.megabytes / max(self.seconds - self.first_record_s, 1e-3)


# ----- the Kafka perf tools ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuUse:
    """CPU seconds a share run cost while its records streamed (from the first record any consumer
    got to the last; the JVM start and the group join left out): the whole machine's busy time
    (/proc/stat, every core, the kernel's work for loopback TCP included) and, within it, the broker,
    the consumers' JVM (the perf tool) and the proxy (0 for a native run)."""

    window_s: float  # wall-clock seconds the accounting covered
    machine_s: float
    broker_s: float
    consumers_s: float
    proxy_s: float
    cores: int

    def per_million(self, records: int) -> dict[str, float]:
        scale = 1e6 / max(records, 1)
        return {"consumers": self.consumers_s * scale, "broker": self.broker_s * scale,
                "proxy": self.proxy_s * scale, "machine": self.machine_s * scale}

    @property
    def busy(self) -> float:
        """The machine's busy share over the window (1.0: every core busy the whole time)."""
        return self.machine_s / max(self.window_s * self.cores, 1e-9)


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def settle_machine(max_wait_s: float = 60.0, busy_below: float = 0.1, sample_s: float = 1.0, *,
                   ticks: Callable[[], tuple[int, int]] = cpu_ticks, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic, sync: Callable[[], None] = os.sync) -> float:
    """Write the page cache's dirty pages out (sync(2)) and wait until the cores are idle --
    busy under `busy_below` over one `sample_s` -- or `max_wait_s` has passed; returns the seconds
    it took. A benchmark part that writes gigabytes of log leaves the kernel writing them back for
    seconds after it ends (1 GB/s at 80 % system time in a goals run, 2026-11-28 07:43), and
    whatever is measured next measures that too."""
    started = clock()
    sync()
    while clock() - started < max_wait_s:
        busy_before, total_before = ticks()
        sleep(sample_s)
        busy_after, total_after = ticks()
        if busy_after - busy_before < busy_below * max(total_after - total_before, 1):
            break
    return clock() - started


def machine_busy_seconds() -> float | None:
    """Busy CPU seconds of every core so far (:func:`cpu_ticks`), None without /proc."""
    try:
        busy, _ = cpu_ticks()
    except OSError:
        return None
    return busy / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples, every `interval_s` on a thread of its own, the machine's busy CPU and that of the
    broker, the proxy and the consumers' JVM (its pid given once the tool started), so the CPU of
    any window inside the run -- the streaming part, known only from the tool's output afterwards
    -- can be read off (:meth:`window`)."""

    def __init__(self, broker_pid: int | None, proxy_pid: int | None, interval_s: float = 0.05) -> None:
        self._pids = {"broker": broker_pid, "proxy": proxy_pid, "consumers": None}
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self.samples: list[tuple[float, float, float, float, float]] = []  # wall, machine, broker, proxy, consumers

    def consumers_started(self, pid: int) -> None:
        self._pids["consumers"] = pid

    def _sample(self) -> None:
        machine = machine_busy_seconds()
        if machine is None:
            return
        by_process = [process_cpu_seconds(pid) if pid else 0.0 for pid in self._pids.values()]
        if any(value is None for value in by_process):
            return  # a process gone between its pid and its stat: skip this instant
        self.samples.append((time.time(), machine, *by_process))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, start: float, end: float) -> CpuUse | None:
        """The CPU between two wall-clock instants (interpolated between samples); None when the
        samples do not cover them (no /proc, or the window outside the run)."""
        samples = self.samples
        if len(samples) < 2 or start < samples[0][0] or end > samples[-1][0] or end <= start:
            return None

        def at(instant: float) -> list[float]:
            after = next(i for i, sample in enumerate(samples) if sample[0] >= instant)
            if after == 0:
                return list(samples[0][1:])
            (t0, *v0), (t1, *v1) = samples[after - 1], samples[after]
            share = (instant - t0) / (t1 - t0) if t1 > t0 else 1.0
            return [a + (b - a) * share for a, b in zip(v0, v1, strict=True)]

        machine, broker, proxy, consumers = (b - a for a, b in zip(at(start), at(end), strict=True))
        return CpuUse(end - start, machine, broker, consumers, proxy, os.cpu_count() or 1)


def streaming_cpu(sampler: CpuSampler, measured: Measurement) -> CpuUse | None:
    """What `measured`'s streaming part (first record to last) cost, from `sampler`."""
    if measured.started_at is None:
        return None
    return sampler.window(measured.started_at + measured.first_record_s, measured.started_at + measured.seconds)


@dataclass(frozen=True, slots=True)
class PerfTools:
    java: str
    classpath: str
    tools_version: str

    def run(self, tool: str, arguments: Sequence[str], timeout: float,
            on_start: Callable[[int], None] | None = None) -> str:
        """The tool's output; `on_start` hears its JVM's pid as soon as it runs."""
        command = [self.java, "-Xmx1g", "-cp", self.classpath, f"{TOOL_PACKAGE}.{tool}", *arguments]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
            if on_start is not None:
                on_start(process.pid)
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        if process.returncode != 0:
            raise RuntimeError(f"{tool} exited {process.returncode}:\n{stdout[-2000:]}\n{stderr[-2000:]}")
        return stdout


def perf_tools(broker_version: str) -> PerfTools:
    libs = fetch_kafka(broker_version)
    jar = kafka_tools_jar(broker_version)
    # kafka-clients and the tools' other dependencies come from the broker's own classpath.
    return PerfTools(find_java(), f"{jar}{os.pathsep}{libs / '*'}", jar.parent.name)


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text.strip(), TOOL_DATE_FORMAT)


def parse_stats(output: str, what: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The tool's summary row and its per-consumer progress rows, as {column: value}."""
    names: list[str] = []
    summary: dict[str, str] | None = None
    progress: list[dict[str, str]] = []
    for line in output.splitlines():
        if line.startswith("start.time"):
            names = [name.strip() for name in line.split(",")]
        elif names and re.match(r"^\d{4}-\d\d-\d\d ", line):
            body, _, consumer = line.partition(" for share consumer ")
            row = dict(zip(names, (value.strip() for value in body.split(",")), strict=False))
            if consumer:
                progress.append(row | {"consumer": consumer.strip()})
            else:
                summary = row
    if summary is None:
        raise RuntimeError(f"{what}: no statistics in the tool's output:\n{output[-2000:]}")
    return summary, progress


def consumer_perf(tools: PerfTools, bootstrap: str, topic: str, records: int, label: str, path: str) -> Measurement:
    output = tools.run("ConsumerPerformance", [
        "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
        "--group", unique_name("bench-cg"), "--timeout", "30000",
    ], timeout=300)
    summary, _ = parse_stats(output, label)
    seconds = (_time(summary["end.time"]) - _time(summary["start.time"])).total_seconds()
    # fetch.time.ms is the run after the group join (rebalance.time.ms) completed.
    first_record_s = max(0.0, seconds - float(summary["fetch.time.ms"]) / 1000)
    return Measurement(label, path, "consumer group", 1, int(summary["data.consumed.in.nMsg"]),
                       float(summary["data.consumed.in.MB"]), seconds, first_record_s)


def share_perf(tools: PerfTools, bootstrap: str, topic: str, group: str, records: int, consumers: int,
               label: str, path: str, on_start: Callable[[int], None] | None = None) -> Measurement:
    output = tools.run("ShareConsumerPerformance", [
        "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
        "--group", group, "--threads", str(consumers), "--timeout", "30000",
        # Progress rows tell when each consumer got its first record (its first row is printed then).
        "--show-detailed-stats", "--reporting-interval", "100",
        # The consumers' own metrics at exit: their ShareFetch round trip and records per fetch.
        "--print-metrics",
    ], timeout=300, on_start=on_start)
    if "WARNING: Exiting before consuming" in output:
        raise RuntimeError(f"{label}: the tool timed out before consuming {records} records:\n{output[-2000:]}")
    summary, progress = parse_stats(output, label)
    started, ended = _time(summary["start.time"]), _time(summary["end.time"])
    first_rows = {row["consumer"]: row for row in reversed(progress)}  # the earliest row per consumer
    first_record = min((_time(row["end.time"]) for row in first_rows.values()), default=started)
    return Measurement(label, path, "share group", consumers, int(summary["data.consumed.in.nMsg"]),
                       float(summary["data.consumed.in.MB"]), (ended - started).total_seconds(),
                       (first_record - started).total_seconds(), client=parse_client_fetches(output),
                       started_at=started.timestamp())


def proxy_counter(metrics_url: str, name: str) -> float:
    """A counter's value from the proxy's Prometheus endpoint (0 before its first increment)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def proxy_samples(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on the proxy's Prometheus endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


LATENCY_SERIES = (  # (what, histogram name, labels)
    ("ShareFetch", "ksp_request_seconds", (("api", "ShareFetch"),)),
    ("ShareAcknowledge", "ksp_request_seconds", (("api", "ShareAcknowledge"),)),
    ("state write", "ksp_share_state_write_seconds", ()),
)


def sample_delta(before: dict, after: dict, name: str, labels: tuple = ()) -> float:
    """How much one sample of two proxy_samples() scrapes grew (0 when absent)."""
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)


def latency_breakdown(before: dict, after: dict, records: int) -> str:
    """Requests and state writes during a run, from the proxy's histograms: count, mean latency and
    the bucket holding the median. The median says more for ShareFetch: each consumer's last fetches
    of a run find the topic drained and long-poll for MaxWaitMs (500 ms), which lifts the mean of a
    few hundred fetches by several ms per consumer."""
    parts = []
    for what, name, labels in LATENCY_SERIES:
        count = sample_delta(before, after, f"{name}_count", labels)
        total = sample_delta(before, after, f"{name}_sum", labels)
        if count:
            median = _median_bucket(before, after, name, labels, count)
            parts.append(f"{what} {count:,.0f} x {1000 * total / count:.2f} ms" + (f" (median {median})" if median else ""))
    fetches = sample_delta(before, after, "ksp_request_seconds_count", LATENCY_SERIES[0][2])
    if fetches:
        parts.append(f"{records / fetches:,.0f} records per ShareFetch")
    return ", ".join(parts)


def upstream_reads(before: dict, after: dict, consumed_mib: float) -> str:
    """The proxy's own upstream Fetches during a run (its ksp_share_upstream_* counters): how many
    per ShareFetch, partitions in each, and the log bytes they read against the bytes consumed
    (above 1.0 by the batches' own headers; well above it, records read more than once)."""
    delta = functools.partial(sample_delta, before, after)
    reads = delta("ksp_share_upstream_fetches_total", (("kind", "read"),))
    polls = delta("ksp_share_upstream_fetches_total", (("kind", "long_poll"),))
    share_fetches = delta("ksp_request_seconds_count", LATENCY_SERIES[0][2])
    if not reads + polls or not share_fetches:
        return ""
    partitions = delta("ksp_share_upstream_fetch_partitions_total")
    read_mib = delta("ksp_share_upstream_fetch_bytes_total") / (1 << 20)
    consumed = f" for {consumed_mib:,.0f} MiB consumed ({read_mib / consumed_mib:.2f})" if consumed_mib else ""
    return (f"upstream Fetches {reads:,.0f} ({reads / share_fetches:.2f} per ShareFetch) and {polls:,.0f} long polls, "
            f"{partitions / (reads + polls):.1f} partitions each; {read_mib:,.0f} MiB read{consumed}")


def fetch_waits(before: dict, after: dict) -> str:
    """How the proxy's waiting ShareFetches ended during a run: wake-ups (every release, expiry or
    new upstream record wakes every waiting fetch), those whose next round found nothing to take,
    and fetches answered empty early because their own member pinned a full window."""
    delta = functools.partial(sample_delta, before, after)
    to_records = delta("ksp_share_fetch_wakeups_total", (("outcome", "records"),))
    to_nothing = delta("ksp_share_fetch_wakeups_total", (("outcome", "nothing"),))
    pinned = delta("ksp_share_fetch_self_pinned_total")
    if not to_records + to_nothing + pinned:
        return ""
    pinned_text = f"{pinned:,.0f} answered early (self-pinned)"
    if ("ksp_share_fetch_wakeups_total", (("outcome", "nothing"),)) not in after:
        return pinned_text  # a proxy tree from before the counter (--proxy-trees): not "woken 0 times"
    return f"waiting fetches woken {to_records + to_nothing:,.0f} times ({to_nothing:,.0f} to nothing), {pinned_text}"


def _median_bucket(before: dict, after: dict, name: str, labels: tuple, count: float) -> str:
    """The histogram bucket the run's median falls in, as "LO-HI ms" ("" without buckets)."""
    bounds = []
    for (sample, sample_labels), value in after.items():
        if sample != f"{name}_bucket":
            continue
        rest = tuple(item for item in sample_labels if item[0] != "le")
        if rest != labels:
            continue
        le = dict(sample_labels)["le"]
        bounds.append((float(le), value - before.get((sample, sample_labels), 0.0)))
    lower = 0.0
    for bound, cumulative in sorted(bounds):
        if cumulative >= count / 2:
            return f"{lower * 1000:g}-{bound * 1000:g} ms" if bound != float("inf") else f"over {lower * 1000:g} ms"
        lower = bound
    return ""


def proxy_counter_sum(metrics_url: str, name: str) -> float:
    """The sum of a labelled counter's series on the proxy's Prometheus endpoint."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(float(value) for value in re.findall(rf"^{re.escape(name)}_total\{{[^}}]*\}} (\S+)$", text, re.MULTILINE))


@contextlib.contextmanager
def _sampling(command: list[str] | None, output: Path):
    """Run the sampling profiler `command` (None: nothing) while the block runs; it writes `output`
    when interrupted, as py-spy and perf do on Ctrl-C."""
    if command is None:
        yield
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached before the run starts
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def py_spy(executable: str | None, pid: int, output: Path):
    """Sample `pid` with py-spy (raw collapsed stacks into `output`) while the block runs: only the
    thread holding the GIL (``--gil``), so the samples are Python at work -- without it a thread
    blocked in epoll or a send counted as busy in that call (stop 35: epoll and sends were 40 % of
    the samples, where perf found the interpreter at 60-70 % of the proxy's CPU)."""
    return _sampling(None if executable is None else [
        executable, "record", "--pid", str(pid), "--rate", "200", "--gil", "--format", "raw", "--output", str(output)],
        output)


def perf_record(executable: str | None, pid: int, output: Path):
    """Sample `pid` (every thread, user and kernel) with Linux perf into `output` while the block runs."""
    return _sampling(None if executable is None else [
        executable, "record", "-F", "499", "-g", "-p", str(pid), "-o", str(output)], output)


def perf_summary(executable: str, path: Path, top: int = 25) -> str:
    """Where a perf recording's CPU went: by library (the interpreter, the kernel, libc's copies,
    ...), then the hottest symbols. Unlike py-spy, perf tells a thread blocked in the kernel from one
    working there, and counts what the interpreter itself costs."""
    def report(sort: str) -> list[str]:
        result = subprocess.run([executable, "report", "-i", str(path), "--no-children", "--sort", sort,
                                 "--stdio", "-g", "none"], capture_output=True, text=True, timeout=120)
        return [line.rstrip() for line in result.stdout.splitlines()
                if line.strip() and not line.startswith("#") and "%" in line]
    by_library = report("dso")[:8]
    by_symbol = report("dso,sym")[:top]
    return "\n".join(["by library (share of samples, every thread):", *by_library, "by symbol:", *by_symbol])


def profile_summary(path: Path, top: int = 25) -> str:
    """The functions with the most samples in a py-spy raw profile: self and inclusive share.

    Only the main thread counts (the trio loop: the proxy's Python work); the librdkafka poller
    threads block in C and would be sampled as busy.
    """
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = other_threads = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        if stack.startswith("Thread._bootstrap"):
            other_threads += count
            continue
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        return f"no main-thread samples ({other_threads} in other threads)"
    lines = [f"{total} main-thread samples ({other_threads} in other threads); self % / inclusive %, by self:"]
    for frame, count in sorted(own.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {100 * count / total:5.1f} {100 * inclusive[frame] / total:5.1f}  {frame}")
    lines.append("by inclusive:")
    for frame, count in sorted(inclusive.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {100 * own.get(frame, 0) / total:5.1f} {100 * count / total:5.1f}  {frame}")
    return "\n".join(lines)


CPROFILED = Path(__file__).with_name("cprofiled.py")


def cprofiled_launcher(out_dir: Path) -> tuple[str, ...]:
    """The proxy's CLI run under :mod:`integration.bench.cprofiled` (by path: a --proxy-trees tree
    on PYTHONPATH need not have it), its profiles written to `out_dir`."""
    return (sys.executable, str(CPROFILED), str(out_dir), "proxy.cli")


@contextlib.contextmanager
def cprofile_window(out_dir: Path | None, pid: int, output: Path, timeout: float = 60.0):
    """Profile the proxy `pid` (started with :func:`cprofiled_launcher` writing to `out_dir`; None:
    nothing) while the block runs, its profile then moved to `output`."""
    if out_dir is None:
        yield
        return
    written = set(out_dir.glob(f"cprofile-{pid}-*.pstats"))
    os.kill(pid, signal.SIGUSR1)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while not (new := set(out_dir.glob(f"cprofile-{pid}-*.pstats")) - written):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the proxy ({pid}) wrote no profile into {out_dir} within {timeout:.0f} s")
            time.sleep(0.05)
        new.pop().replace(output)


def cprofile_summary(path: Path, share_fetches: int | None, top: int = 25) -> str:
    """The functions of a cProfile profile with the most CPU of their own, then the most CPU
    including what they call: per ShareFetch when the run's count is known (µs and calls each),
    else in all (ms and calls). A coroutine's calls count its resumptions."""
    stats = pstats.Stats(str(path))
    per, scale, unit = ((share_fetches, 1e6 / share_fetches, "µs per ShareFetch") if share_fetches
                        else (1, 1e3, "ms in all"))
    rows = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (primitive, calls, own, cumulative, callers)}

    def listing(column: int) -> list[str]:
        ranked = sorted(rows.items(), key=lambda item: -item[1][column])[:top]
        return [f"  {own * scale:9.1f} {cumulative * scale:9.1f} {calls / per:9.2f}  {pstats.func_std_string(function)}"
                for function, (_primitive, calls, own, cumulative, _callers) in ranked]

    return "\n".join([
        f"{stats.total_tt * 1e3:,.0f} ms of the trio thread's CPU profiled"
        f"{f' over {share_fetches:,} ShareFetches' if share_fetches else ''}; own / including calls ({unit}), calls, by own:",
        *listing(2), "by including calls:", *listing(3)])


# ----- data ---------------------------------------------------------------------------------------


def set_native_share_reset_earliest(bootstrap: str, group: str) -> None:
    """Kafka's share groups start at the latest offset unless the group config says otherwise."""
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
    ])
    admin = admin_client(bootstrap)  # must outlive the futures: a collected client cancels them
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


# ----- the run --------------------------------------------------------------------------------------


FILL_BATCH_BYTES = 1_000_000  # the producer's batch.size: about 960 records of 1 KiB per batch


def fill_partition_by_partition(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> None:
    """Fill `topic` one partition after another, each in full batches of FILL_BATCH_BYTES (its last
    one partial). A linger far longer than a batch takes to fill means no batch leaves early, so
    every run's topic is cut the same way, whatever the machine's timing."""
    value = os.urandom(size)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1000,
                         "batch.size": FILL_BATCH_BYTES, "batch.num.messages": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 2_097_151})
    failures = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(error)

    key = 0
    for partition, count in enumerate(split(records, partitions)):
        for _ in range(count):
            while True:
                try:
                    producer.produce(topic, value=value, key=str(key).encode(), partition=partition,
                                     on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            key += 1
        # Flush each partition: its last batch leaves partial, and the next partition's records
        # cannot share a produce request's timing with it.
        if producer.flush(120) != 0:
            raise RuntimeError(f"filling {topic}: partition {partition} was not delivered within 120 s")
    if failures:
        raise RuntimeError(f"filling {topic}: {len(failures)} records failed, the first: {failures[0]}")


def fill_round_robin(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> None:
    """The fill of goal runs 11-41: records round robin over the partitions, linger.ms 5 (the
    pass-through benchmark's produce). On many partitions whether a batch fills or leaves at its
    linger depends on timing, so the topic's batches differ from run to run."""
    produce(Target("direct", bootstrap), topic, partitions, records, size, "none")


FILLS = {"partition-by-partition": fill_partition_by_partition, "round-robin": fill_round_robin}


def batch_record_counts(log_dirs: Path, topic: str) -> dict[int, list[int]]:
    """Records per log batch of each partition of `topic`, in log order, read from the broker's
    segment files under `log_dirs`."""
    counts: dict[int, list[int]] = {}
    # Kafka's topic names hold no glob characters; the match keeps out a topic named `topic`-x.
    for segment in sorted(log_dirs.glob(f"{topic}-*/*.log")):
        found = re.fullmatch(re.escape(topic) + r"-(\d+)", segment.parent.name)
        if found is None:
            continue
        counts.setdefault(int(found[1]), []).extend(
            batch.record_count for batch in iter_batches(segment.read_bytes()) if isinstance(batch, RecordBatchHeader))
    return counts


def describe_batches(counts: Sequence[int]) -> str:
    """'N batches, records per batch: median M, deciles 10-90 % a, b, ...'."""
    if not counts:
        return "no batches found"
    ordered = sorted(counts)
    def at(fraction: float) -> int:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
    deciles = ", ".join(str(at(tenth / 10)) for tenth in range(1, 10))
    return f"{len(ordered):,} batches, records per batch: median {at(0.5)}, deciles 10-90 % {deciles}"


def shape_topics(kafka: LocalKafka, args: argparse.Namespace) -> dict[int, str]:
    """One topic per --partitions shape, each holding the same records, filled by --fill; each
    topic's log batches are reported (native hands out whole batches, so they shape its fetches)."""
    topics = {}
    for partitions in args.partitions:
        topics[partitions] = fill_topic(kafka, args, partitions, f"bench-share-p{partitions}")
    return topics


def fill_topic(kafka: LocalKafka, args: argparse.Namespace, partitions: int, stem: str) -> str:
    """A new topic of `partitions` partitions filled with the run's records the `--fill` way; prints
    its log batches' record counts (read from the broker's segment files), which native share
    groups hand out whole."""
    topic = create_topics(kafka.bootstrap, [unique_name(stem)], partitions=partitions)[0]
    FILLS[args.fill](kafka.bootstrap, topic, partitions, args.records, args.size)
    per_partition = batch_record_counts(kafka.data_dir / "kraft", topic)
    layout = describe_batches([count for counts in per_partition.values() for count in counts])
    print(f"  {topic} ({args.fill}): {layout}", file=sys.stderr, flush=True)
    return topic


def rotated(items: Sequence, shift: int) -> list:
    """`items` starting at `shift`: alternating rounds so no side always runs first."""
    if not items:
        return []
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def side_order(sides: Sequence, cell: int, repeat: int) -> list:
    """The order a cell's sides run in: the first moves on by one from cell to cell and from repeat
    to repeat, so over as many repeats as there are sides every cell runs each side in every
    position (a side run second in a pair measured a few percent faster: stop 35)."""
    return rotated(sides, cell + repeat)


def proxy_label(tree: str) -> str:
    return f"proxy {tree}" if tree else "proxy"


NATIVE = "native"
NATIVE_VIA_HOP = "native via hop"  # native share groups through a bare TCP hop (--hop)


def phase_proxy(args: argparse.Namespace, tools: PerfTools, log_dir: Path, *, native: bool = True) -> list[Measurement]:
    """The proxied runs and, with `native`, Kafka's native share groups on the same broker (started
    with them enabled), each measurement's sides back to back in rotating order."""
    results: list[Measurement] = []
    with contextlib.ExitStack() as stack:
        kafka_options = dict(version=args.kafka_version, share_groups=native, data_dir=log_dir / "kafka")
        if args.hop:
            kafka, hop = start_kafka_behind_a_hop(stack, **kafka_options)
        else:
            kafka, hop = stack.enter_context(LocalKafka(**kafka_options)), None
        topics = shape_topics(kafka, args)
        proxies = []  # (tree name, proxy, metrics url), every tree's proxy in front of the same broker
        for tree, path, variant_args in args.sides:
            metrics_port = free_port()
            # The proxy's state topic is its own: a share-enabled broker keeps its native share
            # groups' state on __share_group_state.
            extra = ("--share-auto-offset-reset", "earliest", "--state-topic", unique_name("__bench_share_state"),
                     "--log-level", "warning", "--metrics-port", str(metrics_port), *variant_args)
            proxy = stack.enter_context(ProxyProcess(
                upstream=kafka.bootstrap, log_path=log_dir / f"proxy{'-' + tree if tree else ''}.log",
                extra_args=extra, env={"PYTHONPATH": path} if path else None,
                launcher=cprofiled_launcher(args.profile_dir) if args.cprofile else ()))
            proxies.append((tree, proxy, f"http://127.0.0.1:{metrics_port}/metrics"))
        share_sides = [*proxies, *([NATIVE] if native else []), *([NATIVE_VIA_HOP] if hop else [])]
        runs = itertools.count()

        def run_side(side, topic: str, partitions: int, consumers: int) -> Measurement:
            if isinstance(side, str):  # Kafka's own share groups, directly or through the hop
                return native_share_run(args, tools, kafka.bootstrap, topic, partitions, consumers, kafka.pid,
                                        hop=hop if side == NATIVE_VIA_HOP else None)
            tree, proxy, metrics_url = side
            profile = args.profile_dir / f"p{partitions}-x{consumers}-{tree or 'proxy'}-{next(runs)}.txt"
            return proxied_share_run(args, tools, proxy, metrics_url, tree, topic, partitions, consumers, profile,
                                     kafka.pid)

        if not args.no_warm_up:
            warm_up(share_sides, topics, args.consumers, run_side)
        for repeat in range(args.repeat):
            cells = itertools.count()
            for partitions, topic in topics.items():
                sides = [(kafka.bootstrap, "direct", "direct")] + [
                    (proxy.bootstrap, "proxy", proxy_label(tree)) for tree, proxy, _ in proxies]
                for bootstrap, path, name in sides:
                    results.append(dataclasses.replace(
                        consumer_perf(tools, bootstrap, topic, args.records, f"consumer group, {name}", path),
                        partitions=partitions))
                    report_progress(results[-1])
                for consumers in args.consumers:
                    for side in side_order(share_sides, next(cells), repeat):
                        results.append(run_side(side, topic, partitions, consumers))
    return results


def warm_up(share_sides: Sequence, topics: dict[int, str], consumers: Sequence[int],
            run_side: Callable[[object, str, int, int], Measurement]) -> None:
    """One share run per side, not measured, before the measured repeats: in a freshly started
    broker the first runs were measured at half the rate of the later ones on every side, while the
    broker's JIT compiled its fetch and share paths (stop 54: the broker's CPU per native run 10.1 s
    in the first repeat, 2.1 and 1.5 s in the next two)."""
    partitions, topic = next(iter(topics.items()))
    print(f"warming up: one share run per side, not measured ({partitions} partitions, {consumers[0]} consumers)",
          file=sys.stderr, flush=True)
    for side in share_sides:
        run_side(side, topic, partitions, consumers[0])
    print("warmed up; the measured repeats follow", file=sys.stderr, flush=True)


def native_share_run(args: argparse.Namespace, tools: PerfTools, bootstrap: str, topic: str, partitions: int,
                     consumers: int, broker_pid: int | None = None, hop: Target | None = None) -> Measurement:
    """One share run with the broker's own share groups (a fresh group reading from the earliest
    offset), its consumers bootstrapping through `hop` when given (the hop's CPU counted as the proxy's)."""
    group = unique_name("bench-share")
    set_native_share_reset_earliest(bootstrap, group)
    side, path = (NATIVE, "native") if hop is None else (NATIVE_VIA_HOP, "native-hop")
    with CpuSampler(broker_pid, None if hop is None else hop.pid) as sampler:
        measured = share_perf(tools, bootstrap if hop is None else hop.bootstrap, topic, group, args.records,
                              consumers, f"share group x{consumers}, {side}", path, sampler.consumers_started)
    result = dataclasses.replace(measured, partitions=partitions, cpu=streaming_cpu(sampler, measured))
    report_progress(result)
    return result


def proxied_share_run(args: argparse.Namespace, tools: PerfTools, proxy: ProxyProcess, metrics_url: str, tree: str,
                      topic: str, partitions: int, consumers: int, profile: Path,
                      broker_pid: int | None = None) -> Measurement:
    """One share run through `proxy`, with the proxy's CPU and counters read around it."""
    assert proxy.process is not None
    pid = proxy.process.pid
    acquired_before = proxy_counter(metrics_url, "ksp_share_records_acquired")
    samples_before = proxy_samples(metrics_url)
    recording = profile.with_suffix(".perf.data")
    profiled = profile.with_suffix(".pstats")
    with py_spy(args.py_spy, pid, profile), perf_record(args.perf, pid, recording), \
            cprofile_window(args.profile_dir if args.cprofile else None, pid, profiled), \
            CpuSampler(broker_pid, pid) as sampler:
        cpu_before = process_cpu_seconds(pid)
        measured = share_perf(tools, proxy.bootstrap, topic, unique_name("bench-share"), args.records, consumers,
                              f"share group x{consumers}, {proxy_label(tree)}", "proxy", sampler.consumers_started)
        cpu_after = process_cpu_seconds(pid)
    # More acquisitions than records would mean redeliveries inflated the count.
    acquired = int(proxy_counter(metrics_url, "ksp_share_records_acquired") - acquired_before)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    result = dataclasses.replace(measured, acquired=acquired, partitions=partitions, proxy_cpu_s=cpu,
                                 cpu=streaming_cpu(sampler, measured), proxy_rss_kib=proc_status_kib(pid, "VmRSS"),
                                 proxy_peak_rss_kib=proc_status_kib(pid, "VmHWM"))
    report_progress(result)
    samples_after = proxy_samples(metrics_url)
    reads = upstream_reads(samples_before, samples_after, measured.megabytes)
    waits = fetch_waits(samples_before, samples_after)
    print(f"    the proxy acquired {acquired:,} records for {result.records:,} consumed; "
          f"{latency_breakdown(samples_before, samples_after, measured.records)}{'; ' + reads if reads else ''}"
          f"{'; ' + waits if waits else ''}",
          file=sys.stderr, flush=True)
    if args.py_spy and profile.exists():
        print(f"    profile {profile}:\n{profile_summary(profile, args.profile_top)}", file=sys.stderr, flush=True)
    if args.cprofile and profiled.exists():
        fetches = measured.client.fetches if measured.client is not None else None
        print(f"    cProfile {profiled}:\n{cprofile_summary(profiled, fetches, args.profile_top)}", file=sys.stderr,
              flush=True)
    if args.perf and recording.exists():
        print(f"    perf {recording}:\n{perf_summary(args.perf, recording, args.profile_top)}", file=sys.stderr,
              flush=True)
    return result


def phase_authorization(args: argparse.Namespace, tools: PerfTools, log_dir: Path) -> list[Measurement]:
    """The proxied share runs once per --share-authorization mode, proxies one after the other."""
    results: list[Measurement] = []
    with LocalKafka(version=args.kafka_version, share_groups=False, data_dir=log_dir / "kafka") as kafka:
        partitions = args.partitions  # main() narrowed it to the one shape
        topic = fill_topic(kafka, args, partitions, "bench-share")
        modes = list(args.share_authorization)
        for run in range(args.repeat):
            # Each repeat starts with another mode: on a shared machine the first runs of a round
            # are measured differently, which a fixed order would charge to one mode.
            for mode in modes[run % len(modes):] + modes[:run % len(modes)]:
                metrics_port = free_port()
                metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
                # "cluster:0" = cluster mode with --share-authorization-cache-ms 0 (a probe per request).
                name, _, cache_ms = mode.partition(":")
                extra = ("--share-auto-offset-reset", "earliest", "--state-topic", unique_name("__bench_share_state"),
                         "--log-level", "warning", "--metrics-port", str(metrics_port),
                         "--share-authorization", name,
                         *(("--share-authorization-cache-ms", cache_ms) if cache_ms else ()))
                with ProxyProcess(upstream=kafka.bootstrap, log_path=log_dir / f"proxy-{name}-{cache_ms}.log",
                                  extra_args=extra) as proxy:
                    for consumers in args.consumers:
                        results.append(share_perf(tools, proxy.bootstrap, topic, unique_name("bench-share"),
                                                  args.records, consumers,
                                                  f"share group x{consumers}, authorization {mode}", "proxy"))
                        report_progress(results[-1])
                    probes = proxy_counter_sum(metrics_url, "ksp_authorization_probes")
                    print(f"    authorization {mode}: {probes:.0f} probes", file=sys.stderr, flush=True)
    return results


def authorization_table(results: Sequence[Measurement], modes: Sequence[str], consumers: Sequence[int]) -> str:
    rows = ["| share consumers | mode | records/s | records/s after first | ratio to " + modes[0] + " |",
            "|---:|---|---:|---:|---:|"]
    for count in consumers:
        baseline = best(results, f"share group x{count}, authorization {modes[0]}")
        for mode in modes:
            m = best(results, f"share group x{count}, authorization {mode}")
            if m is None:
                continue
            ratio = "" if baseline is None else (
                f"{_ratio(m.records_per_second, baseline.records_per_second)} / "
                f"{_ratio(m.streaming_records_per_second, baseline.streaming_records_per_second)}")
            rows.append(f"| {count} | {mode} | {m.records_per_second:,.0f} | "
                        f"{m.streaming_records_per_second:,.0f} | {ratio} |")
    return "\n".join(rows)


def phase_native(args: argparse.Namespace, tools: PerfTools, log_dir: Path) -> list[Measurement]:
    results: list[Measurement] = []
    with LocalKafka(version=args.kafka_version, share_groups=True, data_dir=log_dir / "native-kafka") as kafka:
        topics = shape_topics(kafka, args)
        for _ in range(args.repeat):
            for partitions, topic in topics.items():
                for consumers in args.consumers:
                    results.append(native_share_run(args, tools, kafka.bootstrap, topic, partitions, consumers,
                                                    kafka.pid))
    return results


def report_progress(measurement: Measurement) -> None:
    shape = f" ({measurement.partitions} partitions)" if measurement.partitions else ""
    cpu = ("" if measurement.proxy_cpu_s is None else
           f", proxy CPU {measurement.proxy_cpu_s:.1f} s = {measurement.proxy_cpu_s / measurement.seconds:.0%} of a core")
    client = measurement.client
    fetches = ("" if client is None else
               f"; the consumers' ShareFetch: {client.fetches:,} x {client.round_trip_ms:.2f} ms round trip, "
               f"{client.records_per_fetch:,.0f} records each, {client.cycle_ms(measurement):.2f} ms per cycle")
    use = measurement.cpu
    machine = ("" if use is None else
               f"; while streaming, machine CPU {use.machine_s:.1f} s ({use.busy:.0%} of {use.cores} cores; "
               f"broker {use.broker_s:.1f} s, consumers {use.consumers_s:.1f} s, proxy {use.proxy_s:.1f} s)")
    memory = ("" if measurement.proxy_rss_kib is None or measurement.proxy_peak_rss_kib is None else
              f"; proxy resident {measurement.proxy_rss_kib / 1024:.0f} MiB after the run, "
              f"{measurement.proxy_peak_rss_kib / 1024:.0f} MiB at most so far")
    print(f"  {measurement.label}{shape}: {measurement.records_per_second:,.0f} records/s whole run, "
          f"{measurement.streaming_records_per_second:,.0f} after the first record "
          f"({measurement.first_record_s:.1f} s){cpu}{fetches}{machine}{memory}", file=sys.stderr, flush=True)


def best(results: Sequence[Measurement], label: str, partitions: int | None = None) -> Measurement | None:
    """The fastest of the repeats: on a shared, noisy machine the best run is the least disturbed."""
    matching = [m for m in results if m.label == label and (partitions is None or m.partitions == partitions)]
    return max(matching, key=lambda m: m.records_per_second) if matching else None


def _ratio(numerator: float, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}" if denominator else ""


def table(results: Sequence[Measurement], consumers: Sequence[int], partitions: int | None = None,
          trees: Sequence[str] = ("",)) -> str:
    """Markdown table of one --partitions shape; ratios are records/s (whole run / first record to last)."""
    rows = [
        "| measurement | consumers | records/s | MB/s | first record after s | records/s after first | "
        "MB/s after first | proxy/native | proxy/direct |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    direct = best(results, "consumer group, direct", partitions)

    def row(m: Measurement, baseline: Measurement | None = None, against_direct: bool = False) -> None:
        ratios = ["", ""]
        for index, other in ((0, baseline), (1, direct if against_direct else None)):
            if other is not None:
                ratios[index] = (f"{_ratio(m.records_per_second, other.records_per_second)} / "
                                 f"{_ratio(m.streaming_records_per_second, other.streaming_records_per_second)}")
        rows.append(
            f"| {m.label} | {m.consumers} | {m.records_per_second:,.0f} | {m.megabytes_per_second:.1f} | "
            f"{m.first_record_s:.1f} | {m.streaming_records_per_second:,.0f} | "
            f"{m.streaming_megabytes_per_second:.1f} | {ratios[0]} | {ratios[1]} |"
        )

    if direct:
        row(direct)
    for tree in trees:
        if proxied_group := best(results, f"consumer group, {proxy_label(tree)}", partitions):
            row(proxied_group, against_direct=True)
    for count in consumers:
        native = best(results, f"share group x{count}, {NATIVE}", partitions)
        if native:
            row(native, against_direct=True)
        if via_hop := best(results, f"share group x{count}, {NATIVE_VIA_HOP}", partitions):
            row(via_hop, baseline=native, against_direct=True)
        for tree in trees:
            if proxied := best(results, f"share group x{count}, {proxy_label(tree)}", partitions):
                row(proxied, baseline=native, against_direct=True)
    return "\n".join(rows)


def fetches_table(results: Sequence[Measurement], consumers: Sequence[int], partitions: int,
                  trees: Sequence[str] = ("",)) -> str:
    """Where a share run's time goes, from the consumers' own metrics (the best repeats, as in
    :func:`table`): per consumer, one cycle = the ShareFetch round trip + the consumer's own time
    with the records before its next ShareFetch."""
    def row(native: Measurement | None, m: Measurement) -> str | None:
        if m.client is None:
            return None
        own = m.client.own_time_ms(m)
        deltas = ["", ""]
        if m is not native and native is not None and native.client is not None:
            deltas = [f"{m.client.round_trip_ms - native.client.round_trip_ms:+.2f}",
                      f"{own - native.client.own_time_ms(native):+.2f}"]
        return (f"| {m.label} | {m.client.fetches:,} | {m.client.records_per_fetch:,.0f} | "
                f"{m.client.round_trip_ms:.2f} | {m.client.cycle_ms(m):.2f} | {own:.2f} | {deltas[0]} | {deltas[1]} |")

    return _sides_table(["measurement", "ShareFetches", "records per fetch", "round trip ms", "cycle ms",
                         "consumer's own time ms", "round trip − native's ms", "own time − native's ms"],
                        row, results, consumers, partitions, trees)


def _sides_table(columns: Sequence[str], row: Callable[[Measurement | None, Measurement], str | None],
                 results: Sequence[Measurement], consumers: Sequence[int], partitions: int,
                 trees: Sequence[str]) -> str:
    """A markdown table with a row per share side (native first, native through the hop if measured,
    then each tree's proxy, best repeats, per consumer count): `row(native, side)`, a side without
    the numbers it needs giving None."""
    rows = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    for count in consumers:
        native = best(results, f"share group x{count}, {NATIVE}", partitions)
        sides = [native, best(results, f"share group x{count}, {NATIVE_VIA_HOP}", partitions)] + [
            best(results, f"share group x{count}, {proxy_label(tree)}", partitions) for tree in trees]
        rows += [line for m in sides if m is not None and (line := row(native, m)) is not None]
    return "\n".join(rows)


def cpu_table(results: Sequence[Measurement], consumers: Sequence[int], partitions: int,
              trees: Sequence[str] = ("",)) -> str:
    """What each side's streaming cost the machine (the best repeats, as in :func:`table`): CPU
    seconds per million records by whom, the machine's total, and how busy its cores were. On a
    machine whose cores are all busy, the rates of two sides go roughly as the inverse of their
    totals."""
    def row(native: Measurement | None, m: Measurement) -> str | None:
        if m.cpu is None:
            return None
        use = m.cpu.per_million(m.records)
        versus = ("" if m is native or native is None or native.cpu is None else
                  _ratio(use["machine"], native.cpu.per_million(native.records)["machine"]))
        return (f"| {m.label} | {m.streaming_records_per_second:,.0f} | {use['consumers']:.2f} | "
                f"{use['broker']:.2f} | {use['proxy']:.2f} | {use['machine']:.2f} | {versus} | {m.cpu.busy:.0%} |")

    return _sides_table(["measurement", "records/s after first", "consumers' JVM s", "broker s", "proxy (or hop) s",
                         "machine s", "machine / native's", "cores busy"],
                        row, results, consumers, partitions, trees)


def trees_table(results: Sequence[Measurement], consumers: Sequence[int], partitions: int,
                trees: Sequence[str]) -> str:
    """Each proxy tree against the first (e.g. after / before), share runs, best repeats."""
    rows = [f"| consumers | {' | '.join(f'{tree} / {trees[0]}' for tree in trees[1:])} |",
            f"|---:|{'---:|' * (len(trees) - 1)}"]
    for count in consumers:
        base = best(results, f"share group x{count}, {proxy_label(trees[0])}", partitions)
        cells = []
        for tree in trees[1:]:
            m = best(results, f"share group x{count}, {proxy_label(tree)}", partitions)
            cells.append("" if m is None or base is None else
                         f"{_ratio(m.records_per_second, base.records_per_second)} / "
                         f"{_ratio(m.streaming_records_per_second, base.streaming_records_per_second)}")
        rows.append(f"| {count} | {' | '.join(cells)} |")
    return "\n".join(rows)


def repeats_table(results: Sequence[Measurement], partitions: int) -> str:
    """Every repeat: records/s whole run · after the first record · first record after s."""
    labels = list(dict.fromkeys(m.label for m in results if m.partitions == partitions))
    by_label = {label: [m for m in results if m.label == label and m.partitions == partitions] for label in labels}
    width = max((len(runs) for runs in by_label.values()), default=0)
    rows = [f"| measurement | {' | '.join(f'repeat {i + 1}' for i in range(width))} |", f"|---|{'---|' * width}"]
    for label, runs in by_label.items():
        cells = [f"{m.records_per_second:,.0f} · {m.streaming_records_per_second:,.0f} · {m.first_record_s:.1f}"
                 for m in runs]
        rows.append(f"| {label} | {' | '.join(cells + [''] * (width - len(cells)))} |")
    return "\n".join(rows)


def parse_trees(text: str) -> list[tuple[str, str]]:
    """`before=/tmp/x,after=.` -> [("before", "/tmp/x"), ("after", "/abs/cwd")]."""
    trees = []
    for item in text.split(","):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {item!r}")
        trees.append((name, str(Path(path).resolve())))
    return trees


def proxy_sides(trees: Sequence[tuple[str, str]] | None,
                variants: Sequence[tuple[str, tuple[str, ...]]]) -> list[tuple[str, str, tuple[str, ...]]]:
    """Every proxy a run starts, as (name, source tree or "" for this one, extra serve arguments):
    the --proxy-trees, then a proxy of the current tree per --variant. Without trees the current
    tree's proxy is unnamed, or `default` when variants are measured against it."""
    sides = [(name, path, ()) for name, path in trees] if trees else [("default" if variants else "", "", ())]
    sides += [(name, "", extra) for name, extra in variants]
    names = [name for name, _, _ in sides]
    if len(set(names)) < len(names):
        raise ValueError(f"proxy names must differ: {', '.join(names)}")
    return sides


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="record value size in bytes")
    parser.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[4],
                        help="partitions of the topic, comma separated: one topic per shape (e.g. 4,32)")
    parser.add_argument("--consumers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16],
                        help="share consumer counts, comma separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (the best is reported)")
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--keep-logs", action="store_true", help="keep broker and proxy logs")
    parser.add_argument("--proxy-trees", type=parse_trees, default=None,
                        help="NAME=PATH,...: a proxy per source tree (PYTHONPATH=PATH), measured side by side "
                             "in alternating order, e.g. before=/tmp/base,after=.")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[], metavar='NAME="ARGS"',
                        help="also a proxy of the current tree started with these extra serve arguments, measured "
                             "side by side (repeatable), e.g. glibc-arenas=\"--malloc-arenas 0\"")
    parser.add_argument("--py-spy", default=None, metavar="PATH",
                        help="profile the proxy during each proxied share run with this py-spy executable")
    parser.add_argument("--perf", default=None, metavar="PATH",
                        help="also record the proxy with Linux perf (this executable) during each proxied share "
                             "run: CPU by library and symbol, kernel included (needs perf_event access)")
    parser.add_argument("--cprofile", action="store_true",
                        help="run the proxy under cProfile (the trio thread's CPU clock) and list its functions "
                             "per ShareFetch for each proxied share run")
    parser.add_argument("--profile-dir", type=Path, default=Path(tempfile.gettempdir()) / "share-bench-profiles",
                        help="where --py-spy, --perf and --cprofile write their profiles (one file per run)")
    parser.add_argument("--profile-top", type=int, default=25, help="functions listed per profile")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--no-native", action="store_true",
                        help="leave Kafka's native share groups out: only the --proxy-trees, side by side")
    parser.add_argument("--separate-brokers", action="store_true",
                        help="the proxied runs against a broker without share groups, then the native runs "
                             "against a second broker (the method before 2026-11-27: phases minutes apart)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="measure from the broker's first share run on (by default each side runs once, "
                             "unmeasured, first: a fresh broker's JIT slows the first runs)")
    parser.add_argument("--hop", action="store_true",
                        help="also run Kafka's native share groups through a bare TCP hop (kernel splice, no Kafka "
                             "spoken): what one more process on the path costs them")
    parser.add_argument("--fill", choices=sorted(FILLS), default="partition-by-partition",
                        help="how the topics are filled: one partition after another in full 1 MB batches (the "
                             "default since goal run 42), or round robin with linger.ms 5 as in runs 11-41, whose "
                             "batches on many partitions differ from run to run")
    parser.add_argument("--share-authorization", type=lambda s: s.split(","), default=None,
                        help="measure these --share-authorization modes against each other instead (e.g. off,cluster)")
    args = parser.parse_args(argv)

    if args.share_authorization and (len(args.partitions) > 1 or args.proxy_trees or args.variant):
        parser.error("--share-authorization takes one --partitions shape and no --proxy-trees or --variant")
    if args.hop and (args.no_native or args.separate_brokers or args.share_authorization):
        parser.error("--hop measures native share groups through a hop beside native: not with --no-native, "
                     "--separate-brokers or --share-authorization")
    try:
        args.sides = proxy_sides(args.proxy_trees, args.variant)  # what phase_proxy starts
    except ValueError as error:
        parser.error(str(error))
    trees = [name for name, _, _ in args.sides]
    tools = perf_tools(args.kafka_version)
    log_dir = Path(tempfile.mkdtemp(prefix="share-bench-"))
    started = time.monotonic()
    shapes = ", ".join(str(p) for p in args.partitions)
    print(f"Apache Kafka {args.kafka_version}, kafka-tools {tools.tools_version} perf tools, "
          f"{args.records:,} records x {args.size} B on {shapes} partitions; logs in {log_dir}",
          file=sys.stderr, flush=True)
    try:
        if args.share_authorization:
            args.partitions = args.partitions[0]
            results = phase_authorization(args, tools, log_dir)
            print(authorization_table(results, args.share_authorization, args.consumers))
            print(f"\n{args.records:,} records x {args.size} B, {args.partitions} partitions, best of {args.repeat}; "
                  f"ratios are whole run / after the first record; total run {time.monotonic() - started:.0f} s")
            return 0
        if args.separate_brokers:
            results = phase_proxy(args, tools, log_dir, native=False) + phase_native(args, tools, log_dir)
        else:
            results = phase_proxy(args, tools, log_dir, native=not args.no_native)
    finally:
        if not args.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    for number, partitions in enumerate(args.partitions):
        if number:
            print()
        print(table(results, args.consumers, partitions, trees))
        print(f"\n{args.records:,} records x {args.size} B, {partitions} partitions, best of {args.repeat}; "
              f"ratios are whole run / after the first record; total run {time.monotonic() - started:.0f} s")
        print("\nthe share runs above as their consumers saw them (the Java client's own metrics):\n")
        print(fetches_table(results, args.consumers, partitions, trees))
        print("\nwhat the share runs above cost the machine while their records streamed, CPU seconds per "
              "million records:\n")
        print(cpu_table(results, args.consumers, partitions, trees))
        if len(trees) > 1:
            print(f"\nshare runs, {' and '.join(trees[1:])} / {trees[0]} (whole run / after the first record):\n")
            print(trees_table(results, args.consumers, partitions, trees))
        if args.repeat > 1:
            print("\nevery repeat (records/s whole run · after the first record · first record after s):\n")
            print(repeats_table(results, partitions))
    if args.json:
        args.json.write_text(json.dumps([{**dataclasses.asdict(m),
                                          "records_per_second": m.records_per_second,
                                          "streaming_records_per_second": m.streaming_records_per_second}
                                         for m in results], indent=2))
    acquired = [f"x{m.consumers} {m.label.split(', ', 1)[1]} p{m.partitions}: {m.acquired:,}"
                for m in results if m.acquired is not None]
    print(f"records the proxy acquired per share run (redeliveries would exceed the count): {', '.join(acquired)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
