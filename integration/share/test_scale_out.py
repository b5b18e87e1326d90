"""Several proxy instances on one state topic (--instance-id; issue 15, docs/scale-out.md).

The instances split the state topic's partitions through the ownership group, each serves only the
share-partitions and groups homed on what it owns (the other gets NOT_COORDINATOR), and when one
stops the other takes its partitions over -- fenced, replayed -- and goes on serving the state the
first one confirmed. A third instance claiming a taken slot is refused at start. Clients
bootstrapped with every instance are routed by Metadata and FindCoordinator (virtual node ids);
Kafka's share-group tool administers a group coordinated on one instance whose share-partition
another leads (the peer share-state RPCs).
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import time
import uuid

import pytest
import trio
from confluent_kafka import AcknowledgeType
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from codec.share_events import EventKind
from integration.java.build import driver_command
from integration.kafka_fixtures import topic_id_of
from integration.share.test_crash_safety import CrashRun, _ranges
from integration.share.conftest import (
    ACK_ACCEPT,
    EXPLICIT,
    AcknowledgingConsumer,
    ConsumerThread,
    WireMember,
    acquired_offsets,
    only_partition,
    acknowledge_all,
    describe_share_group,
    durable_state,
    finished_durably,
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


def port_base_flags(kafka) -> tuple[str, str]:
    """A fixed broker port base (scale-out needs one: peers compute each other's ports) whose port
    for the broker is free."""
    return "--broker-port-base", str(free_port() - kafka.broker_id)


def owners(bootstrap: str, state_topic: str, client_config: dict | None = None) -> dict[int, str]:
    """State partition -> instance id, from the ownership group's description."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    members = describe_members(admin, f"{DEFAULT_GROUP_PREFIX}.{state_topic}")
    return {p: identity.instance_id for p, identity in owner_map(members, state_topic).owners.items()}


def owned_by_metrics(port: int) -> set[int]:
    samples = scrape_metrics(port)
    return {p for p in range(STATE_PARTITIONS)
            if metric(samples, "ksp_share_state_partition_owned", partition=str(p)) == 1}


def known_owners(port: int) -> float | None:
    """State partitions an instance's owner map names an owner for (its own view of the group)."""
    return metric(scrape_metrics(port), "ksp_ownership_known_owners")


def group_homed_on(homes: ServiceOwnership, partitions: set[int]) -> str:
    """A group id whose home state partition is one of ``partitions``."""
    for attempt in range(10_000):
        group = f"scale-out-{attempt}-{uuid.uuid4().hex[:6]}"
        if homes.home_of_group(group) in partitions:
            return group
    raise AssertionError("no group id homed there")


def accept_ten_release_ten(bootstrap: str, group: str, topic: str, config: dict | None = None) -> None:
    """Consume records 0-19 of a one-partition topic: 0-9 accepted, 10-19 released (both confirmed)."""
    consumer = share_consumer(bootstrap, group, topic, {**(config or {}), **EXPLICIT})
    try:
        records = sorted(poll_until(consumer, 20, timeout=60), key=lambda m: m.offset())
        assert [m.delivery_count() for m in records] == [1] * 20
        acknowledge_all(consumer, records[:10])
        acknowledge_all(consumer, records[10:], lambda m: AcknowledgeType.RELEASE)
    finally:
        consumer.close()


class Instances:
    """``count`` proxies with --instance-id on one fresh state topic, settled: every state partition
    owned, and each instance's owned-partition gauge agreeing with the ownership group.
    ``client_config``: how the test reaches a secured broker (its own AdminClient)."""

    def __init__(self, kafka, share_proxy, count: int, client_config: dict | None = None, extra: tuple = ()) -> None:
        self.kafka, self.client_config = kafka, client_config
        self.state_topic = f"__share_proxy_state_scale_{uuid.uuid4().hex[:12]}"
        self.ids = tuple(f"ksp-{i}" for i in range(count))
        self.ports = {iid: free_port() for iid in self.ids}
        self.common = ("--state-topic-partitions", str(STATE_PARTITIONS), "--ownership-session-timeout-ms", "6000",
                       "--state-transactional-id-prefix", f"t-{uuid.uuid4().hex[:8]}", *extra)
        self.proxies = {iid: share_proxy(*self.common, "--instance-id", iid, "--metrics-port", str(port),
                                         *port_base_flags(kafka), state_topic=self.state_topic)
                        for iid, port in self.ports.items()}
        self.everything = set(range(STATE_PARTITIONS))
        wait_until(lambda: set(self.owners()) == self.everything and set(self.owners().values()) == set(self.ids),
                   45, f"all {count} instances to own state partitions")
        self.described = self.owners()
        self.mine = {iid: {p for p, owner in self.described.items() if owner == iid} for iid in self.ids}
        wait_until(lambda: all(owned_by_metrics(self.ports[iid]) == self.mine[iid] for iid in self.ids), 15,
                   lambda: f"metrics to agree with the group: {self.mine} vs "
                           f"{ {iid: owned_by_metrics(p) for iid, p in self.ports.items()} }")
        # ...and every instance's own owner map to name an owner for every state partition: until
        # then an instance routes and forwards as if the partitions it has not seen move were unowned.
        wait_until(lambda: all(known_owners(port) == STATE_PARTITIONS for port in self.ports.values()), 15,
                   lambda: f"every instance to know every owner: "
                           f"{ {iid: known_owners(p) for iid, p in self.ports.items()} }")

    def owners(self) -> dict[int, str]:
        return owners(self.kafka.bootstrap, self.state_topic, self.client_config)

    @property
    def bootstrap(self) -> str:
        """Every instance: clients bootstrapped with all of them."""
        return ",".join(proxy.bootstrap for proxy in self.proxies.values())


class TwoInstances:
    """Two proxies with --instance-id on one state topic, a topic, and a group homed on the instance
    that leads the topic's partition ("first"); 20 records consumed through it, 0-9 accepted and
    10-19 released (both confirmed)."""

    def __init__(self, kafka, share_proxy, create_topic, names, *, cross: bool = False, extra: tuple = ()) -> None:
        deployment = Instances(kafka, share_proxy, 2, extra=extra)
        self.kafka, self.state_topic, self.ports = kafka, deployment.state_topic, deployment.ports
        self.common, self.proxies, self.mine = deployment.common, deployment.proxies, deployment.mine
        self.owners = deployment.owners
        described = deployment.described
        self.topic = create_topic(names.topic)
        homes = ServiceOwnership(STATE_PARTITIONS)
        self.topic_id = topic_id_of(kafka.bootstrap, self.topic)
        self.first_id = described[homes.home_of_partition(self.topic_id, 0)]
        self.survivor_id = next(iid for iid in self.proxies if iid != self.first_id)
        self.first, self.survivor = self.proxies[self.first_id], self.proxies[self.survivor_id]
        produce(kafka.bootstrap, self.topic, 20)
        if cross:  # the group coordinated by the other instance than the one leading the partition
            self.group = group_homed_on(homes, self.mine[self.survivor_id])
            return
        self.group = group_homed_on(homes, self.mine[self.first_id])
        accept_ten_release_ten(self.first.bootstrap, self.group, self.topic)

    def heartbeat_error(self, bootstrap: str) -> ErrorCode:
        async def heartbeat() -> ErrorCode:
            member = await WireMember(bootstrap, self.group).connect()
            try:
                return ErrorCode(int((await member.heartbeat((self.topic,), epoch=0)).error_code))
            finally:
                await member.aclose()

        return trio.run(heartbeat)

    def consume_the_rest_at(self, bootstrap: str, delivery_count: int) -> None:
        """What the first instance confirmed stands: 0-9 done, 10-19 delivered again."""
        consumer = share_consumer(bootstrap, self.group, self.topic, EXPLICIT)
        try:
            again = poll_until(consumer, 10, timeout=30)
            assert sorted((m.offset(), m.delivery_count()) for m in again) == [
                (o, delivery_count) for o in range(10, 20)]
            acknowledge_all(consumer, again)
        finally:
            consumer.close()
        assert durable_state(self.kafka.bootstrap, self.state_topic, self.group)[0].start_offset == 20


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_two_instances_split_the_state_and_one_takes_over_when_the_other_stops(kafka, share_proxy, create_topic,
                                                                               names, stop_signal):
    two = TwoInstances(kafka, share_proxy, create_topic, names)
    # The other instance does not coordinate this group.
    assert two.heartbeat_error(two.survivor.bootstrap) is ErrorCode.not_coordinator

    stopped = time.monotonic()
    two.first.stop(stop_signal)  # SIGTERM: a clean leave, flushed; kill -9: after the session times out
    everything = set(range(STATE_PARTITIONS))
    wait_until(lambda: two.owners() == {p: two.survivor_id for p in everything}, 30,
               "the survivor to own every state partition")
    wait_until(lambda: owned_by_metrics(two.ports[two.survivor_id]) == everything, 15,
               "the survivor to gain them all")
    takeover_s = time.monotonic() - stopped
    two.consume_the_rest_at(two.survivor.bootstrap, delivery_count=2)
    print(f"\nscale-out: split {two.mine}, take-over after {signal.Signals(stop_signal).name} {takeover_s:.2f} s")

    # A third instance claiming the survivor's slot is refused at start.
    with pytest.raises(RuntimeError, match="already claimed"):
        share_proxy(*two.common, "--instance-id", f"other-{two.survivor_id.rsplit('-', 1)[1]}",
                    *port_base_flags(kafka), state_topic=two.state_topic)


def test_the_event_log_keeps_one_history_per_record_across_a_hand_over(kafka, share_proxy, create_topic, names):
    """Both instances publish to one event topic. The first accepts 0-9 and releases 10-19, then
    leaves (SIGTERM): it publishes its events and waits for them before the rebalance completes
    (EventLog.hand_over), so on the event topic each record's history reads as one instance's
    after the other's -- the new owner's acquisitions come after the old owner's releases."""
    from integration.share.test_event_log import events_topic, per_offset, read_events

    topic_name = events_topic()
    two = TwoInstances(kafka, share_proxy, create_topic, names, extra=("--share-events-topic", topic_name))
    two.first.stop(signal.SIGTERM)
    wait_until(lambda: two.owners() == {p: two.survivor_id for p in range(STATE_PARTITIONS)}, 30,
               "the survivor to own every state partition")
    two.consume_the_rest_at(two.survivor.bootstrap, delivery_count=2)

    def complete(batches) -> bool:
        history = per_offset(batches, two.group)
        return all(len(history[o]) == (2 if o < 10 else 4) for o in range(20))

    history = per_offset(read_events(kafka.bootstrap, topic_name, enough=complete), two.group)
    first_member = history[0][0].member_id
    second_member = history[10][2].member_id
    assert first_member != second_member
    for offset in range(20):
        expected = [(EventKind.ACQUIRED, first_member, 1)]
        if offset < 10:
            expected.append((EventKind.ACCEPTED, first_member, 1))
        else:
            expected += [(EventKind.RELEASED, first_member, 1), (EventKind.ACQUIRED, second_member, 2),
                         (EventKind.ACCEPTED, second_member, 2)]
        assert [(e.kind, e.member_id, e.delivery_count) for e in history[offset]] == expected, offset


def test_an_instance_frozen_past_its_session_loses_its_partitions_and_rejoins(kafka, share_proxy, create_topic,
                                                                             names):
    two = TwoInstances(kafka, share_proxy, create_topic, names)
    everything = set(range(STATE_PARTITIONS))
    assert two.first.process is not None
    two.first.process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: two.owners() == {p: two.survivor_id for p in everything}, 30,
                   "the survivor to own every state partition")
        wait_until(lambda: owned_by_metrics(two.ports[two.survivor_id]) == everything, 15,
                   "the survivor to gain them all")
        # Fenced and replayed while the first is still frozen: it serves what the first confirmed.
        two.consume_the_rest_at(two.survivor.bootstrap, delivery_count=2)
    finally:
        two.first.process.send_signal(signal.SIGCONT)
    # Resumed, it learns it was declared dead (lost, not revoked: nothing written), and rejoins.
    wait_until(lambda: "change=lost" in two.first.log_tail(lines=400), 15, "the frozen instance to see its loss")
    wait_until(lambda: set(two.owners().values()) == set(two.proxies) and set(two.owners()) == everything, 30,
               "both instances to own partitions again")
    described = two.owners()
    for iid, port in two.ports.items():
        wait_until(lambda iid=iid, port=port: owned_by_metrics(port) == {p for p, o in described.items() if o == iid},
                   15, f"{iid}'s gauge to agree with the group")
    # Only the instance that now owns the group's home coordinates it.
    home = ServiceOwnership(STATE_PARTITIONS).home_of_group(two.group)
    other = next(i for i in two.proxies if i != described[home])
    assert two.heartbeat_error(two.proxies[other].bootstrap) is ErrorCode.not_coordinator


