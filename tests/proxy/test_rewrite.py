"""Every response that names brokers comes back naming only the proxy."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_payload_module, load_response_schema
from kio.schema.index import schema_name_map
from kio.static.constants import EntityType
from kio.static.primitive import i32, i64

from codec.headers import parse_response_header
from proxy.errors import UpstreamError
from proxy.rewrite import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    Endpoint,
    decode_response,
    encode_response,
    locate_metadata_brokers,
    rewrite_endpoints,
    rewrite_response,
    upstream_endpoints,
)
from tests.codec.strategies import entities
from tests.proxy.kio_build import build, has_field, response_frame

PROXY_PORTS = {1: 30001, 2: 30002, 7: 30007}


def endpoint_of(node_id: int) -> tuple[str, int]:
    return "proxy.example", PROXY_PORTS[node_id]


def versions(name: str) -> list[int]:
    return sorted(schema_name_map[name])


def module(api_key: int, version: int):
    return load_payload_module(api_key, version, EntityType.response)


def rewrite_and_decode(entity, header_tags=((7, b"tag"),)):
    frame = response_frame(entity, correlation_id=99, header_tags=header_tags)
    api_key, version = int(entity.__api_key__), int(entity.__version__)
    rewritten = rewrite_response(api_key, version, frame, endpoint_of)
    header_bytes, decoded = decode_response(api_key, version, rewritten)
    original_header_bytes, _ = decode_response(api_key, version, frame)
    assert header_bytes == original_header_bytes  # correlation id and header tags kept verbatim
    return decoded


@pytest.mark.parametrize("version", versions("metadata"))
def test_metadata_brokers_become_proxy_endpoints(version):
    m = module(METADATA, version)
    broker_fields = {"rack": "r1"} if has_field(m.MetadataResponseBroker, "rack") else {}
    partition = build(m.MetadataResponsePartition, partition_index=i32(0), leader_id=i32(2), replica_nodes=(i32(1), i32(2)))
    topic = build(m.MetadataResponseTopic, name="orders", partitions=(partition,))
    response = build(
        m.MetadataResponse,
        brokers=(
            build(m.MetadataResponseBroker, node_id=i32(1), host="kafka-1.internal", port=i32(9092), **broker_fields),
            build(m.MetadataResponseBroker, node_id=i32(2), host="kafka-2.internal", port=i32(9093), **broker_fields),
        ),
        topics=(topic,),
    )
    decoded = rewrite_and_decode(response)
    assert [(b.node_id, b.host, b.port) for b in decoded.brokers] == [
        (1, "proxy.example", 30001),
        (2, "proxy.example", 30002),
    ]
    if broker_fields:
        assert [b.rack for b in decoded.brokers] == ["r1", "r1"]
    assert decoded.topics == response.topics


@pytest.mark.parametrize("version", [v for v in versions("find_coordinator") if v < 4])
def test_find_coordinator_single_coordinator(version):
    m = module(FIND_COORDINATOR, version)
    response = build(m.FindCoordinatorResponse, node_id=i32(7), host="kafka-7.internal", port=i32(9094))
    decoded = rewrite_and_decode(response)
    assert (decoded.node_id, decoded.host, decoded.port) == (7, "proxy.example", 30007)


@pytest.mark.parametrize("version", [v for v in versions("find_coordinator") if v >= 4])
def test_find_coordinator_batched_coordinators(version):
    m = module(FIND_COORDINATOR, version)
    response = build(
        m.FindCoordinatorResponse,
        coordinators=(
            build(m.Coordinator, key="group-a", node_id=i32(1), host="kafka-1.internal", port=i32(9092)),
            build(m.Coordinator, key="group-b", node_id=i32(2), host="kafka-2.internal", port=i32(9093)),
            # A failed lookup carries no address and must stay untouched.
            build(m.Coordinator, key="group-c", node_id=i32(-1), host="", port=i32(-1)),
        ),
    )
    decoded = rewrite_and_decode(response)
    assert [(c.key, c.node_id, c.host, c.port) for c in decoded.coordinators] == [
        ("group-a", 1, "proxy.example", 30001),
        ("group-b", 2, "proxy.example", 30002),
        ("group-c", -1, "", -1),
    ]


def test_find_coordinator_error_placeholder_is_left_alone():
    m = module(FIND_COORDINATOR, 2)
    response = build(m.FindCoordinatorResponse, node_id=i32(-1), host="", port=i32(-1))
    assert upstream_endpoints(FIND_COORDINATOR, response) == []
    decoded = rewrite_and_decode(response, header_tags=())
    assert (decoded.node_id, decoded.host, decoded.port) == (-1, "", -1)


@pytest.mark.parametrize("version", versions("describe_cluster"))
def test_describe_cluster_brokers(version):
    m = module(DESCRIBE_CLUSTER, version)
    response = build(
        m.DescribeClusterResponse,
        cluster_id="c1",
        controller_id=i32(1),
        brokers=(build(m.DescribeClusterBroker, broker_id=i32(1), host="kafka-1.internal", port=i32(9092), rack="r"),),
    )
    decoded = rewrite_and_decode(response)
    assert [(b.broker_id, b.host, b.port, b.rack) for b in decoded.brokers] == [(1, "proxy.example", 30001, "r")]
    assert (decoded.cluster_id, decoded.controller_id) == ("c1", 1)


@pytest.mark.parametrize("version", [v for v in versions("fetch") if v >= 16])
def test_fetch_node_endpoints_are_rewritten_and_records_kept(version):
    m = module(FETCH, version)
    records = bytes(range(256)) * 4
    partition = build(
        m.PartitionData,
        partition_index=i32(3),
        high_watermark=i64(10),
        records=records,
        current_leader=m.LeaderIdAndEpoch(leader_id=i32(2), leader_epoch=i32(5)),
    )
    topic = build(m.FetchableTopicResponse, partitions=(partition,))
    response = build(
        m.FetchResponse,
        responses=(topic,),
        node_endpoints=(build(m.NodeEndpoint, node_id=i32(2), host="kafka-2.internal", port=i32(9093), rack="r"),),
    )
    decoded = rewrite_and_decode(response)
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == [(2, "proxy.example", 30002, "r")]
    (decoded_partition,) = decoded.responses[0].partitions
    assert decoded_partition.records == records
    assert (decoded_partition.current_leader.leader_id, decoded_partition.current_leader.leader_epoch) == (2, 5)


@pytest.mark.parametrize("version", [v for v in versions("produce") if v >= 10])
def test_produce_node_endpoints_are_rewritten(version):
    m = module(PRODUCE, version)
    response = build(
        m.ProduceResponse,
        node_endpoints=(build(m.NodeEndpoint, node_id=i32(1), host="kafka-1.internal", port=i32(9092)),),
    )
    decoded = rewrite_and_decode(response)
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [(1, "proxy.example", 30001)]


def test_fetch_without_node_endpoints_is_returned_unchanged():
    m = module(FETCH, 16)
    frame = response_frame(build(m.FetchResponse))
    assert rewrite_response(FETCH, 16, frame, endpoint_of) == frame


def test_upstream_endpoints_lists_what_must_be_mapped():
    m = module(METADATA, 12)
    response = build(
        m.MetadataResponse,
        brokers=(build(m.MetadataResponseBroker, node_id=i32(4), host="h", port=i32(1)),),
    )
    assert upstream_endpoints(METADATA, response) == [Endpoint(4, "h", 1)]


def test_undecodable_response_is_an_upstream_error():
    with pytest.raises(UpstreamError):
        rewrite_response(METADATA, 12, b"\x00\x00\x00\x01\x00\xff\xff", endpoint_of)


def test_response_schema_versions_cover_all_rewritten_apis():
    # Guards the parametrisation above: kio must offer these APIs at all.
    for api_key in (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, PRODUCE, FETCH):
        assert load_response_schema(api_key, 0 if api_key != FETCH and api_key != PRODUCE else 10)
    assert parse_response_header(b"\x00\x00\x00\x01", 0)[0].correlation_id == 1


# -- Metadata: only the brokers array is re-encoded ------------------------------------------


def any_endpoint(node_id: int) -> tuple[str, int]:
    return f"proxy-{node_id % 7}.example", 20000 + node_id % 1000


@pytest.mark.parametrize("version", versions("metadata"))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_metadata_rewrite_of_the_brokers_alone_equals_rewriting_the_whole_response(version, data):
    response = data.draw(entities(module(METADATA, version).MetadataResponse))
    frame = response_frame(response, correlation_id=7, header_tags=((3, b"t"),) if version >= 9 else ())
    header, entity = decode_response(METADATA, version, frame)
    whole = encode_response(header, rewrite_endpoints(METADATA, entity, any_endpoint))
    assert rewrite_response(METADATA, version, frame, any_endpoint) == whole
    located = locate_metadata_brokers(version, frame)
    assert located.endpoints() == upstream_endpoints(METADATA, entity)


def test_metadata_rewrite_keeps_the_bytes_after_the_brokers_verbatim():
    m = module(METADATA, 12)
    response = build(m.MetadataResponse,
                     brokers=(build(m.MetadataResponseBroker, node_id=i32(1), host="kafka-1", port=i32(9092)),),
                     topics=())
    frame = response_frame(response, correlation_id=5)
    # Bytes kio would not write back (say, a tagged field it does not know) survive: only the
    # brokers array is re-encoded.
    unknown_tail = frame[:-1] + b"\x01\x63\x02hi"  # the response's tagged fields: tag 99, 2 bytes
    rewritten = rewrite_response(METADATA, 12, unknown_tail, endpoint_of)
    assert rewritten.endswith(b"\x01\x63\x02hi")
    assert locate_metadata_brokers(12, rewritten).endpoints() == [Endpoint(1, "proxy.example", 30001)]


@pytest.mark.parametrize("version", [0, 3, 12])
def test_metadata_with_a_truncated_brokers_array_is_an_upstream_error(version):
    m = module(METADATA, version)
    response = build(m.MetadataResponse,
                     brokers=(build(m.MetadataResponseBroker, node_id=i32(1), host="kafka-1", port=i32(9092)),),
                     topics=())
    frame = response_frame(response, correlation_id=5)
    cut = frame.index(b"kafka-1") + 3
    with pytest.raises(UpstreamError):
        rewrite_response(METADATA, version, frame[:cut], endpoint_of)
