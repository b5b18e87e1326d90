"""How long a scale-out instance's loop stalls while it gains state partitions (a hand-over).

Instance A serves a state topic holding ``--groups`` x ``--partitions`` share-partitions (the cost
model's state records, layout 2, on the proxy's default 12 state partitions). Instance B joins, so A
hands it about half the state partitions, then B leaves cleanly (SIGTERM): A gains them back --
fences their lanes, replays them in a worker thread, rebuilds their engines -- while it goes on
serving. A's /healthz, answered by A's own event loop, is asked every ``--interval`` seconds from
B's stop until 2 s after A reports every state partition owned again (``ksp_share_state_partition_owned``);
the slowest answer is what any connection A serves would have waited at most; the full collections
of Python's cyclic collector A made meanwhile are read from its ``ksp_gc_pause_seconds`` (a scrape
just before the hand-back's /healthz window and one just after). (Whether A owns every
partition is read from its /metrics every 50 ms meanwhile, so the hand-back is measured under
scrapes.) Before B joins, once A has restored everything, A's /metrics is scraped ``--scrapes``
times, one after the other, with /healthz asked as above: how long a scrape of that many
share-partitions takes, how long the loop waited meanwhile, and the full collections of Python's
cyclic collector A made from the first scrape to the last (``ksp_gc_pause_seconds``). Each round
runs the proxy of every ``--proxy-trees`` tree in turn (before/after a change), the order rotating.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.gain_stall --groups 100 --partitions 100 \\
        --records 20000 --proxy-trees before=/tmp/base,after=$PWD --repeat 2

Without ``--proxy-trees`` it measures the tree it runs from. ``--proxy-arg`` passes a `serve` flag to
both instances (``--proxy-arg=--metrics-per-partition``: the scrapes with per-partition series).
``--hand-overs N`` has a new second instance join and leave N times in a round; the first hand-back's
stall is reported as above, and A's resident memory (VmRSS) after each: state handed over and
gained again must not pile up (what A gains is frozen out of the collector's reach, runtime.ScaleOut).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from integration.bench.cost_model import (
    LivenessPoller,
    fit_line,
    http_get,
    state_partitions,
    state_records,
    write_layout_2_state_topic,
)
from integration.bench.procfs import proc_status_kib
from integration.bench.scale_bench import wait_for_owners
from integration.bench.share_bench import parse_trees, proxy_samples, rotated
from integration.kafka_fixtures import ProxyProcess, create_topics, topic_id_of, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka
from proxy.localkafka.broker import free_port

def owned_partitions(metrics_url: str) -> int:
    return int(sum(value for (name, _), value in proxy_samples(metrics_url).items()
                   if name == "ksp_share_state_partition_owned"))


def wait_until_owned(metrics_url: str, partitions: int, timeout_s: float = 300) -> None:
    """Until the instance reports ``partitions`` state partitions owned: gained, replayed, restored."""
    deadline = time.monotonic() + timeout_s
    while owned_partitions(metrics_url) < partitions:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the instance did not own {partitions} state partitions within {timeout_s}s")
        time.sleep(0.05)


_GC_PAUSES = re.compile(r'^ksp_gc_pause_seconds_(count|sum)\{generation="(\d)"\} (\S+)$', re.MULTILINE)


def gc_pauses(text: str) -> dict[int, tuple[int, float]]:
    """Per generation, (collections, seconds paused) so far, from a proxy's /metrics text."""
    found: dict[int, dict[str, float]] = {}
    for kind, generation, value in _GC_PAUSES.findall(text):
        found.setdefault(int(generation), {})[kind] = float(value)
    return {generation: (int(v.get("count", 0)), v.get("sum", 0.0)) for generation, v in found.items()}


def scraped(metrics_url: str, healthz_url: str, scrapes: int, interval_s: float) -> dict:
    """Scrape ``metrics_url`` ``scrapes`` times in a row while asking ``healthz_url`` every ``interval_s``;
    also the full collections (generation 2) the proxy made between the first scrape and the last."""
    seconds, size, first, last = [], 0, "", ""
    with LivenessPoller(healthz_url, interval_s) as poller:
        time.sleep(0.5)  # a baseline of answers first
        for _ in range(scrapes):
            asked = time.monotonic()
            text = metrics_text(metrics_url)
            seconds.append(time.monotonic() - asked)
            size = len(text)
            first, last = first or text, text
        time.sleep(0.5)
    summary = poller.summary()
    collections, collection_s = full_collections_between(first, last)
    return {"scrape_slowest_s": max(seconds, default=0.0), "scrape_bytes": size,
            "scrape_healthz_slowest_s": summary["healthz_slowest_s"], "scrape_healthz_failed": summary["healthz_failed"],
            "scrape_full_collections": collections, "scrape_full_collection_s": collection_s}


