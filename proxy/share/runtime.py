"""Start the share-group service inside a running proxy.

Order matters: the state topic is created if missing and replayed to its end *before* the share
APIs are routed, so no client is ever served from partial state (an acknowledged record must
never be redelivered after a restart). Until the upstream cluster answers, start-up waits and
retries; the proxy prints its ready line only afterwards.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog
import trio

from codec import extensions
from codec.extensions import DEFAULT_DESCRIBE_IN_FLIGHT_KEY, DEFAULT_MARK_IN_PROGRESS_KEY
from codec.registry import DEFAULT_REGISTRY
from confluent_kafka.admin import AdminClient

from proxy.allocator import release_freed_memory
from proxy.apiversions import VersionRange
from proxy.collector import refreeze
from proxy.config import HostPort
from proxy.errors import ConfigError
from proxy.security import librdkafka_config, peer_security
from proxy.server import Proxy
from proxy.upstream import UpstreamClient, open_upstream
from proxy.share import metrics, observe, state_layout, state_store
from proxy.share.admin_routes import admin_routes, peer_routes, register_admin_versions
from proxy.share.peers import (
    PEER_APIS,
    PEER_CLIENT_ID_PREFIX,
    Connect,
    GroupConfigForwarder,
    GroupConfigMirror,
    InFlightFanOut,
    MembershipWatch,
    PeerConnections,
    PeerStateClient,
    PeerStateServer,
)
from proxy.share.authorization import AuthorizationPolicy
from proxy.share.cluster import Cluster
from proxy.share.commit import DEFAULT_WRITES_IN_FLIGHT
from proxy.share.dead_letters import DeadLetterCluster, DeadLetterSettings, DeadLetterWriter
from proxy.share.event_log import EventLog, EventLogSettings, EventSink, ensure_event_topic
from proxy.share.coordinator import CoordinatorConfig, ShareGroupConfig, ShareGroupLimits, parse_auto_offset_reset
from proxy.share.group_configs import GroupConfigs, group_config_routes
from proxy.share.group_admin import GroupAdmin
from proxy.share.group_guard import CONSUMER_GROUP_HEARTBEAT, JOIN_GROUP, ConsumerGroupGuard
from proxy.share.manager import ShareService, ShareServiceConfig, monotonic_ms, wall_clock_ms
from proxy.share.persister import (
    StateLogWriter,
    StateTopicSpec,
    ensure_state_topics,
    read_state_topic,
)
from proxy.share.in_flight import in_flight_routes, in_flight_version_range
from proxy.share.progress import extension_features, progress_routes, progress_version_range
from proxy.share.routes import served_version_ranges, share_routes
from proxy.share.state_delta import DeltaPolicy
from proxy.share.routing import InstanceRouting
from proxy.share.state_lanes import TransactionalStateWriter
from proxy.vnodes import Instance
from proxy.share.ownership import (
    DEFAULT_GROUP_PREFIX,
    InstanceIdentity,
    OwnershipMember,
    ServiceOwnership,
    describe_members,
    refuse_taken_slot,
    slot_of_instance,
)
from proxy.share.state_topic_guard import StateTopics, state_topic_routes
from proxy.share.supervise import guarded, supervised

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ShareSettings:
    """Broker-level share-group settings (Kafka's ``group.share.*`` names in comments)."""

    state_topic: str = "__share_proxy_state"
    state_topic_partitions: int = 12
    state_topic_replication_factor: int | None = None  # None: min(3, brokers)
    state_topic_min_insync_replicas: int | None = None  # None: min(2, replication factor)
    max_share_sessions: int = 2000  # group.share.max.share.sessions
    max_share_session_partitions: int = 10_000  # per session (no Kafka counterpart)
    max_share_session_partitions_total: int = 200_000  # over all sessions (no Kafka counterpart)
    record_lock_duration_ms: int = 30_000  # group.share.record.lock.duration.ms
    min_record_lock_duration_ms: int = 15_000  # group.share.min.record.lock.duration.ms
    delivery_count_limit: int = 5  # group.share.delivery.count.limit
    session_timeout_ms: int = 45_000  # group.share.session.timeout.ms
    min_session_timeout_ms: int = 45_000  # group.share.min.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.share.heartbeat.interval.ms
    min_heartbeat_interval_ms: int = 5_000  # group.share.min.heartbeat.interval.ms
    partition_max_record_locks: int = 2_000  # group.share.partition.max.record.locks
    # Bounds on per-group configs (KIP-1240 names); a proxy default outside them widens them.
    max_record_lock_duration_ms: int = 60_000  # group.share.max.record.lock.duration.ms
    max_session_timeout_ms: int = 60_000  # group.share.max.session.timeout.ms
    max_heartbeat_interval_ms: int = 15_000  # group.share.max.heartbeat.interval.ms
    min_delivery_count_limit: int = 2  # group.share.min.delivery.count.limit
    max_delivery_count_limit: int = 10  # group.share.max.delivery.count.limit
    min_partition_max_record_locks: int = 100  # group.share.min.partition.max.record.locks
    max_partition_max_record_locks: int = 4_000  # group.share.max.partition.max.record.locks
    # IN_PROGRESS (draft KIP KAFKA-20458, docs/in-progress.md): group.share.in.progress.*, and bounds.
    in_progress_staleness_threshold_ms: int = 90_000
    in_progress_max_lock_extension_ms: int = 1_800_000
    in_progress_rebalance_grace_ms: int = 5_000
    min_in_progress_staleness_threshold_ms: int = 1_000
    max_in_progress_staleness_threshold_ms: int = 3_600_000
    min_in_progress_max_lock_extension_ms: int = 1_000
    max_in_progress_max_lock_extension_ms: int = 86_400_000
    min_in_progress_rebalance_grace_ms: int = 0
    max_in_progress_rebalance_grace_ms: int = 600_000
    auto_offset_reset: str = "latest"  # share.auto.offset.reset default for new groups
    metadata_refresh_ms: int = 10_000  # new topics/partitions reach assignments within this
    state_write_timeout_ms: int = 30_000  # the state producer's delivery timeout
    state_linger_ms: int = 0  # the state producer's linger.ms
    state_writes_in_flight: int = DEFAULT_WRITES_IN_FLIGHT  # the commit pipeline's writes on their way at once
    state_producers: int = 4  # idempotent producers the state writes are spread over by partition
    # Cumulative ShareUpdates between snapshots (--state-deltas, proxy.share.state_delta), and at most
    # this many updates per snapshot (--state-snapshot-every).
    state_deltas: bool = True
    state_fencing: str = "none"  # none | transactional (proxy/share/state_lanes.py)
    instance_id: str | None = None  # scale-out (issue 15): ScaleOut below
    instance_slot: int | None = None
    ownership_session_timeout_ms: int = 10_000
    share_config_refresh_ms: int = 2_000
    state_transactional_id_prefix: str = "ksp-state"
    state_snapshot_every: int = 100
    read_cache_bytes: int = 64 * 1024 * 1024  # one budget for every share-partition's read cache
    upstream_connections: int = 32  # per broker: ListOffsets, ListGroups, record reads
    long_poll_connections: int = 8  # per broker: Fetch long polls, apart so they cannot starve the above
    metrics_per_partition: bool = False  # share-group series per share-partition too (--metrics-per-partition)
    # The share-group event log (proxy/share/event_log.py, docs/event-log.md).
    share_events_enable: bool = True
    share_events_topic: str = "__share_group_events"
    share_events_buffer_events: int = 100_000
    share_events_linger_ms: int = 100
    share_events_retention_ms: int = 604_800_000
    share_events_partitions: int = 1
    dead_letter_auto_create_topics: bool = False  # errors.deadletterqueue.auto.create.topics.enable
    dead_letter_topic_name_prefix: str = "dlq."  # errors.deadletterqueue.topic.name.prefix

    def event_log_settings(self) -> EventLogSettings:
        return EventLogSettings(
            topic=self.share_events_topic,
            buffer_events=self.share_events_buffer_events,
            linger_ms=self.share_events_linger_ms,
            retention_ms=self.share_events_retention_ms,
            partitions=self.share_events_partitions,
            delivery_timeout_ms=self.state_write_timeout_ms,
        )

    def coordinator_config(self) -> CoordinatorConfig:
        limits = ShareGroupLimits(
            min_session_timeout_ms=min(self.min_session_timeout_ms, self.session_timeout_ms),
            max_session_timeout_ms=max(self.max_session_timeout_ms, self.session_timeout_ms),
            min_heartbeat_interval_ms=min(self.min_heartbeat_interval_ms, self.heartbeat_interval_ms),
            max_heartbeat_interval_ms=max(self.max_heartbeat_interval_ms, self.heartbeat_interval_ms),
            min_record_lock_duration_ms=min(self.min_record_lock_duration_ms, self.record_lock_duration_ms),
            max_record_lock_duration_ms=max(self.max_record_lock_duration_ms, self.record_lock_duration_ms),
            min_delivery_count_limit=min(self.min_delivery_count_limit, self.delivery_count_limit),
            max_delivery_count_limit=max(self.max_delivery_count_limit, self.delivery_count_limit),
            min_partition_max_record_locks=min(self.min_partition_max_record_locks, self.partition_max_record_locks),
            max_partition_max_record_locks=max(self.max_partition_max_record_locks, self.partition_max_record_locks),
            min_in_progress_staleness_threshold_ms=min(self.min_in_progress_staleness_threshold_ms,
                                                       self.in_progress_staleness_threshold_ms),
            max_in_progress_staleness_threshold_ms=max(self.max_in_progress_staleness_threshold_ms,
                                                       self.in_progress_staleness_threshold_ms),
            min_in_progress_max_lock_extension_ms=min(self.min_in_progress_max_lock_extension_ms,
                                                      self.in_progress_max_lock_extension_ms),
            max_in_progress_max_lock_extension_ms=max(self.max_in_progress_max_lock_extension_ms,
                                                      self.in_progress_max_lock_extension_ms),
            min_in_progress_rebalance_grace_ms=min(self.min_in_progress_rebalance_grace_ms,
                                                   self.in_progress_rebalance_grace_ms),
            max_in_progress_rebalance_grace_ms=max(self.max_in_progress_rebalance_grace_ms,
                                                   self.in_progress_rebalance_grace_ms),
        )
        defaults = ShareGroupConfig(
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            record_lock_duration_ms=self.record_lock_duration_ms,
            delivery_count_limit=self.delivery_count_limit,
            partition_max_record_locks=self.partition_max_record_locks,
            auto_offset_reset=parse_auto_offset_reset(self.auto_offset_reset),
            in_progress_staleness_threshold_ms=self.in_progress_staleness_threshold_ms,
            in_progress_max_lock_extension_ms=self.in_progress_max_lock_extension_ms,
            in_progress_rebalance_grace_ms=self.in_progress_rebalance_grace_ms,
        )
        return CoordinatorConfig(group_defaults=defaults, limits=limits)


def _start_event_log(service: ShareService, settings: EventLogSettings, bootstrap: str, cluster: Cluster,
                     nursery: trio.Nursery, client_config: dict[str, str] | None = None) -> EventLog:
    """Publish the share-group event log from the commit pipeline's change hook; the topic is
    created in the background (a failure is logged and retried, never stops the proxy)."""
    sink = EventSink(bootstrap, delivery_timeout_ms=settings.delivery_timeout_ms, client_config=client_config)
    sink.start()

    def topic_name(topic_id):
        info = cluster.topic_by_id(topic_id)
        return None if info is None else info.name

    event_log = EventLog(sink, settings, topic_name=topic_name, wall_clock=wall_clock_ms,
                         ensure_topic=lambda: ensure_event_topic(bootstrap, settings, client_config=client_config))
    service.commits.subscribe(event_log.on_change)
    service.closers.append(event_log.aclose)
    nursery.start_soon(guarded, "event-log-topic", event_log.ensure_topic_task)
    nursery.start_soon(supervised, "event-log", event_log.run)
    return event_log


REPLAY_DELAY_ENV = "KSP_INJECT_REPLAY_DELAY_S"


async def _injected_replay_delay() -> None:
    """Tests only: KSP_INJECT_REPLAY_DELAY_S=N makes replay take N seconds longer (readiness tests)."""
    seconds = float(os.environ.get(REPLAY_DELAY_ENV, "0") or 0)
    if seconds > 0:
        log.warning("replay delayed on purpose", env=REPLAY_DELAY_ENV, seconds=seconds)
        await trio.sleep(seconds)


async def _settled_layout(writer, topic: str, bootstrap: str, client_config) -> int:
    """Scale-out start: the state topic's partition count, once it is known to be in layout 2 for
    it. A topic with no records at all is marked here (several instances starting together write
    the same marker); one with records but no matching marker must be migrated first by a single
    instance without --instance-id (it reads the whole topic, which only a single owner may)."""
    partitions = await writer.partition_count(topic)
    first = await trio.to_thread.run_sync(
        lambda: fold_state_topic(bootstrap, topic, client_config, only=[0], partitions=partitions),
        abandon_on_cancel=True)
    if first.layout == state_store.LayoutMarker(state_store.LAYOUT, partitions):
        return partitions
    if await trio.to_thread.run_sync(lambda: _has_records(bootstrap, topic, client_config), abandon_on_cancel=True):
        raise ConfigError(f"state topic {topic!r} is not in layout 2 for its {partitions} partitions: start one "
                          "instance without --instance-id once to migrate it (docs/scale-out.md)")
    marker = StateLogWriter(bootstrap, client_config=client_config)
    marker.start()
    try:
        await marker.write(topic, [state_store.layout_record(partitions)])
    finally:
        await marker.aclose()
    log.info("empty state topic marked layout 2", topic=topic, partitions=partitions)
    return partitions


#: How long after a change of the state partitions owned the collector's frozen set is renewed.
FREEZE_DELAY_S = 0.5


class ScaleOut:
    """This instance's part in a scale-out deployment (--instance-id; docs/scale-out.md): its
    member of the ownership group, and what gaining and losing state partitions does to the share
    service (fence and replay, or flush and drop)."""

    def __init__(self, service: ShareService, writer: TransactionalStateWriter, settings: ShareSettings,
                 bootstrap: str, client_config: dict[str, str] | None, partitions: int, proxy: Proxy) -> None:
        self.service = service
        self.writer = writer
        self.settings = settings
        self.bootstrap = bootstrap
        self.client_config = client_config
        self.partitions = partitions
        self.proxy = proxy
        self.directory = proxy.directory
        self.slot = slot_of_instance(settings.instance_id, settings.instance_slot)
        self.group_id = f"{DEFAULT_GROUP_PREFIX}.{settings.state_topic}"
        self.member: OwnershipMember | None = None
        # Set by the runtime once the admin routes exist: the coordinator's side of the peer RPCs.
        self.group_admin: GroupAdmin | None = None
        self.group_configs: GroupConfigs | None = None
        self.event_log: EventLog | None = None  # set when the event log is on
        self.peer_connections: PeerConnections | None = None
        self.in_flight_key = DEFAULT_DESCRIBE_IN_FLIGHT_KEY
        self.nursery: trio.Nursery | None = None  # the service's, from join on
        self._freeze_pending = False

    async def check_slot(self) -> None:
        """Refuse to start (OwnershipError) when another live instance claims this slot."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **(self.client_config or {})})
        members = await trio.to_thread.run_sync(describe_members, admin, self.group_id, abandon_on_cancel=True)
        refuse_taken_slot(members, self.settings.instance_id, self.slot)

    async def join(self, bootstrap_port: int, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        identity = InstanceIdentity(self.settings.instance_id, self.slot, self.directory.advertised_host,
                                    bootstrap_port, self.directory.port_base or 0)
        self.member = OwnershipMember(
            self.bootstrap, self.settings.state_topic, identity, group_id=self.group_id,
            on_gained=self._gained, on_revoked=self._revoked, on_lost=self._lost,
            session_timeout_ms=self.settings.ownership_session_timeout_ms, client_config=self.client_config,
            partitions=self.partitions)
        await nursery.start(self.member.run)
        member, cluster = self.member, self.service.cluster

        def topic_id_of(name: str):
            info = cluster.snapshot.topics_by_name.get(name)
            return None if info is None else info.topic_id

        # From now on Metadata / FindCoordinator / DescribeCluster name the owning instances (a
        # ShareFetch / ShareAcknowledge refused here names no leader: the client asks Metadata).
        routing = self.proxy.endpoint_rewrite.routing = InstanceRouting(
            self.service.ownership, lambda: member.map,
            Instance(self.slot, identity.host, identity.port_base), topic_id_of)
        if self.peer_connections is not None:
            connect, timeout_s = self.peer_connections.connect, self.settings.state_write_timeout_ms / 1000
            if self.group_admin is not None:
                self.group_admin.peers = PeerStateClient(self.slot, routing.partition_owner, connect,
                                                         timeout_s=timeout_s)
            if self.group_configs is not None:
                self.group_configs.forwarder = GroupConfigForwarder(
                    self.slot, routing.group_coordinator, lambda: member.map.instances, connect, timeout_s=timeout_s)
            coordinator_elsewhere = functools.partial(self._coordinator_elsewhere, routing)
            self._mirror_group_configs(coordinator_elsewhere, connect, nursery)
            nursery.start_soon(MembershipWatch(
                self.service.holders_of_groups_coordinated_elsewhere, coordinator_elsewhere, connect,
                self.service.release_departed_member, interval_s=self.settings.share_config_refresh_ms / 1000).run)
            self.service.in_flight_fan_out = InFlightFanOut(
                extensions.describe_in_flight(self.in_flight_key), routing.group_coordinator, routing.partition_owner,
                connect, timeout_s=timeout_s)
        log.info("joined the ownership group", group=self.group_id, instance=identity.instance_id, slot=self.slot)

    def _coordinator_elsewhere(self, routing: InstanceRouting, group_id: str) -> InstanceIdentity | None:
        """The live instance coordinating `group_id` when it is another one; else None."""
        owner = routing.group_coordinator(group_id)
        return owner if owner is not None and owner.slot != self.slot else None

    def _mirror_group_configs(self, coordinator_elsewhere: Callable[[str], InstanceIdentity | None],
                              connect: Connect, nursery: trio.Nursery) -> None:
        """Leaders read the configs of groups coordinated elsewhere from their coordinators."""
        service, ownership, coordinator = self.service, self.service.ownership, self.service.coordinator

        def groups() -> set[str]:
            return {group_id for group_id in service.leaders.group_ids() if not ownership.coordinates(group_id)}

        mirror = GroupConfigMirror(
            groups, coordinator_elsewhere, connect,
            lambda group_id, overrides: coordinator.set_group_config(group_id, overrides, replace_all=True),
            coordinator.group_config_overrides, interval_s=self.settings.share_config_refresh_ms / 1000)

        async def before_initialise(group_id: str) -> None:
            if not ownership.coordinates(group_id):
                await mirror.before_first_load(group_id)

        service.leaders.before_initialise = before_initialise
        nursery.start_soon(mirror.run)

    async def leave(self) -> None:
        """Leave the group: owned partitions are flushed and handed over (on_revoked) first."""
        if self.member is not None:
            await self.member.aclose()
        if self.peer_connections is not None:
            await self.peer_connections.aclose()

    async def _gained(self, partitions: frozenset[int]) -> None:
        topic = self.settings.state_topic
        started = trio.current_time()
        delay = 0.5
        while True:  # the rebalance waits: a partition is served only once fenced and replayed
            try:
                await self.writer.fence(topic, partitions)
                recovered = await trio.to_thread.run_sync(
                    lambda: fold_state_topic(self.bootstrap, topic, self.client_config, only=partitions,
                                             partitions=self.partitions, skip_misplaced=True, groups_complete=False),
                    abandon_on_cancel=True)
                break
            except Exception as exc:  # noqa: BLE001 - PersistError or any confluent-kafka error
                log.warning("gained state partitions not loadable yet; retrying", partitions=sorted(partitions),
                            error=str(exc), retry_in_s=delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 10.0)
        await self.service.gain(partitions, recovered)
        self._freeze_soon("gained")
        # What the replay read is garbage now (as after start-up); trimmed off the loop's thread.
        await trio.to_thread.run_sync(release_freed_memory)
        for partition in partitions:
            metrics.STATE_PARTITION_OWNED.labels(str(partition)).set(1)
        log.info("state partitions gained", partitions=sorted(partitions), records=recovered.records,
                 groups=len(recovered.groups), share_partitions=len(recovered.partitions),
                 misplaced=recovered.misplaced, seconds=round(trio.current_time() - started, 3))

    async def _revoked(self, partitions: frozenset[int]) -> None:
        await self.service.give_up(partitions, flush=True)
        if self.event_log is not None:
            # The flush above settled their last changes: their events go out before the new owner's.
            await self.event_log.hand_over(timeout_s=self.settings.state_write_timeout_ms / 1000)
        await self._released(partitions)

    async def _lost(self, partitions: frozenset[int]) -> None:
        # Declared dead (frozen or cut off): another instance may own these already, so nothing is
        # written (the lanes are fenced or about to be).
        await self.service.give_up(partitions, flush=False)
        await self._released(partitions)

    async def _released(self, partitions: frozenset[int]) -> None:
        await self.writer.release(self.settings.state_topic, partitions)
        for partition in partitions:
            metrics.STATE_PARTITION_OWNED.labels(str(partition)).set(0)
        self._freeze_soon("released")

    def _freeze_soon(self, change: str) -> None:
        """After a change of the state partitions owned, what start-up froze is frozen again with
        today's state (proxy.collector.refreeze; nothing when start-up froze nothing,
        --gc-threshold 0), FREEZE_DELAY_S later in a task of its own: the collection holds Python's
        lock throughout, so run at once it would hold up the ownership thread's side of the
        rebalance too; and changes close together (a revocation, then the next round's gain) share it."""
        assert self.nursery is not None  # ownership changes come once joined
        if not self._freeze_pending:
            self._freeze_pending = True
            self.nursery.start_soon(self._freeze_later, change)

    async def _freeze_later(self, change: str) -> None:
        await trio.sleep(FREEZE_DELAY_S)
        self._freeze_pending = False  # a change from now on needs a freeze of its own
        started = trio.current_time()
        frozen = refreeze()
        if frozen:
            log.info("live objects frozen again", after=change, objects=frozen,
                     seconds=round(trio.current_time() - started, 3))


def _has_records(bootstrap: str, topic: str, client_config: Mapping[str, str] | None) -> bool:
    """Whether `topic` holds any record (read up to the first one only)."""
    records = read_state_topic(bootstrap, topic, client_config=client_config)
    try:
        return next(records, None) is not None
    finally:
        records.close()


def fold_state_topic(bootstrap: str, topic: str, client_config: Mapping[str, str] | None, *,
                     only: Iterable[int] | None = None, **recover_options) -> state_store.RecoveredState:
    """Read `topic` (only its partitions `only`, when given) and fold each record as it is read
    (state_store.recover with `recover_options`): in the calling worker thread, so the trio loop
    keeps answering /healthz through a long replay, and holding the fold's state, not the topic.
    Records that do not decode or apply are skipped (logged with partition and offset, counted).
    IN_PROGRESS times are wall clock on the topic; engines run on monotonic_ms."""
    return state_store.recover(read_state_topic(bootstrap, topic, client_config=client_config, partitions=only),
                               topic=topic, clock_offset_ms=wall_clock_ms() - monotonic_ms(), **recover_options)


async def start_share_service(proxy: Proxy, settings: ShareSettings, nursery: trio.Nursery) -> ShareService:
    """Load durable share state, start the service in `nursery`, and route the share APIs."""
    config = proxy.config
    bootstrap = ",".join(str(address) for address in config.upstream)
    # Every confluent-kafka client below connects as the proxy: TLS and the service credentials.
    client_config = librdkafka_config(config)
    spec = StateTopicSpec(
        settings.state_topic,
        partitions=settings.state_topic_partitions,
        replication_factor=settings.state_topic_replication_factor,
        min_insync_replicas=settings.state_topic_min_insync_replicas,
    )
    scale_out = settings.instance_id is not None
    if settings.state_fencing == "transactional" or scale_out:
        writer = TransactionalStateWriter(bootstrap, transactional_id_prefix=settings.state_transactional_id_prefix,
                                          delivery_timeout_ms=settings.state_write_timeout_ms,
                                          linger_ms=settings.state_linger_ms,
                                          client_config=client_config, owned_only=scale_out)
    else:
        writer = StateLogWriter(bootstrap, delivery_timeout_ms=settings.state_write_timeout_ms,
                                linger_ms=settings.state_linger_ms, producers=settings.state_producers,
                                client_config=client_config)
    writer.start()
    delay = 0.5
    replay_started = trio.current_time()
    while True:
        try:
            await trio.to_thread.run_sync(
                lambda: ensure_state_topics(bootstrap, [spec], client_config=client_config), abandon_on_cancel=True
            )
            if scale_out:
                # Nothing is replayed before this instance owns partitions (ScaleOut._gained).
                state_partitions = await _settled_layout(writer, settings.state_topic, bootstrap, client_config)
                recovered = state_store.RecoveredState()
                break
            if isinstance(writer, TransactionalStateWriter):
                # Fence first: after it nothing an earlier owner has open can commit, so the
                # read_committed replay below holds everything any owner ever confirmed.
                await writer.fence(settings.state_topic)
            partitions = await writer.partition_count(settings.state_topic)
            recovered = await trio.to_thread.run_sync(
                lambda: fold_state_topic(bootstrap, settings.state_topic, client_config, partitions=partitions),
                abandon_on_cancel=True,
            )
            if recovered.needs_migration(partitions):
                # Not (wholly) in layout 2 for its partition count: migrated before anything is
                # served (proxy/share/state_layout.py). A failed step is retried with the topic
                # read again, as a replay is: serving from a half-placed topic is what the
                # migration exists to prevent, and a fold of a half-migrated topic finishes it.
                await state_layout.migrate(writer, settings.state_topic, recovered, partitions)
            break
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - PersistError or any confluent-kafka error
            log.warning("share state not loadable yet; retrying", error=str(exc), retry_in_s=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, 10.0)
    await _injected_replay_delay()
    metrics.STATE_REPLAY_SECONDS.set(trio.current_time() - replay_started)
    metrics.STATE_REPLAY_RECORDS.set(recovered.records)
    cluster = Cluster(config.upstream, connect_timeout=config.connect_timeout,
                      max_frame_size=config.max_upstream_frame_size,
                      connections_per_broker=settings.upstream_connections,
                      long_poll_connections_per_broker=settings.long_poll_connections,
                      security=proxy.upstream_security)
    service = ShareService(
        cluster,
        writer,
        ShareServiceConfig(
            state_topic=settings.state_topic,
            max_share_sessions=settings.max_share_sessions,
            max_share_session_partitions=settings.max_share_session_partitions,
            max_share_session_partitions_total=settings.max_share_session_partitions_total,
            metadata_refresh_interval_s=settings.metadata_refresh_ms / 1000,
            max_read_cache_bytes=settings.read_cache_bytes,
            coordinator=settings.coordinator_config(),
            state_deltas=DeltaPolicy(snapshot_every=settings.state_snapshot_every) if settings.state_deltas else None,
            state_writes_in_flight=settings.state_writes_in_flight,
        ),
        advertised_endpoint=proxy.directory.advertised,
    )
    # ShareServiceConfig does not carry the partition bounds yet; set them on the cache
    # before anything is served.
    await service.restore(recovered)
    if scale_out:
        service.ownership = ServiceOwnership(state_partitions)
        service.reader.leads = service.ownership.leads  # long polls answered at once on a hand-over
        # Writes go only to lanes this instance holds: a revoked partition is flushed (its lane still
        # held) before its lane is released; a lost one's lane is fenced already.
        service.commits.may_write = lambda route: writer.owns(settings.state_topic,
                                                              service.ownership.home_of_route(route))
        service.scale_out = ScaleOut(service, writer, settings, bootstrap, client_config, state_partitions, proxy)
        await service.scale_out.check_slot()
    if settings.share_events_enable:
        # Subscribed before the service runs, so no settled change is missed.
        event_log = _start_event_log(service, settings.event_log_settings(), bootstrap, cluster, nursery,
                                     client_config)
        if service.scale_out is not None:
            service.scale_out.event_log = event_log
    await nursery.start(service.run)
    # KIP-1191: ARCHIVING records (announced, or left by the replay just done) get their dead letters.
    dead_letters = DeadLetterWriter(
        service, DeadLetterCluster(bootstrap, delivery_timeout_ms=settings.state_write_timeout_ms,
                                   client_config=client_config),
        DeadLetterSettings(auto_create_topics=settings.dead_letter_auto_create_topics,
                           topic_name_prefix=settings.dead_letter_topic_name_prefix))
    nursery.start_soon(supervised, "dead-letters", dead_letters.run)
    service.hand_over_listeners.append(dead_letters.cancel)
    # Share-group metrics: event counts from the change hook, gauges computed at scrape time.
    observe.register(service, per_partition=settings.metrics_per_partition)
    # Share operations authorized by the cluster's ACLs, asked on each client's own connection
    # (proxy/share/authorization.py); auto mode asks once, on the proxy's own connection, whether
    # the cluster has an authorizer at all, enforcing until it knows.
    policy = AuthorizationPolicy(getattr(config, "share_authorization", "auto"),
                                 ttl_ms=getattr(config, "share_authorization_cache_ms", 5_000),
                                 instance_topic=settings.state_topic)
    nursery.start_soon(guarded, "share-authorization-mode", functools.partial(policy.run, cluster.has_authorizer))
    proxy.routes.update(share_routes(service, policy))
    # Share-group configs (DescribeConfigs / IncrementalAlterConfigs on GROUP resources) are the
    # proxy's; registered before the state-topic guard, which wraps IncrementalAlterConfigs.
    group_configs = GroupConfigs(service.coordinator, service.commits, cluster.upstream_group_type,
                                 write_timeout_s=settings.state_write_timeout_ms / 1000)
    proxy.routes.update(group_config_routes(group_configs, proxy.routes, policy))
    group_admin = GroupAdmin(service, write_timeout_s=settings.state_write_timeout_ms / 1000)
    proxy.routes.update(admin_routes(group_admin, lambda: proxy.directory.ports.keys(), policy))
    if service.scale_out is not None:
        # Coordinator <-> leader share-state RPCs between instances (proxy/share/peers.py).
        ownership = service.ownership
        proxy.routes.update(peer_routes(PeerStateServer(ownership.leads, group_admin.local_summary,
                                                        group_admin.delete_led, group_admin.initialize_led), policy))
        for api_key in PEER_APIS:
            low, high = DEFAULT_REGISTRY.supported_versions(api_key)
            proxy.api_versions.register_local(api_key, VersionRange(low, high))

        # Another instance's listener is reached as a client reaches it: TLS when it serves TLS,
        # the service credentials when clients authenticate (passed through to a broker).
        security = peer_security(config)

        async def connect_peer(host: str, port: int) -> UpstreamClient:
            stream = await open_upstream(HostPort(host, port), timeout=config.connect_timeout,
                                         max_frame_size=config.max_upstream_frame_size, security=security,
                                         authenticate=True)
            return UpstreamClient(stream, client_id=f"{PEER_CLIENT_ID_PREFIX}{settings.instance_id}")

        service.scale_out.group_admin = group_admin
        service.scale_out.group_configs = group_configs
        service.scale_out.peer_connections = PeerConnections(connect_peer)
        service.scale_out.in_flight_key = getattr(config, "describe_in_flight_api_key", DEFAULT_DESCRIBE_IN_FLIGHT_KEY)
    # The state topic is the proxy's: clients may read it, not write, delete or reconfigure it.
    state_topic_names = frozenset({settings.state_topic})

    def state_topic_ids() -> dict:
        known = cluster.snapshot.topics_by_name
        return {known[name].topic_id: name for name in state_topic_names if name in known}

    proxy.routes.update(state_topic_routes(StateTopics(state_topic_names, state_topic_ids), proxy.routes))
    guard = ConsumerGroupGuard(service.coordinator)
    proxy.routes[JOIN_GROUP] = guard
    proxy.routes[CONSUMER_GROUP_HEARTBEAT] = guard
    for api_key, versions in served_version_ranges().items():
        proxy.api_versions.register_local(api_key, versions)
    # The extension RPC DescribeShareGroupInFlight (proxy/share/in_flight.py), under its configured key.
    in_flight_key = getattr(config, "describe_in_flight_api_key", DEFAULT_DESCRIBE_IN_FLIGHT_KEY)
    proxy.routes.update(in_flight_routes(service, in_flight_key, policy))
    proxy.api_versions.register_local(*in_flight_version_range(in_flight_key))
    # The extension RPC MarkInProgress (proxy/share/progress.py), under its configured key; both
    # keys are also advertised as ApiVersions supported features so clients need not guess them.
    mark_key = getattr(config, "mark_in_progress_api_key", DEFAULT_MARK_IN_PROGRESS_KEY)
    proxy.routes.update(progress_routes(service, mark_key, policy))
    proxy.api_versions.register_local(*progress_version_range(mark_key))
    for name, versions in extension_features(mark_key, in_flight_key).items():
        proxy.api_versions.register_feature(name, versions)
    register_admin_versions(proxy.api_versions)
    log.info("share groups served", state_topic=settings.state_topic, replayed_records=recovered.records)
    return service
