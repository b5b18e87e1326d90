"""Share-state RPCs between instances (proxy/share/peers.py): a coordinator's GroupAdmin acting on
share-partitions another instance leads, the two instances being two ShareServices on the fake
cluster of test_manager, joined by a loopback that encodes every request and response with kio."""

from __future__ import annotations

import datetime
import sys
import uuid

import pytest
import trio

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from codec.registry import decode_entity, encode
from proxy.errors import UpstreamError
from proxy.share import state_store
from proxy.share.group_admin import GroupAdmin, PartitionOffset
from proxy.share.ownership import InstanceIdentity
from proxy.share.peers import (
    DELETE_SHARE_GROUP_STATE,
    INITIALIZE_SHARE_GROUP_STATE,
    READ_SHARE_GROUP_STATE_SUMMARY,
    PeerConnections,
    PeerStateClient,
    PeerStateServer,
    call_peer,
)
from tests.proxy.share.test_manager import ACCEPT, GROUP, TOPIC_ID, TP, acquired, start_service

COORDINATOR = InstanceIdentity("ksp-0", 0, "127.0.0.1", 19092, 30000)
LEADER = InstanceIdentity("ksp-1", 1, "127.0.0.1", 19093, 31000)


def round_trip(entity):
    """What the other side decodes: the entity encoded and decoded with its own schema."""
    return decode_entity(type(entity), encode(entity))


class LoopbackPeer:
    """A peer connection whose far side is ``answer(request as decoded there, *args)``; the answer
    comes back encoded and decoded too."""

    def __init__(self, answer) -> None:
        self.answer = answer

    async def call(self, request, *args):
        return round_trip(await self.answer(round_trip(request), *args))

    async def aclose(self) -> None:
        pass


def state_server_peer(server: PeerStateServer, asked: list) -> LoopbackPeer:
    """A connection to the leader's PeerStateServer; records what was asked."""

    async def answer(request):
        key = int(request.__api_key__)
        asked.append((key, request.group_id, [(t.topic_id, int(p.partition)) for t in request.topics
                                              for p in t.partitions]))
        if key == READ_SHARE_GROUP_STATE_SUMMARY:
            return server.read_summary(request)
        if key == DELETE_SHARE_GROUP_STATE:
            return await server.delete_state(request)
        return await server.initialize_state(request)

    return LoopbackPeer(answer)


async def two_instances(nursery, *, leads=lambda topic_id, partition: True, reachable=True):
    """(coordinator harness, its admin, leader harness, leader admin, calls asked of the leader)."""
    coordinator = await start_service(nursery)
    leader = await start_service(nursery)
    coordinator_admin = GroupAdmin(coordinator.service, write_timeout_s=5)
    leader_admin = GroupAdmin(leader.service, write_timeout_s=5)
    server = PeerStateServer(leads, leader_admin.local_summary, leader_admin.delete_led, leader_admin.initialize_led)
    asked: list = []

    async def connect(host: str, port: int):
        assert (host, port) == (LEADER.host, LEADER.bootstrap_port)
        if not reachable:
            raise UpstreamError("connection refused")
        return state_server_peer(server, asked)

    coordinator_admin.peers = PeerStateClient(COORDINATOR.slot, lambda topic_id, partition: LEADER, connect,
                                              timeout_s=5)
    # The coordinator knows the group and that TP is initialised; the leader holds its state.
    coordinator.service.handle_events(coordinator.service.coordinator.create_empty_group(GROUP))
    coordinator.service.coordinator.mark_initialized(GROUP, [TP])
    return coordinator, coordinator_admin, leader, leader_admin, asked


async def leader_with_progress(leader) -> None:
    leader.cluster.append([b"a", b"b", b"c", b"d"])
    member = leader.member("m")
    assert acquired(await leader.fetch(member)) == [(0, 3, 1)]
    await leader.acknowledge(member, [(TP, 0, 1, ACCEPT)])  # SPSO moves to 2; 2 and 3 stay acquired


async def test_describe_offsets_of_a_share_partition_led_elsewhere_asks_its_leader(nursery, autojump_clock):
    coordinator, admin, leader, _, asked = await two_instances(nursery)
    await leader_with_progress(leader)
    coordinator.cluster.append([b"a", b"b", b"c", b"d", b"e"])  # the coordinator's view of the end offset

    offsets = await admin.describe_offsets(GROUP, None)

    assert asked == [(READ_SHARE_GROUP_STATE_SUMMARY, GROUP, [TP])]
    (topic,) = offsets.topics
    assert topic.partitions == (PartitionOffset(0, start_offset=2, leader_epoch=0, lag=3),)


