"""Share operations refused by the cluster's ACLs change nothing: the whole chain in memory.

A real ClientConnection carries the client's requests to the share routes (served by a real
ShareService on a fake cluster, as in test_manager.py); the routes' authorization probes go out
on the connection's upstream stream to a fake broker that answers them as a broker with ACLs
would (tests/proxy/share/test_authorization.py's FakeCluster). Each test checks the answer's
codes *and* that the refused request left the share state as it was.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid

import pytest
import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from codec import extensions
from codec.headers import (
    RequestHeader,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    response_header_version,
)
from codec.registry import DEFAULT_REGISTRY, decode_entity, encode
from proxy.apiversions import ApiVersionTable
from proxy.connection import ClientConnection
from codec import share_state
from proxy.share import metrics
from proxy.apiversions import VersionRange
from proxy.share.admin_routes import admin_routes, peer_routes, register_admin_versions
from proxy.share.authorization import GROUP_OPERATIONS, AuthorizationPolicy, Operation, bits
from proxy.share.group_admin import GroupAdmin
from proxy.share.group_configs import GroupConfigs, group_config_routes
from proxy.share.in_flight import in_flight_routes, in_flight_version_range
from proxy.share.peers import PEER_APIS, PeerStateServer
from proxy.share.progress import progress_routes, progress_version_range
from proxy.share.routes import served_version_ranges, share_routes
from proxy.share.states import AcknowledgeType, RecordState
from proxy.upstream import FramedStream
from tests.proxy.share.test_authorization import DESCRIBE_ONLY, READ_AND_DESCRIBE
from tests.proxy.share.test_authorization import FakeCluster as Acls
from tests.proxy.share.test_manager import GROUP, TOPIC_ID, TP, start_service

ACCEPT = int(AcknowledgeType.ACCEPT)
HEARTBEAT, DESCRIBE, FETCH, ACKNOWLEDGE = 76, 77, 78, 79
LIST_GROUPS, DESCRIBE_GROUPS, DELETE_GROUPS = 16, 15, 42
DESCRIBE_OFFSETS, ALTER_OFFSETS, DELETE_OFFSETS = 90, 91, 92
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
MARK_KEY, IN_FLIGHT_KEY = extensions.DEFAULT_MARK_IN_PROGRESS_KEY, extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY
ALL_GROUP_OPS = {(GROUP, op): True for op in GROUP_OPERATIONS}
STATE_TOPIC = "__share_proxy_state"
INSTANCE = bits([Operation.READ, Operation.WRITE, Operation.DESCRIBE])  # the proxies' rights on the state topic
READ_SUMMARY, DELETE_STATE = 87, 86


def module_of(schema: type):
    return sys.modules[schema.__module__]


class Wire:
    """A client talking to the routes through a real ClientConnection; the upstream end answers
    the authorization probes from `acls` (and counts them)."""

    def __init__(self, harness, acls: Acls, mode: str = "cluster") -> None:
        self.harness, self.acls = harness, acls
        service = harness.service
        # Every request asks (ttl 0): ACL changes show at once. WRITE on the state topic marks an instance.
        policy = AuthorizationPolicy(mode, ttl_ms=0, instance_topic=STATE_TOPIC)
        table = ApiVersionTable()
        routes: dict = {}
        routes.update(share_routes(service, policy))
        configs = GroupConfigs(service.coordinator, service.commits, service.cluster.upstream_group_type,
                               write_timeout_s=5)
        routes.update(group_config_routes(configs, routes, policy))
        admin = GroupAdmin(service, write_timeout_s=5)
        routes.update(admin_routes(admin, lambda: [1], policy))
        routes.update(peer_routes(PeerStateServer(lambda topic_id, partition: True, admin.local_summary,
                                                  admin.delete_led, admin.initialize_led), policy))
        for api_key in PEER_APIS:
            table.register_local(api_key, VersionRange(*DEFAULT_REGISTRY.supported_versions(api_key)))
        routes.update(in_flight_routes(service, IN_FLIGHT_KEY, policy))
        routes.update(progress_routes(service, MARK_KEY, policy))
        for api_key, versions in served_version_ranges().items():
            table.register_local(api_key, versions)
        register_admin_versions(table)
        table.register_local(*in_flight_version_range(IN_FLIGHT_KEY))
        table.register_local(*progress_version_range(MARK_KEY))
        client_end, proxy_end = trio.testing.memory_stream_pair()
        self.client = FramedStream(client_end, 1 << 22)
        self.connection = ClientConnection(FramedStream(proxy_end, 1 << 22), open_upstream=self._open_upstream,
                                           routes=routes, api_versions=table, max_in_flight=8,
                                           listener="bootstrap", node_id=1, peer="127.0.0.1:5555")
        self._correlation = 0

    async def _open_upstream(self) -> FramedStream:
        proxy_end, broker_end = trio.testing.memory_stream_pair()
        assert self._nursery is not None
        self._nursery.start_soon(self._answer_probes, FramedStream(broker_end, 1 << 22))
        return FramedStream(proxy_end, 1 << 22)

    async def _answer_probes(self, broker: FramedStream) -> None:
        while (frame := await broker.receive_frame()) is not None:
            header, offset = parse_request_header(frame)
            request = decode_entity(load_request_schema(header.api_key, header.api_version),
                                    memoryview(frame)[offset:])
            if header.api_key == LIST_GROUPS:  # forwarded: the broker has no groups of its own
                answer = load_response_schema(LIST_GROUPS, header.api_version)(
                    throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, groups=())
            else:
                answer = await self.acls.call(request)
            await broker.send_frame(encode_response_header(
                header.correlation_id, response_header_version(header.api_key, header.api_version)) + encode(answer))

    async def start(self, nursery) -> Wire:
        self._nursery = nursery
        nursery.start_soon(self.connection.serve)
        return self

    async def call(self, api_key: int, version: int, entity, response_type: type | None = None):
        self._correlation += 1
        await self.client.send_frame(encode_request_header(RequestHeader(api_key, version, self._correlation, "t"))
                                     + encode(entity))
        payload = await self.client.receive_frame()
        assert payload is not None
        header, offset = parse_response_header(payload, response_header_version(api_key, version))
        assert header.correlation_id == self._correlation
        return decode_entity(response_type or DEFAULT_REGISTRY.response_type(api_key, version),
                             memoryview(payload)[offset:])

    # -- the share APIs ----------------------------------------------------------------------

    async def heartbeat(self, member_id: str, topics=("orders",), group_id: str = GROUP, epoch: int = 0):
        request = load_request_schema(HEARTBEAT, 1)(group_id=group_id, member_id=member_id, member_epoch=epoch,
                                                    rack_id=None, subscribed_topic_names=tuple(topics))
        return await self.call(HEARTBEAT, 1, request)

    async def fetch(self, member_id: str, epoch: int, *, acks=(), partitions=(TP,)):
        schema = load_request_schema(FETCH, 2)
        m = module_of(schema)
        by_tp = {tp: [] for tp in partitions}
        for tp, first, last, kind in acks:
            by_tp.setdefault(tp, []).append(m.AcknowledgementBatch(first_offset=first, last_offset=last,
                                                                   acknowledge_types=(kind,)))
        request = schema(
            group_id=GROUP, member_id=member_id, share_session_epoch=epoch, max_wait=datetime.timedelta(0),
            min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100, share_acquire_mode=0,
            is_renew_ack=False,
            topics=tuple(m.FetchTopic(topic_id=tp[0], partitions=(m.FetchPartition(
                partition_index=tp[1], acknowledgement_batches=tuple(batches)),)) for tp, batches in by_tp.items()),
            forgotten_topics_data=())
        return await self.call(FETCH, 2, request)

    async def acknowledge(self, member_id: str, epoch: int, acks, group_id: str = GROUP):
        schema = load_request_schema(ACKNOWLEDGE, 2)
        m = module_of(schema)
        request = schema(group_id=group_id, member_id=member_id, share_session_epoch=epoch, is_renew_ack=False,
                         topics=tuple(m.AcknowledgeTopic(topic_id=tp[0], partitions=(m.AcknowledgePartition(
                             partition_index=tp[1], acknowledgement_batches=(m.AcknowledgementBatch(
                                 first_offset=first, last_offset=last, acknowledge_types=(kind,)),)),))
                             for tp, first, last, kind in acks))
        return await self.call(ACKNOWLEDGE, 2, request)


@pytest.fixture
async def harness(nursery):
    return await start_service(nursery)


def states(harness) -> list[tuple[int, int, RecordState, str | None]]:
    leader = harness.service.leaders.active((GROUP, *TP))
    if leader is None:
        return []
    return [(r.first_offset, r.last_offset, r.state, r.member_id) for r in leader.engine.in_flight_locked()]


def partitions_written(writes) -> set:
    """The share-partitions whose state records appear in these state-topic writes."""
    found = set()
    for key, _ in (record for write in writes for record in write):
        _, entity = share_state.decode_key(key)
        if hasattr(entity, "partition"):
            found.add((entity.topic_id, int(entity.partition)))
    return found


def partitions_of(response) -> dict:
    return {(t.topic_id, int(p.partition_index)): p for t in response.responses for p in t.partitions}


async def joined(wire: Wire, name: str = "m") -> tuple[str, int]:
    """A member joined through the wire (allowed), with its assignment; (member id, epoch)."""
    member_id = f"{name}-{uuid.uuid4().hex[:8]}"
    await wire.heartbeat(member_id)
    response = await wire.heartbeat(member_id, epoch=1)
    return member_id, int(response.member_epoch)


def reader(topics=READ_AND_DESCRIBE) -> Acls:
    """ACLs granting everything on the group and `topics` (a bitfield) on the topic "orders"."""
    return Acls(groups=dict(ALL_GROUP_OPS), topics={"orders": topics})


# ----- ShareGroupHeartbeat -----------------------------------------------------------------------


async def test_heartbeat_without_read_on_the_group_is_refused_and_creates_no_group(harness, nursery, autojump_clock):
    acls = reader()
    acls.groups[(GROUP, Operation.READ)] = False
    wire = await Wire(harness, acls).start(nursery)
    before = metrics.AUTHORIZATION_DENIED.labels(api="ShareGroupHeartbeat", resource="group")._value.get()
    response = await wire.heartbeat("m-1")
    assert response.error_code == ErrorCode.group_authorization_failed
    assert response.error_message == "Group authorization failed."
    assert not harness.service.coordinator.has_group(GROUP)
    assert metrics.AUTHORIZATION_DENIED.labels(api="ShareGroupHeartbeat", resource="group")._value.get() == before + 1


async def test_heartbeat_subscribing_to_a_topic_without_describe_is_refused(harness, nursery, autojump_clock):
    acls = reader(topics=0)
    wire = await Wire(harness, acls).start(nursery)
    response = await wire.heartbeat("m-1", topics=("orders",))
    assert response.error_code == ErrorCode.topic_authorization_failed
    assert not harness.service.coordinator.has_group(GROUP)
    acls.topics["orders"] = DESCRIBE_ONLY  # DESCRIBE is all the heartbeat needs
    assert (await wire.heartbeat("m-1")).error_code == ErrorCode.none
    assert harness.service.coordinator.has_group(GROUP)


# ----- ShareFetch / ShareAcknowledge -------------------------------------------------------------


async def test_share_fetch_without_read_on_the_group_opens_no_session_and_acquires_nothing(
        harness, nursery, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    member_id, _ = await joined(wire)
    acls.groups[(GROUP, Operation.READ)] = False
    response = await wire.fetch(member_id, 0)
    assert response.error_code == ErrorCode.group_authorization_failed
    assert response.responses == ()
    assert harness.service.sessions.total_partitions() == 0
    assert harness.cluster.fetches == 0 and states(harness) == []


async def test_share_fetch_of_a_topic_without_read_acquires_nothing_and_applies_no_acknowledgement(
        harness, nursery, autojump_clock):
    harness.cluster.append([b"a", b"b", b"c"])
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    member_id, _ = await joined(wire)
    first = partitions_of(await wire.fetch(member_id, 0))[TP]
    assert first.error_code == ErrorCode.none and [(a.first_offset, a.last_offset) for a in first.acquired_records] == [(0, 2)]
    held = states(harness)
    assert held == [(0, 2, RecordState.ACQUIRED, member_id)]

    acls.topics["orders"] = DESCRIBE_ONLY  # READ revoked
    harness.cluster.append([b"d"])
    fetches = harness.cluster.fetches
    response = await wire.fetch(member_id, 1, acks=[(TP, 0, 2, ACCEPT)], partitions=())
    part = partitions_of(response)[TP]
    assert response.error_code == ErrorCode.none
    assert part.error_code == ErrorCode.topic_authorization_failed
    assert part.acknowledge_error_code == ErrorCode.topic_authorization_failed
    assert part.acquired_records == () and not part.records
    assert states(harness) == held  # not acknowledged, nothing new acquired
    assert harness.cluster.fetches == fetches

    ack = await wire.acknowledge(member_id, 2, [(TP, 0, 2, ACCEPT)])
    assert ack.error_code == ErrorCode.none
    assert partitions_of(ack)[TP].error_code == ErrorCode.topic_authorization_failed
    assert states(harness) == held

    acls.topics["orders"] = READ_AND_DESCRIBE  # granted again: the same acknowledgement works
    ack = await wire.acknowledge(member_id, 3, [(TP, 0, 2, ACCEPT)])
    assert partitions_of(ack)[TP].error_code == ErrorCode.none
    assert all(s[2] is not RecordState.ACQUIRED for s in states(harness))


async def test_share_acknowledge_without_read_on_the_group_applies_nothing(harness, nursery, autojump_clock):
    harness.cluster.append([b"a"])
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    member_id, _ = await joined(wire)
    await wire.fetch(member_id, 0)
    held = states(harness)
    acls.groups[(GROUP, Operation.READ)] = False
    response = await wire.acknowledge(member_id, 1, [(TP, 0, 0, ACCEPT)])
    assert response.error_code == ErrorCode.group_authorization_failed
    assert response.responses == ()
    assert states(harness) == held
    acls.groups[(GROUP, Operation.READ)] = True
    response = await wire.acknowledge(member_id, 1, [(TP, 0, 0, ACCEPT)])  # the epoch did not move
    assert response.error_code == ErrorCode.none


# ----- ShareGroupDescribe ------------------------------------------------------------------------


async def describe(wire: Wire, *group_ids: str, include_operations: bool = True):
    request = load_request_schema(DESCRIBE, 1)(group_ids=group_ids, include_authorized_operations=include_operations)
    return await wire.call(DESCRIBE, 1, request)


async def test_describe_follows_group_and_topic_describe(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await joined(wire)
    acls.groups[(GROUP, Operation.DELETE)] = False
    [group] = (await describe(wire, GROUP)).groups
    assert group.error_code == ErrorCode.none and len(group.members) == 1
    assert group.authorized_operations == bits(op for op in GROUP_OPERATIONS if op is not Operation.DELETE)

    acls.topics["orders"] = 0  # the assignment names a topic the client may not DESCRIBE
    [group] = (await describe(wire, GROUP)).groups
    assert group.error_code == ErrorCode.topic_authorization_failed
    assert group.error_message == "The group has described topic(s) that the client is not authorized to describe."
    assert group.members == ()

    acls.groups[(GROUP, Operation.DESCRIBE)] = False
    acls.groups[("other", Operation.DESCRIBE)] = True
    groups = (await describe(wire, "other", GROUP)).groups
    assert [(g.group_id, g.error_code) for g in groups] == [
        (GROUP, ErrorCode.group_authorization_failed), ("other", ErrorCode.group_id_not_found)]


# ----- admin APIs --------------------------------------------------------------------------------


async def empty_group(wire: Wire, harness) -> None:
    """The share group exists and is empty, with share state on the topic."""
    harness.cluster.append([b"a"])
    member_id, epoch = await joined(wire)
    await wire.fetch(member_id, 0)
    await wire.heartbeat(member_id, epoch=-1)
    assert harness.service.coordinator.has_group(GROUP) and not harness.service.coordinator.has_members(GROUP)
    while not harness.service.commits.idle:  # the member's release, written without anyone waiting
        await trio.sleep(0.01)


async def test_delete_group_needs_delete_on_it(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    acls.groups[(GROUP, Operation.DELETE)] = False
    request = load_request_schema(DELETE_GROUPS, 2)(groups_names=(GROUP,))
    [result] = (await wire.call(DELETE_GROUPS, 2, request)).results
    assert result.error_code == ErrorCode.group_authorization_failed
    assert harness.service.coordinator.has_group(GROUP)
    acls.groups[(GROUP, Operation.DELETE)] = True
    [result] = (await wire.call(DELETE_GROUPS, 2, request)).results
    assert result.error_code == ErrorCode.none
    assert not harness.service.coordinator.has_group(GROUP)


async def test_delete_offsets_needs_delete_on_the_group_and_read_on_the_topic(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    initialised = set(harness.service.coordinator.initialized_partitions(GROUP))
    assert initialised == {TP}
    schema = load_request_schema(DELETE_OFFSETS, 0)
    request = schema(group_id=GROUP, topics=(module_of(schema).DeleteShareGroupOffsetsRequestTopic(
        topic_name="orders"),))
    acls.groups[(GROUP, Operation.DELETE)] = False
    response = await wire.call(DELETE_OFFSETS, 0, request)
    assert response.error_code == ErrorCode.group_authorization_failed and response.responses == ()
    acls.groups[(GROUP, Operation.DELETE)] = True
    acls.topics["orders"] = DESCRIBE_ONLY
    response = await wire.call(DELETE_OFFSETS, 0, request)
    assert [(t.topic_name, t.error_code) for t in response.responses] == [
        ("orders", ErrorCode.topic_authorization_failed)]
    assert set(harness.service.coordinator.initialized_partitions(GROUP)) == initialised
    acls.topics["orders"] = READ_AND_DESCRIBE
    response = await wire.call(DELETE_OFFSETS, 0, request)
    assert [(t.topic_name, t.error_code) for t in response.responses] == [("orders", ErrorCode.none)]
    assert set(harness.service.coordinator.initialized_partitions(GROUP)) == set()


async def test_alter_offsets_needs_read_on_group_and_topic(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    schema = load_request_schema(ALTER_OFFSETS, 0)
    m = module_of(schema)
    request = schema(group_id=GROUP, topics=(m.AlterShareGroupOffsetsRequestTopic(topic_name="orders", partitions=(
        m.AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=0),)),))
    written = len(harness.writer.writes)
    acls.groups[(GROUP, Operation.READ)] = False
    response = await wire.call(ALTER_OFFSETS, 0, request)
    assert response.error_code == ErrorCode.group_authorization_failed
    acls.groups[(GROUP, Operation.READ)] = True
    acls.topics["orders"] = DESCRIBE_ONLY
    response = await wire.call(ALTER_OFFSETS, 0, request)
    [topic] = response.responses
    assert topic.topic_id == TOPIC_ID
    assert [p.error_code for p in topic.partitions] == [ErrorCode.topic_authorization_failed]
    # No share-partition was reset: no state of it written (only the group's unchanged record,
    # as Kafka calls the coordinator with the authorized topics even when there are none).
    assert TP not in partitions_written(harness.writer.writes[written:])
    acls.topics["orders"] = READ_AND_DESCRIBE
    response = await wire.call(ALTER_OFFSETS, 0, request)
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]
    assert TP in partitions_written(harness.writer.writes[written:])


async def test_describe_offsets_hides_or_refuses_topics_without_describe(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    schema = load_request_schema(DESCRIBE_OFFSETS, 1)
    m = module_of(schema)
    everything = schema(groups=(m.DescribeShareGroupOffsetsRequestGroup(group_id=GROUP, topics=None),))
    named = schema(groups=(m.DescribeShareGroupOffsetsRequestGroup(group_id=GROUP, topics=(
        m.DescribeShareGroupOffsetsRequestTopic(topic_name="orders", partitions=(0,)),)),))
    [group] = (await wire.call(DESCRIBE_OFFSETS, 1, everything)).groups
    assert [t.topic_name for t in group.topics] == ["orders"]
    acls.topics["orders"] = 0
    [group] = (await wire.call(DESCRIBE_OFFSETS, 1, everything)).groups
    assert group.error_code == ErrorCode.none and group.topics == ()
    [group] = (await wire.call(DESCRIBE_OFFSETS, 1, named)).groups
    [topic] = group.topics
    assert topic.topic_id in (None, uuid.UUID(int=0))  # the zero uuid (kio reads it as None)
    assert [(p.error_code, p.start_offset, p.lag) for p in topic.partitions] == [
        (ErrorCode.topic_authorization_failed, -1, -1)]
    acls.groups[(GROUP, Operation.DESCRIBE)] = False
    [group] = (await wire.call(DESCRIBE_OFFSETS, 1, everything)).groups
    assert group.error_code == ErrorCode.group_authorization_failed


async def test_list_and_describe_groups_show_share_groups_only_with_describe(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    listed = load_request_schema(LIST_GROUPS, 5)(states_filter=(), types_filter=())
    described = load_request_schema(DESCRIBE_GROUPS, 5)(groups=(GROUP,), include_authorized_operations=False)

    async def list_ids() -> list[str]:
        # The proxy forwards ListGroups and merges its share groups into the broker's answer.
        return [g.group_id for g in (await wire.call(LIST_GROUPS, 5, listed)).groups]

    assert await list_ids() == [GROUP]
    acls.groups[(GROUP, Operation.DESCRIBE)] = False
    assert await list_ids() == []
    acls.cluster_ops = bits([Operation.DESCRIBE])  # DESCRIBE on the cluster lists every group
    assert await list_ids() == [GROUP]
    [group] = (await wire.call(DESCRIBE_GROUPS, 5, described)).groups
    assert group.error_code == ErrorCode.group_authorization_failed


# ----- group configs -----------------------------------------------------------------------------


async def test_group_configs_need_describe_configs_and_alter_configs(harness, nursery, autojump_clock):
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    d_schema = load_request_schema(DESCRIBE_CONFIGS, 4)
    d = d_schema(resources=(module_of(d_schema).DescribeConfigsResource(
        resource_type=32, resource_name=GROUP, configuration_keys=None),), include_synonyms=False,
        include_documentation=False)
    a_schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    am = module_of(a_schema)
    a = a_schema(resources=(am.AlterConfigsResource(resource_type=32, resource_name=GROUP, configs=(
        am.AlterableConfig(name="share.record.lock.duration.ms", config_operation=0, value="20000"),)),),
        validate_only=False)
    acls.groups[(GROUP, Operation.DESCRIBE_CONFIGS)] = False
    acls.groups[(GROUP, Operation.ALTER_CONFIGS)] = False
    [result] = (await wire.call(DESCRIBE_CONFIGS, 4, d)).results
    assert result.error_code == ErrorCode.group_authorization_failed and result.configs == ()
    [result] = (await wire.call(INCREMENTAL_ALTER_CONFIGS, 1, a)).responses
    assert result.error_code == ErrorCode.group_authorization_failed
    assert harness.service.coordinator.group_config_overrides(GROUP) == {}
    acls.groups[(GROUP, Operation.DESCRIBE_CONFIGS)] = True
    [result] = (await wire.call(DESCRIBE_CONFIGS, 4, d)).results
    assert result.error_code == ErrorCode.none and result.configs


# ----- extension RPCs ----------------------------------------------------------------------------


async def test_mark_in_progress_and_in_flight_follow_read_and_describe(harness, nursery, autojump_clock):
    harness.cluster.append([b"a"])
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    member_id, _ = await joined(wire)
    await wire.fetch(member_id, 0)
    held = states(harness)
    mark_type = extensions.mark_in_progress(MARK_KEY).requests[0]
    mark = mark_type(group_id=GROUP, member_id=member_id, share_session_epoch=1, topics=(mark_type.ProgressTopic(
        topic_id=TOPIC_ID, partitions=(mark_type.ProgressPartition(partition_index=0, progress_batches=(
            mark_type.ProgressBatch(first_offset=0, last_offset=0),)),)),))
    mark_response_type = extensions.mark_in_progress(MARK_KEY).responses[0]
    acls.groups[(GROUP, Operation.READ)] = False
    response = await wire.call(MARK_KEY, 0, mark, mark_response_type)
    assert response.error_code == ErrorCode.group_authorization_failed
    acls.groups[(GROUP, Operation.READ)] = True
    acls.topics["orders"] = DESCRIBE_ONLY
    response = await wire.call(MARK_KEY, 0, mark, mark_response_type)
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.topic_authorization_failed]
    assert states(harness) == held  # still ACQUIRED, not IN_PROGRESS

    in_flight_type = extensions.describe_in_flight(IN_FLIGHT_KEY).requests[0]
    in_flight_response_type = extensions.describe_in_flight(IN_FLIGHT_KEY).responses[0]
    ask = in_flight_type(group_id=GROUP, topics=None, states=(), held_longer_than_ms=-1, progress_staleness_ms=-1)
    acls.topics["orders"] = 0
    response = await wire.call(IN_FLIGHT_KEY, 0, ask, in_flight_response_type)
    assert response.error_code == ErrorCode.none and response.topics == ()
    acls.groups[(GROUP, Operation.DESCRIBE)] = False
    response = await wire.call(IN_FLIGHT_KEY, 0, ask, in_flight_response_type)
    assert response.error_code == ErrorCode.group_authorization_failed


# ----- calls between instances (scale-out) -------------------------------------------------------


async def test_share_state_rpcs_are_served_to_proxy_instances_only(harness, nursery, autojump_clock):
    """Kafka asks CLUSTER_ACTION for these; the proxy asks WRITE on the state topic, which only the
    instances' principal holds. Every right on the group is not enough: the RPCs act on any group."""
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    summary_schema, delete_schema = load_request_schema(READ_SUMMARY, 1), load_request_schema(DELETE_STATE, 0)
    sm, dm = module_of(summary_schema), module_of(delete_schema)
    summary = summary_schema(group_id=GROUP, topics=(sm.ReadStateSummaryData(topic_id=TOPIC_ID, partitions=(
        sm.PartitionData(partition=0, leader_epoch=0),)),))
    delete = delete_schema(group_id=GROUP, topics=(dm.DeleteStateData(topic_id=TOPIC_ID, partitions=(
        dm.PartitionData(partition=0),)),))
    before = states(harness)
    writes = len(harness.writer.writes)

    for api_key, version, request in ((READ_SUMMARY, 1, summary), (DELETE_STATE, 0, delete)):
        [result] = (await wire.call(api_key, version, request)).results
        assert [(p.error_code, p.error_message) for p in result.partitions] == [
            (ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")]
    assert states(harness) == before and len(harness.writer.writes) == writes  # nothing deleted

    acls.topics[STATE_TOPIC] = INSTANCE
    [result] = (await wire.call(READ_SUMMARY, 1, summary)).results
    [partition] = result.partitions
    assert (partition.error_code, int(partition.start_offset)) == (ErrorCode.none, 0)


async def test_an_instance_may_describe_and_alter_any_groups_configs_and_describe_in_flight_records(
        harness, nursery, autojump_clock):
    """A leader mirrors a group's configs from its coordinator, an instance passes a client's config
    request to the group's coordinator, and a coordinator asks leaders for their in-flight records,
    each as itself: the client was authorized where it asked."""
    acls = reader()
    wire = await Wire(harness, acls).start(nursery)
    await empty_group(wire, harness)
    acls.groups[(GROUP, Operation.DESCRIBE_CONFIGS)] = False
    acls.groups[(GROUP, Operation.DESCRIBE)] = False
    acls.groups[(GROUP, Operation.ALTER_CONFIGS)] = False
    d_schema = load_request_schema(DESCRIBE_CONFIGS, 4)
    d = d_schema(resources=(module_of(d_schema).DescribeConfigsResource(
        resource_type=32, resource_name=GROUP, configuration_keys=None),), include_synonyms=False,
        include_documentation=False)
    in_flight_api = extensions.describe_in_flight(IN_FLIGHT_KEY)
    ask = in_flight_api.requests[0](group_id=GROUP, topics=None, states=(), held_longer_than_ms=-1,
                                    progress_staleness_ms=-1)
    [result] = (await wire.call(DESCRIBE_CONFIGS, 4, d)).results
    assert result.error_code == ErrorCode.group_authorization_failed
    assert (await wire.call(IN_FLIGHT_KEY, 0, ask, in_flight_api.responses[0])).error_code == \
        ErrorCode.group_authorization_failed

    acls.topics[STATE_TOPIC] = INSTANCE
    [result] = (await wire.call(DESCRIBE_CONFIGS, 4, d)).results
    assert result.error_code == ErrorCode.none and result.configs
    assert (await wire.call(IN_FLIGHT_KEY, 0, ask, in_flight_api.responses[0])).error_code == ErrorCode.none
    a_schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    am = module_of(a_schema)
    a = a_schema(resources=(am.AlterConfigsResource(resource_type=32, resource_name=GROUP, configs=(
        am.AlterableConfig(name="share.record.lock.duration.ms", config_operation=0, value="20000"),)),),
        validate_only=False)
    [result] = (await wire.call(INCREMENTAL_ALTER_CONFIGS, 1, a)).responses
    assert result.error_code == ErrorCode.none
    assert harness.service.coordinator.group_config_overrides(GROUP) == {"share.record.lock.duration.ms": "20000"}
    acls.topics[STATE_TOPIC] = bits([Operation.READ, Operation.DESCRIBE])  # a client that may only read it
    a = dataclasses.replace(a, resources=(dataclasses.replace(a.resources[0], configs=(
        am.AlterableConfig(name="share.record.lock.duration.ms", config_operation=0, value="30000"),)),))
    [result] = (await wire.call(INCREMENTAL_ALTER_CONFIGS, 1, a)).responses
    assert result.error_code == ErrorCode.group_authorization_failed
    assert harness.service.coordinator.group_config_overrides(GROUP) == {"share.record.lock.duration.ms": "20000"}


# ----- modes -------------------------------------------------------------------------------------


async def test_off_mode_never_probes(harness, nursery, autojump_clock):
    harness.cluster.append([b"a"])
    acls = Acls()  # would deny everything
    wire = await Wire(harness, acls, mode="off").start(nursery)
    member_id, _ = await joined(wire)
    assert partitions_of(await wire.fetch(member_id, 0))[TP].acquired_records
    assert acls.calls == []
