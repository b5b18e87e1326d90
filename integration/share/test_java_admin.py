"""Apache Kafka's Java Admin client (kafka-clients 4.4) and its share-group methods, through the proxy.

Each test makes a share group do something real (confluent_kafka ShareConsumers consuming records
produced straight to the broker), then calls the Admin method through the Maven-built driver
(`admin-*` subcommands of integration/java, AdminOps.java) and checks the answer against what the
test did: groups and their states, members and assignments, start offsets and lag, offset resets
and deletions, group deletion, and share.* group configs with their source. Errors are checked by
the exception class the Admin client raised (the driver prints it as JSON).
"""

from __future__ import annotations

import time

import pytest

from integration.java.build import run_driver
from integration.share.conftest import acknowledge_all, poll_until, produce, share_consumer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.java]


@pytest.fixture(scope="module")
def proxy(module_share_proxy):
    return module_share_proxy()


def admin(command: str, proxy, **flags: object) -> dict:
    summary = run_driver(f"admin-{command}", timeout=90, bootstrap=proxy.bootstrap, **flags)
    assert summary["command"] == f"admin-{command}"
    return summary


def error_class(outcome: dict | None) -> str | None:
    return None if outcome is None else outcome["class"]


def consume_all(proxy, group: str, topic: str, count: int):
    """A share consumer in `group` that has consumed and accepted `count` records (still open)."""
    consumer = share_consumer(proxy.bootstrap, group, topic, {"share.acknowledgement.mode": "explicit"})
    messages = poll_until(consumer, count, timeout=30)
    acknowledge_all(consumer, messages)
    return consumer


def share_groups(proxy, **flags) -> dict[str, dict]:
    summary = admin("list-groups", proxy, types="share", **flags)
    assert "error" not in summary, summary
    return {group["group"]: group for group in summary["groups"]}


def offsets(proxy, group: str) -> dict[tuple[str, int], dict]:
    summary = admin("list-share-group-offsets", proxy, group=group)
    assert "error" not in summary, summary
    return {(row["topic"], row["partition"]): row for row in summary["offsets"]}


def wait_for_state(proxy, group: str, state: str, timeout: float = 30.0) -> None:
    def reached() -> bool:
        return share_groups(proxy).get(group, {}).get("state") == state

    wait_until(reached, timeout, f"share group {group} {state}", interval=0.5)


def test_list_groups_and_describe_share_groups_show_the_live_member(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=2)
    produce(kafka.bootstrap, topic, 10, partitions=2)
    consumer = consume_all(proxy, names.group, topic, 10)
    try:
        listed = share_groups(proxy)
        stable = share_groups(proxy, states="Stable")
        empty = share_groups(proxy, states="Empty")
        described = admin("describe-share-groups", proxy, groups=names.group, include_authorized_operations="true")
    finally:
        consumer.close()

    assert listed[names.group]["type"].lower() == "share" and listed[names.group]["state"] == "Stable"
    assert names.group in stable and names.group not in empty
    [group] = described["groups"]
    assert "error" not in group, group
    assert group["state"] == "Stable"
    [member] = group["members"]
    assert member["assignment"] == [f"{topic}:0", f"{topic}:1"]
    assert member["client_id"] and member["member_epoch"] >= 1
    assert group["group_epoch"] >= 1 and group["target_assignment_epoch"] == group["group_epoch"]
    assert group["authorized_operations"] and "DESCRIBE" in group["authorized_operations"]


def test_list_share_group_offsets_gives_start_offsets_and_lag(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=2)
    produce(kafka.bootstrap, topic, 10, partitions=2)  # 5 per partition
    consumer = consume_all(proxy, names.group, topic, 10)
    try:
        consumed = offsets(proxy, names.group)
        produce(kafka.bootstrap, topic, 3, partitions=1)  # 3 more on partition 0, not consumed
        time.sleep(0.5)
        behind = offsets(proxy, names.group)
    finally:
        consumer.close()

    assert {tp: (row["start_offset"], row["lag"]) for tp, row in consumed.items()} == {
        (topic, 0): (5, 0), (topic, 1): (5, 0)}
    assert all(isinstance(row["leader_epoch"], int) for row in consumed.values()), consumed
    assert (behind[(topic, 0)]["start_offset"], behind[(topic, 0)]["lag"]) == (5, 3)
    assert behind[(topic, 1)]["lag"] == 0


def test_alter_share_group_offsets_needs_an_empty_group_then_consumers_reread(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=1)
    produce(kafka.bootstrap, topic, 6)
    consumer = consume_all(proxy, names.group, topic, 6)
    try:
        refused = admin("alter-share-group-offsets", proxy, group=names.group, offsets=f"{topic}:0=0")
    finally:
        consumer.close()
    wait_for_state(proxy, names.group, "Empty")
    altered = admin("alter-share-group-offsets", proxy, group=names.group, offsets=f"{topic}:0=2")
    after = offsets(proxy, names.group)
    again = share_consumer(proxy.bootstrap, names.group, topic, {"share.acknowledgement.mode": "explicit"})
    try:
        reread = poll_until(again, 4, timeout=30)
    finally:
        again.close()

    assert error_class(refused["all"]) == "GroupNotEmptyException", refused
    assert altered["all"] is None and altered["partitions"] == {f"{topic}:0": None}, altered
    assert (after[(topic, 0)]["start_offset"], after[(topic, 0)]["lag"]) == (2, 4)
    assert sorted(m.offset() for m in reread) == [2, 3, 4, 5]


