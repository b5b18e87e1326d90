"""Share-state operations between instances (issue 15, step 5; docs/scale-out.md section b).

With ``--instance-id`` a share group's coordinator and the leaders of its share-partitions may be
different instances. Kafka's group coordinator reaches the share coordinator that holds a
share-partition's state through three broker RPCs; the instances use the same three, each sent
to the instance that owns the share-partition's home state partition, on its bootstrap listener:

==============================  ===  ===================================================================
RPC                             key  what the coordinator uses it for
==============================  ===  ===================================================================
InitializeShareGroupState (v0)   83  AlterShareGroupOffsets: start the share-partition afresh at an offset
DeleteShareGroupState (v0)       86  DeleteShareGroupOffsets, DeleteGroups: tombstone its state
ReadShareGroupStateSummary (v1)  87  DescribeShareGroupOffsets: start offset, delivery-complete count
==============================  ===  ===================================================================

The owner answers each partition it does not lead ``NOT_COORDINATOR`` (the ownership moved; the
admin client retries). A share-partition with no state answers start offset -1, as Kafka's share
coordinator does. Calls have the proxy's own time-out; an unreachable owner gives
``COORDINATOR_NOT_AVAILABLE`` for its partitions (retriable), never a silent success. Connections
are kept for the next call (:class:`PeerConnections`): the config mirror and the membership watch
ask every coordinating instance every refresh.

A leader also keeps a copy of the configs of groups coordinated elsewhere
(:class:`GroupConfigMirror`: DescribeConfigs at the coordinator, before the group's first
share-partition is initialised here and every ``--share-config-refresh-ms``).

**Security.** An instance reaches another's listener as a client does (``proxy.security.peer_security``):
over TLS when the listeners serve it (the other's certificate verified against ``--peer-ssl-ca-location``,
host name checked), authenticated with the proxy's service credentials when clients authenticate
(the listener passes the exchange to a broker, as for any client). Under the cluster's ACLs the
three RPCs are served only to a proxy instance's principal -- one that may WRITE the state topic,
which no client may -- where Kafka asks CLUSTER_ACTION; anyone else is answered
``CLUSTER_AUTHORIZATION_FAILED``. The instance that received the client's request authorized
that client first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog
import trio
from kio.schema.delete_share_group_state.v0 import request as delete_request
from kio.schema.describe_configs.v4 import request as describe_configs_request
from kio.schema.delete_share_group_state.v0 import response as delete_response
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.initialize_share_group_state.v0 import request as initialize_request
from kio.schema.initialize_share_group_state.v0 import response as initialize_response
from kio.schema.read_share_group_state_summary.v1 import request as summary_request
from kio.schema.read_share_group_state_summary.v1 import response as summary_response
from kio.static.primitive import i8, i32, i64

from proxy.errors import UpstreamError
from proxy.share.metrics import PEER_CALLS, PEER_CONNECTIONS_OPENED
from proxy.share.ownership import InstanceIdentity

log = structlog.get_logger(__name__)

INITIALIZE_SHARE_GROUP_STATE = 83
DELETE_SHARE_GROUP_STATE = 86
READ_SHARE_GROUP_STATE_SUMMARY = 87
SHARE_GROUP_DESCRIBE = 77
PEER_APIS = (INITIALIZE_SHARE_GROUP_STATE, DELETE_SHARE_GROUP_STATE, READ_SHARE_GROUP_STATE_SUMMARY)
#: Client id prefix of the calls instances make to each other: answered where they arrive, never passed on.
PEER_CLIENT_ID_PREFIX = "kafka-share-proxy-peer-"


def is_peer_call(header) -> bool:
    """Whether a request (its header) is another instance's call (client id :data:`PEER_CLIENT_ID_PREFIX`)."""
    return (header.client_id or "").startswith(PEER_CLIENT_ID_PREFIX)


NO_STATE_START_OFFSET = -1

TopicPartition = tuple[uuid.UUID, int]
#: Opens a client to another instance's listener (host, port); its ``call`` sends one request.
Connect = Callable[[str, int], Awaitable[object]]
#: What a failed call to another instance raises (connection refused, broken, timed out).
PEER_CALL_ERRORS = (UpstreamError, OSError, trio.TooSlowError)


