"""State layout 2 and the migration to it (proxy/share/state_layout.py, state_store placement).

A fake state topic places records exactly as the writer and librdkafka do (route_partition of the
route, of the key when unrouted, or the explicit partition) and replays them partition by
partition, so a layout-1 topic is built the way an earlier proxy wrote it, migrated, and replayed.
"""

from __future__ import annotations

import uuid

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codec import share_state as records
from codec.errors import StateRecordError
from proxy.share import state_layout, state_store
from proxy.share.partition import PartitionSnapshot, PersistedBatch
from proxy.share.persister import PersistError, ReplayedRecord, route_partition
from proxy.share.states import RecordState
from tests.proxy.share.test_state_store_replay import group_record, share_record

TOPIC = uuid.UUID(int=7)
OTHER = uuid.UUID(int=8)


class FakeStateTopic:
    """A state topic of `partitions` partitions: records land where the writer would put them."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.logs: list[list[tuple[bytes, bytes | None]]] = [[] for _ in range(partitions)]
        self.fail_after: int | None = None  # writes allowed before PersistError (a crash mid-migration)

    def place(self, record: tuple) -> int:
        if len(record) == 3:
            route = record[2]
            return route if isinstance(route, int) else route_partition(route, self.partitions)
        return route_partition(record[0], self.partitions)  # librdkafka's partitioner on the key

    async def write(self, topic: str, batch: list[tuple]) -> None:
        if self.fail_after is not None:
            if self.fail_after == 0:
                raise PersistError("broker gone")
            self.fail_after -= 1
        for record in batch:
            self.logs[self.place(record)].append((record[0], record[1]))

    def replay(self, order: list[int] | None = None) -> list[ReplayedRecord]:
        return [ReplayedRecord(p, offset, key, value)
                for p in (order if order is not None else range(self.partitions))
                for offset, (key, value) in enumerate(self.logs[p])]


def layout1_place(record: tuple[bytes, bytes | None]) -> tuple:
    """How a layout-1 proxy routed `record`: a share-partition's records by its snapshot key, group
    records (and keys that do not decode) by the partitioner on their own key."""
    try:
        kind, key = records.decode_key(record[0])
    except StateRecordError:
        return record[:2]
    if kind in (records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE):
        pkey = (key.group_id, key.topic_id, int(key.partition))
        return (*record[:2], state_store.layout1_share_partition_route(pkey))
    return record[:2]


def snapshot(key, start, batches, epoch=1):
    return state_store.snapshot_record(key, PartitionSnapshot(start, tuple(batches)), snapshot_epoch=epoch,
                                       state_epoch=0, create_timestamp=1, write_timestamp=2, clock_offset_ms=0)


def layout1_topic(partitions: int = 5) -> FakeStateTopic:
    """Two groups on two topic-partitions, configs, a deleted share-partition, as layout 1 left them."""
    topic = FakeStateTopic(partitions)
    history = []
    for group in ("orders", "audit"):
        history += [state_store.group_metadata_record(group, 3, 1_000)[:2],
                    state_store.group_partitions_record(group, [(TOPIC, 0), (TOPIC, 1)], {})[:2]]
        for p in (0, 1):
            key = (group, TOPIC, p)
            history.append(snapshot(key, 10, [PersistedBatch(10, 14, RecordState.ACKNOWLEDGED, 1),
                                              PersistedBatch(15, 16, RecordState.AVAILABLE, 2)]))
            history.append(state_store.update_record(key, state_store.StateDelta(-1, (
                PersistedBatch(15, 15, RecordState.ACKNOWLEDGED, 2),)), snapshot_epoch=1, clock_offset_ms=0))
    history.append(state_store.group_config_record("orders", {"share.delivery.count.limit": "3"})[:2])
    gone = ("audit", OTHER, 0)
    history += [snapshot(gone, 0, []), state_store.partition_tombstone(gone)]
    for record in history:
        topic.logs[topic.place(layout1_place(record))].append(record)
    return topic


def same_state(a: state_store.RecoveredState, b: state_store.RecoveredState) -> bool:
    return a.partitions == b.partitions and a.groups == b.groups


def test_a_share_partition_is_homed_by_topic_and_partition_whatever_its_group():
    homes = {route_partition(state_store.share_partition_route((g, TOPIC, 3)), 12) for g in ("a", "b", "c", "d")}
    assert len(homes) == 1
    assert state_store.share_partition_route(("a", TOPIC, 3)) != state_store.share_partition_route(("a", TOPIC, 4))
    # Both of a share-partition's tombstones and all three of a group's records travel to one home.
    assert {route for *_, route in state_store.partition_tombstones(("a", TOPIC, 3))} == {
        state_store.share_partition_route(("b", TOPIC, 3))}
    routes = {state_store.group_metadata_record("g", 1, 0)[2], state_store.group_partitions_record("g", [], {})[2],
              state_store.group_config_record("g", {})[2]} | {r for *_, r in state_store.group_tombstones("g")}
    assert routes == {state_store.group_route("g")}


def test_a_layout1_topic_replays_as_before_and_plans_copies_tombstones_and_the_marker():
    topic = layout1_topic()
    legacy = state_store.recover([(r.key, r.value) for r in topic.replay()], clock_offset_ms=0)
    placed = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions)
    assert same_state(placed, legacy)
    assert set(placed.partitions) == {(g, TOPIC, p) for g in ("orders", "audit") for p in (0, 1)}
    assert placed.partitions[("orders", TOPIC, 0)].updates  # the update came along with its snapshot
    assert placed.groups["orders"].configs == {"share.delivery.count.limit": "3"}
    assert placed.layout is None and placed.needs_migration(topic.partitions)
    assert placed.migration.copies and placed.migration.tombstones
    # A share-partition's snapshot is copied before its update (an update read before its snapshot
    # is dropped).
    copied = [records.decode_key(key) for key, _, _ in placed.migration.copies]
    for kind, key in copied:
        if kind is records.RecordType.SHARE_UPDATE:
            snapshot_at = copied.index((records.RecordType.SHARE_SNAPSHOT, records.ShareSnapshotKey(
                group_id=key.group_id, topic_id=key.topic_id, partition=key.partition)))
            assert snapshot_at < copied.index((kind, key))
    # Only live records off their home are tombstoned, on the partition they sit on.
    for key, partition in placed.migration.tombstones:
        assert partition != topic.place((key, None, _home_route(key)))
        assert [value for k, value in topic.logs[partition] if k == key][-1] is not None


async def test_migration_puts_every_live_record_at_home_and_the_state_survives_it():
    topic = layout1_topic()
    before = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions)
    outcome = await state_layout.migrate(topic, "__state", before, topic.partitions)
    assert (outcome.copied, outcome.tombstoned) == (len(before.migration.copies), len(before.migration.tombstones))

    after = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions)
    assert same_state(after, before)
    assert after.layout == state_store.LayoutMarker(2, topic.partitions)
    assert not after.needs_migration(topic.partitions)
    # An instance that reads only home records (scale-out) restores the same: nothing live is elsewhere.
    strict = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions,
                                 skip_misplaced=True)
    assert same_state(strict, before)
    assert strict.misplaced > 0  # the old copies and their tombstones, until compaction removes them
    # Reading the partitions in any order restores the same.
    assert same_state(state_store.recover(topic.replay(order=[4, 2, 0, 3, 1]), clock_offset_ms=0,
                                          partitions=topic.partitions), before)


@pytest.mark.parametrize("writes_before_crash", [0, 1, 2])
async def test_a_migration_cut_short_is_finished_by_the_next_start(writes_before_crash):
    topic = layout1_topic()
    before = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions)
    topic.fail_after = writes_before_crash  # copies, tombstones, marker: three writes
    with pytest.raises(PersistError):
        await state_layout.migrate(topic, "__state", before, topic.partitions)
    topic.fail_after = None

    restarted = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions)
    assert same_state(restarted, before)
    assert restarted.needs_migration(topic.partitions)
    if writes_before_crash >= 1:
        assert not restarted.migration.copies  # every home copy already wins
    if writes_before_crash == 2:
        assert not restarted.migration  # only the marker is missing
    await state_layout.migrate(topic, "__state", restarted, topic.partitions)
    done = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=topic.partitions)
    assert same_state(done, before) and not done.needs_migration(topic.partitions)


async def test_a_new_topic_gets_only_the_marker_and_a_grown_topic_is_rehomed():
    empty = FakeStateTopic(3)
    fresh = state_store.recover(empty.replay(), partitions=3)
    assert fresh.needs_migration(3) and not fresh.migration
    await state_layout.migrate(empty, "__state", fresh, 3)
    assert [len(log) for log in empty.logs] == [1, 0, 0]  # the marker, on partition 0

    topic = layout1_topic(partitions=3)
    await state_layout.migrate(topic, "__state", state_store.recover(topic.replay(), partitions=3), 3)
    before = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=3)
    assert not before.needs_migration(3)
    topic.partitions = 7  # partitions added on the cluster: homes move, the marker names 3
    topic.logs += [[] for _ in range(4)]
    grown = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=7)
    assert same_state(grown, before)
    assert grown.needs_migration(7) and grown.migration.copies
    await state_layout.migrate(topic, "__state", grown, 7)
    after = state_store.recover(topic.replay(), clock_offset_ms=0, partitions=7, skip_misplaced=True)
    assert same_state(after, before) and after.layout == state_store.LayoutMarker(2, 7)


def test_across_partitions_the_newest_snapshot_wins_and_a_tombstone_clears_only_its_own_partition():
    key = ("orders", TOPIC, 0)
    topic = FakeStateTopic(5)
    home = topic.place((b"", None, state_store.share_partition_route(key)))
    old, older = (home + 1) % 5, (home + 2) % 5
    topic.logs[home] += [state_store.group_metadata_record("orders", 1, 0)[:2], snapshot(key, 0, [], epoch=3)]
    topic.logs[old] += [snapshot(key, 7, [], epoch=4)]  # newer than home: a copy not yet made
    # An earlier placement's copy, deleted there: it must not take the share-partition down.
    topic.logs[older] += [snapshot(key, 1, [], epoch=5), state_store.partition_tombstone(key)]
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0]):
        recovered = state_store.recover(topic.replay(order), partitions=5)
        assert recovered.partitions[key].snapshot.start_offset == 7
        assert [k for k, _, _ in recovered.migration.copies] == [snapshot(key, 0, [])[0]]
        assert recovered.migration.tombstones == [(snapshot(key, 0, [])[0], old)]
    # On a tie (a migration's copy is identical) the home copy stands and nothing is copied again.
    topic.logs[home].append(snapshot(key, 7, [], epoch=4))
    recovered = state_store.recover(topic.replay(), partitions=5)
    assert recovered.partitions[key].snapshot.start_offset == 7
    assert not recovered.migration.copies and recovered.migration.tombstones == [(snapshot(key, 0, [])[0], old)]


def test_skipping_misplaced_records_counts_them():
    topic = layout1_topic()
    strict = state_store.recover(topic.replay(), partitions=topic.partitions, skip_misplaced=True)
    placed = [1 for p in range(topic.partitions) for key, value in topic.logs[p]
              if topic.place((key, value, _home_route(key))) != p]
    assert strict.misplaced == len(placed) > 0


def _home_route(key_bytes: bytes) -> bytes:
    kind, key = records.decode_key(key_bytes)
    if kind in (records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE):
        return state_store.share_partition_route((key.group_id, key.topic_id, int(key.partition)))
    return state_store.group_route(key.group_id)


# ----- generated histories: placement never changes what replay restores ---------------------------

@st.composite
def layout1_topics(draw):
    partitions = draw(st.integers(1, 6))
    topic = FakeStateTopic(partitions)
    for _ in range(draw(st.integers(1, 30))):
        record = draw(st.one_of(share_record(), share_record(), group_record()))
        topic.logs[topic.place(layout1_place(record))].append(record)
    return topic, draw(st.permutations(range(partitions)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout1_topics())
def test_any_layout1_topic_in_any_partition_order_restores_the_same_before_and_after_migration(case):
    topic, order = case
    legacy = state_store.recover([(r.key, r.value) for r in topic.replay()], clock_offset_ms=0)
    placed = state_store.recover(topic.replay(order), clock_offset_ms=0, partitions=topic.partitions)
    assert same_state(placed, legacy) and placed.skipped == legacy.skipped
    trio.run(state_layout.migrate, topic, "__state", placed, topic.partitions)
    migrated = state_store.recover(topic.replay(order), clock_offset_ms=0, partitions=topic.partitions)
    assert same_state(migrated, legacy)
    assert not migrated.needs_migration(topic.partitions)
    strict = state_store.recover(topic.replay(order), clock_offset_ms=0, partitions=topic.partitions,
                                 skip_misplaced=True)
    assert same_state(strict, legacy)


def test_an_instance_reading_only_its_partitions_keeps_share_partitions_of_groups_homed_elsewhere():
    """Scale-out: a group's records sit on its own home partition, which the leader of its
    share-partitions may not own; the share-partition must survive that instance's replay."""
    topic = FakeStateTopic(5)
    home = topic.place((b"", None, state_store.share_partition_route(("", TOPIC, 0))))
    group = next(g for g in (f"group-{i}" for i in range(100))
                 if topic.place((b"", None, state_store.group_route(g))) != home)
    group_home = topic.place((b"", None, state_store.group_route(group)))
    key = (group, TOPIC, 0)
    topic.logs[home].append(snapshot(key, 7, []))
    topic.logs[group_home].append(state_store.group_metadata_record(group, 1, 0)[:2])
    only_home = [r for r in topic.replay() if r.partition == home]
    assert key not in state_store.recover(only_home, partitions=5, skip_misplaced=True).partitions
    kept = state_store.recover(only_home, partitions=5, skip_misplaced=True, groups_complete=False)
    assert kept.partitions[key].snapshot.start_offset == 7
    # A tombstoned group seen in the same read still takes its share-partitions down.
    deleted = topic.replay() + [ReplayedRecord(group_home, 99, *state_store.group_tombstones(group)[0][:2])]
    assert key not in state_store.recover(deleted, partitions=5, skip_misplaced=True,
                                          groups_complete=False).partitions
