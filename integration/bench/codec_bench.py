"""Codec micro-benchmark (a script, not a test).

    .venv/bin/python integration/bench/codec_bench.py [--repeat N]

1. Encode and decode a ShareFetch v2 response carrying 1 MiB of record bytes
   (through codec.registry: bounds check + kio).
2. The proxy's ShareFetch response built from a fetch's outcome, 1 MiB of records over 1, 4 and
   32 partitions, side by side: kio's entities then kio's encoder (the path before 2026-11-27's
   stop 36), against codec.share_fetch writing the frame directly, joined into one buffer (as
   the tests compare it), and as the proxy sends it (large records left as views: no copy).
3. The share reader's upstream Fetch (v17) for 1 and 4 partitions, 1 MiB of records in all,
   side by side: the request built as kio entities and encoded by kio, the response read by kio
   and its records copied out (before stop 36), against codec.fetch writing the request and reading
   the response with the records a view of it (now).
4. Iterate the batch headers of 64 MiB of records with codec.records.iter_batches,
   without and with CRC-32C verification.
Prints MB/s (1 MB = 2**20 bytes) for each; the best of N repeats.
"""

from __future__ import annotations

import argparse
import datetime
import time
import uuid
from collections.abc import Callable

from kio.schema.errors import ErrorCode
from kio.schema.share_fetch.v2 import response as sf
from kio.static.primitive import Records, i16, i32, i64

from codec.records import encode_batch, iter_batches
from codec.registry import DEFAULT_REGISTRY, encode

MIB = 1 << 20


def records_of(total_bytes: int, batch_bytes: int, values_per_batch: int = 16) -> bytes:
    """Uncompressed v2 batches (``values_per_batch`` records each) adding up to at least ``total_bytes``."""
    value = b"x" * max(1, batch_bytes // values_per_batch - 8)
    parts, size, offset = [], 0, 0
    while size < total_bytes:
        batch = encode_batch(offset, [value] * values_per_batch, base_timestamp=1_700_000_000_000)
        parts.append(batch)
        size += len(batch)
        offset += values_per_batch
    return b"".join(parts)


def share_fetch_response(records: bytes, partitions: int = 4) -> sf.ShareFetchResponse:
    share = len(records) // partitions
    return sf.ShareFetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        acquisition_lock_timeout=datetime.timedelta(seconds=30),
        responses=(
            sf.ShareFetchableTopicResponse(
                topic_id=uuid.uuid4(),
                partitions=tuple(
                    sf.PartitionData(
                        partition_index=i32(p),
                        error_code=ErrorCode.none,
                        acknowledge_error_code=i16(0),
                        current_leader=sf.LeaderIdAndEpoch(leader_id=i32(1), leader_epoch=i32(0)),
                        records=Records(records[p * share : (p + 1) * share]),
                        acquired_records=(sf.AcquiredRecords(first_offset=i64(0), last_offset=i64(99), delivery_count=i16(1)),),
                    )
                    for p in range(partitions)
                ),
            ),
        ),
        node_endpoints=(),
    )


def repeated(times: int, function):
    """Call ``function`` ``times`` times, keeping no results (1 MiB bodies add up)."""

    def run() -> None:
        for _ in range(times):
            function()

    return run


def best_of(repeat: int, function) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def side_by_side(label: str, repeat: int, before: tuple[str, Callable[[], object]],
                 after: tuple[str, Callable[[], object]], inner: int = 200) -> None:
    """Time two ways of doing the same thing (checked equal first); print both and after / before."""
    (before_name, before_call), (after_name, after_call) = before, after
    assert before_call() == after_call()
    before_s = best_of(repeat, repeated(inner, before_call)) / inner
    after_s = best_of(repeat, repeated(inner, after_call)) / inner
    print(f"  {label}: {before_name} {before_s * 1e6:7.1f} us, {after_name} {after_s * 1e6:7.1f} us, "
          f"{after_name} / {before_name.split()[0]} {after_s / before_s:.2f}")


def compare_share_fetch_paths(records: bytes, repeat: int) -> None:
    from codec.headers import RequestHeader, encode_response_header, response_header_version
    from proxy.share.cluster import PartitionInfo, TopicInfo
    from proxy.share.manager import FetchOutcome
    from proxy.share.partition import AcquiredRecords
    from proxy.share.reader import Fetched
    from codec.share_fetch import kio_share_fetch_response
    from proxy.share.routes import share_fetch_body, share_fetch_payload

    topic_id = uuid.uuid4()

    class Cluster:
        topic = TopicInfo("bench", topic_id, {p: PartitionInfo(leader_id=1, leader_epoch=0) for p in range(32)})

        def topic_by_id(self, _):
            return self.topic

    header = RequestHeader(78, 2, correlation_id=1)
    response_header = encode_response_header(1, response_header_version(78, 2))
    print("the proxy's ShareFetch response from a fetch's outcome (records a view of the read cache), v2:")
    for partitions in (1, 4, 32):
        share = len(records) // partitions
        view = memoryview(records)
        outcome = FetchOutcome(lock_ms=30_000, fetched={
            (topic_id, p): Fetched(records=view[p * share:(p + 1) * share], count=100,
                                   acquired=(AcquiredRecords(p * 100, p * 100 + 99, 1),))
            for p in range(partitions)})
        side_by_side(f"{partitions:2d} partitions", repeat,
                     ("kio entities + encoder", lambda: encode(kio_share_fetch_response(
                         2, share_fetch_body(outcome, Cluster())), header=response_header)),
                     ("codec.share_fetch", lambda: bytes(share_fetch_payload(header, outcome, Cluster()))))
        pieces_s = best_of(repeat, repeated(200, lambda: share_fetch_payload(header, outcome, Cluster()))) / 200
        print(f"  {partitions:2d} partitions: codec.share_fetch as sent (records not joined, one writev) "
              f"{pieces_s * 1e6:7.1f} us")


