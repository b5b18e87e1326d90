"""The state-topic guard on a real connection loop (in-memory client and broker).

Every request is built with kio for every version the proxy forwards; what reaches the fake
broker and what the client gets back are decoded again with kio.
"""

from __future__ import annotations

import datetime
import os
import typing
import uuid

import pytest
import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records, i8, i16, i32, i64

from codec.headers import (
    RequestHeader,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    response_header_version,
)
from codec.framing import encode_frame
from codec.records import encode_batch
from codec.registry import decode_entity, encode
from proxy import metrics as connection_metrics
from proxy.apiversions import FORWARDABLE, ApiVersionTable, VersionRange
from proxy.share import metrics
from proxy.share.state_topic_guard import (
    ALTER_CONFIGS,
    CREATE_PARTITIONS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    INCREMENTAL_ALTER_CONFIGS,
    PRODUCE,
    TOPIC_RESOURCE,
    StateTopics,
    state_topic_routes,
)
from tests.proxy.test_connection import (
    Harness,
    assert_closed_by_proxy,
    correlation_of,
    open_upstream_with_a_small_request,
    receive_at_least,
)
from tests.proxy.test_connection import request as request_frame

STATE = "__share_proxy_state"
STATE_ID = uuid.UUID("0b5e7a7e-0000-4000-8000-000000000001")
AUTH_FAILED = ErrorCode.topic_authorization_failed
TOPICS = StateTopics(frozenset({STATE}), ids=lambda: {STATE_ID: STATE})
ALL_PRODUCE = ApiVersionTable({**FORWARDABLE, PRODUCE: VersionRange(3, 13)})

PRODUCE_SERVED = range(FORWARDABLE[PRODUCE].min_version, FORWARDABLE[PRODUCE].max_version + 1)


def versions(api_key: int) -> range:
    served = FORWARDABLE[api_key]
    return range(served.min_version, served.max_version + 1)


def item(cls: type, field: str) -> type:
    return typing.get_args(typing.get_type_hints(cls)[field])[0]


def frame_of(entity: object, correlation_id: int = 7) -> bytes:
    header = RequestHeader(int(entity.__api_key__), int(entity.__version__), correlation_id, "guard-test")
    return encode_request_header(header) + encode(entity)


def body_of(frame: bytes) -> tuple[int, int, memoryview]:
    header, offset = parse_request_header(frame)
    return header.api_version, header.correlation_id, memoryview(frame)[offset:]


def decode_request(api_key: int, frame: bytes) -> object:
    version, _, body = body_of(frame)
    return decode_entity(load_request_schema(api_key, version), body)


def decode_response(api_key: int, version: int, frame: bytes) -> object:
    header_version = response_header_version(api_key, version)
    offset = 4 if header_version == 0 else 5
    assert int.from_bytes(frame[:4], "big") == 7
    return decode_entity(load_response_schema(api_key, version), memoryview(frame)[offset:])


def response_frame(entity: object, correlation_id: int = 7) -> bytes:
    version = response_header_version(int(entity.__api_key__), int(entity.__version__))
    return encode_response_header(correlation_id, version) + encode(entity)


def guarded_harness(api_versions: ApiVersionTable | None = None) -> Harness:
    return Harness(routes=state_topic_routes(TOPICS, {}), api_versions=api_versions, max_frame_size=1 << 20)


# ----- Produce -----------------------------------------------------------------------------------


def produce(version: int, topics: list[tuple[str, list[int]]], acks: int = -1) -> object:
    cls = load_request_schema(PRODUCE, version)
    data_cls = item(cls, "topic_data")
    part_cls = item(data_cls, "partition_data")
    entries = []
    for name, partitions in topics:
        parts = tuple(part_cls(index=i32(p), records=Records(encode_batch(0, [name.encode()]))) for p in partitions)
        if version >= 13:
            topic_id = STATE_ID if name == STATE else uuid.uuid5(uuid.NAMESPACE_OID, name)
            entries.append(data_cls(topic_id=topic_id, partition_data=parts))
        else:
            entries.append(data_cls(name=name, partition_data=parts))
    return cls(transactional_id=None, acks=i16(acks), timeout=datetime.timedelta(seconds=30), topic_data=tuple(entries))


