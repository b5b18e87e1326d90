"""The commit pipeline: staged changes commit on a durable write, roll back on a failed one."""

from __future__ import annotations

import uuid

import pytest
import trio
from prometheus_client import REGISTRY

from codec import share_state as records
from codec.share_events import EventKind
from proxy.share import state_store
from proxy.share.commit import Cause, Change, CommitPipeline
from proxy.share.leaders import Leader
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, PartitionSnapshot, SharePartition
from proxy.share.persister import PersistError
from proxy.share.state_delta import DeltaPolicy
from proxy.share.states import AcknowledgeType, RecordState

KEY = ("g", uuid.UUID(int=1), 0)
ACCEPT = int(AcknowledgeType.ACCEPT)


class Writer:
    def __init__(self) -> None:
        self.fail = False
        self.land_failed = False  # a failing write's records land all the same (its outcome is unknown)
        self.batches: list[list[tuple[bytes, bytes | None]]] = []  # (key, value)
        self.routes: list[list[bytes | None]] = []

    async def write(self, topic, records) -> None:
        await trio.sleep(0)
        if self.fail and not self.land_failed:
            raise PersistError("injected")
        self.batches.append([(record[0], record[1]) for record in records])
        self.routes.append([record[2] if len(record) == 3 else None for record in records])
        if self.fail:
            raise PersistError("injected after landing")


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


async def test_a_share_partition_removed_while_its_write_fails_is_never_written_again(autojump_clock):
    """Handed to another instance (or deleted) while a write of it was in flight: the failed write is
    not retried -- a later write of this engine could overwrite the state rebuilt elsewhere -- and
    whoever waits for its changes is answered with an error."""
    leader = acquired_leader()

    class RemovedMeanwhile(Writer):
        async def write(self, topic, records) -> None:
            leader.removed = True  # what PartitionRegistry.remove does, while the write is in flight
            await super().write(topic, records)

    writer = RemovedMeanwhile()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    writer.fail = True
    staged = leader.engine.stage_acknowledge("m", [AckRange(0, 9, (ACCEPT,))], now=1)
    version = pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert not await pipeline.write_once()
    writer.fail = False
    assert not pipeline.busy and await pipeline.write_once()
    assert writer.batches == []
    with pytest.raises(PersistError):
        await pipeline.durable(leader, version)

    # Removed while dirty, before any write: dropped from the next write, its waiters failed.
    other = acquired_leader()
    pipeline = CommitPipeline(writer := Writer(), "state", wall_clock=lambda: 0)
    waiting = pipeline.record(other, None, Cause.INITIALISED)
    other.removed = True
    assert await pipeline.write_once() and writer.batches == []
    with pytest.raises(PersistError):
        await pipeline.durable(other, waiting)


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
        await trio.sleep(2.5)  # between retries (at 0.2, 0.6, 1.4, 3.0 s: the backoff doubles from 0.2)
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


# ----- cumulative ShareUpdates (--state-deltas on) ----------------------------------------------------


def fragmented_leader() -> Leader:
    """100 records acquired by "m", every other one accepted: a snapshot of ~50 batches."""
    engine = SharePartition(PartitionConfig(), 0)
    engine.acquire("m", [BatchHeader(0, 99)], now=0, max_records=100)
    engine.acknowledge("m", [AckRange(o, o, (ACCEPT,)) for o in range(1, 100, 2)], now=1)
    return Leader(KEY, engine, create_timestamp=0)


def written(writer: Writer) -> list[tuple[records.RecordType, int, bytes | None]]:
    """(record type, snapshot epoch, route) of every share-partition record written, in order."""
    out = []
    for batch, routes in zip(writer.batches, writer.routes):
        for (key, value), route in zip(batch, routes):
            kind = records.decode_key(key)[0]
            if kind in (records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE) and value is not None:
                out.append((kind, records.decode_value(kind, value).snapshot_epoch, route))
    return out


