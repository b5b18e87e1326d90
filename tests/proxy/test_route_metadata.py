"""Metadata routed to virtual nodes: patched bytes equal kio's encoding of the same rewrite, every version."""

import dataclasses
import io
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.schema.index import schema_name_map
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32

from proxy.errors import UpstreamError
from proxy.rewrite import METADATA, decode_response, locate_metadata_brokers
from proxy.route_metadata import metadata_layout, route_metadata
from proxy.vnodes import Instance, vnode
from tests.codec.strategies import entities
from tests.proxy.kio_build import build, has_field, response_frame

VERSIONS = sorted(schema_name_map["metadata"])
INSTANCES = [Instance(0, "ksp-0.ksp", 19100), Instance(1, "ksp-1.ksp", 19200), Instance(2, "ksp-2.ksp", 19300)]
SELF_SLOT = 1
ORDERS_ID = uuid.UUID("6f1c0bb4-7c5e-4b43-9d9e-6c0d7f3a8a11")


def module(version: int):
    return load_payload_module(METADATA, version, EntityType.response)


def owner_slot(name, topic_id, partition) -> int:
    """Deterministic and spread over the three instances, depending on all three arguments."""
    return (len(name or "") + (topic_id.int % 7 if topic_id else 0) + partition) % 3


def routed_by_kio(response, owner=owner_slot, instances=INSTANCES, self_slot=SELF_SLOT):
    """The same routing done on kio entities: what the byte patch must be equal to."""
    def nodes(slot, ids):
        return tuple(i32(vnode(slot, int(b))) for b in ids)

    topics = []
    for topic in response.topics:
        partitions = []
        for p in topic.partitions:
            slot = owner(topic.name, getattr(topic, "topic_id", None), int(p.partition_index))
            changes = {"leader_id": i32(vnode(slot, int(p.leader_id))), "replica_nodes": nodes(slot, p.replica_nodes),
                       "isr_nodes": nodes(slot, p.isr_nodes)}
            if has_field(type(p), "offline_replicas"):
                changes["offline_replicas"] = nodes(slot, p.offline_replicas)
            partitions.append(dataclasses.replace(p, **changes))
        topics.append(dataclasses.replace(topic, partitions=tuple(partitions)))
    brokers = tuple(
        dataclasses.replace(b, node_id=i32(j.node_for(int(b.node_id))), host=j.host, port=i32(j.port_for(int(b.node_id))))
        for j in instances for b in response.brokers
    )
    extra = ({"controller_id": i32(vnode(self_slot, int(response.controller_id)))}
             if has_field(type(response), "controller_id") else {})
    return dataclasses.replace(response, brokers=brokers, topics=tuple(topics), **extra)


def sample_response(version: int):
    """Brokers with racks, a topic with an id and three partitions (one without a leader), an
    error topic, a multi-byte name, and (v12+) a topic known only by id."""
    m = module(version)

    def partition(index, leader, replicas, isr, offline=(), epoch=7, error=ErrorCode.none):
        fields = {"partition_index": i32(index), "leader_id": i32(leader), "replica_nodes": tuple(map(i32, replicas)),
                  "isr_nodes": tuple(map(i32, isr)), "error_code": error}
        if has_field(m.MetadataResponsePartition, "offline_replicas"):
            fields["offline_replicas"] = tuple(map(i32, offline))
        if has_field(m.MetadataResponsePartition, "leader_epoch"):
            fields["leader_epoch"] = i32(epoch)
        return build(m.MetadataResponsePartition, **fields)

    def topic(name, partitions, topic_id=None, error=ErrorCode.none):
        fields = {"name": name, "partitions": partitions, "error_code": error}
        if has_field(m.MetadataResponseTopic, "topic_id"):
            fields["topic_id"] = topic_id
        return build(m.MetadataResponseTopic, **fields)

    rack = {"rack": "eu-1a"} if has_field(m.MetadataResponseBroker, "rack") else {}
    topics = [
        topic("orders", (
            partition(0, 1, (1, 2, 3), (1, 2), offline=(3,)),
            partition(1, 2, (2, 3, 1), (2, 3, 1), epoch=12),
            partition(2, -1, (3, 1, 2), (), offline=(3,), error=ErrorCode.leader_not_available),
        ), topic_id=ORDERS_ID),
        topic("commandes-été", (partition(0, 3, (3,), (3,)),), topic_id=uuid.UUID(int=99)),
        topic("missing", (), error=ErrorCode.unknown_topic_or_partition),
    ]
    if version >= 12:
        topics.append(topic(None, (), topic_id=uuid.UUID(int=5), error=ErrorCode.unknown_topic_id))
    top = {}
    if has_field(m.MetadataResponse, "cluster_id"):
        top["cluster_id"] = "cluster-é"
    if has_field(m.MetadataResponse, "controller_id"):
        top["controller_id"] = i32(2)
    return build(
        m.MetadataResponse,
        brokers=tuple(build(m.MetadataResponseBroker, node_id=i32(b), host=f"kafka-{b}.internal", port=i32(9090 + b),
                            **rack) for b in (1, 2, 3)),
        topics=tuple(topics),
        **top,
    )


