import pytest
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16, i64

from codec.headers import RequestHeader
from proxy.apiversions import (
    FORWARDABLE,
    ApiVersionTable,
    VersionRange,
    narrow_response,
    unsupported_version_response,
)
from proxy.connection import Request
from proxy.rewrite import decode_response
from proxy.server import ApiVersionsRoute
from tests.proxy.kio_build import build, response_frame

PRODUCE, FETCH, METADATA, SASL_HANDSHAKE, API_VERSIONS, SHARE_FETCH = 0, 1, 3, 17, 18, 78

BROKER_4X = [
    (PRODUCE, 3, 13),
    (FETCH, 4, 18),
    (METADATA, 0, 13),
    (SASL_HANDSHAKE, 0, 1),
    (API_VERSIONS, 0, 4),
    (SHARE_FETCH, 1, 2),  # a broker with native share groups
    (5000, 0, 3),  # an API the proxy has never heard of
]


def test_narrow_intersects_with_the_proxy_and_drops_what_it_cannot_carry():
    narrowed = ApiVersionTable().narrow(BROKER_4X)
    assert narrowed == [
        (PRODUCE, 3, 9),  # KIP-951 NodeEndpoints start at v10
        (FETCH, 4, 15),  # ... and at v16 for Fetch
        (METADATA, 0, 13),
        (SASL_HANDSHAKE, 1, 1),  # v0 is followed by unframed SASL bytes
        (API_VERSIONS, 0, 4),
    ]


def test_narrow_uses_the_brokers_range_when_it_is_smaller():
    assert ApiVersionTable().narrow([(METADATA, 1, 5)]) == [(METADATA, 1, 5)]
    assert ApiVersionTable().narrow([(PRODUCE, 10, 11)]) == []


def test_local_apis_are_advertised_even_when_the_broker_lacks_them():
    table = ApiVersionTable()
    table.register_local(SHARE_FETCH, VersionRange(1, 2))
    assert (SHARE_FETCH, 1, 2) in table.narrow([(METADATA, 0, 12)])
    assert table.accepts(SHARE_FETCH, 2)
    assert not table.accepts(SHARE_FETCH, 0)


def test_accepts_only_advertisable_versions():
    table = ApiVersionTable()
    assert table.accepts(FETCH, 15)
    assert not table.accepts(FETCH, 16)
    assert not table.accepts(SHARE_FETCH, 1)
    assert not table.accepts(5000, 0)


def test_forwardable_excludes_share_and_share_state_apis():
    assert not set(FORWARDABLE) & {76, 77, 78, 79, 83, 84, 85, 86, 87, 90, 91, 92}


def test_unsupported_version_answer_matches_kafka_bytes():
    # Header v0 (correlation id), v0 body: error 35, [ApiVersions 0..4].
    assert unsupported_version_response(7, VersionRange(0, 4)) == bytes.fromhex(
        "00000007" "0023" "00000001" "0012" "0000" "0004"
    )


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_narrow_response_keeps_other_fields(version):
    m = load_payload_module(API_VERSIONS, version, EntityType.response)
    extra = {}
    if version >= 3:
        extra = dict(
            supported_features=(m.SupportedFeatureKey(name="share.version", min_version=i16(0), max_version=i16(1)),),
            finalized_features_epoch=i64(12),
        )
    response = build(
        m.ApiVersionsResponse,
        api_keys=tuple(m.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi)) for k, lo, hi in BROKER_4X),
        **extra,
    )
    narrowed = narrow_response(response, ApiVersionTable())
    assert [(a.api_key, a.min_version, a.max_version) for a in narrowed.api_keys] == ApiVersionTable().narrow(BROKER_4X)
    for name, value in extra.items():
        assert getattr(narrowed, name) == value


async def test_route_narrows_a_forwarded_response():
    m = load_payload_module(API_VERSIONS, 3, EntityType.response)
    response = build(
        m.ApiVersionsResponse,
        api_keys=tuple(m.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi)) for k, lo, hi in BROKER_4X),
    )
    request = Request(RequestHeader(API_VERSIONS, 3, 42, "c"), b"", 0)
    payload = await ApiVersionsRoute(ApiVersionTable()).narrow(request, response_frame(response))
    _, decoded = decode_response(API_VERSIONS, 3, payload)
    assert (FETCH, 4, 15) in [(a.api_key, a.min_version, a.max_version) for a in decoded.api_keys]
    assert payload[:4] == (42).to_bytes(4, "big")


async def test_route_reads_a_brokers_unsupported_version_answer_as_v0():
    # The broker only knows ApiVersions up to v3 but the client asked v4: the answer has a v0 body.
    m = load_payload_module(API_VERSIONS, 0, EntityType.response)
    response = m.ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=(m.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),),
    )
    request = Request(RequestHeader(API_VERSIONS, 4, 42, "c"), b"", 0)
    payload = await ApiVersionsRoute(ApiVersionTable()).narrow(request, response_frame(response))
    _, decoded = decode_response(API_VERSIONS, 0, payload)
    assert decoded.error_code == ErrorCode.unsupported_version
    assert [(a.api_key, a.min_version, a.max_version) for a in decoded.api_keys] == [(18, 0, 3)]


