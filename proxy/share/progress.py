"""MarkInProgress (the draft KIP's extension RPC, key 81 unless configured): a member tells the
proxy it is still working on records it holds, moving them ACQUIRED -> IN_PROGRESS or refreshing
their progress time (KIP draft 3.2 "markInProgress handler"; docs/in-progress.md).

Checked as ShareAcknowledge is, and it counts as one for the share session:

* GroupId and MemberId are required (INVALID_REQUEST);
* the share session on the node the request came in on (sessions are per node) must exist with
  the request's epoch (SHARE_SESSION_NOT_FOUND /
  INVALID_SHARE_SESSION_EPOCH), and the epoch advances; a mark neither opens a session (epoch 0)
  nor closes one (epoch -1), both INVALID_SHARE_SESSION_EPOCH;
* the member must be in the group (GROUP_ID_NOT_FOUND / UNKNOWN_MEMBER_ID): a member that left
  rejoins with its member id before it may mark again (its IN_PROGRESS records wait for it through
  the rebalance grace);
* per partition: UNKNOWN_TOPIC_OR_PARTITION for a topic id or partition the cluster does not have,
  INVALID_RECORD_STATE where nothing is held (a share-partition not led here), and the engine's
  verdict -- INVALID_RECORD_STATE for records the member does not hold ACQUIRED or IN_PROGRESS or
  past the max extension, INVALID_REQUEST for bad ranges -- all or nothing per partition.

A mark changes durable state (the record's state, owner and times), so it is staged, written and
answered only once durable; a failed write rolls it back and is answered KAFKA_STORAGE_ERROR
(retriable), as a ShareAcknowledge is. ``AcquisitionLockTimeoutMs`` is the group's staleness
threshold: how long the records stay the member's without another mark.

With share authorization enforced (:mod:`proxy.share.enforce`) a mark needs READ on the group
(else GROUP_AUTHORIZATION_FAILED, before the session is touched) and READ on each topic (else
TOPIC_AUTHORIZATION_FAILED for its partitions, which are not marked), as ShareAcknowledge does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog
from kio.schema.errors import ErrorCode

from codec import extensions
from codec.registry import decode_entity
from proxy.apiversions import VersionRange
from proxy.connection import ClientConnection, Request, ServeLocally
from proxy.route_split import response_payload
from proxy.share.assignor import TopicIdPartition
from proxy.share.authorization import AuthorizationPolicy, Operation
from proxy.share.enforce import GROUP_DENIED_MESSAGE, authorization_for, group_allowed, topic_check
from proxy.share.commit import Cause
from proxy.share.partition import ShareStateError
from proxy.share.persister import PersistError
from proxy.share.sessions import FINAL_EPOCH, INITIAL_EPOCH, ShareSessionError

log = structlog.get_logger(__name__)

PartitionResults = dict[TopicIdPartition, tuple[ErrorCode, str | None]]


@dataclass(slots=True)
class MarkOutcome:
    """What a MarkInProgress did; turned into the response by :func:`mark_response`."""

    error: ErrorCode = ErrorCode.none
    message: str | None = None
    partitions: PartitionResults = field(default_factory=dict)
    lock_ms: int = 0


def requested_ranges(request) -> list[tuple[TopicIdPartition, list[tuple[int, int]]]]:
    """(partition, [(first, last), ...]) in request order; a partition named twice keeps both lists."""
    merged: dict[TopicIdPartition, list[tuple[int, int]]] = {}
    for topic in request.topics:
        for partition in topic.partitions:
            tp = (topic.topic_id, int(partition.partition_index))
            merged.setdefault(tp, []).extend(
                (int(b.first_offset), int(b.last_offset)) for b in partition.progress_batches)
    return list(merged.items())


async def mark_in_progress(service, request, connection_id: int, node_id: int, check_topics=None) -> MarkOutcome:
    """Validate, stage, write and answer one MarkInProgress request of ``service`` (a ShareService)
    that came in on the listener of broker ``node_id``. ``check_topics`` (authorization, a
    manager.TopicCheck) names the topic ids whose partitions are refused."""
    group_id, member_id = request.group_id, request.member_id
    if not group_id or not member_id:
        return MarkOutcome(ErrorCode.invalid_request, "GroupId and MemberId are required.")
    epoch = int(request.share_session_epoch)
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        return MarkOutcome(ErrorCode.invalid_share_session_epoch,
                           f"MarkInProgress neither opens nor closes a share session (epoch {epoch}).")
    refused = service.membership_error(group_id, member_id)
    if refused is not None:
        return MarkOutcome(*refused)
    try:
        # Counts as a ShareAcknowledge for the session: same checks, and the epoch advances.
        service.sessions.share_acknowledge(node_id, group_id, member_id, epoch, connection_id)
    except ShareSessionError as exc:
        return MarkOutcome(exc.code, str(exc))
    requested = requested_ranges(request)
    denied: set[uuid.UUID] = set()
    if check_topics is not None:
        denied = await check_topics({tp[0] for tp, _ in requested})
    group_config = service.coordinator.group_config(group_id)
    outcome = MarkOutcome(lock_ms=group_config.in_progress_staleness_threshold_ms)
    for tp, ranges in requested:
        if tp[0] in denied and ranges:
            outcome.partitions[tp] = (ErrorCode.topic_authorization_failed, "Topic authorization failed.")
    waits = stage_marks(service, group_id, member_id, [(tp, r) for tp, r in requested if tp[0] not in denied],
                        outcome.partitions)
    await _await_durable(service, outcome.partitions, waits)
    return outcome


def stage_marks(service, group_id: str, member_id: str,
                requested: Iterable[tuple[TopicIdPartition, list[tuple[int, int]]]],
                results: PartitionResults) -> list:
    """Stage each partition's marks in its engine (all or nothing per partition); returns the
    (partition, leader, version) writes that must be durable before a success is reported."""
    waits = []
    now = service.clock()
    for tp, ranges in requested:
        if not ranges:
            continue  # as ShareAcknowledge: a partition without batches gets no answer
        topic = service.cluster.topic_by_id(tp[0])
        if topic is None or tp[1] not in topic.partitions:
            results[tp] = (ErrorCode.unknown_topic_or_partition,
                           f"Topic id {tp[0]} partition {tp[1]} does not exist.")
            continue
        leader = service.leaders.active((group_id, *tp))  # a parked one holds nothing acquired
        if leader is None:
            results[tp] = (ErrorCode.invalid_record_state, "No records are acquired on this share-partition.")
            continue
        service.leaders.refresh_config(leader)  # the group's current staleness and max extension
        try:
            staged = leader.engine.stage_mark_in_progress(member_id, ranges, now=now)
        except ShareStateError as exc:
            results[tp] = (ErrorCode(exc.error_code), str(exc))
            continue
        results[tp] = (ErrorCode.none, None)
        service.deadline_changed(leader)  # the sweep of IN_PROGRESS records is a deadline too
        if staged is not None:
            waits.append((tp, leader, service.commits.record(leader, staged.delta, Cause.MARKED_IN_PROGRESS, staged)))
        elif leader.durable < leader.version:
            waits.append((tp, leader, service.commits.touch(leader)))
    return waits


async def _await_durable(service, results: PartitionResults, waits) -> None:
    for tp, leader, version in waits:
        try:
            await service.commits.durable(leader, version)
        except PersistError as exc:
            results[tp] = (ErrorCode.kafka_storage_error,
                           f"The progress mark could not be made durable and was rolled back; retry. ({exc})")


# ----- the wire ------------------------------------------------------------------------------


def mark_response(outcome: MarkOutcome, response_type: type):
    """The MarkInProgress response for what the service did (nested classes from the JSON schema)."""
    topic_type, partition_type, leader_type = (
        response_type.ProgressTopicResponse, response_type.PartitionData, response_type.LeaderIdAndEpoch)
    by_topic: dict[uuid.UUID, list] = {}
    for (topic_id, partition), (code, message) in sorted(outcome.partitions.items(),
                                                         key=lambda kv: (str(kv[0][0]), kv[0][1])):
        by_topic.setdefault(topic_id, []).append(partition_type(
            partition_index=partition, error_code=code, error_message=message,
            # As ShareAcknowledge answers: this proxy leads every share-partition it serves.
            current_leader=leader_type(leader_id=-1, leader_epoch=-1),
        ))
    return response_type(
        throttle_time_ms=0,
        error_code=outcome.error,
        error_message=outcome.message,
        acquisition_lock_timeout_ms=outcome.lock_ms,
        responses=tuple(topic_type(topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
        node_endpoints=(),
    )


def progress_routes(service, api_key: int = extensions.DEFAULT_MARK_IN_PROGRESS_KEY,
                    policy: AuthorizationPolicy | None = None) -> dict[int, ServeLocally]:
    """The route serving MarkInProgress under ``api_key``."""
    api = extensions.mark_in_progress(api_key)

    async def serve(request: Request, connection: ClientConnection) -> bytes:
        header = request.header
        body = memoryview(request.frame)[request.body_offset:]
        entity = decode_entity(api.requests[header.api_version], body)  # MessageDecodeError closes the connection
        authz = authorization_for(policy, connection)
        if authz is not None and not await group_allowed(authz, api_key, entity.group_id, Operation.READ):
            outcome = MarkOutcome(ErrorCode.group_authorization_failed, GROUP_DENIED_MESSAGE)
            return response_payload(request, mark_response(outcome, api.responses[header.api_version]))
        service.watch_connection(connection.id, connection.closed)
        check = None if authz is None else topic_check(authz, service.cluster, api_key)
        outcome = await mark_in_progress(service, entity, connection.id, connection.node_id, check)
        if outcome.error is not ErrorCode.none:
            log.info("progress mark refused", group=entity.group_id, member=entity.member_id,
                     error=outcome.error.name, message=outcome.message)
        return response_payload(request, mark_response(outcome, api.responses[header.api_version]))

    return {api_key: ServeLocally(serve)}


def progress_version_range(api_key: int = extensions.DEFAULT_MARK_IN_PROGRESS_KEY) -> tuple[int, VersionRange]:
    api = extensions.mark_in_progress(api_key)
    return api_key, VersionRange(api.min_version, api.max_version)


def extension_features(mark_key: int, describe_key: int) -> dict[str, VersionRange]:
    """ApiVersions SupportedFeatures naming the extension keys (min = max = the key; common decision 11)."""
    return {
        extensions.MARK_IN_PROGRESS_KEY_FEATURE: VersionRange(mark_key, mark_key),
        extensions.DESCRIBE_IN_FLIGHT_KEY_FEATURE: VersionRange(describe_key, describe_key),
    }


__all__ = ["MarkOutcome", "extension_features", "mark_in_progress", "mark_response", "progress_routes",
           "progress_version_range", "requested_ranges", "stage_marks"]
