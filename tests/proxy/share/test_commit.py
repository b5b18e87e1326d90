"""The commit pipeline: staged changes commit on a durable write, roll back on a failed one."""

from __future__ import annotations

import uuid

import trio
from prometheus_client import REGISTRY

from codec.share_events import EventKind
from proxy.share.commit import Cause, Change, CommitPipeline
from proxy.share.leaders import Leader
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, SharePartition
from proxy.share.persister import PersistError
from proxy.share.states import AcknowledgeType, RecordState

KEY = ("g", uuid.UUID(int=1), 0)
ACCEPT = int(AcknowledgeType.ACCEPT)


class Writer:
    def __init__(self) -> None:
        self.fail = False
        self.batches: list[list[tuple[bytes, bytes | None]]] = []

    async def write(self, topic, records) -> None:
        await trio.sleep(0)
        if self.fail:
            raise PersistError("injected")
        self.batches.append(list(records))


def acquired_leader() -> Leader:
    engine = SharePartition(PartitionConfig(), 0)
    engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=100)
    return Leader(KEY, engine, create_timestamp=0)


async def test_a_failed_write_rolls_the_staged_ack_back_and_the_retry_commits(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    leader = acquired_leader()
    writer.fail = True
    staged = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (ACCEPT,))], now=1)
    version = pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert not await pipeline.write_once()
    assert leader.failed >= version and not pipeline.writable
    assert leader.engine.record_state(3) == (RecordState.ACQUIRED, 1, "m")  # rolled back
    assert leader.engine.start_offset == 0

    writer.fail = False
    retry = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (ACCEPT,))], now=2)
    version = pipeline.record(leader, retry.delta, Cause.ACKNOWLEDGED, retry)
    assert await pipeline.write_once()
    await pipeline.durable(leader, version)
    assert pipeline.writable and leader.engine.start_offset == 10


async def test_the_writable_gauge_is_1_before_any_write_and_follows_failures(autojump_clock):
    def gauge() -> float | None:
        return REGISTRY.get_sample_value("ksp_share_state_writable")

    writer = Writer()
    writer.fail = True
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    leader = acquired_leader()
    pipeline.record(leader, None, Cause.INITIALISED)
    assert not await pipeline.write_once()
    assert gauge() == 0
    fresh = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    assert fresh.writable and gauge() == 1  # nothing written yet, nothing failed
    writer.fail = False
    assert await pipeline.write_once()
    assert pipeline.writable and gauge() == 1


async def test_unstaged_changes_are_written_again_until_durable(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, retry_backoff_s=0.1)
    leader = acquired_leader()
    delta = leader.engine.expire(10**9)  # lock expiry: no client waits, nothing to roll back
    assert delta is not None
    writer.fail = True
    pipeline.record(leader, delta, Cause.LOCK_EXPIRED)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await trio.sleep(3)
        assert writer.batches == [] and pipeline.busy
        writer.fail = False
        await trio.sleep(6)  # past the longest backoff reached
        nursery.cancel_scope.cancel()
    assert writer.batches, "the expiry was never made durable"
    assert leader.durable >= leader.version and leader.engine.record_state(0)[0] is RecordState.AVAILABLE


async def test_group_records_are_coalesced_by_key_while_writes_fail(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    writer.fail = True
    for epoch in range(1000):
        pipeline.queue_group_records([(b"group-key", str(epoch).encode()), (b"other", b"x")])
        await pipeline.write_once()
    assert pipeline.pending_group_records == 2
    writer.fail = False
    assert await pipeline.write_once()
    assert dict(writer.batches[-1]) == {b"group-key": b"999", b"other": b"x"}


async def test_the_change_hook_hears_every_change_with_its_cause(autojump_clock):
    pipeline = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    heard: list[Change] = []
    pipeline.subscribe(heard.append)
    pipeline.subscribe(lambda change: 1 / 0)  # a broken subscriber never breaks a commit
    leader = acquired_leader()
    staged = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (ACCEPT,))], now=1)
    pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert await pipeline.write_once()
    assert [c.cause for c in heard] == [Cause.ACKNOWLEDGED, Cause.COMMITTED]
    assert heard[1].delta.start_offset == 10


