"""Acknowledgements of many members at once, by how many state writes may be in flight (a script,
not a test; docs/benchmarks.md, "State writes in flight").

The real :class:`proxy.share.commit.CommitPipeline` with the real
:class:`proxy.share.persister.StateLogWriter` on a local broker, as the share service runs them: the
pipeline's writer task writes whatever is dirty, with ``max_writes_in_flight`` writes on their way
(``--state-writes-in-flight``). Each of ``--members`` tasks owns a share-partition and, in a loop,
acquires 10 records, waits 0 to twice ``--think-ms`` at random (the consumer processing them; the
members fall out of step as consumers do), acknowledges them
(staged, two-phase, as a ShareAcknowledge is) and waits until the acknowledgement is durable: the
time from staging to durable is what an acknowledging client waits for. Settings alternate round
by round, so a load that comes and goes hits all alike; per setting it prints the acknowledgement
latency and acknowledgements per second, and the state writes it took.

``--producers 1,2,4`` also varies how many producers the writer spreads the state partitions over
(``--state-producers``); the state topic has ``--state-partitions`` partitions (12, the proxy's
default), and each member's share-partition is homed on one of them as in the proxy.

``--brokers 3`` runs the broker with broker-only nodes joined to it and the state topic replicated
on every node (min.insync.replicas 2): an acks=all write then waits for the followers to fetch it,
as on a real cluster, and a broker answers one connection's requests one at a time -- the case
``--producers`` is for. Loopback followers fetch within a millisecond; ``--replica-fetch-wait-ms 5``
makes them slower, as followers in other zones are: every follower fetch waits that long (the
followers' replica.fetch.min.bytes is set above any state write, replica.fetch.wait.max.ms to it),
so an acks=all write waits up to that long for its replicas.

``--extra-rtt-ms 0,5`` also measures each setting as if the broker were farther away: every write
is reported durable no sooner than that long after it was submitted (:class:`FartherBroker`; the
records still go to the local broker). This machine's loopback broker answers a state write in
under a millisecond; a managed cluster's acks=all across zones takes several.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.commit_concurrency \\
        [--members 1,4,16] [--in-flight 1,4] [--producers 1] [--state-partitions 12] [--brokers 1] \\
        [--replica-fetch-wait-ms 0] [--seconds 5] [--rounds 3] [--think-ms 2] [--extra-rtt-ms 0,5]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import statistics
import time
import uuid

import trio
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.localkafka.broker import DEFAULT_VERSION, LocalKafka
from proxy.share.commit import Cause, CommitPipeline
from proxy.share.leaders import Leader
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, SharePartition
from proxy.share.persister import StateLogWriter
from proxy.share.state_delta import DeltaPolicy
from proxy.share.states import AcknowledgeType

TOPIC = "commit-concurrency-state"
ACCEPT = int(AcknowledgeType.ACCEPT)
BATCH = 10


class FartherBroker:
    """The real writer, each write reported durable `extra_ms` after it was submitted at the
    earliest: a broker farther away (a managed cluster across zones, acks=all over three replicas)
    as the commit pipeline sees it. The records still go to the local broker, in order, at once."""

    def __init__(self, writer: StateLogWriter, extra_ms: float) -> None:
        self.writer = writer
        self.extra_s = extra_ms / 1000

    async def submit(self, topic, records):
        ready_at = trio.current_time() + self.extra_s
        delivery = await self.writer.submit(topic, records)

        class Later:
            async def wait(self) -> None:
                await delivery.wait()
                await trio.sleep_until(ready_at)

        return Later()

    async def write(self, topic, records) -> None:
        await (await self.submit(topic, records)).wait()


async def measure(bootstrap: str, members: int, in_flight: int, seconds: float, think_ms: float,
                  extra_rtt_ms: float = 0.0, producers: int = 1) -> tuple[list[float], int]:
    """Acknowledgement latencies (ms) and the number of state writes, `seconds` of `members` acking."""
    writer = StateLogWriter(bootstrap, producers=producers)
    writer.start()
    pipeline = CommitPipeline(writer if not extra_rtt_ms else FartherBroker(writer, extra_rtt_ms), TOPIC, wall_clock=lambda: 0, clock=lambda: 0, deltas=DeltaPolicy(),
                              max_writes_in_flight=in_flight)
    topic_id = uuid.uuid4()
    latencies: list[float] = []
    writes_before = pipeline.writes_issued
    deadline = trio.current_time() + seconds

    async def member(partition: int) -> None:
        leader = Leader(("bench", topic_id, partition), SharePartition(PartitionConfig(), 0), create_timestamp=0)
        rng = random.Random(partition)
        await pipeline.persist_initial(leader)
        offset = 0
        while trio.current_time() < deadline:
            leader.engine.acquire("m", [BatchHeader(offset, offset + BATCH - 1)], now=0, max_records=BATCH)
            await trio.sleep(rng.uniform(0, 2 * think_ms) / 1000)  # members out of step, as consumers are
            started = time.perf_counter()
            staged = leader.engine.stage_acknowledge("m", [AckRange(offset, offset + BATCH - 1, (ACCEPT,))], now=0)
            await pipeline.durable(leader, pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged))
            latencies.append((time.perf_counter() - started) * 1e3)
            offset += BATCH

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.run)
            async with trio.open_nursery() as members_nursery:
                for partition in range(members):
                    members_nursery.start_soon(member, partition)
            nursery.cancel_scope.cancel()
        return sorted(latencies), pipeline.writes_issued - writes_before
    finally:
        await writer.aclose()


def start_cluster(stack: contextlib.ExitStack, args: argparse.Namespace) -> LocalKafka:
    """The broker (and ``--brokers`` - 1 broker-only nodes joined to it, closed with `stack`) with the
    state topic created, replicated on every node."""
    slow_followers = ({"replica.fetch.min.bytes": str(1 << 20), "replica.fetch.wait.max.ms": str(args.replica_fetch_wait_ms)}
                      if args.replica_fetch_wait_ms else {})
    kafka = stack.enter_context(LocalKafka(version=args.kafka_version, server_properties=slow_followers))
    for node_id in range(2, args.brokers + 1):
        stack.enter_context(LocalKafka(version=args.kafka_version, node_id=node_id, join=kafka,
                                       server_properties=slow_followers))
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    replicated = {"min.insync.replicas": "2"} if args.brokers > 1 else {}
    admin.create_topics([NewTopic(TOPIC, args.state_partitions, args.brokers,
                                  config={"cleanup.policy": "compact", **replicated})])[TOPIC].result()
    return kafka


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 16])
    parser.add_argument("--in-flight", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4])
    parser.add_argument("--producers", type=lambda s: [int(v) for v in s.split(",")], default=[1],
                        help="state producers the writer spreads the partitions over (--state-producers)")
    parser.add_argument("--state-partitions", type=int, default=12)
    parser.add_argument("--brokers", type=int, default=1,
                        help="nodes in the cluster; the state topic is replicated on all of them")
    parser.add_argument("--replica-fetch-wait-ms", type=int, default=0,
                        help="with --brokers > 1: followers fetch every this many ms (0: as soon as data arrives)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--extra-rtt-ms", type=lambda s: [float(v) for v in s.split(",")], default=[0.0],
                        help="broker round trips added to each write's delivery (FartherBroker), e.g. 0,5")
    parser.add_argument("--think-ms", type=float, default=2.0,
                        help="a member's mean processing time per 10 records (uniform, 0 to twice this)")
    parser.add_argument("--kafka-version", default=os.environ.get("KSP_KAFKA_VERSION", DEFAULT_VERSION))
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        kafka = start_cluster(stack, args)
        followers = (f"followers fetch every {args.replica_fetch_wait_ms} ms" if args.replica_fetch_wait_ms
                     else "followers fetch as data arrives")
        print(f"Kafka {args.kafka_version}, {args.brokers} broker(s) ({followers}), {args.state_partitions} "
              f"state partitions, {args.seconds:g} s per setting and round, think {args.think_ms:g} ms, "
              f"load {tuple(round(v, 2) for v in os.getloadavg())}", flush=True)
        trio.run(measure, kafka.bootstrap, 1, 1, 1.0, args.think_ms)  # warm-up: producer id, metadata
        results: dict[tuple[float, int, int, int], list[tuple[list[float], int]]] = {}
        for round_number in range(1, args.rounds + 1):
            for extra, members, in_flight, producers in itertools.product(args.extra_rtt_ms, args.members,
                                                                           args.in_flight, args.producers):
                ms, writes = trio.run(measure, kafka.bootstrap, members, in_flight, args.seconds, args.think_ms,
                                      extra, producers)
                results.setdefault((extra, members, in_flight, producers), []).append((ms, writes))
                print(f"round {round_number}, +{extra:g} ms, {members} member(s), {in_flight} in flight, "
                      f"{producers} producer(s): {len(ms) / args.seconds:,.0f} acks/s, p50 {ms[len(ms) // 2]:.2f} ms, "
                      f"p99 {ms[int(len(ms) * 0.99)]:.2f} ms, mean {statistics.mean(ms):.2f} ms, "
                      f"{writes} writes", flush=True)
        print("\n| broker RTT added | members | in flight | producers | acks/s (median round) | p50 ms | p99 ms "
              "| writes per ack |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (extra, members, in_flight, producers), runs in results.items():
            ms, writes = sorted(runs, key=lambda run: len(run[0]))[len(runs) // 2]
            print(f"| {extra:g} ms | {members} | {in_flight} | {producers} | {len(ms) / args.seconds:,.0f} "
                  f"| {ms[len(ms) // 2]:.2f} | "
                  f"{ms[int(len(ms) * 0.99)]:.2f} | {writes / len(ms):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
