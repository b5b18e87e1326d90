"""Scale-out behind secured listeners (issue 15): instances call each other as clients do.

Two proxies with ``--instance-id`` in front of the SASL_SSL broker (StandardAuthorizer, SCRAM
users), their listeners serving TLS with a certificate from a CA made here, clients' SASL passed
through to the broker. The instances reach each other's listeners over TLS (the other's
certificate verified against ``--peer-ssl-ca-location``) and authenticate with the service
credentials (admin), so the share-state RPCs between them pass the cluster's ACLs as a proxy
instance's calls (WRITE on the state topic); a client calling them is refused.

With ``--listener-ssl-client-auth required`` (mutual TLS) an instance presents its own listener
certificate to the other.

The user alice may read the topic and the group, nothing more. The group is coordinated by one
instance and its share-partition led by the other, so describing the group's offsets at its
coordinator needs a call to the leader.
"""

from __future__ import annotations

import ssl
import uuid

import pytest
import trio
from confluent_kafka import Producer
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from integration.kafka_fixtures import create_topic, topic_id_of, unique_name
from integration.security.tls_fixtures import Pki, listener_flags, tls_client
from integration.security_fixtures import grant
from integration.share.conftest import ProxyStarter, wait_until
from integration.share.test_scale_out import (
    STATE_PARTITIONS,
    Instances,
    accept_ten_release_ten,
    group_homed_on,
)
from proxy.config import Secret, parse_host_port
from proxy.security import ServiceCredentials, UpstreamSecurity
from proxy.share.ownership import ServiceOwnership
from proxy.upstream import UpstreamClient, open_upstream

pytestmark = pytest.mark.integration

SCRAM = "SCRAM-SHA-512"
DESCRIBE_OFFSETS, READ_SUMMARY = 90, 87


async def call_as(bootstrap: str, ca_path: str, user: str, api_key: int, version: int, request,
                  certificate: tuple[str, str] | None = None):
    """One request on a TLS connection to the proxy (presenting `certificate` when given),
    authenticated (through it, by the broker) as `user`."""
    context = ssl.create_default_context(cafile=ca_path)
    if certificate is not None:
        context.load_cert_chain(*certificate)
    security = UpstreamSecurity(context, ServiceCredentials(SCRAM, user, Secret(f"{user}-secret")))
    stream = await open_upstream(parse_host_port(bootstrap), timeout=15, max_frame_size=1 << 24,
                                 security=security, authenticate=True)
    client = UpstreamClient(stream, client_id=f"scale-out-{user}")
    try:
        return await client.call(request)
    finally:
        await client.aclose()


def describe_offsets(bootstrap: str, ca_path: str, group: str, topic: str,
                     certificate: tuple[str, str] | None = None) -> tuple[ErrorCode, int]:
    schema = load_request_schema(DESCRIBE_OFFSETS, 0)
    module = __import__(schema.__module__, fromlist=["_"])
    request = schema(groups=(module.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=(
        module.DescribeShareGroupOffsetsRequestTopic(topic_name=topic, partitions=(0,)),)),))
    answer = trio.run(call_as, bootstrap, ca_path, "alice", DESCRIBE_OFFSETS, 0, request, certificate)
    [described] = answer.groups
    [partition] = described.topics[0].partitions if described.topics else [None]
    if partition is None:
        return ErrorCode(int(described.error_code)), -1
    return ErrorCode(int(partition.error_code)), int(partition.start_offset)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("client_auth", ["none", "required"])
def test_instances_behind_tls_and_sasl_listeners_administer_each_others_share_partitions(
        secured_kafka, tmp_path, client_auth):
    """``required``: mutual TLS, so an instance calling another presents its own listener
    certificate (every client, alice included, presents one too)."""
    pki = Pki(tmp_path)
    certificate, key = pki.issue("proxy", "127.0.0.1", "localhost")
    alice_certificate = pki.issue("alice") if client_auth == "required" else None
    mutual = ("--listener-ssl-client-auth", "required", "--listener-ssl-ca-location", pki.ca_path) \
        if client_auth == "required" else ()
    (tmp_path / "proxies").mkdir()
    starter = ProxyStarter(secured_kafka.bootstrap, tmp_path / "proxies")
    security_flags = (
        *listener_flags(certificate, key, *mutual), "--peer-ssl-ca-location", pki.ca_path,
        "--upstream-security-protocol", "SASL_SSL", "--upstream-ssl-ca-location", str(secured_kafka.ca_path),
        "--upstream-sasl-mechanism", SCRAM, "--upstream-sasl-username", "admin",
        "--upstream-sasl-password", "admin-secret")

    def secured_proxy(*flags, **options):
        return starter(*flags, *security_flags, **options)

    try:
        deployment = Instances(secured_kafka, secured_proxy, 2, client_config=secured_kafka.client_config())
        admin_config = secured_kafka.client_config()
        topic = create_topic(secured_kafka.bootstrap, unique_name("scale-sec"), client_config=admin_config)
        homes = ServiceOwnership(STATE_PARTITIONS)
        leader_id = deployment.described[homes.home_of_partition(
            topic_id_of(secured_kafka.bootstrap, topic, admin_config), 0)]
        coordinator_id = next(iid for iid in deployment.ids if iid != leader_id)
        group = group_homed_on(homes, deployment.mine[coordinator_id])
        leader, coordinator = deployment.proxies[leader_id], deployment.proxies[coordinator_id]
        producer = Producer(admin_config)
        for value in range(20):
            producer.produce(topic, value=str(value).encode(), partition=0)
        assert producer.flush(30) == 0
        grant(secured_kafka, "User:alice", "group", group, "read")
        grant(secured_kafka, "User:alice", "group", group, "describe")
        grant(secured_kafka, "User:alice", "topic", topic, "read")
        grant(secured_kafka, "User:alice", "topic", topic, "describe")

        alice = {**tls_client(deployment.bootstrap, pki.ca_path, alice_certificate), "security.protocol": "SASL_SSL",
                 "sasl.mechanism": SCRAM, "sasl.username": "alice", "sasl.password": "alice-secret"}
        accept_ten_release_ten(deployment.bootstrap, group, topic, alice)

        # The coordinator holds no state of the share-partition; it asks the leader, over TLS, as admin.
        def offsets_at_the_coordinator() -> tuple[ErrorCode, int]:
            return describe_offsets(coordinator.bootstrap, pki.ca_path, group, topic, alice_certificate)

        wait_until(lambda: offsets_at_the_coordinator() == (ErrorCode.none, 10), 30,
                   lambda: f"the leader's start offset 10 at the coordinator: {offsets_at_the_coordinator()}")

        # alice may read and describe the group, but is no proxy instance: the RPC is refused.
        schema = load_request_schema(READ_SUMMARY, 1)
        module = __import__(schema.__module__, fromlist=["_"])
        topic_id = topic_id_of(secured_kafka.bootstrap, topic, admin_config)
        ask = schema(group_id=group, topics=(module.ReadStateSummaryData(topic_id=topic_id, partitions=(
            module.PartitionData(partition=0, leader_epoch=0),)),))
        answer = trio.run(call_as, leader.bootstrap, pki.ca_path, "alice", READ_SUMMARY, 1, ask, alice_certificate)
        assert [ErrorCode(int(p.error_code)) for r in answer.results for p in r.partitions] == [
            ErrorCode.cluster_authorization_failed]
        assert uuid.UUID(str(answer.results[0].topic_id)) == topic_id
    finally:
        starter.stop_all()