async def test_a_leader_without_state_answers_start_offset_minus_one(nursery, autojump_clock):
    _, admin, _, _, _ = await two_instances(nursery)
    offsets = await admin.describe_offsets(GROUP, [("orders", [0])])
    assert offsets.topics[0].partitions == (PartitionOffset(0),)


async def test_an_instance_that_no_longer_leads_answers_not_coordinator(nursery, autojump_clock):
    _, admin, leader, _, _ = await two_instances(nursery, leads=lambda topic_id, partition: False)
    await leader_with_progress(leader)
    (row,) = (await admin.describe_offsets(GROUP, None)).topics[0].partitions
    assert (row.partition, row.error, row.start_offset) == (0, ErrorCode.not_coordinator, -1)


async def test_an_unreachable_leader_is_an_error_never_a_silent_answer(nursery, autojump_clock):
    coordinator, admin, _, _, _ = await two_instances(nursery, reachable=False)
    (row,) = (await admin.describe_offsets(GROUP, None)).topics[0].partitions
    assert row.error is ErrorCode.coordinator_not_available
    assert "ksp-1" in row.message and "connection refused" in row.message

    # Deleting fails for the topic and leaves the coordinator's record of it for a retry.
    outcome = await admin.delete_offsets(GROUP, ["orders"])
    assert [(t.name, t.error) for t in outcome.topics] == [("orders", ErrorCode.coordinator_not_available)]
    assert coordinator.service.coordinator.initialized_partitions(GROUP) == {TP}
    code, message = await admin.delete_group(GROUP)
    assert code is ErrorCode.coordinator_not_available
    assert coordinator.service.coordinator.has_group(GROUP)


async def test_no_owner_during_a_hand_over_is_retriable(nursery, autojump_clock):
    coordinator = await start_service(nursery)
    admin = GroupAdmin(coordinator.service, write_timeout_s=5)

    async def connect(host, port):
        raise AssertionError("nobody to connect to")

    admin.peers = PeerStateClient(0, lambda topic_id, partition: None, connect)
    coordinator.service.handle_events(coordinator.service.coordinator.create_empty_group(GROUP))
    coordinator.service.coordinator.mark_initialized(GROUP, [TP])
    (row,) = (await admin.describe_offsets(GROUP, None)).topics[0].partitions
    assert row.error is ErrorCode.coordinator_not_available


async def test_delete_offsets_has_the_leader_tombstone_the_share_partition(nursery, autojump_clock):
    coordinator, admin, leader, _, asked = await two_instances(nursery)
    await leader_with_progress(leader)
    key = (GROUP, *TP)
    assert key in state_store.recover(leader.writer.replayed()).partitions

    outcome = await admin.delete_offsets(GROUP, ["orders"])

    assert [(t.name, t.error) for t in outcome.topics] == [("orders", ErrorCode.none)]
    assert asked[-1][:2] == (DELETE_SHARE_GROUP_STATE, GROUP)
    assert TP in asked[-1][2]
    assert key not in state_store.recover(leader.writer.replayed()).partitions  # durable tombstones
    assert leader.service.leaders.active(key) is None
    assert coordinator.service.coordinator.initialized_partitions(GROUP) == frozenset()


async def test_a_group_with_members_is_refused_before_any_leader_is_asked(nursery, autojump_clock):
    coordinator, admin, leader, _, asked = await two_instances(nursery)
    await leader_with_progress(leader)
    await coordinator.join(coordinator.member("x"))  # the coordinator knows the members
    assert (await admin.delete_offsets(GROUP, ["orders"])).error is ErrorCode.non_empty_group
    assert (await admin.delete_group(GROUP))[0] is ErrorCode.non_empty_group
    assert (await admin.alter_offsets(GROUP, [("orders", [(0, 1)])])).error is ErrorCode.non_empty_group
    assert asked == []
    assert (GROUP, *TP) in state_store.recover(leader.writer.replayed()).partitions


