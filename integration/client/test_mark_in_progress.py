"""ShareConsumer.mark_in_progress end to end: the proxy's MarkInProgress keeps a slow worker's records.

Record locks of 1 s (group config), a staleness threshold of 3 s: a worker that spends three lock
durations per record keeps its records while it marks progress, and loses them to lock expiry
when it does not; a worker that stops marking loses them after the staleness threshold.
"""

from __future__ import annotations

import threading
import time

import pytest

import client
from client import KafkaException
from integration.client.conftest import EXPLICIT, consumer, poll_until, set_group_configs
from integration.share.conftest import finished_durably, produce, wait_until

pytestmark = pytest.mark.integration

LOCK_MS = 1000
STALENESS_MS = 3000
MARK_EVERY_S = 0.4


@pytest.fixture(scope="module")
def proxy(module_share_proxy):
    return module_share_proxy("--share-min-record-lock-duration-ms", "1000")


@pytest.fixture
def group(proxy, names) -> str:
    set_group_configs(proxy.bootstrap, names.group, {
        "share.record.lock.duration.ms": str(LOCK_MS),
        "share.in.progress.staleness.threshold.ms": str(STALENESS_MS),
    })
    return names.group


class Bystander(threading.Thread):
    """Another member of the group, polling and accepting whatever it gets, until stopped."""

    def __init__(self, proxy, group: str, topic: str) -> None:
        super().__init__(name="bystander", daemon=True)
        self.share = consumer(proxy, group, topic)
        self.received: list[tuple[int, int, float]] = []  # (offset, delivery count, when)
        self.errors: list[str] = []
        self._stop_requested = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                for message in self.share.poll(0.2):
                    self.received.append((message.offset(), message.delivery_count(), time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - reported through `errors`
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self.share.close()

    def finish(self) -> None:
        self._stop_requested.set()
        self.join(30)


def work_slowly(share: client.ShareConsumer, messages, *, mark: bool, per_record_s: float,
                after_first=lambda: None, commits: list | None = None) -> list[dict]:
    """Work on ``messages`` one after the other, ``per_record_s`` each; with ``mark``, signal
    progress on every record still to finish every MARK_EVERY_S; with ``commits``, accept each
    record once done (commit_sync results appended). Returns flush_progress()'s results."""
    flushed = []
    for index in range(len(messages)):
        if index == 1:
            after_first()
        started = time.monotonic()
        while time.monotonic() - started < per_record_s:
            if mark:
                for message in messages[index:]:
                    share.mark_in_progress(message)
                flushed.append(share.flush_progress())
            time.sleep(MARK_EVERY_S)
        if commits is not None:
            share.acknowledge(messages[index])
            commits.append(share.commit_sync(10))
    return flushed


def test_a_slow_worker_that_marks_progress_keeps_its_records(kafka, proxy, create_topic, names, group):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 3, batch_records=3)
    worker = consumer(proxy, group, topic, **EXPLICIT)
    held = poll_until(worker, 3)
    bystander = Bystander(proxy, group, topic)
    bystander.start()
    try:
        seen_in_flight, commits = [], []
        flushed = work_slowly(worker, held, mark=True, per_record_s=3 * LOCK_MS / 1000, commits=commits,
                              after_first=lambda: seen_in_flight.extend(
                                  client.describe_share_group_in_flight(proxy.bootstrap, group)))
        # After the first record: it is accepted (the SPSO passed it), the other two are IN_PROGRESS.
        assert [(r.first_offset, r.last_offset, r.state, r.member_id, r.delivery_count, r.stale)
                for r in seen_in_flight] == [(1, 2, "IN_PROGRESS", worker.memberid(), 1, False)]
        assert commits == [{(topic, 0): None}] * 3
        time.sleep(1.0)
    finally:
        bystander.finish()
        worker.close()
    assert bystander.received == [] and bystander.errors == []
    assert len(flushed) >= 18 and all(result == {(topic, 0): None} for result in flushed)
    assert worker.progress_lock_timeout_ms == STALENESS_MS
    wait_until(lambda: finished_durably(kafka.bootstrap, proxy.state_topic, group, {0: 3}), 20,
               "the three records acknowledged durably")


def test_the_same_worker_without_marks_loses_its_records_to_lock_expiry(kafka, proxy, create_topic, names, group):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 3, batch_records=3)
    worker = consumer(proxy, group, topic, **EXPLICIT)
    other = consumer(proxy, group, topic, **EXPLICIT)
    try:
        held = poll_until(worker, 3)
        work_slowly(worker, held[:1], mark=False, per_record_s=3 * LOCK_MS / 1000)
        taken = poll_until(other, 3, timeout=10)
        assert sorted((m.offset(), m.delivery_count()) for m in taken) == [(0, 2), (1, 2), (2, 2)]
        # Too late to mark or acknowledge: the records are the other member's now.
        for message in held:
            worker.mark_in_progress(message)
        with pytest.raises(KafkaException) as refused:
            worker.flush_progress()
        assert refused.value.args[0].name() == "INVALID_RECORD_STATE"
        for message in held:
            worker.acknowledge(message)
        results = worker.commit_sync(10)
        assert [e.args[0].name() for e in results.values() if e is not None] == ["INVALID_RECORD_STATE"]
        in_flight = client.describe_share_group_in_flight(proxy.bootstrap, group)
        assert [(r.first_offset, r.last_offset, r.state, r.member_id) for r in in_flight] == [
            (0, 2, "ACQUIRED", other.memberid())]
        for message in taken:
            other.acknowledge(message)
    finally:
        other.close()
        worker.close()


