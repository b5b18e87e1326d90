"""Scale-out spike (issue 15): what Kafka's own group coordinator and transactional producers give
several proxy instances, measured against a real broker. A probe, not a test: it prints what it
measured (``--json`` also writes the numbers). docs/scale-out.md quotes a run.

One LocalKafka (KRaft, single node; ``group.initial.rebalance.delay.ms=0``), five parts:

1. **Ownership group.** ``--members`` (3) child processes -- each one confluent-kafka Consumer, as a
   proxy instance would run one -- subscribe to a ``--partitions`` (50) partition topic (a stand-in
   for the state topic) in one consumer group, ``session.timeout.ms`` ``--session-timeout-ms``
   (6000), ``heartbeat.interval.ms`` 1000. Per assignor configuration (``range,roundrobin`` --
   librdkafka's default --, ``cooperative-sticky``, and ``cooperative-sticky`` with static membership
   ``group.instance.id``): the partitions each member owns once stable; what
   ``AdminClient.describe_consumer_groups`` shows of every member (client.id, group.instance.id,
   host, assigned partitions) and how long it takes; the time until the surviving members own every
   partition again after one member **closes cleanly** (SIGTERM: ``Consumer.close()``) and after
   one is **killed** (SIGKILL) -- for KIP-848's ``group.protocol=consumer`` spread and a clean close
   only (its session timeout is the broker's, 45 s); and with ``cooperative-sticky``, a member
   **frozen with SIGSTOP** for
   ``--freeze-s`` (10 s, past the session timeout) then resumed with SIGCONT: when the others took
   its partitions, which callback or error tells it that it lost them and how long after SIGCONT it
   still believed it owned them, and when the group is whole again.
2. **Transactional fencing.** Two producers with one ``transactional.id``: the second's
   ``init_transactions`` while the first holds an open transaction with a record in it (how long
   it takes), then what the first one's produce, flush and ``commit_transaction`` report (error name,
   fatal / retriable / abortable) -- once with the transaction open, once idle; which of its records
   a ``read_committed`` and a ``read_uncommitted`` reader see; and that a ``read_committed`` reader
   cannot pass an open transaction (it stops at the last stable offset).
2b. **Fencing by the group's generation** (KIP-447; one producer per instance, not per partition):
   the cost of ``send_offsets_to_transaction`` with the ownership consumer's group metadata per
   transaction (200 iterations, with and without); whether a transaction that passed that check
   before a rebalance still commits after it; how long the new owner's ``committed()`` read
   (RequireStable under read_committed) waits on that open transaction; what a stale member's
   next ``send_offsets_to_transaction`` gets.
3. **Write latency**, side by side, ``--iterations`` (500) each, one ``--record-bytes`` (2048) record
   to a compacted single-partition topic, lz4 (the state writer's settings):
   (a) idempotent ``acks=all`` produce + flush; (b) ``begin_transaction`` / produce /
   ``commit_transaction``; both with ``linger.ms`` 1 and 0, and (b) with a ``flush()`` before the
   commit (200 iterations);
   (c) with ``linger.ms`` 0, 8 records, one per partition of an 8-partition topic, flushed
   together or in one transaction (a group-committed writer batch); p50 / p99 / mean in ms. And
   ``init_transactions`` of a fresh transactional.id and of one that was used (a hand-over's
   fencing cost).
4. **Producers per process**: threads and resident memory of the process before and after 12
   transactional producers (one per state partition of a 12-partition state topic, each
   initialised and one transaction committed), and how long their 12 ``init_transactions`` take
   one after the other (a single instance taking every partition).

About 4-5 minutes. Run one broker at a time on a small machine:

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.scale_spike [--json /tmp/scale_spike.json]

A child process runs ``python -m integration.bench.scale_spike --member ...`` and prints one JSON line
per rebalance event; the parent kills every child it started before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from integration.kafka_fixtures import create_topics, unique_name
from proxy.localkafka import DEFAULT_VERSION, LocalKafka

# ----------------------------------------------------------------------------------------------
# child: one group member


def member_main(args: argparse.Namespace) -> int:
    """One group member: print a JSON line per rebalance event, close cleanly on SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    owned: set[int] = set()
    cooperative = "cooperative" in args.assignor or args.assignor == "consumer-protocol"

    def emit(event: str, **extra: object) -> None:
        line = {"t": time.time(), "member": args.member, "ev": event, "owned": sorted(owned), **extra}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not cooperative:
            owned.clear()
        owned.update(p.partition for p in partitions)
        emit("assign", delta=[p.partition for p in partitions])

    def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        owned.difference_update(p.partition for p in partitions)
        emit("revoke", delta=[p.partition for p in partitions])

    def on_lost(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        owned.difference_update(p.partition for p in partitions)
        emit("lost", delta=[p.partition for p in partitions])

    def on_error(error: KafkaError) -> None:
        emit("error", error=error.name(), detail=error.str(), fatal=error.fatal())

    config: dict[str, object] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        # What a proxy instance would advertise: instance slot, host, port base.
        "client.id": f"ksp:{args.member}:127.0.0.1:{19000 + 100 * args.member}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "error_cb": on_error,
    }
    if args.assignor == "consumer-protocol":
        # KIP-848: the broker assigns; the session timeout is the broker's
        # group.consumer.session.timeout.ms (45 s by default), not a client setting.
        config["group.protocol"] = "consumer"
    else:
        config |= {"partition.assignment.strategy": args.assignor,
                   "session.timeout.ms": args.session_timeout_ms, "heartbeat.interval.ms": 1000}
    if args.static:
        config["group.instance.id"] = f"ksp-instance-{args.member}"
    consumer = Consumer(config)
    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("started")
    while not stop.is_set():
        consumer.poll(0.05)
    emit("closing")
    consumer.close()
    emit("closed")
    return 0


