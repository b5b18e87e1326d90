"""Kafka's group admin RPCs on proxy share groups, request by request over real sockets.

ListGroups / DescribeGroups / ConsumerGroupDescribe / DeleteGroups mix the proxy's share groups
with the upstream broker's answer; Describe/Alter/DeleteShareGroupOffsets are served by the proxy.
Each answer is checked field by field against what Kafka's group coordinator gives.
"""

from __future__ import annotations

import uuid

import trio
from kio.index import load_request_schema

from integration.share.conftest import WireMember, durable_state, produce, wire_call, wire_client

NONE, UNKNOWN_TOPIC_OR_PARTITION, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP = 0, 3, 69, 68
GROUP_OPERATIONS = 3400  # READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS


async def call(bootstrap: str, api_key: int, version: int, **fields):
    return await wire_call(bootstrap, load_request_schema(api_key, version)(**fields))


async def version_up_to(bootstrap: str, api_key: int, wanted: int) -> int:
    """The highest version <= `wanted` the proxy advertises (Kafka 3.9 stops below 4.x's)."""
    async with wire_client(bootstrap) as client:
        return min(wanted, (await client.api_versions())[api_key][1])


def _schema_type(api_key: int, version: int, name: str) -> type:
    import sys

    return getattr(sys.modules[load_request_schema(api_key, version).__module__], name)


def alter_request(group: str, topic: str, offsets: dict[int, int]) -> dict:
    topic_type = _schema_type(91, 0, "AlterShareGroupOffsetsRequestTopic")
    partition_type = _schema_type(91, 0, "AlterShareGroupOffsetsRequestPartition")
    return {"group_id": group, "topics": (topic_type(topic_name=topic, partitions=tuple(
        partition_type(partition_index=p, start_offset=o) for p, o in offsets.items())),)}


def describe_offsets_request(group: str, topics: dict[str, tuple[int, ...]] | None, version: int = 1) -> dict:
    group_type = _schema_type(90, version, "DescribeShareGroupOffsetsRequestGroup")
    topic_type = _schema_type(90, version, "DescribeShareGroupOffsetsRequestTopic")
    described = None if topics is None else tuple(topic_type(topic_name=t, partitions=ps) for t, ps in topics.items())
    return {"groups": (group_type(group_id=group, topics=described),)}


def delete_offsets_request(group: str, *topics: str) -> dict:
    topic_type = _schema_type(92, 0, "DeleteShareGroupOffsetsRequestTopic")
    return {"group_id": group, "topics": tuple(topic_type(topic_name=t) for t in topics)}


def partitions_of(response) -> dict[tuple[str, int], tuple]:
    (group,) = response.groups
    return {(t.topic_name, int(p.partition_index)): (int(p.start_offset), int(p.leader_epoch),
                                                     int(getattr(p, "lag", -1)), int(p.error_code))
            for t in group.topics for p in t.partitions}