async def call_peer(connect: Connect, owner: InstanceIdentity, request, timeout_s: float,
                    response_type: type | None = None):
    """One request to another instance's bootstrap listener over a connection from `connect`
    (closed after the call; :class:`PeerConnections` makes that keep it), within `timeout_s`;
    raises PEER_CALL_ERRORS."""
    PEER_CALLS.inc()
    with trio.fail_after(timeout_s):
        client = await connect(owner.host, owner.bootstrap_port)
        try:
            return await (client.call(request) if response_type is None else client.call(request, response_type))
        finally:
            await client.aclose()


class PeerConnections:
    """Connections to other instances, kept open for the next call.

    The config mirror and the membership watch call every coordinating instance every
    ``--share-config-refresh-ms``; a fresh connection per call was a TCP handshake each time, and a
    TLS handshake and a SASL authentication at a broker too behind secured listeners.
    :meth:`connect` has the signature of a :data:`Connect`: the client it gives goes back to the
    idle connections when closed after a call that succeeded, and is really closed after a failed
    or cancelled one (its stream may be mid-frame). A kept connection the other side has closed
    meanwhile (it restarted, or its SASL session ended) fails its next call, which is then sent
    once more over a fresh connection.
    """

    def __init__(self, connect: Connect, idle_per_instance: int = 2) -> None:
        self._connect = connect
        self._idle_per_instance = idle_per_instance
        self._idle: dict[tuple[str, int], list] = {}
        self.opened = 0  # connections made: what reuse saves shows here (tests, debugging)

    async def connect(self, host: str, port: int) -> _KeptClient:
        idle = self._idle.get((host, port))
        while idle:
            client = idle.pop()
            if not client.session_expired():
                return _KeptClient(self, (host, port), client, reused=True)
            await _close_quietly(client)
        return _KeptClient(self, (host, port), await self._open(host, port), reused=False)

    async def _open(self, host: str, port: int):
        self.opened += 1
        PEER_CONNECTIONS_OPENED.inc()
        return await self._connect(host, port)

    async def _put_back(self, address: tuple[str, int], client) -> None:
        idle = self._idle.setdefault(address, [])
        if len(idle) < self._idle_per_instance:
            idle.append(client)
        else:
            await _close_quietly(client)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for clients in idle.values():
            for client in clients:
                await _close_quietly(client)


class _KeptClient:
    """A client lent by :class:`PeerConnections` for one call; ``aclose`` gives it back."""

    def __init__(self, pool: PeerConnections, address: tuple[str, int], client, *, reused: bool) -> None:
        self._pool, self._address, self._client, self._reused = pool, address, client, reused
        self._healthy = False

    async def call(self, request, *response_type):
        try:
            response = await self._client.call(request, *response_type)
        except UpstreamError:
            if not self._reused:
                raise
            # A kept connection the other side closed while it was idle: once more, afresh.
            await _close_quietly(self._client)
            self._client, self._reused = await self._pool._open(*self._address), False
            response = await self._client.call(request, *response_type)
        self._healthy = True
        return response

    async def aclose(self) -> None:
        if self._healthy:
            self._healthy = False
            await self._pool._put_back(self._address, self._client)
        else:
            await _close_quietly(self._client)


async def _close_quietly(client) -> None:
    with trio.CancelScope(shield=True), contextlib.suppress(*PEER_CALL_ERRORS, trio.BrokenResourceError):
        await client.aclose()


def by_coordinator(groups: Iterable[str], coordinator_of: Callable[[str], InstanceIdentity | None]
                   ) -> list[tuple[InstanceIdentity, list[str]]]:
    """The groups per instance coordinating them (sorted), leaving out those with none."""
    found: dict[int, tuple[InstanceIdentity, list[str]]] = {}
    for group_id in groups:
        owner = coordinator_of(group_id)
        if owner is not None:
            found.setdefault(owner.slot, (owner, []))[1].append(group_id)
    return [(owner, sorted(group_ids)) for owner, group_ids in found.values()]


@dataclass(frozen=True, slots=True)
class PeerFailure:
    """A share-partition the owner could not be asked about, or refused."""

    error: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class PeerSummary:
    start_offset: int  # -1: no state at the owner
    delivery_complete_count: int
    state_epoch: int


NOT_OWNED_MESSAGE = "This instance does not lead the share-partition; its ownership moved."


