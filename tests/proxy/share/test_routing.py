"""InstanceRouting: which instance each partition and group is named at (the responses themselves
are checked byte for byte in tests/proxy/test_route_metadata.py and test_route_cluster.py)."""

from __future__ import annotations

import uuid

from proxy.share.ownership import InstanceIdentity, OwnerMap, ServiceOwnership
from proxy.share.routing import InstanceRouting
from proxy.vnodes import Instance

TOPIC = uuid.UUID(int=42)
A = InstanceIdentity("ksp-0", 0, "a.local", 9092, 19000)
B = InstanceIdentity("ksp-1", 1, "b.local", 9092, 29000)


def routing(owners: dict[int, InstanceIdentity], instances=(A, B)) -> InstanceRouting:
    homes = ServiceOwnership(4)
    current = OwnerMap(owners, tuple(instances))
    return InstanceRouting(homes, lambda: current, Instance(0, "a.local", 19000),
                           lambda name: TOPIC if name == "orders" else None)


def test_a_partition_is_named_at_the_owner_of_its_home_and_at_this_instance_when_unowned():
    homes = ServiceOwnership(4)
    home = homes.home_of_partition(TOPIC, 3)
    assert routing({home: B}).owner_slot("orders", TOPIC, 3) == 1
    assert routing({home: B}).owner_slot("orders", None, 3) == 1  # Metadata below v10: the name's id
    assert routing({}).owner_slot("orders", TOPIC, 3) == 0  # mid-hand-over: this instance
    assert routing({home: B}).owner_slot("unknown", None, 3) == 0  # not a topic the proxy knows
    # An owner that is not among the live instances (it just left) is not named.
    assert routing({home: B}, instances=(A,)).owner_slot("orders", TOPIC, 3) == 0


def test_a_group_is_coordinated_by_the_owner_of_its_home_and_other_keys_here():
    homes = ServiceOwnership(4)
    assert routing({homes.home_of_group("g"): B}).slot_for_key("g", 0) == 1
    assert routing({}).slot_for_key("g", 0) is None  # FindCoordinator: COORDINATOR_NOT_AVAILABLE
    assert routing({homes.home_of_group("g"): B}).slot_for_key("g", 1) == 0  # a transactional id


def test_every_live_instance_is_listed_with_this_one_always_among_them():
    assert [i.slot for i in routing({}, instances=(B,)).instances()] == [0, 1]
    assert routing({}, instances=(A, B)).instances()[1] == Instance(1, "b.local", 29000)


def test_share_responses_refused_here_carry_no_current_leader_and_no_node_endpoint():
    from proxy.share.cluster import PartitionInfo, TopicInfo
    from proxy.share.manager import NOT_LED_HERE, AcknowledgeOutcome, FetchOutcome
    from proxy.share.reader import Fetched
    from proxy.share.routes import share_acknowledge_response, share_fetch_body

    class Cluster:
        def topic_by_id(self, topic_id):
            return TopicInfo("orders", TOPIC, {3: PartitionInfo(leader_id=1, leader_epoch=7)})

    fetched = share_fetch_body(FetchOutcome(fetched={(TOPIC, 3): Fetched(error=NOT_LED_HERE[0])}),
                               Cluster(), scale_out=True)
    ((_, (partition,)),) = fetched.topics
    assert (partition.leader_id, partition.leader_epoch) == (-1, -1)
    assert tuple(fetched.node_endpoints) == ()
    # One instance: the upstream broker moved the partition (KIP-951), named with the proxy's endpoint.
    one = share_fetch_body(FetchOutcome(fetched={(TOPIC, 3): Fetched(error=NOT_LED_HERE[0])}),
                           Cluster(), lambda node_id: ("proxy.local", 9092 + node_id))
    ((_, (partition,)),) = one.topics
    assert (partition.leader_id, partition.leader_epoch) == (1, 7)
    assert [(e.node_id, e.host, e.port) for e in one.node_endpoints] == [(1, "proxy.local", 9093)]
    acknowledged = share_acknowledge_response(AcknowledgeOutcome(acknowledgements={(TOPIC, 3): NOT_LED_HERE}), 1)
    (partition,) = acknowledged.responses[0].partitions
    assert int(partition.current_leader.leader_id) == -1
    assert acknowledged.node_endpoints == ()


def test_the_hand_encoded_share_fetch_counts_its_error_codes_as_the_entity_would():
    from kio.schema.errors import ErrorCode

    from codec.headers import RequestHeader
    from proxy import metrics
    from proxy.share.cluster import PartitionInfo, TopicInfo
    from proxy.share.manager import FetchOutcome
    from proxy.share.reader import Fetched
    from codec.share_fetch import kio_share_fetch_response
    from proxy.share.routes import share_fetch_body, share_fetch_payload
    from tests.proxy.test_metrics import sample

    class Cluster:
        def topic_by_id(self, topic_id):
            return TopicInfo("orders", TOPIC, {p: PartitionInfo(leader_id=1, leader_epoch=7) for p in range(3)})

    def errors() -> dict[str, float]:
        return {name: sample("ksp_response_errors_total", api="ShareFetch", error=name)
                for name in ("NOT_LEADER_OR_FOLLOWER", "INVALID_RECORD_STATE", "UNKNOWN_MEMBER_ID")}

    outcomes = [
        FetchOutcome(fetched={(TOPIC, 0): Fetched(error=ErrorCode.not_leader_or_follower), (TOPIC, 1): Fetched()},
                     acknowledgements={(TOPIC, 1): (ErrorCode.invalid_record_state, None),
                                       (TOPIC, 2): (ErrorCode.none, None)}),
        FetchOutcome(ErrorCode.unknown_member_id, "who?"),
    ]
    before = errors()
    for outcome in outcomes:
        share_fetch_payload(RequestHeader(78, 2, 1), outcome, Cluster())
    by_payload = {name: count - before[name] for name, count in errors().items()}
    for outcome in outcomes:
        metrics.count_response_errors(78, kio_share_fetch_response(2, share_fetch_body(outcome, Cluster())))
    assert by_payload == {name: count - before[name] - by_payload[name] for name, count in errors().items()} == {
        "NOT_LEADER_OR_FOLLOWER": 1, "INVALID_RECORD_STATE": 1, "UNKNOWN_MEMBER_ID": 1}
