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
loop), as a broker would. Decisions are in :mod:`proxy.share.group_admin`; this module decodes,
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

from codec.registry import DEFAULT_REGISTRY, decode_entity, request_type_for, response_type_for
from proxy.apiversions import ApiVersionTable, VersionRange
from proxy.connection import ClientConnection, Request, ServeLocally
from proxy.route_split import MergeEntries, build, constant, item_type, response_payload, split_request
from proxy.share.group_admin import (
    SHARE_GROUP_TYPE,
    SHARE_PROTOCOL_TYPE,
    AdminOutcome,
    GroupAdmin,
    GroupOffsets,
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


def _local(handler: Callable[[object, Request], Awaitable[object]]) -> ServeLocally:
    async def serve(request: Request, connection: ClientConnection) -> bytes:
        return response_payload(request, await handler(_decode_request(request), request))

    return ServeLocally(serve)


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

    async def start(self, request: Request, connection: ClientConnection) -> None:
        if not lists_share_groups(getattr(connection, "listener", ""), self.broker_ids()):
            await connection.forward(request)
            return
        entity = _decode_request(request)
        listed = self.admin.list_groups(getattr(entity, "states_filter", None) or (),
                                        getattr(entity, "types_filter", None) or ())
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
        entries = [self._entry(entry_type, header.api_key, header.api_version, g) for g in share_ids]
        await _split(request, connection, entity, request_field=field, response_field="groups",
                     share_ids=share_ids, local_entries=constant(entries))

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

    async def start(self, request: Request, connection: ClientConnection) -> None:
        entity = _decode_request(request)
        ids = tuple(entity.groups_names)
        share_ids = [group_id for group_id in dict.fromkeys(ids) if self.admin.is_share_group(group_id)]
        if not share_ids:
            await connection.forward(request)
            return
        entry_type = item_type(response_type_for(DELETE_GROUPS, request.header.api_version), "results")

        async def deleted() -> tuple:
            # Run when the answer is due (concurrently when every id is a share group), so the
            # connection goes on reading requests while the tombstones are written.
            entries = []
            for group_id in share_ids:
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


def admin_routes(admin: GroupAdmin, broker_ids: Callable[[], Collection[int]]) -> dict[int, object]:
    """The routes for the group admin APIs (see the module doc)."""

    async def describe_offsets(entity, request: Request):
        version = request.header.api_version
        groups = []
        for group in entity.groups:
            topics = None if group.topics is None else [(t.topic_name, list(t.partitions)) for t in group.topics]
            groups.append(await admin.describe_offsets(group.group_id, topics, with_lag=version >= 1))
        return describe_offsets_response(version, groups)

    async def alter_offsets(entity, request: Request):
        topics = [(t.topic_name, [(p.partition_index, p.start_offset) for p in t.partitions])
                  for t in entity.topics]
        return alter_offsets_response(request.header.api_version, await admin.alter_offsets(entity.group_id, topics))

    async def delete_offsets(entity, request: Request):
        names = [t.topic_name for t in entity.topics]
        return delete_offsets_response(request.header.api_version, await admin.delete_offsets(entity.group_id, names))

    return {
        LIST_GROUPS: ListGroupsRoute(admin, broker_ids),
        DESCRIBE_GROUPS: DescribeRoute(admin),
        CONSUMER_GROUP_DESCRIBE: DescribeRoute(admin),
        DELETE_GROUPS: DeleteGroupsRoute(admin),
        DESCRIBE_SHARE_GROUP_OFFSETS: _local(describe_offsets),
        ALTER_SHARE_GROUP_OFFSETS: _local(alter_offsets),
        DELETE_SHARE_GROUP_OFFSETS: _local(delete_offsets),
    }


def register_admin_versions(table: ApiVersionTable) -> None:
    """Advertise the share-group offsets APIs whatever the upstream offers (the proxy serves them)."""
    for api_key in SERVED_APIS:
        low, high = DEFAULT_REGISTRY.supported_versions(api_key)
        table.register_local(api_key, VersionRange(low, high))


__all__ = ["admin_routes", "register_admin_versions", "lists_share_groups", "describe_offsets_response",
           "alter_offsets_response", "delete_offsets_response"]
