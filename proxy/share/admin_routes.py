"""Kafka's group admin RPCs on the wire, for share groups served by the proxy.

===============================  ===  =================================================================
API                              key  handling
===============================  ===  =================================================================
ListGroups                        16  forwarded; on ONE listener the proxy's share groups are added
                                      (:func:`lists_share_groups`), filtered as Kafka filters
DescribeGroups                    15  share-group ids answered as Kafka answers an id that is not a
                                      classic group; other ids forwarded; mixed requests merged
ConsumerGroupDescribe             69  the same, "not a consumer group"
DeleteGroups                      42  share groups deleted by the proxy; other ids forwarded; merged
DescribeShareGroupOffsets         90  served (v0, v1 adds lag)
AlterShareGroupOffsets            91  served
DeleteShareGroupOffsets           92  served
===============================  ===  =================================================================

A request that does not decode closes the connection (the codec error reaches the connection
loop), as a broker would.

**Authorization** (when enforced, :mod:`proxy.share.enforce`), as KafkaApis's handlers do it:
ListGroups lists a share group only with DESCRIBE on it (or DESCRIBE on the CLUSTER, which lists
all); DescribeGroups / ConsumerGroupDescribe answer GROUP_AUTHORIZATION_FAILED for a share group
without DESCRIBE; DeleteGroups needs DELETE; DescribeShareGroupOffsets needs DESCRIBE on the group
and leaves out (all topics) or refuses (named topics) topics without DESCRIBE; Alter needs READ on
the group and on each topic, Delete needs DELETE on the group and READ on each topic. The
questions are asked when the request is read (never in a response transform: the upstream reader
must stay free to read the answers). Decisions are in :mod:`proxy.share.group_admin`; this module decodes,
calls it and encodes the answer in the request's version.

**Which listener lists share groups.** The Java Admin (and ``kafka-share-groups --list``) sends
ListGroups to *every* broker and concatenates the answers, because each broker lists the groups
it coordinates. The proxy's share groups are not coordinated by any broker, so they are added on
the bootstrap listener and on the listener of the lowest broker node id the proxy knows, and
forwarded untouched everywhere else: the Admin (which asks the brokers it found in Metadata, never
the bootstrap address) sees each share group once; a client asking only the bootstrap address
sees them too.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Awaitable, Callable, Collection, Sequence

from kio.schema.errors import ErrorCode

import trio

from codec.registry import DEFAULT_REGISTRY, decode_entity, request_type_for, response_type_for
from proxy.apiversions import ApiVersionTable, VersionRange
from proxy.connection import ClientConnection, Request, ServeLocally
from proxy.route_split import MergeEntries, build, constant, item_type, response_payload, split_request
from proxy.share.authorization import AuthorizationPolicy, Operation
from proxy.share.peers import (
    DELETE_SHARE_GROUP_STATE,
    INITIALIZE_SHARE_GROUP_STATE,
    READ_SHARE_GROUP_STATE_SUMMARY,
    PeerStateServer,
)
from proxy.share.enforce import (
    CLUSTER_DENIED_MESSAGE,
    GROUP_DENIED_MESSAGE,
    TOPIC_DENIED_MESSAGE,
    authorization_for,
    group_allowed,
    instance_allowed,
    topics_allowed,
)
from proxy.share.group_admin import (
    SHARE_GROUP_TYPE,
    SHARE_PROTOCOL_TYPE,
    ZERO_UUID,
    AdminOutcome,
    GroupAdmin,
    GroupOffsets,
    PartitionOffset,
    PartitionResult,
    TopicOffsets,
    TopicResult,
)

DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
CONSUMER_GROUP_DESCRIBE = 69
DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92
SERVED_APIS = (DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS)
BOOTSTRAP_LISTENER = "bootstrap"  # proxy.server.BOOTSTRAP
DEAD = "Dead"


def lists_share_groups(listener: str, broker_ids: Collection[int]) -> bool:
    """Whether ListGroups answered on `listener` carries the proxy's share groups (see module doc)."""
    return listener == BOOTSTRAP_LISTENER or (bool(broker_ids) and listener == f"broker-{min(broker_ids)}")


# ----- codec helpers -----------------------------------------------------------------------


def _decode_request(request: Request) -> object:
    header = request.header
    return decode_entity(request_type_for(header.api_key, header.api_version),
                         memoryview(request.frame)[request.body_offset:])


