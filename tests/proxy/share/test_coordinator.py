"""Tests for proxy/share/coordinator.py: ShareGroupHeartbeat / ShareGroupDescribe decisions."""

from __future__ import annotations

import io
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from proxy.share.coordinator import (
    AssignmentChanged,
    AutoOffsetReset,
    CoordinatorConfig,
    DepartReason,
    GroupConfigError,
    GroupEpochBumped,
    GroupState,
    MemberDeparted,
    PartitionsDeleted,
    PartitionsToInitialize,
    ShareGroupConfig,
    ShareGroupCoordinator,
    ShareGroupLimits,
    TopicInfo,
    describe_response,
    heartbeat_response,
    parse_auto_offset_reset,
)

ORDERS = TopicInfo("orders", uuid.UUID(int=1), 3)
AUDIT = TopicInfo("audit", uuid.UUID(int=2), 1)


def events_of(result_or_events, kind):
    events = getattr(result_or_events, "events", result_or_events)
    return [e for e in events if isinstance(e, kind)]


@pytest.fixture
def coord() -> ShareGroupCoordinator:
    c = ShareGroupCoordinator()
    c.update_topic_metadata([ORDERS, AUDIT], now_ms=0)
    return c


def join(coord, member, now=0, topics=("orders",), group="g", **kw):
    result = coord.heartbeat(group, member, 0, now, subscribed_topic_names=topics, **kw)
    assert result.ok, result
    return result


# -- request validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "member", "epoch", "rack", "topics", "message"),
    [
        ("g", "", 0, None, ["orders"], "MemberId can't be empty."),
        ("g", "  ", 0, None, ["orders"], "MemberId can't be empty."),
        ("", "m", 0, None, ["orders"], "GroupId can't be empty."),
        ("g", "m", 0, " ", ["orders"], "RackId can't be empty."),
        ("g", "m", 0, None, None, "SubscribedTopicNames must be set in first request."),
        ("g", "m", 0, None, [], "SubscribedTopicNames must be set in first request."),
        ("g", "m", -2, None, None, "MemberEpoch is invalid."),
    ],
)
def test_invalid_requests(coord, group, member, epoch, rack, topics, message):
    result = coord.heartbeat(group, member, epoch, 0, rack_id=rack, subscribed_topic_names=topics)
    assert result.error_code is ErrorCode.invalid_request
    assert result.error_message == message
    assert result.member_id is None
    assert not coord.has_group("g") or coord.group_state("g") is GroupState.EMPTY


# -- join ----------------------------------------------------------------------------------


def test_first_join_creates_group_and_assigns_everything(coord):
    result = join(coord, "m1", client_id="cli", client_host="/10.0.0.1")
    assert result.member_id == "m1"
    assert result.member_epoch == 1
    assert result.heartbeat_interval_ms == 5000
    assert result.assignment == {ORDERS.topic_id: (0, 1, 2)}
    assert events_of(result, GroupEpochBumped) == [GroupEpochBumped("g", 1)]
    [init] = events_of(result, PartitionsToInitialize)
    assert init.partitions == {(ORDERS.topic_id, p) for p in range(3)}
    [changed] = events_of(result, AssignmentChanged)
    assert changed.added == changed.assigned and changed.removed == frozenset()
    assert coord.group_state("g") is GroupState.STABLE


def test_join_to_unknown_topic_gets_empty_assignment_until_it_exists(coord):
    result = join(coord, "m1", topics=("later",))
    assert result.assignment == {}
    later = TopicInfo("later", uuid.UUID(int=3), 2)
    events = coord.update_topic_metadata([ORDERS, AUDIT, later], now_ms=10)
    assert GroupEpochBumped("g", 2) in events
    beat = coord.heartbeat("g", "m1", 1, 20)
    assert beat.member_epoch == 2
    assert beat.assignment == {later.topic_id: (0, 1)}


