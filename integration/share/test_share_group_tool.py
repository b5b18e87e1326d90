"""Kafka's own share-group tool (kafka-share-groups.sh, ShareGroupCommand) describes proxy share groups."""

from __future__ import annotations

import subprocess

import pytest

from integration.kafka_fixtures import kafka_tools_jar
from integration.share.conftest import consumer_threads, describe_share_group
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