def _local(handler: Callable[[object, Request, ClientConnection], Awaitable[object]]) -> ServeLocally:
    async def serve(request: Request, connection: ClientConnection) -> bytes:
        return response_payload(request, await handler(_decode_request(request), request, connection))

    return ServeLocally(serve)


async def _allowed_groups(policy: AuthorizationPolicy | None, connection: ClientConnection, api_key: int,
                          group_ids: Sequence[str], operation: Operation) -> set[str]:
    """The ids among `group_ids` on which `operation` is allowed (all of them when not enforced)."""
    authz = authorization_for(policy, connection)
    if authz is None or not group_ids:
        return set(group_ids)
    allowed: set[str] = set()

    async def one(group_id: str) -> None:
        if await group_allowed(authz, api_key, group_id, operation):
            allowed.add(group_id)

    async with trio.open_nursery() as nursery:  # pipelined on the connection, coalesced, cached
        for group_id in dict.fromkeys(group_ids):
            nursery.start_soon(one, group_id)
    return allowed


_ZERO = datetime.timedelta(0)


async def _split(request: Request, connection: ClientConnection, entity: object, *, request_field: str,
                 response_field: str, share_ids: Sequence[str], local_entries) -> None:
    """Answer the share ids locally and forward the rest: one response, in request order."""
    ids = tuple(getattr(entity, request_field))
    local = set(share_ids)
    await split_request(request, connection, entity=entity, request_field=request_field,
                        response_field=response_field, forwarded=[group_id not in local for group_id in ids],
                        local_entries=local_entries, order=ids)


# ----- ListGroups ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ListGroupsRoute:
    admin: GroupAdmin
    broker_ids: Callable[[], Collection[int]]
    policy: AuthorizationPolicy | None = None

    async def start(self, request: Request, connection: ClientConnection) -> None:
        if not lists_share_groups(getattr(connection, "listener", ""), self.broker_ids()):
            await connection.forward(request)
            return
        entity = _decode_request(request)
        listed = self.admin.list_groups(getattr(entity, "states_filter", None) or (),
                                        getattr(entity, "types_filter", None) or ())
        authz = authorization_for(self.policy, connection)
        if authz is not None and listed and not await authz.cluster_describe():
            # KafkaApis.handleListGroupsRequest: DESCRIBE on the CLUSTER lists every group,
            # otherwise only the groups the client may DESCRIBE.
            visible = await _allowed_groups(self.policy, connection, LIST_GROUPS, [g for g, _ in listed],
                                            Operation.DESCRIBE)
            listed = [(group_id, state) for group_id, state in listed if group_id in visible]
        entry_type = item_type(response_type_for(LIST_GROUPS, request.header.api_version), "groups")
        entries = tuple(
            build(entry_type, group_id=group_id, protocol_type=SHARE_PROTOCOL_TYPE, group_state=state,
                   group_type=SHARE_GROUP_TYPE)
            for group_id, state in listed
        )
        await connection.forward(request, MergeEntries("groups", constant(entries)) if entries else None)