def replay(writer: Writer) -> PartitionSnapshot:
    recovered = state_store.recover([state_store.group_metadata_record(KEY[0], 1, 0)]
                                    + [r for batch in writer.batches for r in batch])
    part = recovered.partitions[KEY]
    return SharePartition.from_persisted(PartitionConfig(), part.snapshot, part.updates).snapshot()


async def change(pipeline: CommitPipeline, leader: Leader, offset: int) -> bool:
    """Accept one more acquired record and write it."""
    pipeline.record(leader, leader.engine.acknowledge("m", [AckRange(offset, offset, (ACCEPT,))], now=2),
                    Cause.ACKNOWLEDGED)
    return await pipeline.write_once()


SNAPSHOT, UPDATE = records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE


async def test_with_deltas_a_change_over_a_durable_snapshot_is_a_cumulative_update_routed_beside_it(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=DeltaPolicy())
    leader = fragmented_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    assert leader.delta_base is not None and leader.delta_base.epoch == 1
    assert await change(pipeline, leader, 50)
    assert await change(pipeline, leader, 60)
    route = state_store.share_partition_route(KEY)
    assert written(writer) == [(SNAPSHOT, 1, route), (UPDATE, 1, route), (UPDATE, 1, route)]
    assert leader.snapshot_epoch == 1 and leader.delta_base.updates == 2
    # The newest update carries both changes (cumulative): compaction may keep it alone.
    newest = records.decode_value(UPDATE, writer.batches[-1][0][1])
    assert [(b.first_offset, b.last_offset, b.delivery_state) for b in newest.state_batches] == [
        (50, 50, int(RecordState.ACKNOWLEDGED)), (60, 60, int(RecordState.ACKNOWLEDGED))]
    assert replay(writer) == leader.engine.snapshot()


async def test_after_a_failed_write_the_next_record_is_a_snapshot(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=DeltaPolicy())
    leader = fragmented_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    writer.fail = True
    assert not await change(pipeline, leader, 50)  # an update: its outcome unknown
    assert leader.delta_base is None
    writer.fail = False
    assert await pipeline.write_once()  # written again (dirty after the failure)
    assert await change(pipeline, leader, 60)
    # (an update does not move the snapshot epoch)
    assert [(kind, epoch) for kind, epoch, _ in written(writer)] == [(SNAPSHOT, 1), (SNAPSHOT, 2), (UPDATE, 2)]
    assert replay(writer) == leader.engine.snapshot()


async def test_a_failed_snapshot_write_leaves_no_base_and_the_next_snapshot_has_a_new_epoch(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=DeltaPolicy())
    leader = fragmented_leader()
    writer.fail = True
    pipeline.touch(leader)
    assert not await pipeline.write_once()
    assert leader.delta_base is None and leader.snapshot_epoch == 1
    writer.fail = False
    assert await pipeline.write_once()
    assert leader.delta_base is not None and leader.delta_base.epoch == leader.snapshot_epoch == 2


async def test_a_snapshot_every_n_updates(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=DeltaPolicy(snapshot_every=2))
    leader = fragmented_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    for offset in (50, 52, 54, 56):
        assert await change(pipeline, leader, offset)
    assert [(kind, epoch) for kind, epoch, _ in written(writer)] == [
        (SNAPSHOT, 1), (UPDATE, 1), (UPDATE, 1), (SNAPSHOT, 2), (UPDATE, 2)]
    assert replay(writer) == leader.engine.snapshot()


@pytest.mark.parametrize(("policy", "kinds"), [
    # In-order accepts leave next to no batches: one snapshot, then updates (smaller than snapshots).
    (DeltaPolicy(), [SNAPSHOT, UPDATE, UPDATE, UPDATE]),
    # Below min_snapshot_batches a small snapshot is written as it is.
    (DeltaPolicy(min_snapshot_batches=8), [SNAPSHOT, SNAPSHOT, SNAPSHOT, SNAPSHOT]),
])
async def test_the_easy_case_writes_updates_after_its_first_snapshot_unless_below_min_snapshot_batches(
        autojump_clock, policy, kinds):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=policy)
    leader = acquired_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    for offset in range(3):
        assert await change(pipeline, leader, offset)
    assert [kind for kind, _, _ in written(writer)] == kinds
    assert replay(writer) == leader.engine.snapshot()