def test_second_member_bumps_epochs_and_first_member_reconciles(coord):
    join(coord, "m1")
    second = join(coord, "m2", now=5)
    assert second.member_epoch == 2
    first = coord.heartbeat("g", "m1", 1, 10)
    assert first.member_epoch == 2
    assert first.assignment is not None
    combined = set(first.assignment[ORDERS.topic_id]) | set(second.assignment[ORDERS.topic_id])
    assert combined == {0, 1, 2}
    [changed] = events_of(first, AssignmentChanged)
    assert changed.member_id == "m1" and changed.removed


def test_more_members_than_partitions_all_get_work(coord):
    epochs = {f"m{i}": join(coord, f"m{i}", topics=("audit",)).member_epoch for i in range(5)}
    for member, epoch in epochs.items():
        assert coord.heartbeat("g", member, epoch, 1).member_epoch == 5
    described = coord.describe(["g"])[0]
    assert all(m.assignment == {AUDIT.topic_id: ("audit", (0,))} for m in described.members)


def test_known_member_rejoining_with_epoch_zero_gets_its_state(coord):
    join(coord, "m1")
    join(coord, "m2")
    coord.heartbeat("g", "m1", 1, 1)  # m1 now at epoch 2, previous 1
    join(coord, "m3")  # epoch 3: m1 is at 2, previous 1
    again = coord.heartbeat("g", "m1", 0, 2, subscribed_topic_names=["orders"])
    assert again.ok
    assert again.member_epoch == 3
    assert again.assignment is not None


def test_group_max_size(coord):
    small = ShareGroupCoordinator(CoordinatorConfig(max_group_size=2))
    small.update_topic_metadata([ORDERS], 0)
    join(small, "a")
    join(small, "b")
    full = small.heartbeat("g", "c", 0, 0, subscribed_topic_names=["orders"])
    assert full.error_code is ErrorCode.group_max_size_reached
    assert small.heartbeat("g", "a", 0, 0, subscribed_topic_names=["orders"]).ok  # existing member


def test_group_of_another_type_is_refused(coord):
    result = coord.heartbeat("cg", "m", 0, 0, subscribed_topic_names=["orders"], group_is_other_type=True)
    assert result.error_code is ErrorCode.group_id_not_found
    assert result.error_message == "Group cg is not a share group."
    assert not coord.has_group("cg")


# -- heartbeat and fencing -----------------------------------------------------------------


def test_steady_heartbeat_sends_no_assignment(coord):
    join(coord, "m1")
    beat = coord.heartbeat("g", "m1", 1, 100)
    assert beat.ok and beat.member_epoch == 1 and beat.assignment is None and beat.events == ()


def test_full_request_always_gets_the_assignment(coord):
    join(coord, "m1")
    beat = coord.heartbeat("g", "m1", 1, 100, subscribed_topic_names=["orders"])
    assert beat.assignment == {ORDERS.topic_id: (0, 1, 2)}
    assert not events_of(beat, GroupEpochBumped)  # same subscription: no rebalance


def test_heartbeat_to_unknown_group(coord):
    result = coord.heartbeat("nope", "m1", 3, 0)
    assert result.error_code is ErrorCode.group_id_not_found


def test_heartbeat_from_unknown_member(coord):
    join(coord, "m1")
    result = coord.heartbeat("g", "ghost", 1, 0)
    assert result.error_code is ErrorCode.unknown_member_id
    assert result.error_message == "Member ghost is not a member of group g."


def test_epoch_ahead_is_fenced(coord):
    join(coord, "m1")
    result = coord.heartbeat("g", "m1", 7, 0)
    assert result.error_code is ErrorCode.fenced_member_epoch
    assert "greater member epoch (7)" in result.error_message


def test_previous_epoch_is_accepted_older_is_fenced(coord):
    join(coord, "m1")
    join(coord, "m2")
    assert coord.heartbeat("g", "m1", 1, 1).member_epoch == 2  # previous epoch 1 now
    assert coord.heartbeat("g", "m1", 1, 2).ok  # lost response: previous epoch still fine
    join(coord, "m3")
    assert coord.heartbeat("g", "m1", 2, 3).member_epoch == 3  # previous 2
    fenced = coord.heartbeat("g", "m1", 1, 4)
    assert fenced.error_code is ErrorCode.fenced_member_epoch
    assert "smaller member epoch (1)" in fenced.error_message


