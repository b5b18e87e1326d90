"""Scale-out throughput (issue 15, must-show 4): share consumption through 1 and through 3 proxy
instances of one deployment (--instance-id), side by side on one broker.

Each measurement starts N instances on a fresh state topic (--state-topic-partitions 12 by
default), waits until the ownership group has given every state partition to one of them, then runs
Kafka's ShareConsumerPerformance (KafkaShareConsumer, implicit acknowledgement; the tool's
--threads consumers) bootstrapped with every instance, in a fresh share group, over the same
topic. Instance counts alternate between repeats, so a load that comes and goes hits both alike.
Reported per run: records/s for the whole run and after the first record, the ratio to one
instance, and how many records each instance acquired (from its ``ksp_share_records_acquired``
counter: the spread, and more than the record count would mean redeliveries).

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.scale_bench --records 200000 --partitions 12 \\
        --instances 1,3 --consumers 16 --repeat 2

On a machine with fewer cores than instances the instances share the cores with the broker and the
consumers, and the ratio measures that contention as much as the scaling; say so with the numbers.
``--instance-cpus C`` runs each instance under a CPU limit of C cores, as a pod's ``limits.cpu``
does (a Linux CFS quota in its own cgroup; needs root and cgroup v1's cpu controller): then one
instance's CPU is the bottleneck, as it is for a deployment whose share traffic outgrows one
instance, and the ratio shows what adding instances buys. Also reported: each instance's CPU
(from its ``process_cpu_seconds_total``) and how busy the machine's cores were during the run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka.admin import AdminClient

from integration.bench.share_bench import (
    cpu_ticks,
    perf_tools,
    proxy_counter,
    proxy_samples,
    rotated,
    share_perf,
    shape_topics,
)
from integration.kafka_fixtures import ProxyProcess, share_proxy_executable, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka
from proxy.localkafka.broker import free_port
from proxy.share.ownership import DEFAULT_GROUP_PREFIX, describe_members, owner_map


@dataclasses.dataclass(frozen=True, slots=True)
class ScaleRun:
    instances: int
    consumers: int
    records: int
    seconds: float
    first_record_s: float
    acquired: tuple[int, ...]  # per instance
    load: str
    proxy_cores: tuple[float, ...] = ()  # per instance, CPU seconds / wall seconds while the tool ran
    throttled: tuple[float, ...] = ()  # per instance under --instance-cpus: share of CFS periods out of quota
    machine_busy: float = 0.0  # share of all cores busy while the tool ran (/proc/stat)

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def streaming_records_per_second(self) -> float:
        return self.records / max(self.seconds - self.first_record_s, 1e-3)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def proxy_gauge(metrics_url: str, name: str) -> float:
    return proxy_samples(metrics_url).get((name, ()), 0.0)


CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000


@contextlib.contextmanager
def cpu_limit(cores: float, name: str):
    """A cgroup (v1 cpu controller) whose processes get at most ``cores`` of CPU time; yields its
    directory. Removed on exit (its processes must have exited by then)."""
    if not (CPU_CGROUP_ROOT / "cpu.cfs_quota_us").exists():
        raise RuntimeError(f"--instance-cpus needs cgroup v1's cpu controller at {CPU_CGROUP_ROOT}")
    group = CPU_CGROUP_ROOT / name
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(cores * CFS_PERIOD_US)))
        yield group
    finally:
        for _ in range(50):  # the stopped process may take a moment to leave the group
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def limited_launcher(group: Path) -> tuple[str, ...]:
    """A command prefix that joins the cgroup before exec'ing the proxy, so every thread it
    starts (librdkafka's included) is limited from the first."""
    return ("sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$0" "$@"', share_proxy_executable())


def throttling(group: Path | None) -> tuple[int, int]:
    """(CFS periods, periods in which the group ran out of quota) so far; (0, 0) unlimited."""
    if group is None:
        return 0, 0
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["nr_periods"]), int(stat["nr_throttled"])


def wait_for_owners(bootstrap: str, state_topic: str, partitions: int, instances: int, timeout_s: float = 60) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = owner_map(describe_members(admin, f"{DEFAULT_GROUP_PREFIX}.{state_topic}"), state_topic)
            if len(found.owners) == partitions and len({o.slot for o in found.owners.values()}) == instances:
                return
        except Exception:  # noqa: BLE001 - the group may not exist yet
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{instances} instances did not take every state partition in {timeout_s}s")


def measure(kafka: LocalKafka, tools, topic: str, instances: int, args: argparse.Namespace, log_dir: Path,
            run: int) -> ScaleRun:
    state_topic = unique_name("__bench_scale_state")
    with contextlib.ExitStack() as stack:
        proxies, metrics, groups = [], [], []
        for slot in range(instances):
            port = free_port()
            group = None
            if args.instance_cpus:
                group = stack.enter_context(cpu_limit(args.instance_cpus, f"ksp-bench-{os.getpid()}-{slot}"))
            groups.append(group)
            proxies.append(stack.enter_context(ProxyProcess(launcher=() if group is None else limited_launcher(group),
                upstream=kafka.bootstrap, log_path=log_dir / f"run{run}-n{instances}-ksp-{slot}.log",
                extra_args=("--instance-id", f"ksp-{slot}", "--broker-port-base", str(free_port() - kafka.broker_id),
                            "--state-topic", state_topic, "--state-topic-partitions", str(args.state_partitions),
                            "--share-auto-offset-reset", "earliest", "--log-level", "warning",
                            "--metrics-port", str(port)))))
            metrics.append(f"http://127.0.0.1:{port}/metrics")
        wait_for_owners(kafka.bootstrap, state_topic, args.state_partitions, instances)
        before = [proxy_counter(url, "ksp_share_records_acquired") for url in metrics]
        cpu_before = [proxy_gauge(url, "process_cpu_seconds_total") for url in metrics]
        throttling_before = [throttling(group) for group in groups]
        load, ticks_before, wall_before = load_average(), cpu_ticks(), time.monotonic()
        measured = share_perf(tools, ",".join(p.bootstrap for p in proxies), topic, unique_name("bench-scale"),
                              args.records, args.consumers, f"share group x{args.consumers}, {instances} instances",
                              "proxy")
        ticks_after, wall = cpu_ticks(), time.monotonic() - wall_before
        acquired = tuple(int(proxy_counter(url, "ksp_share_records_acquired") - b) for url, b in zip(metrics, before))
        proxy_cores = tuple((proxy_gauge(url, "process_cpu_seconds_total") - b) / wall
                            for url, b in zip(metrics, cpu_before))
        throttled = tuple((after[1] - before[1]) / max(after[0] - before[0], 1)
                          for before, after in zip(throttling_before, map(throttling, groups)))
    busy = (ticks_after[0] - ticks_before[0]) / max(ticks_after[1] - ticks_before[1], 1)
    return ScaleRun(instances, args.consumers, measured.records, measured.seconds, measured.first_record_s,
                    acquired, f"{load} -> {load_average()}", proxy_cores, throttled if args.instance_cpus else (), busy)


def table(runs: Sequence[ScaleRun], baseline: int) -> str:
    best = {}
    for run in runs:
        if run.instances not in best or run.streaming_records_per_second > best[run.instances].streaming_records_per_second:
            best[run.instances] = run
    base = best.get(baseline)
    lines = ["| instances | records/s whole run | records/s after the first record | / one instance (whole · streaming) "
             "| acquired per instance | proxy CPU per instance (cores) | periods throttled per instance "
             "| machine busy | load (1, 5, 15 min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        ratio = "-" if base is None else (f"{run.records_per_second / base.records_per_second:.2f} · "
                                          f"{run.streaming_records_per_second / base.streaming_records_per_second:.2f}")
        lines.append(f"| {run.instances} | {run.records_per_second:,.0f} | {run.streaming_records_per_second:,.0f} | "
                     f"{ratio} | {' / '.join(f'{n:,}' for n in run.acquired)} | "
                     f"{' / '.join(f'{c:.2f}' for c in run.proxy_cores)} | "
                     f"{' / '.join(f'{t:.0%}' for t in run.throttled) or '-'} | {run.machine_busy:.0%} | "
                     f"{run.load} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="record value size in bytes")
    parser.add_argument("--partitions", type=int, default=12, help="partitions of the consumed topic")
    parser.add_argument("--state-partitions", type=int, default=12, help="partitions of each run's state topic")
    parser.add_argument("--instances", type=lambda s: [int(x) for x in s.split(",")], default=[1, 3])
    parser.add_argument("--consumers", type=int, default=16, help="the perf tool's --threads")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--instance-cpus", type=float, default=None,
                        help="run each instance under a CPU limit of this many cores (cgroup CFS quota; root)")
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tools = perf_tools(args.kafka_version)
    log_dir = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    print(f"Apache Kafka {args.kafka_version}, kafka-tools {tools.tools_version}; {args.records:,} records x "
          f"{args.size} B on {args.partitions} partitions, {args.consumers} share consumers; {os.cpu_count()} cores; "
          f"each instance limited to {args.instance_cpus or 'no limit of'} cores; "
          f"logs in {log_dir}", file=sys.stderr, flush=True)
    runs: list[ScaleRun] = []
    try:
        with LocalKafka(version=args.kafka_version, share_groups=False, data_dir=log_dir / "kafka") as kafka:
            args.partitions = [args.partitions]
            topic = shape_topics(kafka.bootstrap, args)[args.partitions[0]]
            number = 0
            for repeat in range(args.repeat):
                for instances in rotated(args.instances, repeat):
                    number += 1
                    runs.append(measure(kafka, tools, topic, instances, args, log_dir, number))
                    run = runs[-1]
                    print(f"  {instances} instance(s): {run.records_per_second:,.0f} records/s whole run, "
                          f"{run.streaming_records_per_second:,.0f} after the first record; acquired {run.acquired}; "
                          f"proxy CPU {[round(c, 2) for c in run.proxy_cores]} cores; throttled "
                          f"{[f'{t:.0%}' for t in run.throttled]}; machine busy "
                          f"{run.machine_busy:.0%}; load {run.load}", file=sys.stderr, flush=True)
    finally:
        if not args.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    print(table(runs, min(args.instances)))
    if args.json:
        args.json.write_text(json.dumps([{**dataclasses.asdict(r), "records_per_second": r.records_per_second,
                                          "streaming_records_per_second": r.streaming_records_per_second}
                                         for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
