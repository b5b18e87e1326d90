"""Property: what the commit pipeline writes with --state-deltas on (snapshots and cumulative
ShareUpdates, through state_store's encoding) replays to exactly what a full snapshot of the engine
replays to -- every record replayed in log order, or only the newest record per key (compaction),
including histories where writes fail (landed or not) and the next base is unknown.

On every write it also checks that what the pipeline builds from the engine's changed ranges (the
snapshot spliced from the base, the update compared only there) is exactly what the whole-window
snapshot and diff give.

Random engine histories: members fetch from a log of random batches, acknowledge random subsets of
what they hold with random types (staged, so a failed write rolls them back), mark records
IN_PROGRESS, leave, let locks expire, the IN_PROGRESS sweep runs, and the dead-letter writer
finishes ARCHIVING records; between them the pipeline writes, succeeding, failing, or failing after
its records landed.
"""

from __future__ import annotations

import uuid

import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from codec import share_state
from proxy.share import state_store
from proxy.share.commit import Cause, CommitPipeline
from proxy.share.leaders import Leader
from proxy.share.partition import (
    AckRange,
    BatchHeader,
    PartitionConfig,
    SharePartition,
    ShareStateError,
)
from proxy.share.persister import PersistError
from proxy.share.state_delta import DeltaPolicy, plan
from proxy.share.states import AcknowledgeType, RecordState

KEY = ("g", uuid.UUID(int=7), 3)
MEMBERS = ("m0", "m1", "m2")
WALL = 1_000_000  # wall clock - engine clock
TYPES = (int(AcknowledgeType.ACCEPT), int(AcknowledgeType.RELEASE), int(AcknowledgeType.REJECT))
GROUP = state_store.group_metadata_record(KEY[0], 1, 0)


class Writer:
    """Keeps the log; `mode` is how the next write ends: ok, failed, or failed after landing."""

    def __init__(self) -> None:
        self.log: list[tuple[bytes, bytes | None]] = []
        self.routes: set[bytes] = set()
        self.mode = "ok"
        self.updates = 0

    async def write(self, topic, records) -> None:
        await trio.sleep(0)
        if self.mode == "failed":
            raise PersistError("injected")
        for key, value, route in records:
            self.log.append((key, value))
            self.routes.add(route)
        if self.mode == "landed":
            raise PersistError("injected after landing")


class CheckedPipeline(CommitPipeline):
    """The pipeline, checking on every write that the snapshot and the update it builds from the
    engine's changed ranges are the whole-window ones, and counting the writes built so."""

    narrowed = 0

    def _current(self, leader):
        current, within = super()._current(leader)
        full = leader.engine.snapshot()
        assert current == full
        if within is not None:
            assert plan(leader.delta_base, current, self.deltas, within) == plan(leader.delta_base, full, self.deltas)
            self.narrowed += 1
        return current, within


def rebuild(records: list[tuple[bytes, bytes | None]], config: PartitionConfig) -> SharePartition:
    recovered = state_store.recover([GROUP, *records], clock_offset_ms=WALL)
    part = recovered.partitions[KEY]
    return SharePartition.from_persisted(config, part.snapshot, part.updates)


def compacted(records: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
    newest = {key: i for i, (key, _) in enumerate(records)}
    return [record for i, record in enumerate(records) if newest[record[0]] == i]


def view(engine: SharePartition) -> tuple:
    return engine.snapshot(), list(engine.in_flight()), engine.end_offset


# (operation, member number, a number the operation picks with, then how the write after it ends: none)
operations = st.lists(
    st.tuples(st.sampled_from(["fetch", "fetch", "ack", "ack", "ack", "ack", "mark", "expire", "leave", "sweep",
                               "dead-letter"]),
              st.integers(0, 2), st.integers(0, 2**16),
              st.sampled_from(["none", "ok", "ok", "ok", "ok", "failed", "landed"])),
    min_size=5, max_size=50)


@st.composite
def logs(draw) -> list[BatchHeader]:
    sizes = draw(st.lists(st.integers(1, 6), min_size=5, max_size=40))
    batches, offset = [], 0
    for size in sizes:
        batches.append(BatchHeader(offset, offset + size - 1))
        offset += size
    return batches


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), operations, st.integers(1, 5), st.integers(0, 3), st.integers(0, 9), st.booleans())
def test_deltas_replay_to_what_a_full_snapshot_replays_to(log, ops, snapshot_every, min_batches, halves_from,
                                                          dead_letter):
    config = PartitionConfig(delivery_count_limit=3, record_lock_duration_ms=1_000, dead_letter=dead_letter,
                             in_progress_staleness_threshold_ms=2_000, in_progress_rebalance_grace_ms=1_000)
    trio.run(_history, log, ops, DeltaPolicy(snapshot_every, min_batches, halves_from), config)


