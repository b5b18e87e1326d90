"""Golden compatibility with Apache Kafka 4.4's own serializers, in both directions.

Kafka -> us: Kafka's message classes and share-coordinator serde write fixed inputs; our
codec must decode them to the same values and encode those values to the same bytes.
Us -> Kafka: Kafka parses what our codec writes (including IN_PROGRESS tagged fields and
record batches from our test encoder) and writes it back out byte for byte.
"""

from __future__ import annotations

import pytest

from codec.records import ControlType, encode_batch, iter_batches
from codec.registry import DEFAULT_REGISTRY, encode
from codec.share_fetch import NodeEndpointAnswer, PartitionAnswer, ShareFetchBody, encode_share_fetch_response
from codec.share_state import DeliveryState, decode_record, encode_record
from proxy.share.partition import AckRange

from . import cases
from .build import run

pytestmark = [pytest.mark.integration, pytest.mark.java]

VERSIONS = [1, 2]


@pytest.fixture(scope="module")
def kafka_bytes() -> dict[str, bytes]:
    return {name: bytes.fromhex(value) for name, value in run("emit").items()}


def _expected(name: str, version: int, kafka_bytes):
    return {
        "share_fetch_request": lambda: cases.share_fetch_request(version),
        "share_fetch_response": lambda: cases.share_fetch_response(version, kafka_bytes["fixed_records"]),
        "share_acknowledge_request": lambda: cases.share_acknowledge_request(version),
        "share_acknowledge_response": lambda: cases.share_acknowledge_response(version),
    }[name]()


MESSAGES = [
    (name, version)
    for name in ("share_fetch_request", "share_fetch_response", "share_acknowledge_request", "share_acknowledge_response")
    for version in VERSIONS
]


@pytest.mark.parametrize(("name", "version"), MESSAGES, ids=[f"{n}_v{v}" for n, v in MESSAGES])
def test_kafka_bytes_decode_to_our_values_and_we_encode_the_same_bytes(name, version, kafka_bytes):
    raw = kafka_bytes[f"{name}_v{version}"]
    api_key = cases.SHARE_FETCH if name.startswith("share_fetch") else cases.SHARE_ACKNOWLEDGE
    decode = DEFAULT_REGISTRY.decode_request if name.endswith("request") else DEFAULT_REGISTRY.decode_response
    expected = _expected(name, version, kafka_bytes)
    assert decode(api_key, version, raw) == expected
    assert encode(expected) == raw


@pytest.mark.parametrize(("name", "version"), MESSAGES, ids=[f"{n}_v{v}" for n, v in MESSAGES])
def test_kafka_parses_our_bytes_and_writes_them_back_identically(name, version, kafka_bytes):
    ours = encode(_expected(name, version, kafka_bytes))
    seen = run("parse", f"{name}_v{version}", ours.hex())
    assert seen["remaining"] == 0
    assert bytes.fromhex(seen["reserialized"]) == ours
    parsed = seen["parsed"]
    if name.endswith("request"):
        assert (parsed["groupId"], parsed["memberId"]) == (cases.GROUP, "member-1")
        assert parsed["topics"][0]["partitions"][0]["partitionIndex"] == 0
    else:
        assert parsed["responses"][0]["partitions"][0]["currentLeader"] == {"leaderId": 1, "leaderEpoch": 5}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_proxys_hand_encoded_share_fetch_response_is_kafkas_bytes(version, kafka_bytes):
    """codec.share_fetch (the proxy's hot path, no kio) writes what Kafka's own serializer wrote."""
    expected = cases.share_fetch_response(version, kafka_bytes["fixed_records"])
    ours = encode_share_fetch_response(b"", ShareFetchBody(
        error_code=int(expected.error_code), error_message=expected.error_message,
        lock_ms=int(expected.acquisition_lock_timeout.total_seconds() * 1000),
        throttle_ms=int(expected.throttle_time.total_seconds() * 1000),
        topics=[(topic.topic_id, [
            PartitionAnswer(p.partition_index, int(p.error_code), p.error_message, p.acknowledge_error_code,
                            p.acknowledge_error_message, p.current_leader.leader_id, p.current_leader.leader_epoch,
                            p.records, p.acquired_records) for p in topic.partitions]) for topic in expected.responses],
        node_endpoints=[NodeEndpointAnswer(e.node_id, e.host, e.port, e.rack) for e in expected.node_endpoints],
    ))
    assert ours == kafka_bytes[f"share_fetch_response_v{version}"]


