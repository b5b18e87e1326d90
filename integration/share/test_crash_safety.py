"""Crash safety: `kill -9` of the proxy in the middle of a share-group run loses no acknowledgement.

Three confluent_kafka.ShareConsumer members (explicit acknowledgement, commit_sync after every
poll) consume 50,000 records on two partitions through the proxy. A record counts as *confirmed*
only when the acknowledgement-commit callback reported success for it. After 20,000 records the
proxy is SIGKILLed and started again with the same state topic and the same ports, so the clients
reconnect to it. The run must complete, and:

* every produced record was accepted at least once: an acceptance was sent for it, and the
  durable state (read back from the state topic) has moved every partition's SPSO to its end;
* no record whose acceptance was confirmed before the kill is delivered again afterwards (the
  proxy answers an acknowledgement only once the share-partition snapshot is durable).

Two outcomes of the kill are legitimate and reported, not failed: records acquired but not yet
acknowledged come back after the restart (acquisition is never durable, by design), and an
acceptance in flight at the kill may have been made durable without its answer reaching the
client (the client sees a transport error; the record is finished and not delivered again).
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from dataclasses import dataclass

import pytest

from integration.share.conftest import AcknowledgingConsumer, durable_state, finished_durably, produce, wait_until
from proxy.localkafka.broker import free_port

pytestmark = pytest.mark.integration

RECORDS = 50_000
PARTITIONS = 2
CONSUMERS = 3
KILL_AFTER_ACCEPTED = 20_000
# Work per poll: keeps the run long enough that the kill lands in the middle, not at the end.
PROCESSING_S = 0.002
COMPLETION_TIMEOUT_S = 60.0
# Reconnect quickly to the restarted proxy.
RECONNECT_QUICKLY = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}


@dataclass(frozen=True, slots=True)
class Delivery:
    partition: int
    offset: int
    delivery_count: int
    after_kill: bool  # poll() returned it once the kill had started


class CrashRun:
    """What every consumer saw, and the moment the proxy was killed (shared by the threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.killed_at = float("inf")  # time.monotonic() of the kill, once it happened
        self.deliveries: list[Delivery] = []
        self.accepted: set[tuple[int, int]] = set()
        self.accepted_before_kill: set[tuple[int, int]] = set()
        # Acknowledgements the proxy did not confirm: (partition, offset) -> (error, sent after the kill).
        self.unconfirmed: dict[tuple[int, int], tuple[str, bool]] = {}

    def kill_starts(self) -> None:
        self.killed_at = time.monotonic()

    def on_delivery(self, message, polled_at: float) -> None:
        delivery = Delivery(message.partition(), message.offset(), message.delivery_count(),
                            after_kill=polled_at >= self.killed_at)
        with self.lock:
            self.deliveries.append(delivery)

    def on_acknowledged(self, offsets, error, sent_at: float) -> None:
        # Decide "before the kill" after the confirmation arrived: a confirmation seen while the
        # kill has not started was answered by the first proxy process before it died.
        before_kill = time.monotonic() < self.killed_at
        records = {(tp.partition, offset) for tp, batch in offsets.items() for offset in batch}
        with self.lock:
            if error is not None:
                for record in records:
                    self.unconfirmed[record] = (str(error), sent_at >= self.killed_at)
                return
            self.accepted |= records
            if before_kill:
                self.accepted_before_kill |= records

    def acknowledged(self) -> set[tuple[int, int]]:
        """Records with an acceptance sent, confirmed or not."""
        with self.lock:
            return self.accepted | self.unconfirmed.keys()


def _ranges(offsets: set[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(partition, first, last) runs of a set of (partition, offset)."""
    runs: list[tuple[int, int, int]] = []
    for partition, offset in sorted(offsets):
        if runs and runs[-1][0] == partition and runs[-1][2] + 1 == offset:
            runs[-1] = (partition, runs[-1][1], offset)
        else:
            runs.append((partition, offset, offset))
    return runs


def test_kill_9_mid_run_loses_no_acknowledgement(kafka, share_proxy, create_topic, names, record_property):
    listen_port = free_port()
    # The proxy serves broker N on BASE+N: fixed ports so clients find the restarted proxy again.
    broker_port_base = free_port() - kafka.broker_id
    proxy = share_proxy("--listen", f"127.0.0.1:{listen_port}", "--broker-port-base", str(broker_port_base))
    topic = create_topic(names.topic, partitions=PARTITIONS)
    values = produce(kafka.bootstrap, topic, RECORDS, partitions=PARTITIONS, batch_records=250)
    # produce() spreads the values round-robin over the partitions, in order within each one.
    ends = {partition: len(values[partition::PARTITIONS]) for partition in range(PARTITIONS)}
    produced = {(partition, offset) for partition, end in ends.items() for offset in range(end)}

    run = CrashRun()
    consumers = [AcknowledgingConsumer(proxy.bootstrap, names.group, topic, name=f"consumer-{i}",
                                       on_delivery=run.on_delivery, on_acknowledged=run.on_acknowledged,
                                       processing_s=PROCESSING_S, config=RECONNECT_QUICKLY)
                 for i in range(CONSUMERS)]
    started = time.monotonic()
    for consumer in consumers:
        consumer.start()

    def all_finished_durably() -> bool:
        # Every record has an acceptance sent, and the durable state has moved SPSO past all of them.
        if not produced <= run.acknowledged():
            return False
        return finished_durably(kafka.bootstrap, proxy.state_topic, names.group, ends)

    try:
        wait_until(lambda: len(run.acknowledged()) >= KILL_AFTER_ACCEPTED, 60,
                   f"{KILL_AFTER_ACCEPTED} accepted records before the kill", interval=0.005)
        run.kill_starts()
        proxy.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        proxy.start()
        restarted_in = time.monotonic() - killed_at
        try:
            wait_until(all_finished_durably, COMPLETION_TIMEOUT_S, "every record accepted durably", interval=0.5)
        except AssertionError:
            print(f"\nstalled: {len(run.accepted)} confirmed and {len(run.unconfirmed)} unconfirmed "
                  f"acceptances of {len(produced)} records; never acknowledged: "
                  f"{_ranges(produced - run.acknowledged())}; client errors {[e for c in consumers for e in c.errors][:5]}\n"
                  f"state topic: {durable_state(kafka.bootstrap, proxy.state_topic, names.group)}\n"
                  f"restarted proxy log:\n{proxy.log_tail()}")
            raise
        time.sleep(1.0)  # a late redelivery would show up here
    finally:
        for consumer in consumers:
            consumer.finish()
    elapsed = time.monotonic() - started

    per_record = collections.Counter((d.partition, d.offset) for d in run.deliveries)
    before_kill = collections.Counter((d.partition, d.offset) for d in run.deliveries if not d.after_kill)
    delivered_after_kill = {(d.partition, d.offset) for d in run.deliveries if d.after_kill}
    confirmed_then_redelivered = delivered_after_kill & run.accepted_before_kill
    # Acceptances in flight at the kill: the proxy may have made them durable without answering.
    # Those records are finished (SPSO passed them) yet were never confirmed to a client.
    finished_unconfirmed = produced - run.accepted
    unconfirmed_errors = collections.Counter(error for error, _ in run.unconfirmed.values())
    counts = {
        "produced": len(produced),
        "accepted": len(produced & run.acknowledged()),
        "accepted_confirmed": len(run.accepted),
        "accepted_confirmed_before_kill": len(run.accepted_before_kill),
        "accepted_unconfirmed_but_durable": len(finished_unconfirmed),
        "deliveries": len(run.deliveries),
        "redelivered_after_restart": len(delivered_after_kill & before_kill.keys()),
        "confirmed_then_redelivered": len(confirmed_then_redelivered),
        "duplicates": sum(n - 1 for n in per_record.values()),
        "duplicates_before_kill": sum(n - 1 for n in before_kill.values()),
        "unconfirmed_acks": len(run.unconfirmed),
        "restart_s": round(restarted_in, 2),
        "run_s": round(elapsed, 1),
    }
    record_property("crash_counts", counts)
    print(f"\ncrash-safety counts (Kafka {kafka.version}): {counts}")
    print(f"unconfirmed acknowledgement errors: {dict(unconfirmed_errors)}")
    client_errors = [error for consumer in consumers for error in consumer.errors]
    if client_errors:
        print(f"client errors ({len(client_errors)}), first: {client_errors[:3]}")

    assert produced <= run.acknowledged(), f"never accepted: {_ranges(produced - run.acknowledged())}"
    assert confirmed_then_redelivered == set(), (
        f"{len(confirmed_then_redelivered)} records confirmed before the kill were delivered again: "
        f"{_ranges(confirmed_then_redelivered)}"
    )
    # A record finished without a confirmation must have had its acceptance in flight at the kill,
    # and never been delivered again; one sent to the restarted proxy is always answered.
    late = {r for r in finished_unconfirmed if run.unconfirmed[r][1]}
    assert late == set(), f"acceptances sent after the restart, durable but answered with errors: {_ranges(late)}"
    assert finished_unconfirmed & delivered_after_kill == set()
    # Before the kill nobody failed, so each record went to exactly one consumer once.
    assert counts["duplicates_before_kill"] == 0
    assert len(run.accepted_before_kill) >= KILL_AFTER_ACCEPTED - 1_000
    # The restarted proxy really served the rest of the run.
    assert len(run.accepted - run.accepted_before_kill) > 0