async def test_without_deltas_every_write_is_a_snapshot_routed_to_its_home(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    leader = fragmented_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    assert await change(pipeline, leader, 50)
    # Layout 2: routed by (topic id, partition), the same whatever the group.
    route = state_store.share_partition_route(("another-group", KEY[1], KEY[2]))
    assert written(writer) == [(SNAPSHOT, 1, route), (SNAPSHOT, 2, route)]
    assert leader.delta_base is None


async def test_a_new_state_epoch_is_written_as_a_snapshot(autojump_clock):
    # e.g. an offsets reset: an update cannot carry the state epoch.
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=DeltaPolicy())
    leader = fragmented_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    leader.state_epoch += 1
    assert await change(pipeline, leader, 50)
    assert [kind for kind, _, _ in written(writer)] == [SNAPSHOT, SNAPSHOT]
    assert records.decode_value(SNAPSHOT, writer.batches[-1][0][1]).state_epoch == 1


async def test_a_rolled_back_acceptance_whose_update_landed_is_undone_by_the_next_snapshot(autojump_clock):
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, deltas=DeltaPolicy())
    leader = fragmented_leader()
    pipeline.touch(leader)
    assert await pipeline.write_once()
    writer.fail = writer.land_failed = True
    staged = leader.engine.stage_acknowledge("m", [AckRange(50, 50, (ACCEPT,))], now=2)
    pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
    assert not await pipeline.write_once()  # the update with 50 accepted landed, reported failed
    assert records.decode_key(writer.batches[-1][0][0])[0] is UPDATE
    writer.fail = writer.land_failed = False
    assert await pipeline.write_once()
    assert records.decode_key(writer.batches[-1][0][0])[0] is SNAPSHOT
    assert leader.engine.record_state(50) == (RecordState.ACQUIRED, 1, "m")
    assert replay(writer) == leader.engine.snapshot()


async def test_records_routed_to_a_state_partition_this_instance_may_not_write_are_dropped_not_tried(autojump_clock):
    """Scale-out: a share-partition or group record homed on another instance's state partition is
    never written (it could not succeed, and would fail every record batched with it)."""
    writer = Writer()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    mine, theirs = acquired_leader(), Leader(("g", uuid.UUID(int=2), 0), SharePartition(PartitionConfig(), 0),
                                            create_timestamp=0)
    pipeline.may_write = lambda route: route != state_store.share_partition_route(theirs.key) and route != b"elsewhere"
    waiting = pipeline.record(theirs, None, Cause.INITIALISED)
    pipeline.record(mine, None, Cause.INITIALISED)
    pipeline.queue_group_records([(b"k1", b"v", b"elsewhere"), (b"k2", b"v", state_store.group_route("g"))])
    assert await pipeline.write_once()
    assert [key for key, _ in writer.batches[0]] == [b"k2", writer.batches[0][1][0]]
    assert len(writer.batches[0]) == 2  # the group record homed here and `mine`; not `theirs`, not k1
    with pytest.raises(PersistError):
        await pipeline.durable(theirs, waiting)


# ----- writes in flight --------------------------------------------------------------------------


class GatedWriter:
    """A writer with StateLogWriter's ordered ``submit``: each write's delivery waits for its own
    gate; `outcomes[i] = False` makes the i-th write fail; `submit_delays[i]` makes the i-th
    submission take that long (librdkafka's queue full, say)."""

    def __init__(self) -> None:
        self.gates: list[trio.Event] = []
        self.batches: list[list[tuple]] = []
        self.outcomes: dict[int, bool] = {}
        self.submit_delays: dict[int, float] = {}
        self._submitting = 0

    async def submit(self, topic, records):
        index = self._submitting
        self._submitting += 1
        if index in self.submit_delays:  # else no yield: StateLogWriter.submit yields only when it must wait
            await trio.sleep(self.submit_delays[index])
        self.gates.append(gate := trio.Event())
        self.batches.append(list(records))
        writer = self

        class Delivery:
            async def wait(self) -> None:
                await gate.wait()
                if not writer.outcomes.get(index, True):
                    raise PersistError(f"write {index} injected")

        return Delivery()

    async def write(self, topic, records) -> None:
        await (await self.submit(topic, records)).wait()