async def _history(log, ops, policy: DeltaPolicy, config: PartitionConfig) -> None:
    now = 0
    writer = Writer()
    pipeline = CheckedPipeline(writer, "state", wall_clock=lambda: WALL + now, clock=lambda: now, deltas=policy)
    leader = Leader(KEY, SharePartition(config, 0), create_timestamp=0)
    engine = leader.engine
    pipeline.touch(leader)
    checked = 0
    for op, who, pick, mode in ops:
        member = MEMBERS[who]
        if op in ("ack", "mark"):  # one of the members holding records
            holders = sorted(engine.members())
            member = holders[who % len(holders)] if holders else member
        if op == "fetch":
            start = engine.next_fetch_offset()
            result = engine.acquire(member, [b for b in log if b.last_offset >= start], now=now,
                                    max_records=1 + pick % 40)
            if result.delta is not None:
                pipeline.record(leader, result.delta, Cause.ACQUIRED)
        elif op in ("ack", "mark"):
            _ack_or_mark(pipeline, leader, op, member, pick, now)
        elif op == "expire":
            now += pick % 1_500
            delta = engine.expire(now)
            if delta is not None:
                pipeline.record(leader, delta, Cause.LOCK_EXPIRED)
        elif op == "leave":
            delta = engine.release_member(member, now=now)
            if delta is not None:
                pipeline.record(leader, delta, Cause.MEMBER_RELEASED)
            if engine.last_member_release is not None and engine.last_member_release.delta is not None:
                pipeline.record(leader, engine.last_member_release.delta, Cause.STALE_RELEASED)
        elif op == "sweep":
            for release in engine.release_in_progress(now):
                if release.delta is not None:
                    pipeline.record(leader, release.delta, Cause.STALE_RELEASED)
        elif op == "dead-letter":
            for run in engine.archiving()[:1]:
                delta = engine.finish_archiving(run.first_offset, run.last_offset, dead_lettered=bool(pick & 1))
                if delta is not None:
                    pipeline.record(leader, delta, Cause.DEAD_LETTERED)
        if mode != "none":
            writer.mode = mode
            ok = await pipeline.write_once()
            writer.mode = "ok"
            if ok and leader.durable >= leader.version and not leader.staged:
                full = SharePartition.from_persisted(config, engine.snapshot())
                assert view(rebuild(writer.log, config)) == view(full)
                assert view(rebuild(compacted(writer.log), config)) == view(full)
                checked += 1
    event(f"updates written: {min(sum(share_state.decode_key(k)[0] is share_state.RecordType.SHARE_UPDATE for k, _ in writer.log), 5)}+")
    event(f"checks: {min(checked, 5)}+")
    event(f"writes built from changed ranges: {min(pipeline.narrowed, 5)}+")
    # Finally make everything durable and check once more.
    pipeline.touch(leader)
    assert await pipeline.write_once()
    full = SharePartition.from_persisted(config, engine.snapshot())
    assert view(rebuild(writer.log, config)) == view(full)
    assert view(rebuild(compacted(writer.log), config)) == view(full)
    assert writer.routes == {state_store.share_partition_route(KEY)}


def test_histories_do_write_updates():
    """The property above is not vacuous: a fragmented history writes updates, and they replay exactly."""
    config = PartitionConfig()

    async def history() -> Writer:
        writer = Writer()
        pipeline = CheckedPipeline(writer, "state", wall_clock=lambda: WALL, clock=lambda: 0, deltas=DeltaPolicy())
        leader = Leader(KEY, SharePartition(config, 0), create_timestamp=0)
        leader.engine.acquire("m", [BatchHeader(0, 199)], now=0, max_records=200)
        for offset in range(1, 200, 7):
            staged = leader.engine.stage_acknowledge("m", [AckRange(offset, offset, (TYPES[0],))], now=1)
            pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
            assert await pipeline.write_once()
        full = SharePartition.from_persisted(config, leader.engine.snapshot())
        assert view(rebuild(writer.log, config)) == view(full)
        assert view(rebuild(compacted(writer.log), config)) == view(full)
        # Built from the engine's changed ranges, not the whole window, after the first snapshot.
        assert pipeline.narrowed >= len(range(1, 200, 7)) - 2
        return writer

    writer = trio.run(history)
    kinds = [share_state.decode_key(key)[0] for key, _ in writer.log]
    assert kinds.count(share_state.RecordType.SHARE_UPDATE) > kinds.count(share_state.RecordType.SHARE_SNAPSHOT) >= 1


def _ack_or_mark(pipeline: CommitPipeline, leader: Leader, op: str, member: str, pick: int, now: int) -> None:
    """Acknowledge (staged, random types) or mark IN_PROGRESS a few or a random subset of what `member` holds."""
    engine = leader.engine
    held = [o for first, last, state, _, owner in engine.in_flight() if owner == member
            and state in (RecordState.ACQUIRED, RecordState.IN_PROGRESS) for o in range(first, last + 1)]
    if not held:
        return
    if pick & 1:  # a few records: the window changes a little (where updates pay)
        chosen = sorted({held[(pick >> shift) % len(held)] for shift in (1, 5, 9)[:1 + (pick >> 13) % 3]})
    else:  # a random subset
        chosen = [o for i, o in enumerate(held) if (pick >> (1 + i % 15)) & 1]
    if not chosen:
        return
    try:
        if op == "ack":
            staged = engine.stage_acknowledge(member, [AckRange(o, o, (TYPES[(pick + o) % 3],)) for o in chosen],
                                              now=now)
            if staged is not None:
                pipeline.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)
        else:
            delta = engine.mark_in_progress(member, [(o, o) for o in chosen], now=now)
            if delta is not None:
                pipeline.record(leader, delta, Cause.MARKED_IN_PROGRESS)
    except ShareStateError:
        pass  # e.g. a record over its max extension: refused, nothing changed
