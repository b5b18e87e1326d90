"""Pass-through throughput: confluent-kafka directly against the broker vs through the proxy.

Starts a local Kafka (LocalKafka) and `share-proxy serve` in front of it, then, in the same
run, produces N records of S bytes directly and through the proxy (each to its own topic),
and consumes one topic both ways (assigned partitions, no group, from the beginning).

``--connections 1,8,64`` runs every count in turn: that many producers (and then consumers),
each a confluent-kafka client of its own (its own connection), in threads, the records split
between them; a topic has max(--partitions, connections) partitions and each client owns the
partitions p with p % connections == its index, so every client has work and none shares a
partition. Rounds alternate the order of the paths; per connection count and operation the
report gives each path's median records/s with the spread (min-max) of its rounds, the ratio of
the medians and the median of the per-round ratios (each round measures the paths back to
back, so the per-round ratio is what the machine's load disturbs least). The proxy's CPU time
per record (user+system of its process, from /proc) is reported beside it: on a shared machine
it is steadier than a rate.

``--compare before=/tmp/tree`` starts a second proxy from another source tree (its
``python -m proxy.cli``, same venv) beside the current one: a before/after in one run, the same
rounds alternating over all paths. ``--tls-proxy`` adds every proxy once more with TLS listeners
(``proxy-tls``, ``before-tls``; a fresh CA, the clients verify it; upstream plaintext): the cost
of terminating TLS, and the before/after over TLS.
``--variant gather="--stream-responses-from 0"`` starts one more proxy from the current tree with
those extra ``serve`` arguments: a setting against the current defaults, in the same rounds.
``--profile DIR`` runs the current proxy under cProfile (``DIR/proxy.prof`` at exit).
``--hop`` adds a bare TCP hop (``integration.bench.hop``: splice threads, nothing per byte in
Python) as one more path, reached through a second broker listener that advertises the hop's
address: what one more process between client and broker costs on this machine whatever it does,
the floor any proxy's ratio to direct stands on (``hop/direct``, and ``proxy/hop`` beside it).

    .venv/bin/python -m integration.bench.passthrough --records 200000 --size 1024
    .venv/bin/python -m integration.bench.passthrough --connections 1,8,64 --repeat 5 \\
        --compare before=/tmp/bytes-before
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from integration.bench.hop import hop_process
from integration.bench.procfs import process_cpu_seconds
from integration.kafka_fixtures import ProxyProcess, create_topics, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka, free_port



@dataclass(frozen=True, slots=True)
class Target:
    """One way to reach the broker: its bootstrap, client settings, and the proxy process (if any)."""

    name: str
    bootstrap: str
    client_config: dict[str, str] = field(default_factory=dict)
    pid: int | None = None

    def cpu_seconds(self) -> float | None:
        """User+system CPU the proxy process has used so far (None for the direct path)."""
        if self.pid is None:
            return None
        return process_cpu_seconds(self.pid)


@dataclass(frozen=True, slots=True)
class Measurement:
    path: str
    operation: str
    connections: int
    round: int
    records: int
    payload_bytes: int
    seconds: float
    proxy_cpu_seconds: float | None = None

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    @property
    def cpu_us_per_record(self) -> float | None:
        if self.proxy_cpu_seconds is None:
            return None
        return self.proxy_cpu_seconds / self.records * 1e6


def split(records: int, clients: int) -> list[int]:
    """Records per client: as even as possible, the first clients take the remainder."""
    base, extra = divmod(records, clients)
    return [base + (1 if index < extra else 0) for index in range(clients)]


def owned_partitions(partitions: int, clients: int) -> list[list[int]]:
    """The partitions each client owns: p with p % clients == index (partitions >= clients)."""
    if partitions < clients:
        raise ValueError(f"{clients} clients need at least as many partitions, not {partitions}")
    return [[p for p in range(partitions) if p % clients == index] for index in range(clients)]


def run_parallel(workers: Sequence[Callable[[], None]], cpu_clock: Callable[[], float | None]) -> tuple[float, float | None]:
    """Start every worker in its own thread at once: (seconds until the last one finished, the
    proxy CPU seconds `cpu_clock` counted meanwhile, None without a proxy).

    Clients are created before (by the caller), so connecting is neither timed nor counted, but
    the first requests are. A worker's exception is re-raised here.
    """
    start = threading.Barrier(len(workers) + 1)
    errors: list[BaseException] = []

    def body(work: Callable[[], None]) -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(work,), daemon=True) for work in workers]
    for thread in threads:
        thread.start()
    cpu_before = cpu_clock()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu_after = cpu_clock()
    if errors:
        raise errors[0]
    return elapsed, None if cpu_before is None or cpu_after is None else cpu_after - cpu_before


def producer_config(path: Target, compression: str) -> dict[str, object]:
    return {
        "bootstrap.servers": path.bootstrap,
        **path.client_config,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": compression,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 2_097_151,
    }


def produce(path: Target, topic: str, partitions: int, records: int, size: int, compression: str,
            connections: int = 1) -> tuple[float, float | None]:
    """Produce `records` to `topic` with `connections` producers: (seconds, proxy CPU seconds)."""
    value = os.urandom(size)
    owned = owned_partitions(partitions, connections)
    counts = split(records, connections)
    producers = [Producer(producer_config(path, compression)) for _ in range(connections)]
    failures = [0]

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures[0] += 1

    def worker(producer: Producer, mine: list[int], count: int, first_key: int) -> Callable[[], None]:
        def work() -> None:
            for index in range(count):
                while True:
                    try:
                        producer.produce(topic, value=value, key=str(first_key + index).encode(),
                                         partition=mine[index % len(mine)], on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.01)
                if index % 10_000 == 0:
                    producer.poll(0)
            if producer.flush(120) != 0:
                raise RuntimeError(f"produce to {topic} via {path.name}: flush timed out")
        return work

    # Warm every producer (metadata, its connection to the leader) before the clock starts:
    # one untimed record per partition it owns. A cold start costs ~0.4 s, which would dilute
    # the ratios towards 1.
    for producer, mine in zip(producers, owned):
        for partition in mine:
            producer.produce(topic, value=value, key=b"warm", partition=partition, on_delivery=on_delivery)
        if producer.flush(60) != 0:
            raise RuntimeError(f"produce to {topic} via {path.name}: the warm-up record was not delivered")
    first_keys = [sum(counts[:index]) for index in range(connections)]
    timing = run_parallel([worker(p, mine, count, first)
                           for p, mine, count, first in zip(producers, owned, counts, first_keys)], path.cpu_seconds)
    if failures[0]:
        raise RuntimeError(f"produce to {topic} via {path.name}: {failures[0]} failed deliveries")
    return timing


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    """Each partition's (low, high) watermark, asked directly."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("bench-offsets")})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in range(partitions)]
    finally:
        consumer.close()


