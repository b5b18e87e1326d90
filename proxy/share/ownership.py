"""The ownership group: which proxy instance owns which state-topic partitions (issue 15, step 3).

Several proxy instances for one cluster elect owners with Kafka's own group coordinator, not with
anything home-made (docs/scale-out.md, section a and "Measured" 1): each instance runs one
ordinary consumer in the group ``<prefix>.<state topic>`` subscribed to the state topic, with
the ``cooperative-sticky`` assignor (a member leaving moves only its own partitions; measured: 0
of the survivors' partitions moved on a kill, against 9 with the eager default). A partition
assigned to an instance is a state partition it owns: it leads every share-partition and
coordinates every group homed there. The consumer never reads what it is assigned (it pauses
every partition it gets): the group is used for its membership and assignment alone.

The consumer lives on a thread of its own (its calls block). Its rebalance callbacks hand the
gained, revoked or lost partitions to the trio side (``trio.from_thread.run``) and wait for it, so
a partition is handed over only once the losing side has stopped using it and the winning side
has fenced and replayed it before it answers for it.

**Finding each other, no peer list**: each member's ``client.id`` carries the instance's slot and
endpoints (:class:`InstanceIdentity`), and ``describe_consumer_groups`` returns it verbatim with
each member's assignment (measured), so any instance can rebuild the **owner map** -- state
partition -> instance -> endpoints -- from the cluster alone (:func:`owner_map`). It is refreshed
after every rebalance and every ``refresh_s``.

``--instance-id`` runs one (proxy/share/runtime.py ``ScaleOut``); :class:`ServiceOwnership` is
what the share service asks on each request. Routing clients to the owning instance (virtual node
ids in Metadata and FindCoordinator) is not built yet: docs/scale-out.md step 4.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
import trio
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from proxy.errors import ConfigError
from proxy.share import state_store
from proxy.share.metrics import OWNER_MAP_KNOWN
from proxy.share.persister import route_partition

log = structlog.get_logger(__name__)

CLIENT_ID_VERSION = 1
MAX_SLOT = 2046  # vnode ids ((slot + 1) << 20 | broker) must stay positive int32s
DEFAULT_GROUP_PREFIX = "ksp-owners"
# While a rebalance leaves state partitions without an owner in the map, it is described this often.
UNSETTLED_REFRESH_S = 0.2


class OwnershipError(ConfigError):
    """This instance cannot join the ownership group (e.g. its slot is taken): fatal at start."""


@dataclass(frozen=True, slots=True)
class InstanceIdentity:
    """Who an instance is and where clients reach it; carried in its ownership consumer's client.id."""

    instance_id: str
    slot: int
    host: str
    bootstrap_port: int
    port_base: int

    def __post_init__(self) -> None:
        if not 0 <= self.slot <= MAX_SLOT:
            raise ValueError(f"instance slot {self.slot} is outside 0..{MAX_SLOT}")
        for name, value in (("instance id", self.instance_id), ("host", self.host)):
            if not value or ";" in value or "=" in value:
                raise ValueError(f"{name} {value!r} must be non-empty and contain no ';' or '='")

    @property
    def client_id(self) -> str:
        return (f"ksp;v={CLIENT_ID_VERSION};slot={self.slot};id={self.instance_id};host={self.host};"
                f"bootstrap={self.bootstrap_port};base={self.port_base}")

    @classmethod
    def parse(cls, client_id: str) -> InstanceIdentity | None:
        """The identity in a member's client.id; None for anything else (e.g. a newer format)."""
        parts = client_id.split(";")
        if not parts or parts[0] != "ksp":
            return None
        fields = dict(part.split("=", 1) for part in parts[1:] if "=" in part)
        try:
            if int(fields["v"]) != CLIENT_ID_VERSION:
                return None
            return cls(fields["id"], int(fields["slot"]), fields["host"], int(fields["bootstrap"]),
                       int(fields["base"]))
        except (KeyError, ValueError):
            return None


def slot_of_instance(instance_id: str, explicit: int | None = None) -> int:
    """The slot: ``explicit`` (--instance-slot) when given, else the instance id's trailing digits
    (``ksp-2`` -> 2: a StatefulSet pod's ordinal)."""
    if explicit is not None:
        slot = explicit
    else:
        match = re.search(r"(\d+)$", instance_id)
        if match is None:
            raise ValueError(f"instance id {instance_id!r} does not end in digits; give its slot explicitly")
        slot = int(match.group(1))
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"instance slot {slot} is outside 0..{MAX_SLOT}")
    return slot


@dataclass(frozen=True, slots=True)
class OwnerMap:
    """State partition -> the instance that owns it, and every live instance (proxies in the group)."""

    owners: Mapping[int, InstanceIdentity] = field(default_factory=dict)
    instances: tuple[InstanceIdentity, ...] = ()

    def owner_of(self, partition: int) -> InstanceIdentity | None:
        return self.owners.get(partition)

    def owned_by(self, slot: int) -> frozenset[int]:
        return frozenset(p for p, owner in self.owners.items() if owner.slot == slot)


