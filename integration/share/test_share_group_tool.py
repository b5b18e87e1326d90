"""Kafka's own share-group tool (kafka-share-groups.sh, ShareGroupCommand) describes proxy share groups."""

from __future__ import annotations

import datetime
import subprocess
import time

import pytest
from confluent_kafka import AcknowledgeType

from integration.kafka_fixtures import kafka_tools_jar
from integration.share.conftest import (
    EXPLICIT,
    acknowledge_all,
    consumer_threads,
    describe_share_group,
    poll_until,
    produce,
    share_consumer,
    wait_until,
)
from proxy.localkafka import fetch_kafka

# The tool and its kafka-clients come from the newest Kafka whatever broker is upstream: the tool
# talks to the proxy, which serves the share-group APIs itself.
TOOLS_KAFKA = "4.4.0"


def share_group_command(bootstrap: str, *args: str) -> str:
    classpath = f"{kafka_tools_jar(TOOLS_KAFKA)}:{fetch_kafka(TOOLS_KAFKA)}/*"
    result = subprocess.run(
        ["java", "-cp", classpath, "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
         "--bootstrap-server", bootstrap, *args],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.java
def test_kafka_share_groups_tool_describes_members_and_state(share_proxy, names, create_topic):
    proxy = share_proxy()
    topic = create_topic(names.topic, partitions=2)
    with consumer_threads(proxy.bootstrap, names.group, topic, 2, name="member"):
        described = describe_share_group(proxy.bootstrap, names.group)
        member_ids = {m.member_id for m in described.members}

        members = share_group_command(proxy.bootstrap, "--describe", "--group", names.group, "--members")
        rows = [line.split() for line in members.splitlines() if line.startswith(names.group)]
        assert {row[1] for row in rows} == member_ids
        # Each member's row ends with its assignment; together they cover both partitions once.
        assignments = sorted(row[-1] for row in rows)
        assert assignments == [f"{topic}:0", f"{topic}:1"]
        assert all(row[2].startswith("/127.0.0.1") for row in rows), members

        state = share_group_command(proxy.bootstrap, "--describe", "--group", names.group, "--state")
        row = next(line.split() for line in state.splitlines() if line.startswith(names.group))
        assert row[-2:] == ["Stable", "2"], state


# ----- the whole operator workflow -------------------------------------------------------------


def run_tool(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    """ShareGroupCommand without asserting success (its refusals are part of what is tested)."""
    classpath = f"{kafka_tools_jar(TOOLS_KAFKA)}:{fetch_kafka(TOOLS_KAFKA)}/*"
    return subprocess.run(
        ["java", "-cp", classpath, "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
         "--bootstrap-server", bootstrap, *args],
        capture_output=True, text=True, timeout=120,
    )


def rows(output: str, group: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.startswith(group + " ") or line == group]


def offsets(bootstrap: str, group: str, *, verbose: bool = False) -> dict[tuple[str, int], tuple[str, ...]]:
    """`--describe --offsets`: (topic, partition) -> (start offset, lag) or, verbose, (leader epoch, start, lag)."""
    output = share_group_command(bootstrap, "--describe", "--group", group, "--offsets",
                                 *(["--verbose"] if verbose else []))
    return {(row[1], int(row[2])): tuple(row[3:]) for row in rows(output, group)}


def reset_plan(output: str, group: str) -> dict[tuple[str, int], int]:
    """`--reset-offsets` output: (topic, partition) -> NEW-OFFSET."""
    return {(row[1], int(row[2])): int(row[3]) for row in rows(output, group)}


def consume_all(bootstrap: str, group: str, topic: str, wanted: int) -> list:
    consumer = share_consumer(bootstrap, group, topic, EXPLICIT)
    try:
        messages = poll_until(consumer, wanted, timeout=60)
        acknowledge_all(consumer, messages)
    finally:
        consumer.close()
    return messages


@pytest.mark.java
def test_operator_workflow_lists_describes_resets_and_deletes_a_share_group(share_proxy, names, create_topic):
    proxy = share_proxy("--share-auto-offset-reset", "earliest")
    topic = create_topic(names.topic, partitions=2)
    group = names.group
    produce(proxy.bootstrap, topic, 10, partitions=2)  # offsets 0-4 on each partition

    # One member: on partition 0 it releases offset 0 and accepts 1-4; on partition 1 it accepts all.
    consumer = share_consumer(proxy.bootstrap, group, topic, EXPLICIT)
    try:
        messages = poll_until(consumer, 10, timeout=60)
        acknowledge_all(consumer, messages, lambda m: (AcknowledgeType.RELEASE if (m.partition(), m.offset()) == (0, 0)
                                                       else AcknowledgeType.ACCEPT))
        members = share_group_command(proxy.bootstrap, "--describe", "--group", group, "--members", "--verbose")
        (member_row,) = rows(members, group)
        assert member_row[4] == "2" and member_row[-1] == f"{topic}:0,1", members  # #PARTITIONS, ASSIGNMENT
        assert int(member_row[5]) >= 1  # MEMBER-EPOCH
        state = share_group_command(proxy.bootstrap, "--describe", "--group", group, "--state", "--verbose")
        (state_row,) = rows(state, group)
        assert state_row[-4] == "Stable" and state_row[-1] == "1", state
        assert int(state_row[-3]) == int(state_row[-2]) >= 1  # GROUP-EPOCH == ASSIGNMENT-EPOCH
        assert share_group_command(proxy.bootstrap, "--list", "--state", "Empty").split().count(group) == 0

        # A group with a member cannot be reset, nor deleted.
        refused = run_tool(proxy.bootstrap, "--reset-offsets", "--group", group, "--topic", topic,
                           "--to-earliest", "--execute")
        assert f"Share group '{group}' is not empty." in refused.stdout + refused.stderr
        refused = run_tool(proxy.bootstrap, "--delete", "--group", group)
        assert "is not EMPTY" in refused.stdout + refused.stderr, refused.stdout
    finally:
        consumer.close()
    wait_until(lambda: describe_share_group(proxy.bootstrap, group).group_state == "Empty", 30, "group empty")
    between = datetime.datetime.now()
    time.sleep(1.2)
    produce(proxy.bootstrap, topic, 4, partitions=2, start=10)  # offsets 5-6 on each partition

    # --list (with and without --state), as the Admin asks every broker: listed once.
    assert share_group_command(proxy.bootstrap, "--list").split().count(group) == 1
    listed = {row[0]: row[1] for row in rows(share_group_command(proxy.bootstrap, "--list", "--state", "Empty"), group)}
    assert listed == {group: "Empty"}
    assert rows(share_group_command(proxy.bootstrap, "--list", "--state", "Stable"), group) == []

    # --describe --offsets: partition 0 starts at the released offset 0; four records above it are
    # done, so lag = end 7 - start 0 - 4 = 3. Partition 1: start 5, lag 7 - 5 = 2.
    assert offsets(proxy.bootstrap, group) == {(topic, 0): ("0", "3"), (topic, 1): ("5", "2")}
    verbose = offsets(proxy.bootstrap, group, verbose=True)
    assert {tp: row[1:] for tp, row in verbose.items()} == {(topic, 0): ("0", "3"), (topic, 1): ("5", "2")}
    assert all(row[0] == "0" for row in verbose.values())  # leader epoch of a fresh single-broker topic

    # --dry-run shows the plan and changes nothing.
    plan = run_tool(proxy.bootstrap, "--reset-offsets", "--group", group, "--topic", topic, "--to-latest", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert reset_plan(plan.stdout, group) == {(topic, 0): 7, (topic, 1): 7}
    assert offsets(proxy.bootstrap, group) == {(topic, 0): ("0", "3"), (topic, 1): ("5", "2")}

    # --execute --to-latest: nothing left to deliver.
    done = share_group_command(proxy.bootstrap, "--reset-offsets", "--group", group, "--all-topics", "--to-latest",
                               "--execute")
    assert reset_plan(done, group) == {(topic, 0): 7, (topic, 1): 7}
    assert offsets(proxy.bootstrap, group) == {(topic, 0): ("7", "0"), (topic, 1): ("7", "0")}

    # --to-datetime: the first record produced after `between` (offset 5 on both partitions).
    stamp = between.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    done = share_group_command(proxy.bootstrap, "--reset-offsets", "--group", group, "--topic", topic,
                               "--to-datetime", stamp, "--execute")
    assert reset_plan(done, group) == {(topic, 0): 5, (topic, 1): 5}
    assert offsets(proxy.bootstrap, group) == {(topic, 0): ("5", "2"), (topic, 1): ("5", "2")}

    # --to-earliest: consumers read the whole topic again, each record as a first delivery
    # (in-flight state and delivery counts were discarded with the reset).
    done = share_group_command(proxy.bootstrap, "--reset-offsets", "--group", group, "--topic", topic,
                               "--to-earliest", "--execute")
    assert reset_plan(done, group) == {(topic, 0): 0, (topic, 1): 0}
    assert offsets(proxy.bootstrap, group) == {(topic, 0): ("0", "7"), (topic, 1): ("0", "7")}
    again = consume_all(proxy.bootstrap, group, topic, 14)
    assert sorted(int(m.value()) for m in again) == list(range(14))
    assert {m.delivery_count() for m in again} == {1}
    wait_until(lambda: describe_share_group(proxy.bootstrap, group).group_state == "Empty", 30, "group empty")
    assert offsets(proxy.bootstrap, group) == {(topic, 0): ("7", "0"), (topic, 1): ("7", "0")}

    # --delete-offsets: the topic's share state is gone; an unknown topic is reported per topic.
    deleted = share_group_command(proxy.bootstrap, "--delete-offsets", "--group", group, "--topic", topic,
                                  "--topic", "no-such-topic")
    statuses = {line.split()[0]: " ".join(line.split()[1:]) for line in deleted.splitlines()
                if line.startswith((topic, "no-such-topic"))}
    assert statuses[topic] == "Successful"
    assert statuses["no-such-topic"].startswith("Error:"), deleted
    described = share_group_command(proxy.bootstrap, "--describe", "--group", group, "--offsets")
    assert f"Share group '{group}' has no offset information." in described

    # --delete: gone from --list and --describe.
    deleted = share_group_command(proxy.bootstrap, "--delete", "--group", group)
    assert f"Deletion of requested share groups ('{group}') was successful." in deleted
    assert group not in share_group_command(proxy.bootstrap, "--list").split()
    missing = run_tool(proxy.bootstrap, "--describe", "--group", group, "--state")
    assert f"GroupIdNotFoundException: Group {group} not found." in missing.stdout


@pytest.mark.java
def test_tool_reports_unknown_groups(share_proxy, names, create_topic):
    proxy = share_proxy()
    topic = create_topic(names.topic)
    described = run_tool(proxy.bootstrap, "--describe", "--group", names.group, "--offsets")
    assert f"GroupIdNotFoundException: Group {names.group} not found." in described.stdout, described.stdout
    deleted = run_tool(proxy.bootstrap, "--delete-offsets", "--group", names.group, "--topic", topic)
    assert f"Error: Group {names.group} not found." in deleted.stdout, deleted.stdout
    removed = run_tool(proxy.bootstrap, "--delete", "--group", names.group)
    # The tool itself checks the group is listed as a share group before asking to delete it.
    assert f"Group '{names.group}' is not a share group." in removed.stdout, removed.stdout