def consume(path: Target, topic: str, marks: list[tuple[int, int]], connections: int = 1) -> tuple[float, float | None]:
    """Read `topic` between its watermarks `marks` with `connections` consumers: (seconds, proxy CPU seconds).

    The consumers start at explicit offsets and know the topic's metadata before the clock
    starts: OFFSET_BEGINNING costs a ListOffsets round and about 0.6 s before the first record
    (measured), which would dilute every ratio towards 1.
    """
    owned = owned_partitions(len(marks), connections)
    consumers = []
    for mine in owned:
        consumer = Consumer(
            {
                "bootstrap.servers": path.bootstrap,
                **path.client_config,
                "group.id": unique_name("bench-unused"),  # required by the client; offsets are not committed
                "enable.auto.commit": False,
                "fetch.max.bytes": 52_428_800,
                "max.partition.fetch.bytes": 10_485_760,
            }
        )
        consumer.list_topics(topic, timeout=30)
        consumers.append(consumer)

    def worker(consumer: Consumer, mine: list[int], expected: int) -> Callable[[], None]:
        def work() -> None:
            # Assigned only now: an assigned consumer starts fetching at once, and records it
            # buffered before the clock started would not be timed.
            consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in mine])
            received = 0
            deadline = time.perf_counter() + 300
            while received < expected:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"consumed only {received}/{expected} from {topic} via {path.name}")
                # Never ask for more than is left: consume() waits its whole timeout for a batch it
                # cannot fill, which would add up to a second to every measurement.
                for message in consumer.consume(num_messages=min(10_000, expected - received), timeout=1.0):
                    if message.error() is None:
                        received += 1
        return work

    expected = [sum(marks[p][1] - marks[p][0] for p in mine) for mine in owned]
    try:
        return run_parallel([worker(c, mine, n) for c, mine, n in zip(consumers, owned, expected)], path.cpu_seconds)
    finally:
        for consumer in consumers:
            consumer.close()


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def measured(path: Target, operation: str, connections: int, round_number: int, records: int, size: int,
             action: Callable[[], tuple[float, float | None]]) -> Measurement:
    seconds, cpu = action()
    return Measurement(path.name, operation, connections, round_number, records, records * size, seconds, cpu)


