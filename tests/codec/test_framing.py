import pytest
from hypothesis import given
from hypothesis import strategies as st

from codec.errors import CodecError, FrameError
from codec.framing import FrameDecoder, encode_frame


def test_encode_frame_prefixes_big_endian_length():
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"


def test_next_frame_returns_none_until_the_frame_is_complete():
    decoder = FrameDecoder(max_frame_size=100)
    data = encode_frame(b"hello")
    decoder.feed(data[:2])
    assert decoder.next_frame() is None
    decoder.feed(data[2:6])
    assert decoder.next_frame() is None
    decoder.feed(data[6:])
    assert decoder.next_frame() == b"hello"
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


def test_several_frames_in_one_feed_come_out_in_order():
    decoder = FrameDecoder(max_frame_size=100)
    decoder.feed(encode_frame(b"a") + encode_frame(b"") + encode_frame(b"ccc") + b"\x00")
    assert [decoder.next_frame() for _ in range(4)] == [b"a", b"", b"ccc", None]
    assert decoder.buffered == 1


def test_oversized_prefix_is_rejected_before_the_payload_arrives():
    decoder = FrameDecoder(max_frame_size=10)
    decoder.feed((11).to_bytes(4, "big"))
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_negative_prefix_is_rejected():
    decoder = FrameDecoder(max_frame_size=10)
    decoder.feed(b"\xff\xff\xff\xfe")
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_decoder_stays_failed_after_an_error():
    decoder = FrameDecoder(max_frame_size=1)
    decoder.feed(b"\x7f\xff\xff\xff")
    with pytest.raises(FrameError):
        decoder.next_frame()
    with pytest.raises(FrameError):
        decoder.feed(encode_frame(b"x"))
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_frame_of_exactly_the_maximum_is_accepted():
    decoder = FrameDecoder(max_frame_size=3)
    decoder.feed(encode_frame(b"xyz"))
    assert decoder.next_frame() == b"xyz"


def test_compaction_keeps_later_frames_intact():
    decoder = FrameDecoder(max_frame_size=1 << 20)
    payloads = [bytes([i % 256]) * 1000 for i in range(200)]
    decoder.feed(b"".join(encode_frame(p) for p in payloads))
    out = [decoder.next_frame() for _ in payloads]
    assert out == payloads


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10),
)
def test_round_trip_regardless_of_how_the_stream_is_split(payloads, cuts):
    stream = b"".join(encode_frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(max_frame_size=300)
    out = []
    for start, end in zip(points, points[1:]):
        decoder.feed(stream[start:end])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == payloads


@given(garbage=st.binary(max_size=200), max_frame_size=st.integers(min_value=0, max_value=64))
def test_garbage_raises_only_frame_errors(garbage, max_frame_size):
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    decoder.feed(garbage)
    frames = 0
    try:
        while decoder.next_frame() is not None:
            frames += 1
    except CodecError as exc:
        assert isinstance(exc, FrameError)
    assert frames <= len(garbage) // 4
