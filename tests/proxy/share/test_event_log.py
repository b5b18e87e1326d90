"""The event-log publisher: stamping, merging, bounded buffering, one record per share-partition."""

from __future__ import annotations

import uuid

import pytest
import trio
from prometheus_client import REGISTRY

from codec.share_events import ArchiveReason, EventKind, ShareEvent, decode_event_batch
from proxy.share.commit import Cause, Change
from proxy.share.event_log import MAX_EVENTS_PER_RECORD, EventLog, EventLogSettings
from proxy.share.partition import RecordEvent

TOPIC_ID = uuid.UUID(int=7)
KEY = ("g", TOPIC_ID, 0)
OTHER_KEY = ("g", TOPIC_ID, 1)


class Sink:
    """Records what the producer was given; deliveries settle when the test says."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        self.pending: list = []
        self.full = False
        self.closed = False

    def produce(self, topic, key, value, on_done) -> bool:
        if self.full:
            return False
        self.records.append((topic, key, value))
        self.pending.append(on_done)
        return True

    def deliver(self, error: str | None = None) -> None:
        pending, self.pending = self.pending, []
        for on_done in pending:
            on_done(error)

    async def aclose(self, timeout_s) -> None:
        self.closed = True

    def batches(self):
        return [decode_event_batch(key, value) for _, key, value in self.records]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def event_log(sink, clock=None, **settings) -> EventLog:
    return EventLog(sink, EventLogSettings(topic="events", **settings), topic_name={TOPIC_ID: "orders"}.get,
                    wall_clock=clock or Clock())


def change(*events, key=KEY) -> Change:
    return Change(key, Cause.ACKNOWLEDGED, None, tuple(events))


def metric(name, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def accepted(first, last, member="m1", count=1):
    return RecordEvent(EventKind.ACCEPTED, first, last, member, count)


async def test_one_record_per_share_partition_with_events_stamped_when_heard():
    sink, clock = Sink(), Clock()
    log = event_log(sink, clock)
    log.on_change(change(RecordEvent(EventKind.ACQUIRED, 0, 4, "m1", 1)))
    clock.now = 1_005
    log.on_change(change(accepted(0, 2), RecordEvent(EventKind.RELEASED, 3, 4, "m1", 1)))
    log.on_change(change(RecordEvent(EventKind.ARCHIVED, 9, 9, None, 5, ArchiveReason.DELIVERY_LIMIT), key=OTHER_KEY))
    assert await log.flush_once() == 2
    batches = {batch.partition: batch for batch in sink.batches()}
    assert {topic for topic, _, _ in sink.records} == {"events"}
    assert batches[0].group_id == "g" and batches[0].topic_id == TOPIC_ID and batches[0].topic == "orders"
    assert batches[0].events == (
        ShareEvent(EventKind.ACQUIRED, 0, 4, "m1", 1, ArchiveReason.NONE, 1_000),
        ShareEvent(EventKind.ACCEPTED, 0, 2, "m1", 1, ArchiveReason.NONE, 1_005),
        ShareEvent(EventKind.RELEASED, 3, 4, "m1", 1, ArchiveReason.NONE, 1_005),
    )
    assert batches[1].events == (ShareEvent(EventKind.ARCHIVED, 9, 9, None, 5, ArchiveReason.DELIVERY_LIMIT, 1_005),)


async def test_adjacent_events_merge_only_when_nothing_but_the_offsets_differ():
    sink, clock = Sink(), Clock()
    log = event_log(sink, clock)
    log.on_change(change(accepted(0, 1)))
    log.on_change(change(accepted(2, 3)))  # same millisecond, adjacent: merged
    log.on_change(change(accepted(5, 5)))  # a gap: kept apart
    log.on_change(change(accepted(6, 6, member="m2")))  # another member
    clock.now += 1
    log.on_change(change(accepted(7, 7, member="m2")))  # another millisecond
    await log.flush_once()
    assert [(e.first_offset, e.last_offset, e.member_id) for e in sink.batches()[0].events] == [
        (0, 3, "m1"), (5, 5, "m1"), (6, 6, "m2"), (7, 7, "m2")]
    assert log.held == 4  # entries after merging, in the producer until delivered


async def test_changes_without_events_are_ignored():
    sink = Sink()
    log = event_log(sink)
    log.on_change(Change(KEY, Cause.COMMITTED, None))
    assert await log.flush_once() == 0 and sink.records == []


async def test_beyond_the_bound_new_events_are_dropped_and_counted_until_deliveries_free_room():
    sink = Sink()
    log = event_log(sink, buffer_events=3)
    dropped_before = metric("ksp_share_events_dropped_total", reason="buffer_full")
    log.on_change(change(accepted(0, 0), accepted(2, 2)))
    log.on_change(change(accepted(4, 4), accepted(6, 6)))  # one fits, one is dropped
    assert log.held == 3
    await log.flush_once()
    log.on_change(change(accepted(8, 8)))  # still held by the producer: dropped
    assert metric("ksp_share_events_dropped_total", reason="buffer_full") - dropped_before == 2
    assert metric("ksp_share_events_buffered") == 3
    published_before = metric("ksp_share_events_published_total")
    sink.deliver()
    assert metric("ksp_share_events_published_total") - published_before == 3
    assert log.held == 0 and metric("ksp_share_events_buffered") == 0
    log.on_change(change(accepted(10, 10)))
    assert log.held == 1


async def test_failed_deliveries_free_their_room_and_are_counted():
    sink = Sink()
    log = event_log(sink)
    failed_before = metric("ksp_share_events_dropped_total", reason="delivery_failed")
    log.on_change(change(accepted(0, 0), accepted(2, 2)))
    await log.flush_once()
    sink.deliver("_MSG_TIMED_OUT: Local: Message timed out")
    assert metric("ksp_share_events_dropped_total", reason="delivery_failed") - failed_before == 2
    assert log.held == 0


async def test_a_refusing_producer_drops_the_record_counted_as_buffer_full():
    sink = Sink()
    sink.full = True
    log = event_log(sink)
    dropped_before = metric("ksp_share_events_dropped_total", reason="buffer_full")
    log.on_change(change(accepted(0, 0)))
    await log.flush_once()
    assert metric("ksp_share_events_dropped_total", reason="buffer_full") - dropped_before == 1
    assert log.held == 0


async def test_a_long_run_of_events_is_split_into_records_in_order():
    sink = Sink()
    log = event_log(sink, buffer_events=10 * MAX_EVENTS_PER_RECORD)
    log.on_change(change(*(accepted(2 * i, 2 * i) for i in range(MAX_EVENTS_PER_RECORD + 3))))
    assert await log.flush_once() == 2
    first, second = sink.batches()
    assert len(first.events) == MAX_EVENTS_PER_RECORD and len(second.events) == 3
    assert first.events[-1].first_offset < second.events[0].first_offset
    assert sink.records[0][1] == sink.records[1][1]  # one key: one event-topic partition, in order


async def test_an_unknown_topic_id_publishes_an_empty_topic_name():
    sink = Sink()
    log = event_log(sink)
    log.on_change(change(accepted(0, 0), key=("g", uuid.UUID(int=99), 0)))
    await log.flush_once()
    assert sink.batches()[0].topic == ""


async def test_nothing_is_produced_until_the_topic_is_there_and_creation_is_retried():
    # Real time: creation runs in a worker thread, which an autojump clock would not wait for.
    sink = Sink()
    attempts = []

    def ensure_topic():
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("cluster unreachable")
        return True

    log = EventLog(sink, EventLogSettings(linger_ms=50), topic_name=lambda _: "orders", wall_clock=Clock(),
                   ensure_topic=ensure_topic)
    log.on_change(change(accepted(0, 0)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run)
        await trio.sleep(0.2)
        assert sink.records == [] and not log.topic_ready
        nursery.start_soon(log.ensure_topic_task)
        with trio.fail_after(10):
            while not sink.records:
                await trio.sleep(0.05)
        assert len(attempts) == 3 and log.topic_ready
        assert len(sink.records) == 1
        nursery.cancel_scope.cancel()


async def test_the_flush_task_publishes_every_linger(autojump_clock):
    sink = Sink()
    log = event_log(sink, linger_ms=100)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run)
        log.on_change(change(accepted(0, 0)))
        await trio.sleep(0.15)
        assert len(sink.records) == 1
        log.on_change(change(accepted(1, 1)))
        await trio.sleep(0.1)
        assert len(sink.records) == 2
        nursery.cancel_scope.cancel()


async def test_close_hands_over_what_is_buffered_then_closes_the_producer():
    sink = Sink()
    log = event_log(sink)
    log.on_change(change(accepted(0, 0)))
    await log.aclose()
    assert len(sink.records) == 1 and sink.closed


async def test_a_broken_flush_never_reaches_the_hook():
    """The hook only appends: a sink that raises affects the flush task (supervised), not commits."""
    class BrokenSink(Sink):
        def produce(self, topic, key, value, on_done):
            raise RuntimeError("boom")

    log = event_log(BrokenSink())
    log.on_change(change(accepted(0, 0)))
    with pytest.raises(RuntimeError):
        await log.flush_once()
    log.on_change(change(accepted(1, 1)))  # the hook still works
    assert log.held >= 1


async def test_a_hand_over_publishes_the_buffer_and_waits_for_the_producer(nursery, autojump_clock):
    """Scale-out: share-partitions handed to another instance have their events on the topic
    before the rebalance completes (the new owner's follow them)."""
    import trio

    sink = Sink()
    log = event_log(sink)
    log.on_change(change(accepted(0, 3)))
    done = trio.Event()
    outcome: list[bool] = []

    async def hand_over() -> None:
        outcome.append(await log.hand_over(timeout_s=5))
        done.set()

    nursery.start_soon(hand_over)
    await trio.sleep(1)
    assert len(sink.records) == 1 and not done.is_set()  # produced, waiting for the broker
    sink.deliver()
    await done.wait()
    assert outcome == [True] and log.held == 0

    log.on_change(change(accepted(4, 4)))
    started = trio.current_time()
    assert await log.hand_over(timeout_s=5) is False  # never delivered: bounded, not stuck
    assert trio.current_time() - started == pytest.approx(5, abs=0.1)
