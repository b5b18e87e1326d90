"""The share APIs on the wire: decode a request, call the service, encode the response.

Registered in the proxy's dispatch table (``ServeLocally``) for ShareGroupHeartbeat (76),
ShareGroupDescribe (77), ShareFetch (78) and ShareAcknowledge (79), and advertised in
ApiVersions whatever the upstream broker offers. A request that does not decode closes the
connection (the codec error propagates to the connection loop), as a broker would.

With share authorization enforced (:mod:`proxy.share.enforce`), each request is first checked as
Kafka's ``KafkaApis`` checks it: READ on the group for heartbeat, fetch and acknowledge (else the
whole response is GROUP_AUTHORIZATION_FAILED and nothing changes), DESCRIBE on subscribed topics
for the heartbeat, READ per topic for fetch and acknowledge (TOPIC_AUTHORIZATION_FAILED for those
partitions: no acquisition, no acknowledgement applied), DESCRIBE on each described group and on
the topics of its assignment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import fields

import structlog
from kio.schema.errors import ErrorCode

from codec.headers import RequestHeader, encode_response_header, response_header_version
from codec.registry import DEFAULT_REGISTRY, nested_types
from codec.framing import ScatteredPayload
from codec.share_fetch import NodeEndpointAnswer, PartitionAnswer, ShareFetchBody, share_fetch_response_parts
from proxy.apiversions import VersionRange
from proxy.connection import ByteBudget, ClientConnection, Request, ServeLocally
from proxy.metrics import count_error_codes
from proxy.route_split import item_type, response_payload
from proxy.share.authorization import AuthorizationPolicy, Operation
from proxy.share.coordinator import AUTHORIZED_OPERATIONS_OMITTED
from proxy.share.enforce import (
    DESCRIBED_TOPICS_DENIED_MESSAGE,
    GROUP_DENIED_MESSAGE,
    authorization_for,
    group_allowed,
    group_or_instance_allowed,
    topic_check,
    topics_allowed,
)
from proxy.share.manager import AcknowledgeOutcome, FetchOutcome, ShareService
from proxy.share.reader import Fetched
from proxy.share.sessions import response_order

log = structlog.get_logger(__name__)

SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79

# Versions served: those the codec registry decodes (v0, Kafka 4.0's early access, is not served).
SERVED_VERSIONS = {
    api_key: DEFAULT_REGISTRY.supported_versions(api_key)
    for api_key in (SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE)
}

Handler = Callable[[object, Request, ClientConnection], Awaitable[object]]

# A ShareFetch always may return this much, even on a connection whose byte budget is spent.
MIN_SHARE_FETCH_BYTES = 256 * 1024


def _serve(handler: Handler):
    async def serve(request: Request, connection: ClientConnection) -> bytes:
        header = request.header
        body = memoryview(request.frame)[request.body_offset:]
        entity = DEFAULT_REGISTRY.decode_request(header.api_key, header.api_version, body)
        response = await handler(entity, request, connection)
        # A handler on the hot path encodes its own frame (share_fetch_payload).
        if isinstance(response, (bytes, ScatteredPayload)):
            return response
        return response_payload(request, response)

    return serve


def share_routes(service: ShareService, policy: AuthorizationPolicy | None = None) -> dict[int, ServeLocally]:
    async def heartbeat(entity, request: Request, connection: ClientConnection):
        if service.ownership is not None and not service.ownership.coordinates(entity.group_id):
            # Scale-out: the client finds the coordinator again (FindCoordinator) and retries there.
            return heartbeat_refusal(ErrorCode.not_coordinator,
                                     "Another proxy instance coordinates this group (scale-out).")
        authz = authorization_for(policy, connection)
        if authz is not None:
            # KafkaApis.handleShareGroupHeartbeat: READ on the group, DESCRIBE on every subscribed topic.
            if not await group_allowed(authz, SHARE_GROUP_HEARTBEAT, entity.group_id, Operation.READ):
                return heartbeat_refusal(ErrorCode.group_authorization_failed, GROUP_DENIED_MESSAGE)
            subscribed = set(entity.subscribed_topic_names or ())
            if subscribed and len(await topics_allowed(authz, SHARE_GROUP_HEARTBEAT, subscribed,
                                                       Operation.DESCRIBE)) < len(subscribed):
                return heartbeat_refusal(ErrorCode.topic_authorization_failed, None)
        host = connection_peer_host(connection)
        return await service.heartbeat(entity, client_id=request.header.client_id or "", client_host=host)

    async def describe(entity, request: Request, connection: ClientConnection):
        authz = authorization_for(policy, connection)
        if authz is None:
            return service.describe(entity)
        return await authorized_describe(service, authz, entity)

    async def share_fetch(entity, request: Request, connection: ClientConnection):
        version = request.header.api_version
        authz = authorization_for(policy, connection)
        if authz is not None and not await group_allowed(authz, SHARE_FETCH, entity.group_id, Operation.READ):
            # Before any session change (KafkaApis.handleShareFetchRequest).
            return share_fetch_payload(request.header, FetchOutcome(ErrorCode.group_authorization_failed,
                                                             GROUP_DENIED_MESSAGE), service.cluster)
        service.watch_connection(connection.id, connection.closed)
        check = None if authz is None else topic_check(authz, service.cluster, SHARE_FETCH)
        with reserved_fetch_bytes(getattr(connection, "budget", None)) as cap:
            outcome = await service.share_fetch(entity, version, connection.id, node_id=connection.node_id,
                                                max_bytes_cap=cap, check_topics=check)
        return share_fetch_payload(request.header, outcome, service.cluster, service.advertised_endpoint,
                                   scale_out=service.ownership is not None)

    async def share_acknowledge(entity, request: Request, connection: ClientConnection):
        version = request.header.api_version
        authz = authorization_for(policy, connection)
        if authz is not None and not await group_allowed(authz, SHARE_ACKNOWLEDGE, entity.group_id, Operation.READ):
            return share_acknowledge_response(
                AcknowledgeOutcome(ErrorCode.group_authorization_failed, GROUP_DENIED_MESSAGE), version)
        service.watch_connection(connection.id, connection.closed)
        check = None if authz is None else topic_check(authz, service.cluster, SHARE_ACKNOWLEDGE)
        outcome = await service.share_acknowledge(entity, version, connection.id, node_id=connection.node_id,
                                                  check_topics=check)
        return share_acknowledge_response(outcome, version)

    return {
        SHARE_GROUP_HEARTBEAT: ServeLocally(_serve(heartbeat)),
        SHARE_GROUP_DESCRIBE: ServeLocally(_serve(describe)),
        SHARE_FETCH: ServeLocally(_serve(share_fetch)),
        SHARE_ACKNOWLEDGE: ServeLocally(_serve(share_acknowledge)),
    }


def heartbeat_refusal(code: ErrorCode, message: str | None):
    """A ShareGroupHeartbeat answered with only an error (Kafka's getErrorResponse)."""
    response_type = DEFAULT_REGISTRY.response_type(SHARE_GROUP_HEARTBEAT, SERVED_VERSIONS[SHARE_GROUP_HEARTBEAT][1])
    return response_type(throttle_time=_ms(0), error_code=code, error_message=message, member_id=None,
                         member_epoch=0, heartbeat_interval=_ms(0), assignment=None)


async def authorized_describe(service: ShareService, authz, entity):
    """ShareGroupDescribe as KafkaApis.handleShareGroupDescribe answers it under an authorizer:
    GROUP_AUTHORIZATION_FAILED for a group without DESCRIBE (listed first, as Kafka adds them
    first); a described group whose assignment names a topic the client may not DESCRIBE becomes
    TOPIC_AUTHORIZATION_FAILED without members; AuthorizedOperations from the probes."""
    permitted, refused = [], []
    for group_id in entity.group_ids:
        # An instance's principal passes: leaders ask coordinators who left (MembershipWatch).
        allowed = await group_or_instance_allowed(authz, SHARE_GROUP_DESCRIBE, group_id, Operation.DESCRIBE)
        (permitted if allowed else refused).append(group_id)
    described = service.describe(dataclasses.replace(entity, group_ids=tuple(permitted),
                                                     include_authorized_operations=False))
    group_type = item_type(type(described), "groups")

    def bare(group_id: str, code: ErrorCode, message: str | None):
        return group_type(error_code=code, error_message=message, group_id=group_id, group_state="", group_epoch=0,
                        assignment_epoch=0, assignor_name="", members=(),
                        authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)

    groups = [bare(group_id, ErrorCode.group_authorization_failed, None) for group_id in refused]
    groups.extend(described.groups)
    names = {tp.topic_name for g in groups for m in g.members for tp in m.assignment.topic_partitions}
    visible = await topics_allowed(authz, SHARE_GROUP_DESCRIBE, names, Operation.DESCRIBE)
    answered = []
    for g in groups:
        if any(tp.topic_name not in visible for m in g.members for tp in m.assignment.topic_partitions):
            answered.append(bare(g.group_id, ErrorCode.topic_authorization_failed, DESCRIBED_TOPICS_DENIED_MESSAGE))
        elif entity.include_authorized_operations and g.error_code is ErrorCode.none:
            answered.append(dataclasses.replace(g, authorized_operations=await authz.group_operations(g.group_id)))
        else:
            answered.append(g)
    return dataclasses.replace(described, groups=tuple(answered))


@contextlib.contextmanager
def reserved_fetch_bytes(budget: ByteBudget | None) -> Iterator[int | None]:
    """What a ShareFetch may bring back, taken from the connection's byte budget while it runs.

    Reserved up front, so fetches a client pipelines cannot each return MaxBytes: the first gets
    what is left of the budget, later ones at least MIN_SHARE_FETCH_BYTES (they always progress).
    """
    if budget is None:
        yield None
        return
    reserved = max(MIN_SHARE_FETCH_BYTES, budget.limit - budget.held)
    budget.charge(reserved)
    try:
        yield reserved
    finally:
        budget.release(reserved)


def served_version_ranges() -> dict[int, VersionRange]:
    return {key: VersionRange(low, high) for key, (low, high) in SERVED_VERSIONS.items()}


def connection_peer_host(connection: ClientConnection) -> str:
    peer = getattr(connection, "peer", "") or ""
    return "/" + peer.rsplit(":", 1)[0] if peer else ""


# ----- responses ---------------------------------------------------------------------------


def _ms(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def share_fetch_body(outcome: FetchOutcome, cluster, advertised_endpoint=None, *,
                     scale_out: bool = False) -> ShareFetchBody:
    """What the ShareFetch response for `outcome` says (partitions by topic in response order,
    the leader hints).

    A partition answered NOT_LEADER_OR_FOLLOWER names its upstream leader (KIP-951: the broker
    moved it) -- but with ``scale_out`` no leader at all, so the client refreshes metadata, which
    names the instance leading it: naming that instance here would carry the upstream leader
    epoch unchanged (a move between instances does not bump it), and Java's KafkaShareConsumer
    (4.x) ignores a hint whose epoch is not newer *without* refreshing metadata -- after a
    kill -9 it kept fetching from the dead instance until metadata.max.age.ms
    (integration/share/test_scale_out.py, the Java-follows test)."""
    if outcome.error is not ErrorCode.none:
        return ShareFetchBody(outcome.error.value, outcome.message, lock_ms=0, topics=())
    fetched, ack_results = outcome.fetched, outcome.acknowledgements
    by_topic: dict[uuid.UUID, list[PartitionAnswer]] = {}
    moved_leaders: set[int] = set()
    for tp in sorted(set(fetched) | set(ack_results), key=response_order):  # clients hand records out so
        part = fetched.get(tp) or _NOTHING_FETCHED
        ack_code, ack_message = ack_results.get(tp, _NO_ACK_ERROR)
        topic = cluster.topic_by_id(tp[0])
        info = topic.partitions.get(tp[1]) if topic else None
        leader_id, leader_epoch = (info.leader_id, info.leader_epoch) if info else (-1, -1)
        if part.error is ErrorCode.not_leader_or_follower and info is not None and info.leader_id >= 0:
            if scale_out:
                leader_id, leader_epoch = -1, -1
            else:
                moved_leaders.add(info.leader_id)
        by_topic.setdefault(tp[0], []).append(PartitionAnswer(
            tp[1], part.error.value, part.message, int(ack_code), ack_message, leader_id, leader_epoch,
            part.records, part.acquired))
    return ShareFetchBody(ErrorCode.none.value, outcome.message, outcome.lock_ms, list(by_topic.items()),
                          _node_endpoints(moved_leaders, advertised_endpoint))


_NOTHING_FETCHED = Fetched()
_NO_ACK_ERROR = (ErrorCode.none, None)


def share_fetch_payload(header: RequestHeader, outcome: FetchOutcome, cluster, advertised_endpoint=None, *,
                        scale_out: bool = False) -> ScatteredPayload:
    """The ShareFetch response frame for the request `header` names, written by
    :mod:`codec.share_fetch` (the hot path: no kio entities, large records not copied); its error
    codes counted as :func:`response_payload` counts them."""
    body = share_fetch_body(outcome, cluster, advertised_endpoint, scale_out=scale_out)
    count_error_codes(SHARE_FETCH, _error_codes_of(body))
    return share_fetch_response_parts(
        encode_response_header(header.correlation_id, response_header_version(SHARE_FETCH, header.api_version)), body)


def _error_codes_of(body: ShareFetchBody) -> Iterator[int]:
    if body.error_code:
        yield body.error_code
    for _, answers in body.topics:
        for answer in answers:
            if answer.error_code:
                yield answer.error_code
            if answer.acknowledge_error_code:
                yield answer.acknowledge_error_code


def _node_endpoints(node_ids, advertised_endpoint) -> list[NodeEndpointAnswer]:
    """KIP-951 leader hints for moved partitions, with the proxy's endpoints for those nodes."""
    found: dict[int, tuple[str, int]] = {}
    if advertised_endpoint is not None:
        for node_id in node_ids:
            try:
                found[node_id] = advertised_endpoint(node_id)
            except KeyError:
                continue  # a broker the proxy has no listener for yet; the client refreshes metadata
    return [NodeEndpointAnswer(node_id, found[node_id][0], found[node_id][1], None) for node_id in sorted(found)]


def share_acknowledge_response(outcome: AcknowledgeOutcome, version: int):
    """The ShareAcknowledge response (`version`) for what the service did. A partition answered
    NOT_LEADER_OR_FOLLOWER names no leader: the client refreshes metadata."""
    response_type = DEFAULT_REGISTRY.response_type(SHARE_ACKNOWLEDGE, version)
    types = nested_types(response_type)
    partition_type, topic_type, leader_type = (
        types["PartitionData"], types["ShareAcknowledgeTopicResponse"], types["LeaderIdAndEpoch"],
    )
    by_topic: dict[uuid.UUID, list] = {}
    results = sorted(outcome.acknowledgements.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
    for (topic_id, partition), (ack_code, ack_message) in results:
        by_topic.setdefault(topic_id, []).append(partition_type(
            partition_index=partition, error_code=ack_code, error_message=ack_message,
            current_leader=leader_type(leader_id=-1, leader_epoch=-1),
        ))
    extra = ({"acquisition_lock_timeout": _ms(outcome.lock_ms)}
             if _has_field(response_type, "acquisition_lock_timeout") else {})
    return response_type(
        throttle_time=_ms(0), error_code=outcome.error, error_message=outcome.message,
        responses=tuple(topic_type(topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
        node_endpoints=(), **extra,
    )


@functools.cache
def _has_field(entity_type: type, name: str) -> bool:
    return any(f.name == name for f in fields(entity_type))


__all__ = ["share_routes", "served_version_ranges", "SERVED_VERSIONS", "share_fetch_body", "share_fetch_payload",
           "share_acknowledge_response"]
