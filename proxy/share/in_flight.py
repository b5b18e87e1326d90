"""DescribeShareGroupInFlight (the draft KIP's extension RPC, key 82 unless configured): what a
share group holds in flight, per share-partition.

Served by the proxy alone (no broker has it). Per share-partition of the group -- every one it
has, or those asked for -- the answer carries the SPSO, the SPEO (exclusive) and the window
between them as offset ranges of uniform state, delivery count, owner and times, with when the
records were acquired, when they entered IN_PROGRESS and last made progress, and when their hold
ends (wall-clock ms; the engine's monotonic times are converted at the moment of the answer).
Filters (draft KIP §2.5 ``describeShareGroupInFlight`` options), combined with AND:

* ``States``: only ranges in these states (empty: every state a window holds);
* ``HeldLongerThanMs``: only records acquired longer ago than this (an IN_PROGRESS record with no
  acquisition time, i.e. recovered after a restart, counts from its in-progress start);
* ``ProgressStalenessMs``: only IN_PROGRESS records whose last progress is older than this.

IN_PROGRESS ranges (issue 10) carry two derived values, both from the config the share-partition's
engine runs with (the group's live config, as the sweeper sees it):

* ``Stale``: the last progress is older than ``share.in.progress.staleness.threshold.ms``;
* ``LockDeadlineTimestamp``: IN_PROGRESS records are not under the acquisition lock, so this is
  when the sweeper releases them -- the earliest of last progress + staleness threshold,
  in-progress start + max lock extension, and the rebalance grace deadline if the owner left
  (docs/in-progress.md, "The IN_PROGRESS lock"). For ACQUIRED records it is the lock's expiry.

A parked share-partition (leaders.py: no members, nothing in flight) is described from its parked
SPSO without bringing it back. Errors are the protocol's: GROUP_ID_NOT_FOUND for a group the
proxy does not have, INVALID_REQUEST for a filter that makes no sense, and per partition
UNKNOWN_TOPIC_OR_PARTITION for a topic id or partition the cluster does not have. A partition
that exists but the group never initialised is answered with offsets -1 and no records (Kafka's
DescribeShareGroupOffsets treats it the same way: absence of data, not an error).

With share authorization enforced (:mod:`proxy.share.enforce`) the group needs DESCRIBE (else
GROUP_AUTHORIZATION_FAILED) and each topic DESCRIBE: asked for all share-partitions, topics without
it are left out; asked for by id, their partitions are answered TOPIC_AUTHORIZATION_FAILED with no
name and no records (as DescribeShareGroupOffsets does for named topics).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import structlog
from kio.schema.errors import ErrorCode

from codec import extensions
from codec.registry import decode_entity
from codec.share_state import DeliveryState
from proxy.apiversions import VersionRange
from proxy.connection import ClientConnection, Request, ServeLocally
from proxy.route_split import response_payload
from proxy.share.authorization import AuthorizationPolicy, Operation
from proxy.share.enforce import TOPIC_DENIED_MESSAGE, authorization_for, group_or_instance_allowed, topics_allowed
from proxy.share.partition import InFlightRun, PartitionConfig
from proxy.share.peers import PeerFailure
from proxy.share.states import RecordState

log = structlog.get_logger(__name__)

NOT_LED_HERE_MESSAGE = "Another proxy instance leads this share-partition; ask the group's coordinator."

IN_PROGRESS = RecordState.IN_PROGRESS
# State ids a request may filter on: every id the wire carries (ARCHIVING, 3, holds records whose
# dead-letter write is pending, KIP-1191).
KNOWN_STATE_IDS = frozenset(int(state) for state in DeliveryState)
NO_FILTER = -1


@dataclass(frozen=True, slots=True)
class InFlightFilter:
    """What a request asks to see; -1 means no filter, an empty ``states`` every state."""

    states: frozenset[int] = frozenset()
    held_longer_than_ms: int = NO_FILTER
    progress_staleness_ms: int = NO_FILTER

    def problem(self) -> str | None:
        """Why the filter is invalid, or None."""
        unknown = sorted(self.states - KNOWN_STATE_IDS)
        if unknown:
            return f"unknown record state id(s) {unknown}; known: {sorted(KNOWN_STATE_IDS)}"
        if self.held_longer_than_ms < NO_FILTER:
            return f"HeldLongerThanMs must be -1 (no filter) or >= 0, not {self.held_longer_than_ms}"
        if self.progress_staleness_ms < NO_FILTER:
            return f"ProgressStalenessMs must be -1 (no filter) or >= 0, not {self.progress_staleness_ms}"
        return None

    def matches(self, run: InFlightRun, now: int) -> bool:
        """Whether a run passes every filter (``now`` on the engine's clock)."""
        if self.states and int(run.state) not in self.states:
            return False
        if self.held_longer_than_ms >= 0:
            since = held_since(run)
            if since < 0 or now - since <= self.held_longer_than_ms:
                return False
        if self.progress_staleness_ms >= 0:
            # Only IN_PROGRESS records carry a progress signal.
            if run.state != IN_PROGRESS or run.last_progress < 0 or now - run.last_progress <= self.progress_staleness_ms:
                return False
        return True


def held_since(run: InFlightRun) -> int:
    """When a member took the run (engine ms), -1 if none holds it: the acquisition, or for an
    IN_PROGRESS run recovered without one, its in-progress start."""
    if run.acquired_at >= 0:
        return run.acquired_at
    return run.in_progress_start if run.state == IN_PROGRESS else -1


def is_stale(run: InFlightRun, config: PartitionConfig, now: int) -> bool:
    """An IN_PROGRESS run whose last progress is older than the group's staleness threshold
    (the sweeper's own test: now - last_progress > threshold)."""
    return (run.state == IN_PROGRESS and run.last_progress >= 0
            and now - run.last_progress > config.in_progress_staleness_threshold_ms)


def hold_deadline(run: InFlightRun, config: PartitionConfig) -> int:
    """When the run's hold ends (engine ms, -1 for none): the acquisition lock's expiry, or for
    IN_PROGRESS the moment the sweeper releases it (staleness, max extension, rebalance grace)."""
    if run.state != IN_PROGRESS:
        return run.lock_deadline
    ends = []
    if run.last_progress >= 0:
        ends.append(run.last_progress + config.in_progress_staleness_threshold_ms)
    if run.in_progress_start >= 0:
        ends.append(run.in_progress_start + config.in_progress_max_lock_extension_ms)
    if run.grace_deadline >= 0:
        ends.append(run.grace_deadline)
    return min(ends) if ends else run.lock_deadline


@dataclass(frozen=True, slots=True)
class DescribedRange:
    first_offset: int
    last_offset: int
    state: int
    delivery_count: int
    member_id: str | None
    acquired_timestamp: int  # wall-clock ms, -1 when not acquired
    lock_deadline_timestamp: int  # wall-clock ms, -1 when not held (see hold_deadline)
    in_progress_start_timestamp: int = -1  # wall-clock ms, -1 unless IN_PROGRESS
    last_progress_timestamp: int = -1  # wall-clock ms, -1 unless IN_PROGRESS
    stale: bool = False


@dataclass(frozen=True, slots=True)
class DescribedPartition:
    partition: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    start_offset: int = -1
    end_offset: int = -1
    ranges: tuple[DescribedRange, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribedTopic:
    topic_id: uuid.UUID
    name: str | None
    partitions: tuple[DescribedPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupInFlight:
    group_id: str
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    topics: tuple[DescribedTopic, ...] = ()


def describe_group_in_flight(
    service, group_id: str, requested: dict[uuid.UUID, Iterable[int]] | None, wanted: InFlightFilter,
    *, coordinated: bool = True,
) -> GroupInFlight:
    """The in-flight picture of one group, read from the engines (no I/O, nothing changes).

    ``service`` is the ShareService: its coordinator, partition registry, cluster and clocks.
    ``requested`` maps topic ids to partitions, or is None for all of the group's share-partitions.
    ``coordinated`` False (scale-out, another instance coordinates the group): the named
    share-partitions are described from what this instance leads, without knowing the group.
    """
    problem = wanted.problem()
    if problem is not None:
        return GroupInFlight(group_id, ErrorCode.invalid_request, problem)
    if coordinated and not service.coordinator.has_group(group_id):
        return GroupInFlight(group_id, ErrorCode.group_id_not_found, f"Share group {group_id} not found.")
    registry = service.leaders
    owned: set[tuple[uuid.UUID, int]] = set(service.coordinator.initialized_partitions(group_id))
    owned.update((leader.key[1], leader.key[2]) for leader in registry.of_group(group_id))
    owned.update((key[1], key[2]) for key in registry.parked_of_group(group_id))
    if requested is None:
        wanted_partitions: dict[uuid.UUID, list[int]] = {}
        for topic_id, partition in owned:
            wanted_partitions.setdefault(topic_id, []).append(partition)
    else:
        wanted_partitions = {topic_id: list(partitions) for topic_id, partitions in requested.items()}
    now, wall_now = service.clock(), service.wall_clock()

    def wall(ms: int) -> int:
        # The engine keeps time on the monotonic clock; shown as wall-clock time.
        return -1 if ms < 0 else wall_now - (now - ms)

    topics = []
    for topic_id in sorted(wanted_partitions, key=str):
        topic = service.cluster.topic_by_id(topic_id)
        described = []
        for partition in sorted(set(wanted_partitions[topic_id])):
            key = (group_id, topic_id, partition)
            leader = registry.active(key)
            if leader is not None:
                engine = leader.engine
                config = engine.config
                ranges = tuple(
                    DescribedRange(run.first_offset, run.last_offset, int(run.state), run.delivery_count,
                                   run.member_id, wall(run.acquired_at), wall(hold_deadline(run, config)),
                                   wall(run.in_progress_start), wall(run.last_progress),
                                   is_stale(run, config, now))
                    for run in engine.in_flight_locked() if wanted.matches(run, now)
                )
                described.append(DescribedPartition(partition, start_offset=engine.start_offset,
                                                    end_offset=engine.end_offset, ranges=ranges))
                continue
            parked = registry.parked_start_offset(key)
            if parked is not None:
                # Parked: nothing in flight, so the window is empty at its SPSO.
                described.append(DescribedPartition(partition, start_offset=parked, end_offset=parked))
            elif (topic_id, partition) in owned:
                # Initialised but not led here (yet): nothing known beyond that.
                described.append(DescribedPartition(partition))
            elif topic is None or partition not in topic.partitions:
                described.append(DescribedPartition(
                    partition, ErrorCode.unknown_topic_or_partition,
                    f"Topic id {topic_id} partition {partition} does not exist."))
            else:
                described.append(DescribedPartition(partition))  # never initialised for this group
        topics.append(DescribedTopic(topic_id, topic.name if topic else None, tuple(described)))
    return GroupInFlight(group_id, topics=tuple(topics))


# ----- the wire ------------------------------------------------------------------------------


def in_flight_response(result: GroupInFlight, response_type: type):
    # Classes built from the extension's JSON schema carry their nested structs as attributes.
    topic_type, partition_type, records_type = (
        response_type.InFlightTopic, response_type.InFlightPartition, response_type.InFlightRecords)
    return response_type(
        throttle_time_ms=0,
        error_code=result.error,
        error_message=result.message,
        group_id=result.group_id,
        topics=tuple(
            topic_type(
                topic_id=topic.topic_id,
                topic_name=topic.name,
                partitions=tuple(
                    partition_type(
                        partition_index=p.partition,
                        error_code=p.error,
                        error_message=p.message,
                        start_offset=p.start_offset,
                        end_offset=p.end_offset,
                        records=tuple(
                            records_type(
                                first_offset=r.first_offset,
                                last_offset=r.last_offset,
                                state=r.state,
                                delivery_count=r.delivery_count,
                                member_id=r.member_id,
                                acquired_timestamp=r.acquired_timestamp,
                                in_progress_start_timestamp=r.in_progress_start_timestamp,
                                last_progress_timestamp=r.last_progress_timestamp,
                                lock_deadline_timestamp=r.lock_deadline_timestamp,
                                stale=r.stale,
                            )
                            for r in p.ranges
                        ),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in result.topics
        ),
    )


def request_filter(request) -> InFlightFilter:
    return InFlightFilter(
        states=frozenset(int(s) for s in request.states),
        held_longer_than_ms=int(request.held_longer_than_ms),
        progress_staleness_ms=int(request.progress_staleness_ms),
    )


def requested_partitions(request) -> dict[uuid.UUID, list[int]] | None:
    if request.topics is None:
        return None
    requested: dict[uuid.UUID, list[int]] = {}
    for topic in request.topics:
        requested.setdefault(topic.topic_id, []).extend(int(p) for p in topic.partitions)
    return requested


def in_flight_routes(service, api_key: int = extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY,
                     policy: AuthorizationPolicy | None = None) -> dict[int, ServeLocally]:
    """The route serving DescribeShareGroupInFlight under ``api_key``."""
    api = extensions.describe_in_flight(api_key)

    async def serve(request: Request, connection: ClientConnection) -> bytes:
        header = request.header
        body = memoryview(request.frame)[request.body_offset:]
        entity = decode_entity(api.requests[header.api_version], body)  # MessageDecodeError closes the connection
        authz = authorization_for(policy, connection)
        # A coordinating instance fanning a client's request out calls as itself (the client was
        # authorized where it asked), so an instance's principal passes too.
        if authz is not None and not await group_or_instance_allowed(authz, api_key, entity.group_id,
                                                                     Operation.DESCRIBE):
            result = GroupInFlight(entity.group_id, ErrorCode.group_authorization_failed, None)
            return response_payload(request, in_flight_response(result, api.responses[header.api_version]))
        requested = requested_partitions(entity)
        fan_out, ownership = getattr(service, "in_flight_fan_out", None), getattr(service, "ownership", None)
        if fan_out is not None and ownership is not None and not ownership.coordinates(entity.group_id):
            if requested is None:  # the whole group: the coordinator knows its share-partitions
                answer = await fan_out.from_coordinator(entity, header.api_version)
                if not isinstance(answer, PeerFailure):
                    return response_payload(request, answer)
                result = GroupInFlight(entity.group_id, answer.error, answer.message)
                return response_payload(request, in_flight_response(result, api.responses[header.api_version]))
            result = _led_here(describe_group_in_flight(service, entity.group_id, requested, request_filter(entity),
                                                        coordinated=False), ownership)
        else:
            result = describe_group_in_flight(service, entity.group_id, requested, request_filter(entity))
            if fan_out is not None and ownership is not None and result.error is ErrorCode.none:
                result = await _with_leaders(result, fan_out, ownership, entity, header.api_version)
        if authz is not None and result.error is ErrorCode.none:
            result = await authorized_topics(result, authz, api_key, listed_all=requested is None)
        if result.error is not ErrorCode.none:
            log.info("in-flight describe refused", group=entity.group_id, error=result.error.name,
                     message=result.message)
        return response_payload(request, in_flight_response(result, api.responses[header.api_version]))

    return {api_key: ServeLocally(serve)}


def _led_here(result: GroupInFlight, ownership) -> GroupInFlight:
    """Named share-partitions of a group coordinated elsewhere: those not led here are refused."""
    return dataclasses.replace(result, topics=tuple(dataclasses.replace(topic, partitions=tuple(
        p if p.error is not ErrorCode.none or ownership.leads(topic.topic_id, p.partition)
        else DescribedPartition(p.partition, ErrorCode.not_leader_or_follower, NOT_LED_HERE_MESSAGE)
        for p in topic.partitions)) for topic in result.topics))


async def _with_leaders(result: GroupInFlight, fan_out, ownership, request, version: int) -> GroupInFlight:
    """The coordinator's answer with the share-partitions other instances lead described by them."""
    remote = [(topic.topic_id, p.partition) for topic in result.topics for p in topic.partitions
              if p.error is ErrorCode.none and not ownership.leads(topic.topic_id, p.partition)]
    if not remote:
        return result
    answers = await fan_out.from_leaders(request, version, remote)

    def described(topic_id: uuid.UUID, partition: DescribedPartition) -> DescribedPartition:
        answer = answers.get((topic_id, partition.partition))
        if answer is None:
            return partition
        if isinstance(answer, PeerFailure):
            return DescribedPartition(partition.partition, answer.error, answer.message)
        return _from_wire(answer)

    return dataclasses.replace(result, topics=tuple(dataclasses.replace(topic, partitions=tuple(
        described(topic.topic_id, p) for p in topic.partitions)) for topic in result.topics))


def _from_wire(entry) -> DescribedPartition:
    """An InFlightPartition entry (a leading instance's answer) as this module describes one."""
    return DescribedPartition(
        int(entry.partition_index), ErrorCode(int(entry.error_code)), entry.error_message, int(entry.start_offset),
        int(entry.end_offset), tuple(
            DescribedRange(int(r.first_offset), int(r.last_offset), int(r.state), int(r.delivery_count),
                           r.member_id, int(r.acquired_timestamp), int(r.lock_deadline_timestamp),
                           int(r.in_progress_start_timestamp), int(r.last_progress_timestamp), bool(r.stale))
            for r in entry.records))


async def authorized_topics(result: GroupInFlight, authz, api_key: int, *, listed_all: bool) -> GroupInFlight:
    """`result` without what the client may not DESCRIBE (see the module doc)."""
    named = [t.name for t in result.topics if t.name is not None]
    visible = await topics_allowed(authz, api_key, named, Operation.DESCRIBE)
    topics = []
    for topic in result.topics:
        if topic.name is None or topic.name in visible:
            topics.append(topic)
        elif not listed_all:
            topics.append(DescribedTopic(topic.topic_id, None, tuple(
                DescribedPartition(p.partition, ErrorCode.topic_authorization_failed, TOPIC_DENIED_MESSAGE)
                for p in topic.partitions)))
    return dataclasses.replace(result, topics=tuple(topics))


def in_flight_version_range(api_key: int = extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY) -> tuple[int, VersionRange]:
    api = extensions.describe_in_flight(api_key)
    return api_key, VersionRange(api.min_version, api.max_version)


__all__ = ["InFlightFilter", "describe_group_in_flight", "hold_deadline", "held_since", "in_flight_routes",
           "in_flight_response", "in_flight_version_range", "is_stale", "IN_PROGRESS", "RecordState"]