def full_collections_between(first: str, last: str) -> tuple[int, float]:
    """The full collections (generation 2) a proxy made between two of its /metrics texts, and
    the seconds they paused it."""
    (before, before_s), (after, after_s) = (gc_pauses(text).get(2, (0, 0.0)) for text in (first, last))
    return after - before, after_s - before_s


def metrics_text(metrics_url: str) -> str:
    answer = http_get(metrics_url)
    if answer is None or answer[0] != 200:
        raise RuntimeError(f"/metrics did not answer 200: {answer}")
    return answer[1]


def instance(kafka: LocalKafka, state_topic: str, slot: int, tree: str, log_dir: Path,
             proxy_args: Sequence[str] = ()) -> tuple[ProxyProcess, int]:
    port = free_port()
    proxy = ProxyProcess(
        upstream=kafka.bootstrap, log_path=log_dir / f"{state_topic}-ksp-{slot}.log",
        extra_args=("--instance-id", f"ksp-{slot}", "--broker-port-base", str(free_port() - kafka.broker_id),
                    "--state-topic", state_topic, "--log-level", "warning", "--metrics-port", str(port),
                    *proxy_args),
        env={"PYTHONPATH": tree} if tree else None, startup_timeout=300)
    return proxy, port


def hand_back(kafka: LocalKafka, state_topic: str, partitions: int, first: ProxyProcess, first_port: int,
              slot: int, tree: str, args: argparse.Namespace, log_dir: Path) -> dict:
    """Instance ``slot`` joins, takes about half the state partitions, and leaves cleanly: how the
    first instance's loop, collector and resident memory fare while it gains them back."""
    metrics = f"http://127.0.0.1:{first_port}/metrics"
    second, _ = instance(kafka, state_topic, slot, tree, log_dir, args.proxy_arg)
    with second:
        wait_for_owners(kafka.bootstrap, state_topic, partitions, 2, timeout_s=300)
        deadline = time.monotonic() + 60
        while owned_partitions(metrics) == partitions:  # A's revocation done
            if time.monotonic() > deadline:
                raise RuntimeError("the first instance kept every state partition")
            time.sleep(0.1)
        handed_over = partitions - owned_partitions(metrics)
        before_hand_back = metrics_text(metrics)  # (a scrape: not while the loop's answers are timed)
        with LivenessPoller(f"http://127.0.0.1:{first_port}/healthz", args.interval) as poller:
            time.sleep(1.0)  # a baseline of answers before the hand-back
            load = os.getloadavg()[0]
            stopped = time.monotonic()
            second.stop()  # a clean leave (SIGTERM): A gains its partitions back
            wait_until_owned(metrics, partitions)
            gained_s = time.monotonic() - stopped
            time.sleep(2.0)  # an instance renews its collector's frozen set 0.5 s after a change (runtime)
        collections, collection_s = full_collections_between(before_hand_back, metrics_text(metrics))
    return {"handed_over": handed_over, "gained_s": gained_s, "load": load, **poller.summary(),
            "full_collections": collections, "full_collection_s": collection_s,
            "rss_kib": resident_kib(first)}


def resident_kib(proxy: ProxyProcess) -> int:
    assert proxy.process is not None
    rss = proc_status_kib(proxy.process.pid, "VmRSS")
    if rss is None:
        raise RuntimeError(f"cannot read the resident memory of the proxy process {proxy.process.pid}")
    return rss


def growth_per_hand_over(rss_kib: Sequence[int]) -> float:
    """KiB of resident memory gained per hand-over after the first, by least squares: the first
    hand-over's own growth (the allocator's and the caches' first high-water mark) is left out."""
    settled = list(rss_kib[1:])
    if len(settled) < 2:
        return 0.0
    return fit_line(list(enumerate(settled)))[1]