async def test_waiting_for_group_records_returns_only_once_a_write_carrying_them_succeeded(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    writer.fail = True
    ticket = pipeline.queue_group_records([(b"config-key", b"v1")])
    done = []

    async def wait() -> None:
        await pipeline.group_records_durable(ticket)
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        assert not await pipeline.write_once()  # failed: requeued, the waiter keeps waiting
        await trio.sleep(1)
        assert done == []
        writer.fail = False
        later = pipeline.queue_group_records([(b"other-key", b"v2")])
        assert await pipeline.write_once()
        await pipeline.group_records_durable(later)
    assert len(done) == 1
    assert dict(writer.batches[-1]) == {b"config-key": b"v1", b"other-key": b"v2"}


# ----- events (Change.events) --------------------------------------------------------------------

REJECT = int(AcknowledgeType.REJECT)
RENEW = int(AcknowledgeType.RENEW)


def listening(pipeline: CommitPipeline) -> list[Change]:
    heard: list[Change] = []
    pipeline.subscribe(heard.append)
    return heard


def event_kinds(change: Change) -> list[tuple[EventKind, int, int]]:
    return [(e.kind, e.first_offset, e.last_offset) for e in change.events]


async def test_a_staged_changes_events_are_published_at_its_commit(autojump_clock):
    pipeline = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    heard = listening(pipeline)
    leader = acquired_leader()
    staged = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (ACCEPT,))], now=1)
    pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert [(c.cause, c.events) for c in heard] == [(Cause.ACKNOWLEDGED, ())]  # not settled yet
    assert await pipeline.write_once()
    assert heard[-1].cause is Cause.COMMITTED
    assert event_kinds(heard[-1]) == [(EventKind.ACCEPTED, 0, 9)]
    assert leader.staged == []


async def test_a_rolled_back_changes_events_are_never_published(autojump_clock):
    writer = Writer()
    writer.fail = True
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    heard = listening(pipeline)
    leader = acquired_leader()
    staged = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (ACCEPT,))], now=1)
    pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert not await pipeline.write_once()
    writer.fail = False
    assert await pipeline.write_once()  # the retry of the partition: nothing staged any more
    assert [c.events for c in heard] == [()]
    assert leader.staged == []


async def test_an_unstaged_changes_events_are_published_when_recorded(autojump_clock):
    pipeline = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    heard = listening(pipeline)
    leader = acquired_leader()
    pipeline.record(leader, leader.engine.expire(10**9), Cause.LOCK_EXPIRED)
    assert event_kinds(heard[0]) == [(EventKind.LOCK_EXPIRED, 0, 9)]
    assert heard[0].events[0].member_id == "m"


async def test_events_only_delta_is_published_without_a_write(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    heard = listening(pipeline)
    leader = acquired_leader()
    renewed = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (RENEW,))], now=1)
    version = pipeline.record(leader, renewed.delta, Cause.ACKNOWLEDGED, renewed)
    assert version == leader.version == 0 and not pipeline.busy
    await pipeline.durable(leader, version)  # nothing pending: returns at once
    assert event_kinds(heard[0]) == [(EventKind.RENEWED, 0, 9)]
    assert writer.batches == []


async def test_events_only_delta_waits_for_earlier_unfinished_changes(autojump_clock):
    pipeline = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    leader = acquired_leader()
    pipeline.record(leader, None, Cause.INITIALISED)
    renewed = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (RENEW,))], now=1)
    version = pipeline.record(leader, renewed.delta, Cause.ACKNOWLEDGED, renewed)
    assert version == 2 and leader.durable < version
    assert await pipeline.write_once()
    await pipeline.durable(leader, version)


async def test_note_delivered_tells_subscribers_without_a_write(autojump_clock):
    pipeline = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    heard = listening(pipeline)
    engine = SharePartition(PartitionConfig(), 0)
    result = engine.acquire("m", [BatchHeader(0, 4), BatchHeader(5, 5, is_control=True), BatchHeader(6, 9)],
                            now=0, max_records=100)
    pipeline.note_delivered(KEY, result.delivered)
    pipeline.note_delivered(KEY, ())  # nothing handed over: nothing heard
    assert [(c.cause, c.delta) for c in heard] == [(Cause.DELIVERED, None)]
    assert [(e.kind, e.first_offset, e.last_offset, e.member_id, e.delivery_count) for e in heard[0].events] == [
        (EventKind.ACQUIRED, 0, 4, "m", 1), (EventKind.ACQUIRED, 6, 9, "m", 1)]
    assert not pipeline.busy


async def test_dead_lettered_change_publishes_dead_lettered_then_archived(autojump_clock):
    pipeline = CommitPipeline(Writer(), "state", wall_clock=lambda: 0)
    heard = listening(pipeline)
    engine = SharePartition(PartitionConfig(dead_letter=True), 0)
    engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=100)
    leader = Leader(KEY, engine, create_timestamp=0)
    staged = engine.stage_acknowledge("m", [AckRange(0, 1, (REJECT,))], now=1)
    pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert await pipeline.write_once()
    assert event_kinds(heard[-1]) == [(EventKind.REJECTED, 0, 1), (EventKind.ARCHIVING, 0, 1)]
    version = pipeline.record(leader, engine.finish_archiving(0, 1, dead_lettered=True), Cause.DEAD_LETTERED)
    assert event_kinds(heard[-1]) == [(EventKind.DEAD_LETTERED, 0, 1), (EventKind.ARCHIVED, 0, 1)]
    assert await pipeline.write_once()
    await pipeline.durable(leader, version)
    assert engine.start_offset == 2
