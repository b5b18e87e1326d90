"""Produce requests: topic names found and topics left out without decoding the records."""

from __future__ import annotations

import datetime
import typing
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.static.primitive import Records, i16, i32

from codec.errors import MessageDecodeError
from codec.headers import RequestHeader, encode_request_header, parse_request_header
from codec.produce import FIRST_TOPIC_ID_VERSION, names_any, names_any_in_head, produce_layout
from codec.records import encode_batch
from codec.registry import decode_entity, encode

VERSIONS = range(3, 14)  # every Produce version kio knows; the proxy forwards 3-9 (ApiVersions cap)
STATE = "__share_proxy_state"
STATE_ID = uuid.UUID("5fa0f1e2-0000-4000-8000-00000000abcd")


def topic_key(version: int, name: str) -> bytes:
    return topic_id(name).bytes if version >= FIRST_TOPIC_ID_VERSION else name.encode()


def topic_id(name: str) -> uuid.UUID:
    return STATE_ID if name == STATE else uuid.uuid5(uuid.NAMESPACE_OID, name)


def records(*values: bytes) -> Records:
    return Records(encode_batch(0, list(values)))


def request(version: int, topics: list[tuple[str, list[tuple[int, bytes | None]]]], *, acks: int = -1,
            transactional_id: str | None = None) -> object:
    cls = load_request_schema(0, version)
    data_cls = _item(cls, "topic_data")
    part_cls = _item(data_cls, "partition_data")
    entries = []
    for name, partitions in topics:
        parts = tuple(part_cls(index=i32(p), records=r) for p, r in partitions)
        if version >= FIRST_TOPIC_ID_VERSION:
            entries.append(data_cls(topic_id=topic_id(name), partition_data=parts))
        else:
            entries.append(data_cls(name=name, partition_data=parts))
    return cls(transactional_id=transactional_id, acks=i16(acks), timeout=_ms(30_000), topic_data=tuple(entries))


def _item(cls: type, field: str) -> type:
    return typing.get_args(typing.get_type_hints(cls)[field])[0]


def _ms(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def frame(version: int, entity: object, client_id: str | None = "producer-1") -> tuple[bytes, int]:
    header = encode_request_header(RequestHeader(0, version, 7, client_id))
    return header + encode(entity), len(header)


MIXED = [
    ("orders", [(0, records(b"a", b"b")), (1, records(b"c"))]),
    (STATE, [(2, records(b"x")), (0, None)]),
    ("payments", [(0, records(b"p" * 300))]),
]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_guarded_topic_is_found_wherever_it_is_named(version):
    keys = {topic_key(version, STATE)}
    for position in range(3):
        topics = [t for t in MIXED if t[0] != STATE]
        topics.insert(position, MIXED[1])
        data, body = frame(version, request(version, topics))
        assert names_any(data, body, version, keys)
    data, body = frame(version, request(version, [t for t in MIXED if t[0] != STATE]))
    assert not names_any(data, body, version, keys)
    data, body = frame(version, request(version, []))
    assert not names_any(data, body, version, keys)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_layout_has_acks_every_topic_and_its_partitions(version, acks):
    data, body = frame(version, request(version, MIXED, acks=acks, transactional_id="txn"))
    layout = produce_layout(data, body, version)
    assert layout.acks == acks
    assert [t.key for t in layout.topics] == [topic_key(version, name) for name, _ in MIXED]
    assert [t.partitions for t in layout.topics] == [(0, 1), (2, 0), (0,)]
    assert layout.topics[0].start == layout.array_offset + (4 if version < 9 else 1)
    assert all(a.end == b.start for a, b in zip(layout.topics, layout.topics[1:]))
    assert layout.array_end == layout.topics[-1].end


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dropped", [{1}, {0}, {2}, {0, 2}, {0, 1, 2}])
def test_leaving_topics_out_keeps_the_rest_byte_for_byte(version, dropped):
    entity = request(version, MIXED, acks=1, transactional_id=None)
    data, body = frame(version, entity)
    layout = produce_layout(data, body, version)
    trimmed = layout.without(data, dropped)
    header, body_offset = parse_request_header(trimmed)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (0, version, 7, "producer-1")
    decoded = decode_entity(load_request_schema(0, version), memoryview(trimmed)[body_offset:])
    expected = tuple(t for i, t in enumerate(entity.topic_data) if i not in dropped)
    assert decoded.topic_data == expected
    assert (decoded.acks, decoded.timeout) == (entity.acks, entity.timeout)


def test_a_flexible_request_with_tagged_fields_is_walked_past_them():
    # kio writes no tagged fields in Produce; Kafka may add some: built by hand (v9).
    def uvarint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        return bytes(out + bytes([n]))

    def compact(b: bytes) -> bytes:
        return uvarint(len(b) + 1) + b

    tags = uvarint(2) + uvarint(0) + uvarint(2) + b"xy" + uvarint(300) + uvarint(200) + b"t" * 200
    batch = encode_batch(0, [b"v"])
    partition = i32(4).to_bytes(4, "big") + compact(batch) + tags
    topic_a = compact(b"a") + uvarint(2) + partition + uvarint(0)
    topic_s = compact(STATE.encode()) + uvarint(2) + partition + tags
    body = uvarint(0) + (1).to_bytes(2, "big") + (1000).to_bytes(4, "big") + uvarint(3) + topic_a + topic_s + tags
    header = encode_request_header(RequestHeader(0, 9, 1, "c"))
    data = header + body
    assert names_any(data, len(header), 9, {STATE.encode()})
    layout = produce_layout(data, len(header), 9)
    assert [t.key for t in layout.topics] == [b"a", STATE.encode()]
    assert [t.partitions for t in layout.topics] == [(4,), (4,)]
    assert layout.array_end == len(data) - len(tags)
    trimmed = layout.without(data, {1})
    assert trimmed == header + body.replace(uvarint(3) + topic_a + topic_s, uvarint(2) + topic_a)


@pytest.mark.parametrize("version", [3, 8, 9, 13])
def test_every_truncation_raises_only_a_decode_error(version):
    data, body = frame(version, request(version, MIXED))
    for cut in range(body, len(data)):
        try:
            layout = produce_layout(data[:cut], body, version)
        except MessageDecodeError:
            continue
        assert layout.array_end <= cut  # only the trailing tagged fields were cut off


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(list(VERSIONS)))
def test_random_bodies_raise_only_decode_errors(body, version):
    header = encode_request_header(RequestHeader(0, version, 1, None))
    data = header + body
    for call in (lambda: names_any(data, len(header), version, {b"x"}), lambda: produce_layout(data, len(header), version)):
        try:
            call()
        except MessageDecodeError:
            pass


