"""Share-group metrics: event counts kept as plain integers, everything exported at scrape time.

Theory of operation
-------------------
Counting on the hot paths is one dict lookup and an integer add (:class:`ShareEventCounts`):
acquisitions (the reader), acknowledgements by type (the service, when they are applied), and the
change hook of the commit pipeline (lock expiries, members' releases, archiving by reason, records
marked IN_PROGRESS, IN_PROGRESS releases by reason). Gauges -- records in flight by state, records
IN_PROGRESS and stale, SPSO, lag, members, sessions -- are not bookkept at all: the
:class:`ShareCollector` computes them from the partition registry and the coordinator when
Prometheus scrapes, so they cannot drift from the engines' truth.

How long records stayed IN_PROGRESS is the engine's to measure (it sees every way out: accept,
release, reject, sweeper, grace expiry, log truncation); the change hook drains those durations
from the share-partition that changed (:meth:`SharePartition.drain_in_progress_finished`) into a
histogram, and every scrape drains what is left, so the engines never hold more than the records
that left IN_PROGRESS since their last change.

Cardinality: group-level series always (a group is an operator-chosen name); series per
share-partition (topic, partition labels) only with ``--metrics-per-partition``. Series of groups
and share-partitions that no longer exist are dropped at the next scrape.

Lag follows Kafka's definition (DescribeShareGroupOffsets v1, KIP-1226): partition end offset -
SPSO - records already delivery-complete (Acknowledged or Archived) above the SPSO. The end offset
used is the high watermark the reader saw on its last upstream fetch of that partition; no scrape
asks the cluster anything. A share-partition never fetched has an unknown lag (-1), and group lag
sums the share-partitions whose lag is known.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily

from proxy.exposition import CounterSeries, GaugeSeries, HistogramSeries
from proxy.metrics import SCRAPE_PREPARERS
from proxy.share.commit import Cause, Change
from proxy.share.partition import AckRange, AcquiredRecords, SharePartitionKey, StateDelta
from proxy.share.group_admin import share_lag
from proxy.share.states import TERMINAL_STATES, AcknowledgeType, RecordState
from proxy.timeslice import TimeSlices

if TYPE_CHECKING:
    from proxy.share.manager import ShareService

MAX_DELIVERY_COUNT_BUCKET = 10  # Kafka's delivery count limit is at most 10
# Seconds a record stayed IN_PROGRESS: the draft's workloads run for seconds to minutes, bounded
# by the max lock extension (30 min by default).
IN_PROGRESS_DURATION_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
# The change hook's causes for IN_PROGRESS records released by the engine, as metric reasons.
IN_PROGRESS_RELEASE_REASONS = {
    Cause.STALE_RELEASED: "staleness",
    Cause.MAX_EXTENSION_RELEASED: "max_extension",
    Cause.GRACE_EXPIRED: "grace_expiry",
}
# A scrape reads the engines in slices of this long (ShareCollector.prepare).
SCRAPE_SLICE_S = 0.01
ACK_TYPE_NAMES = {int(t): t.name.lower() for t in AcknowledgeType if t is not AcknowledgeType.GAP}
ARCHIVE_REASONS = ("rejected", "delivery_limit", "aborted_or_control", "log_truncated")
STATE_NAMES = {state: state.name.lower() for state in RecordState}


@dataclass(slots=True)
class ShareCounts:
    """Monotonic event counts of one share group (or one share-partition)."""

    acquired: int = 0
    acknowledged: dict[str, int] = field(default_factory=dict)  # ack type -> records
    lock_expired: int = 0
    member_released: int = 0
    archived: dict[str, int] = field(default_factory=dict)  # reason -> records
    # delivery_counts[n] = records handed out for the n-th time (n capped at the last bucket)
    delivery_counts: list[int] = field(default_factory=lambda: [0] * (MAX_DELIVERY_COUNT_BUCKET + 1))
    marked_in_progress: int = 0  # records named by applied marks (first marks and refreshes)
    in_progress_released: dict[str, int] = field(default_factory=dict)  # reason -> records
    # in_progress_durations[i] = records whose time IN_PROGRESS fell in bucket i (last: +Inf)
    in_progress_durations: list[int] = field(default_factory=lambda: [0] * (len(IN_PROGRESS_DURATION_BUCKETS) + 1))
    in_progress_seconds: float = 0.0

    def add_archived(self, reason: str, records: int) -> None:
        if records > 0:
            self.archived[reason] = self.archived.get(reason, 0) + records

    def add_in_progress_duration(self, duration_ms: int, records: int) -> None:
        seconds = max(duration_ms, 0) / 1000
        self.in_progress_durations[bisect.bisect_left(IN_PROGRESS_DURATION_BUCKETS, seconds)] += records
        self.in_progress_seconds += seconds * records


class ShareEventCounts:
    """The proxy's share-group event counts (one per process, :data:`EVENTS`)."""

    def __init__(self, *, per_partition: bool = False) -> None:
        self.per_partition = per_partition
        self.groups: dict[str, ShareCounts] = {}
        self.partitions: dict[SharePartitionKey, ShareCounts] = {}

    def _counts(self, key: SharePartitionKey) -> Iterator[ShareCounts]:
        counts = self.groups.get(key[0])
        if counts is None:
            counts = self.groups[key[0]] = ShareCounts()
        yield counts
        if self.per_partition:
            counts = self.partitions.get(key)
            if counts is None:
                counts = self.partitions[key] = ShareCounts()
            yield counts

    # ----- events ------------------------------------------------------------------------

    def acquired(self, key: SharePartitionKey, acquired: Sequence[AcquiredRecords]) -> None:
        for counts in self._counts(key):
            histogram = counts.delivery_counts
            for records in acquired:
                size = records.last_offset - records.first_offset + 1
                counts.acquired += size
                histogram[min(max(records.delivery_count, 0), MAX_DELIVERY_COUNT_BUCKET)] += size

    def acknowledged(self, key: SharePartitionKey, ranges: Sequence[AckRange], delta: StateDelta | None) -> None:
        """Acknowledgements applied to a share-partition, and the state change they made."""
        by_type: dict[int, int] = {}
        for ack in ranges:
            types = ack.acknowledge_types
            if len(types) == 1:
                by_type[types[0]] = by_type.get(types[0], 0) + ack.last_offset - ack.first_offset + 1
            else:
                for ack_type in types:
                    by_type[ack_type] = by_type.get(ack_type, 0) + 1
        rejected = by_type.get(int(AcknowledgeType.REJECT), 0)
        # A release at the delivery limit archives the record: what was archived and not rejected.
        archived = _archived_in(delta)
        for counts in self._counts(key):
            for ack_type, records in by_type.items():
                name = ACK_TYPE_NAMES.get(ack_type)
                if name is not None:
                    counts.acknowledged[name] = counts.acknowledged.get(name, 0) + records
            counts.add_archived("rejected", min(rejected, archived))
            counts.add_archived("delivery_limit", archived - rejected)

    def on_change(self, change: Change) -> None:
        """The commit pipeline's change hook."""
        cause, delta = change.cause, change.delta
        if delta is None or not (delta.changed or delta.state_batches):
            return
        if cause is Cause.LOCK_EXPIRED:
            released = _records_in(delta, RecordState.AVAILABLE)
            archived = _archived_in(delta)
            for counts in self._counts(change.key):
                counts.lock_expired += released + archived
                counts.add_archived("delivery_limit", archived)
        elif cause is Cause.MEMBER_RELEASED:
            released = _records_in(delta, RecordState.AVAILABLE)
            for counts in self._counts(change.key):
                counts.member_released += released
        elif cause is Cause.MARKED_IN_PROGRESS:
            marked = _records_in(delta, RecordState.IN_PROGRESS)
            for counts in self._counts(change.key):
                counts.marked_in_progress += marked
        elif cause in IN_PROGRESS_RELEASE_REASONS:
            reason = IN_PROGRESS_RELEASE_REASONS[cause]
            released = _records_in(delta, RecordState.AVAILABLE)
            archived = _archived_in(delta)  # released on their last delivery
            for counts in self._counts(change.key):
                if released + archived:
                    counts.in_progress_released[reason] = counts.in_progress_released.get(reason, 0) + released + archived
                counts.add_archived("delivery_limit", archived)
        elif cause in (Cause.ACQUIRED, Cause.LOG_TRUNCATED):
            reason = "aborted_or_control" if cause is Cause.ACQUIRED else "log_truncated"
            archived = _archived_in(delta)
            for counts in self._counts(change.key):
                counts.add_archived(reason, archived)

    def in_progress_finished(self, key: SharePartitionKey, finished: Sequence[tuple[int, int]]) -> None:
        """(duration ms, records) of records that left IN_PROGRESS, from the engine."""
        if not finished:
            return
        for counts in self._counts(key):
            for duration_ms, records in finished:
                counts.add_in_progress_duration(duration_ms, records)

    # ----- housekeeping ------------------------------------------------------------------

    def forget_missing(self, groups: set[str], partitions: set[SharePartitionKey]) -> None:
        """Drop the counts of groups and share-partitions that no longer exist."""
        for group_id in [g for g in self.groups if g not in groups]:
            del self.groups[group_id]
        for key in [k for k in self.partitions if k not in partitions]:
            del self.partitions[key]