# ----- DescribeGroups / ConsumerGroupDescribe ------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DescribeRoute:
    """DescribeGroups (15) and ConsumerGroupDescribe (69) for ids that may be share groups."""

    admin: GroupAdmin
    policy: AuthorizationPolicy | None = None

    async def start(self, request: Request, connection: ClientConnection) -> None:
        header = request.header
        entity = _decode_request(request)
        field = "groups" if header.api_key == DESCRIBE_GROUPS else "group_ids"
        ids = tuple(getattr(entity, field))
        share_ids = [group_id for group_id in dict.fromkeys(ids) if self.admin.is_share_group(group_id)]
        if not share_ids:
            await connection.forward(request)
            return
        entry_type = item_type(response_type_for(header.api_key, header.api_version), "groups")
        visible = await _allowed_groups(self.policy, connection, header.api_key, share_ids, Operation.DESCRIBE)
        entries = [self._entry(entry_type, header.api_key, header.api_version, g) if g in visible
                   else self._refused(entry_type, g) for g in share_ids]
        await _split(request, connection, entity, request_field=field, response_field="groups",
                     share_ids=share_ids, local_entries=constant(entries))

    @staticmethod
    def _refused(entry_type: type, group_id: str) -> object:
        # DescribeGroupsResponse.groupError / an empty ConsumerGroupDescribe DescribedGroup.
        return build(entry_type, error_code=ErrorCode.group_authorization_failed, error_message=None,
                     group_id=group_id, group_state="", protocol_type="", protocol_data="", members=(),
                     group_epoch=0, assignment_epoch=0, assignor_name="")

    @staticmethod
    def _entry(entry_type: type, api_key: int, version: int, group_id: str) -> object:
        if api_key == DESCRIBE_GROUPS:
            # GroupMetadataManager.describeGroups: a group that is not classic is "not found";
            # v6+ carries the error, earlier versions only the Dead state.
            error, message = ((ErrorCode.group_id_not_found, f"Group {group_id} is not a classic group.")
                              if version >= 6 else (ErrorCode.none, None))
            return build(entry_type, error_code=error, error_message=message, group_id=group_id, group_state=DEAD,
                          protocol_type="", protocol_data="", members=())
        # GroupMetadataManager.consumerGroupDescribe -> consumerGroup(id): GroupIdNotFoundException.
        return build(entry_type, error_code=ErrorCode.group_id_not_found,
                      error_message=f"Group {group_id} is not a consumer group.", group_id=group_id,
                      group_state="", group_epoch=0, assignment_epoch=0, assignor_name="", members=())


# ----- DeleteGroups --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DeleteGroupsRoute:
    admin: GroupAdmin
    policy: AuthorizationPolicy | None = None

    async def start(self, request: Request, connection: ClientConnection) -> None:
        entity = _decode_request(request)
        ids = tuple(entity.groups_names)
        share_ids = [group_id for group_id in dict.fromkeys(ids) if self.admin.is_share_group(group_id)]
        if not share_ids:
            await connection.forward(request)
            return
        entry_type = item_type(response_type_for(DELETE_GROUPS, request.header.api_version), "results")
        deletable = await _allowed_groups(self.policy, connection, DELETE_GROUPS, share_ids, Operation.DELETE)

        async def deleted() -> tuple:
            # Run when the answer is due (concurrently when every id is a share group), so the
            # connection goes on reading requests while the tombstones are written.
            entries = []
            for group_id in share_ids:
                if group_id not in deletable:
                    entries.append(build(entry_type, group_id=group_id,
                                         error_code=ErrorCode.group_authorization_failed, error_message=None))
                    continue
                code, message = await self.admin.delete_group(group_id)
                entries.append(build(entry_type, group_id=group_id, error_code=code, error_message=message))
            return tuple(entries)

        await _split(request, connection, entity, request_field="groups_names", response_field="results",
                     share_ids=share_ids, local_entries=deleted)


# ----- the share-group offsets APIs ----------------------------------------------------------


def describe_offsets_response(version: int, groups: Sequence[GroupOffsets]) -> object:
    response_type = DEFAULT_REGISTRY.response_type(DESCRIBE_SHARE_GROUP_OFFSETS, version)
    group_type = item_type(response_type, "groups")
    topic_type = item_type(group_type, "topics")
    partition_type = item_type(topic_type, "partitions")
    return response_type(throttle_time=_ZERO, groups=tuple(
        build(group_type, group_id=g.group_id, error_code=g.error, error_message=g.message, topics=tuple(
            build(topic_type, topic_name=t.name, topic_id=t.topic_id, partitions=tuple(
                build(partition_type, partition_index=p.partition, start_offset=p.start_offset,
                       leader_epoch=p.leader_epoch, lag=p.lag, error_code=p.error, error_message=p.message)
                for p in t.partitions))
            for t in g.topics))
        for g in groups))


def alter_offsets_response(version: int, outcome: AdminOutcome) -> object:
    response_type = DEFAULT_REGISTRY.response_type(ALTER_SHARE_GROUP_OFFSETS, version)
    topic_type = item_type(response_type, "responses")
    partition_type = item_type(topic_type, "partitions")
    return response_type(
        throttle_time=_ZERO, error_code=outcome.error, error_message=outcome.message,
        responses=tuple(
            build(topic_type, topic_name=t.name, topic_id=t.topic_id, partitions=tuple(
                build(partition_type, partition_index=p.partition, error_code=p.error, error_message=p.message)
                for p in t.partitions))
            for t in outcome.topics),
    )


