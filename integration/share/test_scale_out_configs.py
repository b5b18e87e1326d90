"""Scale-out (issue 15 step 5): a share group's configs can be set and read at any instance.

Kafka's Admin sends DescribeConfigs, IncrementalAlterConfigs and ListConfigResources to any node
(the least loaded), not to the group's coordinator, while a group's configs live with its
coordinator. Two proxies with ``--instance-id``; the group is coordinated by one ("coordinator")
and its share-partition led by the other ("leader"). Runs against both broker versions (the
listing of config resources needs ListConfigResources v1, Kafka 4.1+).
"""

from __future__ import annotations

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from integration.share.conftest import wait_until
from integration.share.test_group_configs import (
    DEFAULT_CONFIG,
    GROUP,
    GROUP_CONFIG,
    SET,
    alter,
    describe,
    kafka_configs,
    wire_call,
)
from integration.share.test_scale_out import TwoInstances

pytestmark = pytest.mark.integration

LOCK = "share.record.lock.duration.ms"
LIST_CONFIG_RESOURCES = 74


def listed_groups(bootstrap: str) -> set[str] | None:
    """The GROUP resources ListConfigResources v1 lists at this instance; None before Kafka 4.1."""
    request = load_request_schema(LIST_CONFIG_RESOURCES, 1)(resource_types=(GROUP,))
    response = trio.run(wire_call, bootstrap, request)
    if response.error_code != ErrorCode.none:
        return None
    return {r.resource_name for r in response.config_resources if int(r.resource_type) == GROUP}


def supports_list_config_resources(kafka) -> bool:
    major, minor = (int(part) for part in kafka.version.split(".")[:2])
    return (major, minor) >= (4, 1)


@pytest.mark.java
def test_a_groups_configs_are_set_and_read_at_any_instance(kafka, share_proxy, create_topic, names):
    two = TwoInstances(kafka, share_proxy, create_topic, names, cross=True)
    coordinator, leader = two.survivor, two.first

    # Set at the instance that does not coordinate the group: it passes the request on.
    assert alter(leader.bootstrap, [(GROUP, two.group, [(LOCK, SET, "17000")])]) == {
        (GROUP, two.group): (ErrorCode.none, None)}
    for proxy in (coordinator, leader):  # read at either: the coordinator's record, not a copy
        assert describe(proxy.bootstrap, two.group, (LOCK,))[LOCK][:2] == ("17000", GROUP_CONFIG)
    # Applied (and written) by the coordinator only; the leader holds no share-partition of the group.
    assert "group config changed" in coordinator.log_tail(lines=2000)
    assert "group config changed" not in leader.log_tail(lines=2000)

    # Kafka's own tool, bootstrapped at the leader: whichever node its Admin picks, the answer is one.
    result = kafka_configs("--bootstrap-server", leader.bootstrap, "--entity-type", "groups",
                           "--entity-name", two.group, "--alter", "--add-config", "share.auto.offset.reset=latest")
    assert result.returncode == 0, result.stderr[-2000:]
    for proxy in (coordinator, leader):
        result = kafka_configs("--bootstrap-server", proxy.bootstrap, "--entity-type", "groups",
                               "--entity-name", two.group, "--describe")
        assert result.returncode == 0, result.stderr[-2000:]
        settings = {line.split("=", 1)[0].strip() for line in result.stdout.splitlines() if "=" in line}
        assert settings == {LOCK, "share.auto.offset.reset"}, result.stdout
        assert f"{LOCK}=17000 " in result.stdout and "share.auto.offset.reset=latest " in result.stdout

    # Deleted at the leader, gone at both.
    assert alter(leader.bootstrap, [(GROUP, two.group, [(LOCK, 1, None)])]) == {(GROUP, two.group): (ErrorCode.none, None)}
    for proxy in (coordinator, leader):
        assert describe(proxy.bootstrap, two.group, (LOCK,))[LOCK][:2] == ("30000", DEFAULT_CONFIG)

    if supports_list_config_resources(kafka):
        # The listing at either instance names the group, whose configs only the coordinator holds.
        wait_until(lambda: all(two.group in (listed_groups(p.bootstrap) or set()) for p in (coordinator, leader)), 15,
                   lambda: f"the group listed at both: {[listed_groups(p.bootstrap) for p in (coordinator, leader)]}")
