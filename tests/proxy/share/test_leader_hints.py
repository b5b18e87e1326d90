"""NOT_LEADER_OR_FOLLOWER hints name the owning instance's node, and encode in real responses."""

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode

from codec.registry import DEFAULT_REGISTRY, decode_entity, encode, nested_types
from proxy.share.leader_hints import SHARE_ACKNOWLEDGE, SHARE_FETCH, node_endpoints, not_leader_hint
from proxy.vnodes import Instance, vnode

OWNER = Instance(2, "ksp-2.ksp", 19300)
OTHER = Instance(0, "ksp-0.ksp", 19100)
TOPIC = uuid.UUID(int=42)
VERSIONS = [(api, v) for api in (SHARE_FETCH, SHARE_ACKNOWLEDGE)
            for v in range(DEFAULT_REGISTRY.supported_versions(api)[0], DEFAULT_REGISTRY.supported_versions(api)[1] + 1)]


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
def test_the_hint_names_the_owner_node_with_the_upstream_epoch(api_key, version):
    hint = not_leader_hint(api_key, version, OWNER, leader=3, leader_epoch=17, rack="eu-1a")
    assert (hint.current_leader.leader_id, hint.current_leader.leader_epoch) == (vnode(2, 3), 17)
    endpoint = hint.node_endpoint
    assert (endpoint.node_id, endpoint.host, endpoint.port, endpoint.rack) == (vnode(2, 3), "ksp-2.ksp", 19303, "eu-1a")


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
@pytest.mark.parametrize(("owner", "leader"), [(None, 3), (OWNER, -1)])
def test_an_unknown_leader_is_minus_one_without_an_endpoint(api_key, version, owner, leader):
    hint = not_leader_hint(api_key, version, owner, leader=leader, leader_epoch=17)
    assert (hint.current_leader.leader_id, hint.current_leader.leader_epoch, hint.node_endpoint) == (-1, -1, None)


def test_node_endpoints_are_one_per_node_in_node_order():
    hints = [not_leader_hint(SHARE_FETCH, 1, OWNER, 3, 1), not_leader_hint(SHARE_FETCH, 1, OTHER, 1, 5),
             not_leader_hint(SHARE_FETCH, 1, OWNER, 3, 1), not_leader_hint(SHARE_FETCH, 1, None, 3, 1)]
    assert [e.node_id for e in node_endpoints(hints)] == [vnode(0, 1), vnode(2, 3)]


def test_other_apis_are_refused():
    with pytest.raises(ValueError, match="ShareFetch 78"):
        not_leader_hint(1, 12, OWNER, 3, 1)


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
def test_the_hint_travels_in_a_response_of_that_version(api_key, version):
    response_type = DEFAULT_REGISTRY.response_type(api_key, version)
    types = nested_types(response_type)
    hint = not_leader_hint(api_key, version, OWNER, leader=3, leader_epoch=17)
    ms0 = datetime.timedelta(0)
    if api_key == SHARE_FETCH:
        partition = types["PartitionData"](
            partition_index=0, error_code=ErrorCode.not_leader_or_follower, error_message=None,
            acknowledge_error_code=0, acknowledge_error_message=None, current_leader=hint.current_leader,
            records=b"", acquired_records=())
        response = response_type(
            throttle_time=ms0, error_code=ErrorCode.none, error_message=None, acquisition_lock_timeout=ms0,
            responses=(types["ShareFetchableTopicResponse"](topic_id=TOPIC, partitions=(partition,)),),
            node_endpoints=node_endpoints([hint]))
    else:
        partition = types["PartitionData"](partition_index=0, error_code=ErrorCode.not_leader_or_follower,
                                           error_message=None, current_leader=hint.current_leader)
        extra = {"acquisition_lock_timeout": ms0} if "acquisition_lock_timeout" in response_type.__dataclass_fields__ else {}
        response = response_type(
            throttle_time=ms0, error_code=ErrorCode.none, error_message=None,
            responses=(types["ShareAcknowledgeTopicResponse"](topic_id=TOPIC, partitions=(partition,)),),
            node_endpoints=node_endpoints([hint]), **extra)
    decoded = decode_entity(response_type, encode(response))
    assert decoded.responses[0].partitions[0].current_leader.leader_id == vnode(2, 3)
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [(vnode(2, 3), "ksp-2.ksp", 19303)]