def delete_offsets_response(version: int, outcome: AdminOutcome) -> object:
    response_type = DEFAULT_REGISTRY.response_type(DELETE_SHARE_GROUP_OFFSETS, version)
    topic_type = item_type(response_type, "responses")
    return response_type(
        throttle_time=_ZERO, error_code=outcome.error, error_message=outcome.message,
        responses=tuple(
            build(topic_type, topic_name=t.name, topic_id=t.topic_id, error_code=t.error, error_message=t.message)
            for t in outcome.topics),
    )


def admin_routes(admin: GroupAdmin, broker_ids: Callable[[], Collection[int]],
                 policy: AuthorizationPolicy | None = None) -> dict[int, object]:
    """The routes for the group admin APIs (see the module doc)."""

    async def describe_offsets(entity, request: Request, connection: ClientConnection):
        version = request.header.api_version
        authz = authorization_for(policy, connection)
        groups = []
        for group in entity.groups:
            topics = None if group.topics is None else [(t.topic_name, list(t.partitions)) for t in group.topics]
            if authz is None:
                groups.append(await admin.describe_offsets(group.group_id, topics, with_lag=version >= 1))
            else:
                groups.append(await _authorized_describe_offsets(admin, authz, group.group_id, topics, version))
        return describe_offsets_response(version, groups)

    async def alter_offsets(entity, request: Request, connection: ClientConnection):
        version = request.header.api_version
        topics = [(t.topic_name, [(p.partition_index, p.start_offset) for p in t.partitions])
                  for t in entity.topics]
        authz = authorization_for(policy, connection)
        if authz is None:
            return alter_offsets_response(version, await admin.alter_offsets(entity.group_id, topics))
        # KafkaApis.handleAlterShareGroupOffsetsRequest: READ on the group, READ on each topic.
        if not await group_allowed(authz, ALTER_SHARE_GROUP_OFFSETS, entity.group_id, Operation.READ):
            return alter_offsets_response(version, AdminOutcome(ErrorCode.group_authorization_failed,
                                                                GROUP_DENIED_MESSAGE))
        readable = await topics_allowed(authz, ALTER_SHARE_GROUP_OFFSETS, [name for name, _ in topics],
                                        Operation.READ)
        known = admin.cluster.snapshot.topics_by_name
        refused = tuple(
            TopicResult(name, known[name].topic_id if name in known else ZERO_UUID, tuple(
                PartitionResult(p, ErrorCode.topic_authorization_failed, TOPIC_DENIED_MESSAGE) for p, _ in parts))
            for name, parts in topics if name not in readable)
        outcome = await admin.alter_offsets(entity.group_id, [(n, parts) for n, parts in topics if n in readable])
        if outcome.error is not ErrorCode.none:
            return alter_offsets_response(version, outcome)
        return alter_offsets_response(version, dataclasses.replace(outcome, topics=refused + outcome.topics))

    async def delete_offsets(entity, request: Request, connection: ClientConnection):
        version = request.header.api_version
        names = [t.topic_name for t in entity.topics]
        authz = authorization_for(policy, connection)
        if authz is None:
            return delete_offsets_response(version, await admin.delete_offsets(entity.group_id, names))
        # KafkaApis.handleDeleteShareGroupOffsetsRequest: DELETE on the group, READ on each topic.
        if not await group_allowed(authz, DELETE_SHARE_GROUP_OFFSETS, entity.group_id, Operation.DELETE):
            return delete_offsets_response(version, AdminOutcome(ErrorCode.group_authorization_failed,
                                                                 GROUP_DENIED_MESSAGE))
        readable = await topics_allowed(authz, DELETE_SHARE_GROUP_OFFSETS, names, Operation.READ)
        refused = tuple(TopicResult(name, ZERO_UUID, error=ErrorCode.topic_authorization_failed,
                                    message=TOPIC_DENIED_MESSAGE) for name in names if name not in readable)
        outcome = await admin.delete_offsets(entity.group_id, [name for name in names if name in readable])
        if outcome.error is not ErrorCode.none:
            return delete_offsets_response(version, outcome)
        return delete_offsets_response(version, dataclasses.replace(outcome, topics=refused + outcome.topics))

    return {
        LIST_GROUPS: ListGroupsRoute(admin, broker_ids, policy),
        DESCRIBE_GROUPS: DescribeRoute(admin, policy),
        CONSUMER_GROUP_DESCRIBE: DescribeRoute(admin, policy),
        DELETE_GROUPS: DeleteGroupsRoute(admin, policy),
        DESCRIBE_SHARE_GROUP_OFFSETS: _local(describe_offsets),
        ALTER_SHARE_GROUP_OFFSETS: _local(alter_offsets),
        DELETE_SHARE_GROUP_OFFSETS: _local(delete_offsets),
    }


