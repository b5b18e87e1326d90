"""Share operations obey the cluster's own ACLs, end to end (issue 12, "Must show").

A SASL_SSL broker with SCRAM users and the StandardAuthorizer (`secured_kafka`); the proxy in
front of it reaches it with TLS and admin's service credentials, and serves plaintext listeners
(clients' SASL passes through to the broker on each client's own upstream connection). ACLs are
set as admin (`integration.security_fixtures.grant`). The users alice and bob talk to the proxy:

* with a raw protocol client authenticated as the user (`open_upstream(..., authenticate=True)`),
  so each assertion names the exact Kafka error code;
* with confluent-kafka's ShareConsumer and AdminClient, for what a real application sees.

The proxy runs with its default authorization mode (auto: the cluster has an authorizer, so it
enforces) and its default 5 s cache; a test that changes an ACL opens new connections after it
(a reconnect starts with an empty cache).
"""

from __future__ import annotations

import contextlib
import sys
import time
import typing
from collections.abc import Iterator

import pytest
import trio
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from integration.kafka_fixtures import create_topic, unique_name
from integration.security_fixtures import grant, revoke
from integration.share.conftest import (
    ProxyStarter,
    WireMember,
    acquired_offsets,
    metric,
    only_partition,
    scrape_metrics,
    share_consumer,
)
from proxy.config import Secret, parse_host_port
from proxy.errors import UpstreamError
from proxy.localkafka import LocalKafka, free_port
from proxy.security import ServiceCredentials, UpstreamSecurity
from proxy.upstream import UpstreamClient, open_upstream

pytestmark = pytest.mark.integration

SCRAM = "SCRAM-SHA-512"
GROUP_DENIED, TOPIC_DENIED = ErrorCode.group_authorization_failed, ErrorCode.topic_authorization_failed
LIST_GROUPS, DESCRIBE_GROUPS, SHARE_GROUP_DESCRIBE, DELETE_SHARE_GROUP_OFFSETS = 16, 15, 77, 92


@pytest.fixture(scope="module")
def proxy(secured_kafka: LocalKafka, tmp_path_factory) -> Iterator:
    """The proxy in front of the SASL_SSL broker, as admin for its own connections."""
    starter = ProxyStarter(secured_kafka.bootstrap, tmp_path_factory.mktemp("authz-proxy"))
    metrics_port = free_port()
    running = starter(
        "--metrics-port", str(metrics_port),
        "--upstream-security-protocol", "SASL_SSL",
        "--upstream-ssl-ca-location", str(secured_kafka.ca_path),
        "--upstream-sasl-mechanism", SCRAM,
        "--upstream-sasl-username", "admin",
        "--upstream-sasl-password", "admin-secret",
    )
    running.metrics_port = metrics_port
    yield running
    starter.stop_all()


def denied(proxy, api: str, resource: str) -> float:
    """ksp_authorization_denied_total{api, resource} of the proxy (0 before the first)."""
    return metric(scrape_metrics(proxy.metrics_port), "ksp_authorization_denied_total", api=api,
                  resource=resource) or 0.0


def user_config(proxy, user: str) -> dict[str, object]:
    """librdkafka settings of `user` reaching the proxy (plaintext listener, SASL passed through)."""
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": SCRAM, "sasl.username": user, "sasl.password": f"{user}-secret"}


def credentials(user: str) -> UpstreamSecurity:
    return UpstreamSecurity(None, ServiceCredentials(SCRAM, user, Secret(f"{user}-secret")))


async def client_as(proxy, user: str) -> UpstreamClient:
    """A raw protocol connection to the proxy, authenticated (through it, by the broker) as `user`."""
    stream = await open_upstream(parse_host_port(proxy.bootstrap), timeout=10, max_frame_size=1 << 24,
                                 security=credentials(user), authenticate=True)
    return UpstreamClient(stream, client_id=f"authz-{user}")


class MemberAs(WireMember):
    """WireMember whose two connections are authenticated as `user`."""

    def __init__(self, proxy, user: str, group: str) -> None:
        super().__init__(proxy.bootstrap, group)
        self.proxy, self.user = proxy, user

    async def connect(self) -> MemberAs:
        self.session = await client_as(self.proxy, self.user)
        self.control = await client_as(self.proxy, self.user)
        return self