def test_delete_share_group_offsets_then_delete_the_group(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=1)
    produce(kafka.bootstrap, topic, 4)
    consumer = consume_all(proxy, names.group, topic, 4)
    try:
        busy_delete = admin("delete-share-groups", proxy, groups=names.group)
    finally:
        consumer.close()
    wait_for_state(proxy, names.group, "Empty")
    deleted_offsets = admin("delete-share-group-offsets", proxy, group=names.group, topics=topic)
    remaining = offsets(proxy, names.group)
    deleted = admin("delete-share-groups", proxy, groups=names.group)
    listed = share_groups(proxy)
    missing = admin("delete-share-groups", proxy, groups=names.group)

    assert error_class(busy_delete["groups"][names.group]) == "GroupNotEmptyException", busy_delete
    assert deleted_offsets["all"] is None and deleted_offsets["topics"] == {topic: None}, deleted_offsets
    assert all(row["start_offset"] in (None, -1) for tp, row in remaining.items() if tp[0] == topic), remaining
    assert deleted["groups"] == {names.group: None}, deleted
    assert names.group not in listed
    assert error_class(missing["groups"][names.group]) == "GroupIdNotFoundException", missing


def test_group_configs_are_set_described_with_their_source_and_validated(kafka, proxy, create_topic, names):
    topic = create_topic(names.topic, partitions=1)
    produce(kafka.bootstrap, topic, 2)
    consume_all(proxy, names.group, topic, 2).close()

    altered = admin("alter-group-configs", proxy, group=names.group,
                    set="share.record.lock.duration.ms=20000,share.auto.offset.reset=earliest")
    described = admin("describe-group-configs", proxy, group=names.group)
    refused = admin("alter-group-configs", proxy, group=names.group, set="share.auto.offset.reset=sometimes")
    reverted = admin("alter-group-configs", proxy, group=names.group, delete="share.record.lock.duration.ms")
    after_delete = admin("describe-group-configs", proxy, group=names.group)

    assert altered["result"] is None, altered
    configs = {c["name"]: c for c in described["configs"]}
    assert configs["share.record.lock.duration.ms"]["value"] == "20000"
    assert configs["share.record.lock.duration.ms"]["source"] == "DYNAMIC_GROUP_CONFIG"
    assert configs["share.auto.offset.reset"]["value"] == "earliest"
    # The proxy kept them: the broker's own answer (Admin straight to it) never saw the change.
    broker = admin("describe-group-configs", kafka, group=names.group)
    broker_values = {c["name"]: c["value"] for c in broker.get("configs") or ()}
    assert broker_values.get("share.record.lock.duration.ms") != "20000", broker
    assert error_class(refused["result"]) == "InvalidConfigurationException", refused
    assert reverted["result"] is None
    lock = {c["name"]: c for c in after_delete["configs"]}["share.record.lock.duration.ms"]
    assert lock["value"] == "30000" and lock["source"] != "DYNAMIC_GROUP_CONFIG"


def test_unknown_share_group_is_reported_with_kafkas_exceptions(proxy):
    described = admin("describe-share-groups", proxy, groups="no-such-share-group")
    deleted = admin("delete-share-groups", proxy, groups="no-such-share-group")

    [group] = described["groups"]
    # Kafka answers DescribeShareGroups for an unknown id with GROUP_ID_NOT_FOUND.
    assert error_class(group.get("error")) == "GroupIdNotFoundException", group
    assert error_class(deleted["groups"]["no-such-share-group"]) == "GroupIdNotFoundException", deleted


@pytest.fixture(scope="module")
def latest_proxy(module_share_proxy):
    """New groups start at the log end unless their own share.auto.offset.reset says otherwise."""
    return module_share_proxy("--share-auto-offset-reset", "latest")


def test_a_group_config_set_through_admin_is_applied_by_the_proxy(kafka, latest_proxy, create_topic, names):
    """share.auto.offset.reset=earliest set before the group exists: its first consumer reads the
    records produced before it started (the broker accepting the config would change nothing)."""
    topic = create_topic(names.topic, partitions=1)
    produce(kafka.bootstrap, topic, 5)

    altered = admin("alter-group-configs", latest_proxy, group=names.group, set="share.auto.offset.reset=earliest")
    consumer = share_consumer(latest_proxy.bootstrap, names.group, topic, {"share.acknowledgement.mode": "explicit"})
    try:
        received = poll_until(consumer, 5, timeout=30)
    finally:
        consumer.close()

    assert altered["result"] is None, altered
    assert sorted(m.offset() for m in received) == [0, 1, 2, 3, 4]
