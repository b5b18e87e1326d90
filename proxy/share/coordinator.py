"""Share-group coordinator decisions: membership, epochs, session timeouts, assignment.

Theory of operation
-------------------
This is the pure core of ShareGroupHeartbeat (API 76, v1) and ShareGroupDescribe (API 77),
following KIP-932 ("Share group membership", "Heartbeat and session", "Group states") and,
where the KIP and today's Kafka differ, Kafka's ``GroupMetadataManager`` (4.1+):

* The member generates its member id (KIP-1082); an empty id is INVALID_REQUEST.
* Epoch 0 joins (creating the group if needed; a known member id rejoining with 0 gets its
  state back, KAFKA-19233), a positive epoch heartbeats, -1 leaves. An unknown group is
  GROUP_ID_NOT_FOUND, an unknown member UNKNOWN_MEMBER_ID, and an epoch that is neither the
  member's current nor its previous one FENCED_MEMBER_EPOCH (the previous epoch is accepted
  because the response that bumped it may have been lost).
* The **group epoch** bumps whenever the group's inputs to assignment change: a member
  joins, leaves, times out or changes its subscription, or the partitions of a subscribed
  topic change (:meth:`ShareGroupCoordinator.update_topic_metadata`). Each bump recomputes
  the target assignment at once, so the **assignment epoch** follows the group epoch.
* A member whose epoch is behind the assignment epoch is reconciled on its next heartbeat:
  it takes its target partitions and the assignment epoch as its member epoch (share groups
  need no revocation handshake: partitions are shared, there is no fencing of fetches).
* The response carries the assignment when the member (re)joins, sends a full request
  (subscribed topics set), or its partitions changed.
* A member that does not heartbeat within the session timeout is removed by
  :meth:`ShareGroupCoordinator.expire`; its departure is returned so the caller releases
  its acquired records.
* Group state: Empty without members, Stable with members, Dead once deleted.

Every call takes ``now_ms``; nothing here reads a clock, sleeps or does I/O. Calls return
result values carrying :class:`Event` s for the caller to act on (release records, initialise
share-partition state, persist group metadata).
"""

from __future__ import annotations

import datetime
import enum
import heapq
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.share_group_describe.v1 import response as describe_v1
from kio.schema.share_group_heartbeat.v1 import response as heartbeat_v1
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i32Timedelta

from proxy.share.assignor import ASSIGNOR_NAME, SimpleAssignor, TopicIdPartition
from proxy.share.group_config import (
    AutoOffsetReset,
    GroupConfigError,
    ShareGroupConfig,
    ShareGroupLimits,
    parse_auto_offset_reset,
)

__all__ = [
    "GroupState",
    "TopicInfo",
    "ShareGroupConfig",
    "ShareGroupLimits",
    "CoordinatorConfig",
    "GroupConfigError",
    "AutoOffsetReset",
    "parse_auto_offset_reset",
    "DepartReason",
    "MemberDeparted",
    "AssignmentChanged",
    "PartitionsToInitialize",
    "PartitionsDeleted",
    "GroupEpochBumped",
    "Event",
    "HeartbeatResult",
    "DescribedMember",
    "DescribedGroup",
    "ShareGroupCoordinator",
    "LEAVE_GROUP_MEMBER_EPOCH",
    "heartbeat_response",
    "describe_response",
]

LEAVE_GROUP_MEMBER_EPOCH = -1
JOIN_GROUP_MEMBER_EPOCH = 0


class GroupState(enum.Enum):
    """Share group states as ShareGroupDescribe/ListGroups spell them (Kafka's ShareGroupState)."""

    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the coordinator needs to know about a topic from cluster metadata."""

    name: str
    topic_id: uuid.UUID
    num_partitions: int


# -- group configuration: proxy/share/group_config.py -------------------------------------


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Coordinator-wide settings: group defaults, their bounds, and group size."""

    group_defaults: ShareGroupConfig = ShareGroupConfig()
    limits: ShareGroupLimits = ShareGroupLimits()
    max_group_size: int = 200
    """``group.share.max.size``."""
    initialize_retry_interval_ms: int = 30_000
    """``group.share.initialize.retry.interval.ms``: re-ask to initialise partitions not confirmed."""


# -- events and results --------------------------------------------------------------------


class DepartReason(enum.Enum):
    LEFT = "left"
    SESSION_TIMEOUT = "session_timeout"


