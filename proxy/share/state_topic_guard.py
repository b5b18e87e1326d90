"""The state topic belongs to the proxy: clients may read it, but not write, delete or reconfigure it.

Share state lives on an ordinary compacted topic (``--state-topic``), so nothing in Kafka stops a
client from producing to it, deleting its records or the topic, adding partitions (which would
move keys to other partitions: replay would then fold records out of order), or changing its
cleanup policy. Kafka protects its own internal topics from clients; the proxy does the same for
its state topic, on these requests only, answering each refused topic (or partition) in the API's
own response shape with TOPIC_AUTHORIZATION_FAILED:

==========================  ===  ============================================================
API                         key  refused when
==========================  ===  ============================================================
Produce                       0  a TopicData entry names the state topic (or its id, v13+)
DeleteTopics                 20  the state topic is named (or its id, v6)
DeleteRecords                21  the state topic is named
AlterConfigs                 33  a TOPIC resource is the state topic
CreatePartitions             37  the state topic is named
IncrementalAlterConfigs      44  a TOPIC resource is the state topic
==========================  ===  ============================================================

Other topics of the same request are not affected. A request that does not name the state topic
goes to the route that was registered before the guard (normally: forwarded byte for byte). One
that names only the state topic is answered by the proxy. A mixed one is split: the other topics
are forwarded upstream (Produce: the request bytes with the state topic's entries cut out; the
admin APIs: re-encoded without them, through the wrapped route, which may answer part of them
itself -- proxy.route_split.AnswerView) and the refusals are added to the answer.

Produce is the hot path: it is never decoded. ``codec.produce.names_any`` reads only the fields
in front of the topic names and skips each partition's records by their length (a single-topic
request costs a microsecond or two); only when the state topic is named is the layout walked
again and a response built. A large Produce still arriving (``--stream-requests-from``) is decided
on its first bytes when they name a single topic that is not the state topic, and passed on as it
arrives (spliced); any other is gathered whole first. Produce with acks=0 gets no response: as Kafka does when an acks=0
Produce fails, the other topics are still forwarded and then the connection is closed, in order,
so the client notices and refreshes its metadata.

Kafka itself answers a write to one of *its* internal topics with INVALID_TOPIC_EXCEPTION; the
proxy uses TOPIC_AUTHORIZATION_FAILED, what an ACL denial gives, which every client treats as
final for that topic (it is not retried). Reads (Fetch, ListOffsets, DescribeConfigs, ...) pass.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from codec.produce import FIRST_TOPIC_ID_VERSION, names_any, names_any_in_head, produce_layout
from codec.registry import decode_entity, encode
from proxy.connection import FORWARD, ClientConnection, Request, Route, start_streamed
from proxy.route_split import AnswerView, MergeEntries, build, constant, item_type, local_response
from proxy.share import metrics
from proxy.upstream import StreamedFrame

log = structlog.get_logger(__name__)

PRODUCE = 0
DELETE_TOPICS = 20
DELETE_RECORDS = 21
ALTER_CONFIGS = 33
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44
GUARDED_APIS = (PRODUCE, DELETE_TOPICS, DELETE_RECORDS, ALTER_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS)

TOPIC_RESOURCE = 2  # ConfigResource.Type.TOPIC
REFUSAL = ErrorCode.topic_authorization_failed  # 29


@dataclasses.dataclass(frozen=True, slots=True)
class StateTopics:
    """The topics the guard protects: names, and their ids as far as the cluster metadata knows them.

    `ids` is called only for requests that can name a topic by id (Produce v13+, DeleteTopics v6).
    """

    names: frozenset[str]
    ids: Callable[[], Mapping[uuid.UUID, str]] = dict
    encoded_names: frozenset[bytes] = dataclasses.field(init=False)  # as Produce spells them

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoded_names", frozenset(name.encode() for name in self.names))

    def message(self, name: str) -> str:
        return f"Topic {name} holds the share proxy's state; clients may read it but not change it."


def _refused(connection: ClientConnection, request: Request, topics: Iterable[str], *, forwarded: bool) -> None:
    header = request.header
    metrics.STATE_TOPIC_REFUSALS.labels(api_key=str(header.api_key)).inc()
    connection.log.warning(
        "state topic change refused", api_key=header.api_key, api_version=header.api_version,
        client_id=header.client_id, topics=sorted(set(topics)), other_topics_forwarded=forwarded,
    )


# ----- Produce -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ProduceGuard:
    """Route for Produce: refuse the state topic's partitions, forward everything else untouched."""

    topics: StateTopics
    inner: Route = FORWARD

    async def start(self, request: Request, connection: ClientConnection) -> None:
        version = request.header.api_version
        by_id = version >= FIRST_TOPIC_ID_VERSION
        keys: frozenset[bytes] | set[bytes] = self.topics.encoded_names
        ids: Mapping[uuid.UUID, str] = {}
        if by_id:  # not forwarded today (ApiVersions caps Produce at v9); ready when the cap goes
            ids = self.topics.ids()
            keys = {topic_id.bytes for topic_id in ids}
        if not names_any(request.frame, request.body_offset, version, keys):
            await self.inner.start(request, connection)
            return
        layout = produce_layout(request.frame, request.body_offset, version)
        refused = {i for i, topic in enumerate(layout.topics) if topic.key in keys}
        # Topic key -> partitions refused (a topic may be listed twice).
        partitions: dict[bytes, list[int]] = {}
        for i in sorted(refused):
            partitions.setdefault(layout.topics[i].key, []).extend(layout.topics[i].partitions)
        names = {key: ids[uuid.UUID(bytes=key)] if by_id else key.decode() for key in partitions}
        forwarded = len(refused) < len(layout.topics)
        _refused(connection, request, names.values(), forwarded=forwarded)
        if layout.acks == 0:
            if forwarded:
                await connection.forward(dataclasses.replace(request, frame=layout.without(request.frame, refused)))
            await connection.close_in_order(request, f"Produce (acks=0) to state topic {sorted(names.values())}")
            return
        entries = self._refusals(version, partitions, names)
        if not forwarded:
            await connection.respond(request, local_response(request, "responses", entries))
            return
        trimmed = dataclasses.replace(request, frame=layout.without(request.frame, refused))
        await connection.forward(trimmed, MergeEntries("responses", constant(entries)))

    async def start_streamed(self, request: Request, rest: StreamedFrame, connection: ClientConnection) -> bool:
        """A large Produce still arriving passes on as it arrives once its first bytes show it names
        one topic and that is not the state topic; anything else is gathered and goes to `start`."""
        version = request.header.api_version
        if version >= FIRST_TOPIC_ID_VERSION:  # ids are looked up per request: decided on the whole one
            return False
        if names_any_in_head(request.frame, request.body_offset, version, self.topics.encoded_names) is not False:
            return False
        return await start_streamed(self.inner, request, rest, connection)

    def _refusals(self, version: int, partitions: Mapping[bytes, list[int]], names: Mapping[bytes, str]) -> tuple:
        response_type = load_response_schema(PRODUCE, version)
        topic_type = item_type(response_type, "responses")
        partition_type = item_type(topic_type, "partition_responses")
        by_id = version >= FIRST_TOPIC_ID_VERSION
        return tuple(
            build(
                topic_type,
                name=names[key],
                topic_id=uuid.UUID(bytes=key) if by_id else None,
                partition_responses=tuple(
                    build(partition_type, index=index, error_code=REFUSAL, base_offset=-1, log_start_offset=-1,
                           record_errors=(), error_message=self.topics.message(names[key]))
                    for index in indexes
                ),
            )
            for key, indexes in partitions.items()
        )