async def test_delete_group_has_the_leader_tombstone_its_share_partitions(nursery, autojump_clock):
    coordinator, admin, leader, _, asked = await two_instances(nursery)
    await leader_with_progress(leader)
    assert await admin.delete_group(GROUP) == (ErrorCode.none, None)
    assert asked[-1][:2] == (DELETE_SHARE_GROUP_STATE, GROUP)
    assert (GROUP, *TP) not in state_store.recover(leader.writer.replayed()).partitions
    assert not coordinator.service.coordinator.has_group(GROUP)


async def test_alter_offsets_starts_the_leaders_share_partition_afresh_durably(nursery, autojump_clock):
    coordinator, admin, leader, _, asked = await two_instances(nursery)
    await leader_with_progress(leader)
    leader.cluster.append([b"e", b"f"])

    outcome = await admin.alter_offsets(GROUP, [("orders", [(0, 5)])])

    assert [(t.name, [(p.partition, p.error) for p in t.partitions]) for t in outcome.topics] == [
        ("orders", [(0, ErrorCode.none)])]
    assert asked == [(INITIALIZE_SHARE_GROUP_STATE, GROUP, [TP])]
    recovered = state_store.recover(leader.writer.replayed()).partitions[(GROUP, *TP)]
    assert recovered.snapshot.start_offset == 5
    assert recovered.state_epoch == 1  # a new state epoch, as Kafka's alter
    assert coordinator.service.coordinator.initialized_partitions(GROUP) == {TP}


async def test_alter_offsets_reports_a_leader_that_failed_per_partition(nursery, autojump_clock):
    coordinator, admin, _, _, _ = await two_instances(nursery, leads=lambda topic_id, partition: False)
    outcome = await admin.alter_offsets(GROUP, [("orders", [(0, 5)])])
    assert [(t.name, [(p.partition, p.error) for p in t.partitions]) for t in outcome.topics] == [
        ("orders", [(0, ErrorCode.not_coordinator)])]


def test_refusals_are_well_formed_answers_for_every_rpc():
    server = PeerStateServer(lambda t, p: True, lambda g, t, p: None, None, None)
    client = PeerStateClient(0, lambda t, p: LEADER, None)
    topic = uuid.uuid4()
    requests = {
        READ_SHARE_GROUP_STATE_SUMMARY: _request(client, "summaries", topic),
        DELETE_SHARE_GROUP_STATE: _request(client, "delete", topic),
        INITIALIZE_SHARE_GROUP_STATE: _request(client, "initialize", topic),
    }
    for key, request in requests.items():
        response = round_trip(server.refuse(key, request, ErrorCode.group_authorization_failed, "denied"))
        ((result,),) = [response.results]
        assert result.topic_id == topic
        assert [(int(p.partition), p.error_code, p.error_message) for p in result.partitions] == [
            (3, ErrorCode.group_authorization_failed, "denied")]


def _request(client: PeerStateClient, operation: str, topic: uuid.UUID):
    """The request `client` would send for partition 3 of `topic`, captured from a fake connection."""
    import trio

    captured = []

    class Capture:
        async def call(self, request):
            captured.append(request)
            raise UpstreamError("captured")

        async def aclose(self):
            pass

    async def connect(host, port):
        return Capture()

    client._connect = connect
    argument = {(topic, 3): 7} if operation == "initialize" else [(topic, 3)]
    trio.run(getattr(client, operation), "g", argument)
    return round_trip(captured[0])


# ----- group configs at leaders ----------------------------------------------------------------


def describe_configs_answer(configs: dict[str, dict[str, tuple[str, int]]], errors: dict[str, ErrorCode] = {}):
    """A DescribeConfigs v4 answer: group -> {name: (value, source)}."""
    from kio.schema.describe_configs.v4 import response as r
    import datetime

    from kio.static.primitive import i8

    return round_trip(r.DescribeConfigsResponse(throttle_time=datetime.timedelta(0), results=tuple(
        r.DescribeConfigsResult(error_code=errors.get(group, ErrorCode.none), error_message=None,
                                resource_type=i8(32), resource_name=group, configs=tuple(
            r.DescribeConfigsResourceResult(name=name, value=value, read_only=False, config_source=i8(source),
                                            is_sensitive=False, synonyms=(), config_type=i8(2), documentation=None)
            for name, (value, source) in entries.items()))
        for group, entries in configs.items())))


