"""The commit pipeline: staged changes commit on a durable write, roll back on a failed one."""

from __future__ import annotations

import uuid

import trio
from prometheus_client import REGISTRY

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