def route(response, owner=owner_slot, header_tags=((7, b"tag"),)) -> bytes:
    frame = response_frame(response, correlation_id=99, header_tags=header_tags)
    return route_metadata(int(response.__version__), frame, owner, INSTANCES, SELF_SLOT)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_node_id_is_routed_and_nothing_else_changes(version):
    response = sample_response(version)
    expected = routed_by_kio(response)
    routed = route(response)
    assert routed == response_frame(expected, correlation_id=99, header_tags=((7, b"tag"),))
    _, decoded = decode_response(METADATA, version, routed)
    assert decoded == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_the_topics_keep_their_byte_length_only_the_brokers_grow(version):
    response = sample_response(version)
    frame = response_frame(response, header_tags=())
    routed = route(response, header_tags=())
    old = locate_metadata_brokers(version, frame)
    new = locate_metadata_brokers(version, routed)
    assert len(frame) - old.end == len(routed) - new.end
    assert len(new.brokers) == len(INSTANCES) * len(old.brokers)


@pytest.mark.parametrize("version", VERSIONS)
def test_owner_slot_is_asked_once_per_partition_with_what_the_version_carries(version):
    asked = []

    def recording(name, topic_id, partition):
        asked.append((name, topic_id, partition))
        return 0

    route(sample_response(version), owner=recording)
    orders_id = ORDERS_ID if metadata_layout(version).topic_id else None
    other_id = uuid.UUID(int=99) if metadata_layout(version).topic_id else None
    assert asked == [("orders", orders_id, 0), ("orders", orders_id, 1), ("orders", orders_id, 2),
                     ("commandes-été", other_id, 0)]


def test_the_layout_follows_the_schema_versions():
    assert [v for v in VERSIONS if metadata_layout(v).topic_id] == list(range(10, 14))
    assert [v for v in VERSIONS if metadata_layout(v).offline_replicas] == list(range(5, 14))
    assert [v for v in VERSIONS if metadata_layout(v).leader_epoch] == list(range(7, 14))
    assert [v for v in VERSIONS if metadata_layout(v).flexible] == list(range(9, 14))
    assert [v for v in VERSIONS if metadata_layout(v).controller_id] == list(range(1, 14))