def produce_answer(version: int, request: object) -> object:
    """What a broker answers for `request`: every partition written at offset 100."""
    cls = load_response_schema(PRODUCE, version)
    topic_cls = item(cls, "responses")
    part_cls = item(topic_cls, "partition_responses")
    topics = []
    for topic in request.topic_data:
        parts = tuple(part_cls(index=p.index, error_code=ErrorCode.none, base_offset=i64(100), record_errors=())
                      if "record_errors" in part_cls.__dataclass_fields__ else
                      part_cls(index=p.index, error_code=ErrorCode.none, base_offset=i64(100))
                      for p in topic.partition_data)
        key = {"topic_id": topic.topic_id} if version >= 13 else {"name": topic.name}
        topics.append(topic_cls(**key, partition_responses=parts))
    return cls(responses=tuple(topics))


def refused_partitions(response: object) -> dict[str, list[tuple[int, ErrorCode, int]]]:
    found: dict[str, list] = {}
    for topic in response.responses:
        topic_id = getattr(topic, "topic_id", None)
        name = (STATE if topic_id == STATE_ID else str(topic_id)) if topic_id is not None else topic.name
        for p in topic.partition_responses:
            found.setdefault(name, []).append((int(p.index), p.error_code, int(p.base_offset)))
    return found


@pytest.mark.parametrize("version", range(3, 14))
async def test_produce_to_the_state_topic_only_is_answered_by_the_proxy(version):
    h = guarded_harness(ALL_PRODUCE)
    before = metrics.STATE_TOPIC_REFUSALS.labels(api_key="0")._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(produce(version, [(STATE, [0, 2])])))
        answer = decode_response(PRODUCE, version, await h.client.receive_frame())
        assert refused_partitions(answer) == {STATE: [(0, AUTH_FAILED, -1), (2, AUTH_FAILED, -1)]}
        if version >= 8:
            assert "share proxy" in answer.responses[0].partition_responses[0].error_message
        assert not h.broker_connected.is_set()  # nothing went upstream
        await h.client_side.aclose()
    assert metrics.STATE_TOPIC_REFUSALS.labels(api_key="0")._value.get() == before + 1