def test_a_stuck_worker_loses_its_records_after_the_staleness_threshold(kafka, proxy, create_topic, names, group):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 2, batch_records=2)
    worker = consumer(proxy, group, topic, **EXPLICIT)
    held = poll_until(worker, 2)
    for message in held:
        worker.mark_in_progress(message)
    worker.flush_progress()
    marked_at = time.monotonic()
    bystander = Bystander(proxy, group, topic)
    bystander.start()
    try:
        wait_until(lambda: len(bystander.received) >= 2, STALENESS_MS / 1000 + 5, "the stuck worker's records")
    finally:
        bystander.finish()
        worker.close()
    assert sorted((offset, count) for offset, count, _ in bystander.received) == [(0, 2), (1, 2)]
    waited = min(when for _, _, when in bystander.received) - marked_at
    # Not before the threshold; by threshold + one sweep (threshold/4) + slack.
    assert STALENESS_MS / 1000 - 0.1 <= waited <= STALENESS_MS / 1000 * 1.25 + 1.5, waited


def test_marks_wait_for_the_next_poll_unless_too_many_batches_are_pending(kafka, proxy, create_topic, names, group):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 6, batch_records=6)
    set_group_configs(proxy.bootstrap, group, {"share.record.lock.duration.ms": "30000"})
    with consumer(proxy, group, topic, **EXPLICIT, **{"max.in-flight.progress.batches": 2}) as worker:
        held = poll_until(worker, 6)

        def in_progress() -> list[tuple[int, int]]:
            return [(r.first_offset, r.last_offset) for r in
                    client.describe_share_group_in_flight(proxy.bootstrap, group, only_state="IN_PROGRESS")]

        worker.mark_in_progress(held[0])
        worker.mark_in_progress(held[1])  # coalesced with offset 0: one batch
        worker.mark_in_progress(held[3])  # a second batch: not more than two, still queued
        assert worker.pending_progress_batches() == 2 and in_progress() == []
        worker.mark_in_progress(held[5])  # a third: flushed at once, in one MarkInProgress
        assert worker.pending_progress_batches() == 0
        assert in_progress() == [(0, 1), (3, 3), (5, 5)]
        worker.mark_in_progress(held[2])
        assert in_progress() == [(0, 1), (3, 3), (5, 5)]
        for message in held:
            worker.acknowledge(message, client.AcknowledgeType.RENEW if message.offset() == 4 else
                               client.AcknowledgeType.ACCEPT)
        worker.poll(0.2)  # flushes offset 2's mark, then acknowledges
        assert in_progress() == []
        remaining = client.describe_share_group_in_flight(proxy.bootstrap, group)
        assert [(r.first_offset, r.last_offset, r.state) for r in remaining] == [(4, 4, "ACQUIRED"), (5, 5, "ACKNOWLEDGED")]
        worker.acknowledge(held[4])


def test_marked_records_are_accepted_implicitly_at_the_next_poll(kafka, proxy, create_topic, names, group):
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 4, batch_records=4)
    with consumer(proxy, group, topic) as worker:
        held = poll_until(worker, 4)
        for message in held:
            worker.mark_in_progress(message)
        worker.flush_progress()
        assert [r.state for r in client.describe_share_group_in_flight(proxy.bootstrap, group)] == ["IN_PROGRESS"]
        assert worker.poll(0.5) == []
    wait_until(lambda: finished_durably(kafka.bootstrap, proxy.state_topic, group, {0: 4}), 20,
               "the marked records accepted durably")


def test_the_mark_key_is_read_from_api_versions_not_hard_coded(kafka, proxy, share_proxy, create_topic, names):
    """A proxy serving MarkInProgress under 80 advertises it; a client left at its defaults (81) follows."""
    assert proxy_keys(proxy) == (81, 82, True)
    moved = share_proxy("--mark-in-progress-api-key", "80")
    assert proxy_keys(moved) == (80, 82, True)
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, 2, batch_records=2)
    with consumer(moved, names.group, topic, **EXPLICIT) as worker:
        held = poll_until(worker, 2)
        for message in held:
            worker.mark_in_progress(message)
        assert worker.flush_progress() == {(topic, 0): None}
        assert [(r.first_offset, r.last_offset, r.state) for r in
                client.describe_share_group_in_flight(moved.bootstrap, names.group)] == [(0, 1, "IN_PROGRESS")]
        for message in held:
            worker.acknowledge(message)


def proxy_keys(running) -> tuple[int, int, bool]:
    share = client.ShareConsumer({"bootstrap.servers": running.bootstrap, "group.id": "keys-probe"})
    try:
        keys = share.extension_keys
        assert keys.mark_in_progress_served and keys.describe_in_flight_served
        return keys.mark_in_progress, keys.describe_in_flight, keys.advertised
    finally:
        share.close()