def _in_range(response):
    """A generated response with every broker id made one virtual nodes can carry."""
    def fix(b):
        return i32(-1 if int(b) < 0 else int(b) % (1 << 20))

    def fix_partition(p):
        changes = {"leader_id": fix(p.leader_id), "replica_nodes": tuple(map(fix, p.replica_nodes)),
                   "isr_nodes": tuple(map(fix, p.isr_nodes))}
        if has_field(type(p), "offline_replicas"):
            changes["offline_replicas"] = tuple(map(fix, p.offline_replicas))
        return dataclasses.replace(p, **changes)

    topics = tuple(dataclasses.replace(t, partitions=tuple(map(fix_partition, t.partitions))) for t in response.topics)
    brokers = tuple(dataclasses.replace(b, node_id=i32(abs(int(b.node_id)) % (1 << 20))) for b in response.brokers)
    extra = {"controller_id": fix(response.controller_id)} if has_field(type(response), "controller_id") else {}
    return dataclasses.replace(response, brokers=brokers, topics=topics, **extra)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_response_routes_as_kio_would(version, data):
    response = _in_range(data.draw(entities(module(version).MetadataResponse)))
    expected = response_frame(routed_by_kio(response), correlation_id=99, header_tags=())
    assert route(response, header_tags=()) == expected


def _tags(*fields: tuple[int, bytes]) -> bytes:
    out = bytes([len(fields)])
    for tag, value in fields:
        out += bytes([tag, len(value)]) + value
    return out


@pytest.mark.parametrize("version", [v for v in VERSIONS if metadata_layout(v).flexible])
def test_unknown_tagged_fields_are_skipped_by_their_length_and_kept(version):
    m = module(version)
    part = build(m.MetadataResponsePartition, partition_index=i32(4), leader_id=i32(3), leader_epoch=i32(9),
                 replica_nodes=(i32(3), i32(1)), isr_nodes=(i32(3),), offline_replicas=(i32(1),))
    topic_id = {"topic_id": uuid.UUID(int=77)} if has_field(m.MetadataResponseTopic, "topic_id") else {}
    topic = build(m.MetadataResponseTopic, name="tagged", partitions=(part,), **topic_id)
    response = build(m.MetadataResponse, brokers=(build(m.MetadataResponseBroker, node_id=i32(3), host="k", port=i32(1)),),
                     controller_id=i32(3), topics=(topic,))

    def with_tags(entity):
        """kio's frame of ``entity`` with tagged fields spliced into the partition and topic."""
        frame = response_frame(entity, header_tags=())
        part_bytes, topic_bytes = _body(entity.topics[0].partitions[0]), _body(entity.topics[0])
        part_end = frame.index(part_bytes) + len(part_bytes) - 1  # its empty tag section
        topic_end = frame.index(topic_bytes) + len(topic_bytes) - 1
        assert frame[part_end] == 0 and frame[topic_end] == 0
        frame = frame[:topic_end] + _tags((3, b"\xff\xff\xff\xff"), (40, b"x" * 9)) + frame[topic_end + 1 :]
        return frame[:part_end] + _tags((1, b"\x00\x00\x00\x01")) + frame[part_end + 1 :]

    routed = route_metadata(version, with_tags(response), owner_slot, INSTANCES, SELF_SLOT)
    assert routed == with_tags(routed_by_kio(response))


def _body(entity) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


@pytest.mark.parametrize("version", [0, 9, 13])
def test_a_broker_id_beyond_2_to_the_20_is_refused_naming_the_limit(version):
    m = module(version)
    big = build(m.MetadataResponseBroker, node_id=i32(1 << 20), host="k", port=i32(1))
    with pytest.raises(UpstreamError, match=r"2\*\*20"):
        route(build(m.MetadataResponse, brokers=(big,), topics=()))
    response = sample_response(version)
    part = dataclasses.replace(response.topics[0].partitions[0], replica_nodes=(i32(1), i32(1 << 20)))
    topic = dataclasses.replace(response.topics[0], partitions=(part,))
    with pytest.raises(UpstreamError, match=r"2\*\*20"):
        route(dataclasses.replace(response, topics=(topic,)))


@pytest.mark.parametrize("version", [0, 9, 13])
def test_a_truncated_response_is_an_upstream_error(version):
    frame = response_frame(sample_response(version), header_tags=())
    with pytest.raises(UpstreamError):
        route_metadata(version, frame[:-12], owner_slot, INSTANCES, SELF_SLOT)


def test_an_owner_slot_outside_the_range_is_refused():
    with pytest.raises(UpstreamError, match="0..2046"):
        route(sample_response(13), owner=lambda *_: 2047)
