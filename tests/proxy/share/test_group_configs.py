"""Group-config routes on a real connection loop (in-memory client and fake broker).

What reaches the fake broker and what the client gets back are decoded with kio: the proxy's group
resources are answered here, everything else is forwarded, mixed requests are split and merged,
and the state-topic guard composes with the group-config route.
"""

from __future__ import annotations

import datetime

import pytest
import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from proxy.share.coordinator import ShareGroupCoordinator
from proxy.share.group_configs import (
    ALTER_CONFIGS,
    DESCRIBE_CONFIGS,
    GROUP_RESOURCE,
    INCREMENTAL_ALTER_CONFIGS,
    GroupConfigs,
    group_config_routes,
)
from proxy.share.state_topic_guard import TOPIC_RESOURCE, state_topic_routes
from tests.proxy.share.test_state_topic_guard import (
    STATE,
    TOPICS,
    decode_request,
    decode_response,
    frame_of,
    item,
    response_frame,
)
from tests.proxy.test_connection import Harness

SET, DELETE = 0, 1


class FakeCommits:
    """Group records are 'written' when the test says so."""

    def __init__(self) -> None:
        self.queued: list[tuple[bytes, bytes | None]] = []
        self.written = trio.Event()

    def queue_group_records(self, records) -> int:
        self.queued.extend(records)
        return len(self.queued)

    async def group_records_durable(self, ticket: int) -> None:
        await self.written.wait()


class Upstream:
    def __init__(self, groups: dict[str, str] | None = None) -> None:
        self.groups = groups or {}
        self.asked: list[str] = []

    async def __call__(self, group_id: str) -> str | None:
        self.asked.append(group_id)
        return self.groups.get(group_id)


def harness(coordinator=None, upstream=None, commits=None, *, guard=False):
    coordinator = coordinator or ShareGroupCoordinator()
    commits = commits or FakeCommits()
    configs = GroupConfigs(coordinator, commits, upstream or Upstream(), write_timeout_s=5)
    routes = group_config_routes(configs, {})
    if guard:
        routes.update(state_topic_routes(TOPICS, routes))
    return Harness(routes=routes, max_frame_size=1 << 20), coordinator, commits


def alter_request(resources, validate_only=False, version=1):
    cls = load_request_schema(INCREMENTAL_ALTER_CONFIGS, version)
    resource_type = item(cls, "resources")
    config_type = item(resource_type, "configs")
    return cls(resources=tuple(
        resource_type(resource_type=t, resource_name=n,
                      configs=tuple(config_type(name=k, config_operation=op, value=v) for k, op, v in ops))
        for t, n, ops in resources), validate_only=validate_only)


def describe_request(resources, version=4):
    cls = load_request_schema(DESCRIBE_CONFIGS, version)
    resource_type = item(cls, "resources")
    values = {"resources": tuple(resource_type(resource_type=t, resource_name=n, configuration_keys=keys)
                                 for t, n, keys in resources)}
    if version >= 1:
        values["include_synonyms"] = True
    if version >= 3:
        values["include_documentation"] = True
    return cls(**values)


def alter_answer(version, resources):
    cls = load_response_schema(INCREMENTAL_ALTER_CONFIGS, version)
    entry = item(cls, "responses")
    return cls(throttle_time=datetime.timedelta(0), responses=tuple(
        entry(error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type,
              resource_name=r.resource_name) for r in resources))


def describe_answer(version, resources):
    cls = load_response_schema(DESCRIBE_CONFIGS, version)
    result = item(cls, "results")
    return cls(throttle_time=datetime.timedelta(0), results=tuple(
        result(error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type,
               resource_name=r.resource_name, configs=()) for r in resources))


def by_resource(entries):
    return {(int(e.resource_type), e.resource_name): e for e in entries}