def _archived_in(delta: StateDelta | None) -> int:
    """Records the change archived: counted when they enter ARCHIVING (a dead-letter queue is
    configured) or ARCHIVED directly -- never again when ARCHIVING ends (Cause.DEAD_LETTERED)."""
    return _records_in(delta, RecordState.ARCHIVED) + _records_in(delta, RecordState.ARCHIVING)


def _records_in(delta: StateDelta | None, state: RecordState) -> int:
    if delta is None:
        return 0
    return sum(b.last_offset - b.first_offset + 1 for b in delta.changed or delta.state_batches
               if b.delivery_state == state)


EVENTS = ShareEventCounts()
"""The process's share event counts; the reader and the service count into it."""


# ----- scrape time ---------------------------------------------------------------------------


@dataclass(slots=True)
class PartitionView:
    """What a scrape reports of one share-partition."""

    key: SharePartitionKey
    topic: str
    start_offset: int
    in_flight: dict[str, int]
    lag: int  # -1: unknown (no high watermark seen yet)
    in_progress: int = 0  # records IN_PROGRESS
    stale: int = 0  # of those, no progress within the staleness threshold


def partition_view(key: SharePartitionKey, topic: str, engine, high_watermark: int, now: int | None = None
                   ) -> PartitionView:
    """In-flight records by state, IN_PROGRESS and stale records (stale needs ``now``, the engine's
    clock) and lag of one in-memory share-partition."""
    in_flight = dict.fromkeys(STATE_NAMES.values(), 0)
    complete = 0
    for first, last, state, _, _ in engine.in_flight():
        size = last - first + 1
        name = STATE_NAMES.get(state, str(int(state)))
        in_flight[name] = in_flight.get(name, 0) + size
        if state in TERMINAL_STATES and first >= engine.start_offset:
            complete += size
    # -1: no high watermark seen yet. One seen before the latest acquisitions can trail them: not below 0.
    lag = -1 if high_watermark < 0 else max(0, share_lag(high_watermark, engine.start_offset, complete))
    stale = engine.stale_count(now) if now is not None else 0
    return PartitionView(key, topic, engine.start_offset, in_flight, lag, engine.in_progress_count(), stale)


