"""State writes that fail: the broker is frozen longer than the state producer's delivery timeout.

The module runs its own single-node broker (same version as the session one) because it freezes
that broker's JVM with SIGSTOP and resumes it with SIGCONT; the session broker is never touched.
A frozen broker keeps its sockets open and answers nothing, so the proxy's state writes do not
fail fast: each one fails when the state producer's delivery timeout runs out
(`--state-write-timeout-ms 3000` here, 30 s by default).

* `test_failed_state_write_rolls_back_and_the_same_retry_succeeds`: the protocol, exactly. A hand-made
  member acquires records, the broker freezes, its ShareAcknowledge(ACCEPT) is answered
  KAFKA_STORAGE_ERROR after about the write timeout, `ksp_share_state_writable` reads 0, and a
  second member's ShareFetch while frozen (served from the proxy's read cache) gets other records,
  never the rolled-back ones. After SIGCONT the second member still cannot get them, the first
  member's retry of the same acknowledgement is answered NONE, and the state topic, read back,
  has every record finished.
* `test_share_consumers_through_a_frozen_broker_lose_no_acknowledgement`: confluent_kafka share
  consumers (explicit acknowledgement) run through a freeze longer than the write timeout: no
  acceptance is confirmed while the broker is frozen, every record ends accepted durably, no record
  whose acceptance was confirmed is delivered again, and the writable gauge goes 1 -> 0 -> 1.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from kio.schema.errors import ErrorCode

from integration.kafka_fixtures import create_topic, kafka_version
from integration.share.conftest import (
    ACK_ACCEPT,
    AcknowledgingConsumer,
    Names,
    ProxyStarter,
    WireMember,
    acquired_offsets,
    durable_state,
    finished_durably,
    metric,
    only_partition,
    produce,
    scrape_metrics,
    wait_until,
)
from proxy.localkafka import LocalKafka
from proxy.localkafka.broker import free_port
from proxy.share.states import TERMINAL_STATES

pytestmark = pytest.mark.integration

WRITE_TIMEOUT_MS = 3_000
WRITE_TIMEOUT_S = WRITE_TIMEOUT_MS / 1000
WRITABLE = "ksp_share_state_writable"
ROLLED_BACK = "ksp_share_acknowledgements_rolled_back_total"


# ----- the module's own broker, frozen and resumed -------------------------------------------


@dataclass(eq=False)
class FreezableBroker:
    """A LocalKafka whose JVM the tests stop (SIGSTOP) and resume (SIGCONT)."""

    kafka: LocalKafka
    frozen: bool = False

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    def _state(self) -> str:
        # /proc/PID/stat: "pid (comm) state ..."; comm may hold spaces, so split after the ')'.
        return Path(f"/proc/{self.kafka.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def freeze(self) -> float:
        """SIGSTOP the JVM and wait until the kernel reports it stopped; returns when (monotonic)."""
        os.kill(self.kafka.pid, signal.SIGSTOP)
        self.frozen = True
        wait_until(lambda: self._state() == "T", 5, "the broker JVM to stop", interval=0.01)
        return time.monotonic()

    def thaw(self) -> float:
        """SIGCONT the JVM (harmless when it is not stopped); returns when (monotonic)."""
        if self.frozen:
            os.kill(self.kafka.pid, signal.SIGCONT)
            self.frozen = False
            wait_until(lambda: self._state() != "T", 5, "the broker JVM to run again", interval=0.01)
        return time.monotonic()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreezableBroker]:
    kafka = LocalKafka(version=kafka_version(), share_groups=False, data_dir=tmp_path_factory.mktemp("frozen-kafka"))
    kafka.start()
    freezable = FreezableBroker(kafka)
    try:
        yield freezable
    finally:
        freezable.thaw()
        kafka.stop()


@pytest.fixture
def proxies(broker: FreezableBroker, tmp_path: Path) -> Iterator[ProxyStarter]:
    starter = ProxyStarter(broker.bootstrap, tmp_path)
    try:
        yield starter
    finally:
        broker.thaw()  # a failed test may have left it frozen; the proxies flush state on SIGTERM
        starter.stop_all()


def _ranges(offsets: set[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if runs and runs[-1][1] + 1 == offset:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


# ----- 1. the protocol, exactly --------------------------------------------------------------

BATCHES = 3
BATCH_RECORDS = 10
# Answered after one write timeout; allow a write already in flight at the freeze, its backoff,
# and librdkafka's once-a-second timeout scan.
LATEST_FAILURE_S = 2 * WRITE_TIMEOUT_S + 5


async def test_failed_state_write_rolls_back_and_the_same_retry_succeeds(broker, proxies, names: Names,
                                                                         record_property):
    topic = await trio.to_thread.run_sync(create_topic, broker.bootstrap, names.topic, 1)
    for batch in range(BATCHES):  # one producer flush per batch: three batches of exactly ten records
        await trio.to_thread.run_sync(lambda b=batch: produce(broker.bootstrap, topic, BATCH_RECORDS,
                                                              start=b * BATCH_RECORDS))
    metrics_port = free_port()
    # The default 30 s lock outlasts the whole test: nothing is released by expiry here.
    proxy = proxies("--state-write-timeout-ms", str(WRITE_TIMEOUT_MS), "--metrics-port", str(metrics_port))

    async def scrape():
        return await trio.to_thread.run_sync(scrape_metrics, metrics_port)

    first = await WireMember(proxy.bootstrap, names.group).connect()
    second = await WireMember(proxy.bootstrap, names.group).connect()
    seen: dict[str, object] = {}
    try:
        async with trio.open_nursery() as nursery:
            topic_id = await first.join(topic)
            await second.join(topic)
            nursery.start_soon(first.keep_alive)
            nursery.start_soon(second.keep_alive)

            opened = await first.fetch(topic_id, max_records=BATCH_RECORDS)
            held = acquired_offsets(opened)
            assert opened.error_code == ErrorCode.none and held == set(range(BATCH_RECORDS)), opened
            await trio.sleep(1.0)  # group and initialisation records written: the writer is idle
            before = await scrape()
            assert metric(before, WRITABLE) == 1.0

            await trio.to_thread.run_sync(broker.freeze)
            try:
                started = trio.current_time()
                failed = await first.acknowledge(topic_id, [(0, BATCH_RECORDS - 1, ACK_ACCEPT)])
                seen["failed_after_s"] = round(trio.current_time() - started, 2)
                seen["failed"] = (failed.error_code, only_partition(failed).error_code,
                                  only_partition(failed).error_message)
                during = await scrape()
                seen["writable_while_frozen"] = metric(during, WRITABLE)
                seen["rolled_back"] = metric(during, ROLLED_BACK)
                # The second member opens its session while the broker is frozen: the proxy serves it
                # from the batches the first read brought in, so whatever is acquirable is handed out.
                with trio.move_on_after(10):
                    frozen_fetch = await second.fetch(topic_id, max_records=BATCH_RECORDS)
                    seen["second_while_frozen"] = (frozen_fetch.error_code, acquired_offsets(frozen_fetch))
            finally:
                await trio.to_thread.run_sync(broker.thaw)
            # (Checked here: a request left unanswered would garble the connection's next answer.)
            assert "second_while_frozen" in seen, "a ShareFetch during the freeze was not answered within 10 s"

            # The broker answers again; the rolled-back records are still the first member's.
            thawed_fetch = await second.fetch(topic_id, max_records=BATCH_RECORDS)
            seen["second_after_thaw"] = (thawed_fetch.error_code, acquired_offsets(thawed_fetch))
            # The failed write is retried with the rolled-back state: once a write succeeds again
            # the state topic must not hold the refused acceptance as done.
            with trio.fail_after(30):
                while metric(await scrape(), WRITABLE) != 1.0:
                    await trio.sleep(0.1)
            rebuilt = await trio.to_thread.run_sync(durable_state, broker.bootstrap, proxy.state_topic, names.group)
            seen["durable_before_retry"] = rebuilt.get(0)
            started = trio.current_time()
            retried = await first.acknowledge(topic_id, [(0, BATCH_RECORDS - 1, ACK_ACCEPT)])
            seen["retry_after_s"] = round(trio.current_time() - started, 2)
            seen["retried"] = (retried.error_code, only_partition(retried).error_code)
            after = await scrape()
            seen["writable_after"] = metric(after, WRITABLE)

            second_held = acquired_offsets(frozen_fetch) | acquired_offsets(thawed_fetch)
            accepted = await second.acknowledge(topic_id, [(lo, hi, ACK_ACCEPT) for lo, hi in _ranges(second_held)])
            seen["second_accepted"] = (accepted.error_code, only_partition(accepted).error_code)
            nursery.cancel_scope.cancel()
    finally:
        await first.aclose()
        await second.aclose()
    print(f"\nstate-write failure, crafted (Kafka {broker.kafka.version}): {seen}")
    record_property("crafted_answers", {k: str(v) for k, v in seen.items()})

    # The acknowledgement was refused (retriably) once the write timed out, not before.
    assert seen["failed"][:2] == (ErrorCode.none, ErrorCode.kafka_storage_error), seen["failed"]
    assert 0.9 * WRITE_TIMEOUT_S <= seen["failed_after_s"] <= LATEST_FAILURE_S, seen["failed_after_s"]
    assert seen["writable_while_frozen"] == 0.0
    assert seen["rolled_back"] is not None and seen["rolled_back"] >= 1
    # While frozen, another member is served, but not the rolled-back records (they are Acquired
    # by the first member again, under their lock); nor once the broker is back.
    code, offsets = seen["second_while_frozen"]
    assert code == ErrorCode.none and offsets, f"nothing acquired while frozen: {seen['second_while_frozen']}"
    assert not offsets & held, f"rolled-back records handed to another member: {sorted(offsets & held)}"
    code, offsets = seen["second_after_thaw"]
    assert code == ErrorCode.none and not offsets & held, seen["second_after_thaw"]
    # Rolled back, not committed: before the retry the state topic has the SPSO at 0 and none of
    # the refused records finished.
    snapshot = seen["durable_before_retry"]
    assert snapshot is not None and snapshot.start_offset == 0, snapshot
    assert not [b for b in snapshot.state_batches
                if b.delivery_state in TERMINAL_STATES and b.first_offset <= max(held)], snapshot
    # The same member's retry of the same acknowledgement succeeds.
    assert seen["retried"] == (ErrorCode.none, ErrorCode.none)
    assert seen["writable_after"] == 1.0
    assert seen["second_accepted"] == (ErrorCode.none, ErrorCode.none)
    # Durable: the state topic, read back as a restart would, has every record finished.
    ends = {0: BATCHES * BATCH_RECORDS}
    try:
        wait_until(lambda: finished_durably(broker.bootstrap, proxy.state_topic, names.group, ends), 20,
                   "every record finished in the state topic", interval=0.5)
    except AssertionError:
        print(f"durable state: {durable_state(broker.bootstrap, proxy.state_topic, names.group)}")
        raise


# ----- 2. share consumers through a freeze ---------------------------------------------------

RECORDS = 3_000
PARTITIONS = 2
CONSUMERS = 3
FREEZE_AFTER_ACCEPTED = 1_000
# Frozen until two state writes have failed: the second one carried every acknowledgement that
# reached the proxy before the first one failed (the held one among them), so those fail too.
FAILED_WRITES_WHILE_FROZEN = 2
MAX_FREEZE_S = 30.0
LOCK_MS = 8_000  # records whose failed acceptance is not retried come back this soon
# A confirmation answered just before SIGSTOP may reach the client a moment after it.
IN_FLIGHT_MARGIN_S = 1.0
CONSUMER_CONFIG = {"max.poll.records": 100}


@dataclass(frozen=True, slots=True)
class Confirmation:
    records: frozenset[tuple[int, int]]
    error: str | None
    sent_at: float
    confirmed_at: float


@dataclass(eq=False)
class FreezeRun:
    """What the consumers saw (shared by their threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    deliveries: list[tuple[tuple[int, int], int, float]] = field(default_factory=list)
    confirmations: list[Confirmation] = field(default_factory=list)
    accepted: dict[tuple[int, int], float] = field(default_factory=dict)  # confirmed -> when
    failed: set[tuple[int, int]] = field(default_factory=set)  # an acceptance answered with an error
    redelivered_after_confirmation: list[tuple[tuple[int, int], float, float]] = field(default_factory=list)

    def on_delivery(self, message, polled_at: float) -> None:
        record = (message.partition(), message.offset())
        with self.lock:
            self.deliveries.append((record, message.delivery_count(), polled_at))
            if record in self.accepted:
                self.redelivered_after_confirmation.append((record, self.accepted[record], polled_at))

    def on_acknowledged(self, offsets, error, sent_at: float) -> None:
        now = time.monotonic()
        records = frozenset((tp.partition, offset) for tp, batch in offsets.items() for offset in batch)
        with self.lock:
            self.confirmations.append(Confirmation(records, None if error is None else str(error), sent_at, now))
            if error is not None:
                self.failed |= records
            else:
                for record in records:
                    self.accepted.setdefault(record, now)

    def acknowledged(self) -> set[tuple[int, int]]:
        with self.lock:
            return set(self.accepted) | self.failed


class HoldUntilFrozen:
    """`before_acknowledge` hook: once armed, keep the next polled records until the broker is
    frozen, so their acknowledgement goes out while it is."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.frozen = threading.Event()

    def __call__(self, messages) -> None:
        if self.armed.is_set() and not self.holding.is_set():
            self.holding.set()
            self.frozen.wait(30)


def test_share_consumers_through_a_frozen_broker_lose_no_acknowledgement(broker, proxies, names: Names,
                                                                          record_property):
    topic = create_topic(broker.bootstrap, names.topic, PARTITIONS)
    values = produce(broker.bootstrap, topic, RECORDS, partitions=PARTITIONS, batch_records=50)
    ends = {p: len(values[p::PARTITIONS]) for p in range(PARTITIONS)}
    produced = {(p, offset) for p, end in ends.items() for offset in range(end)}
    metrics_port = free_port()
    proxy = proxies("--state-write-timeout-ms", str(WRITE_TIMEOUT_MS), "--metrics-port", str(metrics_port),
                    "--share-min-record-lock-duration-ms", "1000",
                    "--share-record-lock-duration-ms", str(LOCK_MS))
    # Nothing has been written yet and nothing has failed: the state topic counts as writable.
    writable_at_start = metric(scrape_metrics(metrics_port), WRITABLE)
    run = FreezeRun()
    holder = HoldUntilFrozen()
    consumers = [AcknowledgingConsumer(proxy.bootstrap, names.group, topic, name=f"consumer-{i}",
                                       on_delivery=run.on_delivery, on_acknowledged=run.on_acknowledged,
                                       processing_s=0.02, before_acknowledge=holder if i == 0 else None,
                                       config=CONSUMER_CONFIG)
                 for i in range(CONSUMERS)]
    gauge: list[tuple[float, float | None]] = []  # (seconds after the freeze, ksp_share_state_writable)

    def writable() -> float | None:
        return metric(scrape_metrics(metrics_port), WRITABLE)

    def failed_writes() -> float:
        return metric(scrape_metrics(metrics_port), "ksp_share_state_writes_total", outcome="failed") or 0.0

    started = time.monotonic()
    for consumer in consumers:
        consumer.start()
    try:
        wait_until(lambda: len(run.accepted) >= FREEZE_AFTER_ACCEPTED, 60,
                   lambda: f"{FREEZE_AFTER_ACCEPTED} confirmed acceptances (have {len(run.accepted)}, "
                           f"client errors {[e for c in consumers for e in c.errors][:3]})", interval=0.01)
        writable_before = writable()
        holder.armed.set()
        wait_until(holder.holding.is_set, 20, "the holding consumer to poll records it keeps")
        failed_before_freeze = failed_writes()
        frozen_at = broker.freeze()
        try:
            holder.frozen.set()  # the held records are acknowledged now, while the broker is frozen
            accepted_at_freeze = len(run.accepted)
            while time.monotonic() - frozen_at < MAX_FREEZE_S:
                # The failure count is read before the gauge: a write and the one in flight behind it
                # fail together, so a gauge read first could show 1 just before both failures and the
                # loop would end without a sample of the 0 that followed them.
                failed_so_far = failed_writes() - failed_before_freeze
                gauge.append((round(time.monotonic() - frozen_at, 2), writable()))
                if failed_so_far >= FAILED_WRITES_WHILE_FROZEN:
                    break
                time.sleep(0.25)
            failed_while_frozen = failed_writes() - failed_before_freeze
        finally:
            thawed_at = broker.thaw()
        wait_until(lambda: writable() == 1.0, 30, "ksp_share_state_writable back at 1")

        def all_finished_durably() -> bool:
            return produced <= run.acknowledged() and finished_durably(broker.bootstrap, proxy.state_topic,
                                                                       names.group, ends)

        try:
            wait_until(all_finished_durably, 60, "every record accepted durably", interval=0.5)
        except AssertionError:
            print(f"\nstalled: {len(run.accepted)} confirmed, {len(run.failed)} failed of {len(produced)}; "
                  f"client errors {[e for c in consumers for e in c.errors][:5]}\nproxy log:\n{proxy.log_tail()}")
            raise
        time.sleep(1.0)  # a late redelivery would show up here
        final = scrape_metrics(metrics_port)
    finally:
        holder.frozen.set()
        for consumer in consumers:
            consumer.finish()
    elapsed = time.monotonic() - started

    frozen_window = (frozen_at + IN_FLIGHT_MARGIN_S, thawed_at)
    confirmed_while_frozen = [c for c in run.confirmations
                              if c.error is None and frozen_window[0] <= c.confirmed_at < frozen_window[1]]
    sent_while_frozen = [c for c in run.confirmations if frozen_at <= c.sent_at < thawed_at]
    per_record = collections.Counter(record for record, _, _ in run.deliveries)
    # A failed acceptance followed by a successful one with no delivery in between: a retry.
    retried_ok = set()
    for record in run.failed & set(run.accepted):
        failures = [c.confirmed_at for c in run.confirmations if c.error is not None and record in c.records]
        deliveries = [at for r, _, at in run.deliveries if r == record]
        if not any(min(failures) <= at <= run.accepted[record] for at in deliveries):
            retried_ok.add(record)
    counts = {
        "produced": len(produced),
        "accepted_confirmed": len(run.accepted),
        "accepted_confirmed_before_freeze": accepted_at_freeze,
        "acceptances_failed": len(run.failed),
        "failed_then_retried_ok_without_redelivery": len(retried_ok),
        "acks_sent_while_frozen": len(sent_while_frozen),
        "deliveries": len(run.deliveries),
        "duplicates": sum(n - 1 for n in per_record.values()),
        "max_delivery_count": max(count for _, count, _ in run.deliveries),
        "frozen_s": round(thawed_at - frozen_at, 1),
        "state_writes_failed_while_frozen": failed_while_frozen,
        "ack_errors_answered_while_frozen": sum(1 for c in run.confirmations
                                                if c.error is not None and c.confirmed_at < thawed_at
                                                and c.confirmed_at >= frozen_at),
        "rolled_back": metric(final, ROLLED_BACK),
        "state_writes_failed": metric(final, "ksp_share_state_writes_total", outcome="failed"),
        "run_s": round(elapsed, 1),
    }
    record_property("freeze_counts", counts)
    print(f"\nstate-write failure, share consumers (Kafka {broker.kafka.version}): {counts}")
    print(f"writable gauge during the freeze (s after SIGSTOP, value): {gauge}")
    print("acknowledgement errors: "
          f"{dict(collections.Counter(c.error for c in run.confirmations if c.error is not None))}")
    client_errors = [error for consumer in consumers for error in consumer.errors]
    if client_errors:
        print(f"client errors ({len(client_errors)}), first: {client_errors[:3]}")

    # Nothing can become durable while the broker is frozen, so nothing may be confirmed then.
    assert confirmed_while_frozen == [], f"acceptances confirmed while frozen: {confirmed_while_frozen[:3]}"
    assert run.redelivered_after_confirmation == [], (
        f"{len(run.redelivered_after_confirmation)} records delivered again after their acceptance was confirmed: "
        f"{run.redelivered_after_confirmation[:5]}")
    assert produced <= run.acknowledged()
    # The freeze really failed writes and rolled acknowledgements back, and the client was told.
    assert failed_while_frozen >= FAILED_WRITES_WHILE_FROZEN, f"{failed_while_frozen} writes failed while frozen"
    assert writable_at_start == 1.0
    assert writable_before == 1.0
    assert any(value == 0.0 for _, value in gauge), gauge
    assert counts["rolled_back"] is not None and counts["rolled_back"] >= 1
    assert any(c.error is not None and "KAFKA_STORAGE_ERROR" in c.error for c in sent_while_frozen), (
        "no acknowledgement sent while frozen failed with KAFKA_STORAGE_ERROR")
    # The run straddled the freeze.
    assert accepted_at_freeze < len(produced) and len(run.accepted) > accepted_at_freeze
