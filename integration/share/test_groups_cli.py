"""`share-proxy groups --describe` and the DescribeShareGroupInFlight RPC against a real broker.

A confluent_kafka ShareConsumer (explicit acknowledgement) takes ten records through the proxy,
accepts four, releases two, rejects one and keeps three; the in-flight view must show exactly
that: SPSO past the accepted ones, the rejected record archived, the kept ones acquired by the
member the group describes, with an acquisition time and a lock deadline 30 s after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from confluent_kafka import AcknowledgeType

from codec import extensions
from integration.share.conftest import EXPLICIT, describe_share_group, poll_until, produce, share_consumer, wire_call

pytestmark = pytest.mark.integration

SHARE_PROXY = str(Path(sys.executable).with_name("share-proxy"))
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4


@pytest.fixture(scope="module")
def proxy(module_share_proxy):
    return module_share_proxy()


def groups_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARE_PROXY, "groups", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def in_flight(bootstrap: str, group: str, **filters):
    """The proxy's DescribeShareGroupInFlight answer (v0, key 82) for the whole group."""
    api = extensions.describe_in_flight()
    return trio.run(wire_call, bootstrap, api.requests[0](group_id=group, **filters), api.responses[0])


@pytest.fixture(scope="module")
def consumed(kafka, proxy, module_topic):
    """A group whose one member accepted 0-3, released 4-5, rejected 6 and holds 7-9."""
    topic, group = module_topic
    produce(kafka.bootstrap, topic, 10)
    consumer = share_consumer(proxy.bootstrap, group, topic, EXPLICIT)
    before = int(time.time() * 1000)
    messages = poll_until(consumer, 10, timeout=30)
    after = int(time.time() * 1000)
    assert sorted(m.offset() for m in messages) == list(range(10))
    outcome = {0: AcknowledgeType.ACCEPT, 1: AcknowledgeType.ACCEPT, 2: AcknowledgeType.ACCEPT,
               3: AcknowledgeType.ACCEPT, 4: AcknowledgeType.RELEASE, 5: AcknowledgeType.RELEASE,
               6: AcknowledgeType.REJECT}
    for message in messages:
        if message.offset() in outcome:
            consumer.acknowledge(message, outcome[message.offset()])
    results = consumer.commit_sync(30)
    assert all(error is None for error in results.values()), results
    yield topic, group, (before, after)
    consumer.close()


@pytest.fixture(scope="module")
def module_topic(kafka):
    from integration.kafka_fixtures import create_topic, unique_name

    topic = unique_name("t-in-flight")
    create_topic(kafka.bootstrap, topic, partitions=1)
    return topic, unique_name("g-in-flight")


def test_in_flight_rpc_shows_each_record_state_owner_and_times(proxy, consumed):
    topic, group, (before, after) = consumed
    [member] = describe_share_group(proxy.bootstrap, group).members

    response = in_flight(proxy.bootstrap, group)

    assert (response.error_code, response.group_id) == (0, group)
    [described_topic] = response.topics
    [partition] = described_topic.partitions
    assert (described_topic.topic_name, partition.partition_index, partition.error_code) == (topic, 0, 0)
    assert (partition.start_offset, partition.end_offset) == (4, 10)  # 0-3 accepted: SPSO moved past them
    by_offset = {}
    for records in partition.records:
        for offset in range(records.first_offset, records.last_offset + 1):
            by_offset[offset] = records
    assert sorted(by_offset) == list(range(4, 10))
    assert (by_offset[6].state, by_offset[6].delivery_count, by_offset[6].member_id) == (ARCHIVED, 1, None)
    for offset in (7, 8, 9):
        held = by_offset[offset]
        assert (held.state, held.delivery_count, held.member_id) == (ACQUIRED, 1, member.member_id)
        assert before - 1000 <= held.acquired_timestamp <= after + 1000
        assert held.lock_deadline_timestamp == held.acquired_timestamp + 30_000
    # Released records are Available again (delivery count 1) unless the consumer's background
    # fetch already took them back (then Acquired, count 2).
    assert {(by_offset[o].state, by_offset[o].delivery_count) for o in (4, 5)} <= {(AVAILABLE, 1), (ACQUIRED, 2)}


def test_in_flight_rpc_filters_by_state_and_time_held(proxy, consumed):
    _, group, _ = consumed

    archived = in_flight(proxy.bootstrap, group, states=(ARCHIVED,))
    held_long = in_flight(proxy.bootstrap, group, held_longer_than_ms=3_600_000)
    held = in_flight(proxy.bootstrap, group, held_longer_than_ms=0)

    [partition] = archived.topics[0].partitions
    assert [(r.first_offset, r.last_offset, r.state) for r in partition.records] == [(6, 6, ARCHIVED)]
    assert held_long.topics[0].partitions[0].records == ()
    assert {r.state for r in held.topics[0].partitions[0].records} == {ACQUIRED}
    assert 7 in {o for r in held.topics[0].partitions[0].records for o in range(r.first_offset, r.last_offset + 1)}


def test_cli_describe_counts_in_flight_records_by_state(proxy, consumed):
    topic, group, _ = consumed

    table = groups_cli("--bootstrap-server", proxy.bootstrap, "--describe", "--group", group)
    as_json = groups_cli("--bootstrap-server", proxy.bootstrap, "--describe", "--group", group, "--format", "json")

    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "END-OFFSET", "IN-FLIGHT",
                              "AVAILABLE", "ACQUIRED", "ACKNOWLEDGED", "ARCHIVING", "ARCHIVED", "IN_PROGRESS"]
    cells = row.split()
    assert cells[:6] == [group, topic, "0", "4", "10", "6"]
    available, acquired, acknowledged, archiving, archived, in_progress = map(int, cells[6:])
    assert (available + acquired, acknowledged, archiving, archived, in_progress) == (5, 0, 0, 1, 0)
    assert acquired >= 3
    assert as_json.returncode == 0, as_json.stderr
    [partition] = json.loads(as_json.stdout)["partitions"]
    assert (partition["topic"], partition["start_offset"], partition["end_offset"], partition["in_flight"]) == (
        topic, 4, 10, 6)
    assert partition["records_by_state"]["ARCHIVED"] == 1 and partition["records_by_state"]["ACQUIRED"] == acquired


def test_cli_errors_have_their_own_exit_codes(kafka, proxy):
    unknown = groups_cli("--bootstrap-server", proxy.bootstrap, "--describe", "--group", "no-such-group")
    unreachable = groups_cli("--bootstrap-server", "127.0.0.1:1", "--describe", "--group", "g", "--timeout", "5")
    broker = groups_cli("--bootstrap-server", kafka.bootstrap, "--describe", "--group", "g")
    moved = groups_cli("--bootstrap-server", proxy.bootstrap, "--describe", "--group", "g", "--api-key", "80")
    usage = groups_cli("--bootstrap-server", proxy.bootstrap, "--describe")

    assert (unknown.returncode, unknown.stdout) == (1, "")
    assert "GROUP_ID_NOT_FOUND" in unknown.stderr and "no-such-group" in unknown.stderr
    assert unreachable.returncode == 3 and "127.0.0.1:1" in unreachable.stderr
    # A Kafka broker does not serve the extension (82 is its controller-only UpdateRaftVoter).
    assert broker.returncode == 4 and "does not serve DescribeShareGroupInFlight" in broker.stderr
    # 80 is Kafka's AddRaftVoter, which the proxy forwards: the broker hangs up on the wrong body.
    assert moved.returncode == 4 and "--api-key" in moved.stderr
    assert usage.returncode == 2 and "--group" in usage.stderr