@contextlib.asynccontextmanager
async def member_as(proxy, user: str, group: str):
    member = await MemberAs(proxy, user, group).connect()
    try:
        yield member
    finally:
        await member.aclose()


def topic_with_records(kafka: LocalKafka, count: int = 5) -> str:
    topic = create_topic(kafka.bootstrap, unique_name("authz"), client_config=kafka.client_config())
    producer = Producer(kafka.client_config("admin"))
    for index in range(count):
        producer.produce(topic, value=f"value-{index}".encode())
    assert producer.flush(20) == 0
    return topic


async def topic_id_of(proxy, topic: str):
    """The topic's id, from Metadata through the proxy as admin (forwarded to the broker)."""
    client = await client_as(proxy, "admin")
    try:
        schema = load_request_schema(3, 12)
        topic_type = typing.get_args(typing.get_args(typing.get_type_hints(schema)["topics"])[0])[0]
        response = await client.call(schema(topics=(topic_type(topic_id=None, name=topic),),
                                            allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False))
    finally:
        await client.aclose()
    [found] = response.topics
    return found.topic_id


# ----- READ on the topic -------------------------------------------------------------------------


def test_without_read_on_the_topic_share_fetch_is_refused_per_partition_and_delivers_nothing(
        secured_kafka, proxy):
    topic = topic_with_records(secured_kafka)
    topic_id = trio.run(topic_id_of, proxy, topic)
    group = unique_name("authz-read-topic")
    grant(secured_kafka, "User:alice", "group", group, "read")
    grant(secured_kafka, "User:alice", "topic", topic, "describe")  # enough to subscribe, not to read

    async def scenario():
        async with member_as(proxy, "alice", group) as member:
            await member.join(topic)
            response = await member.fetch(topic_id)
            assert response.error_code == ErrorCode.none
            partition = only_partition(response)
            assert partition.error_code == TOPIC_DENIED
            assert acquired_offsets(response) == set() and not partition.records
        grant(secured_kafka, "User:alice", "topic", topic, "read")
        async with member_as(proxy, "alice", group) as member:  # a new connection: nothing cached
            await member.join(topic)
            response = await member.fetch(topic_id)
            assert only_partition(response).error_code == ErrorCode.none
            assert acquired_offsets(response) == set(range(5))

    trio.run(scenario)


def poll_for(consumer, seconds: float, wanted: int | None = None) -> tuple[list[bytes], list[KafkaError]]:
    """Poll for `seconds` (or until `wanted` records): (values, errors seen)."""
    values: list[bytes] = []
    errors: list[KafkaError] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (wanted is None or len(values) < wanted):
        try:
            for message in consumer.poll(0.5):
                if message.error():
                    errors.append(message.error())
                else:
                    values.append(message.value())  # acknowledged implicitly at the next poll
        except KafkaException as exc:
            errors.append(exc.args[0])
    return values, errors


def test_a_share_consumer_without_read_on_the_topic_sees_no_records_until_granted(secured_kafka, proxy):
    topic = topic_with_records(secured_kafka, 3)
    group = unique_name("authz-consumer")
    grant(secured_kafka, "User:bob", "group", group, "read")
    grant(secured_kafka, "User:bob", "topic", topic, "describe")
    refused_before = denied(proxy, "ShareFetch", "topic")
    consumer = share_consumer(proxy.bootstrap, group, topic, user_config(proxy, "bob"))
    try:
        values, errors = poll_for(consumer, 10)
    finally:
        consumer.close()
    assert values == []
    # librdkafka logs "Not authorized to read" and keeps fetching; the proxy refused each fetch.
    assert {e.code() for e in errors} <= {KafkaError.TOPIC_AUTHORIZATION_FAILED}, errors
    assert denied(proxy, "ShareFetch", "topic") > refused_before

    grant(secured_kafka, "User:bob", "topic", topic, "read")
    consumer = share_consumer(proxy.bootstrap, group, topic, user_config(proxy, "bob"))
    try:
        values, errors = poll_for(consumer, 30, wanted=3)
    finally:
        consumer.close()
    assert sorted(values) == [b"value-0", b"value-1", b"value-2"], errors


# ----- READ on the group -------------------------------------------------------------------------