@dataclass(frozen=True, slots=True)
class MemberDeparted:
    """A member left or timed out: release the records it holds acquired."""

    group_id: str
    member_id: str
    reason: DepartReason
    assigned: frozenset[TopicIdPartition]


@dataclass(frozen=True, slots=True)
class AssignmentChanged:
    """A member took a new assignment (reported in its heartbeat response)."""

    group_id: str
    member_id: str
    member_epoch: int
    assigned: frozenset[TopicIdPartition]
    added: frozenset[TopicIdPartition]
    removed: frozenset[TopicIdPartition]


@dataclass(frozen=True, slots=True)
class PartitionsToInitialize:
    """Subscribed share-partitions with no share state yet: initialise their SPSO from
    ``share.auto.offset.reset`` and confirm with :meth:`ShareGroupCoordinator.mark_initialized`."""

    group_id: str
    group_epoch: int
    partitions: frozenset[TopicIdPartition]


@dataclass(frozen=True, slots=True)
class PartitionsDeleted:
    """Share-partitions whose topic disappeared (or was recreated with a new id)."""

    group_id: str
    partitions: frozenset[TopicIdPartition]


@dataclass(frozen=True, slots=True)
class GroupEpochBumped:
    """The group epoch (and the target assignment) changed; persist if you persist epochs."""

    group_id: str
    group_epoch: int


Event = MemberDeparted | AssignmentChanged | PartitionsToInitialize | PartitionsDeleted | GroupEpochBumped


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """What a ShareGroupHeartbeat response needs, plus events for the caller."""

    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Mapping[uuid.UUID, tuple[int, ...]] | None = None
    """topic id -> sorted partitions; ``None`` means the response carries no assignment."""
    events: tuple[Event, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error_code is ErrorCode.none


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    assignment: Mapping[uuid.UUID, tuple[str, tuple[int, ...]]]
    """topic id -> (topic name, sorted partitions)."""


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedMember, ...] = ()