async def test_describe_of_a_share_group_is_answered_by_the_proxy_with_sources():
    h, coordinator, _ = harness()
    coordinator.set_group_config("sg", {"share.delivery.count.limit": "3"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(describe_request([(GROUP_RESOURCE, "sg", None)])))
        answer = decode_response(DESCRIBE_CONFIGS, 4, await h.client.receive_frame())
        assert h.broker is None  # nothing went upstream
        (result,) = answer.results
        configs = {c.name: c for c in result.configs}
        # Kafka's seven share.* configs, the three share.in.progress.* ones and KIP-1191's two errors.deadletterqueue.*
        assert len(configs) == 12
        limit = configs["share.delivery.count.limit"]
        assert (limit.value, int(limit.config_source), int(limit.config_type)) == ("3", 8, 3)
        assert [(s.name, s.value, int(s.source)) for s in limit.synonyms] == [
            ("share.delivery.count.limit", "3", 8), ("group.share.delivery.count.limit", "5", 5)]
        assert configs["share.isolation.level"].documentation
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("version", [1, 2, 3, 4])
async def test_describe_mixing_a_topic_and_a_share_group_is_split_and_merged(version):
    h, coordinator, _ = harness()
    coordinator.set_group_config("sg", {"share.isolation.level": "read_committed"})
    request = describe_request([(TOPIC_RESOURCE, "orders", None), (GROUP_RESOURCE, "sg", ("share.isolation.level",)),
                                (GROUP_RESOURCE, "consumers", None)], version)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        upstream = decode_request(DESCRIBE_CONFIGS, await h.broker_receive())
        assert [r.resource_name for r in upstream.resources] == ["orders", "consumers"]
        await h.broker.send_frame(response_frame(describe_answer(version, upstream.resources)))
        answer = by_resource(decode_response(DESCRIBE_CONFIGS, version, await h.client.receive_frame()).results)
        assert set(answer) == {(TOPIC_RESOURCE, "orders"), (GROUP_RESOURCE, "sg"), (GROUP_RESOURCE, "consumers")}
        (entry,) = answer[(GROUP_RESOURCE, "sg")].configs
        assert (entry.name, entry.value) == ("share.isolation.level", "read_committed")
        nursery.cancel_scope.cancel()


async def test_alter_of_an_upstream_consumer_group_is_forwarded_byte_for_byte():
    upstream = Upstream({"consumers": "consumer"})
    h, coordinator, commits = harness(upstream=upstream)
    sent = frame_of(alter_request([(GROUP_RESOURCE, "consumers", [("share.session.timeout.ms", SET, "50000")])]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        assert upstream.asked == ["consumers"]
        assert commits.queued == [] and coordinator.group_config_overrides("consumers") == {}
        nursery.cancel_scope.cancel()


async def test_consumer_keys_on_an_unknown_group_pass_without_asking_upstream():
    upstream = Upstream()
    h, _, _ = harness(upstream=upstream)
    sent = frame_of(alter_request([(GROUP_RESOURCE, "new", [("consumer.session.timeout.ms", SET, "50000")])]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        assert upstream.asked == []
        nursery.cancel_scope.cancel()


async def test_share_keys_on_a_new_group_id_are_kept_and_answered_once_durable():
    h, coordinator, commits = harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(alter_request(
            [(GROUP_RESOURCE, "fresh", [("share.auto.offset.reset", SET, "earliest")])])))
        await trio.testing.wait_all_tasks_blocked()
        # Applied at once (in request order), but not answered before the record is durable.
        assert str(coordinator.group_config("fresh").auto_offset_reset) == "earliest"
        assert not coordinator.has_group("fresh")
        assert len(commits.queued) == 1
        with trio.move_on_after(0.2):
            await h.client.receive_frame()
            pytest.fail("answered before the config record was durable")
        commits.written.set()
        answer = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame())
        assert [(r.resource_name, r.error_code) for r in answer.responses] == [("fresh", ErrorCode.none)]
        nursery.cancel_scope.cancel()


async def test_invalid_and_validate_only_alterations_write_nothing():
    h, coordinator, commits = harness()
    coordinator.set_group_config("sg", {"share.delivery.count.limit": "3"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(alter_request(
            [(GROUP_RESOURCE, "sg", [("share.delivery.count.limit", SET, "11")])])))
        (refused,) = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame()).responses
        assert refused.error_code == ErrorCode.invalid_config
        assert "group.share.max.delivery.count.limit (10)" in refused.error_message
        await h.client.send_frame(frame_of(alter_request(
            [(GROUP_RESOURCE, "sg", [("share.delivery.count.limit", DELETE, None)])], validate_only=True)))
        (checked,) = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame()).responses
        assert checked.error_code == ErrorCode.none
        assert coordinator.group_config_overrides("sg") == {"share.delivery.count.limit": "3"}
        assert commits.queued == []
        nursery.cancel_scope.cancel()


async def test_delete_of_the_last_override_writes_a_tombstone():
    h, coordinator, commits = harness()
    commits.written.set()
    coordinator.set_group_config("sg", {"share.delivery.count.limit": "3"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(alter_request(
            [(GROUP_RESOURCE, "sg", [("share.delivery.count.limit", DELETE, None)])])))
        (done,) = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame()).responses
        assert done.error_code == ErrorCode.none
        assert coordinator.group_config_overrides("sg") == {}
        assert [value for _, value, _ in commits.queued] == [None]
        nursery.cancel_scope.cancel()


async def test_state_topic_share_group_and_topic_in_one_request_all_get_their_answer():
    h, coordinator, commits = harness(guard=True)
    commits.written.set()
    request = alter_request([
        (TOPIC_RESOURCE, STATE, [("cleanup.policy", SET, "delete")]),
        (GROUP_RESOURCE, "sg", [("share.heartbeat.interval.ms", SET, "6000")]),
        (TOPIC_RESOURCE, "orders", [("retention.ms", SET, "1000")]),
    ])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        upstream = decode_request(INCREMENTAL_ALTER_CONFIGS, await h.broker_receive())
        assert [r.resource_name for r in upstream.resources] == ["orders"]
        await h.broker.send_frame(response_frame(alter_answer(1, upstream.resources)))
        answer = by_resource(decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame()).responses)
        assert {k: v.error_code for k, v in answer.items()} == {
            (TOPIC_RESOURCE, STATE): ErrorCode.topic_authorization_failed,
            (GROUP_RESOURCE, "sg"): ErrorCode.none,
            (TOPIC_RESOURCE, "orders"): ErrorCode.none,
        }
        assert coordinator.group_config("sg").heartbeat_interval_ms == 6000
        nursery.cancel_scope.cancel()


async def test_a_share_group_named_twice_is_an_invalid_request_for_both():
    h, coordinator, commits = harness()
    coordinator.set_group_config("sg", {"share.delivery.count.limit": "3"})
    request = alter_request([(GROUP_RESOURCE, "sg", [("share.delivery.count.limit", SET, "4")]),
                             (GROUP_RESOURCE, "sg", [("share.delivery.count.limit", SET, "6")])])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        answer = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame()).responses
        assert [r.error_code for r in answer] == [ErrorCode.invalid_request] * 2
        assert coordinator.group_config("sg").delivery_count_limit == 3
        nursery.cancel_scope.cancel()