def start_proxies(stack: ExitStack, kafka: LocalKafka, scratch: Path, args: argparse.Namespace) -> list[Target]:
    """direct, proxy, one per --compare tree; with --tls-proxy each proxy once more with TLS listeners."""
    python = sys.executable
    common = ("--log-level", "warning", *args.proxy_arg)
    # -P: the working directory must not shadow the tree PYTHONPATH names.
    profile = (python, "-P", "-m", "cProfile", "-o", str(Path(args.profile) / "proxy.prof"), "-m", "proxy.cli") \
        if args.profile else ()
    if profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    # name -> (launcher, environment, extra serve arguments): the current tree (the venv's
    # share-proxy), the other trees, and the current tree with other settings.
    kinds: dict[str, tuple[tuple[str, ...], dict[str, str] | None, tuple[str, ...]]] = {"proxy": (profile, None, ())}
    for name, tree in args.compare:
        kinds[name] = ((python, "-P", "-m", "proxy.cli"), dict(os.environ, PYTHONPATH=tree), ())
    for name, extra in args.variant:
        kinds[name] = ((), None, extra)
    variants: list[tuple[str, tuple[str, ...], dict[str, str]]] = [(name, (), {}) for name in kinds]
    if args.tls_proxy:
        from proxy.localkafka.certs import Certificates

        certificates = Certificates(scratch / "pki")
        cert, key = certificates.issue("proxy", hosts=("127.0.0.1", "localhost"))
        listener = ("--listener-ssl-certificate-location", str(cert), "--listener-ssl-key-location", str(key))
        client = {"security.protocol": "SSL", "ssl.ca.location": str(certificates.ca_cert)}
        variants += [(f"{name}-tls", listener, client) for name in kinds]
    paths = [Target("direct", kafka.bootstrap)]
    for name, listener_args, client_config in variants:
        launcher, env, extra = kinds[name.removesuffix("-tls")]
        started = stack.enter_context(ProxyProcess(upstream=kafka.bootstrap, log_path=scratch / f"{name}.log",
                                                   extra_args=(*common, *extra, *listener_args), launcher=launcher,
                                                   env=env))
        assert started.process is not None
        paths.append(Target(name, started.bootstrap, client_config, pid=started.process.pid))
    return paths


def start_kafka_behind_a_hop(stack: ExitStack, **kafka_options) -> tuple[LocalKafka, Target]:
    """The broker (`kafka_options` go to LocalKafka) with a second listener (HOP) that advertises a
    bare hop's address, and the hop in front of it: a client that bootstraps through the hop is sent
    back through it for every broker connection, while the direct path and the proxies use the
    ordinary listener."""
    port, controller_port, hop_listener_port, hop_port = (free_port() for _ in range(4))
    listeners = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
                     f"HOP://127.0.0.1:{hop_listener_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},HOP://127.0.0.1:{hop_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,HOP:PLAINTEXT",
    }
    hop = stack.enter_context(hop_process(hop_port, f"127.0.0.1:{hop_listener_port}"))
    kafka = stack.enter_context(LocalKafka(port=port, controller_port=controller_port, server_properties=listeners,
                                           **kafka_options))
    return kafka, Target("hop", f"127.0.0.1:{hop_port}", pid=hop.pid)


