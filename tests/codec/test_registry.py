import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.share_fetch.v2.request import ShareFetchRequest
from kio.static.primitive import i32

from codec.errors import MessageDecodeError, MessageEncodeError, UnsupportedApi
from codec.registry import DEFAULT_REGISTRY, MessageRegistry, encode

from .strategies import entities

SERVED = [
    (api_key, version, kind, cls)
    for api_key, version, request, response in DEFAULT_REGISTRY.entity_types()
    for kind, cls in (("request", request), ("response", response))
]


@pytest.mark.parametrize(
    ("api_key", "version", "kind", "entity_type"),
    SERVED,
    ids=[f"{DEFAULT_REGISTRY.name(k)}-v{v}-{kind}" for k, v, kind, _ in SERVED],
)
def test_every_served_message_round_trips(api_key, version, kind, entity_type):
    decode = DEFAULT_REGISTRY.decode_request if kind == "request" else DEFAULT_REGISTRY.decode_response

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(entities(entity_type))
    def round_trip(value):
        body = encode(value)
        assert decode(api_key, version, body) == value
        assert decode(api_key, version, memoryview(body)) == value

    round_trip()


def test_share_api_versions_match_kafka_4_4_and_skip_early_access_v0():
    assert DEFAULT_REGISTRY.supported_versions(76) == (1, 1)
    assert DEFAULT_REGISTRY.supported_versions(77) == (1, 1)
    assert DEFAULT_REGISTRY.supported_versions(78) == (1, 2)
    assert DEFAULT_REGISTRY.supported_versions(79) == (1, 2)
    assert DEFAULT_REGISTRY.supported_versions(90) == (0, 1)
    assert DEFAULT_REGISTRY.supported_versions(91) == (0, 0)
    assert DEFAULT_REGISTRY.supported_versions(92) == (0, 0)
    with pytest.raises(UnsupportedApi):
        DEFAULT_REGISTRY.decode_request(78, 0, b"")


def test_versions_kio_lacks_come_from_our_definitions():
    assert DEFAULT_REGISTRY.supported_versions(18) == (0, 5)
    assert DEFAULT_REGISTRY.supported_versions(42) == (0, 3)
    request = DEFAULT_REGISTRY.request_type(18, 5)(
        client_software_name="c", client_software_version="1", cluster_id="abc", node_id=i32(3)
    )
    assert DEFAULT_REGISTRY.decode_request(18, 5, encode(request)) == request
    result_type = DEFAULT_REGISTRY.response_type(42, 3).DeletableGroupResult
    assert "error_message" in result_type.__dataclass_fields__


def test_unserved_api_key_is_unsupported():
    assert not DEFAULT_REGISTRY.serves(0)  # Produce passes through, never decoded
    with pytest.raises(UnsupportedApi):
        DEFAULT_REGISTRY.supported_versions(0)
    with pytest.raises(UnsupportedApi):
        DEFAULT_REGISTRY.decode_request(79, 3, b"")


def test_trailing_bytes_after_a_body_are_rejected():
    request = ShareFetchRequest(
        member_id="m", share_session_epoch=i32(0), max_wait=__import__("datetime").timedelta(0),
        min_bytes=i32(1), max_records=i32(10), batch_size=i32(10), topics=(), forgotten_topics_data=(),
    )
    with pytest.raises(MessageDecodeError, match="trailing"):
        DEFAULT_REGISTRY.decode_request(78, 2, encode(request) + b"\x00")


def test_extension_keys_are_configurable():
    moved = MessageRegistry(mark_in_progress_key=10081, describe_in_flight_key=10082)
    assert moved.name(10081) == "MarkInProgress"
    assert moved.name(10082) == "DescribeShareGroupInFlight"
    assert not moved.serves(81) and not moved.serves(82)
    assert moved.request_type(10081, 0).__api_key__ == 10081
    assert DEFAULT_REGISTRY.name(81) == "MarkInProgress"


def test_extension_key_colliding_with_a_served_api_is_refused():
    with pytest.raises(ValueError, match="78"):
        MessageRegistry(mark_in_progress_key=78)


def test_encode_after_a_header_is_the_header_then_the_body():
    request_type = DEFAULT_REGISTRY.request_type(81, 0)
    entity = request_type(member_id="m", share_session_epoch=i32(2), topics=())
    assert encode(entity, header=b"\x00\x00\x00\x07") == b"\x00\x00\x00\x07" + encode(entity)


def test_encode_out_of_range_value_is_a_codec_error():
    request_type = DEFAULT_REGISTRY.request_type(81, 0)
    bad = request_type(member_id="m", share_session_epoch=2**40, topics=())
    with pytest.raises(MessageEncodeError):
        encode(bad)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SERVED), st.binary(max_size=200))
def test_random_bodies_raise_only_decode_errors(served, body):
    api_key, version, kind, _ = served
    decode = DEFAULT_REGISTRY.decode_request if kind == "request" else DEFAULT_REGISTRY.decode_response
    try:
        decode(api_key, version, body)
    except MessageDecodeError:
        pass


def test_hostile_array_count_is_rejected_before_kio_allocates():
    # MarkInProgress v0: group_id null, member_id "m", epoch, then a topics count of 2**32 - 2.
    body = b"\x00" + b"\x02m" + b"\x00\x00\x00\x01" + b"\xff\xff\xff\xff\x0f"
    with pytest.raises(MessageDecodeError, match="elements"):
        DEFAULT_REGISTRY.decode_request(81, 0, body)


def test_a_null_array_is_refused_where_the_field_is_not_nullable():
    # MarkInProgress v0: group_id null, member_id "m", epoch 1, then Topics as a null compact array
    # (length 0). kio read it as None, where every reader of the request expects a tuple.
    body = b"\x00" + b"\x02m" + b"\x00\x00\x00\x01" + b"\x00" + b"\x00"
    with pytest.raises(MessageDecodeError, match="not nullable"):
        DEFAULT_REGISTRY.decode_request(81, 0, body)
    # Where Kafka's schema makes the array nullable, null still reads as None: Metadata v12's
    # Topics (null: all topics).
    request = DEFAULT_REGISTRY.request_type(3, 12)(topics=None, include_topic_authorized_operations=False)
    assert DEFAULT_REGISTRY.decode_request(3, 12, encode(request)).topics is None


def test_uuid_zero_reads_back_as_none():
    topic_type = DEFAULT_REGISTRY.request_type(81, 0).ProgressTopic
    assert topic_type(topic_id=uuid.UUID(int=0)).topic_id == uuid.UUID(int=0)
    request = DEFAULT_REGISTRY.request_type(81, 0)(member_id="m", topics=(topic_type(topic_id=None),))
    assert DEFAULT_REGISTRY.decode_request(81, 0, encode(request)).topics[0].topic_id is None