def test_a_member_heartbeats_at_the_coordinating_instance_and_fetches_at_the_leading_one(kafka, share_proxy,
                                                                                       create_topic, names):
    """The group is coordinated by one instance, its partition led by the other: the leader serves
    the member without knowing the group (as Kafka's partition leaders do), initialising the
    share-partition itself; the coordinator does not lead the partition (NOT_LEADER_OR_FOLLOWER)."""
    two = TwoInstances(kafka, share_proxy, create_topic, names, cross=True)
    coordinator, leader = two.survivor, two.first

    async def scenario() -> dict[str, object]:
        member = await WireMember(coordinator.bootstrap, two.group).connect()
        at_leader = await WireMember(leader.bootstrap, two.group, member_id=member.member_id).connect()
        seen: dict[str, object] = {}
        try:
            assert await member.join(two.topic) == two.topic_id
            wrong = await member.fetch(two.topic_id, max_wait_ms=100)  # the coordinator's own session
            seen["at_coordinator"] = ErrorCode(int(only_partition(wrong).error_code))
            acquired: set[int] = set()
            with trio.fail_after(30):
                while len(acquired) < 20:
                    acquired |= acquired_offsets(await at_leader.fetch(two.topic_id, max_records=20))
            seen["acquired"] = sorted(acquired)
            done = await at_leader.acknowledge(two.topic_id, [(0, 19, ACK_ACCEPT)])
            seen["acknowledged"] = ErrorCode(int(only_partition(done).error_code))
        finally:
            await member.aclose()
            await at_leader.aclose()
        return seen

    seen = trio.run(scenario)
    assert seen == {"at_coordinator": ErrorCode.not_leader_or_follower, "acquired": list(range(20)),
                    "acknowledged": ErrorCode.none}
    assert durable_state(kafka.bootstrap, two.state_topic, two.group)[0].start_offset == 20


