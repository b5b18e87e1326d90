"""The share-group service: a thin facade over the rooms that serve share groups.

Theory of operation
-------------------
:class:`ShareService` is what the share routes call. It owns the pure decision cores --
:class:`ShareGroupCoordinator` (membership, assignment) and :class:`ShareSessionCache` (share
sessions bound to client connections) -- and wires the rooms around the engines:

* :mod:`proxy.share.leaders` -- the partition registry (leaders by group, initialisation, live
  group configs, one deadline heap, idle share-partitions parked out of memory);
* :mod:`proxy.share.commit` -- the commit pipeline (stage, write, commit or roll back; the change
  hook);
* :mod:`proxy.share.reader` -- upstream reads, the read cache under one byte budget, long polls,
  bounded metadata refreshes.

All engine calls happen on the trio thread between awaits, so each is atomic without locks.
Deadlines (locks, member sessions) run on a monotonic clock; wall time is used only where it is
persisted or shown (snapshot timestamps, by_duration offset resets).

**ShareFetch** (KIP-932 "ShareFetch"): a session is opened only for a member of the group (else
GROUP_ID_NOT_FOUND / UNKNOWN_MEMBER_ID, and nothing is created); piggybacked acknowledgements are
staged and made durable while the reader acquires new records; the response goes out when both
are done. **ShareAcknowledge**: staged, written, then committed -- or rolled back with a
retriable error when the write fails. **Sessions are per node** (the broker id of the listener a
request came in on; see :mod:`proxy.share.sessions`): a session that ends -- final epoch, replaced
by an epoch-0 ShareFetch, or its connection closed -- releases the member's records on that
session's share-partitions only (no delivery counted), as Kafka's ``releaseSession`` does; a
member leaving the group releases everything it holds in the group.

Background tasks (state writer, timers, metadata refresh, partition initialisation) are
supervised: a crash is logged, counted and the task restarted; pass-through traffic never
depends on them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Set
from dataclasses import dataclass, field

import structlog
import trio
from kio.schema.errors import ErrorCode

from proxy.errors import UpstreamError
from proxy.share import metrics, observe, state_store
from proxy.share.assignor import TopicIdPartition
from proxy.share.commit import DEFAULT_WRITES_IN_FLIGHT, Cause, CommitPipeline
from proxy.share.coordinator import (
    AssignmentChanged,
    CoordinatorConfig,
    DescribedGroup,
    GroupEpochBumped,
    MemberDeparted,
    PartitionsDeleted,
    PartitionsToInitialize,
    ShareGroupCoordinator,
    describe_response,
    heartbeat_response,
)
from proxy.share.coordinator import TopicInfo as CoordinatorTopic
from proxy.share.leaders import Leader, PartitionRegistry, SharePartitionKey
from proxy.share.ownership import ServiceOwnership
from proxy.share.partition import AckRange, AcquireMode, ReleaseReason, ShareStateError, acquisition_mark
from proxy.share.persister import PersistError, StateLogWriter
from proxy.share.reader import Fetched, FetchParams, MetadataRefresher, Reader, WorkSignal
from proxy.share.state_delta import DeltaPolicy
from proxy.share.sessions import (
    ContextKind,
    ForgottenPartitions,
    SessionKey,
    SessionView,
    ShareSessionCache,
    ShareSessionError,
)
from proxy.share.supervise import guarded, supervised
from proxy.timeslice import TimeSlices

log = structlog.get_logger(__name__)

Clock = Callable[[], int]
AckResults = dict[TopicIdPartition, tuple[ErrorCode, str | None]]
#: Authorization at the route edge (proxy/share/authorization.py): given the topic ids a request
#: touches, the ones the client may not READ. Asked after the session step, as Kafka's brokers do.
TopicCheck = Callable[[set[uuid.UUID]], Awaitable[set[uuid.UUID]]]
TOPIC_DENIED = (ErrorCode.topic_authorization_failed, "Topic authorization failed.")
NOT_LED_HERE = (ErrorCode.not_leader_or_follower,
                "Another proxy instance leads this share-partition (scale-out); refresh metadata.")

# Fetch failures that mean our metadata may be stale trigger a refresh at most this often.
STALE_METADATA_REFRESH_S = 0.5

# A restore rebuilds engines for at most this long before letting other tasks run (ShareService.restore).
RESTORE_SLICE_S = 0.02

# Why the timer released IN_PROGRESS records -> the cause the commit pipeline records.
RELEASE_CAUSES = {
    ReleaseReason.STALENESS: Cause.STALE_RELEASED,
    ReleaseReason.MAX_EXTENSION: Cause.MAX_EXTENSION_RELEASED,
    ReleaseReason.GRACE_EXPIRY: Cause.GRACE_EXPIRED,
}


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class ShareServiceConfig:
    state_topic: str = "__share_proxy_state"
    max_share_sessions: int = 2000
    max_share_session_partitions: int = 10_000  # per session (no Kafka counterpart)
    max_share_session_partitions_total: int = 200_000  # across the session cache
    metadata_refresh_interval_s: float = 10.0
    max_fetch_bytes_per_partition: int = 8 * 1024 * 1024
    # One budget for every share-partition's read cache (log bytes kept for queued members).
    max_read_cache_bytes: int = 64 * 1024 * 1024
    # How often member-less groups' idle share-partitions are parked out of memory.
    idle_sweep_interval_s: float = 30.0
    coordinator: CoordinatorConfig = CoordinatorConfig()
    # Cumulative ShareUpdates between snapshots (--state-deltas, proxy.share.state_delta); None: off.
    state_deltas: DeltaPolicy | None = DeltaPolicy()
    # State writes on their way at once (--state-writes-in-flight; commit.py, "Writes in flight").
    state_writes_in_flight: int = DEFAULT_WRITES_IN_FLIGHT


@dataclass(slots=True)
class FetchOutcome:
    """What a ShareFetch produced; routes turns it into the response."""

    error: ErrorCode = ErrorCode.none
    message: str | None = None
    fetched: dict[TopicIdPartition, Fetched] = field(default_factory=dict)
    acknowledgements: AckResults = field(default_factory=dict)
    lock_ms: int = 0


@dataclass(slots=True)
class AcknowledgeOutcome:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    acknowledgements: AckResults = field(default_factory=dict)
    lock_ms: int = 0


class ShareService:
    def __init__(
        self,
        cluster,
        writer: StateLogWriter,
        config: ShareServiceConfig = ShareServiceConfig(),
        *,
        clock: Clock = monotonic_ms,
        wall_clock: Clock = wall_clock_ms,
        advertised_endpoint: Callable[[int], tuple[str, int]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.writer = writer
        self.config = config
        self.clock = clock
        self.wall_clock = wall_clock
        # node id -> the proxy's (host, port) for that broker: leader hints never leak upstream addresses.
        self.advertised_endpoint = advertised_endpoint
        self.coordinator = ShareGroupCoordinator(config.coordinator)
        self.sessions = ShareSessionCache(
            config.max_share_sessions, max_partitions_per_session=config.max_share_session_partitions,
            max_partitions=config.max_share_session_partitions_total,
        )
        # Partitions members dropped from their sessions while holding records there.
        self.forgotten = ForgottenPartitions()
        self.work = WorkSignal()  # fired when records may have become acquirable on a share-partition
        self.commits = CommitPipeline(writer, config.state_topic, wall_clock=wall_clock,
                                      on_settled=self._settled, clock=clock, deltas=config.state_deltas,
                                      max_writes_in_flight=config.state_writes_in_flight)
        self.leaders = PartitionRegistry(self.coordinator, cluster, clock=clock, wall_clock=wall_clock,
                                         persist_initial=self.commits.persist_initial)
        self.refresher = MetadataRefresher(cluster, self._metadata_refreshed,
                                           min_interval_s=STALE_METADATA_REFRESH_S)
        self.reader = Reader(
            cluster, self.leaders, self.commits, self.work, self.refresher, clock=clock,
            schedule=self._schedule, max_fetch_bytes_per_partition=config.max_fetch_bytes_per_partition,
            max_read_cache_bytes=config.max_read_cache_bytes, background=lambda: self._nursery,
        )
        self._timer_wakeup = trio.Event()
        self._timer_due = 0  # clock ms at which the timer task next wakes unless woken earlier
        self._next_idle_sweep = 0
        self._watched_connections: set[int] = set()
        self._nursery: trio.Nursery | None = None
        self._group_created: dict[str, int] = {}
        # Scale-out (issue 15): which share-partitions and groups this instance serves; None: all.
        self.ownership: ServiceOwnership | None = None
        self.scale_out = None  # runtime.ScaleOut with --instance-id: the ownership group member
        # Scale-out: DescribeShareGroupInFlight across instances (peers.InFlightFanOut); None: one instance.
        self.in_flight_fan_out = None
        # Closed after the last state write, before the writer (e.g. the event log, which still
        # hears that write's committed changes).
        self.closers: list[Callable[[], Awaitable[None]]] = []
        #: Scale-out: told the share-partitions being handed to another instance, first thing (e.g.
        #: the dead-letter writer stops their drains).
        self.hand_over_listeners: list[Callable[[list[SharePartitionKey]], None]] = []

    # ----- lifecycle -----------------------------------------------------------------

    async def restore(self, recovered: state_store.RecoveredState, *, slice_s: float = RESTORE_SLICE_S) -> None:
        """Serve from replayed state: groups (no members; they rejoin) and share-partitions.

        The share-partitions' engines (0.1-0.2 ms each) are rebuilt in slices of ``slice_s``, other
        tasks running between them, and served all in one step once every one is built: nothing
        sees part of them, and the loop keeps answering meanwhile (/healthz during start-up, the
        connections already served when a scale-out instance gains partitions)."""
        for group_id, group in recovered.groups.items():
            if group.exists:
                self.coordinator.restore_group(
                    group_id,
                    group_epoch=group.group_epoch,
                    initialized=[(t, p) for t, p in group.initialized],
                )
            # Configs may be set before a group's first member arrives: restored either way.
            dropped = self.coordinator.restore_group_config(group_id, group.configs) if group.configs else []
            if dropped:
                log.warning("persisted group configs outside the proxy's bounds ignored", group=group_id,
                            configs=dropped)
        rebuilt = []
        slices = TimeSlices(slice_s)
        for key, partition in recovered.partitions.items():
            rebuilt.append(self.leaders.rebuild(key, partition.snapshot, partition.updates,
                                                snapshot_epoch=partition.snapshot_epoch,
                                                state_epoch=partition.state_epoch,
                                                create_timestamp=partition.create_timestamp))
            await slices.pause_if_due()
        for leader in rebuilt:
            self.leaders.add(leader)
        log.info("share state restored", groups=len(recovered.groups), partitions=len(recovered.partitions),
                 skipped_records=recovered.skipped)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if not await self.refresher.refresh("start"):
                log.warning("upstream metadata unavailable at start")
            nursery.start_soon(supervised, "writer", self.commits.run)
            nursery.start_soon(supervised, "timer", self._timer_loop)
            nursery.start_soon(supervised, "metadata", self._metadata_loop)
            task_status.started()

    @property
    def state_writable(self) -> bool:
        """False from a failed state write until the next successful one (readiness)."""
        return self.commits.writable

    async def aclose(self) -> None:
        """Write what is still dirty, then close the writer and upstream connections."""
        if self.scale_out is not None:
            await self.scale_out.leave()  # hands owned partitions over, flushed, before anything closes
        await self.commits.flush([leader for leader in self.leaders.values() if leader.durable < leader.version])
        for close in self.closers:
            await close()
        await self.writer.aclose()
        await self.cluster.aclose()

    # ----- timers ---------------------------------------------------------------------

    def _settled(self, leader: Leader) -> None:
        """Staged changes of `leader` committed or rolled back: wake its fetches, queue lock deadlines."""
        self._schedule(leader)
        self.work.fire(leader.key)

    def deadline_changed(self, leader: Leader) -> None:
        """A route changed `leader`'s deadlines (e.g. a progress mark starts its sweeps): queue them."""
        self._schedule(leader)

    def _schedule(self, leader: Leader) -> None:
        """Queue the leader's lock deadline; wake the timer only if it falls before its wake-up."""
        deadline = self.leaders.schedule(leader)
        self._wake_timer(deadline)

    def _wake_timer(self, deadline: int | None) -> None:
        if deadline is not None and deadline < self._timer_due:
            self._timer_wakeup.set()

    async def _timer_loop(self) -> None:
        while True:
            now = self.clock()
            self._expire(now)
            if now >= self._next_idle_sweep:
                self._next_idle_sweep = now + int(self.config.idle_sweep_interval_s * 1000)
                self._park_idle()
            deadlines = [d for d in (self.leaders.next_deadline(), self.coordinator.next_deadline()) if d is not None]
            now = self.clock()
            self._timer_due = min([*deadlines, now + 1000])  # re-checked at least every second
            with trio.move_on_after(max(0, self._timer_due - now) / 1000):
                await self._timer_wakeup.wait()
            self._timer_wakeup = trio.Event()

    def _expire(self, now: int) -> None:
        released = []
        for leader in self.leaders.due(now):
            # The group's current staleness threshold and max extension govern this sweep.
            self.leaders.refresh_config(leader)
            delta = leader.engine.expire(now)
            released.append(leader.key)
            if delta is not None:
                self.commits.record(leader, delta, Cause.LOCK_EXPIRED)
            # IN_PROGRESS records are not under the lock: the sweep (every staleness threshold / 4)
            # and grace deadlines are part of the engine's next_deadline (docs/in-progress.md).
            for release in leader.engine.release_in_progress(now):
                if release.delta is not None:
                    self.commits.record(leader, release.delta, RELEASE_CAUSES[release.reason])
            self.leaders.schedule(leader)
        self.handle_events(self.coordinator.expire(now))
        for key in released:
            self.work.fire(key)

    def _park_idle(self) -> None:
        idle_groups = [g for g in self.coordinator.group_ids() if not self.coordinator.has_members(g)]
        self.leaders.park_idle(idle_groups)
        metrics.LEADERS.labels(state="active").set(len(self.leaders))
        metrics.LEADERS.labels(state="parked").set(self.leaders.parked_count)

    # ----- metadata ---------------------------------------------------------------------

    async def _metadata_loop(self) -> None:
        while True:
            await trio.sleep(self.config.metadata_refresh_interval_s)
            await self.refresher.refresh("periodic")

    def _metadata_refreshed(self) -> None:
        topics = [CoordinatorTopic(t.name, t.topic_id, len(t.partitions))
                  for t in self.cluster.snapshot.topics_by_name.values()]
        self.handle_events(self.coordinator.update_topic_metadata(topics, self.clock()))

    # ----- coordinator events ---------------------------------------------------------

    def handle_events(self, events: Iterable[object]) -> None:
        """Act on coordinator events (release records, initialise, persist group metadata)."""
        for event in events:
            if isinstance(event, MemberDeparted):
                # The share session stays: it belongs to the connection, and a client may still
                # send its final ShareAcknowledge after leaving (librdkafka leaves first).
                self._release_member(event.group_id, event.member_id)
            elif isinstance(event, PartitionsToInitialize):
                assert self._nursery is not None
                group_id, partitions = event.group_id, event.partitions
                self._nursery.start_soon(guarded, "partition-init",
                                         lambda g=group_id, p=partitions: self._initialize_partitions(g, p))
            elif isinstance(event, GroupEpochBumped):
                created = self._group_created.setdefault(event.group_id, self.wall_clock())
                self.commits.queue_group_records(
                    [state_store.group_metadata_record(event.group_id, event.group_epoch, created)]
                )
            elif isinstance(event, PartitionsDeleted):
                for tp in event.partitions:
                    key = (event.group_id, tp[0], tp[1])
                    leader = self.leaders.active(key)
                    if leader is not None:
                        self.commits.forget(leader)  # a snapshot written after the tombstone would revive it
                    if self.leaders.remove(key):
                        self.commits.queue_group_records(state_store.partition_tombstones(key))
            elif isinstance(event, AssignmentChanged):
                pass  # assignments travel in heartbeat responses; nothing to do here

    def holders_of_groups_coordinated_elsewhere(self) -> dict[str, set[str]]:
        """Scale-out: group -> members holding records on share-partitions led here, for the groups
        another instance coordinates (what :class:`proxy.share.peers.MembershipWatch` checks)."""
        held: dict[str, set[str]] = {}
        if self.ownership is None:
            return held
        for group_id in self.leaders.active_group_ids():  # a parked share-partition holds nothing
            if self.ownership.coordinates(group_id):
                continue  # departures come as the coordinator's own events
            for leader in self.leaders.of_group(group_id):
                if members := leader.engine.members():
                    held.setdefault(group_id, set()).update(members)
        return held

    def release_departed_member(self, group_id: str, member_id: str) -> None:
        """A member left the group at its coordinator on another instance: release what it holds
        here, as for a departure this instance's coordinator saw."""
        self._release_member(group_id, member_id)

    def _release_member(self, group_id: str, member_id: str) -> None:
        """The member left the group: release what it holds anywhere in `group_id` (see
        :meth:`_release_on`)."""
        self.forgotten.drop_member(group_id, member_id)
        self._release_on(self.leaders.of_group(group_id), member_id)

    def _end_session(self, session: SessionView) -> None:
        """A share session ended (final epoch, replaced by epoch 0, connection closed): release the
        member's records on that session's share-partitions only (Kafka's
        ``SharePartitionManager.releaseSession`` releases the session's cached partitions).

        Partitions the session forgot while the member held records there count as the session's
        (nothing else would release them before their locks expire). A partition that the member's
        session on another node also fetches is left alone: the engine knows records by member,
        not by session, and those may have been acquired through the live session.
        """
        key = session.key
        partitions = set(session.partitions) | self.forgotten.drop(key)
        for other in self.sessions.sessions_of_member(key.group_id, key.member_id):
            if other.key.node_id != key.node_id:
                partitions -= other.partitions
        leaders = [leader for leader in (self.leaders.active((key.group_id, *tp)) for tp in partitions)
                   if leader is not None]  # a parked share-partition holds nothing acquired
        self._release_on(leaders, key.member_id)

    def _release_on(self, leaders: Iterable[Leader], member_id: str) -> None:
        """Release what `member_id` holds on `leaders`: ACQUIRED records at once (no delivery
        counted), stale IN_PROGRESS ones at once, fresh IN_PROGRESS ones after the rebalance grace
        (the draft KIP's "Rebalance flow"; a rejoin with the same member id keeps them)."""
        now = self.clock()
        for leader in leaders:
            self.leaders.refresh_config(leader)  # the group's current staleness threshold and grace
            released = False
            delta = leader.engine.release_member(member_id, now=now)
            if delta is not None:
                self.commits.record(leader, delta, Cause.MEMBER_RELEASED)
                released = True
            stale = leader.engine.last_member_release
            if stale is not None and stale.delta is not None:
                self.commits.record(leader, stale.delta, Cause.STALE_RELEASED)
                released = True
            self._schedule(leader)  # records held for the grace have a deadline now
            if released:
                self.work.fire(leader.key)

    async def _initialize_partitions(self, group_id: str, partitions: Iterable[TopicIdPartition]) -> None:
        done = []
        for tp in partitions:
            if self.ownership is not None and not self.ownership.leads(*tp):
                # Scale-out: the instance leading it initialises it durably on its first fetch
                # (leaders.ensure) before serving it; the coordinator only records it as assignable.
                done.append(tp)
                continue
            try:
                await self.leaders.ensure((group_id, tp[0], tp[1]))
                done.append(tp)
            except (UpstreamError, PersistError) as exc:
                log.warning("share-partition initialisation failed", group=group_id, topic_id=str(tp[0]),
                            partition=tp[1], error=str(exc))
                self.coordinator.initialization_failed(group_id, [tp])
        if done:
            self.coordinator.mark_initialized(group_id, done)
            self.commits.queue_group_records([self.partitions_record(group_id)])

    def partitions_record(self, group_id: str) -> tuple[bytes, bytes | None]:
        """The group's record of its initialised share-partitions, as the coordinator has them now."""
        topic_names = {t.topic_id: t.name for t in self.cluster.snapshot.topics_by_id.values()}
        return state_store.group_partitions_record(
            group_id, list(self.coordinator.initialized_partitions(group_id)), topic_names)

    def group_deleted(self, group_id: str) -> None:
        """Forget what the service keeps of a deleted group beside the coordinator."""
        self._group_created.pop(group_id, None)

    # ----- connections ----------------------------------------------------------------

    def watch_connection(self, connection_id: int, closed: trio.Event) -> None:
        """Release a connection's sessions when it closes (KIP-932: sessions are per connection)."""
        if connection_id in self._watched_connections or self._nursery is None:
            return
        self._watched_connections.add(connection_id)

        async def watch() -> None:
            await closed.wait()
            self._watched_connections.discard(connection_id)
            for session in self.sessions.connection_closed(connection_id):
                log.debug("share session evicted with its connection", group=session.key.group_id,
                          member=session.key.member_id, node=session.key.node_id)
                self._end_session(session)

        self._nursery.start_soon(watch)

    # ----- ShareGroupHeartbeat / ShareGroupDescribe -------------------------------------

    async def heartbeat(self, request, *, client_id: str, client_host: str):
        subscribed = request.subscribed_topic_names
        if subscribed and any(name not in self.cluster.snapshot.topics_by_name for name in subscribed):
            # A topic the proxy has not seen yet: refresh (at most once a second) before assigning.
            # Within that second wait instead of skipping: a skipped refresh leaves the member
            # without an assignment for a whole heartbeat interval.
            await trio.sleep_until(self.refresher.last_refresh + 1.0)
            if trio.current_time() - self.refresher.last_refresh >= 1.0:
                await self.refresher.refresh("subscribed-topic")
        other_type = False
        if int(request.member_epoch) == 0 and not self.coordinator.has_group(request.group_id):
            # One group-id namespace: a new share group must not shadow an upstream group.
            try:
                other_type = await self.cluster.upstream_group_type(request.group_id) is not None
            except UpstreamError as exc:
                log.warning("cannot check upstream groups", group=request.group_id, error=str(exc))
        result = self.coordinator.heartbeat(
            request.group_id,
            request.member_id,
            int(request.member_epoch),
            self.clock(),
            rack_id=request.rack_id,
            subscribed_topic_names=subscribed,
            client_id=client_id,
            client_host=client_host,
            group_is_other_type=other_type,
        )
        self.handle_events(result.events)
        self._wake_timer(self.coordinator.next_deadline())
        return heartbeat_response(result)

    def describe(self, request):
        ownership = self.ownership
        if ownership is None:
            described = self.coordinator.describe(request.group_ids)
        else:
            here = [g for g in request.group_ids if ownership.coordinates(g)]
            local = iter(self.coordinator.describe(here))
            described = [next(local) if ownership.coordinates(g) else DescribedGroup(
                g, ErrorCode.not_coordinator, "Another proxy instance coordinates this group (scale-out).")
                for g in request.group_ids]
        return describe_response(described, include_authorized_operations=bool(request.include_authorized_operations))

    # ----- scale-out: state partitions gained and given up -------------------------------------

    async def gain(self, partitions: frozenset[int], recovered: state_store.RecoveredState) -> None:
        """Serve the share-partitions and groups homed on ``partitions`` (fenced and replayed by the
        caller; ``recovered`` holds only their records). Nothing homed there is served (ownership)
        before the restore has put all of it in place."""
        assert self.ownership is not None
        await self.restore(recovered)
        self.ownership.owned = self.ownership.owned | partitions
        self.work.fire()

    async def give_up(self, partitions: frozenset[int], *, flush: bool) -> None:
        """Stop serving what is homed on ``partitions`` (another instance takes them over): refuse it
        from now on, write what is dirty there when ``flush`` (a clean revocation; never when the
        partitions were lost: this instance's writes are fenced or about to be), then drop the
        share-partitions and groups from memory. Acquired records are not written: the new owner's
        replay finds them available with their previous delivery count."""
        ownership = self.ownership
        assert ownership is not None
        ownership.owned = ownership.owned - partitions
        leaving = [key for key in self.leaders.keys() if ownership.home_of_partition(key[1], key[2]) in partitions]
        for listener in self.hand_over_listeners:
            listener(leaving)
        if flush:
            dirty = [leader for key in leaving if (leader := self.leaders.active(key)) is not None
                     and leader.durable < leader.version]
            if dirty:
                await self.commits.flush(dirty)
        for key in leaving:
            leader = self.leaders.active(key)
            self.leaders.remove(key)  # marks it removed: a write in flight is never retried
            if leader is not None:
                self.commits.forget(leader)
                self.reader.cache_budget.drop(leader)
        groups = [g for g in self.coordinator.group_ids() if ownership.home_of_group(g) in partitions]
        for group_id in groups:
            self.coordinator.forget_group(group_id)
            self._group_created.pop(group_id, None)
        self.commits.forget_group_records(lambda route: ownership.home_of_route(route) in partitions)
        self.work.fire()
        log.info("share state handed over", partitions=sorted(partitions), share_partitions=len(leaving),
                 groups=len(groups), flushed=flush)

    def membership_error(self, group_id: str, member_id: str) -> tuple[ErrorCode, str] | None:
        """A share session is served only to a member of the group (else nothing is created).

        Kafka's brokers (4.1/4.2) do not ask the group coordinator here: they open a session for
        any member id and fail per partition later. The proxy refuses up front with the codes
        Kafka's group coordinator uses for the same conditions.
        """
        if not self.coordinator.has_group(group_id):
            return ErrorCode.group_id_not_found, f"Share group {group_id} not found."
        if not self.coordinator.has_member(group_id, member_id):
            return ErrorCode.unknown_member_id, f"Member {member_id} is not a member of share group {group_id}."
        return None

    # ----- acknowledgements -------------------------------------------------------------

    def _apply_acknowledgements(
        self, session: SessionKey, topics: Iterable[object], denied: Set[uuid.UUID] = frozenset(),
    ) -> tuple[AckResults, list[tuple[TopicIdPartition, Leader, int]]]:
        """Stage acknowledgement batches sent to `session`'s node in the engines (atomic per
        partition, in memory). Those of `denied` topics are answered TOPIC_AUTHORIZATION_FAILED
        and change nothing.

        Returns the per-partition results and the state versions that must be durable before
        any of those results may be reported as a success.
        """
        results: AckResults = {}
        waits: list[tuple[TopicIdPartition, Leader, int]] = []
        now = self.clock()
        released: list[SharePartitionKey] = []  # where records became acquirable at once
        group_id, member_id = session.group_id, session.member_id
        watching = self.forgotten.watching(session)
        acknowledged: list[tuple[TopicIdPartition, int]] = []  # (partition, newest lock acknowledged there)
        for topic in topics:
            for partition in topic.partitions:
                tp = (topic.topic_id, int(partition.partition_index))
                batches = partition.acknowledgement_batches
                if not batches:
                    continue
                if tp[0] in denied:
                    results[tp] = TOPIC_DENIED
                    continue
                if self.ownership is not None and not self.ownership.leads(*tp):
                    results[tp] = NOT_LED_HERE
                    continue
                leader = self.leaders.active((group_id, *tp))  # a parked one holds nothing acquired
                if leader is None:
                    code = (ErrorCode.unknown_topic_or_partition if self.cluster.topic_by_id(tp[0]) is None
                            else ErrorCode.invalid_record_state)
                    results[tp] = (code, "No records are acquired on this share-partition.")
                    continue
                ranges = [
                    AckRange(int(b.first_offset), int(b.last_offset), tuple(int(t) for t in b.acknowledge_types))
                    for b in batches
                ]
                # Read before staging: staged records no longer count as the member's acquisitions.
                newest = max(
                    (leader.engine.newest_acquisition(member_id, r.first_offset, r.last_offset) for r in ranges),
                    default=0,
                ) if watching else 0
                try:
                    staged = leader.engine.stage_acknowledge(member_id, ranges, now=now)
                except ShareStateError as exc:
                    results[tp] = (ErrorCode(exc.error_code), str(exc))
                    continue
                results[tp] = (ErrorCode.none, None)
                observe.EVENTS.acknowledged(leader.key, ranges, staged.delta if staged is not None else None)
                if newest:
                    acknowledged.append((tp, newest))
                # A staged acknowledgement frees record locks and releases records only once its
                # write is durable (the SPSO moves on commit, as Kafka's does after its persister
                # write), and that wakes waiting fetches (_settled). Woken now as well, they only
                # looked and waited again. A change applied at once wakes them now.
                if staged is not None and not staged.change_id:
                    released.append(leader.key)
                self._schedule(leader)  # a renewal moves the lock deadline
                if staged is not None:
                    waits.append((tp, leader, self.commits.record(leader, staged.delta, Cause.ACKNOWLEDGED, staged)))
                elif leader.durable < leader.version:
                    # Nothing changed now but an earlier change of this partition is not durable
                    # yet: answer only once it is.
                    waits.append((tp, leader, self.commits.touch(leader)))
        if acknowledged:
            released += self._release_abandoned(session, acknowledged)
        for key in released:
            self.work.fire(key)
        return results, waits

    def _release_abandoned(self, session: SessionKey, acknowledged) -> list[SharePartitionKey]:
        """Release what `member_id` still holds on partitions it forgot and was handed before the
        records it has just acknowledged: those will never be acknowledged (Kafka's Java client
        before 4.4 drops them; see sessions.ForgottenPartitions). Counted as a delivery, like a lock
        expiry, and not staged: no client waits on it. Returns the share-partitions it released on."""
        released: list[SharePartitionKey] = []
        group_id, member_id = session.group_id, session.member_id
        view = self.sessions.get(session.node_id, group_id, member_id)
        fetched = view.partitions if view is not None else frozenset()
        settled = []  # nothing of the member's there, nor fetched again: nothing left to abandon
        for tp, mark in self.forgotten.abandoned(session, acknowledged, acquisition_mark()):
            leader = self.leaders.active((group_id, *tp))
            if leader is None:
                continue
            delta = leader.engine.release_abandoned(member_id, mark)
            if delta is not None:
                self.commits.record(leader, delta, Cause.LOCK_EXPIRED)
                released.append(leader.key)
                log.debug("released records abandoned on a forgotten partition", group=group_id,
                          member=member_id, topic_id=str(tp[0]), partition=tp[1])
            elif tp not in fetched and member_id not in leader.engine.members():
                settled.append(tp)
        if settled:
            self.forgotten.settled(session, settled)
        return released

    async def _await_durable(self, results: AckResults, waits) -> None:
        """Turn each result whose state write failed (and was rolled back) into a retriable error."""
        for tp, leader, version in waits:
            try:
                await self.commits.durable(leader, version)
            except PersistError as exc:
                metrics.ACKNOWLEDGEMENTS_ROLLED_BACK.inc()
                results[tp] = (ErrorCode.kafka_storage_error,
                               f"The acknowledgement could not be made durable and was rolled back; retry. ({exc})")
        metrics.ACKNOWLEDGEMENTS.inc(sum(1 for code, _ in results.values() if code is ErrorCode.none))

    # ----- ShareFetch / ShareAcknowledge ------------------------------------------------

    async def share_fetch(self, request, version: int, connection_id: int, *, node_id: int,
                          max_bytes_cap: int | None = None, check_topics: TopicCheck | None = None) -> FetchOutcome:
        """Serve a ShareFetch that came in on the listener of broker `node_id` (its session's node).

        `check_topics` (authorization): partitions of topics it denies are answered
        TOPIC_AUTHORIZATION_FAILED, acquire nothing and their acknowledgements are not applied.
        """
        group_id, member_id = request.group_id, request.member_id
        if not group_id or not member_id:
            return FetchOutcome(ErrorCode.invalid_request, "GroupId and MemberId are required.")
        epoch = int(request.share_session_epoch)
        # Scale-out: a leader whose instance does not coordinate the group cannot check membership;
        # as Kafka's partition leaders, it serves the member (its coordinator checked it).
        coordinated = self.ownership is None or self.ownership.coordinates(group_id)
        if epoch == 0 and coordinated:  # opening a session: only for a member (later epochs need the session)
            refused = self.membership_error(group_id, member_id)
            if refused is not None:
                return FetchOutcome(*refused)
        fetch_partitions = [
            (t.topic_id, int(p.partition_index)) for t in request.topics for p in t.partitions
        ]
        forgotten = [
            (t.topic_id, int(p)) for t in request.forgotten_topics_data for p in t.partitions
        ]
        has_acks = any(p.acknowledgement_batches for t in request.topics for p in t.partitions)
        try:
            context = self.sessions.share_fetch(
                node_id, group_id, member_id, epoch, connection_id,
                fetch_partitions=fetch_partitions, forgotten_partitions=forgotten, has_acknowledgements=has_acks,
            )
        except ShareSessionError as exc:
            return FetchOutcome(exc.code, str(exc))

        key = SessionKey(node_id, group_id, member_id)
        denied: Set[uuid.UUID] = frozenset()
        if check_topics is not None:
            # Kafka authorizes every partition of the session and of the request, after the
            # session step (KafkaApis.handleShareFetchRequest).
            denied = await check_topics({tp[0] for tp in context.session.partitions}
                                        | {t.topic_id for t in request.topics})
        ack_results, ack_waits = (self._apply_acknowledgements(key, request.topics, denied)
                                  if has_acks else ({}, []))
        outcome = FetchOutcome(acknowledgements=ack_results,
                               lock_ms=self.coordinator.group_config(group_id).record_lock_duration_ms)
        if context.kind is ContextKind.FINAL:
            await self._await_durable(ack_results, ack_waits)
            self._end_session(context.session)
            return outcome
        if context.replaced is not None:
            self._end_session(context.replaced)
        if context.removed:
            # Records the member holds or gets there may never be acknowledged: watch them (see
            # sessions.ForgottenPartitions).
            self.forgotten.forgot(key, context.removed)
        if self.forgotten.watching(key):
            self.forgotten.fetch_started(key, acquisition_mark())

        # The state write of the acknowledgements and the read of new records overlap: the writer
        # task hands the write to the producer as soon as this task first yields, and the response
        # goes out once both are done, so an acknowledgement is still reported only once durable,
        # but the fetch does not wait behind the write. (Waiting for it after the read, in this
        # task, spares a task of its own and the turn its wake-up took.)
        # A member that has left the group (or timed out) keeps its connection and session for
        # its last acknowledgements, but acquires nothing more: its heartbeat tells it to rejoin.
        renew = getattr(request, "is_renew_ack", False)
        allowed = ([tp for tp in context.session.partitions if tp[0] not in denied] if denied
                   else list(context.session.partitions))  # (testing even an empty set hashes each id)
        not_led = [] if self.ownership is None else [tp for tp in allowed if not self.ownership.leads(*tp)]
        if not_led:
            allowed = [tp for tp in allowed if tp not in not_led]
        if not renew and allowed and (not coordinated or self.coordinator.has_member(group_id, member_id)):
            outcome.fetched = await self.reader.fetch_records(
                allowed, group_id, member_id, _fetch_params(request, max_bytes_cap))
        for tp in not_led:  # scale-out: the client re-reads metadata and goes to the leader
            outcome.fetched[tp] = Fetched(error=NOT_LED_HERE[0], message=NOT_LED_HERE[1])
        await self._await_durable(ack_results, ack_waits)
        if denied and not renew:
            for tp in context.session.partitions:
                if tp[0] in denied:
                    outcome.fetched[tp] = Fetched(error=TOPIC_DENIED[0])
        return outcome

    async def share_acknowledge(self, request, version: int, connection_id: int, *,
                                node_id: int, check_topics: TopicCheck | None = None) -> AcknowledgeOutcome:
        """Serve a ShareAcknowledge that came in on the listener of broker `node_id`; acknowledgements
        of topics `check_topics` denies are answered TOPIC_AUTHORIZATION_FAILED and not applied."""
        group_id, member_id = request.group_id, request.member_id
        if not group_id or not member_id:
            return AcknowledgeOutcome(ErrorCode.invalid_request, "GroupId and MemberId are required.")
        try:
            context = self.sessions.share_acknowledge(node_id, group_id, member_id,
                                                      int(request.share_session_epoch), connection_id)
        except ShareSessionError as exc:
            return AcknowledgeOutcome(exc.code, str(exc))
        denied: Set[uuid.UUID] = frozenset()
        if check_topics is not None:
            denied = await check_topics({t.topic_id for t in request.topics})
        results, waits = self._apply_acknowledgements(SessionKey(node_id, group_id, member_id), request.topics,
                                                      denied)
        await self._await_durable(results, waits)
        if context.kind is ContextKind.FINAL:
            self._end_session(context.session)
        lock_ms = self.coordinator.group_config(group_id).record_lock_duration_ms
        return AcknowledgeOutcome(acknowledgements=results, lock_ms=lock_ms)


def _fetch_params(request, max_bytes_cap: int | None = None) -> FetchParams:
    max_wait_ms = int(request.max_wait.total_seconds() * 1000)
    max_bytes = int(request.max_bytes) if request.max_bytes else 50 * 1024 * 1024
    return FetchParams(
        max_records=int(getattr(request, "max_records", 0) or 0) or 500,
        max_bytes=min(max_bytes, max_bytes_cap) if max_bytes_cap else max_bytes,
        batch_size=int(getattr(request, "batch_size", 0) or 0) or None,
        mode=AcquireMode(int(getattr(request, "share_acquire_mode", 0) or 0)),
        deadline=trio.current_time() + max_wait_ms / 1000,
        waits=max_wait_ms > 0,
    )


__all__ = ["AcknowledgeOutcome", "FetchOutcome", "ShareService", "ShareServiceConfig", "monotonic_ms",
           "wall_clock_ms"]
