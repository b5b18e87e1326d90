"""Two proxy instances on one state topic (--instance-id; issue 15 step 3, docs/scale-out.md).

The instances split the state topic's partitions through the ownership group, each serves only the
share-partitions and groups homed on what it owns (the other gets NOT_COORDINATOR), and when one
stops the other takes its partitions over -- fenced, replayed -- and goes on serving the state the
first one confirmed. A third instance claiming a taken slot is refused at start.

Routing clients to the owning instance (virtual node ids, step 4) is not built, so the test
connects each client to the instance that owns its group and partition.
"""

from __future__ import annotations

import time
import uuid

import pytest
import trio
from confluent_kafka import AcknowledgeType, TopicCollection
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from integration.share.conftest import (
    EXPLICIT,
    WireMember,
    acknowledge_all,
    durable_state,
    metric,
    poll_until,
    produce,
    scrape_metrics,
    share_consumer,
    wait_until,
)
from proxy.localkafka.broker import free_port
from proxy.share.ownership import DEFAULT_GROUP_PREFIX, ServiceOwnership, describe_members, owner_map

pytestmark = pytest.mark.integration

STATE_PARTITIONS = 6


def topic_id_of(bootstrap: str, topic: str) -> uuid.UUID:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.describe_topics(TopicCollection([topic]))[topic].result().topic_id
    return uuid.UUID(int=((found.get_most_significant_bits() & (2**64 - 1)) << 64)
                     | (found.get_least_significant_bits() & (2**64 - 1)))


def owners(bootstrap: str, state_topic: str) -> dict[int, str]:
    """State partition -> instance id, from the ownership group's description."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    members = describe_members(admin, f"{DEFAULT_GROUP_PREFIX}.{state_topic}")
    return {p: identity.instance_id for p, identity in owner_map(members, state_topic).owners.items()}


def owned_by_metrics(port: int) -> set[int]:
    samples = scrape_metrics(port)
    return {p for p in range(STATE_PARTITIONS)
            if metric(samples, "ksp_share_state_partition_owned", partition=str(p)) == 1}


def group_homed_on(homes: ServiceOwnership, partitions: set[int]) -> str:
    """A group id whose home state partition is one of ``partitions``."""
    for attempt in range(10_000):
        group = f"scale-out-{attempt}-{uuid.uuid4().hex[:6]}"
        if homes.home_of_group(group) in partitions:
            return group
    raise AssertionError("no group id homed there")


def test_two_instances_split_the_state_and_one_takes_over_when_the_other_stops(kafka, share_proxy, create_topic,
                                                                               names):
    state_topic = f"__share_proxy_state_scale_{uuid.uuid4().hex[:12]}"
    ports = {"ksp-0": free_port(), "ksp-1": free_port()}
    common = ("--state-topic-partitions", str(STATE_PARTITIONS), "--ownership-session-timeout-ms", "6000",
              "--state-transactional-id-prefix", f"t-{uuid.uuid4().hex[:8]}")
    proxies = {iid: share_proxy(*common, "--instance-id", iid, "--metrics-port", str(port), state_topic=state_topic)
               for iid, port in ports.items()}

    everything = set(range(STATE_PARTITIONS))
    wait_until(lambda: set(owners(kafka.bootstrap, state_topic)) == everything
               and set(owners(kafka.bootstrap, state_topic).values()) == set(proxies), 30,
               "both instances to own state partitions")
    described = owners(kafka.bootstrap, state_topic)
    mine = {iid: {p for p, owner in described.items() if owner == iid} for iid in proxies}
    # What each instance says it owns is what the group says it owns.
    wait_until(lambda: all(owned_by_metrics(ports[iid]) == mine[iid] for iid in proxies), 15,
               lambda: f"metrics to agree with the group: {mine} vs "
                       f"{ {iid: owned_by_metrics(p) for iid, p in ports.items()} }")

    topic = create_topic(names.topic)
    homes = ServiceOwnership(STATE_PARTITIONS)
    home = homes.home_of_partition(topic_id_of(kafka.bootstrap, topic), 0)
    first_id = described[home]
    survivor_id = next(iid for iid in proxies if iid != first_id)
    group = group_homed_on(homes, mine[first_id])
    first, survivor = proxies[first_id], proxies[survivor_id]
    produce(kafka.bootstrap, topic, 20)

    consumer = share_consumer(first.bootstrap, group, topic, EXPLICIT)
    try:
        records = sorted(poll_until(consumer, 20, timeout=30), key=lambda m: m.offset())
        assert [m.delivery_count() for m in records] == [1] * 20
        acknowledge_all(consumer, records[:10])
        for message in records[10:]:
            consumer.acknowledge(message, AcknowledgeType.RELEASE)
        consumer.commit_sync(30)
    finally:
        consumer.close()

    async def heartbeat_at(bootstrap: str) -> ErrorCode:
        member = await WireMember(bootstrap, group).connect()
        try:
            return ErrorCode(int((await member.heartbeat((topic,), epoch=0)).error_code))
        finally:
            await member.aclose()

    # The other instance does not coordinate this group.
    assert trio.run(heartbeat_at, survivor.bootstrap) is ErrorCode.not_coordinator

    stopped = time.monotonic()
    first.stop()  # SIGTERM: leaves the group, its partitions are flushed and handed over
    wait_until(lambda: owners(kafka.bootstrap, state_topic) == {p: survivor_id for p in everything}, 15,
               "the survivor to own every state partition")
    wait_until(lambda: owned_by_metrics(ports[survivor_id]) == everything, 15, "the survivor to gain them all")
    takeover_s = time.monotonic() - stopped

    # The survivor serves what the first confirmed: 0-9 accepted, 10-19 released (delivered again).
    consumer = share_consumer(survivor.bootstrap, group, topic, EXPLICIT)
    try:
        again = poll_until(consumer, 10, timeout=30)
        assert sorted((m.offset(), m.delivery_count()) for m in again) == [(o, 2) for o in range(10, 20)]
        acknowledge_all(consumer, again)
    finally:
        consumer.close()
    assert durable_state(kafka.bootstrap, state_topic, group)[0].start_offset == 20
    print(f"\nscale-out: split {mine}, take-over after SIGTERM {takeover_s:.2f} s")

    # A third instance claiming the survivor's slot is refused at start.
    with pytest.raises(RuntimeError, match="already claimed"):
        share_proxy(*common, "--instance-id", f"other-{survivor_id.rsplit('-', 1)[1]}", state_topic=state_topic)