def test_rack_and_client_are_recorded(coord):
    join(coord, "m1", rack_id="r1", client_id="c1", client_host="/h")
    coord.heartbeat("g", "m1", 1, 1)  # nulls mean unchanged
    [member] = coord.describe(["g"])[0].members
    assert (member.rack_id, member.client_id, member.client_host) == ("r1", "c1", "/h")


# -- subscription changes ------------------------------------------------------------------


def test_subscription_change_bumps_and_reassigns(coord):
    join(coord, "m1")
    beat = coord.heartbeat("g", "m1", 1, 10, subscribed_topic_names=["orders", "audit"])
    assert beat.member_epoch == 2
    assert beat.assignment == {AUDIT.topic_id: (0,), ORDERS.topic_id: (0, 1, 2)}
    [init] = events_of(beat, PartitionsToInitialize)
    assert init.partitions == {(AUDIT.topic_id, 0)}
    narrowed = coord.heartbeat("g", "m1", 2, 20, subscribed_topic_names=["audit"])
    assert narrowed.assignment == {AUDIT.topic_id: (0,)}


# -- leave and session timeout -------------------------------------------------------------


def test_leave_removes_member_and_reports_departure(coord):
    join(coord, "m1")
    join(coord, "m2")
    assert coord.heartbeat("g", "m1", 1, 5).assignment != {ORDERS.topic_id: (0, 1, 2)}
    left = coord.heartbeat("g", "m2", -1, 10)
    assert left.ok and left.member_id == "m2" and left.member_epoch == -1
    assert left.heartbeat_interval_ms == 0 and left.assignment is None
    [departed] = events_of(left, MemberDeparted)
    assert departed.reason is DepartReason.LEFT and departed.member_id == "m2"
    assert events_of(left, GroupEpochBumped) == [GroupEpochBumped("g", 3)]
    beat = coord.heartbeat("g", "m1", 2, 20)
    assert beat.member_epoch == 3 and beat.assignment == {ORDERS.topic_id: (0, 1, 2)}


def test_last_member_leaving_empties_the_group(coord):
    join(coord, "m1")
    coord.heartbeat("g", "m1", -1, 1)
    assert coord.group_state("g") is GroupState.EMPTY
    assert coord.list_groups() == [("g", GroupState.EMPTY)]


def test_leave_errors(coord):
    assert coord.heartbeat("nope", "m", -1, 0).error_code is ErrorCode.group_id_not_found
    join(coord, "m1")
    assert coord.heartbeat("g", "ghost", -1, 0).error_code is ErrorCode.unknown_member_id


def test_session_timeout_expires_silent_members(coord):
    join(coord, "m1", now=0)
    join(coord, "m2", now=1000)
    assert coord.next_deadline() == 45_000
    assert coord.expire(44_999) == []
    events = coord.expire(45_000)
    [departed] = events_of(events, MemberDeparted)
    assert departed.member_id == "m1" and departed.reason is DepartReason.SESSION_TIMEOUT
    assert departed.assigned
    assert coord.next_deadline() == 46_000
    assert coord.heartbeat("g", "m1", 2, 45_001).error_code is ErrorCode.unknown_member_id


def test_heartbeat_extends_the_session(coord):
    join(coord, "m1", now=0)
    coord.heartbeat("g", "m1", 1, 40_000)
    assert coord.expire(45_000) == []
    assert coord.next_deadline() == 85_000


def test_no_members_no_deadline():
    assert ShareGroupCoordinator().next_deadline() is None


def test_group_config_overrides_heartbeat_and_session(coord):
    coord.set_group_config("g", {"share.heartbeat.interval.ms": "6000", "share.session.timeout.ms": 50_000})
    result = join(coord, "m1", now=0)
    assert result.heartbeat_interval_ms == 6000
    assert coord.next_deadline() == 50_000
    assert coord.group_config("other") == ShareGroupConfig()


# -- metadata refresh ----------------------------------------------------------------------