# ----------------------------------------------------------------------------------------------
# parent: the members, their events


@dataclass
class Member:
    index: int
    process: subprocess.Popen[str]
    owned: set[int] = field(default_factory=set)
    alive: bool = True
    events: list[dict] = field(default_factory=list)


class Group:
    """Child processes in one consumer group and the events they print."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, assignor: str, static: bool,
                 session_timeout_ms: int) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.assignor, self.static, self.session_timeout_ms = assignor, static, session_timeout_ms
        self.group = unique_name("spike-owners")
        self.members: dict[int, Member] = {}
        self.events: queue.Queue[dict] = queue.Queue()

    def start(self, index: int) -> Member:
        command = [sys.executable, "-m", "integration.bench.scale_spike", "--member", str(index),
                   "--bootstrap", self.bootstrap, "--group", self.group, "--topic", self.topic,
                   "--assignor", self.assignor, "--session-timeout-ms", str(self.session_timeout_ms)]
        if self.static:
            command.append("--static")
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        member = self.members[index] = Member(index, process)

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                try:
                    self.events.put(json.loads(line))
                except ValueError:
                    pass

        def pump_log() -> None:
            # librdkafka's own log lines (stderr), time-stamped on arrival.
            assert process.stderr is not None
            for line in process.stderr:
                self.events.put({"t": time.time(), "member": index, "ev": "log", "line": line.strip()[:300],
                                 "owned": None})

        threading.Thread(target=pump, daemon=True).start()
        threading.Thread(target=pump_log, daemon=True).start()
        return member

    def drain(self, timeout: float) -> list[dict]:
        """Events that arrive within `timeout` s (applied to the members' owned sets)."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return got
            member = self.members[event["member"]]
            if event["owned"] is not None:
                member.owned = set(event["owned"])
            member.events.append(event)
            got.append(event)

    def live(self) -> list[Member]:
        return [m for m in self.members.values() if m.alive]

    def covered(self, among: Sequence[Member]) -> bool:
        """Every partition owned by exactly one of `among`."""
        counts: dict[int, int] = {}
        for member in among:
            for p in member.owned:
                counts[p] = counts.get(p, 0) + 1
        return len(counts) == self.partitions and all(c == 1 for c in counts.values())

    def wait_covered(self, among: Sequence[Member], limit_s: float) -> float | None:
        """Wall time (time.time) of the event after which `among` own every partition once; None on timeout."""
        deadline = time.monotonic() + limit_s
        last = time.time()
        while time.monotonic() < deadline:
            if self.covered(among) and all(m.owned for m in among):
                # Stable: no further event for a moment.
                if not self.drain(1.0):
                    return last
                continue
            events = self.drain(0.2)
            if events:
                last = events[-1]["t"]
        return None

    def stop_all(self) -> None:
        for member in self.members.values():
            if member.process.poll() is None:
                try:
                    member.process.send_signal(signal.SIGCONT)
                    member.process.kill()
                except ProcessLookupError:
                    pass
                member.process.wait(timeout=10)


def spread(members: Sequence[Member]) -> dict[int, int]:
    return {m.index: len(m.owned) for m in members}


def describe(bootstrap: str, group: str) -> dict:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    description = admin.describe_consumer_groups([group])[group].result(timeout=15)
    elapsed_ms = (time.monotonic() - started) * 1000
    members = []
    for m in description.members:
        assigned = sorted(tp.partition for tp in (m.assignment.topic_partitions if m.assignment else []))
        members.append({"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                        "group_instance_id": m.group_instance_id, "assigned": len(assigned),
                        "first_partitions": assigned[:5]})
    return {"state": str(description.state), "protocol": description.partition_assignor,
            "elapsed_ms": round(elapsed_ms, 1), "members": members}


def ownership_part(bootstrap: str, args: argparse.Namespace, assignor: str, static: bool, freeze: bool,
                   kill: bool = True) -> dict:
    topic = create_topics(bootstrap, [unique_name("spike-ownership")], partitions=args.partitions)[0]
    group = Group(bootstrap, topic, args.partitions, assignor, static, args.session_timeout_ms)
    label = assignor + (" + static" if static else "")
    result: dict = {"assignor": label}
    try:
        started = time.time()
        for i in range(args.members):
            group.start(i)
        stable = group.wait_covered(group.live(), 60)
        result["initial_stable_s"] = None if stable is None else round(stable - started, 2)
        result["initial_spread"] = spread(group.live())
        result["describe"] = describe(bootstrap, group.group)

        # 1. a clean close
        leaving = group.members[args.members - 1]
        t0 = time.time()
        leaving.process.send_signal(signal.SIGTERM)
        leaving.alive = False
        done = group.wait_covered(group.live(), 60)
        result["clean_close_s"] = None if done is None else round(done - t0, 2)
        result["after_close_spread"] = spread(group.live())
        leaving.process.wait(timeout=20)
        leaving.owned = set()

        # back to full strength (a fresh member with the same index)
        t0 = time.time()
        group.start(args.members - 1)
        done = group.wait_covered(group.live(), 60)
        result["rejoin_s"] = None if done is None else round(done - t0, 2)
        result["rejoin_spread"] = spread(group.live())
        moved = 0
        if not kill:
            return result

        # 2. kill -9
        victim = group.members[0]
        before = {m.index: set(m.owned) for m in group.live()}
        t0 = time.time()
        victim.process.kill()
        victim.alive = False
        victim.process.wait(timeout=10)
        survivors = group.live()
        done = group.wait_covered(survivors, 90)
        result["kill9_s"] = None if done is None else round(done - t0, 2)
        result["after_kill_spread"] = spread(survivors)
        for m in survivors:
            moved += len(before[m.index] - m.owned)
        result["kill9_partitions_taken_from_survivors"] = moved
        victim.owned = set()

        if freeze:
            t0 = time.time()
            group.start(0)
            done = group.wait_covered(group.live(), 60)
            result["rejoin_after_kill_s"] = None if done is None else round(done - t0, 2)
            frozen = group.members[1]
            others = [m for m in group.live() if m is not frozen]
            frozen_owned = set(frozen.owned)
            t_stop = time.time()
            frozen.process.send_signal(signal.SIGSTOP)
            frozen.alive = False
            done = group.wait_covered(others, 60)
            result["sigstop_others_took_over_s"] = None if done is None else round(done - t_stop, 2)
            group.drain(max(0.0, args.freeze_s - (time.time() - t_stop)))
            t_cont = time.time()
            frozen.process.send_signal(signal.SIGCONT)
            frozen.alive = True
            seen = len(frozen.events)
            # Its first events after the resume: what told it, and when.
            deadline = time.monotonic() + 30
            first_loss = None
            while time.monotonic() < deadline and first_loss is None:
                group.drain(0.2)
                for event in frozen.events[seen:]:
                    if event["ev"] in ("lost", "revoke") and set(event["delta"]) & frozen_owned:
                        first_loss = event
                        break
            after = [
                {k: e[k] for k in ("ev", "error", "detail", "line") if k in e}
                | {"after_cont_s": round(e["t"] - t_cont, 3)}
                for e in frozen.events[seen:]
            ]
            result["sigstop_frozen_s"] = round(t_cont - t_stop, 2)
            result["sigstop_events_after_resume"] = after[:12]
            result["sigstop_lost_via"] = None if first_loss is None else first_loss["ev"]
            result["sigstop_believed_owner_after_resume_s"] = (
                None if first_loss is None else round(first_loss["t"] - t_cont, 3))
            done = group.wait_covered(group.live(), 60)
            result["sigstop_rejoined_s"] = None if done is None else round(done - t_cont, 2)
            result["sigstop_final_spread"] = spread(group.live())
    finally:
        group.stop_all()
    return result


# ----------------------------------------------------------------------------------------------
# part 2: transactional fencing


def _error(exc: BaseException) -> dict:
    if isinstance(exc, SystemError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        e = exc.args[0]
        return {"error": e.name(), "fatal": e.fatal(), "retriable": e.retriable(),
                "txn_requires_abort": e.txn_requires_abort(), "detail": e.str()[:160]}
    return {"error": type(exc).__name__, "detail": str(exc)[:160]}


def _attempt(steps: dict, name: str, call: Callable[[], object], done: str = "ok") -> None:
    """Record in `steps` what one client call of a (possibly fenced) producer did."""
    try:
        call()
        steps[name] = done
    except (KafkaException, SystemError) as exc:
        steps[name] = _error(exc)


def _flush(producer: Producer, timeout: float = 10) -> str:
    try:
        left = producer.flush(timeout)
        return f"ok ({left} left)"
    except (KafkaException, SystemError) as exc:
        # confluent-kafka raises the fatal error from flush(); a delivery callback called while it
        # is pending then surfaces as SystemError with the KafkaException as its cause.
        cause = exc.__cause__ if isinstance(exc, SystemError) and exc.__cause__ is not None else exc
        return json.dumps(_error(cause))


def _count(bootstrap: str, topic: str, isolation: str, timeout_s: float = 3.0) -> tuple[int, int]:
    """(records read, position reached) of partition 0 from the beginning within `timeout_s`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("spike-reader"),
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(100, 0.2):
            if message.error() is None:
                seen += 1
    position = consumer.position([TopicPartition(topic, 0)])[0].offset
    consumer.close()
    return seen, position


def fencing_part(bootstrap: str) -> dict:
    topic = create_topics(bootstrap, [unique_name("spike-fence")], partitions=1)[0]
    txn_id = unique_name("ksp-state-spike-0")
    base = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, "error_cb": lambda e: on_error(e)}
    result: dict = {}
    deliveries: list[str] = []

    client_errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        deliveries.append("ok" if err is None else str(err)[:160])

    def on_error(err: KafkaError) -> None:
        client_errors.append(str(err)[:200])

    # A: an open transaction with one record in it (flushed: written to the log, not committed).
    a = Producer({**base, "transactional.id": txn_id})
    t = time.monotonic()
    a.init_transactions(30)
    result["init_fresh_ms"] = round((time.monotonic() - t) * 1000, 1)
    a.begin_transaction()
    a.produce(topic, key=b"k", value=b"A-open-1", on_delivery=on_delivery)
    a.flush(10)
    result["a_first_record_delivery"] = list(deliveries)
    for isolation in ("read_uncommitted", "read_committed"):
        # librdkafka's watermark query follows the consumer's isolation.level (default
        # read_committed): the "high" offset is then the last stable offset.
        hw = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("wm"), "isolation.level": isolation})
        watermarks = hw.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        result[f"open_txn_watermarks_{isolation}"] = list(watermarks)
        hw.close()
    committed_seen, committed_pos = _count(bootstrap, topic, "read_committed", 2.0)
    result["open_txn_read_committed_seen_position"] = [committed_seen, committed_pos]

    # B: the same transactional.id -- the new owner fencing the old one.
    b = Producer({**base, "transactional.id": txn_id})
    t = time.monotonic()
    b.init_transactions(60)
    result["b_init_while_a_open_ms"] = round((time.monotonic() - t) * 1000, 1)

    # A carries on as if nothing happened.
    deliveries.clear()
    steps: dict = {}
    _attempt(steps, "produce", lambda: a.produce(topic, key=b"k", value=b"A-open-2", on_delivery=on_delivery),
             "accepted locally")
    steps["flush"] = _flush(a)
    steps["delivery_reports"] = list(deliveries)
    _attempt(steps, "commit_transaction", lambda: a.commit_transaction(10))
    steps["error_cb"] = list(client_errors)
    client_errors.clear()
    result["a_after_fenced_open_txn"] = steps

    # B writes and commits: the new owner's record.
    b.begin_transaction()
    b.produce(topic, key=b"k", value=b"B-1")
    b.commit_transaction(30)

    # The fenced-while-idle case: C takes the id from B while B has no transaction open.
    c = Producer({**base, "transactional.id": txn_id})
    t = time.monotonic()
    c.init_transactions(60)
    result["init_used_id_idle_ms"] = round((time.monotonic() - t) * 1000, 1)
    steps = {}
    deliveries.clear()
    _attempt(steps, "begin_transaction", b.begin_transaction)
    _attempt(steps, "produce", lambda: b.produce(topic, key=b"k", value=b"B-zombie", on_delivery=on_delivery),
             "accepted locally")
    steps["flush"] = _flush(b)
    steps["delivery_reports"] = list(deliveries)
    _attempt(steps, "commit_transaction", lambda: b.commit_transaction(10))
    steps["error_cb"] = list(client_errors)
    result["b_after_fenced_idle"] = steps
    c.begin_transaction()
    c.produce(topic, key=b"k", value=b"C-1")
    c.commit_transaction(30)

    result["read_committed_seen_position"] = list(_count(bootstrap, topic, "read_committed"))
    result["read_uncommitted_seen_position"] = list(_count(bootstrap, topic, "read_uncommitted"))
    values = []
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("spike-values"),
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        values += [m.value().decode() for m in reader.consume(100, 0.2) if m.error() is None]
    reader.close()
    result["read_committed_values"] = values
    for producer in (a, b, c):
        _flush(producer, 1)
    return result


# ----------------------------------------------------------------------------------------------
# part 2b: fencing by the ownership group's generation (KIP-447), one producer per instance


def _wait_assigned(consumers: Sequence[Consumer], owned: dict[int, set[int]], want: int, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        if sum(len(v) for v in owned.values()) == want and all(owned[i] for i in range(len(consumers))):
            for _ in range(10):
                for c in consumers:
                    c.poll(0.05)
            return
    raise TimeoutError("the group did not settle")


def group_fencing_part(bootstrap: str, iterations: int) -> dict:
    """send_offsets_to_transaction with the ownership group's metadata as the fence: its cost per
    transaction, what a stale member's transaction gets, and whether a transaction that passed the
    check before a rebalance still commits after it."""
    topic = create_topics(bootstrap, [unique_name("spike-447")], partitions=2)[0]
    group = unique_name("spike-447-owners")
    owned: dict[int, set[int]] = {0: set(), 1: set()}
    result: dict = {}

    def consumer(index: int) -> Consumer:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
                      "heartbeat.interval.ms": 1000, "partition.assignment.strategy": "cooperative-sticky",
                      "enable.auto.commit": False, "isolation.level": "read_committed"})

        def on_assign(_c: Consumer, parts: list[TopicPartition]) -> None:
            owned[index].update(p.partition for p in parts)

        def on_revoke(_c: Consumer, parts: list[TopicPartition]) -> None:
            owned[index].difference_update(p.partition for p in parts)

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        return c

    c1 = consumer(0)
    deadline = time.monotonic() + 30
    while len(owned[0]) < 2 and time.monotonic() < deadline:
        c1.poll(0.1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "transactional.id": unique_name("spike-447-instance")})
    producer.init_transactions(30)
    value = os.urandom(2048)

    def one(i: int, with_offsets: bool) -> None:
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=value, partition=0)
        if with_offsets:
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, i + 1)], c1.consumer_group_metadata(), 10)
        producer.commit_transaction(30)

    for with_offsets in (False, True):
        samples = []
        for i in range(20 + iterations):
            c1.poll(0)
            t = time.perf_counter()
            one(i, with_offsets)
            if i >= 20:
                samples.append((time.perf_counter() - t) * 1000)
        result["txn_with_send_offsets" if with_offsets else "txn_without_send_offsets"] = _stats(samples)

    # A transaction that passed the generation check, then a rebalance, then its commit.
    stale_metadata = c1.consumer_group_metadata()
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"zombie-passed-check", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 10_000)], stale_metadata, 10)
    c2 = consumer(1)
    _wait_assigned([c1, c2], owned, 2)
    result["rebalanced_owned"] = {k: sorted(v) for k, v in owned.items()}
    # The new owner's committed-offset read (require_stable under read_committed) while that
    # transaction is open: how long it waits.
    owner_of_0 = c1 if 0 in owned[0] else c2
    waited: dict = {}

    def read_committed_offsets() -> None:
        t = time.perf_counter()
        try:
            waited["offset"] = owner_of_0.committed([TopicPartition(topic, 0)], timeout=20)[0].offset
        except KafkaException as exc:
            waited["error"] = _error(exc)
        waited["ms"] = round((time.perf_counter() - t) * 1000, 1)

    reader = threading.Thread(target=read_committed_offsets)
    reader.start()
    time.sleep(2.0)
    try:
        producer.commit_transaction(30)
        result["commit_after_rebalance_of_txn_checked_before"] = "ok"
    except (KafkaException, SystemError) as exc:
        result["commit_after_rebalance_of_txn_checked_before"] = _error(exc)
    reader.join()
    result["new_owner_committed_read_while_txn_open"] = waited | {"commit_sent_after_ms": 2000}

    # A stale member's next transaction: the check itself.
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"zombie-stale", partition=0)
    try:
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 20_000)], stale_metadata, 10)
        result["stale_send_offsets"] = "ok"
    except (KafkaException, SystemError) as exc:
        result["stale_send_offsets"] = _error(exc)
    try:
        producer.commit_transaction(10)
        result["stale_commit"] = "ok"
    except (KafkaException, SystemError) as exc:
        result["stale_commit"] = _error(exc)
        try:
            producer.abort_transaction(10)
        except (KafkaException, SystemError):
            pass
    for c in (c1, c2):
        c.close()
    return result


# ----------------------------------------------------------------------------------------------
# part 3: latency


def _stats(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "mean_ms": round(statistics.fmean(ordered), 2),
            "max_ms": round(ordered[-1], 2)}


def _time_writes(producer: Producer, topics: Sequence[tuple[str, int]], value: bytes, iterations: int,
                 transactional: bool, flush_in_transaction: bool = False) -> dict:
    """`iterations` timed writes of one record to each (topic, partition), after 20 untimed ones."""
    samples = []
    for i in range(20 + iterations):
        t = time.perf_counter()
        if transactional:
            producer.begin_transaction()
        for topic, partition in topics:
            producer.produce(topic, key=b"k%d" % (i % 50), value=value, partition=partition)
        if transactional:
            if flush_in_transaction:
                producer.flush(10)
            producer.commit_transaction(30)
        else:
            producer.flush(10)
        if i >= 20:
            samples.append((time.perf_counter() - t) * 1000)
    return _stats(samples)


def latency_part(bootstrap: str, iterations: int, record_bytes: int) -> dict:
    compacted = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
    one = create_topics(bootstrap, [unique_name("spike-lat")], partitions=1, config=compacted)[0]
    eight = create_topics(bootstrap, [unique_name("spike-lat8")], partitions=8, config=compacted)[0]
    value = os.urandom(record_bytes)
    result: dict = {}
    single = [(one, 0)]
    spread8 = [(eight, p) for p in range(8)]
    for linger in (1, 0):
        base = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger, "compression.type": "lz4"}
        idem = Producer({**base, "enable.idempotence": True})
        result[f"idempotent_produce_flush_linger{linger}"] = _time_writes(idem, single, value, iterations, False)
        txn = Producer({**base, "transactional.id": unique_name("spike-lat-txn")})
        txn.init_transactions(30)
        result[f"transactional_begin_produce_commit_linger{linger}"] = _time_writes(
            txn, single, value, iterations, True)
        # flush() before commit_transaction (the commit flushes anyway)
        result[f"transactional_flush_then_commit_linger{linger}"] = _time_writes(
            txn, single, value, min(iterations, 200), True, flush_in_transaction=True)
        if linger == 0:
            result["idempotent_8_partitions_flush_linger0"] = _time_writes(idem, spread8, value, iterations, False)
            result["transactional_8_partitions_one_txn_linger0"] = _time_writes(
                txn, spread8, value, iterations, True)
        idem.flush(10)
        txn.flush(10)

    # init_transactions: the fencing a new owner pays per state-topic partition it gains.
    base = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0}
    inits = []
    for _ in range(10):
        tid = unique_name("spike-init")
        p = Producer({**base, "transactional.id": tid})
        t = time.perf_counter()
        p.init_transactions(30)
        fresh = (time.perf_counter() - t) * 1000
        q = Producer({**base, "transactional.id": tid})
        t = time.perf_counter()
        q.init_transactions(30)
        inits.append((fresh, (time.perf_counter() - t) * 1000))
    result["init_transactions_fresh"] = _stats([f for f, _ in inits])
    result["init_transactions_takeover_idle"] = _stats([u for _, u in inits])
    return result


# ----------------------------------------------------------------------------------------------
# part 4: what a transactional producer per owned state partition costs one process


def _threads_and_rss() -> tuple[int, int]:
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return threads, rss_kb


def producers_part(bootstrap: str, count: int) -> dict:
    """Threads and resident memory of this process before and after `count` transactional producers
    (each ``init_transactions``-ed, one record committed), and the total time of their inits."""
    topic = create_topics(bootstrap, [unique_name("spike-lanes")], partitions=count)[0]
    before = _threads_and_rss()
    producers = []
    t = time.perf_counter()
    for p in range(count):
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                             "compression.type": "lz4", "transactional.id": unique_name(f"spike-lane-{p}")})
        producer.init_transactions(30)
        producers.append(producer)
    inits_ms = (time.perf_counter() - t) * 1000
    for p, producer in enumerate(producers):
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=b"v" * 2048, partition=p)
        producer.commit_transaction(30)
    after = _threads_and_rss()
    for producer in producers:
        producer.flush(5)
    return {"producers": count, "threads_before": before[0], "threads_after": after[0],
            "threads_per_producer": round((after[0] - before[0]) / count, 1),
            "rss_kb_before": before[1], "rss_kb_after": after[1],
            "rss_kb_per_producer": round((after[1] - before[1]) / count), "sequential_inits_ms": round(inits_ms)}


# ----------------------------------------------------------------------------------------------


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--freeze-s", type=float, default=10.0)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--record-bytes", type=int, default=2048)
    parser.add_argument("--parts", default="ownership,fencing,group-fencing,latency,producers")
    parser.add_argument("--json")
    # child mode
    parser.add_argument("--member", type=int)
    parser.add_argument("--bootstrap")
    parser.add_argument("--group")
    parser.add_argument("--topic")
    parser.add_argument("--assignor", default="range,roundrobin")
    parser.add_argument("--static", action="store_true")
    args = parser.parse_args(argv)
    if args.member is not None:
        return member_main(args)

    parts = set(args.parts.split(","))
    out: dict = {"command": " ".join(sys.argv), "uptime_before": load(), "kafka": args.kafka_version}
    print(f"# scale_spike: Kafka {args.kafka_version}; {out['uptime_before']}", flush=True)
    with LocalKafka(version=args.kafka_version, share_groups=False) as kafka:
        bootstrap = kafka.bootstrap
        if "ownership" in parts:
            out["ownership"] = []
            for assignor, static, freeze, kill in (("range,roundrobin", False, False, True),
                                                   ("cooperative-sticky", False, True, True),
                                                   ("cooperative-sticky", True, False, True),
                                                   # the broker's 45 s session timeout: no kill here
                                                   ("consumer-protocol", False, False, False)):
                result = ownership_part(bootstrap, args, assignor, static, freeze, kill)
                out["ownership"].append(result)
                print(json.dumps(result, indent=1), flush=True)
        if "fencing" in parts:
            out["fencing"] = fencing_part(bootstrap)
            print(json.dumps(out["fencing"], indent=1), flush=True)
        if "group-fencing" in parts:
            out["group_fencing"] = group_fencing_part(bootstrap, min(args.iterations, 200))
            print(json.dumps(out["group_fencing"], indent=1), flush=True)
        if "producers" in parts:
            out["producers"] = producers_part(bootstrap, 12)
            print(json.dumps(out["producers"], indent=1), flush=True)
        if "latency" in parts:
            out["latency"] = latency_part(bootstrap, args.iterations, args.record_bytes)
            print(json.dumps(out["latency"], indent=1), flush=True)
    out["uptime_after"] = load()
    print(f"# done; {out['uptime_after']}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
