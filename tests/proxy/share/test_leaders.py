"""The partition registry: one deadline heap, live group configs, idle share-partitions parked."""

from __future__ import annotations

import uuid

import trio

from proxy.share.coordinator import CoordinatorConfig, ShareGroupCoordinator
from proxy.share.leaders import Leader, PartitionRegistry
from proxy.share.partition import AckRange, BatchHeader, SharePartition
from proxy.share.states import AcknowledgeType

TOPIC = uuid.UUID(int=5)


def registry() -> PartitionRegistry:
    async def persist(leader: Leader) -> None:
        await trio.sleep(0)

    return PartitionRegistry(ShareGroupCoordinator(CoordinatorConfig()), cluster=None, clock=lambda: 0,
                             wall_clock=lambda: 0, persist_initial=persist)


def add(reg: PartitionRegistry, group: str, partition: int) -> Leader:
    key = (group, TOPIC, partition)
    return reg.add(Leader(key, SharePartition(reg.config_for(group), 0), create_timestamp=0))


def test_only_due_leaders_come_off_the_deadline_heap():
    reg = registry()
    leaders = [add(reg, "g", p) for p in range(100)]
    for i, leader in enumerate(leaders):
        leader.engine.acquire("m", [BatchHeader(0, 0)], now=i * 1000, max_records=10)
        reg.schedule(leader)
    lock_ms = leaders[0].engine.config.record_lock_duration_ms
    assert reg.next_deadline() == lock_ms
    due = reg.due(lock_ms + 2_500)
    assert [leader.key[2] for leader in due] == [0, 1, 2]
    assert reg.next_deadline() == lock_ms + 3_000


def test_a_group_config_change_reaches_an_engine_already_in_flight():
    reg = registry()
    leader = add(reg, "g", 0)
    leader.engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=10)
    reg.coordinator.set_group_config("g", {"share.delivery.count.limit": "2",
                                           "share.record.lock.duration.ms": "20000"})
    reg.refresh_config(leader)
    assert leader.engine.config.delivery_count_limit == 2
    leader.engine.expire(10**9)  # first delivery expired: Available, count 1
    leader.engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=10)
    assert leader.engine.next_deadline() == 20_000  # the new lock duration
    leader.engine.expire(10**9)  # second delivery expires at the new limit of 2: archived
    assert leader.engine.start_offset == 10


def test_idle_share_partitions_of_memberless_groups_are_parked_and_come_back():
    reg = registry()
    busy = add(reg, "g", 0)
    idle = add(reg, "g", 1)
    busy.engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=10)
    idle.engine.acquire("m", [BatchHeader(0, 9)], now=0, max_records=10)
    idle.engine.acknowledge("m", [AckRange(0, 9, (int(AcknowledgeType.ACCEPT),))], now=0)
    assert idle.engine.in_flight_count == 0 and idle.engine.start_offset == 10

    quiet = add(reg, "quiet", 0)  # a group whose only share-partition is parked
    assert reg.park_idle(["g", "quiet"]) == 2
    assert reg.active(idle.key) is None and reg.active(busy.key) is busy and reg.active(quiet.key) is None
    assert (reg.group_ids(), reg.active_group_ids()) == ({"g", "quiet"}, ["g"])
    back = reg.get(idle.key)  # brought back from its parked SPSO and epochs
    assert back is not None and back is not idle and back.engine.start_offset == 10


async def test_a_share_partition_whose_initial_write_fails_is_never_served_nor_written_again():
    """ensure() raises, registers nothing, and marks the engine removed, so the commit pipeline drops
    it instead of retrying its initial write forever (and failing every write batched with it)."""
    import pytest

    from proxy.share.cluster import PartitionInfo, TopicInfo
    from proxy.share.persister import PersistError

    created: list[Leader] = []

    async def persist(leader: Leader) -> None:
        created.append(leader)
        raise PersistError("state partition not owned by this instance")

    class Cluster:
        def topic_by_id(self, topic_id):
            return TopicInfo("orders", TOPIC, {0: PartitionInfo(leader_id=1, leader_epoch=0)})

        async def list_offset(self, topic, partition, timestamp):
            return 0

    reg = PartitionRegistry(ShareGroupCoordinator(CoordinatorConfig()), cluster=Cluster(), clock=lambda: 0,
                            wall_clock=lambda: 0, persist_initial=persist)
    with pytest.raises(PersistError):
        await reg.ensure(("g", TOPIC, 0))
    assert reg.get(("g", TOPIC, 0)) is None
    assert [leader.removed for leader in created] == [True]