# ----- admin APIs: decoded (rare, small) -------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _AdminApi:
    """Where an admin request lists its topics, and how one refusal looks in its response."""

    request_field: str  # "topics" / "topic_names" / "resources"
    response_field: str
    # (state topics, request entry, state topic ids -> names) -> the state topic the entry names, or None
    names: Callable[[StateTopics, Any, Mapping[uuid.UUID, str]], str | None]
    # (response entry type, entry, state topic name, message) -> the refusal entry
    refusal: Callable[[type, Any, str, str], object]


def _by_name(topics: StateTopics, entry: Any, ids: Mapping[uuid.UUID, str]) -> str | None:
    return entry.name if entry.name in topics.names else None


def _delete_topics_target(topics: StateTopics, entry: Any, ids: Mapping[uuid.UUID, str]) -> str | None:
    if isinstance(entry, str):  # v1-v5: a list of names
        return entry if entry in topics.names else None
    if entry.name is not None:
        return entry.name if entry.name in topics.names else None
    return ids.get(entry.topic_id)


def _topic_resource(topics: StateTopics, entry: Any, ids: Mapping[uuid.UUID, str]) -> str | None:
    if int(entry.resource_type) == TOPIC_RESOURCE and entry.resource_name in topics.names:
        return entry.resource_name
    return None