def run(args: argparse.Namespace) -> tuple[list[Measurement], list[str]]:
    measurements: list[Measurement] = []
    notes = [f"load (1/5/15 min) at start: {load()}"]
    with tempfile.TemporaryDirectory(prefix="ksp-bench-") as scratch, ExitStack() as stack:
        if args.hop:
            kafka, hop = start_kafka_behind_a_hop(stack, version=args.kafka_version, heap=args.heap)
        else:
            kafka, hop = stack.enter_context(LocalKafka(version=args.kafka_version, heap=args.heap)), None
        paths = start_proxies(stack, kafka, Path(scratch), args)
        if hop is not None:
            paths.insert(1, hop)
        print(f"Kafka {kafka.version} at {kafka.bootstrap}; "
              + ", ".join(f"{p.name} at {p.bootstrap}" for p in paths[1:]), flush=True)
        warmup = min(args.records, 20_000)
        for path in paths:
            [topic] = create_topics(kafka.bootstrap, [unique_name(f"warmup-{path.name}")], args.partitions)
            produce(path, topic, args.partitions, warmup, args.size, args.compression)
            consume(path, topic, watermarks(kafka.bootstrap, topic, args.partitions))
        for connections in args.connections:
            partitions = max(args.partitions, connections)
            for round_number in range(args.repeat):
                names = [unique_name(f"bench-{p.name}") for p in paths]
                topics = dict(zip((p.name for p in paths), create_topics(kafka.bootstrap, names, partitions)))
                # Rotate the order every round so that no path always meets a warmer broker.
                shift = round_number % len(paths)
                order = paths[shift:] + paths[:shift]
                for path in order if "produce" in args.operations else ():
                    measurements.append(measured(
                        path, "produce", connections, round_number, args.records, args.size,
                        lambda: produce(path, topics[path.name], partitions, args.records, args.size,
                                        args.compression, connections)))
                if "produce" not in args.operations:  # consume only: the records still have to be there
                    produce(paths[0], topics["direct"], partitions, args.records, args.size, args.compression,
                            connections)
                # Every path reads the same records: the topic produced directly.
                marks = watermarks(kafka.bootstrap, topics["direct"], partitions)
                records = sum(high - low for low, high in marks)
                for path in order if "consume" in args.operations else ():
                    measurements.append(measured(
                        path, "consume", connections, round_number, records, args.size,
                        lambda: consume(path, topics["direct"], marks, connections)))
                print(f"connections {connections}: round {round_number + 1}/{args.repeat} done (load {load()})",
                      flush=True)
    notes.append(f"load (1/5/15 min) at end: {load()}")
    return measurements, notes


def _spread(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def report(measurements: list[Measurement], args: argparse.Namespace, notes: Sequence[str] = ()) -> str:
    path_names = list(dict.fromkeys(m.path for m in measurements))
    lines = [
        f"{args.records} records x {args.size} B, partitions max({args.partitions}, connections), "
        f"compression={args.compression}, {args.repeat} round(s) per connection count, Kafka {args.kafka_version}",
        *notes,
        "",
        "| connections | operation | path | records/s (median) | spread | MB/s | its process's CPU µs/record (median, spread) | rounds (records/s) |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    ratio_lines = ["", "| connections | operation | ratio | of medians | per-round median | per-round spread |",
                   "|---:|---|---|---:|---:|---:|"]
    for connections in args.connections:
        for operation in args.operations:
            runs = {name: sorted((m for m in measurements if m.operation == operation and m.path == name
                                  and m.connections == connections), key=lambda m: m.round)
                    for name in path_names}
            medians = {}
            for name, these in runs.items():
                if not these:
                    continue
                rates = [m.records_per_second for m in these]
                medians[name] = statistics.median(rates)
                throughput = statistics.median(m.megabytes_per_second for m in these)
                cpus = [m.cpu_us_per_record for m in these if m.cpu_us_per_record is not None]
                cpu = f"{statistics.median(cpus):.2f} ({_spread(cpus, '{:.2f}')})" if cpus else ""
                each = ", ".join(f"{rate:,.0f}" for rate in rates)
                lines.append(f"| {connections} | {operation} | {name} | {medians[name]:,.0f} | {_spread(rates)} "
                             f"| {throughput:,.1f} | {cpu} | {each} |")
            pairs = [(name, "direct") for name in path_names if name != "direct"]
            others = [name for name, _ in (*args.compare, *args.variant)]
            pairs += [("proxy", name) for name in others]
            pairs += [("proxy-tls", f"{name}-tls") for name in others]
            pairs += [("proxy-tls", "proxy")]  # what terminating TLS costs
            pairs += [("proxy", "hop")]  # what the proxy costs beyond the hop itself
            for top, bottom in pairs:
                if top not in medians or bottom not in medians:
                    continue
                per_round = [a.records_per_second / b.records_per_second for a, b in zip(runs[top], runs[bottom])]
                ratio_lines.append(
                    f"| {connections} | {operation} | {top}/{bottom} | {medians[top] / medians[bottom]:.2f} "
                    f"| **{statistics.median(per_round):.2f}** | {_spread(per_round, '{:.2f}')} |")
                if bottom != "direct":
                    cpu_pairs = [(a.cpu_us_per_record, b.cpu_us_per_record) for a, b in zip(runs[top], runs[bottom])]
                    cpu_ratios = [a / b for a, b in cpu_pairs if a is not None and b]
                    if cpu_ratios:
                        ratio_lines.append(
                            f"| {connections} | {operation} | CPU/record {top}/{bottom} | "
                            f"| **{statistics.median(cpu_ratios):.2f}** | {_spread(cpu_ratios, '{:.2f}')} |")
    return "\n".join(lines + ratio_lines)


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """`glibc-arenas=--malloc-arenas 0` -> ("glibc-arenas", ("--malloc-arenas", "0")): a proxy's
    name and the extra serve arguments it starts with (split as a shell would)."""
    name, sep, extra = text.partition("=")
    if not sep or not name or not extra.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=\"SERVE ARGUMENTS\", not {text!r}")
    return name, tuple(shlex.split(extra))