class _Error(Exception):
    """Internal: a heartbeat rule was broken; converted to a result at the entry point."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- state ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Member:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    assigned: frozenset[TopicIdPartition] = frozenset()
    session_deadline_ms: int = 0


@dataclass(slots=True)
class _Group:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    target: dict[str, frozenset[TopicIdPartition]] = field(default_factory=dict)
    subscribed: dict[str, TopicInfo] = field(default_factory=dict)
    """The subscribed topics as last resolved (name -> info); a change bumps the epoch."""
    initialized: set[TopicIdPartition] = field(default_factory=set)
    initializing: dict[TopicIdPartition, int] = field(default_factory=dict)
    """Partitions asked to be initialised -> when (ms), for the retry interval."""

    @property
    def state(self) -> GroupState:
        return GroupState.STABLE if self.members else GroupState.EMPTY

    def subscribed_topic_names(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names}


class ShareGroupCoordinator:
    """All share groups served by this proxy, keyed by group id."""

    def __init__(self, config: CoordinatorConfig = CoordinatorConfig()) -> None:
        config.group_defaults.validate(config.limits)
        self.config = config
        self.assignor = SimpleAssignor()
        self._groups: dict[str, _Group] = {}
        self._topics_by_name: dict[str, TopicInfo] = {}
        self._topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self._deadlines: list[tuple[int, str, str]] = []  # (deadline, group, member), lazy
        # Group configs live beside groups, as in Kafka: they may be set before a group exists.
        self._config_overrides: dict[str, dict[str, str | int]] = {}
        self._configs: dict[str, ShareGroupConfig] = {}

    # -- queries -------------------------------------------------------------------------

    def has_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def has_member(self, group_id: str, member_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and member_id in group.members

    def has_members(self, group_id: str) -> bool:
        return self.member_count(group_id) > 0

    def member_count(self, group_id: str) -> int:
        group = self._groups.get(group_id)
        return len(group.members) if group is not None else 0

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def list_groups(self) -> list[tuple[str, GroupState]]:
        """(group id, state) for ListGroups (protocol type ``share``)."""
        return [(g, self._groups[g].state) for g in sorted(self._groups)]

    def group_state(self, group_id: str) -> GroupState:
        group = self._groups.get(group_id)
        return group.state if group else GroupState.DEAD

    def group_config(self, group_id: str) -> ShareGroupConfig:
        """The effective share settings of a group (defaults plus its overrides)."""
        return self._configs.get(group_id, self.config.group_defaults)

    def group_config_overrides(self, group_id: str) -> dict[str, str | int]:
        return dict(self._config_overrides.get(group_id, {}))

    def configured_group_ids(self) -> list[str]:
        """Group ids with configs set (share groups or not yet), for ListConfigResources."""
        return sorted(self._config_overrides)

    def initialized_partitions(self, group_id: str) -> frozenset[TopicIdPartition]:
        group = self._groups.get(group_id)
        return frozenset(group.initialized) if group else frozenset()

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._topics_by_id.get(topic_id)

    # -- ShareGroupHeartbeat -------------------------------------------------------------

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        now_ms: int,
        *,
        rack_id: str | None = None,
        subscribed_topic_names: Iterable[str] | None = None,
        client_id: str = "",
        client_host: str = "",
        topic_metadata: Iterable[TopicInfo] | None = None,
        group_is_other_type: bool = False,
    ) -> HeartbeatResult:
        """Handle one ShareGroupHeartbeat (v1).

        ``topic_metadata``, when given, replaces the metadata image first (as
        :meth:`update_topic_metadata`). ``group_is_other_type`` says the id is a consumer
        or classic group upstream: the group is then refused with GROUP_ID_NOT_FOUND, as
        Kafka refuses a share heartbeat for a group of another type.
        """
        events: list[Event] = []
        if topic_metadata is not None:
            events.extend(self.update_topic_metadata(topic_metadata, now_ms))
        subscribed = None if subscribed_topic_names is None else tuple(subscribed_topic_names)
        try:
            self._validate_request(group_id, member_id, member_epoch, rack_id, subscribed)
            if group_is_other_type:
                raise _Error(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
            if member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
                return self._leave(group_id, member_id, now_ms, events)
            return self._heartbeat(
                group_id, member_id, member_epoch, now_ms, rack_id, subscribed,
                client_id, client_host, events,
            )
        except _Error as error:
            return HeartbeatResult(error_code=error.code, error_message=error.message, events=tuple(events))

    @staticmethod
    def _validate_request(
        group_id: str,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed: tuple[str, ...] | None,
    ) -> None:
        # Kafka's throwIfShareGroupHeartbeatRequestIsInvalid; blank means empty.
        if not member_id or not member_id.strip():
            raise _Error(ErrorCode.invalid_request, "MemberId can't be empty.")
        if not group_id or not group_id.strip():
            raise _Error(ErrorCode.invalid_request, "GroupId can't be empty.")
        if rack_id is not None and not rack_id.strip():
            raise _Error(ErrorCode.invalid_request, "RackId can't be empty.")
        if member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if not subscribed:
                raise _Error(ErrorCode.invalid_request, "SubscribedTopicNames must be set in first request.")
        elif member_epoch < LEAVE_GROUP_MEMBER_EPOCH:
            raise _Error(ErrorCode.invalid_request, "MemberEpoch is invalid.")

    def _existing_group(self, group_id: str) -> _Group:
        group = self._groups.get(group_id)
        if group is None:
            raise _Error(ErrorCode.group_id_not_found, f"Share group {group_id} not found.")
        return group

    @staticmethod
    def _existing_member(group: _Group, member_id: str) -> _Member:
        member = group.members.get(member_id)
        if member is None:
            raise _Error(
                ErrorCode.unknown_member_id,
                f"Member {member_id} is not a member of group {group.group_id}.",
            )
        return member

    def _leave(self, group_id: str, member_id: str, now_ms: int, events: list[Event]) -> HeartbeatResult:
        group = self._existing_group(group_id)
        member = self._existing_member(group, member_id)
        events.extend(self._remove_member(group, member, DepartReason.LEFT, now_ms))
        return HeartbeatResult(
            member_id=member_id, member_epoch=LEAVE_GROUP_MEMBER_EPOCH, events=tuple(events)
        )

    def _heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        now_ms: int,
        rack_id: str | None,
        subscribed: tuple[str, ...] | None,
        client_id: str,
        client_host: str,
        events: list[Event],
    ) -> HeartbeatResult:
        joining = member_epoch == JOIN_GROUP_MEMBER_EPOCH
        group = self._groups.get(group_id)
        if group is None:
            if not joining:
                raise _Error(ErrorCode.group_id_not_found, f"Share group {group_id} not found.")
            group = _Group(group_id)
        if len(group.members) >= self.config.max_group_size and member_id not in group.members:
            raise _Error(
                ErrorCode.group_max_size_reached,
                f"The share group has reached its maximum capacity of {self.config.max_group_size} members.",
            )
        member = group.members.get(member_id)
        if member is None:
            if not joining:
                raise _Error(
                    ErrorCode.unknown_member_id,
                    f"Member {member_id} is not a member of group {group_id}.",
                )
            member = _Member(member_id)
        else:
            self._check_member_epoch(member, member_epoch)

        # Only now, with the request accepted, does a new group or member exist.
        self._groups[group_id] = group
        group.members[member_id] = member
        previous_assigned = member.assigned
        if rack_id is not None:
            member.rack_id = rack_id
        if client_id:
            member.client_id = client_id
        if client_host:
            member.client_host = client_host
        subscription_changed = False
        if subscribed is not None and frozenset(subscribed) != member.subscribed_topic_names:
            member.subscribed_topic_names = frozenset(subscribed)
            subscription_changed = True

        if self._refresh_subscription(group, now_ms, events) or subscription_changed:
            self._bump(group, now_ms, events)
        self._reconcile(group, member, events)
        config = self.group_config(group_id)
        member.session_deadline_ms = now_ms + config.session_timeout_ms
        heapq.heappush(self._deadlines, (member.session_deadline_ms, group_id, member_id))

        send_assignment = joining or subscribed is not None or member.assigned != previous_assigned
        return HeartbeatResult(
            member_id=member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            assignment=_by_topic(member.assigned) if send_assignment else None,
            events=tuple(events),
        )

    @staticmethod
    def _check_member_epoch(member: _Member, received: int) -> None:
        if received == JOIN_GROUP_MEMBER_EPOCH:
            return  # a known member rejoining gets its current state back (KAFKA-19233)
        if received > member.member_epoch:
            raise _Error(
                ErrorCode.fenced_member_epoch,
                f"The share group member has a greater member epoch ({received}) than the one known "
                f"by the group coordinator ({member.member_epoch}). The member must abandon all its "
                "partitions and rejoin.",
            )
        if received < member.member_epoch and received != member.previous_member_epoch:
            raise _Error(
                ErrorCode.fenced_member_epoch,
                f"The share group member has a smaller member epoch ({received}) than the one known "
                f"by the group coordinator ({member.member_epoch}). The member must abandon all its "
                "partitions and rejoin.",
            )

    # -- assignment ----------------------------------------------------------------------

    def _refresh_subscription(self, group: _Group, now_ms: int, events: list[Event]) -> bool:
        """Re-resolve the group's subscribed topics against the metadata image.

        Returns whether the resolution changed (a topic appeared, vanished, was recreated
        or changed its partition count), which bumps the group epoch.
        """
        resolved = {
            name: self._topics_by_name[name]
            for name in sorted(group.subscribed_topic_names())
            if name in self._topics_by_name
        }
        if resolved == group.subscribed:
            return False
        gone: set[TopicIdPartition] = set()
        new_ids = {info.topic_id for info in resolved.values()}
        for name, old in group.subscribed.items():
            new = resolved.get(name)
            if new is None or new.topic_id != old.topic_id:
                if old.topic_id not in new_ids and old.topic_id not in self._topics_by_id:
                    gone.update((old.topic_id, p) for p in range(old.num_partitions))
            elif new.num_partitions < old.num_partitions:
                gone.update((old.topic_id, p) for p in range(new.num_partitions, old.num_partitions))
        group.subscribed = resolved
        if gone:
            group.initialized -= gone
            for tp in gone:
                group.initializing.pop(tp, None)
            events.append(PartitionsDeleted(group.group_id, frozenset(gone)))
        return True

    def _bump(self, group: _Group, now_ms: int, events: list[Event]) -> None:
        group.group_epoch += 1
        partition_counts = {info.topic_id: info.num_partitions for info in group.subscribed.values()}
        ids_by_name = {name: info.topic_id for name, info in group.subscribed.items()}
        subscriptions = {
            m.member_id: [ids_by_name[t] for t in sorted(m.subscribed_topic_names) if t in ids_by_name]
            for m in group.members.values()
        }
        group.target = self.assignor.assign(subscriptions, partition_counts, group.target)
        group.assignment_epoch = group.group_epoch
        events.append(GroupEpochBumped(group.group_id, group.group_epoch))
        self._maybe_initialize(group, now_ms, events)

    def _maybe_initialize(self, group: _Group, now_ms: int, events: list[Event]) -> None:
        retry = self.config.initialize_retry_interval_ms
        pending = {
            (info.topic_id, p)
            for info in group.subscribed.values()
            for p in range(info.num_partitions)
            if (info.topic_id, p) not in group.initialized
            and now_ms - group.initializing.get((info.topic_id, p), now_ms - retry) >= retry
        }
        if pending:
            for tp in pending:
                group.initializing[tp] = now_ms
            events.append(PartitionsToInitialize(group.group_id, group.group_epoch, frozenset(pending)))

    def _reconcile(self, group: _Group, member: _Member, events: list[Event]) -> None:
        if member.member_epoch == group.assignment_epoch:
            return
        target = group.target.get(member.member_id, frozenset())
        old = member.assigned
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = group.assignment_epoch
        member.assigned = target
        if target != old:
            events.append(AssignmentChanged(
                group.group_id, member.member_id, member.member_epoch, target, target - old, old - target,
            ))

    def _remove_member(
        self, group: _Group, member: _Member, reason: DepartReason, now_ms: int
    ) -> list[Event]:
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        events: list[Event] = [MemberDeparted(group.group_id, member.member_id, reason, member.assigned)]
        # The leaving member's topics may no longer be subscribed by anyone.
        self._refresh_subscription(group, now_ms, events)
        self._bump(group, now_ms, events)
        return events

    # -- time ----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest session deadline (ms), or None when no member is tracked."""
        while self._deadlines:
            deadline, group_id, member_id = self._deadlines[0]
            if self._is_live_deadline(deadline, group_id, member_id):
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def expire(self, now_ms: int) -> list[Event]:
        """Remove members whose session timed out by ``now_ms``; return what happened.

        The :class:`MemberDeparted` events name the members whose acquired records must be
        released.
        """
        events: list[Event] = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, group_id, member_id = heapq.heappop(self._deadlines)
            if not self._is_live_deadline(deadline, group_id, member_id):
                continue
            group = self._groups[group_id]
            events.extend(
                self._remove_member(group, group.members[member_id], DepartReason.SESSION_TIMEOUT, now_ms)
            )
        return events

    def _is_live_deadline(self, deadline: int, group_id: str, member_id: str) -> bool:
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group else None
        return member is not None and member.session_deadline_ms == deadline

    # -- metadata ------------------------------------------------------------------------

    def update_topic_metadata(self, topics: Iterable[TopicInfo], now_ms: int) -> list[Event]:
        """Replace the metadata image; bump the epoch of every group whose subscribed
        topics changed (created, deleted, recreated, partitions added)."""
        topics = list(topics)
        self._topics_by_name = {t.name: t for t in topics}
        self._topics_by_id = {t.topic_id: t for t in topics}
        events: list[Event] = []
        for group_id in sorted(self._groups):
            group = self._groups[group_id]
            if self._refresh_subscription(group, now_ms, events):
                self._bump(group, now_ms, events)
            else:
                self._maybe_initialize(group, now_ms, events)
        return events

    # -- share-partition state -----------------------------------------------------------

    def mark_initialized(self, group_id: str, partitions: Iterable[TopicIdPartition]) -> None:
        """Record that these share-partitions have durable state (SPSO initialised)."""
        group = self._groups.get(group_id)
        if group is None:
            return
        for tp in partitions:
            group.initialized.add(tp)
            group.initializing.pop(tp, None)

    def initialization_failed(self, group_id: str, partitions: Iterable[TopicIdPartition]) -> None:
        """Forget a pending initialisation so the next heartbeat or refresh asks again."""
        group = self._groups.get(group_id)
        if group is not None:
            for tp in partitions:
                group.initializing.pop(tp, None)

    # -- group lifecycle -----------------------------------------------------------------

    def restore_group(
        self,
        group_id: str,
        *,
        group_epoch: int,
        initialized: Iterable[TopicIdPartition] = (),
        config_overrides: Mapping[str, str | int] | None = None,
    ) -> None:
        """Recreate a group from persisted metadata at startup (no members: they rejoin)."""
        group = _Group(group_id, group_epoch=group_epoch, assignment_epoch=group_epoch)
        group.initialized = set(initialized)
        self._groups[group_id] = group
        if config_overrides:
            self.restore_group_config(group_id, config_overrides)

    def restore_group_config(self, group_id: str, overrides: Mapping[str, str | int]) -> list[str]:
        """Take persisted overrides back (the group need not exist); returns the names dropped.

        The proxy's bounds may have changed since they were written: an override that no longer
        validates is dropped (and reported) rather than refusing to start, and the group runs
        with the proxy's default for it.
        """
        try:
            self.set_group_config(group_id, overrides, replace_all=True)
            return []
        except GroupConfigError:
            pass
        kept: dict[str, str | int] = {}
        dropped = []
        for name, value in overrides.items():
            try:
                self.config.group_defaults.with_overrides({**kept, name: value}).validate(self.config.limits)
                kept[name] = value
            except GroupConfigError:
                dropped.append(name)
        self.set_group_config(group_id, kept, replace_all=True)
        return dropped

    def delete_group(self, group_id: str) -> tuple[ErrorCode, list[Event]]:
        """DeleteGroups for a share group: only an Empty group can be deleted (it is then Dead).

        Its config overrides go with it: the caller tombstones the group's config record too, so
        keeping them in memory would make a restart and a running proxy disagree.
        """
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.group_id_not_found, []
        if group.members:
            return ErrorCode.non_empty_group, []
        del self._groups[group_id]
        self._config_overrides.pop(group_id, None)
        self._configs.pop(group_id, None)
        gone = frozenset(group.initialized)
        return ErrorCode.none, [PartitionsDeleted(group_id, gone)] if gone else []

    def forget_group(self, group_id: str) -> bool:
        """Drop a group from memory without deleting it (no events, nothing to persist): another
        proxy instance coordinates it now (scale-out hand-over); its members rejoin there."""
        self._config_overrides.pop(group_id, None)
        self._configs.pop(group_id, None)
        return self._groups.pop(group_id, None) is not None

    def create_empty_group(self, group_id: str) -> list[Event]:
        """An empty share group, as Kafka's AlterShareGroupOffsets creates one for an unknown id
        (``getOrMaybeCreateShareGroup(groupId, true)``); no event if it exists already."""
        if group_id in self._groups:
            return []
        self._groups[group_id] = _Group(group_id)
        return [GroupEpochBumped(group_id, 0)]

    def forget_topic(self, group_id: str, topic_id: uuid.UUID) -> frozenset[TopicIdPartition]:
        """DeleteShareGroupOffsets: the topic's share-partitions are no longer initialised for the
        group (a later subscription initialises them afresh); returns those that were."""
        group = self._groups.get(group_id)
        if group is None:
            return frozenset()
        gone = frozenset(tp for tp in group.initialized if tp[0] == topic_id)
        group.initialized -= gone
        for tp in [tp for tp in group.initializing if tp[0] == topic_id]:
            del group.initializing[tp]
        return gone

    def set_group_config(
        self,
        group_id: str,
        overrides: Mapping[str, str | int | None],
        *,
        replace_all: bool = False,
        validate_only: bool = False,
    ) -> ShareGroupConfig:
        """Validate and apply per-group overrides by Kafka name (a ``None`` value removes one).

        Raises :class:`GroupConfigError` and changes nothing on error, nor with `validate_only`.
        The group need not exist yet (Kafka too keeps group configs apart from groups). The
        result is validated as a whole, as Kafka's controller validates the resource's configs
        after the change. New timeouts and intervals apply from each member's next heartbeat;
        engines take the rest at their next acquisition (PartitionRegistry.refresh_config).
        """
        merged: dict[str, str | int | None] = {} if replace_all else dict(self._config_overrides.get(group_id, {}))
        merged.update(overrides)
        kept = {k: v for k, v in merged.items() if v is not None}
        config = self.config.group_defaults.with_overrides(kept).validate(self.config.limits)
        if validate_only:
            return config
        if kept:
            self._config_overrides[group_id] = kept
            self._configs[group_id] = config
        else:
            self._config_overrides.pop(group_id, None)
            self._configs.pop(group_id, None)
        return config

    # -- ShareGroupDescribe --------------------------------------------------------------

    def describe(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        """ShareGroupDescribe: one entry per requested id, GROUP_ID_NOT_FOUND if unknown."""
        described = []
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if group is None:
                described.append(DescribedGroup(
                    group_id=group_id,
                    error_code=ErrorCode.group_id_not_found,
                    error_message=f"Group {group_id} not found.",
                    group_state=GroupState.DEAD.value,
                ))
                continue
            members = tuple(
                DescribedMember(
                    member_id=m.member_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=tuple(sorted(m.subscribed_topic_names)),
                    assignment={
                        tid: (self._topic_name(group, tid), parts)
                        for tid, parts in _by_topic(m.assigned).items()
                    },
                )
                for _, m in sorted(group.members.items())
            )
            described.append(DescribedGroup(
                group_id=group_id,
                group_state=group.state.value,
                group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=ASSIGNOR_NAME,
                members=members,
            ))
        return described

    def _topic_name(self, group: _Group, topic_id: uuid.UUID) -> str:
        info = self._topics_by_id.get(topic_id)
        if info is not None:
            return info.name
        for name, sub in group.subscribed.items():
            if sub.topic_id == topic_id:
                return name
        return ""


def _by_topic(partitions: Iterable[TopicIdPartition]) -> dict[uuid.UUID, tuple[int, ...]]:
    grouped: dict[uuid.UUID, list[int]] = {}
    for topic_id, partition in partitions:
        grouped.setdefault(topic_id, []).append(partition)
    return {t: tuple(sorted(ps)) for t, ps in sorted(grouped.items())}


# -- kio edges -----------------------------------------------------------------------------


def _millis(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def heartbeat_response(
    result: HeartbeatResult, throttle_time_ms: int = 0
) -> heartbeat_v1.ShareGroupHeartbeatResponse:
    """Map a :class:`HeartbeatResult` to a kio ``ShareGroupHeartbeatResponse`` (v1)."""
    r = heartbeat_v1
    assignment = None
    if result.assignment is not None:
        assignment = r.Assignment(
            topic_partitions=tuple(
                r.TopicPartitions(topic_id=tid, partitions=tuple(i32(p) for p in parts))
                for tid, parts in result.assignment.items()
            )
        )
    return r.ShareGroupHeartbeatResponse(
        throttle_time=_millis(throttle_time_ms),
        error_code=result.error_code,
        error_message=result.error_message,
        member_id=result.member_id,
        member_epoch=i32(result.member_epoch),
        heartbeat_interval=_millis(result.heartbeat_interval_ms),
        assignment=assignment,
    )


# AclOperation bits Kafka reports for a group when every operation is allowed
# (AclEntry.supportedOperations(GROUP): READ 3, DELETE 6, DESCRIBE 8, DESCRIBE_CONFIGS 10,
# ALTER_CONFIGS 11). The proxy has no ACLs, so everything is allowed.
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)
# Kafka's "not asked for" value of AuthorizedOperations.
AUTHORIZED_OPERATIONS_OMITTED = -2147483648


def describe_response(
    groups: Iterable[DescribedGroup], throttle_time_ms: int = 0, *, include_authorized_operations: bool = False,
) -> describe_v1.ShareGroupDescribeResponse:
    """Map :meth:`ShareGroupCoordinator.describe` output to a kio ``ShareGroupDescribeResponse`` (v1).

    ``authorized_operations`` is filled, as Kafka does, only for groups described without error and
    only when the request asked for it.
    """
    r = describe_v1

    def authorized(g: DescribedGroup) -> int:
        if include_authorized_operations and g.error_code is ErrorCode.none:
            return GROUP_AUTHORIZED_OPERATIONS
        return AUTHORIZED_OPERATIONS_OMITTED

    def member(m: DescribedMember) -> r.Member:
        return r.Member(
            member_id=m.member_id,
            rack_id=m.rack_id,
            member_epoch=i32(m.member_epoch),
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=tuple(TopicName(t) for t in m.subscribed_topic_names),
            assignment=r.Assignment(
                topic_partitions=tuple(
                    r.TopicPartitions(
                        topic_id=tid, topic_name=TopicName(name), partitions=tuple(i32(p) for p in parts)
                    )
                    for tid, (name, parts) in m.assignment.items()
                )
            ),
        )

    return r.ShareGroupDescribeResponse(
        throttle_time=_millis(throttle_time_ms),
        groups=tuple(
            r.DescribedGroup(
                error_code=g.error_code,
                error_message=g.error_message,
                group_id=GroupId(g.group_id),
                group_state=g.group_state,
                group_epoch=i32(g.group_epoch),
                assignment_epoch=i32(g.assignment_epoch),
                assignor_name=g.assignor_name,
                members=tuple(member(m) for m in g.members),
                authorized_operations=i32(authorized(g)),
            )
            for g in groups
        ),
    )