@dataclass(slots=True)
class ShareReading:
    """What one scrape reports, read on the event loop's thread; formatting it touches nothing the
    loop changes, so it may run in a worker thread."""

    group_ids: list[str]
    groups_by_state: dict[str, int]
    members: list[tuple[str, int]]
    sessions: int
    views: list[PartitionView]
    group_counts: dict[str, ShareCounts]
    # Per-partition counts with their label values (group, topic, partition); None when off.
    partition_counts: list[tuple[list[str], ShareCounts]] | None


class ShareCollector:
    """Prometheus collector of the share-group series (registered once the service runs).

    A scrape first reads the engines, the coordinator and the event counts on the loop's thread
    (:meth:`prepare`, in time slices: ~10 us per share-partition), then formats what it read
    (:meth:`collect`, wherever the registry is walked: the metrics endpoint does it in a worker
    thread). Without a :meth:`prepare` first, :meth:`collect` reads for itself, which is safe on the
    loop's thread only (tests, and a registry other than the default one)."""

    def __init__(self, service: ShareService, events: ShareEventCounts = EVENTS) -> None:
        self.service = service
        self.events = events
        self._prepared: ShareReading | None = None

    def describe(self) -> Iterable:
        return ()  # names are not checked against other collectors (families are built per scrape)

    async def prepare(self, slices: TimeSlices | None = None) -> None:
        """Read the next scrape's values, letting other tasks run between ``slices``."""
        slices = slices or TimeSlices(SCRAPE_SLICE_S)
        views = []
        for view in self._leader_views():
            views.append(view)
            await slices.pause_if_due()
        self._prepared = self._reading(views)

    def read(self) -> ShareReading:
        """The next scrape's values, read in one go."""
        return self._reading(list(self._leader_views()))

    def collect(self) -> Iterator:
        reading, self._prepared = self._prepared or self.read(), None
        yield from self._families(reading)

    def _leader_views(self) -> Iterator[PartitionView]:
        now = self.service.clock()
        for leader in self.service.leaders.values():
            self.events.in_progress_finished(leader.key, leader.engine.drain_in_progress_finished())
            yield partition_view(leader.key, self._topic_name(leader.key[1]), leader.engine, leader.high_watermark,
                                 now)

    def _reading(self, views: list[PartitionView]) -> ShareReading:
        coordinator, events = self.service.coordinator, self.events
        group_ids = coordinator.group_ids()
        known_keys = self.service.leaders.keys()
        events.forget_missing(set(group_ids) | self.service.leaders.group_ids(), known_keys)
        views = [view for view in views if view.key in known_keys]  # not one removed while reading
        by_state: dict[str, int] = {}
        for _, state in coordinator.list_groups():
            by_state[state.value] = by_state.get(state.value, 0) + 1
        partition_counts = None
        if events.per_partition:
            names = {view.key: [view.key[0], view.topic, str(view.key[2])] for view in views}
            keys = sorted(events.partitions, key=lambda k: (k[0], str(k[1]), k[2]))
            partition_counts = [(names.get(k) or [k[0], self._topic_name(k[1]), str(k[2])], events.partitions[k])
                                for k in keys]
        return ShareReading(
            group_ids=group_ids, groups_by_state=by_state,
            members=[(group_id, coordinator.member_count(group_id)) for group_id in group_ids],
            sessions=len(self.service.sessions), views=views,
            group_counts={g: events.groups[g] for g in sorted(events.groups)},
            partition_counts=partition_counts)

    def _families(self, reading: ShareReading) -> Iterator:
        group_ids, views = reading.group_ids, reading.views
        groups = GaugeSeries("ksp_share_groups", "Share groups by state (Kafka: share-group-count)",
                             labels=["state"])
        for state_name in ("Empty", "Stable"):
            groups.add_metric([state_name], reading.groups_by_state.get(state_name, 0))
        yield groups

        members = GaugeSeries("ksp_share_group_members", "Members of a share group", labels=["group"])
        for group_id, count in reading.members:
            members.add_metric([group_id], count)
        yield members
        yield GaugeMetricFamily("ksp_share_sessions", "Share sessions open (Kafka: group.share.max.share.sessions)",
                                value=reading.sessions)

        in_flight = GaugeSeries(
            "ksp_share_group_in_flight_records",
            "Records in flight (between SPSO and SPEO) by state, summed over the group's share-partitions "
            "(Kafka: SharePartitionMetrics InFlightMessageCount)", labels=["group", "state"])
        lag = GaugeSeries(
            "ksp_share_group_lag_records",
            "End offset - SPSO - delivery-complete records above SPSO, summed over share-partitions whose "
            "end offset is known (DescribeShareGroupOffsets v1 lag)", labels=["group"])
        partitions = GaugeSeries("ksp_share_group_partitions", "Share-partitions of the group (in memory)",
                                 labels=["group"])
        in_progress = GaugeSeries(
            "ksp_share_group_records_in_progress",
            "Records IN_PROGRESS (marked by MarkInProgress, not yet acknowledged or released)", labels=["group"])
        stale = GaugeSeries(
            "ksp_share_group_records_in_progress_stale",
            "Records IN_PROGRESS whose last progress is older than the group's staleness threshold "
            "(the sweeper releases them on its next pass)", labels=["group"])
        group_in_flight: dict[str, dict[str, int]] = {g: dict.fromkeys(STATE_NAMES.values(), 0) for g in group_ids}
        group_lag: dict[str, int] = dict.fromkeys(group_ids, 0)
        group_partitions: dict[str, int] = dict.fromkeys(group_ids, 0)
        group_in_progress: dict[str, int] = dict.fromkeys(group_ids, 0)
        group_stale: dict[str, int] = dict.fromkeys(group_ids, 0)
        for view in views:
            group = view.key[0]
            totals = group_in_flight.setdefault(group, dict.fromkeys(STATE_NAMES.values(), 0))
            for state_name, records in view.in_flight.items():
                totals[state_name] = totals.get(state_name, 0) + records
            group_lag[group] = group_lag.get(group, 0) + max(view.lag, 0)
            group_partitions[group] = group_partitions.get(group, 0) + 1
            group_in_progress[group] = group_in_progress.get(group, 0) + view.in_progress
            group_stale[group] = group_stale.get(group, 0) + view.stale
        for group, totals in sorted(group_in_flight.items()):
            for state_name, records in totals.items():
                in_flight.add_metric([group, state_name], records)
        for group, value in sorted(group_lag.items()):
            lag.add_metric([group], value)
        for group, value in sorted(group_partitions.items()):
            partitions.add_metric([group], value)
        for group, value in sorted(group_in_progress.items()):
            in_progress.add_metric([group], value)
        for group, value in sorted(group_stale.items()):
            stale.add_metric([group], value)
        yield in_flight
        yield lag
        yield partitions
        yield in_progress
        yield stale

        yield from _counter_families("ksp_share_group", ["group"],
                                     (([g], counts) for g, counts in reading.group_counts.items()))

        if reading.partition_counts is not None:
            labels = ["group", "topic", "partition"]
            spso = GaugeSeries("ksp_share_partition_start_offset", "Share-partition start offset (SPSO)",
                               labels=labels)
            p_in_flight = GaugeSeries("ksp_share_partition_in_flight_records",
                                      "Records in flight by state (Kafka: InFlightMessageCount)",
                                      labels=[*labels, "state"])
            p_lag = GaugeSeries("ksp_share_partition_lag_records",
                                "End offset - SPSO - delivery-complete records above SPSO; -1 unknown",
                                labels=labels)
            p_in_progress = GaugeSeries("ksp_share_partition_records_in_progress", "Records IN_PROGRESS",
                                        labels=labels)
            p_stale = GaugeSeries("ksp_share_partition_records_in_progress_stale",
                                  "Records IN_PROGRESS with no progress within the staleness threshold",
                                  labels=labels)
            for view in views:
                label_values = [view.key[0], view.topic, str(view.key[2])]
                spso.add_metric(label_values, view.start_offset)
                p_lag.add_metric(label_values, view.lag)
                p_in_progress.add_metric(label_values, view.in_progress)
                p_stale.add_metric(label_values, view.stale)
                for state_name, records in view.in_flight.items():
                    p_in_flight.add_metric([*label_values, state_name], records)
            yield spso
            yield p_in_flight
            yield p_lag
            yield p_in_progress
            yield p_stale
            yield from _counter_families("ksp_share_partition", labels, reading.partition_counts)

    def _topic_name(self, topic_id: uuid.UUID) -> str:
        topic = self.service.cluster.topic_by_id(topic_id)
        return topic.name if topic is not None else str(topic_id)