def test_partition_increase_bumps_and_initialises_new_partitions(coord):
    join(coord, "m1")
    grown = TopicInfo("orders", ORDERS.topic_id, 5)
    events = coord.update_topic_metadata([grown, AUDIT], now_ms=10)
    assert GroupEpochBumped("g", 2) in events
    [init] = events_of(events, PartitionsToInitialize)
    assert init.partitions == {(ORDERS.topic_id, 3), (ORDERS.topic_id, 4)}
    beat = coord.heartbeat("g", "m1", 1, 20)
    assert beat.assignment == {ORDERS.topic_id: (0, 1, 2, 3, 4)}


def test_unrelated_metadata_change_does_not_bump(coord):
    join(coord, "m1")
    events = coord.update_topic_metadata([ORDERS, AUDIT, TopicInfo("x", uuid.UUID(int=5), 9)], now_ms=10)
    assert not events_of(events, GroupEpochBumped)


def test_deleted_topic_is_reported_and_unassigned(coord):
    join(coord, "m1")
    coord.mark_initialized("g", [(ORDERS.topic_id, p) for p in range(3)])
    events = coord.update_topic_metadata([AUDIT], now_ms=10)
    [deleted] = events_of(events, PartitionsDeleted)
    assert deleted.partitions == {(ORDERS.topic_id, p) for p in range(3)}
    assert coord.initialized_partitions("g") == frozenset()
    assert coord.heartbeat("g", "m1", 1, 20).assignment == {}


def test_recreated_topic_gets_a_fresh_assignment(coord):
    join(coord, "m1")
    recreated = TopicInfo("orders", uuid.UUID(int=99), 2)
    events = coord.update_topic_metadata([recreated, AUDIT], now_ms=10)
    assert events_of(events, PartitionsDeleted)
    assert coord.heartbeat("g", "m1", 1, 20).assignment == {recreated.topic_id: (0, 1)}


def test_heartbeat_can_carry_metadata(coord):
    join(coord, "m1")
    beat = coord.heartbeat("g", "m1", 1, 10, topic_metadata=[TopicInfo("orders", ORDERS.topic_id, 4), AUDIT])
    assert beat.member_epoch == 2 and beat.assignment == {ORDERS.topic_id: (0, 1, 2, 3)}


# -- share-partition initialisation --------------------------------------------------------


def test_initialisation_is_requested_once_then_retried_after_interval(coord):
    join(coord, "m1", now=0)
    join(coord, "m2", now=1)  # epoch bump within the retry interval: no new request
    assert not events_of(coord.update_topic_metadata([ORDERS, AUDIT], now_ms=2), PartitionsToInitialize)
    retried = events_of(coord.update_topic_metadata([ORDERS, AUDIT], now_ms=30_000), PartitionsToInitialize)
    assert retried and retried[0].partitions == {(ORDERS.topic_id, p) for p in range(3)}
    coord.mark_initialized("g", retried[0].partitions)
    assert coord.initialized_partitions("g") == retried[0].partitions
    assert not events_of(coord.update_topic_metadata([ORDERS, AUDIT], now_ms=90_000), PartitionsToInitialize)


def test_failed_initialisation_is_asked_again(coord):
    join(coord, "m1", now=0)
    coord.initialization_failed("g", [(ORDERS.topic_id, 0)])
    [again] = events_of(coord.update_topic_metadata([ORDERS, AUDIT], now_ms=1), PartitionsToInitialize)
    assert again.partitions == {(ORDERS.topic_id, 0)}


# -- describe, list, delete, restore -------------------------------------------------------


def test_describe(coord):
    join(coord, "m1", client_id="c", client_host="/h", rack_id="r")
    [group, missing] = coord.describe(["g", "missing"])
    assert (group.group_state, group.group_epoch, group.assignment_epoch, group.assignor_name) == (
        "Stable", 1, 1, "simple",
    )
    [member] = group.members
    assert member.subscribed_topic_names == ("orders",)
    assert member.assignment == {ORDERS.topic_id: ("orders", (0, 1, 2))}
    assert missing.error_code is ErrorCode.group_id_not_found