def written_engine(batches: list[list[tuple]]) -> SharePartition:
    """Share-partition KEY as replay rebuilds it from `batches`."""
    recovered = state_store.recover([state_store.group_metadata_record(KEY[0], 1, 0)]
                                    + [(record[0], record[1]) for batch in batches for record in batch])
    part = recovered.partitions[KEY]
    return SharePartition.from_persisted(PartitionConfig(), part.snapshot, part.updates)


def leader_of(partition: int) -> Leader:
    engine = SharePartition(PartitionConfig(), 0)
    engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=100)
    return Leader(("g", uuid.UUID(int=1), partition), engine, create_timestamp=0)


def accept(pipeline: CommitPipeline, leader: Leader, first: int, last: int) -> int:
    staged = leader.engine.stage_acknowledge("m", [AckRange(first, last, (ACCEPT,))], now=1)
    return pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)


async def accept_in_turn(pipeline: CommitPipeline, *acks: tuple[Leader, int, int]) -> list[int]:
    """Each acceptance once the writer task has issued a write for the one before; their versions."""
    versions = []
    for leader, first, last in acks:
        versions.append(accept(pipeline, leader, first, last))
        await trio.sleep(0.01)
    return versions


async def test_writes_go_out_while_others_are_in_flight_up_to_the_limit_and_apply_in_issue_order(autojump_clock):
    writer = GatedWriter()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, max_writes_in_flight=2)
    first, second, third = leader_of(0), leader_of(1), leader_of(2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        v1, v2 = await accept_in_turn(pipeline, (first, 0, 9), (second, 0, 9))
        assert len(writer.gates) == 2  # the second went out while the first was in flight
        v3 = accept(pipeline, third, 0, 9)
        await trio.sleep(0.01)
        assert len(writer.gates) == 2 and pipeline.busy  # the limit: the third waits for a slot

        writer.gates[1].set()  # the second lands first ...
        await trio.sleep(0.01)
        assert second.durable < v2 and second.engine.start_offset == 0  # ... but waits for the first
        assert len(writer.gates) == 2  # a write holds its slot until its outcome is applied
        writer.gates[0].set()
        await pipeline.durable(first, v1)
        await pipeline.durable(second, v2)
        assert first.engine.start_offset == second.engine.start_offset == 10
        await trio.sleep(0.01)
        assert len(writer.gates) == 3  # the third went out in a freed slot
        writer.gates[2].set()
        await pipeline.durable(third, v3)
        assert pipeline.idle
        nursery.cancel_scope.cancel()


async def test_a_write_issued_before_an_earlier_write_failed_counts_as_failed_and_is_written_again(autojump_clock):
    """The second write's snapshot carries the first one's acceptance of 0-4, which is rolled back when
    the first fails: the second must not report 5-9 (nor 0-4) durable on the strength of that snapshot."""
    writer = GatedWriter()
    writer.outcomes[0] = False
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, retry_backoff_s=0.01)
    leader = leader_of(0)
    outcomes: dict[str, str] = {}

    async def waits(name: str, version: int) -> None:
        try:
            await pipeline.durable(leader, version)
            outcomes[name] = "durable"
        except PersistError:
            outcomes[name] = "failed"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        nursery.start_soon(waits, "0-4", accept(pipeline, leader, 0, 4))
        await trio.sleep(0.01)
        nursery.start_soon(waits, "5-9", accept(pipeline, leader, 5, 9))
        await trio.sleep(0.01)
        assert len(writer.gates) == 2
        assert records.decode_key(writer.batches[1][0][0])[0] is SNAPSHOT
        writer.gates[1].set()  # the later write succeeds at the broker ...
        writer.gates[0].set()  # ... the earlier one fails
        await trio.sleep(0.01)
        assert outcomes == {"0-4": "failed", "5-9": "failed"}
        assert [leader.engine.record_state(o)[0] for o in (0, 9)] == [RecordState.ACQUIRED] * 2  # rolled back
        assert leader.engine.start_offset == 0
        await trio.sleep(1)  # past the backoff: the rolled-back truth is written again
        assert len(writer.gates) == 3
        writer.gates[2].set()
        await trio.sleep(0.01)
        assert pipeline.idle and pipeline.writable and leader.durable == leader.version
        nursery.cancel_scope.cancel()
    landed = [batch for index, batch in enumerate(writer.batches) if writer.outcomes.get(index, True)]
    assert written_engine(landed).snapshot() == leader.engine.snapshot()


