"""GroupAdmin on a ShareService with the fake cluster and state writer of test_manager (virtual time)."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from codec import share_state
from proxy.share import state_store
from proxy.share.coordinator import GroupState
from proxy.share.group_admin import (
    ZERO_UUID,
    GroupAdmin,
    PartitionOffset,
    delivery_complete_count,
    share_group_listed,
    share_lag,
)
from proxy.share.partition import PartitionSnapshot, PersistedBatch
from proxy.share.states import RecordState
from tests.proxy.share.test_manager import ACCEPT, GROUP, TOPIC_ID, TP, acquired, start_service

# ----- pure rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "states", "types", "listed"), [
    (GroupState.STABLE, (), (), True),
    (GroupState.STABLE, (" stable ",), (), True),
    (GroupState.EMPTY, ("EMPTY",), ("SHARE",), True),
    (GroupState.EMPTY, ("Stable",), (), False),
    (GroupState.STABLE, (), ("consumer",), False),
    (GroupState.STABLE, (), ("nonsense",), False),  # parses to "unknown", which no group has
    (GroupState.STABLE, (), ("consumer", "Share"), True),
])
def test_share_group_listed_follows_kafkas_filters(state, states, types, listed):
    assert share_group_listed(state, states, types) is listed


def test_delivery_complete_count_counts_acknowledged_and_archived_above_the_start():
    snapshot = PartitionSnapshot(10, (
        PersistedBatch(10, 11, RecordState.AVAILABLE, 1),
        PersistedBatch(12, 14, RecordState.ACKNOWLEDGED, 1),
        PersistedBatch(15, 15, RecordState.ARCHIVED, 5),
        PersistedBatch(16, 19, RecordState.AVAILABLE, 2),
    ))
    assert delivery_complete_count(snapshot) == 4


def test_share_lag_is_end_minus_start_minus_done_or_minus_one():
    assert share_lag(20, 10, 4) == 6
    assert share_lag(None, 10, 4) == -1
    assert share_lag(20, -1, 0) == -1


# ----- operations -------------------------------------------------------------------------------


async def harness_with_admin(nursery):
    harness = await start_service(nursery)
    return harness, GroupAdmin(harness.service, write_timeout_s=5)


async def test_describe_offsets_reports_spso_and_lag_from_the_engine(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    harness.cluster.append([b"a", b"b", b"c", b"d"])
    member = harness.member("m")
    assert acquired(await harness.fetch(member)) == [(0, 3, 1)]
    await harness.acknowledge(member, [(TP, 1, 2, ACCEPT)])  # 0 and 3 still acquired
    harness.cluster.append([b"e"])

    offsets = await admin.describe_offsets(GROUP, None)

    assert offsets.error is ErrorCode.none
    (topic,) = offsets.topics
    assert (topic.name, topic.topic_id) == ("orders", TOPIC_ID)
    # end 5 - start 0 - 2 acknowledged above it
    assert topic.partitions == (PartitionOffset(0, start_offset=0, leader_epoch=0, lag=3),)
    v0 = await admin.describe_offsets(GROUP, None, with_lag=False)
    assert v0.topics[0].partitions == (PartitionOffset(0, start_offset=0, leader_epoch=0, lag=-1),)


async def test_describe_offsets_of_unknown_group_topic_and_partition(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    assert (await admin.describe_offsets("nobody", None)).topics == ()
    named = await admin.describe_offsets("nobody", [("orders", [0]), ("missing", [2])])
    assert [(t.name, t.topic_id, t.partitions) for t in named.topics] == [
        ("orders", TOPIC_ID, (PartitionOffset(0),)),
        ("missing", ZERO_UUID, (PartitionOffset(2),)),
    ]


async def test_alter_offsets_refuses_a_group_with_members(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    await harness.join(harness.member("m"))
    outcome = await admin.alter_offsets(GROUP, [("orders", [(0, 0)])])
    assert (outcome.error, outcome.topics) == (ErrorCode.non_empty_group, ())


async def test_alter_offsets_creates_the_group_and_writes_the_state_durably(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    for _ in range(3):
        harness.cluster.append([b"x", b"y"])

    outcome = await admin.alter_offsets("fresh", [("orders", [(0, 4), (3, 0)]), ("missing", [(0, 1)])])

    assert outcome.error is ErrorCode.none
    assert [(t.name, [(p.partition, p.error) for p in t.partitions]) for t in outcome.topics] == [
        ("orders", [(0, ErrorCode.none), (3, ErrorCode.unknown_topic_or_partition)]),
        ("missing", [(0, ErrorCode.unknown_topic_or_partition)]),
    ]
    assert harness.service.coordinator.group_state("fresh") is GroupState.EMPTY
    assert harness.service.coordinator.initialized_partitions("fresh") == {TP}
    # Durable before the answer: a restart rebuilds the group and its SPSO.
    recovered = state_store.recover(harness.writer.replayed())
    assert "fresh" in recovered.groups
    assert recovered.partitions[("fresh", TOPIC_ID, 0)].snapshot.start_offset == 4
    offsets = await admin.describe_offsets("fresh", None)
    assert offsets.topics[0].partitions == (PartitionOffset(0, start_offset=4, leader_epoch=0, lag=2),)


async def test_alter_offsets_discards_in_flight_state_and_moves_the_state_epoch(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    harness.cluster.append([b"a", b"b", b"c"])
    member = harness.member("m")
    await harness.fetch(member)
    await harness.acknowledge(member, [(TP, 1, 1, ACCEPT)])
    member.closed.set()  # the connection goes; leaving makes the group empty
    await harness.service.heartbeat(_leave(member.member_id), client_id="t", client_host="")
    leader = harness.service.leaders.get((GROUP, *TP))
    epoch = leader.state_epoch

    outcome = await admin.alter_offsets(GROUP, [("orders", [(0, 0)])])

    assert outcome.error is ErrorCode.none
    leader = harness.service.leaders.get((GROUP, *TP))
    assert leader.state_epoch == epoch + 1
    assert leader.engine.start_offset == 0 and leader.engine.in_flight_count == 0
    assert (await admin.describe_offsets(GROUP, None)).topics[0].partitions[0].lag == 3


async def test_delete_offsets_forgets_the_topic_and_tombstones_it(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    assert (await admin.delete_offsets(GROUP, ["orders"])).error is ErrorCode.group_id_not_found
    await admin.alter_offsets(GROUP, [("orders", [(0, 0)])])

    outcome = await admin.delete_offsets(GROUP, ["orders", "missing"])

    assert outcome.error is ErrorCode.none
    assert [(t.name, t.error) for t in outcome.topics] == [
        ("orders", ErrorCode.none), ("missing", ErrorCode.unknown_topic_or_partition)]
    assert harness.service.coordinator.initialized_partitions(GROUP) == frozenset()
    assert harness.service.leaders.get((GROUP, *TP)) is None
    assert (GROUP, TOPIC_ID, 0) not in state_store.recover(harness.writer.replayed()).partitions
    assert_both_keys_tombstoned_on_the_snapshot_partition(harness.writer, (GROUP, TOPIC_ID, 0))
    again = await admin.delete_offsets(GROUP, ["orders"])
    assert [(t.error, t.message) for t in again.topics] == [
        (ErrorCode.unknown_topic_or_partition, "There is no offset information to delete.")]


async def test_delete_group_refuses_members_and_tombstones_an_empty_group(nursery, autojump_clock):
    harness, admin = await harness_with_admin(nursery)
    member = harness.member("m")
    await harness.join(member)
    assert await admin.delete_group(GROUP) == (ErrorCode.non_empty_group, "The group is not empty.")
    await harness.service.heartbeat(_leave(member.member_id), client_id="t", client_host="")
    await admin.alter_offsets(GROUP, [("orders", [(0, 0)])])

    assert await admin.delete_group(GROUP) == (ErrorCode.none, None)

    assert not admin.is_share_group(GROUP)
    recovered = state_store.recover(harness.writer.replayed())
    assert GROUP not in recovered.groups and not recovered.partitions
    assert_both_keys_tombstoned_on_the_snapshot_partition(harness.writer, (GROUP, TOPIC_ID, 0))
    assert await admin.delete_group(GROUP) == (ErrorCode.group_id_not_found, f"Group {GROUP} not found.")


def assert_both_keys_tombstoned_on_the_snapshot_partition(writer, key) -> None:
    """The snapshot key and the update key (--state-deltas) are tombstoned, routed by the snapshot key."""
    route = state_store.share_partition_route(key)
    tombstones = {}
    for write, routes in zip(writer.writes, writer.routes):
        for (record_key, value), record_route in zip(write, routes):
            if value is None and record_route == route:
                tombstones[share_state.decode_key(record_key)[0]] = record_key
    assert set(tombstones) == {share_state.RecordType.SHARE_SNAPSHOT, share_state.RecordType.SHARE_UPDATE}


def _leave(member_id: str):
    from kio.index import load_request_schema

    return load_request_schema(76, 1)(group_id=GROUP, member_id=member_id, member_epoch=-1, rack_id=None,
                                      subscribed_topic_names=None)


def test_zero_uuid_is_kafkas():
    assert ZERO_UUID == uuid.UUID("00000000-0000-0000-0000-000000000000")