def test_a_member_that_stops_heartbeating_loses_its_records_at_an_instance_that_does_not_coordinate(
        kafka, share_proxy, create_topic, names):
    """A member hangs: it stops heartbeating at its group's coordinator but keeps its connection to
    the leading instance open. The coordinator fences it after the session timeout; the leader
    learns that from the coordinator (ShareGroupDescribe, every --share-config-refresh-ms) and
    releases the member's records for others, as a leader on the coordinator's instance does --
    long before their acquisition locks (60 s here) would have expired."""
    session_timeout_s, lock_s = 6, 60
    two = TwoInstances(kafka, share_proxy, create_topic, names, cross=True, extra=(
        "--share-min-session-timeout-ms", "1000", "--share-session-timeout-ms", str(session_timeout_s * 1000),
        "--share-record-lock-duration-ms", str(lock_s * 1000)))
    coordinator, leader = two.survivor, two.first

    async def scenario() -> tuple[float, set[int]]:
        hung = await WireMember(coordinator.bootstrap, two.group).connect()
        hung_at_leader = await WireMember(leader.bootstrap, two.group, member_id=hung.member_id).connect()
        other = await WireMember(coordinator.bootstrap, two.group).connect()
        other_at_leader = await WireMember(leader.bootstrap, two.group, member_id=other.member_id).connect()
        try:
            await hung.join(two.topic)
            held: set[int] = set()
            with trio.fail_after(30):
                while len(held) < 20:
                    held |= acquired_offsets(await hung_at_leader.fetch(two.topic_id, max_records=20))
            last_heartbeat = time.monotonic()  # from now on it only keeps its connections open
            async with trio.open_nursery() as nursery:
                await other.join(two.topic)
                nursery.start_soon(other.keep_alive)
                taken: set[int] = set()
                with trio.fail_after(lock_s / 2):
                    while len(taken) < 20:
                        taken |= acquired_offsets(await other_at_leader.fetch(two.topic_id, max_records=20,
                                                                              max_wait_ms=200))
                took = time.monotonic() - last_heartbeat
                await other_at_leader.acknowledge(two.topic_id, [(0, 19, ACK_ACCEPT)])
                nursery.cancel_scope.cancel()
            return took, taken
        finally:
            for member in (hung, hung_at_leader, other, other_at_leader):
                await member.aclose()

    took, taken = trio.run(scenario)
    assert taken == set(range(20))
    assert took < lock_s / 2, took
    assert "member left the group at its coordinator; its records here released" in leader.log_tail(lines=3000)
    # The leader asked the coordinator every 2 s (config mirror and membership watch) over
    # connections it kept: a connection per call would open one per call.
    samples = scrape_metrics(two.ports[two.first_id])
    calls, opened = metric(samples, "ksp_peer_calls_total"), metric(samples, "ksp_peer_connections_opened_total")
    assert calls >= 4 and opened <= 2, (calls, opened)
    print(f"\nscale-out: a hung member's records released at the leading instance {took:.1f} s after its "
          f"last heartbeat (session timeout {session_timeout_s} s, lock {lock_s} s); {calls:.0f} calls to the "
          f"coordinator over {opened:.0f} connection(s)")