async def test_list_config_resources_adds_the_group_ids_the_proxy_holds_configs_for():
    h, coordinator, _ = harness()
    coordinator.set_group_config("sg", {"share.delivery.count.limit": "3"})
    request = load_request_schema(74, 1)(resource_types=())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        await h.broker_receive()
        cls = load_response_schema(74, 1)
        entry = item(cls, "config_resources")
        await h.broker.send_frame(response_frame(cls(
            throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
            config_resources=(entry(resource_name="orders", resource_type=TOPIC_RESOURCE),))))
        answer = decode_response(74, 1, await h.client.receive_frame())
        assert [(r.resource_name, int(r.resource_type)) for r in answer.config_resources] == [
            ("orders", TOPIC_RESOURCE), ("sg", GROUP_RESOURCE)]
        nursery.cancel_scope.cancel()


def legacy_alter_request(resources, version=2):
    cls = load_request_schema(ALTER_CONFIGS, version)
    resource_type = item(cls, "resources")
    config_type = item(resource_type, "configs")
    return cls(resources=tuple(
        resource_type(resource_type=t, resource_name=n, configs=tuple(config_type(name=k, value=v) for k, v in kv))
        for t, n, kv in resources), validate_only=False)


async def test_legacy_alter_configs_replaces_a_share_groups_whole_config():
    """Kafka accepts the legacy AlterConfigs on GROUP resources too: the keys named are set, the
    others go back to their defaults; the proxy must not let it reach the broker for share groups."""
    h, coordinator, commits = harness()
    commits.written.set()
    coordinator.set_group_config("sg", {"share.delivery.count.limit": "3", "share.record.lock.duration.ms": "20000"})
    coordinator.set_group_config("sg-other", {"share.delivery.count.limit": "4"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(legacy_alter_request([
            (GROUP_RESOURCE, "sg", [("share.auto.offset.reset", "earliest"), ("share.delivery.count.limit", "6")]),
            (GROUP_RESOURCE, "sg-other", [("share.delivery.count.limit", "99")]),
        ])))
        answer = decode_response(ALTER_CONFIGS, 2, await h.client.receive_frame())
        codes = {r.resource_name: r.error_code for r in answer.responses}
        assert codes == {"sg": ErrorCode.none, "sg-other": ErrorCode.invalid_config}
        assert coordinator.group_config_overrides("sg") == {
            "share.auto.offset.reset": "earliest", "share.delivery.count.limit": "6"}
        assert coordinator.group_config_overrides("sg-other") == {"share.delivery.count.limit": "4"}
        assert len(commits.queued) == 1
        nursery.cancel_scope.cancel()


async def test_dead_letter_keys_on_a_new_group_id_are_the_proxys_and_checked_as_kafka_does():
    h, coordinator, commits = harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(alter_request(
            [(GROUP_RESOURCE, "fresh", [("errors.deadletterqueue.topic.name", SET, "__consumer_offsets")])])))
        answer = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, await h.client.receive_frame())
        assert h.broker is None  # never forwarded: the cluster would accept it and nobody apply it
        assert [(r.error_code, r.error_message) for r in answer.responses] == [
            (ErrorCode.invalid_config, "errors.deadletterqueue.topic.name: DLQ topic name must not start with '__'")]
        assert coordinator.group_config_overrides("fresh") == {} and commits.queued == []
        nursery.cancel_scope.cancel()