def test_kafka_reads_record_batches_from_our_encoder(kafka_bytes):
    records = (
        encode_batch(100, [b"a", b"bb", None], keys=[b"k", None, b"z"], base_timestamp=1_700_000_000_000,
                     producer_id=42, producer_epoch=0, base_sequence=0, transactional=True)
        + encode_batch(103, [b""], control_type=ControlType.COMMIT, producer_id=42, producer_epoch=0)
    )
    ours = encode(cases.share_fetch_response(2, records))
    seen = run("parse", "share_fetch_response_v2", ours.hex())
    assert bytes.fromhex(seen["reserialized"]) == ours
    assert [(b["baseOffset"], b["lastOffset"], b["count"], b["isControl"]) for b in seen["batches"]] == [
        (100, 102, 3, False),
        (103, 103, 1, True),
    ]
    assert seen["batches"][0]["isTransactional"] and seen["batches"][0]["producerId"] == 42


def test_our_batch_reader_agrees_with_kafkas_batch_writer(kafka_bytes):
    (batch,) = iter_batches(kafka_bytes["fixed_records"], verify_crc=True)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (10, 11, 2)
    assert batch.max_timestamp == 1_700_000_000_001 and not batch.is_control


@pytest.mark.parametrize("kind", ["share_snapshot", "share_update"])
def test_state_records_match_kafkas_share_coordinator_serde(kind, kafka_bytes):
    key, value = getattr(cases, kind)()
    key_bytes, value_bytes = encode_record(key, value)
    assert key_bytes == kafka_bytes[f"{kind}_key"]
    assert value_bytes == kafka_bytes[f"{kind}_value"]
    record = decode_record(kafka_bytes[f"{kind}_key"], kafka_bytes[f"{kind}_value"])
    assert (record.key, record.value) == (key, value)
    tombstone = decode_record(kafka_bytes[f"{kind}_tombstone_key"], None)
    assert tombstone.key == key and tombstone.is_tombstone


def _compact_string(text: str) -> bytes:
    data = text.encode()
    assert len(data) + 1 < 0x80  # one-byte varint length in these cases
    return bytes([len(data) + 1]) + data


@pytest.mark.parametrize("kind", ["share_snapshot", "share_update"])
def test_kafka_reads_our_in_progress_state_and_keeps_the_tags(kind):
    key, value = getattr(cases, kind)(
        last_state=DeliveryState.IN_PROGRESS,
        in_progress_start_timestamp=1_700_000_000_500,
        last_progress_timestamp=1_700_000_000_900,
        in_progress_member_id="member-1",
    )
    key_bytes, value_bytes = encode_record(key, value)
    seen = run("parse", "share_state", key_bytes.hex(), value_bytes.hex())
    assert seen["keyType"] == (0 if kind == "share_snapshot" else 1) and seen["valueVersion"] == 0
    assert bytes.fromhex(seen["reserializedKey"]) == key_bytes
    assert bytes.fromhex(seen["reserializedValue"]) == value_bytes
    # Kafka keeps tags 100-102 as unknown tagged fields: the two int64 times and the compact string.
    last_batch_tags = seen["batchUnknownTags"][-1]["tags"]
    assert [(t["tag"], bytes.fromhex(t["data"])) for t in last_batch_tags] == [
        (100, (1_700_000_000_500).to_bytes(8, "big")),
        (101, (1_700_000_000_900).to_bytes(8, "big")),
        (102, _compact_string("member-1")),
    ]
    # Batches in other states carry none (the tags are written only for state 5).
    assert all(not b["tags"] for b in seen["batchUnknownTags"][:-1])
    java_batch = seen["value"]["stateBatches"][-1]
    ours = value.state_batches[-1]
    assert (java_batch["firstOffset"], java_batch["lastOffset"], java_batch["deliveryState"],
            java_batch["deliveryCount"]) == (ours.first_offset, ours.last_offset, 5, ours.delivery_count)