@pytest.mark.java
def test_kafka_share_groups_administers_a_group_whose_partition_another_instance_leads(kafka, share_proxy,
                                                                                       create_topic, names):
    """Issue 15 step 5: the group's coordinator asks the instance leading its share-partition
    (ReadShareGroupStateSummary, InitializeShareGroupState, DeleteShareGroupState) for
    `--describe --offsets`, `--reset-offsets` and `--delete-offsets`: without those calls the
    coordinator holds no state of a share-partition it does not lead. The tool's describeTopics
    (DescribeTopicPartitions) must name the leading instance's node, or the reset finds "no leader"."""
    from integration.share.test_share_group_tool import offsets, reset_plan, share_group_command

    two = TwoInstances(kafka, share_proxy, create_topic, names, cross=True)
    both = ",".join(proxy.bootstrap for proxy in two.proxies.values())
    accept_ten_release_ten(both, two.group, two.topic)
    wait_until(lambda: durable_state(kafka.bootstrap, two.state_topic, two.group)[0].start_offset == 10, 30,
               "the leader's SPSO at 10")

    # Asked at either instance, the tool reaches the coordinator, which asks the leader.
    for proxy in two.proxies.values():
        assert offsets(proxy.bootstrap, two.group) == {(two.topic, 0): ("10", "10")}

    # --list: the Admin asks every node Metadata names (each instance's virtual nodes); each instance
    # lists the groups it coordinates on one of its listeners, so a group coordinated on either
    # instance is listed once, whichever instance was the bootstrap.
    other_group = group_homed_on(ServiceOwnership(STATE_PARTITIONS), two.mine[two.first_id])
    other = share_consumer(both, other_group, two.topic, EXPLICIT)
    try:
        acknowledge_all(other, poll_until(other, 20, timeout=60))  # its own share-partition state
    finally:
        other.close()
    for bootstrap in [*(p.bootstrap for p in two.proxies.values()), both]:
        listed = share_group_command(bootstrap, "--list").split()
        assert (listed.count(two.group), listed.count(other_group)) == (1, 1), listed

    # ShareGroupDescribe at the coordinator (the survivor, with cross=True).
    wait_until(lambda: describe_share_group(two.survivor.bootstrap, two.group).group_state == "Empty", 30,
               "the group empty")
    done = share_group_command(both, "--reset-offsets", "--group", two.group, "--topic", two.topic,
                               "--to-latest", "--execute")
    assert reset_plan(done, two.group) == {(two.topic, 0): 20}, done
    assert durable_state(kafka.bootstrap, two.state_topic, two.group)[0].start_offset == 20  # at the leader
    assert offsets(both, two.group) == {(two.topic, 0): ("20", "0")}

    deleted = share_group_command(both, "--delete-offsets", "--group", two.group, "--topic", two.topic)
    assert any(line.split()[:2] == [two.topic, "Successful"] for line in deleted.splitlines()), deleted
    assert 0 not in durable_state(kafka.bootstrap, two.state_topic, two.group)  # tombstoned by the leader
    described = share_group_command(both, "--describe", "--group", two.group, "--offsets")
    assert f"Share group '{two.group}' has no offset information." in described
    assert "for the group's coordinator" in two.first.log_tail(lines=2000)  # the leader acted on both