def test_without_read_on_the_group_heartbeat_and_fetch_are_refused(secured_kafka, proxy):
    topic = topic_with_records(secured_kafka, 1)
    topic_id = trio.run(topic_id_of, proxy, topic)
    group = unique_name("authz-read-group")
    grant(secured_kafka, "User:alice", "topic", topic, "read")

    async def scenario():
        async with member_as(proxy, "alice", group) as member:
            response = await member.heartbeat((topic,), epoch=0)
            assert response.error_code == GROUP_DENIED
            response = await member.fetch(topic_id, epoch=0)
            assert response.error_code == GROUP_DENIED and response.responses == ()
        grant(secured_kafka, "User:alice", "group", group, "read")
        async with member_as(proxy, "alice", group) as member:
            await member.join(topic)
            assert acquired_offsets(await member.fetch(topic_id)) == {0}

    trio.run(scenario)


# ----- DELETE on the group -----------------------------------------------------------------------


def delete_offsets_request(group: str, topic: str):
    schema = load_request_schema(DELETE_SHARE_GROUP_OFFSETS, 0)
    module = sys.modules[schema.__module__]
    return schema(group_id=group, topics=(module.DeleteShareGroupOffsetsRequestTopic(topic_name=topic),))


def test_without_delete_on_the_group_its_offsets_and_the_group_cannot_be_deleted(secured_kafka, proxy):
    topic = topic_with_records(secured_kafka, 2)
    topic_id = trio.run(topic_id_of, proxy, topic)
    group = unique_name("authz-delete")
    for user in ("alice", "bob"):
        grant(secured_kafka, f"User:{user}", "group", group, "read")
        grant(secured_kafka, f"User:{user}", "topic", topic, "read")

    async def make_empty_group():
        async with member_as(proxy, "alice", group) as member:
            await member.join(topic)
            await member.fetch(topic_id)
            assert (await member.heartbeat(epoch=-1)).error_code == ErrorCode.none  # leaves: the group is empty

    async def delete_offsets_as(user: str):
        client = await client_as(proxy, user)
        try:
            return await client.call(delete_offsets_request(group, topic))
        finally:
            await client.aclose()

    trio.run(make_empty_group)
    response = trio.run(delete_offsets_as, "bob")
    assert response.error_code == GROUP_DENIED and response.responses == ()
    bob_admin = AdminClient(user_config(proxy, "bob"))
    with pytest.raises(KafkaException) as refused:
        bob_admin.delete_consumer_groups([group], request_timeout=20)[group].result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    grant(secured_kafka, "User:bob", "group", group, "delete")
    response = trio.run(delete_offsets_as, "bob")
    assert response.error_code == ErrorCode.none
    assert [(t.topic_name, t.error_code) for t in response.responses] == [(topic, ErrorCode.none)]
    granted_admin = AdminClient(user_config(proxy, "bob"))  # kept referenced: a collected client drops its futures
    granted_admin.delete_consumer_groups([group], request_timeout=20)[group].result(timeout=30)
    listed = granted_admin.list_consumer_groups(request_timeout=20).result(timeout=30)
    assert group not in {g.group_id for g in listed.valid}


# ----- DESCRIBE on the group ---------------------------------------------------------------------


def test_without_describe_on_the_group_it_is_neither_listed_nor_described(secured_kafka, proxy):
    topic = topic_with_records(secured_kafka, 1)
    group = unique_name("authz-describe")
    grant(secured_kafka, "User:alice", "group", group, "read")
    grant(secured_kafka, "User:alice", "topic", topic, "read")

    async def join_as_alice():
        async with member_as(proxy, "alice", group) as member:
            await member.join(topic)

    async def look_as(user: str):
        client = await client_as(proxy, user)
        try:
            listed = await client.call(load_request_schema(LIST_GROUPS, 5)(states_filter=(), types_filter=()))
            described = await client.call(load_request_schema(SHARE_GROUP_DESCRIBE, 1)(
                group_ids=(group,), include_authorized_operations=True))
            classic = await client.call(load_request_schema(DESCRIBE_GROUPS, 5)(
                groups=(group,), include_authorized_operations=False))
            return [g.group_id for g in listed.groups], described.groups[0], classic.groups[0]
        finally:
            await client.aclose()

    trio.run(join_as_alice)
    listed, described, classic = trio.run(look_as, "bob")
    assert group not in listed
    assert described.error_code == GROUP_DENIED and described.members == ()
    assert classic.error_code == GROUP_DENIED

    grant(secured_kafka, "User:bob", "group", group, "describe")
    grant(secured_kafka, "User:bob", "topic", topic, "describe")
    listed, described, _ = trio.run(look_as, "bob")
    assert group in listed
    assert described.error_code == ErrorCode.none
    # bob may DESCRIBE the group and nothing else on it: the bitfield says exactly that (bit 8).
    assert int(described.authorized_operations) == 1 << 8


