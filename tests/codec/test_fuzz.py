"""Hostile input into every codec parser: only the codec's own error types may come out.

Random bytes find shallow failures; mutated valid inputs (bit flips, extreme length
fields, cuts and insertions) reach deep into the parsers. A per-example deadline
catches hangs; a hostile length that made a parser allocate would abort the process.
"""

import os
import struct
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import i8, i16, i32, i64

from codec.errors import CodecError
from codec.framing import FrameDecoder, encode_frame
from codec.headers import RequestHeader, encode_request_header, parse_request_header, parse_response_header
from codec.records import ControlType, encode_batch, iter_batches
from codec.registry import DEFAULT_REGISTRY, encode
from codec.share_state import ShareSnapshotKey, ShareSnapshotValue, decode_record, encode_record

from .strategies import entities

# KSP_FUZZ_EXAMPLES=20000 for a long run; the default keeps the unit suite quick.
FUZZ = settings(max_examples=int(os.environ.get("KSP_FUZZ_EXAMPLES", "400")), deadline=1000, suppress_health_check=[HealthCheck.too_slow])
_EXTREMES = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


@st.composite
def mutated(draw, seeds):
    data = bytearray(draw(seeds))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "extreme", "cut", "insert", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "extreme" and len(data) >= at + 4:
            data[at : at + 4] = struct.pack(">I", draw(st.sampled_from(_EXTREMES)))
        elif kind == "cut":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "truncate":
            del data[at:]
    return bytes(data)


def _only_codec_errors(parse, data):
    try:
        parse(data)
    except CodecError:
        pass


# -- frames and headers (codec/framing.py, codec/headers.py) -------------------------------

_request_frames = st.builds(
    lambda header, body: encode_request_header(header) + body,
    st.builds(
        RequestHeader,
        api_key=st.sampled_from([0, 1, 3, 18, 78, 79]),
        api_version=st.integers(0, 12),
        correlation_id=st.integers(-(2**31), 2**31 - 1),
        client_id=st.one_of(st.none(), st.text(max_size=10)),
    ),
    st.binary(max_size=20),
)


@FUZZ
@given(mutated(st.lists(_request_frames, min_size=1, max_size=3).map(lambda fs: b"".join(map(encode_frame, fs)))))
def test_mutated_frame_streams(stream):
    def parse(data):
        decoder = FrameDecoder(max_frame_size=1 << 16)
        decoder.feed(data)
        while (frame := decoder.next_frame()) is not None:
            _only_codec_errors(parse_request_header, frame)

    _only_codec_errors(parse, stream)


@FUZZ
@given(mutated(_request_frames))
def test_mutated_request_headers(frame):
    _only_codec_errors(parse_request_header, frame)


@FUZZ
@given(mutated(st.binary(min_size=4, max_size=30)), st.sampled_from([0, 1]))
def test_mutated_response_headers(frame, version):
    _only_codec_errors(lambda data: parse_response_header(data, version), frame)


# -- record batches (codec/records.py) ------------------------------------------------------

_batches = st.lists(
    st.one_of(
        st.builds(lambda base, values: encode_batch(base, values), st.integers(0, 2**40),
                  st.lists(st.binary(max_size=30), min_size=1, max_size=4)),
        st.sampled_from([ControlType.ABORT, ControlType.COMMIT]).map(lambda m: encode_batch(9, [b""], control_type=m)),
    ),
    min_size=1,
    max_size=3,
).map(b"".join)


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated(_batches)), st.booleans())
def test_random_and_mutated_record_batches(data, verify_crc):
    _only_codec_errors(lambda raw: list(iter_batches(raw, verify_crc=verify_crc)), data)


# -- share-state records (codec/share_state.py) ---------------------------------------------

_snapshot_record = st.builds(
    lambda batches: encode_record(
        ShareSnapshotKey(group_id="group", topic_id=uuid.UUID(int=7), partition=i32(1)),
        ShareSnapshotValue(
            snapshot_epoch=i32(1), state_epoch=i32(1), leader_epoch=i32(1), start_offset=i64(0),
            create_timestamp=i64(1), write_timestamp=i64(2),
            state_batches=tuple(
                ShareSnapshotValue.StateBatch(first_offset=i64(a), last_offset=i64(a + 1), delivery_state=i8(5),
                                              delivery_count=i16(1), last_progress_timestamp=i64(a))
                for a in batches
            ),
        ),
    ),
    st.lists(st.integers(0, 1000), max_size=3),
)


@FUZZ
@given(_snapshot_record.flatmap(lambda kv: st.tuples(mutated(st.just(kv[0])), mutated(st.just(kv[1])))))
def test_mutated_state_records(record):
    key, value = record
    _only_codec_errors(lambda _: decode_record(key, value), None)


@FUZZ
@given(st.binary(max_size=100), st.one_of(st.none(), st.binary(max_size=100)))
def test_random_state_records(key, value):
    _only_codec_errors(lambda _: decode_record(key, value), None)


# -- message bodies through the registry (kio behind the bounds check) ----------------------

_SHARE_MESSAGES = [(78, 1), (78, 2), (79, 2), (81, 0), (82, 0), (76, 1)]


@st.composite
def _mutated_body(draw):
    api_key, version = draw(st.sampled_from(_SHARE_MESSAGES))
    kind = draw(st.sampled_from(["request", "response"]))
    entity_type = (DEFAULT_REGISTRY.request_type if kind == "request" else DEFAULT_REGISTRY.response_type)(api_key, version)
    body = draw(mutated(entities(entity_type).map(encode)))
    return api_key, version, kind, body


@FUZZ
@given(_mutated_body())
def test_mutated_message_bodies(case):
    api_key, version, kind, body = case
    decode = DEFAULT_REGISTRY.decode_request if kind == "request" else DEFAULT_REGISTRY.decode_response
    _only_codec_errors(lambda data: decode(api_key, version, data), body)