@pytest.mark.parametrize("version", [3, 4, 5])
def test_registered_features_join_the_brokers_from_v3(version):
    from codec.registry import DEFAULT_REGISTRY

    response_type = (DEFAULT_REGISTRY.response_type(API_VERSIONS, 5) if version == 5
                     else load_payload_module(API_VERSIONS, version, EntityType.response).ApiVersionsResponse)
    feature = (response_type.SupportedFeatureKey if version == 5
               else load_payload_module(API_VERSIONS, version, EntityType.response).SupportedFeatureKey)
    api_version = (response_type.ApiVersion if version == 5
                   else load_payload_module(API_VERSIONS, version, EntityType.response).ApiVersion)
    response = build(
        response_type,
        api_keys=tuple(api_version(api_key=i16(k), min_version=i16(lo), max_version=i16(hi)) for k, lo, hi in BROKER_4X),
        supported_features=(feature(name="share.version", min_version=i16(0), max_version=i16(1)),
                            feature(name="kafka-share-proxy.mark-in-progress.api-key", min_version=i16(1),
                                    max_version=i16(1))),  # a stale value upstream never wins
    )
    table = ApiVersionTable()
    table.register_local(81, VersionRange(0, 0))
    table.register_feature("kafka-share-proxy.mark-in-progress.api-key", VersionRange(81, 81))
    table.register_feature("kafka-share-proxy.describe-in-flight.api-key", VersionRange(82, 82))

    narrowed = narrow_response(response, table)

    assert [(f.name, f.min_version, f.max_version) for f in narrowed.supported_features] == [
        ("share.version", 0, 1),
        ("kafka-share-proxy.describe-in-flight.api-key", 82, 82),
        ("kafka-share-proxy.mark-in-progress.api-key", 81, 81),
    ]
    assert (81, 0, 0) in [(a.api_key, a.min_version, a.max_version) for a in narrowed.api_keys]


def test_features_are_not_added_before_v3():
    m = load_payload_module(API_VERSIONS, 2, EntityType.response)
    response = build(m.ApiVersionsResponse, api_keys=(m.ApiVersion(api_key=i16(18), min_version=i16(0),
                                                                   max_version=i16(2)),))
    table = ApiVersionTable()
    table.register_feature("kafka-share-proxy.mark-in-progress.api-key", VersionRange(81, 81))
    narrowed = narrow_response(response, table)
    assert not hasattr(narrowed, "supported_features")
    assert [(a.api_key, a.max_version) for a in narrowed.api_keys] == [(18, 2)]


def broker_answer(correlation_id: int, keys=BROKER_4X) -> bytes:
    m = load_payload_module(API_VERSIONS, 3, EntityType.response)
    response = build(
        m.ApiVersionsResponse,
        api_keys=tuple(m.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi)) for k, lo, hi in keys),
    )
    return response_frame(response, correlation_id=correlation_id)


def ranges(payload: bytes) -> list[tuple[int, int, int]]:
    _, decoded = decode_response(API_VERSIONS, 3, payload)
    return [(a.api_key, a.min_version, a.max_version) for a in decoded.api_keys]


async def test_the_same_broker_answer_is_narrowed_once_and_each_client_gets_its_correlation_id(monkeypatch):
    route = ApiVersionsRoute(ApiVersionTable())
    first = await route.narrow(Request(RequestHeader(API_VERSIONS, 3, 1, "a"), b"", 0), broker_answer(1))

    def no_second_narrowing(*args):
        raise AssertionError("narrowed again")

    monkeypatch.setattr(route, "_narrow", no_second_narrowing)
    second = await route.narrow(Request(RequestHeader(API_VERSIONS, 3, 7, "b"), b"", 0), broker_answer(7))
    assert (first[:4], second[:4]) == ((1).to_bytes(4, "big"), (7).to_bytes(4, "big"))
    assert first[4:] == second[4:]


async def test_a_different_broker_answer_or_a_changed_table_is_narrowed_afresh():
    table = ApiVersionTable()
    route = ApiVersionsRoute(table)
    request = Request(RequestHeader(API_VERSIONS, 3, 1, "a"), b"", 0)
    before = ranges(await route.narrow(request, broker_answer(1)))
    assert (SHARE_FETCH, 1, 2) not in before
    table.register_local(SHARE_FETCH, VersionRange(1, 1))  # the share service starts
    assert (SHARE_FETCH, 1, 1) in ranges(await route.narrow(request, broker_answer(1)))
    older_broker = [(k, lo, min(hi, 2)) for k, lo, hi in BROKER_4X]
    assert (METADATA, 0, 2) in ranges(await route.narrow(request, broker_answer(1, older_broker)))