def measure(kafka: LocalKafka, topic_id, tree: str, args: argparse.Namespace, log_dir: Path) -> dict:
    state_topic = unique_name("__bench_gain_state")
    written, _ = write_layout_2_state_topic(kafka.bootstrap, state_topic, state_records(
        args.groups, args.partitions, args.records, topic_id=topic_id))
    partitions = state_partitions()  # the topic write_layout_2_state_topic created
    first, first_port = instance(kafka, state_topic, 0, tree, log_dir, args.proxy_arg)
    with first:
        metrics = f"http://127.0.0.1:{first_port}/metrics"
        wait_for_owners(kafka.bootstrap, state_topic, partitions, 1, timeout_s=300)
        wait_until_owned(metrics, partitions)  # replayed and restored: the scrapes see all of it
        scrapes = scraped(metrics, f"http://127.0.0.1:{first_port}/healthz", args.scrapes, args.interval)
        rss_before = resident_kib(first)
        hand_backs = [hand_back(kafka, state_topic, partitions, first, first_port, slot, tree, args, log_dir)
                      for slot in range(1, args.hand_overs + 1)]
    rss = [row["rss_kib"] for row in hand_backs]
    return {"written": written, **hand_backs[0], **scrapes, "rss_before_kib": rss_before, "rss_after_kib": rss,
            "rss_growth_kib": growth_per_hand_over(rss)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=100, help="topic partitions per group")
    parser.add_argument("--records", type=int, default=20_000, help="state records written (cost model's)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between /healthz asks")
    parser.add_argument("--scrapes", type=int, default=5, help="/metrics scrapes timed before the hand-over")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--hand-overs", type=int, default=1,
                        help="times a second instance joins and leaves per round; the first one's stall is "
                             "reported, the first instance's resident memory after each")
    parser.add_argument("--proxy-arg", action="append", default=[],
                        help="extra `serve` argument for both instances (repeatable), "
                             "e.g. --proxy-arg=--metrics-per-partition")
    parser.add_argument("--proxy-trees", type=parse_trees, default=None,
                        help="NAME=PATH,...: measure the proxy of each source tree, rounds alternating")
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    args = parser.parse_args(argv)
    if args.hand_overs < 1:
        parser.error("--hand-overs must be 1 or more: each round measures at least one hand-over")
    trees = args.proxy_trees or [("this", "")]
    print(f"gain stall: {args.groups}x{args.partitions} share-partitions, {args.records:,} state records, "
          f"/healthz every {args.interval}s, Kafka {args.kafka_version}"
          + (f", proxies with {' '.join(args.proxy_arg)}" if args.proxy_arg else ""), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gain-stall-") as tmp, \
            LocalKafka(version=args.kafka_version, share_groups=False, data_dir=Path(tmp) / "kafka") as kafka:
        topic = create_topics(kafka.bootstrap, [unique_name("gain-stall")], partitions=args.partitions)[0]
        topic_id = topic_id_of(kafka.bootstrap, topic)
        for repeat in range(args.repeat):
            for name, path in rotated(trees, repeat):
                row = {"tree": name, "repeat": repeat + 1, **measure(kafka, topic_id, path, args, Path(tmp))}
                rows.append(row)
                print(f"{name:>8} repeat {repeat + 1}: {row['handed_over']} of {state_partitions()} state partitions "
                      f"handed back in {row['gained_s']:.2f}s; slowest /healthz {row['healthz_slowest_s']:.3f}s "
                      f"({row['healthz_failed']} of {row['healthz_asked']} failed), {row['full_collections']} full "
                      f"collections, {row['full_collection_s']:.3f}s; load {row['load']:.2f}; "
                      f"before it, {args.scrapes} scrapes of /metrics ({row['scrape_bytes']:,} bytes): slowest "
                      f"{row['scrape_slowest_s']:.3f}s, slowest /healthz meanwhile {row['scrape_healthz_slowest_s']:.3f}s "
                      f"({row['scrape_healthz_failed']} failed); from the first scrape to the last, "
                      f"{row['scrape_full_collections']} full collections, {row['scrape_full_collection_s']:.3f}s",
                      flush=True)
                if args.hand_overs > 1:
                    print(f"{'':>8} resident memory: {row['rss_before_kib'] / 1024:.1f} MiB before the hand-overs, "
                          f"after each: {', '.join(f'{kib / 1024:.1f}' for kib in row['rss_after_kib'])} MiB; "
                          f"{row['rss_growth_kib'] / 1024:+.2f} MiB per hand-over after the first", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