def config_mirror(answers: list, groups=("g",), owner=COORDINATOR):
    from proxy.share.peers import GroupConfigMirror

    asked: list = []
    table: dict[str, dict[str, str]] = {}

    async def connect(host, port):
        assert (host, port) == (owner.host, owner.bootstrap_port)
        async def answer(request):
            asked.append([(int(r.resource_type), r.resource_name, r.configuration_keys)
                          for r in request.resources])
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        return LoopbackPeer(answer)

    def apply(group, overrides):
        if overrides.get("share.record.lock.duration.ms") == "1":
            raise ValueError("below the minimum")
        table[group] = dict(overrides)

    mirror = GroupConfigMirror(lambda: list(groups), lambda g: owner, connect, apply,
                               lambda g: table.get(g, {}), interval_s=2)
    return mirror, table, asked


async def test_a_leader_takes_a_groups_overrides_from_its_coordinator_and_keeps_them_on_failure(autojump_clock):
    import trio

    answers = [
        describe_configs_answer({"g": {"share.auto.offset.reset": ("latest", 8),
                                       "share.record.lock.duration.ms": ("30000", 1)}}),  # a default: not copied
        describe_configs_answer({"g": {"share.auto.offset.reset": ("latest", 8)}}),  # unchanged
        UpstreamError("connection refused"),  # the last copy stays
        describe_configs_answer({"g": {}}, errors={"g": ErrorCode.not_coordinator}),  # stays too
        describe_configs_answer({"g": {"share.record.lock.duration.ms": ("1", 8)}}),  # refused here: stays
        describe_configs_answer({"g": {}}),  # every override removed at the coordinator
    ]
    mirror, table, asked = config_mirror(answers)

    await mirror.before_first_load("g")
    assert table == {"g": {"share.auto.offset.reset": "latest"}}
    assert asked == [[(32, "g", None)]]
    await mirror.before_first_load("g")  # read once already: not asked again
    assert len(asked) == 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(mirror.run)
        for expected in ({"share.auto.offset.reset": "latest"},) * 4 + ({},):
            await trio.sleep(2.01)
            assert table["g"] == expected
        nursery.cancel_scope.cancel()
    assert len(asked) == 6 and answers == []


# ----- the in-flight describe across instances ----------------------------------------------------


class Ownership:
    def __init__(self, leads: bool, coordinates: bool) -> None:
        self._leads, self._coordinates = leads, coordinates

    def leads(self, topic_id, partition) -> bool:
        return self._leads

    def coordinates(self, group_id) -> bool:
        return self._coordinates


async def test_the_coordinator_describes_in_flight_records_of_a_partition_another_instance_leads(
        nursery, autojump_clock):
    from codec import extensions
    from proxy.share.in_flight import (
        InFlightFilter,
        _led_here,
        _with_leaders,
        describe_group_in_flight,
        in_flight_response,
        request_filter,
        requested_partitions,
    )
    from proxy.share.peers import InFlightFanOut

    coordinator, _, leader, _, _ = await two_instances(nursery)
    await leader_with_progress(leader)  # 0-1 accepted, 2-3 acquired by "m"
    api = extensions.describe_in_flight(82)
    asked = []

    async def answer(request, response_type):
        asked.append(requested_partitions(request))
        described = _led_here(describe_group_in_flight(leader.service, request.group_id,
                                                       requested_partitions(request), request_filter(request),
                                                       coordinated=False), Ownership(True, False))
        return in_flight_response(described, response_type)

    async def connect(host, port):
        return LoopbackPeer(answer)

    fan_out = InFlightFanOut(api, lambda g: COORDINATOR, lambda t, p: LEADER, connect)
    request = api.requests[0](group_id=GROUP, topics=None, held_longer_than_ms=-1, progress_staleness_ms=-1,
                              states=())
    here = describe_group_in_flight(coordinator.service, GROUP, None, InFlightFilter())
    assert here.topics[0].partitions[0].start_offset == -1  # the coordinator alone knows nothing of it

    result = await _with_leaders(here, fan_out, Ownership(False, True), request, 0)

    assert asked == [{TOPIC_ID: [0]}]  # only what that instance leads, named
    (partition,) = result.topics[0].partitions
    assert (partition.error, partition.start_offset, partition.end_offset) == (ErrorCode.none, 2, 4)
    assert [(r.first_offset, r.last_offset, r.member_id.startswith("m")) for r in partition.ranges] == [(2, 3, True)]

    # An instance asked for named share-partitions of a group it neither coordinates nor leads.
    refused = _led_here(describe_group_in_flight(coordinator.service, GROUP, {TOPIC_ID: [0]}, InFlightFilter(),
                                                 coordinated=False), Ownership(False, False))
    assert refused.topics[0].partitions[0].error is ErrorCode.not_leader_or_follower


