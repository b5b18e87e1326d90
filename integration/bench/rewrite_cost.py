"""What would rewriting KIP-951 NodeEndpoints cost? (not a test)

Compares, per response, the work the proxy does on a forwarded Fetch/Produce
response today (read the correlation id, pass the bytes on) with decoding it
with kio, rewriting endpoints and encoding it again -- what serving Fetch v16+ /
Produce v10+ would need, since NodeEndpoints sit in the top-level tagged fields
at the very end of the response.

    .venv/bin/python -m integration.bench.rewrite_cost
"""

from __future__ import annotations

import time

from kio.index import load_payload_module
from kio.static.constants import EntityType
from kio.static.primitive import i32, i64

from proxy.rewrite import FETCH, PRODUCE, rewrite_response
from tests.proxy.kio_build import build, response_frame


def endpoint_of(node_id: int) -> tuple[str, int]:
    return "proxy", 30000 + node_id


def fetch_response(partitions: int, record_bytes: int) -> bytes:
    m = load_payload_module(FETCH, 16, EntityType.response)
    chunk = bytes(record_bytes // partitions)
    parts = tuple(
        build(m.PartitionData, partition_index=i32(p), high_watermark=i64(1000), records=chunk)
        for p in range(partitions)
    )
    return response_frame(build(m.FetchResponse, responses=(build(m.FetchableTopicResponse, partitions=parts),)))


def produce_response(partitions: int) -> bytes:
    m = load_payload_module(PRODUCE, 10, EntityType.response)
    parts = tuple(build(m.PartitionProduceResponse, index=i32(p), base_offset=i64(p)) for p in range(partitions))
    return response_frame(build(m.ProduceResponse, responses=(build(m.TopicProduceResponse, name="t", partition_responses=parts),)))


def per_call(fn, budget: float = 1.0) -> float:
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget:
        fn()
        calls += 1
    return elapsed / calls


def main() -> None:
    cases = [
        ("Fetch v16, 1 partition, 1 MiB records", FETCH, 16, fetch_response(1, 1 << 20)),
        ("Fetch v16, 50 partitions, 1 MiB records", FETCH, 16, fetch_response(50, 1 << 20)),
        ("Fetch v16, 1 partition, 16 KiB records", FETCH, 16, fetch_response(1, 16 << 10)),
        ("Fetch v16, empty long-poll answer", FETCH, 16, fetch_response(1, 0)),
        ("Produce v10, 1 partition", PRODUCE, 10, produce_response(1)),
        ("Produce v10, 50 partitions", PRODUCE, 10, produce_response(50)),
    ]
    print(f"{'response':45} {'bytes':>9} {'pass-through':>13} {'decode+rewrite+encode':>22} {'ratio':>8}")
    for name, api_key, version, frame in cases:
        passthrough = per_call(lambda: int.from_bytes(frame[:4], "big"))
        rewrite = per_call(lambda: rewrite_response(api_key, version, frame, endpoint_of))
        print(
            f"{name:45} {len(frame):9d} {passthrough * 1e6:10.2f} us {rewrite * 1e6:19.1f} us {rewrite / passthrough:7.0f}x"
        )


if __name__ == "__main__":
    main()