@pytest.mark.java
def test_kafka_share_groups_administers_a_group_spread_over_three_instances(kafka, share_proxy, create_topic, names):
    """Issue 15 step 5 with three instances (the design's test): the group's coordinator asks each
    of the other two for the share-partitions it leads -- one call per instance -- to describe,
    reset and delete the group's offsets, asked at any instance."""
    from integration.share.test_share_group_tool import offsets, reset_plan, share_group_command

    deployment = Instances(kafka, share_proxy, 3)
    partitions = 6
    homes = ServiceOwnership(STATE_PARTITIONS)
    for attempt in range(5):
        # The group coordinated by an instance such that both others lead some of the topic's
        # partitions (homes hash the topic id, so a new topic is drawn until that holds).
        topic = create_topic(f"{names.topic}-{attempt}", partitions=partitions)
        topic_id = topic_id_of(kafka.bootstrap, topic)
        leaders = {p: deployment.described[homes.home_of_partition(topic_id, p)] for p in range(partitions)}
        coordinator_id = next((iid for iid in deployment.ids if len(set(leaders.values()) - {iid}) == 2), None)
        if coordinator_id is not None:
            break
    assert coordinator_id is not None, f"five topics homed on one instance only: {leaders}"
    group = group_homed_on(homes, deployment.mine[coordinator_id])
    produce(kafka.bootstrap, topic, 60, partitions=partitions)  # 10 per partition
    consumer = share_consumer(deployment.bootstrap, group, topic, EXPLICIT)
    try:
        consumed: list = []
        deadline = time.monotonic() + 90
        while len(consumed) < 60:  # each poll's records accepted before the next (explicit mode)
            assert time.monotonic() < deadline, f"{len(consumed)} of 60 records in 90 s"
            batch = [m for m in consumer.poll(0.5) if m.error() is None]
            acknowledge_all(consumer, batch)
            consumed += batch
    finally:
        consumer.close()
    wait_until(lambda: {p: s.start_offset for p, s in durable_state(kafka.bootstrap, deployment.state_topic,
                                                                    group).items()} == dict.fromkeys(range(6), 10),
               30, "every leader's SPSO at 10")

    expected = {(topic, p): ("10", "0") for p in range(partitions)}
    for proxy in deployment.proxies.values():
        assert offsets(proxy.bootstrap, group) == expected
    coordinator = deployment.proxies[coordinator_id]
    wait_until(lambda: describe_share_group(coordinator.bootstrap, group).group_state == "Empty", 30, "the group empty")
    done = share_group_command(deployment.bootstrap, "--reset-offsets", "--group", group, "--topic", topic,
                               "--to-earliest", "--execute")
    assert reset_plan(done, group) == {(topic, p): 0 for p in range(partitions)}, done
    assert {p: s.start_offset for p, s in durable_state(kafka.bootstrap, deployment.state_topic, group).items()} == \
        dict.fromkeys(range(partitions), 0)  # written by each leader
    assert offsets(deployment.bootstrap, group) == {(topic, p): ("0", "10") for p in range(partitions)}
    deleted = share_group_command(deployment.bootstrap, "--delete-offsets", "--group", group, "--topic", topic)
    assert any(line.split()[:2] == [topic, "Successful"] for line in deleted.splitlines()), deleted
    assert durable_state(kafka.bootstrap, deployment.state_topic, group) == {}  # tombstoned by every leader
    for iid in set(leaders.values()) - {coordinator_id}:
        assert "for the group's coordinator" in deployment.proxies[iid].log_tail(lines=3000), iid


def test_share_proxy_groups_in_flight_describes_records_another_instance_holds(kafka, share_proxy, create_topic,
                                                                             names):
    """Issue 15 step 5: `share-proxy groups --describe --in-flight` at any instance: one that does not
    coordinate the group passes the request to the coordinator, which asks the instance leading
    each share-partition for its in-flight records."""
    from integration.share.test_in_flight_cli import cli_subprocess

    two = TwoInstances(kafka, share_proxy, create_topic, names, cross=True)  # 20 records already produced
    consumer = share_consumer(",".join(p.bootstrap for p in two.proxies.values()), two.group, two.topic, EXPLICIT)
    try:
        held = poll_until(consumer, 20, timeout=60)  # acquired at the leader, not acknowledged yet
        for proxy in two.proxies.values():
            found = cli_subprocess("--bootstrap-server", proxy.bootstrap, "--describe", "--group", two.group,
                                   "--in-flight", "--format", "json")
            assert found.returncode == 0, found.stderr
            ranges = json.loads(found.stdout)["ranges"]
            assert sorted(o for r in ranges for o in range(r["first_offset"], r["last_offset"] + 1)) == list(range(20)), ranges
            assert {r["state"] for r in ranges} == {"ACQUIRED"}, ranges
        acknowledge_all(consumer, held)
    finally:
        consumer.close()