def test_delete_group(coord):
    join(coord, "m1")
    assert coord.delete_group("g") == (ErrorCode.non_empty_group, [])
    coord.mark_initialized("g", [(ORDERS.topic_id, 0)])
    coord.heartbeat("g", "m1", -1, 1)
    code, events = coord.delete_group("g")
    assert code is ErrorCode.none
    assert events == [PartitionsDeleted("g", frozenset({(ORDERS.topic_id, 0)}))]
    assert coord.group_state("g") is GroupState.DEAD
    assert coord.delete_group("g")[0] is ErrorCode.group_id_not_found


def test_restore_group_keeps_epoch_and_initialised_partitions(coord):
    coord.restore_group(
        "g", group_epoch=7, initialized=[(ORDERS.topic_id, p) for p in range(3)],
        config_overrides={"share.delivery.count.limit": "3"},
    )
    assert coord.group_state("g") is GroupState.EMPTY
    result = join(coord, "m1")
    assert result.member_epoch == 8
    assert not events_of(result, PartitionsToInitialize)
    assert coord.group_config("g").delivery_count_limit == 3


# -- group configs -------------------------------------------------------------------------


def test_group_config_defaults_match_kafka():
    config = ShareGroupConfig()
    assert (config.session_timeout_ms, config.heartbeat_interval_ms, config.record_lock_duration_ms) == (
        45_000, 5_000, 30_000,
    )
    assert (config.delivery_count_limit, config.partition_max_record_locks) == (5, 2_000)
    assert str(config.auto_offset_reset) == "latest"
    assert config.validate() is config


@pytest.mark.parametrize(
    "overrides",
    [
        {"share.session.timeout.ms": "44999"},
        {"share.session.timeout.ms": "60001"},
        {"share.heartbeat.interval.ms": "4999"},
        {"share.heartbeat.interval.ms": "15001"},
        {"share.record.lock.duration.ms": "14999"},
        {"share.delivery.count.limit": "1"},
        {"share.delivery.count.limit": "11"},
        {"share.partition.max.record.locks": "99"},
        {"share.isolation.level": "dirty"},
        {"share.auto.offset.reset": "sometimes"},
        {"share.auto.offset.reset": "by_duration:-PT1S"},
        {"share.unknown": "1"},
        {"share.delivery.count.limit": "five"},
    ],
)
def test_invalid_group_configs_are_refused_without_change(coord, overrides):
    with pytest.raises(GroupConfigError):
        coord.set_group_config("g", overrides)
    assert coord.group_config("g") == ShareGroupConfig()


def test_session_timeout_must_exceed_heartbeat_interval():
    limits = ShareGroupLimits(min_session_timeout_ms=1000, min_heartbeat_interval_ms=1000)
    with pytest.raises(GroupConfigError):
        ShareGroupConfig(session_timeout_ms=5000, heartbeat_interval_ms=5000).validate(limits)


def test_overrides_merge_and_none_removes(coord):
    coord.set_group_config("g", {"share.delivery.count.limit": "3"})
    coord.set_group_config("g", {"share.record.lock.duration.ms": 20_000})
    config = coord.group_config("g")
    assert (config.delivery_count_limit, config.record_lock_duration_ms) == (3, 20_000)
    coord.set_group_config("g", {"share.delivery.count.limit": None})
    assert coord.group_config("g").delivery_count_limit == 5
    assert coord.group_config_overrides("g") == {"share.record.lock.duration.ms": 20_000}
    assert not coord.has_group("g")  # configs do not create groups


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest", AutoOffsetReset("latest")),
        ("EARLIEST", AutoOffsetReset("earliest")),
        ("by_duration:PT1H", AutoOffsetReset("by_duration", 3_600_000)),
        ("by_duration:P1DT2M3.5S", AutoOffsetReset("by_duration", 86_400_000 + 123_500)),
        ("by_duration:PT0S", AutoOffsetReset("by_duration", 0)),
    ],
)
def test_auto_offset_reset_parsing(text, expected):
    assert parse_auto_offset_reset(text) == expected


@pytest.mark.parametrize("text", ["by_duration:", "by_duration:P", "by_duration:PT", "by_duration:1H", "none"])
def test_auto_offset_reset_rejects(text):
    with pytest.raises(GroupConfigError):
        parse_auto_offset_reset(text)


# -- kio edges -----------------------------------------------------------------------------