@pytest.mark.parametrize("version", PRODUCE_SERVED)
async def test_produce_to_other_topics_is_forwarded_byte_for_byte(version):
    h = guarded_harness()
    sent = frame_of(produce(version, [("orders", [0, 1]), (STATE + "-not", [0])]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        await h.broker.send_frame(b"\x00\x00\x00\x07" + b"\x00" * (1 if version >= 9 else 0) + b"opaque")
        assert (await h.client.receive_frame()).endswith(b"opaque")  # not decoded either
        await h.client_side.aclose()


@pytest.mark.parametrize("version", range(3, 14))
async def test_mixed_produce_forwards_the_other_topics_and_merges_the_refusal(version):
    h = guarded_harness(ALL_PRODUCE)
    request = produce(version, [("orders", [0, 1]), (STATE, [1]), ("payments", [3])])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        forwarded = await h.broker_receive()
        upstream = decode_request(PRODUCE, forwarded)
        assert upstream.topic_data == (request.topic_data[0], request.topic_data[2])  # records untouched
        assert body_of(forwarded)[:2] == (version, 7)
        await h.broker.send_frame(response_frame(produce_answer(version, upstream)))
        answer = decode_response(PRODUCE, version, await h.client.receive_frame())
        found = refused_partitions(answer)
        assert found.pop(STATE) == [(1, AUTH_FAILED, -1)]
        assert sorted(found.values()) == [[(0, ErrorCode.none, 100), (1, ErrorCode.none, 100)],
                                          [(3, ErrorCode.none, 100)]]
        await h.client_side.aclose()


@pytest.mark.parametrize("version", [3, 9])
async def test_produce_acks_0_to_the_state_topic_closes_the_connection_after_earlier_answers(version):
    h = guarded_harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        first = frame_of(produce(version, [("orders", [0])]), correlation_id=1)
        await h.client.send_frame(first)
        await h.client.send_frame(frame_of(produce(version, [(STATE, [0])], acks=0), correlation_id=2))
        assert await h.broker_receive() == first
        await h.broker.send_frame(b"\x00\x00\x00\x01" + b"\x00" * (1 if version >= 9 else 0) + b"ok")
        assert (await h.client.receive_frame()).endswith(b"ok")  # owed before the refusal: written
        await assert_closed_by_proxy(h)


@pytest.mark.parametrize("version", [3, 9])
async def test_mixed_produce_acks_0_forwards_the_other_topics_then_closes(version):
    h = guarded_harness()
    request = produce(version, [(STATE, [0]), ("orders", [0])], acks=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        upstream = decode_request(PRODUCE, await h.broker_receive())
        assert upstream.topic_data == (request.topic_data[1],)
        assert upstream.acks == 0
        await assert_closed_by_proxy(h)


async def test_a_state_topic_id_unknown_to_the_metadata_is_not_refused():
    h = Harness(routes=state_topic_routes(StateTopics(frozenset({STATE})), {}), api_versions=ALL_PRODUCE,
                max_frame_size=1 << 20)
    sent = frame_of(produce(13, [(STATE, [0])]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        nursery.cancel_scope.cancel()  # the fake broker never answers


async def test_a_malformed_produce_request_closes_the_connection_instead_of_passing():
    h = guarded_harness()
    sent = frame_of(produce(9, [("orders", [0]), (STATE, [0])]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent[: len(sent) - 40])  # cut inside the first topic's records
        await assert_closed_by_proxy(h)
    assert not h.broker_connected.is_set()


# ----- Produce arriving in pieces (--stream-requests-from) ---------------------------------------

STREAM = 128 * 1024


def large_produce(version: int, topics: list[tuple[str, int]]) -> object:
    """Produce with one partition per topic carrying a record of the given size."""
    cls = load_request_schema(PRODUCE, version)
    data_cls = item(cls, "topic_data")
    part_cls = item(data_cls, "partition_data")
    entries = tuple(data_cls(name=name, partition_data=(
        part_cls(index=i32(0), records=Records(encode_batch(0, [os.urandom(size)]))),)) for name, size in topics)
    return cls(transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=30), topic_data=entries)


def streaming_harness() -> Harness:
    return Harness(routes=state_topic_routes(TOPICS, {}), max_frame_size=2 << 20, stream_requests_from=STREAM,
                   tcp=True)


@pytest.mark.parametrize("version", [3, 9])
async def test_a_large_produce_to_one_other_topic_passes_on_as_it_arrives(version):
    h = streaming_harness()
    streamed_before = connection_metrics.REQUESTS_STREAMED._value.get()
    sent = encode_frame(frame_of(large_produce(version, [("orders", 900 * 1024)])))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await open_upstream_with_a_small_request(h)
        await h.client_side.send_all(sent[:300 * 1024])
        with trio.fail_after(5):  # gathered whole, nothing would reach the broker yet
            early = await receive_at_least(h.broker.stream, 200 * 1024)
        await h.client_side.send_all(sent[300 * 1024:])
        assert early + await receive_at_least(h.broker.stream, len(sent) - len(early)) == sent
        await h.broker.send_frame(b"\x00\x00\x00\x07" + b"\x00" * (1 if version >= 9 else 0) + b"opaque")
        assert (await h.client.receive_frame()).endswith(b"opaque")
        await h.client_side.aclose()
    await h.aclose()
    assert connection_metrics.REQUESTS_STREAMED._value.get() == streamed_before + 1


@pytest.mark.parametrize("version", [3, 9])
async def test_a_large_produce_to_the_state_topic_is_gathered_and_refused(version):
    h = streaming_harness()
    streamed_before = connection_metrics.REQUESTS_STREAMED._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await open_upstream_with_a_small_request(h)
        await h.client.send_frame(frame_of(large_produce(version, [(STATE, 900 * 1024)])))
        answer = decode_response(PRODUCE, version, await h.client.receive_frame())
        assert refused_partitions(answer) == {STATE: [(0, AUTH_FAILED, -1)]}
        # Nothing of it went upstream: the next request is the next thing the broker gets.
        await h.client.send_frame(request_frame(8))
        assert correlation_of(await h.broker_receive()) == 8
        await h.broker.send_frame(b"\x00\x00\x00\x08\x00metadata")
        assert await h.client.receive_frame() == b"\x00\x00\x00\x08\x00metadata"
        await h.client_side.aclose()
    await h.aclose()
    assert connection_metrics.REQUESTS_STREAMED._value.get() == streamed_before


@pytest.mark.parametrize("version", [3, 9])
async def test_a_large_produce_naming_the_state_topic_second_is_gathered_and_split(version):
    # The second topic's name comes after the first's records: the first bytes cannot clear it.
    h = streaming_harness()
    streamed_before = connection_metrics.REQUESTS_STREAMED._value.get()
    request = large_produce(version, [("orders", 900 * 1024), (STATE, 10)])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await open_upstream_with_a_small_request(h)
        await h.client.send_frame(frame_of(request))
        upstream = decode_request(PRODUCE, await h.broker_receive())
        assert upstream.topic_data == request.topic_data[:1]
        await h.broker.send_frame(response_frame(produce_answer(version, upstream)))
        answer = decode_response(PRODUCE, version, await h.client.receive_frame())
        assert refused_partitions(answer) == {"orders": [(0, ErrorCode.none, 100)], STATE: [(0, AUTH_FAILED, -1)]}
        await h.client_side.aclose()
    await h.aclose()
    assert connection_metrics.REQUESTS_STREAMED._value.get() == streamed_before


# ----- admin APIs ---------------------------------------------------------------------------------


def delete_records(version: int, names: list[str]) -> object:
    cls = load_request_schema(DELETE_RECORDS, version)
    topic_cls = item(cls, "topics")
    part_cls = item(topic_cls, "partitions")
    return cls(topics=tuple(topic_cls(name=n, partitions=(part_cls(partition_index=i32(0), offset=i64(5)),
                                                          part_cls(partition_index=i32(1), offset=i64(-1))))
                            for n in names), timeout=datetime.timedelta(seconds=30))


def delete_topics(version: int, names: list[str | uuid.UUID]) -> object:
    cls = load_request_schema(DELETE_TOPICS, version)
    if version < 6:
        return cls(topic_names=tuple(names), timeout=datetime.timedelta(seconds=30))
    state_cls = item(cls, "topics")
    return cls(topics=tuple(state_cls(topic_id=n) if isinstance(n, uuid.UUID) else state_cls(name=n, topic_id=None)
                            for n in names), timeout=datetime.timedelta(seconds=30))


def create_partitions(version: int, names: list[str]) -> object:
    cls = load_request_schema(CREATE_PARTITIONS, version)
    topic_cls = item(cls, "topics")
    return cls(topics=tuple(topic_cls(name=n, count=i32(6), assignments=None) for n in names),
               timeout=datetime.timedelta(seconds=30), validate_only=False)


def alter_configs(api_key: int, version: int, resources: list[tuple[int, str]]) -> object:
    cls = load_request_schema(api_key, version)
    resource_cls = item(cls, "resources")
    config_cls = item(resource_cls, "configs")
    extra = {"config_operation": i8(0)} if api_key == INCREMENTAL_ALTER_CONFIGS else {}
    config = config_cls(name="cleanup.policy", value="delete", **extra)
    return cls(resources=tuple(resource_cls(resource_type=i8(t), resource_name=n, configs=(config,))
                               for t, n in resources), validate_only=False)


def entries(api_key: int, entity: object) -> tuple:
    field = {DELETE_RECORDS: "topics", CREATE_PARTITIONS: "topics", ALTER_CONFIGS: "resources",
             INCREMENTAL_ALTER_CONFIGS: "resources"}.get(api_key)
    if field is None:
        field = "topic_names" if hasattr(entity, "topic_names") else "topics"
    return getattr(entity, field)


def results(api_key: int, response: object) -> dict[object, object]:
    """Name (or id) -> error code(s) of an admin response."""
    if api_key == DELETE_RECORDS:
        return {t.name: [(int(p.partition_index), p.error_code, int(p.low_watermark)) for p in t.partitions]
                for t in response.topics}
    if api_key == DELETE_TOPICS:
        return {r.name: r.error_code for r in response.responses}
    if api_key == CREATE_PARTITIONS:
        return {r.name: r.error_code for r in response.results}
    return {(int(r.resource_type), r.resource_name): r.error_code for r in response.responses}


def broker_answer(api_key: int, version: int, request: object) -> object:
    """Success for every entry of `request`, as a broker would answer."""
    cls = load_response_schema(api_key, version)
    zero = datetime.timedelta(0)
    if api_key == DELETE_RECORDS:
        topic_cls = item(cls, "topics")
        part_cls = item(topic_cls, "partitions")
        return cls(throttle_time=zero, topics=tuple(
            topic_cls(name=t.name, partitions=tuple(part_cls(partition_index=p.partition_index, low_watermark=i64(5),
                                                             error_code=ErrorCode.none) for p in t.partitions))
            for t in request.topics))
    if api_key == DELETE_TOPICS:
        result_cls = item(cls, "responses")
        names = request.topic_names if version < 6 else [t.name for t in request.topics]
        extra = {"topic_id": uuid.uuid4()} if version >= 6 else {}
        return cls(throttle_time=zero, responses=tuple(result_cls(name=n, error_code=ErrorCode.none, **extra)
                                                       for n in names))
    if api_key == CREATE_PARTITIONS:
        result_cls = item(cls, "results")
        return cls(throttle_time=zero, results=tuple(result_cls(name=t.name, error_code=ErrorCode.none)
                                                     for t in request.topics))
    result_cls = item(cls, "responses")
    return cls(throttle_time=zero, responses=tuple(
        result_cls(error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type,
                   resource_name=r.resource_name) for r in request.resources))


ADMIN_CASES = (
    [(DELETE_RECORDS, v, lambda v, names: delete_records(v, names)) for v in versions(DELETE_RECORDS)]
    + [(DELETE_TOPICS, v, lambda v, names: delete_topics(v, names)) for v in versions(DELETE_TOPICS)]
    + [(CREATE_PARTITIONS, v, lambda v, names: create_partitions(v, names)) for v in versions(CREATE_PARTITIONS)]
    + [(k, v, lambda v, names, k=k: alter_configs(k, v, [(TOPIC_RESOURCE, n) for n in names]))
       for k in (ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS) for v in versions(k)]
)
CASE_IDS = [f"{key}-v{version}" for key, version, _ in ADMIN_CASES]


def refusal_of(api_key: int, name: str) -> object:
    if api_key == DELETE_RECORDS:
        return [(0, AUTH_FAILED, -1), (1, AUTH_FAILED, -1)]
    return AUTH_FAILED


def key_of(api_key: int, name: str) -> object:
    return (TOPIC_RESOURCE, name) if api_key in (ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS) else name


@pytest.mark.parametrize(("api_key", "version", "build"), ADMIN_CASES, ids=CASE_IDS)
async def test_admin_request_on_the_state_topic_only_is_refused_by_the_proxy(api_key, version, build):
    h = guarded_harness()
    before = metrics.STATE_TOPIC_REFUSALS.labels(api_key=str(api_key))._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(build(version, [STATE])))
        answer = decode_response(api_key, version, await h.client.receive_frame())
        assert results(api_key, answer) == {key_of(api_key, STATE): refusal_of(api_key, STATE)}
        assert not h.broker_connected.is_set()
        await h.client_side.aclose()
    assert metrics.STATE_TOPIC_REFUSALS.labels(api_key=str(api_key))._value.get() == before + 1


@pytest.mark.parametrize(("api_key", "version", "build"), ADMIN_CASES, ids=CASE_IDS)
async def test_admin_request_without_the_state_topic_is_forwarded_byte_for_byte(api_key, version, build):
    h = guarded_harness()
    sent = frame_of(build(version, ["orders", "payments"]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        nursery.cancel_scope.cancel()  # the fake broker never answers


@pytest.mark.parametrize(("api_key", "version", "build"), ADMIN_CASES, ids=CASE_IDS)
async def test_mixed_admin_request_forwards_the_rest_and_merges_the_refusal(api_key, version, build):
    h = guarded_harness()
    request = build(version, ["orders", STATE, "payments"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(request))
        upstream = decode_request(api_key, await h.broker_receive())
        kept = entries(api_key, upstream)
        assert kept == (entries(api_key, request)[0], entries(api_key, request)[2])
        await h.broker.send_frame(response_frame(broker_answer(api_key, version, upstream)))
        answer = results(api_key, decode_response(api_key, version, await h.client.receive_frame()))
        assert answer.pop(key_of(api_key, STATE)) == refusal_of(api_key, STATE)
        assert set(answer) == {key_of(api_key, "orders"), key_of(api_key, "payments")}
        await h.client_side.aclose()


async def test_delete_topics_by_the_state_topic_id_is_refused():
    h = guarded_harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(frame_of(delete_topics(6, [STATE_ID])))
        answer = decode_response(DELETE_TOPICS, 6, await h.client.receive_frame())
        assert [(r.name, r.topic_id, r.error_code) for r in answer.responses] == [(STATE, STATE_ID, AUTH_FAILED)]
        await h.client_side.aclose()


@pytest.mark.parametrize("api_key", [ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS])
async def test_config_changes_of_other_resource_types_named_like_the_state_topic_pass(api_key):
    h = guarded_harness()
    broker, group = 4, 32
    sent = frame_of(alter_configs(api_key, 1, [(broker, STATE), (group, STATE)]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.connection.serve)
        await h.client.send_frame(sent)
        assert await h.broker_receive() == sent
        nursery.cancel_scope.cancel()  # the fake broker never answers


def test_routes_wrap_whatever_was_registered_before():
    marker = object()
    routes = state_topic_routes(TOPICS, {DELETE_RECORDS: marker})
    assert routes[DELETE_RECORDS].inner is marker
    assert set(routes) == {PRODUCE, DELETE_TOPICS, DELETE_RECORDS, ALTER_CONFIGS, CREATE_PARTITIONS,
                           INCREMENTAL_ALTER_CONFIGS}