def _counter_families(prefix: str, labels: list[str], rows: Iterable[tuple[list[str], ShareCounts]]) -> Iterator:
    acquired = CounterSeries(f"{prefix}_records_acquired", "Records acquired (handed to consumers)",
                             labels=labels)
    acknowledged = CounterSeries(
        f"{prefix}_records_acknowledged", "Records acknowledged, by type (Kafka: RecordAcknowledgementsPerSec)",
        labels=[*labels, "type"])
    expired = CounterSeries(
        f"{prefix}_lock_expired_records", "Records whose acquisition lock expired "
        "(Kafka: AcquisitionLockTimeoutPerSec)", labels=labels)
    released = CounterSeries(f"{prefix}_member_released_records",
                             "Acquired records released because their member left or its session closed",
                             labels=labels)
    archived = CounterSeries(f"{prefix}_records_archived", "Records archived, by reason",
                             labels=[*labels, "reason"])
    deliveries = HistogramSeries(f"{prefix}_delivery_count",
                                 "Delivery count of each record handed to a consumer", labels=labels)
    marked = CounterSeries(f"{prefix}_records_marked_in_progress",
                           "Records named by applied MarkInProgress requests (first marks and refreshes)",
                           labels=labels)
    in_progress_released = CounterSeries(
        f"{prefix}_in_progress_released_records",
        "IN_PROGRESS records released by the proxy (archived if on their last delivery), by reason: staleness, "
        "max_extension, grace_expiry", labels=[*labels, "reason"])
    in_progress_durations = HistogramSeries(
        f"{prefix}_in_progress_duration_seconds",
        "How long records stayed IN_PROGRESS (first mark to accept, release, reject or release by the proxy)",
        labels=labels)
    for label_values, counts in rows:
        acquired.add_metric(label_values, counts.acquired)
        for name in ACK_TYPE_NAMES.values():
            acknowledged.add_metric([*label_values, name], counts.acknowledged.get(name, 0))
        expired.add_metric(label_values, counts.lock_expired)
        released.add_metric(label_values, counts.member_released)
        for reason in ARCHIVE_REASONS:
            archived.add_metric([*label_values, reason], counts.archived.get(reason, 0))
        buckets, running, total = [], 0, 0
        for n in range(1, MAX_DELIVERY_COUNT_BUCKET + 1):
            running += counts.delivery_counts[n]
            total += n * counts.delivery_counts[n]
            buckets.append((str(float(n)), running))
        running += counts.delivery_counts[0]  # never happens (counts start at 1); kept in +Inf
        buckets.append(("+Inf", running))
        deliveries.add_metric(label_values, buckets, sum_value=total)
        marked.add_metric(label_values, counts.marked_in_progress)
        for reason in IN_PROGRESS_RELEASE_REASONS.values():
            in_progress_released.add_metric([*label_values, reason], counts.in_progress_released.get(reason, 0))
        buckets, running = [], 0
        for bound, records in zip((*IN_PROGRESS_DURATION_BUCKETS, float("inf")), counts.in_progress_durations):
            running += records
            buckets.append(("+Inf" if bound == float("inf") else str(bound), running))
        in_progress_durations.add_metric(label_values, buckets, sum_value=counts.in_progress_seconds)
    yield acquired
    yield acknowledged
    yield expired
    yield released
    yield archived
    yield deliveries
    yield marked
    yield in_progress_released
    yield in_progress_durations