def owner_map(members: Iterable[object], state_topic: str) -> OwnerMap:
    """The owner map from a group description's members (``client_id`` and
    ``assignment.topic_partitions``, as confluent-kafka's MemberDescription has them); members whose
    client.id is not an instance identity are ignored."""
    owners: dict[int, InstanceIdentity] = {}
    instances: dict[int, InstanceIdentity] = {}
    for member in members:
        identity = InstanceIdentity.parse(member.client_id)
        if identity is None:
            continue
        instances[identity.slot] = identity
        for tp in member.assignment.topic_partitions:
            if tp.topic == state_topic:
                owners[tp.partition] = identity
    return OwnerMap(owners, tuple(sorted(instances.values(), key=lambda i: i.slot)))


def slot_conflict(members: Iterable[object], identity: InstanceIdentity) -> InstanceIdentity | None:
    """A live member that claims ``identity``'s slot under another instance id (the same id is this
    instance's own earlier incarnation, still in the group until its session times out)."""
    for member in members:
        other = InstanceIdentity.parse(member.client_id)
        if other is not None and other.slot == identity.slot and other.instance_id != identity.instance_id:
            return other
    return None


def refuse_taken_slot(members: Iterable[object], instance_id: str, slot: int) -> None:
    """OwnershipError if a live member claims ``slot`` under another instance id."""
    taken = slot_conflict(members, InstanceIdentity(instance_id, slot, "-", 0, 0))
    if taken is not None:
        raise OwnershipError(f"slot {slot} is already claimed by instance {taken.instance_id!r} "
                             f"({taken.host}:{taken.bootstrap_port}); give every instance a unique slot")


def describe_members(admin: AdminClient, group_id: str) -> Sequence[object]:
    """The members of ``group_id`` (none when it does not exist yet); blocking."""
    future = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id]
    return future.result().members


