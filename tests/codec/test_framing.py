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


def test_a_frame_split_over_feeds_reports_what_it_still_misses():
    decoder = FrameDecoder(max_frame_size=1 << 20)
    payload = bytes(range(256)) * 40
    data = encode_frame(payload)
    decoder.feed(data[:1000])
    assert decoder.next_frame() is None
    assert decoder.missing == len(payload) - (1000 - 4)
    assert decoder.buffered == 1000
    decoder.feed(data[1000:5000])
    assert decoder.next_frame() is None
    assert decoder.missing == len(data) - 5000
    decoder.feed(data[5000:] + encode_frame(b"next"))
    assert decoder.missing == 0
    assert decoder.next_frame() == payload
    assert decoder.next_frame() == b"next"
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


def test_a_prefix_alone_starts_a_frame_that_counts_as_buffered():
    decoder = FrameDecoder(max_frame_size=100)
    decoder.feed((10).to_bytes(4, "big"))
    assert decoder.next_frame() is None
    assert (decoder.missing, decoder.buffered) == (10, 4)  # EOF now is EOF inside a frame


def test_a_split_prefix_is_kept_until_its_last_bytes_come():
    decoder = FrameDecoder(max_frame_size=100)
    data = encode_frame(b"a") + encode_frame(b"bcd")
    decoder.feed(data[:7])  # the first frame and two bytes of the second prefix
    assert decoder.next_frame() == b"a"
    assert decoder.next_frame() is None
    assert (decoder.missing, decoder.buffered) == (0, 2)
    decoder.feed(data[7:])
    assert decoder.next_frame() == b"bcd"


def test_a_fed_buffer_the_caller_reuses_does_not_change_the_frames():
    decoder = FrameDecoder(max_frame_size=100)
    buffer = bytearray(encode_frame(b"hello") + encode_frame(b"world")[:6])
    decoder.feed(buffer)
    buffer[:] = b"\x00" * len(buffer)  # a reader reusing its receive buffer
    assert decoder.next_frame() == b"hello"
    assert decoder.next_frame() is None
    decoder.feed(memoryview(bytearray(b"rld")))
    assert decoder.next_frame() == b"world"


def test_frames_come_out_as_bytes():
    decoder = FrameDecoder(max_frame_size=1 << 20)
    big = encode_frame(b"x" * 100_000)
    decoder.feed(big[:10])
    decoder.feed(big[10:])
    frame = decoder.next_frame()
    assert type(frame) is bytes and len(frame) == 100_000
    decoder.feed(encode_frame(b"small"))
    assert type(decoder.next_frame()) is bytes


@given(
    payloads=st.lists(st.binary(max_size=3000), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=40_000), max_size=20),
    drain_every=st.integers(min_value=1, max_value=4),
)
def test_round_trip_when_feeds_and_drains_interleave_unevenly(payloads, cuts, drain_every):
    stream = b"".join(encode_frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(max_frame_size=3000)
    out = []
    for index, (start, end) in enumerate(zip(points, points[1:])):
        decoder.feed(memoryview(stream)[start:end])
        if index % drain_every == 0:
            while (frame := decoder.next_frame()) is not None:
                out.append(frame)
        assert decoder.buffered + sum(len(p) + 4 for p in out) == end
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    assert out == payloads
    assert (decoder.buffered, decoder.missing) == (0, 0)


def test_a_frame_in_progress_is_detached_with_what_it_still_misses_and_the_decoder_goes_on():
    decoder = FrameDecoder(max_frame_size=1 << 20)
    payload = bytes(range(256)) * 40
    decoder.feed(encode_frame(payload)[:1000])
    assert decoder.next_frame() is None
    assert decoder.frame_received == 996
    head, missing = decoder.detach_frame()
    assert head == payload[:996] and missing == len(payload) - 996
    assert decoder.frame_received == decoder.missing == decoder.buffered == 0
    # The caller took the rest from the stream itself; what follows is framed as usual.
    decoder.feed(encode_frame(b"next"))
    assert decoder.next_frame() == b"next"


def test_only_an_incomplete_frame_can_be_detached():
    decoder = FrameDecoder(max_frame_size=1 << 20)
    with pytest.raises(ValueError):
        decoder.detach_frame()
    decoder.feed(encode_frame(b"whole"))
    with pytest.raises(ValueError):
        decoder.detach_frame()  # complete frames are handed out by next_frame
    assert decoder.next_frame() == b"whole"