async def test_a_group_ticket_is_not_durable_through_a_later_write_when_its_own_write_failed(autojump_clock):
    writer = GatedWriter()
    writer.outcomes[0] = False
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, retry_backoff_s=0.01)
    done: list[int] = []

    async def wait(ticket: int) -> None:
        await pipeline.group_records_durable(ticket)
        done.append(ticket)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        first = pipeline.queue_group_records([(b"config", b"v1")])
        nursery.start_soon(wait, first)
        await trio.sleep(0.01)
        second = pipeline.queue_group_records([(b"epoch", b"e1")])
        nursery.start_soon(wait, second)
        await trio.sleep(0.01)
        writer.gates[1].set()
        writer.gates[0].set()
        await trio.sleep(0.01)
        assert done == []  # neither: the first failed, the second counts as failed with it
        await trio.sleep(1)
        assert {key for key, *_ in writer.batches[2]} == {b"config", b"epoch"}  # both again, in one write
        writer.gates[2].set()
        await trio.sleep(0.01)
        assert sorted(done) == [first, second]
        nursery.cancel_scope.cancel()


async def test_a_write_cancelled_in_flight_is_written_again_by_the_flush(autojump_clock):
    writer = GatedWriter()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    leader = leader_of(0)
    version = accept(pipeline, leader, 0, 9)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await trio.sleep(0.01)
        assert len(writer.gates) == 1
        nursery.cancel_scope.cancel()  # shutdown while the write is in flight: its outcome is unknown
    assert pipeline.busy and leader.durable < version

    async def open_gates() -> None:
        while len(writer.gates) < 2:
            await trio.sleep(0.01)
        writer.gates[1].set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_gates)
        await pipeline.flush([leader])
    assert leader.durable >= version and leader.engine.start_offset == 10