def compare_fetch_paths(records: bytes, repeat: int) -> None:
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    from codec.fetch import PartitionFetch, decode_fetch_response, encode_fetch_request
    from codec.registry import nested_types

    version = 17
    request_type, response_type = load_request_schema(1, version), load_response_schema(1, version)
    request_types, response_types = nested_types(request_type), nested_types(response_type)
    topic_id = uuid.uuid4()
    print(f"the share reader's upstream Fetch v{version}, request written and response read, 1 MiB of records:")
    for partitions in (1, 4):
        share = len(records) // partitions
        reads = [PartitionFetch(p, 0, p * 1000, share) for p in range(partitions)]
        body = encode(response_type(
            throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(0),
            responses=(response_types["FetchableTopicResponse"](topic_id=topic_id, partitions=tuple(
                response_types["PartitionData"](
                    partition_index=i32(p), error_code=ErrorCode.none, high_watermark=i64(10**6),
                    last_stable_offset=i64(10**6), log_start_offset=i64(0), aborted_transactions=None,
                    records=Records(records[p * share:(p + 1) * share]))
                for p in range(partitions))),)))

        def with_kio():
            encode(request_type(
                max_wait=datetime.timedelta(0), min_bytes=i32(1), max_bytes=i32(len(records)), isolation_level=0,
                session_id=i32(0), session_epoch=i32(-1),
                topics=(request_types["FetchTopic"](topic_id=topic_id, partitions=tuple(
                    request_types["FetchPartition"](partition=i32(r.partition), current_leader_epoch=i32(0),
                                                    fetch_offset=i64(r.fetch_offset), log_start_offset=i64(-1),
                                                    partition_max_bytes=i32(r.partition_max_bytes))
                    for r in reads)),),
                forgotten_topics_data=(), rack_id=""))
            response, _ = entity_reader(response_type)(body, 0)
            return [bytes(p.records) for t in response.responses for p in t.partitions]

        def with_codec():
            encode_fetch_request(version, max_wait_ms=0, min_bytes=1, max_bytes=len(records), isolation_level=0,
                                 topics=[(topic_id, reads)])
            return [p.records for p in decode_fetch_response(body).partitions]

        side_by_side(f"{partitions:2d} partitions", repeat, ("kio", with_kio), ("codec.fetch", with_codec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    # Records whose batches Kafka would cut at ~16 KiB (a typical producer batch).
    one_mib = records_of(MIB, 16 * 1024)[:MIB]
    response = share_fetch_response(one_mib)
    body = encode(response)
    assert DEFAULT_REGISTRY.decode_response(78, 2, body) == response
    inner = 200
    encode_s = best_of(args.repeat, repeated(inner, lambda: encode(response))) / inner
    decode_s = best_of(args.repeat, repeated(inner, lambda: DEFAULT_REGISTRY.decode_response(78, 2, body))) / inner
    print(f"ShareFetch v2 response, {len(body) / MIB:.2f} MiB body, 4 partitions:")
    print(f"  encode  {len(body) / MIB / encode_s:9.0f} MB/s  ({encode_s * 1e6:8.1f} us per response)")
    print(f"  decode  {len(body) / MIB / decode_s:9.0f} MB/s  ({decode_s * 1e6:8.1f} us per response)")

    compare_share_fetch_paths(one_mib, args.repeat)
    compare_fetch_paths(one_mib, args.repeat)

    for batch_kib in (16, 1):
        records = records_of(64 * MIB, batch_kib * 1024)
        count = sum(1 for _ in iter_batches(records))
        for verify in (False, True):
            seconds = best_of(max(1, args.repeat // 2), lambda: sum(1 for _ in iter_batches(records, verify_crc=verify)))
            print(
                f"iter_batches, {len(records) / MIB:.0f} MiB in {count} batches of ~{batch_kib} KiB, verify_crc={verify}: "
                f"{len(records) / MIB / seconds:8.0f} MB/s  ({count / seconds / 1e6:.2f} M batches/s)"
            )


if __name__ == "__main__":
    main()