# ----- group configs asked at an instance that does not coordinate the group ----------------------


async def test_config_requests_for_groups_coordinated_elsewhere_go_to_each_coordinator_narrowed(autojump_clock):
    from kio.schema.describe_configs.v4 import request as dreq
    from kio.schema.describe_configs.v4 import response as dres
    from kio.static.primitive import i8

    from proxy.share.peers import GroupConfigForwarder

    third = InstanceIdentity("ksp-2", 2, "127.0.0.1", 19094, 32000)
    coordinators = {"on-leader": LEADER, "on-third": third, "on-third-too": third, "orphan": None}
    asked: dict = {}

    def answering(owner):
        async def answer(request):
            asked.setdefault(owner.instance_id, []).append(
                (request.include_synonyms, [r.resource_name for r in request.resources]))
            if owner is third:
                raise UpstreamError("connection refused")
            return describe_configs_answer({r.resource_name: {"share.auto.offset.reset": ("latest", 8)}
                                            for r in request.resources})
        return answer

    async def connect(host, port):
        owner = next(o for o in (LEADER, third) if o.bootstrap_port == port)
        return LoopbackPeer(answering(owner))

    forwarder = GroupConfigForwarder(COORDINATOR.slot, coordinators.get, lambda: [COORDINATOR, LEADER, third], connect)
    assert forwarder.elsewhere("on-leader") and forwarder.elsewhere("orphan")
    assert not GroupConfigForwarder(LEADER.slot, coordinators.get, lambda: [], connect).elsewhere("on-leader")

    request = dreq.DescribeConfigsRequest(include_synonyms=True, include_documentation=False, resources=tuple(
        dreq.DescribeConfigsResource(resource_type=i8(32), resource_name=g, configuration_keys=None)
        for g in ("orphan", "on-third", "on-leader", "on-third-too")))

    def failed(resource, code, message):
        return dres.DescribeConfigsResult(error_code=code, error_message=message, resource_type=resource.resource_type,
                                          resource_name=resource.resource_name, configs=())

    results = await forwarder.forward(request, list(request.resources), "results", failed)
    assert [(r.resource_name, r.error_code) for r in results] == [
        ("orphan", ErrorCode.coordinator_not_available), ("on-third", ErrorCode.coordinator_not_available),
        ("on-leader", ErrorCode.none), ("on-third-too", ErrorCode.coordinator_not_available)]
    assert [(c.name, c.value) for c in results[2].configs] == [("share.auto.offset.reset", "latest")]
    assert "ksp-2 did not answer" in results[1].error_message and "hand-over" in results[0].error_message
    # One call per coordinator, carrying only its groups and the client's own flags.
    assert asked == {"ksp-1": [(True, ["on-leader"])], "ksp-2": [(True, ["on-third", "on-third-too"])]}


# ----- members that left, learnt by leaders from the coordinator ----------------------------------


async def test_a_leader_releases_members_its_groups_coordinator_no_longer_lists(autojump_clock):
    from kio.index import load_response_schema

    from proxy.share.peers import MembershipWatch

    response_type = load_response_schema(77, 1)
    described = sys.modules[response_type.__module__]

    def group(group_id, code, members=()):
        return described.DescribedGroup(
            error_code=code, error_message=None, group_id=group_id, group_state="Stable", group_epoch=i32(3),
            assignment_epoch=i32(3), assignor_name="simple", authorized_operations=i32(-2147483648),
            members=tuple(described.Member(member_id=m, rack_id=None, member_epoch=i32(3), client_id="c",
                                           client_host="/h", subscribed_topic_names=("t",),
                                           assignment=described.Assignment(topic_partitions=()))
                          for m in members))

    held = {"live": {"a", "b"}, "deleted": {"c"}, "moved": {"d"}, "idle": set()}
    asked: list = []

    async def answer(request):
        asked.append(list(request.group_ids))
        held["live"].add("joined-meanwhile")  # holds records now, but not when the call was sent
        return response_type(throttle_time=datetime.timedelta(0), groups=(
            group("live", ErrorCode.none, ["a"]), group("deleted", ErrorCode.group_id_not_found),
            group("moved", ErrorCode.not_coordinator)))

    async def connect(host, port):
        assert (host, port) == (COORDINATOR.host, COORDINATOR.bootstrap_port)
        return LoopbackPeer(answer)

    released: list = []
    watch = MembershipWatch(lambda: {g: set(m) for g, m in held.items()}, lambda g: COORDINATOR, connect,
                            lambda g, m: released.append((g, m)))
    await watch.check()
    assert asked == [["deleted", "live", "moved"]]  # one call per coordinator; groups with holders only
    assert released == [("live", "b"), ("deleted", "c")]  # a moved coordinator is asked next round

    async def refused(host, port):
        raise UpstreamError("connection refused")

    released.clear()
    await MembershipWatch(lambda: held, lambda g: COORDINATOR, refused, lambda g, m: released.append((g, m))).check()
    assert released == []  # an unreachable coordinator releases nothing