def roundtrip(entity):
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    data = buffer.getvalue()
    value, consumed = entity_reader(type(entity))(data, 0)
    assert consumed == len(data)
    return value


def test_heartbeat_response_maps_to_kio(coord):
    response = heartbeat_response(join(coord, "m1"))
    assert roundtrip(response) == response
    assert response.member_epoch == 1
    assert response.assignment is not None
    assert [tuple(tp.partitions) for tp in response.assignment.topic_partitions] == [(0, 1, 2)]
    error = heartbeat_response(coord.heartbeat("g", "", 0, 0))
    assert error.error_code is ErrorCode.invalid_request and error.assignment is None


def test_describe_response_maps_to_kio(coord):
    join(coord, "m1", client_id="c", client_host="/h")
    response = describe_response(coord.describe(["g", "missing"]))
    assert roundtrip(response) == response
    assert [g.group_state for g in response.groups] == ["Stable", "Dead"]


# -- properties ----------------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["join", "beat", "stale", "leave", "tick", "resub"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(0, 20_000),
    ),
    max_size=60,
)


@settings(max_examples=200)
@given(OPS)
def test_membership_invariants_under_random_traffic(ops):
    coord = ShareGroupCoordinator()
    coord.update_topic_metadata([ORDERS, AUDIT], 0)
    now = 0
    epochs: dict[str, int] = {}
    last_group_epoch = 0
    for op, member, step in ops:
        now += step
        if op == "join":
            result = coord.heartbeat("g", member, 0, now, subscribed_topic_names=["orders"])
        elif op == "resub":
            result = coord.heartbeat(
                "g", member, epochs.get(member, 0), now, subscribed_topic_names=["orders", "audit"]
            )
        elif op == "beat":
            result = coord.heartbeat("g", member, epochs.get(member, 5), now)
        elif op == "stale":
            result = coord.heartbeat("g", member, epochs.get(member, 5) + 1, now)
            assert result.error_code in (
                ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id, ErrorCode.group_id_not_found,
            )
            continue
        elif op == "leave":
            result = coord.heartbeat("g", member, -1, now)
            epochs.pop(member, None)
            continue
        else:
            for event in coord.expire(now):
                if isinstance(event, MemberDeparted):
                    epochs.pop(event.member_id, None)
            continue
        if result.ok:
            epochs[member] = result.member_epoch
        [group] = coord.describe(["g"]) if coord.has_group("g") else [None]
        if group is None:
            continue
        assert group.group_epoch >= last_group_epoch
        last_group_epoch = group.group_epoch
        assert group.assignment_epoch == group.group_epoch
        assert all(m.member_epoch <= group.assignment_epoch for m in group.members)
        assert {m.member_id for m in group.members} == set(epochs)
        assert group.group_state == ("Stable" if group.members else "Empty")


# -- purity --------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["coordinator", "sessions", "assignor"])
def test_core_modules_import_no_io(module):
    """The decision cores stay pure: no trio, sockets, threads or Kafka clients (direct imports)."""
    import ast
    import pathlib

    import proxy.share

    source = pathlib.Path(proxy.share.__file__).with_name(f"{module}.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"trio", "socket", "threading", "confluent_kafka", "time", "asyncio"}


def test_admin_lifecycle_create_empty_forget_topic_and_delete_drops_configs():
    from proxy.share.coordinator import GroupEpochBumped

    coordinator = ShareGroupCoordinator()
    assert coordinator.create_empty_group("admin") == [GroupEpochBumped("admin", 0)]
    assert coordinator.create_empty_group("admin") == []
    topic_a, topic_b = uuid.uuid4(), uuid.uuid4()
    coordinator.mark_initialized("admin", [(topic_a, 0), (topic_a, 1), (topic_b, 0)])
    coordinator.set_group_config("admin", {"share.record.lock.duration.ms": 20_000})

    assert coordinator.forget_topic("admin", topic_a) == {(topic_a, 0), (topic_a, 1)}
    assert coordinator.initialized_partitions("admin") == {(topic_b, 0)}
    code, _ = coordinator.delete_group("admin")
    assert code is ErrorCode.none
    assert coordinator.group_config_overrides("admin") == {}
