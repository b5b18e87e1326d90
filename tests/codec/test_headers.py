import pytest
from hypothesis import given
from hypothesis import strategies as st

from codec.errors import CodecError, HeaderError
from codec.headers import (
    FLEXIBILITY,
    RequestHeader,
    ResponseHeader,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    request_expects_response,
    request_header_version,
    response_header_version,
)

METADATA, FETCH, PRODUCE, API_VERSIONS, SASL_HANDSHAKE = 3, 1, 0, 18, 17


@pytest.mark.parametrize(
    ("api_key", "api_version", "request_version", "response_version"),
    [
        (METADATA, 8, 1, 0),
        (METADATA, 9, 2, 1),
        (FETCH, 11, 1, 0),
        (FETCH, 12, 2, 1),
        (PRODUCE, 8, 1, 0),
        (PRODUCE, 9, 2, 1),
        (API_VERSIONS, 2, 1, 0),
        # ApiVersions v3 is flexible, but its response header stays v0.
        (API_VERSIONS, 3, 2, 0),
        (SASL_HANDSHAKE, 1, 1, 0),
        (7, 0, 0, 0),
    ],
)
def test_header_versions_follow_flexible_versions(api_key, api_version, request_version, response_version):
    if api_key == 7:
        # ControlledShutdown is gone from kio (removed in Kafka 4.0); only its v0 request rule remains.
        assert request_header_version(api_key, api_version) == request_version
        return
    assert request_header_version(api_key, api_version) == request_version
    assert response_header_version(api_key, api_version) == response_version


def test_versions_newer_than_kio_are_flexible_and_older_are_not():
    newest = FLEXIBILITY[METADATA].max_version
    assert request_header_version(METADATA, newest + 5) == 2
    assert request_header_version(FETCH, 0) == 1


def test_unknown_api_key_is_a_header_error():
    with pytest.raises(HeaderError):
        request_header_version(9999, 0)


def test_parse_request_header_v1():
    frame = b"\x00\x03\x00\x08\x00\x00\x00\x07\x00\x03abc" + b"BODY"
    header, offset = parse_request_header(frame)
    assert header == RequestHeader(METADATA, 8, 7, "abc", ())
    assert frame[offset:] == b"BODY"


def test_parse_request_header_v2_with_tagged_fields_and_null_client_id():
    frame = b"\x00\x03\x00\x0c\x00\x00\x00\x09\xff\xff" + b"\x02\x00\x01z\x05\x02hi" + b"BODY"
    header, offset = parse_request_header(frame)
    assert header == RequestHeader(METADATA, 12, 9, None, ((0, b"z"), (5, b"hi")))
    assert frame[offset:] == b"BODY"


def test_client_id_stays_a_legacy_string_in_header_v2():
    encoded = encode_request_header(RequestHeader(METADATA, 12, 1, "ab"))
    assert encoded == b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x02ab\x00"


def test_request_header_v0_has_no_client_id():
    header, offset = parse_request_header(b"\x00\x07\x00\x00\x00\x00\x00\x01rest")
    assert (header.api_key, header.correlation_id, header.client_id, offset) == (7, 1, None, 8)


def test_response_headers():
    assert encode_response_header(5, 0) == b"\x00\x00\x00\x05"
    assert encode_response_header(5, 1) == b"\x00\x00\x00\x05\x00"
    header, offset = parse_response_header(b"\x00\x00\x00\x05\x01\x03\x01xB", 1)
    assert header == ResponseHeader(5, ((3, b"x"),))
    assert offset == 8


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00",
        b"\x00\x03\x00\x08\x00\x00\x00\x07\x00",  # truncated client id length
        b"\x00\x03\x00\x08\x00\x00\x00\x07\x00\x09ab",  # client id longer than frame
        b"\x00\x03\x00\x08\x00\x00\x00\x07\xff\xfe",  # length -2
        b"\x00\x03\x00\x0c\x00\x00\x00\x07\xff\xff\x01\x00\x7f",  # tagged field runs past the end
        b"\x00\x03\x00\x0c\x00\x00\x00\x07\xff\xff\xff\xff\xff\xff\xff",  # varint too long
        b"\x00\x03\x00\x08\x00\x00\x00\x07\x00\x02\xff\xfe",  # invalid UTF-8
        b"\x27\x0f\x00\x00\x00\x00\x00\x01",  # unknown API key 9999
        b"\x00\x03\xff\xff\x00\x00\x00\x01",  # negative version
    ],
)
def test_malformed_request_headers_raise_header_error(frame):
    with pytest.raises(HeaderError):
        parse_request_header(frame)


def _produce_frame(version: int, acks: int) -> tuple[RequestHeader, bytes, int]:
    header = RequestHeader(PRODUCE, version, 1, "c")
    head = encode_request_header(header)
    if version >= 9:
        body = b"\x03tx" + acks.to_bytes(2, "big", signed=True)  # compact string "tx"
    else:
        body = b"\xff\xff" + acks.to_bytes(2, "big", signed=True)  # null transactional id
    return header, head + body + b"rest", len(head)


@pytest.mark.parametrize("version", [3, 8, 9, 11])
@pytest.mark.parametrize(("acks", "expected"), [(0, False), (1, True), (-1, True)])
def test_only_produce_with_acks_zero_expects_no_response(version, acks, expected):
    header, frame, offset = _produce_frame(version, acks)
    assert request_expects_response(header, frame, offset) is expected


known_apis = st.sampled_from(sorted(FLEXIBILITY))
tagged_fields = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=20)), max_size=4
).map(tuple)


@st.composite
def request_headers(draw):
    api_key = draw(known_apis)
    flexibility = FLEXIBILITY[api_key]
    version = draw(st.integers(flexibility.min_version, flexibility.max_version))
    flexible = request_header_version(api_key, version) == 2
    return RequestHeader(
        api_key=api_key,
        api_version=version,
        correlation_id=draw(st.integers(-(2**31), 2**31 - 1)),
        client_id=draw(st.none() | st.text(max_size=30)),
        tagged_fields=draw(tagged_fields) if flexible else (),
    )


@given(request_headers(), st.binary(max_size=10))
def test_request_header_round_trip(header, body):
    frame = encode_request_header(header) + body
    parsed, offset = parse_request_header(frame)
    assert parsed == header
    assert frame[offset:] == body


@given(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1]), tagged_fields, st.binary(max_size=10))
def test_response_header_round_trip(correlation_id, version, fields, body):
    fields = fields if version == 1 else ()
    frame = encode_response_header(correlation_id, version, fields) + body
    parsed, offset = parse_response_header(frame, version)
    assert parsed == ResponseHeader(correlation_id, fields)
    assert frame[offset:] == body


@given(st.binary(max_size=64))
def test_garbage_request_headers_raise_only_codec_errors(garbage):
    try:
        header, offset = parse_request_header(garbage)
    except CodecError:
        return
    assert 0 < offset <= len(garbage)
    assert header.api_key in FLEXIBILITY


@given(st.binary(max_size=64), st.sampled_from([0, 1]))
def test_garbage_response_headers_raise_only_codec_errors(garbage, version):
    try:
        _, offset = parse_response_header(garbage, version)
    except CodecError:
        return
    assert offset <= len(garbage)


@given(request_headers(), st.binary(max_size=6))
def test_expects_response_on_garbage_bodies_raises_only_codec_errors(header, body):
    frame = encode_request_header(header) + body
    parsed, offset = parse_request_header(frame)
    try:
        result = request_expects_response(parsed, frame, offset)
    except CodecError:
        return
    assert isinstance(result, bool)