def test_share_group_is_listed_and_described_as_kafka_does(share_proxy, names, create_topic):
    proxy = share_proxy()
    topic = create_topic(names.topic)
    missing = f"nobody-{uuid.uuid4().hex[:8]}"

    async def scenario():
        member = await WireMember(proxy.bootstrap, names.group).connect()
        try:
            await member.join(topic)
            # ListGroups: type and state filters are case-insensitive (Kafka lower-cases both).
            listed = await call(proxy.bootstrap, 16, 5, states_filter=(" STABLE ",), types_filter=("Share",))
            assert [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in listed.groups
                    if g.group_id == names.group] == [(names.group, "share", "Stable", "share")]
            for states, types in ((("empty",), ()), ((), ("consumer",)), ((), ("no-such-type",))):
                listed = await call(proxy.bootstrap, 16, 5, states_filter=states, types_filter=types)
                assert names.group not in {g.group_id for g in listed.groups}, (states, types)
            listed = await call(proxy.bootstrap, 16, 3)
            assert [(g.group_id, g.protocol_type) for g in listed.groups if g.group_id == names.group] == [
                (names.group, "share")]

            # DescribeGroups: a share group is "not a classic group" (v6 error, earlier only Dead);
            # the other id is answered by the broker, in request order.
            version = await version_up_to(proxy.bootstrap, 15, 6)
            described = await call(proxy.bootstrap, 15, version, groups=(missing, names.group),
                                   include_authorized_operations=False)
            assert [g.group_id for g in described.groups] == [missing, names.group]
            if version >= 6:
                assert [(int(g.error_code), g.group_state) for g in described.groups] == [
                    (GROUP_ID_NOT_FOUND, "Dead"), (GROUP_ID_NOT_FOUND, "Dead")]
                assert described.groups[1].error_message == f"Group {names.group} is not a classic group."
            described = await call(proxy.bootstrap, 15, 5, groups=(names.group,), include_authorized_operations=False)
            assert [(int(g.error_code), g.group_state, g.protocol_type) for g in described.groups] == [(NONE, "Dead", "")]

            # v0: Kafka 3.9 serves only v0 (the proxy advertises the broker's range).
            described = await call(proxy.bootstrap, 69, 0, group_ids=(names.group,), include_authorized_operations=False)
            (group,) = described.groups
            assert (int(group.error_code), group.error_message) == (
                GROUP_ID_NOT_FOUND, f"Group {names.group} is not a consumer group.")

            # ShareGroupDescribe: authorized operations only when asked (no ACLs: all of a group's).
            asked = await call(proxy.bootstrap, 77, 1, group_ids=(names.group,), include_authorized_operations=True)
            not_asked = await call(proxy.bootstrap, 77, 1, group_ids=(names.group,), include_authorized_operations=False)
            assert int(asked.groups[0].authorized_operations) == GROUP_OPERATIONS
            assert int(not_asked.groups[0].authorized_operations) == -2147483648
            assert [m.member_id for m in asked.groups[0].members] == [member.member_id]
        finally:
            await member.aclose()

    trio.run(scenario)


def test_offsets_of_a_group_with_members_cannot_change(share_proxy, names, create_topic):
    proxy = share_proxy()
    topic = create_topic(names.topic)

    async def scenario():
        member = await WireMember(proxy.bootstrap, names.group).connect()
        try:
            await member.join(topic)
            altered = await call(proxy.bootstrap, 91, 0, **alter_request(names.group, topic, {0: 0}))
            assert (int(altered.error_code), altered.responses) == (NON_EMPTY_GROUP, ())
            deleted = await call(proxy.bootstrap, 92, 0, **delete_offsets_request(names.group, topic))
            assert (int(deleted.error_code), deleted.responses) == (NON_EMPTY_GROUP, ())
            removed = await call(proxy.bootstrap, 42, 2, groups_names=(names.group,))
            assert [(r.group_id, int(r.error_code)) for r in removed.results] == [(names.group, NON_EMPTY_GROUP)]
        finally:
            await member.aclose()

    trio.run(scenario)