def test_group_configs_set_at_the_coordinator_reach_the_instance_leading_the_partition(kafka, share_proxy,
                                                                                      create_topic, names):
    """Issue 15 step 5: a group config is set at the group's coordinator (where FindCoordinator sends
    an admin); the instance leading the group's share-partition reads it before initialising the
    share-partition (share.auto.offset.reset) and picks up later changes within
    --share-config-refresh-ms. The instances' own default here is earliest."""
    from integration.share.test_group_configs import GROUP as GROUP_RESOURCE, SET, alter

    two = TwoInstances(kafka, share_proxy, create_topic, names, cross=True)  # 20 records already produced
    coordinator, leader = two.survivor, two.first
    assert alter(coordinator.bootstrap, [(GROUP_RESOURCE, two.group, [("share.auto.offset.reset", SET, "latest")])]) \
        == {(GROUP_RESOURCE, two.group): (ErrorCode.none, None)}
    consumer = share_consumer(",".join(p.bootstrap for p in two.proxies.values()), two.group, two.topic, EXPLICIT)
    try:
        deadline = time.monotonic() + 30
        while 0 not in durable_state(kafka.bootstrap, two.state_topic, two.group):
            assert len(consumer.poll(0.5)) == 0, "latest: none of the 20 earlier records"
            assert time.monotonic() < deadline, "the leader never initialised the share-partition"
        assert durable_state(kafka.bootstrap, two.state_topic, two.group)[0].start_offset == 20
        produce(kafka.bootstrap, two.topic, 5, start=20)
        later = poll_until(consumer, 5, timeout=30)
        assert sorted(m.offset() for m in later) == list(range(20, 25))
        acknowledge_all(consumer, later)
    finally:
        consumer.close()
    assert "group configs taken from the coordinator" in leader.log_tail(lines=2000)

    # A change once the share-partition is loaded reaches its leader within the refresh interval.
    changed_at = time.monotonic()
    assert alter(coordinator.bootstrap, [(GROUP_RESOURCE, two.group, [("share.record.lock.duration.ms", SET, "16000")])]) \
        == {(GROUP_RESOURCE, two.group): (ErrorCode.none, None)}
    wait_until(lambda: "'share.record.lock.duration.ms': '16000'" in leader.log_tail(lines=2000), 15,
               "the leader to take the new lock duration")
    print(f"\nscale-out: a group config reached the leading instance {time.monotonic() - changed_at:.1f} s after it was set")


RECORDS = 50_000
TOPIC_PARTITIONS = 8


