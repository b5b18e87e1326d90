"""Share-group metrics: event counts from real engine deltas, gauges computed at scrape time."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from proxy.share.commit import Cause, Change
from proxy.share.coordinator import GroupState
from proxy.share.observe import ShareCollector, ShareEventCounts, partition_view
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, SharePartition
from proxy.share.states import AcknowledgeType

TOPIC_ID = uuid.uuid4()
KEY = ("orders-group", TOPIC_ID, 0)
ACCEPT, RELEASE, REJECT, RENEW = (int(t) for t in (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                                                   AcknowledgeType.REJECT, AcknowledgeType.RENEW))


def engine_with(records: int, *, limit: int = 2, start: int = 0) -> SharePartition:
    return SharePartition(PartitionConfig(delivery_count_limit=limit), start)


def acquire(engine: SharePartition, first: int, last: int, now: int = 0):
    return engine.acquire("m1", [BatchHeader(first, last)], now=now, max_records=1000)


def test_acquisitions_and_the_delivery_count_histogram():
    events = ShareEventCounts()
    engine = engine_with(10)
    events.acquired(KEY, acquire(engine, 0, 9).acquired)
    engine.acknowledge("m1", [AckRange(0, 3, (RELEASE,))], now=1)
    events.acquired(KEY, acquire(engine, 0, 9, now=2).acquired)  # 0-3 for the second time
    counts = events.groups["orders-group"]
    assert counts.acquired == 14
    assert counts.delivery_counts[1:3] == [10, 4]
    assert events.partitions == {}  # per-partition counting is off


def test_acknowledgements_by_type_and_archiving_by_reason_from_a_real_delta():
    events = ShareEventCounts(per_partition=True)
    engine = engine_with(10, limit=2)
    acquire(engine, 0, 9)
    engine.acknowledge("m1", [AckRange(5, 9, (RELEASE,))], now=1)
    acquire(engine, 5, 9, now=2)  # 5-9 on their second (and last) delivery
    ranges = [AckRange(0, 3, (ACCEPT,)), AckRange(4, 4, (REJECT,)),
              AckRange(5, 9, (RELEASE, RELEASE, ACCEPT, RENEW, ACCEPT))]
    staged = engine.stage_acknowledge("m1", ranges, now=3)
    events.acknowledged(KEY, ranges, staged.delta)
    for counts in (events.groups["orders-group"], events.partitions[KEY]):
        assert counts.acknowledged == {"accept": 6, "reject": 1, "release": 2, "renew": 1}
        # 4 rejected; 5 and 6 released at the delivery limit of 2 are archived too.
        assert counts.archived == {"rejected": 1, "delivery_limit": 2}


def test_lock_expiry_and_member_release_from_the_change_hook():
    events = ShareEventCounts()
    engine = engine_with(10, limit=2)
    acquire(engine, 0, 4, now=0)
    engine.acknowledge("m1", [AckRange(0, 1, (RELEASE,))], now=1)
    acquire(engine, 0, 1, now=2)  # 0-1 second delivery, 2-4 still on their first
    expired = engine.expire(now=10**9)
    events.on_change(Change(KEY, Cause.LOCK_EXPIRED, expired))
    counts = events.groups["orders-group"]
    assert counts.lock_expired == 5
    assert counts.archived == {"delivery_limit": 2}  # 0-1 ran out of deliveries
    acquire(engine, 2, 9, now=10**9)
    events.on_change(Change(KEY, Cause.MEMBER_RELEASED, engine.release_member("m1")))
    assert counts.member_released == 8
    events.on_change(Change(KEY, Cause.COMMITTED, None))  # nothing to count, nothing breaks


def test_partition_view_in_flight_by_state_and_lag():
    engine = engine_with(10, start=100)
    acquire(engine, 100, 109)
    engine.acknowledge("m1", [AckRange(102, 103, (ACCEPT,)), AckRange(104, 104, (RELEASE,)),
                              AckRange(105, 105, (REJECT,))], now=1)
    view = partition_view(KEY, "orders", engine, high_watermark=120)
    assert view.start_offset == 100
    assert view.in_flight == {"available": 1, "acquired": 6, "acknowledged": 2, "archived": 1, "in_progress": 0}
    # Kafka's lag: end offset - SPSO - delivery-complete records above SPSO = 120 - 100 - 3.
    assert view.lag == 17
    assert partition_view(KEY, "orders", engine, high_watermark=-1).lag == -1  # never read: unknown


@dataclass
class FakeLeader:
    key: tuple
    engine: SharePartition
    high_watermark: int = -1


@dataclass
class FakeRegistry:
    leaders: dict = field(default_factory=dict)

    def values(self):
        return iter(list(self.leaders.values()))

    def keys(self):
        return set(self.leaders)


class FakeCoordinator:
    def __init__(self, members: dict[str, int]) -> None:
        self.members = members

    def group_ids(self):
        return sorted(self.members)

    def list_groups(self):
        return [(g, GroupState.STABLE if n else GroupState.EMPTY) for g, n in sorted(self.members.items())]

    def member_count(self, group_id):
        return self.members.get(group_id, 0)


def scrape(collector: ShareCollector) -> dict:
    registry = CollectorRegistry()
    registry.register(collector)
    return {(s.name, frozenset(s.labels.items())): s.value for f in registry.collect() for s in f.samples}


def make_service(members: dict[str, int], leaders: list[FakeLeader]):
    return SimpleNamespace(
        coordinator=FakeCoordinator(members), leaders=FakeRegistry({leader.key: leader for leader in leaders}),
        sessions=[1, 2, 3], cluster=SimpleNamespace(topic_by_id=lambda tid: SimpleNamespace(name="orders")),
    )


def test_collector_series_per_group_per_partition_with_the_switch_and_removal_of_deleted_groups():
    engine = engine_with(10)
    events = ShareEventCounts()
    events.acquired(KEY, acquire(engine, 0, 4).acquired)
    other_key = ("other-group", TOPIC_ID, 0)
    other = engine_with(10)
    events.acquired(other_key, acquire(other, 0, 1).acquired)
    service = make_service({"orders-group": 2, "other-group": 0},
                           [FakeLeader(KEY, engine, 8), FakeLeader(other_key, other)])
    samples = scrape(ShareCollector(service, events))
    group = frozenset({("group", "orders-group")})
    assert samples[("ksp_share_group_records_acquired_total", group)] == 5
    assert samples[("ksp_share_group_in_flight_records", group | {("state", "acquired")})] == 5
    assert samples[("ksp_share_group_lag_records", group)] == 8
    assert samples[("ksp_share_group_members", group)] == 2
    assert samples[("ksp_share_groups", frozenset({("state", "Stable")}))] == 1
    assert samples[("ksp_share_groups", frozenset({("state", "Empty")}))] == 1
    assert samples[("ksp_share_sessions", frozenset())] == 3
    assert samples[("ksp_share_group_delivery_count_bucket", group | {("le", "1.0")})] == 5
    assert not any(name.startswith("ksp_share_partition_") for name, _ in samples)

    events.per_partition = True
    events.acquired(KEY, acquire(engine, 5, 9).acquired)
    samples = scrape(ShareCollector(service, events))
    partition = group | {("topic", "orders"), ("partition", "0")}
    assert samples[("ksp_share_partition_start_offset", partition)] == 0
    assert samples[("ksp_share_partition_lag_records", partition)] == 8
    assert samples[("ksp_share_partition_records_acquired_total", partition)] == 5  # counted since the switch

    # The other group is deleted: its series go at the next scrape.
    service.coordinator.members.pop("other-group")
    service.leaders.leaders.pop(other_key)
    samples = scrape(ShareCollector(service, events))
    assert not any(("group", "other-group") in labels for _, labels in samples)
    assert "other-group" not in events.groups