def test_kafka_reads_the_in_progress_state_the_engine_and_state_store_write():
    """The real write path: an engine with IN_PROGRESS records -> state_store -> Kafka's serde."""
    from proxy.share import state_store
    from proxy.share.partition import BatchHeader, PartitionConfig, SharePartition

    engine = SharePartition(PartitionConfig(), 0)
    engine.acquire("member-7", [BatchHeader(0, 9)], now=1_000, max_records=10)
    engine.mark_in_progress("member-7", [(2, 5)], now=2_000)
    engine.mark_in_progress("member-7", [(4, 5)], now=3_000)
    engine.acknowledge("member-7", [AckRange(0, 1, (1,))], now=3_000)
    key_bytes, value_bytes = state_store.snapshot_record(
        (cases.GROUP, cases.TOPIC, 0), engine.snapshot(), snapshot_epoch=1, state_epoch=0,
        create_timestamp=1, write_timestamp=2, clock_offset_ms=1_700_000_000_000)
    seen = run("parse", "share_state", key_bytes.hex(), value_bytes.hex())
    assert bytes.fromhex(seen["reserializedValue"]) == value_bytes
    assert seen["value"]["startOffset"] == 2
    assert [(b["firstOffset"], b["lastOffset"], b["deliveryState"], b["deliveryCount"])
            for b in seen["value"]["stateBatches"]] == [(2, 3, 5, 1), (4, 5, 5, 1)]
    wall = 1_700_000_000_000
    assert [[(t["tag"], bytes.fromhex(t["data"])) for t in b["tags"]] for b in seen["batchUnknownTags"]] == [
        [(100, (wall + 2_000).to_bytes(8, "big")), (101, (wall + 2_000).to_bytes(8, "big")),
         (102, _compact_string("member-7"))],
        [(100, (wall + 2_000).to_bytes(8, "big")), (101, (wall + 3_000).to_bytes(8, "big")),
         (102, _compact_string("member-7"))],
    ]


def test_kafka_reads_the_archiving_state_the_engine_and_state_store_write():
    """KIP-1191: state 3 is Kafka's ARCHIVING; our reason (tag 103) is kept as an unknown tag."""
    from proxy.share import state_store
    from proxy.share.partition import BatchHeader, PartitionConfig, SharePartition

    engine = SharePartition(PartitionConfig(delivery_count_limit=2, dead_letter=True), 0)
    engine.acquire("member-7", [BatchHeader(0, 9)], now=1_000, max_records=10)
    engine.acknowledge("member-7", [AckRange(0, 2, (3,)), AckRange(3, 9, (2,))], now=2_000)  # reject, release
    engine.acquire("member-7", [BatchHeader(0, 9)], now=3_000, max_records=10)
    engine.acknowledge("member-7", [AckRange(3, 4, (2,))], now=4_000)  # second delivery: the limit
    key_bytes, value_bytes = state_store.snapshot_record(
        (cases.GROUP, cases.TOPIC, 0), engine.snapshot(), snapshot_epoch=1, state_epoch=0,
        create_timestamp=1, write_timestamp=2)
    seen = run("parse", "share_state", key_bytes.hex(), value_bytes.hex())
    assert bytes.fromhex(seen["reserializedValue"]) == value_bytes
    assert seen["value"]["startOffset"] == 0
    assert [(b["firstOffset"], b["lastOffset"], b["deliveryState"], b["deliveryCount"])
            for b in seen["value"]["stateBatches"]] == [(0, 2, 3, 1), (3, 4, 3, 2), (5, 9, 0, 1)]
    assert [[(t["tag"], bytes.fromhex(t["data"])) for t in b["tags"]] for b in seen["batchUnknownTags"]] == [
        [(103, bytes([1]))], [(103, bytes([2]))], []]


def test_kafka_reads_our_tombstone():
    key, _ = cases.share_snapshot()
    key_bytes, value_bytes = encode_record(key, None)
    seen = run("parse", "share_state", key_bytes.hex())
    assert value_bytes is None and seen["value"] is None
    assert seen["key"]["groupId"] == cases.GROUP