@pytest.mark.java
def test_three_instances_serve_two_groups_exactly_once_and_share_the_work(kafka, share_proxy, create_topic, names):
    """Issue 15 must-show 1: librdkafka and Java share consumers bootstrapped with all three
    instances consume 50,000 records over 8 partitions in 2 groups; each group gets every record
    exactly once (delivery count 1, none twice), and acquisitions happen on more than one instance."""
    deployment = Instances(kafka, share_proxy, 3)
    state_topic, ids, ports = deployment.state_topic, deployment.ids, deployment.ports
    bootstrap = deployment.bootstrap

    topic = create_topic(names.topic, partitions=TOPIC_PARTITIONS)
    produced = {v.decode() for v in produce(kafka.bootstrap, topic, RECORDS, partitions=TOPIC_PARTITIONS,
                                            batch_records=500)}
    group_a, group_b = names.group, names.another("group")
    java = subprocess.Popen(
        driver_command("share-consume", bootstrap=bootstrap, group=group_b, topic=topic, ack_mode="explicit",
                       commit="sync", max_poll_records=500, idle_stop_ms=8000, timeout_ms=150_000),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    python = [ConsumerThread(bootstrap, group_a, topic, name="a-0"), ConsumerThread(bootstrap, group_a, topic, name="a-1"),
              ConsumerThread(bootstrap, group_b, topic, name="b-librdkafka")]
    for consumer in python:
        consumer.start()
    try:
        stdout, stderr = java.communicate(timeout=180)
        assert java.returncode == 0, stderr[-4000:]
        java_summary = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
        java_values = [d[3] for d in java_summary["deliveries"]]

        def values(threads) -> list[str]:
            return [d.value.decode() for t in threads for d in list(t.deliveries)]

        wait_until(lambda: set(values(python[:2])) >= produced, 120, lambda: f"group a to get every record "
                   f"({len(set(values(python[:2])))} of {RECORDS})")
        wait_until(lambda: set(values(python[2:]) + java_values) >= produced, 120,
                   lambda: f"group b to get every record ({len(set(values(python[2:]) + java_values))} of {RECORDS})")
        time.sleep(2.0)  # a late redelivery would show up here
    finally:
        if java.poll() is None:
            java.kill()
            java.wait()
        for consumer in python:
            consumer.finish()

    for group, delivered, counts in (
            ("a", values(python[:2]), [d.delivery_count for t in python[:2] for d in t.deliveries]),
            ("b", values(python[2:]) + java_values,
             [d.delivery_count for d in python[2].deliveries] + [d[2] for d in java_summary["deliveries"]])):
        seen = collections.Counter(delivered)
        assert seen.keys() == produced, group
        assert [v for v, n in seen.items() if n > 1] == [], f"group {group}: delivered twice"
        assert set(counts) == {1}, f"group {group}: delivery counts {collections.Counter(counts)}"
    assert java_summary["ack_errors"] == [] and all(t.errors == [] for t in python)
    split_b = {"java": len(java_values), "librdkafka": len(python[2].deliveries)}

    acquired = {iid: metric(scrape_metrics(ports[iid]), "ksp_share_records_acquired_total") or 0.0 for iid in ids}
    assert sum(acquired.values()) == 2 * RECORDS, acquired
    assert sum(1 for n in acquired.values() if n > 0) >= 2, acquired
    for group in (group_a, group_b):
        state = durable_state(kafka.bootstrap, state_topic, group)
        assert {p: s.start_offset for p, s in state.items()} == {
            p: RECORDS // TOPIC_PARTITIONS for p in range(TOPIC_PARTITIONS)}, group
    print(f"\nthree instances: acquisitions per instance {acquired}; group b split {split_b}")


@pytest.mark.java
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_java_share_consumer_follows_its_partitions_and_group_to_another_instance(kafka, share_proxy, create_topic,
                                                                                  names, stop_signal):
    """Java's KafkaShareConsumer across a move (docs/scale-out.md "What stays uncertain"): mid-run,
    the instance that both coordinates the consumer's group and leads some of its partitions is
    stopped (SIGTERM: a clean hand-over; SIGKILL: declared dead after the ownership session). The
    consumer, bootstrapped with all three instances, finds the new coordinator and leaders --
    whose leader epochs are unchanged -- and finishes every record."""
    partitions, records = 4, 20_000
    deployment = Instances(kafka, share_proxy, 3)
    ports, proxies, described = deployment.ports, deployment.proxies, deployment.described
    homes = ServiceOwnership(STATE_PARTITIONS)
    for attempt in range(5):  # a topic with a partition led where the group is coordinated
        topic = create_topic(f"{names.topic}-{attempt}", partitions=partitions)
        topic_id = topic_id_of(kafka.bootstrap, topic)
        leaders = collections.Counter(described[homes.home_of_partition(topic_id, p)] for p in range(partitions))
        if len(leaders) > 1:
            break
    victim = leaders.most_common(1)[0][0]
    group = group_homed_on(homes, deployment.mine[victim])
    produced = {v.decode() for v in produce(kafka.bootstrap, topic, records, partitions=partitions,
                                            batch_records=250)}
    java = subprocess.Popen(
        driver_command("share-consume", bootstrap=deployment.bootstrap, group=group, topic=topic,
                       ack_mode="explicit", commit="sync", max_poll_records=250, process_ms=20, count=records,
                       linger_ms=2000, timeout_ms=150_000),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sum(metric(scrape_metrics(ports[iid]), "ksp_share_records_acquired_total") or 0.0
                               for iid in deployment.ids) >= records // 4, 90, "a quarter of the records acquired")
        proxies[victim].stop(stop_signal)
        moved_at = time.monotonic()
        stdout, stderr = java.communicate(timeout=180)
    finally:
        if java.poll() is None:
            java.kill()
            java.wait()
    assert java.returncode == 0, stderr[-4000:]
    summary = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    delivered = collections.Counter(d[3] for d in summary["deliveries"])
    assert set(delivered) == produced, (
        f"{len(produced - set(delivered))} records never delivered; finished {summary['finished']} after "
        f"{time.monotonic() - moved_at:.1f} s; ack errors {summary['ack_errors'][:5]}; stderr {stderr[-3000:]}")
    assert summary["finished"] >= records, summary["finished"]
    again = sum(n - 1 for n in delivered.values())
    print(f"\nJava across a move ({stop_signal.name}): all {records} records finished "
          f"{time.monotonic() - moved_at:.1f} s after the stop; {again} deliveries again, "
          f"{len(summary['ack_errors'])} acknowledgement errors reported")


@pytest.mark.parametrize("failure", ["kill-9", "sigstop", "scale-in"])
def test_an_instance_failing_mid_run_moves_its_partitions_and_loses_no_acknowledgement(kafka, share_proxy,
                                                                                      create_topic, names, failure):
    """Issue 15 must-shows 2 and 3: three instances, three explicitly acknowledging librdkafka
    consumers bootstrapped with all three; after half the records are accepted, the instance leading
    most of the topic's partitions (not the group's coordinator) is killed with SIGKILL, or frozen
    with SIGSTOP past its ownership session and then resumed. Its share-partitions move to the
    survivors, consumption completes, every record is accepted at least once, and none whose
    acceptance was confirmed before the failure is delivered again. A resumed instance is fenced --
    the survivor took its lanes over, so whatever it tries to write fails -- and rejoins.
    "scale-in" (must-show 4's 3 -> 1): two instances, the group's coordinator among them, are
    stopped with SIGTERM one after the other; the last one serves everything and nothing is lost."""
    partitions, records = 4, 40_000
    deployment = Instances(kafka, share_proxy, 3)
    state_topic, ids, ports, proxies = deployment.state_topic, deployment.ids, deployment.ports, deployment.proxies
    everything, described = deployment.everything, deployment.described
    topic = create_topic(names.topic, partitions=partitions)
    homes = ServiceOwnership(STATE_PARTITIONS)
    topic_id = topic_id_of(kafka.bootstrap, topic)
    leaders = collections.Counter(described[homes.home_of_partition(topic_id, p)] for p in range(partitions))
    victim = leaders.most_common(1)[0][0]
    group = group_homed_on(homes, {p for p, o in described.items() if o != victim})
    values = produce(kafka.bootstrap, topic, records, partitions=partitions, batch_records=250)
    ends = {p: len(values[p::partitions]) for p in range(partitions)}
    produced = {(p, o) for p, end in ends.items() for o in range(end)}
    bootstrap = deployment.bootstrap

    run = CrashRun()
    consumers = [AcknowledgingConsumer(bootstrap, group, topic, name=f"consumer-{i}", on_delivery=run.on_delivery,
                                       on_acknowledged=run.on_acknowledged, processing_s=0.002,
                                       config={"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
                 for i in range(3)]
    for consumer in consumers:
        consumer.start()
    survivors = [iid for iid in ids if iid != victim]
    try:
        wait_until(lambda: len(run.acknowledged()) >= records // 2, 90, "half the records accepted before the failure",
                   interval=0.005)
        run.kill_starts()
        failed_at = time.monotonic()
        if failure == "kill-9":
            proxies[victim].stop(signal.SIGKILL)
        elif failure == "scale-in":
            coordinator = described[homes.home_of_group(group)]
            last = next(iid for iid in ids if iid not in (victim, coordinator))
            proxies[victim].stop()
            proxies[coordinator].stop()
            survivors = [last]
        else:
            assert proxies[victim].process is not None
            proxies[victim].process.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: set(owners(kafka.bootstrap, state_topic).values()) == set(survivors)
                           and set(owners(kafka.bootstrap, state_topic)) == everything, 30,
                           "the survivors to own every state partition")
                wait_until(lambda: owned_by_metrics(ports[survivors[0]]) | owned_by_metrics(ports[survivors[1]])
                           == everything, 15, "the survivors to have fenced and replayed them")
                time.sleep(1.0)  # the consumers' requests to the frozen instance pile up meanwhile
            finally:
                proxies[victim].process.send_signal(signal.SIGCONT)
        wait_until(lambda: produced <= run.acknowledged()
                   and finished_durably(kafka.bootstrap, state_topic, group, ends), 120,
                   lambda: f"every record accepted durably: never acknowledged "
                           f"{_ranges(produced - run.acknowledged())[:10]}", interval=0.5)
        completed_s = time.monotonic() - failed_at
        time.sleep(1.0)  # a late redelivery would show up here
    finally:
        for consumer in consumers:
            consumer.finish()

    delivered_after = {(d.partition, d.offset) for d in run.deliveries if d.after_kill}
    confirmed_then_redelivered = delivered_after & run.accepted_before_kill
    moved = {p for p in range(partitions) if described[homes.home_of_partition(topic_id, p)] == victim}
    fenced = (metric(scrape_metrics(ports[victim]), "ksp_share_state_lanes_fenced_total") or 0.0
              if failure == "sigstop" else None)
    print(f"\n{failure} of {victim} (led partitions {sorted(moved)}): completed {completed_s:.1f} s after it; "
          f"{len(run.accepted_before_kill)} confirmed before it, {len(delivered_after)} deliveries after, "
          f"{len(run.unconfirmed)} unconfirmed acknowledgements; lanes the resumed instance found fenced: {fenced}")
    if failure == "scale-in":
        assert owners(kafka.bootstrap, state_topic) == {p: survivors[0] for p in everything}
    assert moved, "the failed instance led none of the topic's partitions"
    assert produced <= run.acknowledged(), f"never accepted: {_ranges(produced - run.acknowledged())}"
    assert confirmed_then_redelivered == set(), (
        f"{len(confirmed_then_redelivered)} records confirmed before the failure were delivered again: "
        f"{_ranges(confirmed_then_redelivered)[:10]}")
    # The survivors served the failed instance's partitions afterwards.
    assert {p for p, _ in run.accepted - run.accepted_before_kill} & moved
    if failure == "sigstop":
        # Resumed, it learned it was declared dead (lost: nothing written), and rejoined.
        wait_until(lambda: "change=lost" in proxies[victim].log_tail(lines=2000), 15, "the resumed instance's loss")
        wait_until(lambda: set(owners(kafka.bootstrap, state_topic).values()) == set(ids), 30,
                   "the resumed instance to own partitions again")