# ----- group configs -----------------------------------------------------------------------------


def describe_group_config_as(proxy, user: str, group: str):
    async def ask():
        client = await client_as(proxy, user)
        try:
            schema = load_request_schema(32, 4)
            resource = sys.modules[schema.__module__].DescribeConfigsResource(
                resource_type=32, resource_name=group, configuration_keys=("share.record.lock.duration.ms",))
            response = await client.call(schema(resources=(resource,), include_synonyms=False,
                                                include_documentation=False))
        finally:
            await client.aclose()
        [result] = response.results
        return result

    return trio.run(ask)


def test_share_group_configs_follow_describe_configs(secured_kafka, proxy):
    topic = topic_with_records(secured_kafka, 1)
    group = unique_name("authz-configs")
    grant(secured_kafka, "User:alice", "group", group, "read")
    grant(secured_kafka, "User:alice", "topic", topic, "read")

    async def join_as_alice():
        async with member_as(proxy, "alice", group) as member:
            await member.join(topic)

    trio.run(join_as_alice)  # the proxy's share group: the proxy answers its configs
    result = describe_group_config_as(proxy, "bob", group)
    assert result.error_code == GROUP_DENIED and result.configs == ()
    grant(secured_kafka, "User:bob", "group", group, "describe_configs")
    result = describe_group_config_as(proxy, "bob", group)
    admin_result = describe_group_config_as(proxy, "admin", group)
    if secured_kafka.version.startswith("3."):
        # Kafka 3.9 does not know GROUP config resources: the group probe cannot tell, so the
        # CLUSTER resource decides -- bob's group ACL does not count, the super user may
        # (docs/security.md, "Authorization").
        assert result.error_code == GROUP_DENIED
        assert admin_result.error_code == ErrorCode.none
        # confluent-kafka's BROKER is Kafka's CLUSTER. DescribeCluster reports the cluster's operations
        # only to a principal that may DESCRIBE it, so the fallback needs both.
        cluster_acls = ("describe", "describe_configs")
        for operation in cluster_acls:
            grant(secured_kafka, "User:bob", "broker", "kafka-cluster", operation)
        try:
            result = describe_group_config_as(proxy, "bob", group)
            assert result.error_code == ErrorCode.none
        finally:
            for operation in cluster_acls:
                revoke(secured_kafka, "User:bob", "broker", "kafka-cluster", operation)
    else:
        assert result.error_code == ErrorCode.none
        assert [c.name for c in result.configs] == ["share.record.lock.duration.ms"]
        assert admin_result.error_code == ErrorCode.none


# ----- no authentication -------------------------------------------------------------------------


def test_a_client_that_never_authenticated_is_served_nothing(secured_kafka, proxy):
    """The proxy serves share APIs itself; without SASL to the cluster the probe goes out on an
    unauthenticated connection, the broker closes it, and so does the proxy: nothing is served."""
    group = unique_name("authz-anonymous")

    async def heartbeat_without_sasl():
        stream = await open_upstream(parse_host_port(proxy.bootstrap), timeout=10, max_frame_size=1 << 24)
        client = UpstreamClient(stream, client_id="authz-anonymous")
        try:
            await client.call(load_request_schema(76, 1)(group_id=group, member_id="m" * 22, member_epoch=0,
                                                         rack_id=None, subscribed_topic_names=("t",)))
        finally:
            await client.aclose()

    with pytest.raises(UpstreamError):
        trio.run(heartbeat_without_sasl)

    async def describe_as_admin():
        client = await client_as(proxy, "admin")
        try:
            return await client.call(load_request_schema(SHARE_GROUP_DESCRIBE, 1)(
                group_ids=(group,), include_authorized_operations=False))
        finally:
            await client.aclose()

    [described] = trio.run(describe_as_admin).groups
    assert described.error_code == ErrorCode.group_id_not_found  # no group was created