class PeerStateClient:
    """The coordinator's side: which share-partitions another instance leads, and the three calls.

    `owner_of(topic_id, partition)` is the identity of the instance owning the share-partition's
    home state partition (None while it has none); `connect(host, port)` opens a Kafka-protocol
    client (:class:`proxy.upstream.UpstreamClient` in production, a fake in unit tests)."""

    def __init__(self, self_slot: int, owner_of: Callable[[uuid.UUID, int], InstanceIdentity | None],
                 connect: Connect, *, timeout_s: float = 30.0) -> None:
        self.self_slot = self_slot
        self._owner_of = owner_of
        self._connect = connect
        self.timeout_s = timeout_s

    def is_remote(self, topic_id: uuid.UUID, partition: int) -> bool:
        """Whether the share-partition is not led here (another instance owns it, or nobody yet)."""
        owner = self._owner_of(topic_id, partition)
        return owner is None or owner.slot != self.self_slot

    def remote(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        return [tp for tp in partitions if self.is_remote(*tp)]

    async def summaries(self, group_id: str, partitions: Iterable[TopicPartition]
                        ) -> dict[TopicPartition, PeerSummary | PeerFailure]:
        def build(topics):
            return summary_request.ReadShareGroupStateSummaryRequest(group_id=group_id, topics=tuple(
                summary_request.ReadStateSummaryData(topic_id=topic_id, partitions=tuple(
                    summary_request.PartitionData(partition=i32(p), leader_epoch=i32(0)) for p in ps))
                for topic_id, ps in topics))

        def read(result, row):
            return PeerSummary(int(row.start_offset), max(int(row.delivery_complete_count), 0),
                               int(row.state_epoch))

        return await self._call_owners(partitions, build, read)

    async def delete(self, group_id: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, PeerFailure | None]:
        def build(topics):
            return delete_request.DeleteShareGroupStateRequest(group_id=group_id, topics=tuple(
                delete_request.DeleteStateData(topic_id=topic_id, partitions=tuple(
                    delete_request.PartitionData(partition=i32(p)) for p in ps))
                for topic_id, ps in topics))

        return await self._call_owners(partitions, build, lambda result, row: None)

    async def initialize(self, group_id: str, starts: Mapping[TopicPartition, int]
                         ) -> dict[TopicPartition, PeerFailure | None]:
        def build(topics):
            return initialize_request.InitializeShareGroupStateRequest(group_id=group_id, topics=tuple(
                initialize_request.InitializeStateData(topic_id=topic_id, partitions=tuple(
                    initialize_request.PartitionData(partition=i32(p), state_epoch=i32(0),
                                                     start_offset=i64(starts[(topic_id, p)])) for p in ps))
                for topic_id, ps in topics))

        return await self._call_owners(starts.keys(), build, lambda result, row: None)

    async def _call_owners(self, partitions: Iterable[TopicPartition], build, read) -> dict:
        """One call per owning instance (concurrently), each carrying all of its partitions."""
        results, by_owner = _by_owner(partitions, self._owner_of)

        async def one(owner: InstanceIdentity, topics: dict[uuid.UUID, list[int]]) -> None:
            asked = [(t, p) for t, ps in topics.items() for p in ps]
            try:
                request = build(sorted((t, sorted(ps)) for t, ps in topics.items()))
                response = await call_peer(self._connect, owner, request, self.timeout_s)
            except PEER_CALL_ERRORS as exc:
                log.warning("peer share-state call failed", instance=owner.instance_id, host=owner.host,
                            port=owner.bootstrap_port, error=str(exc) or type(exc).__name__)
                for tp in asked:
                    results[tp] = PeerFailure(ErrorCode.coordinator_not_available,
                                              f"Instance {owner.instance_id} leading the share-partition did "
                                              f"not answer: {str(exc) or type(exc).__name__}")
                return
            answered = set()
            for result in response.results:
                for row in result.partitions:
                    tp = (result.topic_id, int(row.partition))
                    answered.add(tp)
                    if row.error_code is not ErrorCode.none:
                        results[tp] = PeerFailure(row.error_code, row.error_message or row.error_code.name)
                    else:
                        results[tp] = read(result, row)
            for tp in asked:
                if tp not in answered:
                    results[tp] = PeerFailure(ErrorCode.unknown_server_error,
                                              f"Instance {owner.instance_id} did not answer for the share-partition.")

        async with trio.open_nursery() as nursery:
            for owner, topics in by_owner.values():
                nursery.start_soon(one, owner, topics)
        return results


# ----- the owner's side ---------------------------------------------------------------------


class PeerStateServer:
    """The owner's answers to the three RPCs, from its share service (the routes wrap these).

    `leads(topic_id, partition)` says whether this instance leads the share-partition; `summary`,
    `delete` and `initialize` act on one the instance leads (the GroupAdmin's local operations)."""

    def __init__(self, leads: Callable[[uuid.UUID, int], bool],
                 summary: Callable[[str, uuid.UUID, int], tuple[int, int, int] | None],
                 delete: Callable[[str, list[TopicPartition]], Awaitable[PeerFailure | None]],
                 initialize: Callable[[str, dict[TopicPartition, int]], Awaitable[PeerFailure | None]]) -> None:
        self._leads = leads
        self._summary = summary
        self._delete = delete
        self._initialize = initialize

    def read_summary(self, request) -> object:
        results = []
        for topic in request.topics:
            rows = []
            for data in topic.partitions:
                partition = int(data.partition)
                if not self._leads(topic.topic_id, partition):
                    rows.append(summary_response.PartitionResult(
                        partition=i32(partition), error_code=ErrorCode.not_coordinator, error_message=NOT_OWNED_MESSAGE,
                        state_epoch=i32(0), leader_epoch=i32(0), start_offset=i64(NO_STATE_START_OFFSET)))
                    continue
                found = self._summary(request.group_id, topic.topic_id, partition)
                start, complete, state_epoch = found if found is not None else (NO_STATE_START_OFFSET, 0, 0)
                rows.append(summary_response.PartitionResult(
                    partition=i32(partition), error_code=ErrorCode.none, state_epoch=i32(state_epoch),
                    leader_epoch=i32(0), start_offset=i64(start), delivery_complete_count=i32(complete)))
            results.append(summary_response.ReadStateSummaryResult(topic_id=topic.topic_id, partitions=tuple(rows)))
        return summary_response.ReadShareGroupStateSummaryResponse(results=tuple(results))

    async def delete_state(self, request) -> object:
        partitions = [(topic.topic_id, int(d.partition)) for topic in request.topics for d in topic.partitions]
        outcome = await self._act(partitions, lambda led: self._delete(request.group_id, led))
        return delete_response.DeleteShareGroupStateResponse(results=tuple(
            delete_response.DeleteStateResult(topic_id=topic_id, partitions=tuple(
                delete_response.PartitionResult(partition=i32(p), error_code=error, error_message=message)
                for p, error, message in rows))
            for topic_id, rows in _by_topic(partitions, outcome)))

    async def initialize_state(self, request) -> object:
        starts = {(topic.topic_id, int(d.partition)): int(d.start_offset)
                  for topic in request.topics for d in topic.partitions}
        outcome = await self._act(list(starts), lambda led: self._initialize(
            request.group_id, {tp: starts[tp] for tp in led}))
        return initialize_response.InitializeShareGroupStateResponse(results=tuple(
            initialize_response.InitializeStateResult(topic_id=topic_id, partitions=tuple(
                initialize_response.PartitionResult(partition=i32(p), error_code=error, error_message=message)
                for p, error, message in rows))
            for topic_id, rows in _by_topic(list(starts), outcome)))

    def refuse(self, api_key: int, request, error: ErrorCode, message: str) -> object:
        """The answer to any of the three RPCs with every partition refused (e.g. not authorized)."""
        if api_key == READ_SHARE_GROUP_STATE_SUMMARY:
            return summary_response.ReadShareGroupStateSummaryResponse(results=tuple(
                summary_response.ReadStateSummaryResult(topic_id=topic.topic_id, partitions=tuple(
                    summary_response.PartitionResult(
                        partition=d.partition, error_code=error, error_message=message, state_epoch=i32(0),
                        leader_epoch=i32(0), start_offset=i64(NO_STATE_START_OFFSET))
                    for d in topic.partitions)) for topic in request.topics))
        module = delete_response if api_key == DELETE_SHARE_GROUP_STATE else initialize_response
        response, result = ((module.DeleteShareGroupStateResponse, module.DeleteStateResult)
                            if api_key == DELETE_SHARE_GROUP_STATE
                            else (module.InitializeShareGroupStateResponse, module.InitializeStateResult))
        return response(results=tuple(
            result(topic_id=topic.topic_id, partitions=tuple(
                module.PartitionResult(partition=d.partition, error_code=error, error_message=message)
                for d in topic.partitions)) for topic in request.topics))

    async def _act(self, partitions: list[TopicPartition], act) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        led = [tp for tp in partitions if self._leads(*tp)]
        outcome = {tp: (ErrorCode.not_coordinator, NOT_OWNED_MESSAGE) for tp in partitions if tp not in led}
        failure = await act(led) if led else None
        for tp in led:
            outcome[tp] = (ErrorCode.none, None) if failure is None else (failure.error, failure.message)
        return outcome


# ----- group configs at leaders -------------------------------------------------------------

GROUP_RESOURCE_TYPE = 32  # ConfigResource.Type.GROUP
GROUP_CONFIG_SOURCE = 8  # DescribeConfigsResponse.ConfigSource.GROUP_CONFIG: set on the group


class GroupConfigMirror:
    """A leader's copy of the configs of groups another instance coordinates (docs/scale-out.md b).

    Group configs are set at a group's coordinator (IncrementalAlterConfigs reaches it through
    FindCoordinator's routing); an instance leading share-partitions of that group reads them from
    the coordinator with DescribeConfigs -- before it first initialises one of the group's
    share-partitions (``share.auto.offset.reset``), then every `interval_s` -- and applies the
    group's overrides to its own coordinator's config table, in memory only (the coordinator's
    state-topic record stays the one truth; this instance replays it if it becomes the coordinator).
    Engines take a change at their next acquisition, as with a local change. A coordinator that
    cannot be asked leaves the copy as it was.

    `groups()` is the groups with share-partitions led here and coordinated elsewhere;
    `coordinator_of(group)` the identity of the instance coordinating it (None while none does);
    `apply(group, overrides)` replaces the group's overrides (raises on an invalid set)."""

    def __init__(self, groups: Callable[[], Iterable[str]], coordinator_of: Callable[[str], InstanceIdentity | None],
                 connect: Connect, apply: Callable[[str, dict[str, str]], None],
                 current: Callable[[str], Mapping[str, object]], *, interval_s: float = 2.0,
                 timeout_s: float = 5.0) -> None:
        self._groups = groups
        self._coordinator_of = coordinator_of
        self._connect = connect
        self._apply = apply
        self._current = current
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.mirrored: set[str] = set()  # groups read at least once

    async def before_first_load(self, group_id: str) -> None:
        """Read a group's configs before its first share-partition here is initialised."""
        if group_id not in self.mirrored:
            await self.refresh([group_id])

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.refresh(self._groups())
            except Exception as exc:  # noqa: BLE001 - a malformed answer must not stop the refresh
                log.warning("group config refresh failed", error=repr(exc))

    async def refresh(self, groups: Iterable[str]) -> None:
        async with trio.open_nursery() as nursery:
            for owner, group_ids in by_coordinator(groups, self._coordinator_of):
                nursery.start_soon(self._refresh_from, owner, group_ids)

    async def _refresh_from(self, owner: InstanceIdentity, group_ids: list[str]) -> None:
        request = describe_configs_request.DescribeConfigsRequest(resources=tuple(
            describe_configs_request.DescribeConfigsResource(resource_type=i8(GROUP_RESOURCE_TYPE), resource_name=g,
                                                             configuration_keys=None)
            for g in group_ids))
        try:
            response = await call_peer(self._connect, owner, request, self.timeout_s)
        except PEER_CALL_ERRORS as exc:
            log.warning("group configs not readable from their coordinator; keeping the last copy",
                        instance=owner.instance_id, groups=group_ids, error=str(exc) or type(exc).__name__)
            return
        for result in response.results:
            if result.error_code is not ErrorCode.none:
                continue  # e.g. the coordinator moved: asked again at the next refresh
            overrides = {c.name: c.value for c in result.configs
                         if int(c.config_source) == GROUP_CONFIG_SOURCE and c.value is not None}
            self.mirrored.add(result.resource_name)
            current = {k: str(v) for k, v in self._current(result.resource_name).items()}
            if overrides == current:
                continue
            try:
                self._apply(result.resource_name, overrides)
            except Exception as exc:  # noqa: BLE001 - an override set this instance's bounds refuse
                log.warning("group configs from the coordinator refused here", group=result.resource_name,
                            overrides=overrides, error=str(exc))
                continue
            log.info("group configs taken from the coordinator", group=result.resource_name,
                     instance=owner.instance_id, overrides=overrides)


# ----- members that left, learnt by leaders from the coordinator -----------------------------


class MembershipWatch:
    """Leaders learn from a group's coordinator which members left (the member notice of
    docs/scale-out.md section c, pulled rather than pushed).

    A leader on the coordinator's own instance releases a departed member's records at once (the
    coordinator's MemberDeparted event). A leader elsewhere learns of a member killed outright from
    its closed connections, and of one that hangs with them open only from its locks. So every
    `interval_s` it asks each coordinating instance ShareGroupDescribe (a public API) for the groups
    with records held here, and calls `release(group, member)` for each member that held records
    here *before the call* and is not among the group's members in the answer -- as the
    coordinator's own leaders do (ACQUIRED at once, IN_PROGRESS after the rebalance grace). Members
    that appear after the call was sent are never judged by it; a group the coordinator no longer
    knows (GROUP_ID_NOT_FOUND) has no members; any other error skips the group until the next round.

    `holders()` maps each group coordinated elsewhere to the members holding records here;
    `coordinator_of(group)` is the instance coordinating it (None: none now, or this one)."""

    def __init__(self, holders: Callable[[], Mapping[str, set[str]]],
                 coordinator_of: Callable[[str], InstanceIdentity | None],
                 connect: Connect, release: Callable[[str, str], None], *,
                 interval_s: float = 2.0, timeout_s: float = 5.0) -> None:
        self._holders = holders
        self._coordinator_of = coordinator_of
        self._connect = connect
        self._release = release
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 - a malformed answer must not stop the watch
                log.warning("membership check failed", error=repr(exc))

    async def check(self) -> None:
        held = {group: set(members) for group, members in self._holders().items() if members}
        async with trio.open_nursery() as nursery:
            for owner, group_ids in by_coordinator(held, self._coordinator_of):
                nursery.start_soon(self._check_at, owner, group_ids, held)

    async def _check_at(self, owner: InstanceIdentity, group_ids: list[str], held: Mapping[str, set[str]]) -> None:
        request = load_request_schema(SHARE_GROUP_DESCRIBE, 1)(group_ids=tuple(group_ids),
                                                               include_authorized_operations=False)
        try:
            response = await call_peer(self._connect, owner, request, self.timeout_s)
        except PEER_CALL_ERRORS as exc:
            log.warning("membership not readable from the coordinating instance", instance=owner.instance_id,
                        groups=group_ids, error=str(exc) or type(exc).__name__)
            return
        for group in response.groups:
            if group.group_id not in held:
                continue
            if group.error_code is ErrorCode.group_id_not_found:
                live: set[str] = set()
            elif group.error_code is ErrorCode.none:
                live = {m.member_id for m in group.members}
            else:
                continue  # e.g. the coordinator moved: asked again next round
            for member_id in sorted(held[group.group_id] - live):
                log.info("member left the group at its coordinator; its records here released",
                         group=group.group_id, member=member_id, instance=owner.instance_id)
                self._release(group.group_id, member_id)


# ----- group configs asked at an instance that does not coordinate the group ----------------


class GroupConfigForwarder:
    """DescribeConfigs / (Incremental)AlterConfigs of GROUP resources, and ListConfigResources,
    at any instance.

    Kafka's Admin sends these to any node (the least loaded), not to the group's coordinator, and
    a group's configs live with its coordinator (its state-topic record). So an instance passes the
    GROUP resources of groups another instance coordinates to that instance, one call per
    coordinator with the client's own request narrowed to them (same version and flags), and puts
    the answers where the resources were; a listing of config resources adds the groups every
    other live instance holds configs for. Calls from instances (client id
    :data:`PEER_CLIENT_ID_PREFIX`) are answered where they arrive, so the calls cannot loop. A
    group with no coordinator now (a hand-over), or an unreachable one, is answered
    ``COORDINATOR_NOT_AVAILABLE`` for that resource.

    `coordinator_of(group)` is the live instance coordinating the group (None while none does);
    `others()` every other live instance."""

    def __init__(self, self_slot: int, coordinator_of: Callable[[str], InstanceIdentity | None],
                 others: Callable[[], Iterable[InstanceIdentity]], connect: Connect,
                 *, timeout_s: float = 30.0) -> None:
        self.self_slot = self_slot
        self._coordinator_of = coordinator_of
        self._others = others
        self._connect = connect
        self.timeout_s = timeout_s

    def elsewhere(self, group_id: str) -> bool:
        """Whether the group's configs are not this instance's to answer (another coordinates it, or none does)."""
        owner = self._coordinator_of(group_id)
        return owner is None or owner.slot != self.self_slot

    async def forward(self, request, resources: list, response_field: str,
                      failed: Callable[[object, ErrorCode, str], object]) -> list:
        """The coordinators' results for `resources` (GROUP resources of `request`), in their order;
        `failed(resource, code, message)` builds the result of one that could not be asked."""
        results: list = [None] * len(resources)
        by_owner: dict[int, tuple[InstanceIdentity, list[int]]] = {}
        for i, resource in enumerate(resources):
            owner = self._coordinator_of(resource.resource_name)
            if owner is None or owner.slot == self.self_slot:
                results[i] = failed(resource, ErrorCode.coordinator_not_available,
                                    "No instance coordinates the group now (a hand-over); retry.")
            else:
                by_owner.setdefault(owner.slot, (owner, []))[1].append(i)

        async def one(owner: InstanceIdentity, indexes: list[int]) -> None:
            narrowed = dataclasses.replace(request, resources=tuple(resources[i] for i in indexes))
            try:
                answer = await self._call(owner, narrowed)
                answered = {(int(r.resource_type), r.resource_name): r for r in getattr(answer, response_field)}
            except PEER_CALL_ERRORS as exc:
                log.warning("group configs: the coordinating instance cannot be asked", instance=owner.instance_id,
                            error=str(exc) or type(exc).__name__)
                answered = {}
            for i in indexes:
                resource = resources[i]
                found = answered.get((int(resource.resource_type), resource.resource_name))
                results[i] = found if found is not None else failed(
                    resource, ErrorCode.coordinator_not_available,
                    f"The group's coordinating instance {owner.instance_id} did not answer; retry.")

        async with trio.open_nursery() as nursery:
            for owner, indexes in by_owner.values():
                nursery.start_soon(one, owner, indexes)
        return results

    async def groups_configured_elsewhere(self, request, response_field: str = "config_resources") -> set[str]:
        """The GROUP resources every other live instance lists for `request` (a ListConfigResources);
        an instance that cannot be asked is left out (logged): a listing is best effort."""
        found: set[str] = set()

        async def one(owner: InstanceIdentity) -> None:
            try:
                answer = await self._call(owner, request)
            except PEER_CALL_ERRORS as exc:
                log.warning("config resources: an instance cannot be asked; its groups are not listed",
                            instance=owner.instance_id, error=str(exc) or type(exc).__name__)
                return
            if answer.error_code is ErrorCode.none:
                found.update(r.resource_name for r in getattr(answer, response_field)
                             if int(r.resource_type) == GROUP_RESOURCE_TYPE)

        async with trio.open_nursery() as nursery:
            for owner in self._others():
                if owner.slot != self.self_slot:
                    nursery.start_soon(one, owner)
        return found

    async def _call(self, owner: InstanceIdentity, request):
        return await call_peer(self._connect, owner, request, self.timeout_s)


# ----- the in-flight describe across instances ----------------------------------------------


class InFlightFanOut:
    """DescribeShareGroupInFlight (the extension RPC) across instances.

    The coordinator knows the group's share-partitions; each instance knows the in-flight records
    of those it leads. So the instance asked for a whole group it does not coordinate passes the
    request to the coordinator (:meth:`from_coordinator`), and the coordinator asks each leading
    instance for the share-partitions it leads, naming them (:meth:`from_leaders`); an instance
    asked for named share-partitions of a group it does not coordinate answers those it leads
    (the route's leader mode), so the calls cannot loop. `api` is the extension's message classes
    (the same key on every instance)."""

    def __init__(self, api, coordinator_of: Callable[[str], InstanceIdentity | None],
                 leader_of: Callable[[uuid.UUID, int], InstanceIdentity | None],
                 connect: Connect, *, timeout_s: float = 30.0) -> None:
        self.api = api
        self._coordinator_of = coordinator_of
        self._leader_of = leader_of
        self._connect = connect
        self.timeout_s = timeout_s

    async def _call(self, owner: InstanceIdentity, request, version: int):
        return await call_peer(self._connect, owner, request, self.timeout_s, self.api.responses[version])

    async def from_coordinator(self, request, version: int) -> object | PeerFailure:
        """The coordinating instance's whole answer, or why it could not be had."""
        owner = self._coordinator_of(request.group_id)
        if owner is None:
            return PeerFailure(ErrorCode.coordinator_not_available, "No instance coordinates the group yet.")
        try:
            return await self._call(owner, request, version)
        except PEER_CALL_ERRORS as exc:
            return PeerFailure(ErrorCode.coordinator_not_available,
                               f"Instance {owner.instance_id} coordinating the group did not answer: "
                               f"{str(exc) or type(exc).__name__}")

    async def from_leaders(self, request, version: int, partitions: Iterable[TopicPartition]) -> dict:
        """(topic id, partition) -> the leading instance's InFlightPartition entry, or a PeerFailure."""
        results, by_owner = _by_owner(partitions, self._leader_of)
        topic_type = self.api.requests[version].DescribeTopic

        async def one(owner: InstanceIdentity, topics: dict[uuid.UUID, list[int]]) -> None:
            asked = dataclasses.replace(request, topics=tuple(
                topic_type(topic_id=t, partitions=tuple(sorted(ps))) for t, ps in sorted(topics.items(), key=str)))
            try:
                response = await self._call(owner, asked, version)
            except PEER_CALL_ERRORS as exc:
                failure = PeerFailure(ErrorCode.coordinator_not_available,
                                      f"Instance {owner.instance_id} leading the share-partition did not answer: "
                                      f"{str(exc) or type(exc).__name__}")
                results.update({(t, p): failure for t, ps in topics.items() for p in ps})
                return
            error = ErrorCode(int(response.error_code))  # the extension's classes carry plain ints
            if error is not ErrorCode.none:
                failure = PeerFailure(error, response.error_message or error.name)
                results.update({(t, p): failure for t, ps in topics.items() for p in ps})
                return
            for topic in response.topics:
                for entry in topic.partitions:
                    results[(topic.topic_id, int(entry.partition_index))] = entry

        async with trio.open_nursery() as nursery:
            for owner, topics in by_owner.values():
                nursery.start_soon(one, owner, topics)
        return results


def _by_owner(partitions: Iterable[TopicPartition], owner_of: Callable[[uuid.UUID, int], InstanceIdentity | None]
              ) -> tuple[dict, dict]:
    """(failures by share-partition, {slot: (owner, {topic id: [partitions]})}): the partitions to
    ask each owning instance about, and those with no owner to ask."""
    failures: dict = {}
    by_owner: dict[int, tuple[InstanceIdentity, dict[uuid.UUID, list[int]]]] = {}
    for topic_id, partition in partitions:
        owner = owner_of(topic_id, partition)
        if owner is None:
            failures[(topic_id, partition)] = PeerFailure(
                ErrorCode.coordinator_not_available, "No instance leads the share-partition yet (a hand-over).")
        else:
            by_owner.setdefault(owner.slot, (owner, {}))[1].setdefault(topic_id, []).append(partition)
    return failures, by_owner


def _by_topic(partitions: list[TopicPartition], outcome: Mapping[TopicPartition, tuple[ErrorCode, str | None]]):
    topics: dict[uuid.UUID, list[tuple[int, ErrorCode, str | None]]] = {}
    for topic_id, partition in partitions:
        topics.setdefault(topic_id, []).append((partition, *outcome[(topic_id, partition)]))
    return list(topics.items())


__all__ = ["PeerStateClient", "PeerStateServer", "GroupConfigMirror", "GroupConfigForwarder", "InFlightFanOut",
           "MembershipWatch", "PeerConnections", "Connect", "call_peer",
           "PEER_CLIENT_ID_PREFIX", "is_peer_call", "PeerSummary", "PeerFailure", "PEER_APIS",
           "INITIALIZE_SHARE_GROUP_STATE", "DELETE_SHARE_GROUP_STATE", "READ_SHARE_GROUP_STATE_SUMMARY"]
