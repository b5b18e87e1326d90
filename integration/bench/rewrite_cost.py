"""What do response rewrites cost? (not a test; pure, no broker)

``--part endpoints`` (the default): would rewriting KIP-951 NodeEndpoints pay? Compares, per
response, the work the proxy does on a forwarded Fetch/Produce response today (read the
correlation id, pass the bytes on) with decoding it with kio, rewriting endpoints and encoding it
again -- what serving Fetch v16+ / Produce v10+ would need, since NodeEndpoints sit in the
top-level tagged fields at the very end of the response.

``--part routing`` (issue 15): Metadata routed to virtual nodes. Compares today's brokers-only
rewrite, the in-place patch of every partition's node ids (``proxy.route_metadata``), and a kio
decode + the same routing on entities + encode, at 1, 64, 1,000 and 10,000 partitions.

    .venv/bin/python -m integration.bench.rewrite_cost [--part endpoints|routing]
"""

from __future__ import annotations

import argparse
import time
import uuid
import zlib

from kio.index import load_payload_module
from kio.static.constants import EntityType
from kio.static.primitive import i32, i64

from proxy.rewrite import FETCH, METADATA, PRODUCE, decode_response, encode_response, rewrite_response
from proxy.route_metadata import route_metadata
from proxy.vnodes import Instance
from tests.proxy.kio_build import build, response_frame
from tests.proxy.test_route_metadata import routed_by_kio


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


def endpoints() -> None:
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


INSTANCES = [Instance(0, "ksp-0.ksp", 19100), Instance(1, "ksp-1.ksp", 19200), Instance(2, "ksp-2.ksp", 19300)]
STATE_PARTITIONS = 12
OWNERS = [s % len(INSTANCES) for s in range(STATE_PARTITIONS)]  # state partition -> slot (an owner map)


def owner_slot(name, topic_id, partition) -> int:
    """The design's home(t, p) (crc32 of topic id and partition) looked up in an owner map."""
    key = (topic_id.bytes if topic_id else name.encode()) + partition.to_bytes(4, "big")
    return OWNERS[zlib.crc32(key) % STATE_PARTITIONS]


def metadata_response(version: int, partitions: int, per_topic: int = 64) -> bytes:
    """3 brokers; ``partitions`` spread over topics of ``per_topic``, 3 replicas each, all in sync."""
    m = load_payload_module(METADATA, version, EntityType.response)
    brokers = tuple(build(m.MetadataResponseBroker, node_id=i32(b), host=f"kafka-{b}.internal", port=i32(9092),
                          rack=f"rack-{b}") for b in (1, 2, 3))
    topics, left, t = [], partitions, 0
    while left:
        count = min(per_topic, left)
        parts = tuple(
            build(m.MetadataResponsePartition, partition_index=i32(p), leader_id=i32(1 + p % 3), leader_epoch=i32(4),
                  replica_nodes=tuple(i32(1 + (p + r) % 3) for r in range(3)),
                  isr_nodes=tuple(i32(1 + (p + r) % 3) for r in range(3)))
            for p in range(count))
        topics.append(build(m.MetadataResponseTopic, name=f"topic-{t:04d}", topic_id=uuid.UUID(int=t + 1),
                            partitions=parts))
        left, t = left - count, t + 1
    return response_frame(build(m.MetadataResponse, brokers=brokers, cluster_id="c", controller_id=i32(1),
                                topics=tuple(topics)))


def routing() -> None:
    def kio_routed(version: int, frame: bytes) -> bytes:
        header, entity = decode_response(METADATA, version, frame)
        return encode_response(header, routed_by_kio(entity, owner_slot, INSTANCES, 1))

    print(f"{'Metadata v13':18} {'bytes':>9} {'brokers only (today)':>21} {'in-place patch':>15} "
          f"{'per partition':>14} {'kio decode+encode':>18} {'kio/patch':>10}")
    for partitions in (1, 64, 1_000, 10_000):
        frame = metadata_response(13, partitions)
        assert route_metadata(13, frame, owner_slot, INSTANCES, 1) == kio_routed(13, frame)
        budget = 2.0 if partitions >= 1_000 else 1.0
        today = per_call(lambda: rewrite_response(METADATA, 13, frame, endpoint_of), budget)
        patch = per_call(lambda: route_metadata(13, frame, owner_slot, INSTANCES, 1), budget)
        kio = per_call(lambda: kio_routed(13, frame), budget)
        print(f"{partitions:>7,} partitions {len(frame):9d} {today * 1e6:18.1f} us {patch * 1e6:12.1f} us "
              f"{patch / partitions * 1e6:11.2f} us {kio * 1e6:15.1f} us {kio / patch:9.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("endpoints", "routing"), default="endpoints")
    {"endpoints": endpoints, "routing": routing}[parser.parse_args().part]()


if __name__ == "__main__":
    main()