def in_progress_drain(service, events: ShareEventCounts):
    """A change hook that moves the changed share-partition's finished IN_PROGRESS durations into
    ``events`` (so the engine's list stays short whether or not anyone scrapes)."""

    def drain(change: Change) -> None:
        leader = service.leaders.active(change.key)
        if leader is not None:
            events.in_progress_finished(change.key, leader.engine.drain_in_progress_finished())

    return drain


def register(service: ShareService, *, per_partition: bool, registry=None) -> ShareCollector:
    """Count the service's share events and export them (one block in runtime.py) until the
    service closes (a process that runs the share service again exports only the new one)."""
    from prometheus_client import REGISTRY

    EVENTS.per_partition = per_partition
    service.commits.subscribe(EVENTS.on_change)
    service.commits.subscribe(in_progress_drain(service, EVENTS))
    collector = ShareCollector(service)
    exported_by = registry or REGISTRY
    exported_by.register(collector)
    if registry is None:
        SCRAPE_PREPARERS.append(collector.prepare)

    async def unregister() -> None:
        exported_by.unregister(collector)
        if collector.prepare in SCRAPE_PREPARERS:
            SCRAPE_PREPARERS.remove(collector.prepare)

    service.closers.append(unregister)
    return collector


__all__ = ["EVENTS", "IN_PROGRESS_DURATION_BUCKETS", "ShareCollector", "ShareCounts", "ShareEventCounts",
           "in_progress_drain", "partition_view", "register"]