def peer_routes(server: PeerStateServer, policy: AuthorizationPolicy | None = None) -> dict[int, object]:
    """Routes for the share-state RPCs instances send each other in scale-out (proxy/share/peers.py).
    Under enforced ACLs only a proxy instance may call them (WRITE on the state topic,
    :meth:`Authorization.is_instance`), where Kafka asks CLUSTER_ACTION: they act on any group's
    state, and the calling instance authorized its own client. Others: CLUSTER_AUTHORIZATION_FAILED."""

    def route(api_key: int, serve):
        async def handle(entity, request: Request, connection: ClientConnection):
            authz = authorization_for(policy, connection)
            if authz is not None and not await instance_allowed(authz, api_key):
                return server.refuse(api_key, entity, ErrorCode.cluster_authorization_failed, CLUSTER_DENIED_MESSAGE)
            return await serve(entity)
        return _local(handle)

    async def read_summary(entity):
        return server.read_summary(entity)

    return {
        READ_SHARE_GROUP_STATE_SUMMARY: route(READ_SHARE_GROUP_STATE_SUMMARY, read_summary),
        INITIALIZE_SHARE_GROUP_STATE: route(INITIALIZE_SHARE_GROUP_STATE, server.initialize_state),
        DELETE_SHARE_GROUP_STATE: route(DELETE_SHARE_GROUP_STATE, server.delete_state),
    }


async def _authorized_describe_offsets(admin: GroupAdmin, authz, group_id: str,
                                       topics: list[tuple[str, list[int]]] | None, version: int) -> GroupOffsets:
    """KafkaApis.handleDescribeShareGroupOffsetsRequest under an authorizer: DESCRIBE on the group;
    all topics: those without DESCRIBE left out; named topics: those without DESCRIBE answered
    TOPIC_AUTHORIZATION_FAILED per partition (start offset and lag -1, topic id zero)."""
    if not await group_allowed(authz, DESCRIBE_SHARE_GROUP_OFFSETS, group_id, Operation.DESCRIBE):
        return GroupOffsets(group_id, error=ErrorCode.group_authorization_failed)
    if topics is None:
        described = await admin.describe_offsets(group_id, None, with_lag=version >= 1)
        if described.error is not ErrorCode.none:
            return described
        visible = await topics_allowed(authz, DESCRIBE_SHARE_GROUP_OFFSETS, [t.name for t in described.topics],
                                       Operation.DESCRIBE)
        return dataclasses.replace(described, topics=tuple(t for t in described.topics if t.name in visible))
    if not topics:
        return GroupOffsets(group_id)
    visible = await topics_allowed(authz, DESCRIBE_SHARE_GROUP_OFFSETS, [name for name, _ in topics],
                                   Operation.DESCRIBE)
    described = await admin.describe_offsets(group_id, [(n, ps) for n, ps in topics if n in visible],
                                             with_lag=version >= 1)
    if described.error is not ErrorCode.none:
        return described
    refused = tuple(
        TopicOffsets(name, ZERO_UUID, tuple(
            PartitionOffset(p, error=ErrorCode.topic_authorization_failed, message=TOPIC_DENIED_MESSAGE)
            for p in partitions))
        for name, partitions in topics if name not in visible)
    return dataclasses.replace(described, topics=described.topics + refused)


def register_admin_versions(table: ApiVersionTable) -> None:
    """Advertise the share-group offsets APIs whatever the upstream offers (the proxy serves them)."""
    for api_key in SERVED_APIS:
        low, high = DEFAULT_REGISTRY.supported_versions(api_key)
        table.register_local(api_key, VersionRange(low, high))


__all__ = ["admin_routes", "peer_routes", "register_admin_versions", "lists_share_groups", "describe_offsets_response",
           "alter_offsets_response", "delete_offsets_response"]