class KeptPeerClient:
    """A connection to another instance that can be closed by the far side or its SASL session end."""

    def __init__(self, number: int) -> None:
        self.number, self.closed, self.dropped_by_peer, self.expired = number, False, False, False

    async def call(self, request, *args):
        if self.closed or self.dropped_by_peer:
            raise UpstreamError("upstream closed the connection")
        if request == "fail":
            raise UpstreamError("broken mid-frame")
        if request == "hang":
            await trio.sleep_forever()
        return (self.number, request)

    def session_expired(self) -> bool:
        return self.expired

    async def aclose(self) -> None:
        self.closed = True


def kept_connections(idle_per_instance: int = 2) -> tuple[PeerConnections, list[KeptPeerClient]]:
    made: list[KeptPeerClient] = []

    async def connect(host: str, port: int) -> KeptPeerClient:
        made.append(KeptPeerClient(len(made)))
        return made[-1]

    return PeerConnections(connect, idle_per_instance), made


PEER = InstanceIdentity("ksp-1", 1, "b.local", 9092, 19000)
OTHER_PEER = InstanceIdentity("ksp-2", 2, "c.local", 9092, 19000)


async def test_calls_to_an_instance_reuse_one_connection_and_each_instance_has_its_own():
    pool, made = kept_connections()
    for _ in range(3):
        assert await call_peer(pool.connect, PEER, "describe", 1.0) == (0, "describe")
    assert await call_peer(pool.connect, OTHER_PEER, "describe", 1.0) == (1, "describe")
    assert pool.opened == 2 and not any(c.closed for c in made)
    await pool.aclose()
    assert all(c.closed for c in made)


async def test_a_failed_or_cancelled_call_closes_its_connection_and_the_next_call_opens_another():
    pool, made = kept_connections()
    with pytest.raises(UpstreamError):
        await call_peer(pool.connect, PEER, "fail", 1.0)
    with pytest.raises(trio.TooSlowError):
        await call_peer(pool.connect, PEER, "hang", 0.05)
    assert [c.closed for c in made] == [True, True]  # neither stream is left mid-frame for reuse
    assert await call_peer(pool.connect, PEER, "describe", 1.0) == (2, "describe")


async def test_a_kept_connection_closed_by_the_other_side_is_replaced_within_the_call():
    pool, made = kept_connections()
    await call_peer(pool.connect, PEER, "describe", 1.0)
    made[0].dropped_by_peer = True  # the other instance restarted while the connection was idle
    assert await call_peer(pool.connect, PEER, "describe", 1.0) == (1, "describe")
    assert made[0].closed and pool.opened == 2
    assert await call_peer(pool.connect, PEER, "describe", 1.0) == (1, "describe")  # the fresh one is kept


async def test_a_fresh_connection_that_fails_is_not_retried():
    pool, made = kept_connections()
    with pytest.raises(UpstreamError):
        await call_peer(pool.connect, PEER, "fail", 1.0)
    assert pool.opened == 1


async def test_a_connection_whose_sasl_session_ended_is_not_reused():
    pool, made = kept_connections()
    await call_peer(pool.connect, PEER, "describe", 1.0)
    made[0].expired = True
    assert await call_peer(pool.connect, PEER, "describe", 1.0) == (1, "describe")
    assert made[0].closed


async def test_concurrent_calls_take_separate_connections_and_at_most_the_idle_cap_is_kept():
    pool, made = kept_connections(idle_per_instance=2)
    clients = [await pool.connect(PEER.host, PEER.bootstrap_port) for _ in range(3)]
    for client in clients:
        await client.call("describe")
    for client in clients:
        await client.aclose()
    assert pool.opened == 3 and [c.closed for c in made] == [False, False, True]