class ServiceOwnership:
    """What the share service asks on every request in scale-out mode: does this instance lead a
    share-partition (its topic-partition's home state partition is owned here) and coordinate a
    group (its group home is owned here)? Homes are layout 2's (proxy/share/state_store.py)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.owned: frozenset[int] = frozenset()
        self._homes: dict[tuple[uuid.UUID, int], int] = {}

    def home_of_partition(self, topic_id: uuid.UUID, partition: int) -> int:
        home = self._homes.get((topic_id, partition))
        if home is None:
            if len(self._homes) > 100_000:
                self._homes.clear()
            home = self._homes[(topic_id, partition)] = route_partition(
                state_store.share_partition_route(("", topic_id, partition)), self.partitions)
        return home

    def home_of_group(self, group_id: str) -> int:
        return route_partition(state_store.group_route(group_id), self.partitions)

    def home_of_route(self, route: bytes | int) -> int:
        """The partition a routed state record goes to (an int route is the partition itself)."""
        return route if isinstance(route, int) else route_partition(route, self.partitions)

    def leads(self, topic_id: uuid.UUID, partition: int) -> bool:
        return self.home_of_partition(topic_id, partition) in self.owned

    def coordinates(self, group_id: str) -> bool:
        return self.home_of_group(group_id) in self.owned


PartitionsHandler = Callable[[frozenset[int]], Awaitable[None]]


class OwnershipMember:
    """This instance's member of the ownership group (see the module docstring).

    ``on_gained`` runs (on the trio side; the rebalance waits for it) for partitions assigned to
    this instance, ``on_revoked`` for partitions taken away cleanly, ``on_lost`` for partitions
    lost because this instance was declared dead (frozen, cut off): the latter must not write.
    """

    def __init__(
        self,
        bootstrap: str,
        state_topic: str,
        identity: InstanceIdentity,
        *,
        on_gained: PartitionsHandler,
        on_revoked: PartitionsHandler,
        on_lost: PartitionsHandler,
        group_id: str | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        refresh_s: float = 2.0,
        client_config: Mapping[str, str] | None = None,
        partitions: int | None = None,
    ) -> None:
        self.state_topic = state_topic
        self.partitions = partitions  # the state topic's, when known: for the idle warning
        self.identity = identity
        self.group_id = group_id or f"{DEFAULT_GROUP_PREFIX}.{state_topic}"
        self._handlers = {"gained": on_gained, "revoked": on_revoked, "lost": on_lost}
        self._refresh_s = refresh_s
        common = {"bootstrap.servers": bootstrap, **(client_config or {})}
        self._admin_config = dict(common)
        self._consumer_config = {
            **common,
            "group.id": self.group_id,
            "client.id": identity.client_id,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        self.owned: frozenset[int] = frozenset()
        self.map = OwnerMap()
        self._map_changed = trio.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._admin: AdminClient | None = None
        self._refresh_now = trio.Event()
        self._idle = False

    # ----- the owner map ---------------------------------------------------------------------

    def _describe_members(self) -> Sequence[object]:
        if self._admin is None:
            self._admin = AdminClient(self._admin_config)
        return describe_members(self._admin, self.group_id)

    async def refresh(self) -> OwnerMap:
        """Describe the group and rebuild the owner map (a worker thread: the Admin call blocks)."""
        members = await trio.to_thread.run_sync(self._describe_members, abandon_on_cancel=True)
        self.map = owner_map(members, self.state_topic)
        OWNER_MAP_KNOWN.set(len(self.map.owners))
        self._map_changed.set()
        self._map_changed = trio.Event()
        self._warn_when_idle()
        return self.map

    def next_refresh_s(self) -> float:
        """How long until the owner map is described again: the refresh interval, but quickly
        while some state partition has no owner in it (a rebalance under way). A revoking member
        describes the group before the others' new assignments show, and until it describes
        again it answers FindCoordinator, and forwards, as if no instance owned those partitions."""
        if self.partitions is not None and len(self.map.owners) < self.partitions:
            return min(self._refresh_s, UNSETTLED_REFRESH_S)
        return self._refresh_s

    def _warn_when_idle(self) -> None:
        """Say once, when it starts, that this instance can own nothing: the group has more
        instances than the state topic has partitions (each partition has one owner), so this one
        leads no share-partition and coordinates no group until another instance leaves."""
        idle = (self.partitions is not None and len(self.map.instances) > self.partitions
                and any(i.slot == self.identity.slot for i in self.map.instances)
                and not self.map.owned_by(self.identity.slot))
        if idle and not self._idle:
            log.warning("instance owns no state partition: more instances than state-topic partitions",
                        instance=self.identity.instance_id, instances=len(self.map.instances),
                        state_topic=self.state_topic, partitions=self.partitions,
                        hint="a state topic's partitions cap the instances that share work; "
                             "create it with more (--state-topic-partitions) before deploying")
        self._idle = idle

    async def wait_for_map(self, predicate: Callable[[OwnerMap], bool]) -> OwnerMap:
        """Wait until the owner map satisfies ``predicate`` (tests and start-up)."""
        while not predicate(self.map):
            self._refresh_now.set()
            await self._map_changed.wait()
        return self.map

    # ----- running ---------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Refuse a taken slot, join the group, and keep the owner map fresh until cancelled."""
        try:
            members = await trio.to_thread.run_sync(self._describe_members, abandon_on_cancel=True)
        except KafkaException as exc:
            raise OwnershipError(f"cannot describe the ownership group {self.group_id!r}: {exc}") from exc
        refuse_taken_slot(members, self.identity.instance_id, self.identity.slot)
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._poll_loop, name="ownership-member", daemon=True)
        self._thread.start()
        task_status.started()
        while True:
            with trio.move_on_after(self.next_refresh_s()):
                await self._refresh_now.wait()
            self._refresh_now = trio.Event()
            try:
                await self.refresh()
            except KafkaException as exc:
                log.warning("ownership group not described; retrying", group=self.group_id, error=str(exc))

    async def aclose(self) -> None:
        """Leave the group: the rebalance this triggers revokes every owned partition first
        (``on_revoked`` runs), then the other instances take them over at once."""
        self._stopping.set()
        if self._thread is not None:
            await trio.to_thread.run_sync(self._thread.join)

    def _poll_loop(self) -> None:
        consumer = Consumer(self._consumer_config)
        try:
            consumer.subscribe([self.state_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                               on_lost=self._on_lost)
            while not self._stopping.is_set():
                message = consumer.poll(0.2)
                if message is not None and message.error() is not None:
                    log.warning("ownership consumer error", error=str(message.error()))
        finally:
            consumer.close()  # leaves the group; the revoke callback runs inside

    def _hand_over(self, kind: str, partitions: list[TopicPartition]) -> None:
        """Run the trio-side handler for ``partitions`` and wait for it (the rebalance waits too)."""
        numbers = frozenset(tp.partition for tp in partitions if tp.topic == self.state_topic)
        if not numbers:
            return  # cooperative rebalances call back with nothing for members whose share is unchanged
        if kind == "gained":
            self.owned = self.owned | numbers
        else:
            self.owned = self.owned - numbers
        log.info("ownership changed", change=kind, group=self.group_id, partitions=sorted(numbers),
                 owned=sorted(self.owned))
        assert self._token is not None
        try:
            trio.from_thread.run(self._after_handover, kind, numbers, trio_token=self._token)
        except trio.RunFinishedError:
            pass  # the trio side is gone (shutting down): nothing is left to hand over

    async def _after_handover(self, kind: str, numbers: frozenset[int]) -> None:
        await self._handlers[kind](numbers)
        self._refresh_now.set()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)  # owned for its assignment only: never read
        self._hand_over("gained", partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._hand_over("revoked", partitions)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._hand_over("lost", partitions)
        consumer.incremental_unassign(partitions)