def _named_variant(text: str) -> tuple[str, tuple[str, ...]]:
    name, extra = parse_variant(text)
    if name in ("direct", "proxy") or name.endswith("-tls"):
        raise argparse.ArgumentTypeError(f"{name!r} names one of this benchmark's own paths: choose another")
    return name, extra


def _connection_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("connection counts are positive integers, e.g. 1,8,64")
    return counts


def _named_tree(text: str) -> tuple[str, str]:
    name, _, tree = text.partition("=")
    if not name or not tree or name in ("direct", "proxy") or name.endswith("-tls") or not Path(tree, "proxy").is_dir():
        raise argparse.ArgumentTypeError(f"expected NAME=SOURCE_TREE with a proxy/ package in it, not {text!r}")
    return name, str(Path(tree).resolve())


def per_round_ratios(measurements: Sequence[Measurement], top: str, bottom: str = "direct") -> dict[str, dict[int, float]]:
    """{operation: {connections: median over rounds of top/bottom records/s}}: each round measures the
    paths back to back, so the per-round ratio is what the machine's load disturbs least."""
    ratios: dict[str, dict[int, float]] = {}
    for operation in dict.fromkeys(m.operation for m in measurements):
        for connections in dict.fromkeys(m.connections for m in measurements):
            def rounds(path: str) -> list[Measurement]:
                return sorted((m for m in measurements if (m.operation, m.path, m.connections) == (operation, path, connections)),
                              key=lambda m: m.round)
            pairs = list(zip(rounds(top), rounds(bottom)))
            if pairs:
                ratios.setdefault(operation, {})[connections] = statistics.median(
                    a.records_per_second / b.records_per_second for a, b in pairs)
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kafka-version", default=os.environ.get("KSP_KAFKA_VERSION", DEFAULT_VERSION))
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="value size in bytes")
    parser.add_argument("--partitions", type=int, default=3, help="at least; max(this, connections) are used")
    parser.add_argument("--compression", default="none")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per connection count")
    parser.add_argument("--heap", default="1g", help="broker -Xmx")
    parser.add_argument("--connections", type=_connection_counts, default=[1],
                        help="comma-separated client counts, e.g. 1,8,64 (default 1)")
    parser.add_argument("--compare", type=_named_tree, action="append", default=[], metavar="NAME=TREE",
                        help="also measure a proxy run from another source tree (repeatable)")
    parser.add_argument("--variant", type=_named_variant, action="append", default=[], metavar='NAME="ARGS"',
                        help="also measure the current tree with these extra serve arguments (repeatable)")
    parser.add_argument("--operations", type=lambda text: [op for op in ("produce", "consume") if op in text.split(",")],
                        default=["produce", "consume"], help="produce,consume (default both); consume reads what "
                        "was produced directly, so it always produces there")
    parser.add_argument("--tls-proxy", action="store_true", help="also measure every proxy with TLS listeners")
    parser.add_argument("--hop", action="store_true",
                        help="also measure a bare TCP hop (kernel splice, no Kafka spoken): the extra hop's own cost")
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    parser.add_argument("--profile", help="run the current proxy under cProfile; DIR/proxy.prof at exit")
    parser.add_argument("--json", type=Path, help="also write every measurement and the per-round ratios here")
    args = parser.parse_args(argv)
    measurements, notes = run(args)
    print(report(measurements, args, notes))
    if args.json:
        paths = dict.fromkeys(m.path for m in measurements if m.path != "direct")
        args.json.write_text(json.dumps({
            "notes": list(notes),
            "measurements": [dataclasses.asdict(m) for m in measurements],
            "per_round_ratio_to_direct": {path: per_round_ratios(measurements, path) for path in paths},
        }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
