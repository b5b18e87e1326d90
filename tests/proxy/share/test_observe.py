"""Share-group metrics: event counts from real engine deltas, gauges computed at scrape time."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import trio
from prometheus_client import CollectorRegistry

from proxy.metrics import SCRAPE_PREPARERS
from proxy.share import observe
from proxy.share.commit import Cause, Change
from proxy.share.coordinator import GroupState
from proxy.share.observe import (
    EVENTS,
    IN_PROGRESS_DURATION_BUCKETS,
    ShareCollector,
    ShareEventCounts,
    in_progress_drain,
    partition_view,
)
from proxy.share.partition import AckRange, BatchHeader, PartitionConfig, SharePartition
from proxy.share.states import AcknowledgeType
from proxy.timeslice import TimeSlices

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


def test_with_a_dead_letter_queue_archiving_is_counted_once_not_again_when_dead_lettered():
    events = ShareEventCounts()
    engine = SharePartition(PartitionConfig(delivery_count_limit=2, dead_letter=True), 0)
    acquire(engine, 0, 4)
    engine.acknowledge("m1", [AckRange(0, 1, (RELEASE,))], now=1)
    acquire(engine, 0, 1, now=2)  # 0-1 on their last delivery
    ranges = [AckRange(0, 1, (RELEASE,)), AckRange(2, 2, (REJECT,))]
    staged = engine.stage_acknowledge("m1", ranges, now=3)
    events.acknowledged(KEY, ranges, staged.delta)
    engine.commit(staged.change_id)
    expired = engine.expire(now=10**9)  # 3-4: first delivery, released, not archived
    events.on_change(Change(KEY, Cause.LOCK_EXPIRED, expired))
    counts = events.groups["orders-group"]
    assert counts.archived == {"rejected": 1, "delivery_limit": 2}
    events.on_change(Change(KEY, Cause.DEAD_LETTERED, engine.finish_archiving(0, 2, dead_lettered=True)))
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
    assert view.in_flight == {"available": 1, "acquired": 6, "acknowledged": 2, "archiving": 0, "archived": 1,
                              "in_progress": 0}
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

    def group_ids(self):
        return {key[0] for key in self.leaders}


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
        clock=lambda: 0,
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


async def test_a_prepared_scrape_reads_in_slices_reports_what_read_reports_and_drops_leaders_removed_meanwhile():
    events = ShareEventCounts(per_partition=True)
    leaders = []
    for partition in range(6):
        key = ("orders-group", TOPIC_ID, partition)
        engine = engine_with(10)
        events.acquired(key, acquire(engine, 0, partition).acquired)
        leaders.append(FakeLeader(key, engine, 20))
    service = make_service({"orders-group": 1}, leaders)
    collector = ShareCollector(service, events)
    expected = scrape(collector)  # read in one go
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            if turns == 3:  # a share-partition goes away while the scrape reads
                service.leaders.leaders.pop(("orders-group", TOPIC_ID, 5))
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.sleep(0)
        before = turns
        await collector.prepare(TimeSlices(0))  # a pause after every share-partition
        during = turns - before
        nursery.cancel_scope.cancel()
    prepared = scrape(collector)  # formats what prepare read
    assert during >= 5
    gone = frozenset({("group", "orders-group"), ("topic", "orders"), ("partition", "5")})
    assert ("ksp_share_partition_start_offset", gone) in expected
    assert not any(labels == gone for _, labels in prepared)
    assert prepared[("ksp_share_group_partitions", frozenset({("group", "orders-group")}))] == 5
    # A reading is used once; the next scrapes read in one go: after the removal, the same values.
    assert scrape(collector) == prepared
    leaders[0].high_watermark += 100
    lag = ("ksp_share_group_lag_records", frozenset({("group", "orders-group")}))
    assert scrape(collector)[lag] == prepared[lag] + 100


# ----- IN_PROGRESS ----------------------------------------------------------------------------

IN_PROGRESS_CONFIG = dict(delivery_count_limit=2, in_progress_staleness_threshold_ms=10_000,
                          in_progress_max_lock_extension_ms=60_000, in_progress_rebalance_grace_ms=5_000)


def in_progress_engine() -> SharePartition:
    return SharePartition(PartitionConfig(**IN_PROGRESS_CONFIG), 0)


def test_marks_are_counted_from_the_change_hook():
    events = ShareEventCounts(per_partition=True)
    engine = in_progress_engine()
    acquire(engine, 0, 9)
    events.on_change(Change(KEY, Cause.MARKED_IN_PROGRESS, engine.mark_in_progress("m1", [(0, 3)], now=1)))
    events.on_change(Change(KEY, Cause.MARKED_IN_PROGRESS, engine.mark_in_progress("m1", [(0, 1), (6, 6)], now=2)))
    for counts in (events.groups["orders-group"], events.partitions[KEY]):
        assert counts.marked_in_progress == 7  # 4 first marks, then 2 refreshes and 1 first mark


def test_releases_by_the_sweeper_are_counted_by_reason_and_archived_at_the_delivery_limit():
    events = ShareEventCounts()
    engine = in_progress_engine()
    acquire(engine, 0, 9, now=0)
    engine.acknowledge("m1", [AckRange(5, 9, (RELEASE,))], now=0)
    acquire(engine, 5, 9, now=0)  # 5-9 on their second (last) delivery
    engine.mark_in_progress("m1", [(0, 9)], now=0)
    engine.mark_in_progress("m1", [(0, 1)], now=40_000)  # 0-1 keep making progress, the rest go quiet
    released = engine.release_in_progress(now=50_000)
    by_reason = {release.reason.value: release for release in released}
    assert by_reason["staleness"].records == 8
    for release in released:
        events.on_change(Change(KEY, _RELEASE_CAUSES[release.reason.value], release.delta))
    counts = events.groups["orders-group"]
    assert counts.in_progress_released == {"staleness": 8}
    assert counts.archived == {"delivery_limit": 5}  # 5-9 were on their last delivery
    # 0-1 kept marking: released at the max extension (60 s after the first mark), progress or not.
    engine.mark_in_progress("m1", [(0, 1)], now=55_000)
    for release in engine.release_in_progress(now=61_000):
        events.on_change(Change(KEY, _RELEASE_CAUSES[release.reason.value], release.delta))
    assert counts.in_progress_released == {"staleness": 8, "max_extension": 2}


def test_a_departed_members_fresh_records_are_counted_as_grace_expiry():
    events = ShareEventCounts()
    engine = in_progress_engine()
    acquire(engine, 0, 4, now=0)
    engine.mark_in_progress("m1", [(0, 1)], now=1_000)
    engine.release_member("m1", now=2_000)  # 2-4 released at once; 0-1 held for the grace
    assert engine.in_progress_count() == 2
    released = engine.release_in_progress(now=7_001)
    for release in released:
        events.on_change(Change(KEY, _RELEASE_CAUSES[release.reason.value], release.delta))
    assert events.groups["orders-group"].in_progress_released == {"grace_expiry": 2}
    assert engine.in_progress_count() == 0


_RELEASE_CAUSES = {"staleness": Cause.STALE_RELEASED, "max_extension": Cause.MAX_EXTENSION_RELEASED,
                   "grace_expiry": Cause.GRACE_EXPIRED}


def test_in_progress_durations_fill_the_histogram():
    events = ShareEventCounts()
    events.in_progress_finished(KEY, [(500, 2), (1_000, 1), (45_000, 3), (7_200_000, 1)])
    counts = events.groups["orders-group"]
    # le=1s gets 0.5 s and 1 s; le=60 s gets 45 s; 2 h is past the last bound (+Inf).
    assert counts.in_progress_durations[0] == 3
    assert counts.in_progress_durations[4] == 3
    assert counts.in_progress_durations[-1] == 1
    assert counts.in_progress_seconds == 0.5 * 2 + 1 + 45 * 3 + 7_200


def test_collector_exports_in_progress_and_stale_gauges_releases_and_durations():
    engine = in_progress_engine()
    events = ShareEventCounts(per_partition=True)
    events.acquired(KEY, acquire(engine, 0, 9, now=0).acquired)
    events.on_change(Change(KEY, Cause.MARKED_IN_PROGRESS, engine.mark_in_progress("m1", [(0, 5)], now=0)))
    engine.mark_in_progress("m1", [(0, 1)], now=8_000)
    engine.acknowledge("m1", [AckRange(2, 2, (ACCEPT,))], now=9_000)  # 9 s IN_PROGRESS, then accepted
    now = {"ms": 12_000}  # 3-5 last progressed 12 s ago (> 10 s threshold): stale; 0-1 4 s ago: fresh
    service = make_service({"orders-group": 1}, [FakeLeader(KEY, engine, 10)])
    service.clock = lambda: now["ms"]

    samples = scrape(ShareCollector(service, events))

    group = frozenset({("group", "orders-group")})
    partition = group | {("topic", "orders"), ("partition", "0")}
    for prefix, labels in (("ksp_share_group", group), ("ksp_share_partition", partition)):
        assert samples[(f"{prefix}_records_in_progress", labels)] == 5
        assert samples[(f"{prefix}_records_in_progress_stale", labels)] == 3
        assert samples[(f"{prefix}_records_marked_in_progress_total", labels)] == 6
        assert samples[(f"{prefix}_in_progress_released_records_total", labels | {("reason", "staleness")})] == 0
        # The accepted record spent 9 s IN_PROGRESS (drained from the engine by the scrape).
        assert samples[(f"{prefix}_in_progress_duration_seconds_bucket", labels | {("le", "5.0")})] == 0
        assert samples[(f"{prefix}_in_progress_duration_seconds_bucket", labels | {("le", "10.0")})] == 1
        assert samples[(f"{prefix}_in_progress_duration_seconds_count", labels)] == 1
        assert samples[(f"{prefix}_in_progress_duration_seconds_sum", labels)] == 9.0
    assert samples[("ksp_share_group_in_flight_records", group | {("state", "in_progress")})] == 5
    assert engine.drain_in_progress_finished() == []  # the scrape took them

    now["ms"] = 100_000  # everything is stale now
    samples = scrape(ShareCollector(service, events))
    assert samples[("ksp_share_group_records_in_progress_stale", group)] == 5
    assert samples[("ksp_share_group_in_progress_duration_seconds_count", group)] == 1  # not counted twice


def test_the_change_hook_drains_durations_of_the_share_partition_that_changed():
    engine = in_progress_engine()
    events = ShareEventCounts()
    acquire(engine, 0, 3, now=0)
    engine.mark_in_progress("m1", [(0, 3)], now=0)
    service = make_service({"orders-group": 1}, [FakeLeader(KEY, engine)])
    service.leaders.active = service.leaders.leaders.get
    drain = in_progress_drain(service, events)
    delta = engine.acknowledge("m1", [AckRange(0, 3, (ACCEPT,))], now=70_000)

    drain(Change(KEY, Cause.ACKNOWLEDGED, delta))
    drain(Change(("gone-group", TOPIC_ID, 0), Cause.ACKNOWLEDGED, None))  # not in memory: nothing happens

    counts = events.groups["orders-group"]
    assert counts.in_progress_durations[IN_PROGRESS_DURATION_BUCKETS.index(120.0)] == 4  # 70 s each
    assert counts.in_progress_seconds == 280.0


async def test_a_registered_collector_is_exported_and_prepared_until_its_service_closes():
    from prometheus_client import REGISTRY

    service = make_service({"g": 1}, [FakeLeader(("g", TOPIC_ID, 0), engine_with(3))])
    service.commits = SimpleNamespace(subscribe=lambda hook: None)
    service.closers = []
    per_partition = EVENTS.per_partition
    collector = observe.register(service, per_partition=False)
    try:
        assert collector.prepare in SCRAPE_PREPARERS
        assert "ksp_share_groups" in {family.name for family in REGISTRY.collect()}
    finally:  # the service closes (and the process-wide registry is left as it was) whatever failed
        for close in service.closers:
            await close()
        EVENTS.per_partition = per_partition
    assert collector.prepare not in SCRAPE_PREPARERS
    assert "ksp_share_groups" not in {family.name for family in REGISTRY.collect()}