def test_hostile_counts_cost_nothing():
    header = encode_request_header(RequestHeader(0, 8, 1, None))
    body = (-1).to_bytes(2, "big", signed=True) + (1).to_bytes(2, "big") + (0).to_bytes(4, "big")
    many_topics = header + body + (2**31 - 1).to_bytes(4, "big") + (1).to_bytes(2, "big") + b"a" + (2**31 - 1).to_bytes(4, "big")
    with pytest.raises(MessageDecodeError):
        produce_layout(many_topics, len(header), 8)
    with pytest.raises(MessageDecodeError):
        names_any(many_topics, len(header), 8, {b"b"})


@pytest.mark.parametrize("version", [8, 9, 12])
@pytest.mark.parametrize("size", [100, 20_000, 2_200_000], ids=["1-byte-varint", "3-byte-varint", "4-byte-varint"])
def test_records_of_every_length_class_are_skipped(version, size):
    topics = [("big", [(0, records(b"r" * size)), (1, records(b"s" * (size // 2)))]), (STATE, [(0, records(b"x"))])]
    data, body = frame(version, request(version, topics))
    assert names_any(data, body, version, {topic_key(version, STATE)})
    layout = produce_layout(data, body, version)
    assert [(t.key, t.partitions) for t in layout.topics] == [(b"big", (0, 1)), (topic_key(version, STATE), (0,))]
    assert layout.array_end == len(data) - (1 if version >= 9 else 0)


def test_a_name_is_matched_whole():
    data, body = frame(9, request(9, [(STATE + "2", []), (STATE[:-1], []), ("x", [])]))
    assert not names_any(data, body, 9, {STATE.encode()})


@pytest.mark.parametrize("version", VERSIONS)
def test_the_first_bytes_of_a_request_decide_only_what_they_hold(version):
    keys = {topic_key(version, STATE)}
    big = records(b"r" * 5000)
    other, body = frame(version, request(version, [("orders", [(0, big)])]))
    state, _ = frame(version, request(version, [(STATE, [(0, big)])]))
    both, _ = frame(version, request(version, [("orders", [(0, big)]), (STATE, [(0, None)])]))

    def name_end(data: bytes, name: str) -> int:
        return data.index(topic_key(version, name)) + len(topic_key(version, name))

    for data, named in ((other, False), (state, True)):
        decided_from = name_end(data, STATE if named else "orders")
        for cut in range(body, len(data) + 1):
            assert names_any_in_head(data[:cut], body, version, keys) == (named if cut >= decided_from else None)
    # A second topic is named behind the first one's records: nothing short of those decides.
    for cut in range(body, name_end(both, STATE)):
        assert names_any_in_head(both[:cut], body, version, keys) is None
    assert names_any_in_head(both, body, version, keys) is True