def _delete_topics_refusal(entry_type: type, entry: Any, name: str, message: str) -> object:
    topic_id = None if isinstance(entry, str) else entry.topic_id
    return build(entry_type, name=name, topic_id=topic_id, error_code=REFUSAL, error_message=message)


_ADMIN_APIS: dict[int, _AdminApi] = {
    DELETE_RECORDS: _AdminApi(
        "topics", "topics", _by_name,
        lambda entry_type, entry, name, message: build(
            entry_type, name=name,
            partitions=tuple(
                build(item_type(entry_type, "partitions"), partition_index=p.partition_index, low_watermark=-1,
                       error_code=REFUSAL)
                for p in entry.partitions
            ),
        ),
    ),
    DELETE_TOPICS: _AdminApi("topic_names", "responses", _delete_topics_target, _delete_topics_refusal),
    CREATE_PARTITIONS: _AdminApi(
        "topics", "results", _by_name,
        lambda entry_type, entry, name, message: build(entry_type, name=name, error_code=REFUSAL,
                                                        error_message=message),
    ),
    ALTER_CONFIGS: _AdminApi(
        "resources", "responses", _topic_resource,
        lambda entry_type, entry, name, message: build(entry_type, error_code=REFUSAL, error_message=message,
                                                        resource_type=entry.resource_type, resource_name=name),
    ),
}
_ADMIN_APIS[INCREMENTAL_ALTER_CONFIGS] = _ADMIN_APIS[ALTER_CONFIGS]


@dataclasses.dataclass(frozen=True, slots=True)
class AdminGuard:
    """Route for DeleteTopics, DeleteRecords, CreatePartitions, (Incremental)AlterConfigs."""

    topics: StateTopics
    inner: Route = FORWARD

    async def start(self, request: Request, connection: ClientConnection) -> None:
        header = request.header
        api = _ADMIN_APIS[header.api_key]
        request_type = load_request_schema(header.api_key, header.api_version)
        entity = decode_entity(request_type, memoryview(request.frame)[request.body_offset:])
        field = api.request_field
        if header.api_key == DELETE_TOPICS and header.api_version >= 6:
            field = "topics"
        entries = getattr(entity, field) or ()
        needs_ids = header.api_key == DELETE_TOPICS and any(
            not isinstance(e, str) and e.name is None for e in entries)
        ids = self.topics.ids() if needs_ids else {}
        targets = [api.names(self.topics, entry, ids) for entry in entries]
        if all(target is None for target in targets):
            await self.inner.start(request, connection)
            return
        response_type = load_response_schema(header.api_key, header.api_version)
        entry_type = item_type(response_type, api.response_field)
        refusals = tuple(
            api.refusal(entry_type, entry, target, self.topics.message(target))
            for entry, target in zip(entries, targets)
            if target is not None
        )
        kept = tuple(entry for entry, target in zip(entries, targets) if target is None)
        _refused(connection, request, [t for t in targets if t is not None], forwarded=bool(kept))
        if not kept:
            await connection.respond(request, local_response(request, api.response_field, refusals))
            return
        body = encode(dataclasses.replace(entity, **{field: kept}))
        trimmed = dataclasses.replace(request, frame=bytes(request.frame[: request.body_offset]) + body)
        # The rest goes through the route the guard wraps (it may answer part of it itself, e.g.
        # share-group configs); the refusals are added to whatever it answers.
        await self.inner.start(trimmed, AnswerView(connection, MergeEntries(api.response_field, constant(refusals))))


def state_topic_routes(topics: StateTopics, routes: Mapping[int, Route]) -> dict[int, Route]:
    """Guard routes for every API that can change a topic, each wrapping the route it replaces."""
    guarded: dict[int, Route] = {PRODUCE: ProduceGuard(topics, routes.get(PRODUCE, FORWARD))}
    for api_key in _ADMIN_APIS:
        guarded[api_key] = AdminGuard(topics, routes.get(api_key, FORWARD))
    return guarded