def test_alter_creates_the_group_describe_reports_lag_delete_tombstones(share_proxy, names, create_topic):
    proxy = share_proxy()
    topic = create_topic(names.topic, partitions=2)
    produce(proxy.bootstrap, topic, 20, partitions=2)  # 10 records per partition
    other = f"nobody-{uuid.uuid4().hex[:8]}"

    async def scenario():
        # Unknown groups: no offsets (an empty answer, as Kafka), nothing to delete.
        described = await call(proxy.bootstrap, 90, 1, **describe_offsets_request(names.group, None))
        assert (int(described.groups[0].error_code), described.groups[0].topics) == (NONE, ())
        deleted = await call(proxy.bootstrap, 92, 0, **delete_offsets_request(names.group, topic))
        assert int(deleted.error_code) == GROUP_ID_NOT_FOUND

        # Alter on an unknown group creates it (Kafka's getOrMaybeCreateShareGroup(id, true)).
        altered = await call(proxy.bootstrap, 91, 0, **alter_request(names.group, topic, {0: 3, 1: 7, 5: 0}))
        assert int(altered.error_code) == NONE
        (result,) = altered.responses
        assert {int(p.partition_index): int(p.error_code) for p in result.partitions} == {
            0: NONE, 1: NONE, 5: UNKNOWN_TOPIC_OR_PARTITION}
        unknown = await call(proxy.bootstrap, 91, 0, **alter_request(names.group, "no-such-topic", {0: 0}))
        assert [int(p.error_code) for p in unknown.responses[0].partitions] == [UNKNOWN_TOPIC_OR_PARTITION]
        state = await call(proxy.bootstrap, 77, 1, group_ids=(names.group,), include_authorized_operations=False)
        assert (int(state.groups[0].error_code), state.groups[0].group_state) == (NONE, "Empty")

        # v1: lag = end 10 - start; v0 has no lag. Null topics = the initialised partitions.
        everything = await call(proxy.bootstrap, 90, 1, **describe_offsets_request(names.group, None))
        assert partitions_of(everything) == {(topic, 0): (3, 0, 7, NONE), (topic, 1): (7, 0, 3, NONE)}
        v0 = await call(proxy.bootstrap, 90, 0, **describe_offsets_request(names.group, {topic: (0,)}, version=0))
        assert {tp: row[:2] for tp, row in partitions_of(v0).items()} == {(topic, 0): (3, 0)}
        named = await call(proxy.bootstrap, 90, 1, **describe_offsets_request(
            names.group, {topic: (1, 4), "no-such-topic": (0,)}))
        assert partitions_of(named) == {(topic, 1): (7, 0, 3, NONE), (topic, 4): (-1, 0, -1, NONE),
                                        ("no-such-topic", 0): (-1, 0, -1, NONE)}

        # The altered state is durable on the state topic.
        durable = durable_state(proxy.upstream, proxy.state_topic, names.group)
        assert {p: s.start_offset for p, s in durable.items()} == {0: 3, 1: 7}

        # DeleteShareGroupOffsets: an unknown topic is reported per topic; the topic's state goes.
        deleted = await call(proxy.bootstrap, 92, 0, **delete_offsets_request(names.group, topic, "no-such-topic"))
        assert int(deleted.error_code) == NONE
        assert {t.topic_name: int(t.error_code) for t in deleted.responses} == {
            topic: NONE, "no-such-topic": UNKNOWN_TOPIC_OR_PARTITION}
        again = await call(proxy.bootstrap, 92, 0, **delete_offsets_request(names.group, topic))
        assert [(t.error_code, t.error_message) for t in again.responses] == [
            (UNKNOWN_TOPIC_OR_PARTITION, "There is no offset information to delete.")]
        everything = await call(proxy.bootstrap, 90, 1, **describe_offsets_request(names.group, None))
        assert everything.groups[0].topics == ()

        # DeleteGroups mixing a share group and an id the broker answers for.
        await call(proxy.bootstrap, 91, 0, **alter_request(names.group, topic, {0: 1}))
        removed = await call(proxy.bootstrap, 42, 2, groups_names=(other, names.group))
        assert [(r.group_id, int(r.error_code)) for r in removed.results] == [
            (other, GROUP_ID_NOT_FOUND), (names.group, NONE)]
        state = await call(proxy.bootstrap, 77, 1, group_ids=(names.group,), include_authorized_operations=False)
        assert int(state.groups[0].error_code) == GROUP_ID_NOT_FOUND

    trio.run(scenario)
    # Tombstoned: nothing of the group survives a restart.
    assert durable_state(proxy.upstream, proxy.state_topic, names.group) == {}
    proxy.restart()

    async def after_restart():
        state = await call(proxy.bootstrap, 77, 1, group_ids=(names.group,), include_authorized_operations=False)
        assert int(state.groups[0].error_code) == GROUP_ID_NOT_FOUND

    trio.run(after_restart)