async def test_the_shutdown_flush_waits_for_every_write_in_flight(autojump_clock):
    writer = GatedWriter()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    first, second = leader_of(0), leader_of(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await accept_in_turn(pipeline, (first, 0, 9), (second, 0, 9))
        assert len(writer.gates) == 2

        async def land_later() -> None:
            await trio.sleep(1)
            for gate in writer.gates:
                gate.set()

        nursery.start_soon(land_later)
        await pipeline.flush([first, second])
        assert trio.current_time() >= 1 and first.durable == first.version and second.durable == second.version
        nursery.cancel_scope.cancel()


def test_at_least_one_write_in_flight() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CommitPipeline(GatedWriter(), "state", wall_clock=lambda: 0, max_writes_in_flight=0)


async def test_a_write_goes_to_the_producer_while_the_task_that_staged_it_goes_on(autojump_clock):
    """A ShareFetch stages its acknowledgements, yields (at a partition's read lock) and then
    takes its records without yielding: its write must be with the producer by then, not after
    the take (it was three writer-task turns away, ~0.2 ms on the response's critical path)."""
    writer = GatedWriter()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    first, second = leader_of(0), leader_of(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await trio.sleep(0.01)  # the writer task waits for work
        for leader in (first, second):  # one after the other: the second goes out while the first is in flight
            accept(pipeline, leader, 0, 9)
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            assert len(writer.batches) == (1 if leader is first else 2)
        for gate in writer.gates:
            gate.set()
        await trio.sleep(0.01)
        assert first.engine.start_offset == second.engine.start_offset == 10
        nursery.cancel_scope.cancel()


async def test_writes_reach_the_producer_in_issue_order_when_one_is_slow_to_submit(autojump_clock):
    """The producer keeps a state partition's records in the order they were handed to it, so a
    later write must not be handed over while an earlier one is still being handed over."""
    writer = GatedWriter()
    writer.submit_delays[0] = 0.5
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0)
    leader = leader_of(0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await accept_in_turn(pipeline, (leader, 0, 4), (leader, 5, 9))
        await trio.sleep(1)
        assert len(writer.batches) == 2
        first, second = (written_engine([batch]) for batch in writer.batches)
        # The earlier snapshot first (acquisitions are not written: replay finds 5 available).
        assert first.record_state(5)[0] is RecordState.AVAILABLE
        assert second.record_state(5)[0] is not RecordState.AVAILABLE  # accepted
        for gate in writer.gates:
            gate.set()
        await trio.sleep(0.01)
        assert leader.engine.start_offset == 10
        nursery.cancel_scope.cancel()


async def test_a_writer_without_ordered_submit_gets_one_write_at_a_time(autojump_clock):
    class Unordered:
        def __init__(self) -> None:
            self.inner = GatedWriter()

        async def write(self, topic, records) -> None:
            await self.inner.write(topic, records)

    writer = Unordered()
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, max_writes_in_flight=4)
    assert pipeline.max_writes_in_flight == 1
    first, second = leader_of(0), leader_of(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await accept_in_turn(pipeline, (first, 0, 9), (second, 0, 9))
        assert len(writer.inner.gates) == 1
        writer.inner.gates[0].set()
        await trio.sleep(0.01)
        assert len(writer.inner.gates) == 2
        nursery.cancel_scope.cancel()


async def test_a_write_failing_while_the_writer_waits_for_a_slot_still_holds_the_next_one_back(autojump_clock):
    writer = GatedWriter()
    writer.outcomes[0] = False
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, retry_backoff_s=0.5, max_writes_in_flight=1)
    first, second = leader_of(0), leader_of(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await accept_in_turn(pipeline, (first, 0, 9), (second, 0, 9))  # the second waits for the slot
        assert len(writer.gates) == 1
        failed_at = trio.current_time()
        writer.gates[0].set()
        while len(writer.gates) < 2:
            await trio.sleep(0.01)
        assert trio.current_time() - failed_at >= 1.0  # the first retry's backoff: 0.5 s doubled
        assert writer.batches[0][0][0] in {key for key, *_ in writer.batches[1]}  # the failed one again
        writer.gates[1].set()
        await trio.sleep(0.01)
        assert pipeline.idle and first.durable == first.version and second.durable == second.version
        nursery.cancel_scope.cancel()


async def test_writes_failing_together_back_off_once_not_once_each(autojump_clock):
    """Four writes in flight when the broker goes away fail together: one failed attempt, whose
    backoff is the first one's (0.5 s doubled), not the fourth's."""
    writer = GatedWriter()
    writer.outcomes.update({0: False, 1: False, 2: False, 3: False})
    pipeline = CommitPipeline(writer, "state", wall_clock=lambda: 0, retry_backoff_s=0.5)
    leaders = [leader_of(p) for p in range(4)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await accept_in_turn(pipeline, *((leader, 0, 9) for leader in leaders))
        assert len(writer.gates) == 4
        failed_at = trio.current_time()
        for gate in writer.gates:
            gate.set()
        while len(writer.gates) < 5:
            await trio.sleep(0.01)
        assert 1.0 <= trio.current_time() - failed_at < 1.1
        writer.gates[4].set()
        await trio.sleep(0.01)
        assert pipeline.idle and all(leader.durable == leader.version for leader in leaders)
        nursery.cancel_scope.cancel()
