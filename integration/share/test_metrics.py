"""The metrics endpoint against a real broker and real share consumers.

A scrape during and after a run shows the share counters moving exactly as the test drove them:
records acquired = records the consumers received, acknowledgements by type = what a
confluent_kafka ShareConsumer sent with explicit ACCEPT / RELEASE / REJECT, archiving by reason,
the delivery-count histogram, and SPSO / in-flight / lag gauges at the end. The per-API series
count forwarded and locally served requests, and the error codes of responses the proxy built.
Per-partition series appear only with --metrics-per-partition.
"""

from __future__ import annotations

import time

import pytest
import trio
from confluent_kafka import AcknowledgeType
from confluent_kafka.admin import AdminClient

from integration.share.conftest import (
    EXPLICIT,
    Names,
    WireMember,
    acknowledge_all,
    metric,
    poll_until,
    produce,
    scrape_metrics,
    share_consumer,
)
from proxy.localkafka.broker import free_port

pytestmark = pytest.mark.integration

RECORDS = 30


def _ack_type(first_round: bool):
    """Round 1: 0-9 accept, 10-19 release, 20-29 reject. Round 2 (10-19 again): 10-14 release, 15-19 accept."""
    def choose(message):
        offset = message.offset()
        if first_round:
            return (AcknowledgeType.ACCEPT if offset < 10 else
                    AcknowledgeType.RELEASE if offset < 20 else AcknowledgeType.REJECT)
        return AcknowledgeType.RELEASE if offset < 15 else AcknowledgeType.ACCEPT
    return choose


def _wait_for(predicate, timeout: float, describe) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(describe())
        time.sleep(0.2)


def test_share_counters_follow_what_the_consumers_did(kafka, share_proxy, create_topic, names: Names) -> None:
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port), "--metrics-per-partition",
                        "--share-delivery-count-limit", "2")
    create_topic(names.topic)
    produce(kafka.bootstrap, names.topic, RECORDS)
    group = {"group": names.group}

    consumer = share_consumer(proxy.bootstrap, names.group, names.topic, EXPLICIT)
    try:
        first = poll_until(consumer, RECORDS, timeout=30)
        assert sorted(m.offset() for m in first) == list(range(RECORDS))
        # A scrape during the run: everything handed out is Acquired, nothing acknowledged yet.
        during = scrape_metrics(port)
        assert metric(during, "ksp_share_group_records_acquired_total", **group) == RECORDS
        assert metric(during, "ksp_share_group_in_flight_records", **group, state="acquired") == RECORDS
        acknowledge_all(consumer, first, _ack_type(first_round=True))

        second = poll_until(consumer, 10, timeout=30)
        assert sorted(m.offset() for m in second) == list(range(10, 20))
        assert {m.delivery_count() for m in second} == {2}
        acknowledge_all(consumer, second, _ack_type(first_round=False))
    finally:
        consumer.close()

    samples = {}

    def settled() -> bool:
        samples.update(scrape_metrics(port))
        return metric(samples, "ksp_share_partition_start_offset", **group, topic=names.topic,
                      partition="0") == RECORDS

    _wait_for(settled, 20, lambda: f"SPSO never reached {RECORDS}: {_share_samples(samples)}")

    received = len(first) + len(second)
    assert metric(samples, "ksp_share_group_records_acquired_total", **group) == received == 40
    acks = {t: metric(samples, "ksp_share_group_records_acknowledged_total", **group, type=t)
            for t in ("accept", "release", "reject", "renew")}
    assert acks == {"accept": 15.0, "release": 15.0, "reject": 10.0, "renew": 0.0}
    archived = {r: metric(samples, "ksp_share_group_records_archived_total", **group, reason=r)
                for r in ("rejected", "delivery_limit")}
    assert archived == {"rejected": 10.0, "delivery_limit": 5.0}  # 10-14 released at the limit of 2
    # Delivery-count histogram: 30 first deliveries, 10 second ones.
    assert metric(samples, "ksp_share_group_delivery_count_bucket", **group, le="1.0") == 30
    assert metric(samples, "ksp_share_group_delivery_count_bucket", **group, le="2.0") == 40
    assert metric(samples, "ksp_share_group_delivery_count_count", **group) == 40
    assert metric(samples, "ksp_share_group_delivery_count_sum", **group) == 30 * 1 + 10 * 2
    assert metric(samples, "ksp_share_group_lock_expired_records_total", **group) == 0

    # The end: every record finished, SPSO at the log end, nothing in flight, no lag.
    for state in ("available", "acquired", "acknowledged", "archived"):
        assert metric(samples, "ksp_share_group_in_flight_records", **group, state=state) == 0, state
    assert metric(samples, "ksp_share_group_lag_records", **group) == 0
    partition = {**group, "topic": names.topic, "partition": "0"}
    assert metric(samples, "ksp_share_partition_lag_records", **partition) == 0
    assert metric(samples, "ksp_share_partition_records_acquired_total", **partition) == 40
    assert metric(samples, "ksp_share_partition_records_acknowledged_total", **partition, type="reject") == 10
    assert metric(samples, "ksp_share_groups", state="Empty") + metric(samples, "ksp_share_groups",
                                                                       state="Stable") >= 1

    # Per API: forwarded (Metadata) and served (share APIs) requests are counted and timed.
    for api in ("Metadata", "ShareGroupHeartbeat", "ShareFetch"):
        count = metric(samples, "ksp_requests_total", api=api)
        assert count is not None and count >= 1, api
        assert metric(samples, "ksp_request_seconds_count", api=api) >= 1, api
    fetches = metric(samples, "ksp_requests_total", api="ShareFetch")
    # Every ShareFetch was answered before the scrape, so each one was timed.
    assert metric(samples, "ksp_request_seconds_count", api="ShareFetch") == fetches
    # State writes carried the acknowledgements.
    assert metric(samples, "ksp_share_state_writes_total", outcome="ok") >= 3
    assert metric(samples, "ksp_share_state_replay_seconds") is not None

    # Bounded cardinality: a deleted group's series leave the endpoint with it.
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.delete_consumer_groups([names.group], request_timeout=30)[names.group].result(timeout=30)
    remaining = [k for k in scrape_metrics(port) if k[0].startswith("ksp_share_") and ("group", names.group) in k[1]]
    assert remaining == []


def test_error_codes_of_served_responses_are_counted_by_name(kafka, share_proxy, create_topic,
                                                             names: Names) -> None:
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    create_topic(names.topic)
    error = {"api": "ShareGroupHeartbeat", "error": "UNKNOWN_MEMBER_ID"}
    before = metric(scrape_metrics(port), "ksp_response_errors_total", **error) or 0.0

    async def main() -> None:
        real = await WireMember(proxy.bootstrap, names.group).connect()
        stranger = await WireMember(proxy.bootstrap, names.group).connect()
        try:
            await real.join(names.topic)
            for _ in range(3):
                response = await stranger.heartbeat(epoch=1)  # a member id the group never saw
                assert int(response.error_code) == 25  # UNKNOWN_MEMBER_ID
        finally:
            await real.aclose()
            await stranger.aclose()

    trio.run(main)
    after = metric(scrape_metrics(port), "ksp_response_errors_total", **error)
    assert after == before + 3


def test_per_partition_series_only_with_the_switch(kafka, share_proxy, create_topic, names: Names) -> None:
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port))
    create_topic(names.topic, partitions=2)
    produce(kafka.bootstrap, names.topic, 8, partitions=2)
    consumer = share_consumer(proxy.bootstrap, names.group, names.topic, EXPLICIT)
    try:
        messages = poll_until(consumer, 8, timeout=30)
        acknowledge_all(consumer, messages)
    finally:
        consumer.close()
    samples = scrape_metrics(port)
    assert metric(samples, "ksp_share_group_records_acquired_total", group=names.group) == 8
    assert metric(samples, "ksp_share_group_records_acknowledged_total", group=names.group, type="accept") == 8
    assert metric(samples, "ksp_share_group_partitions", group=names.group) == 2
    per_partition = sorted({name for name, _ in samples if name.startswith("ksp_share_partition_")})
    assert per_partition == [], per_partition


def _share_samples(samples) -> dict:
    return {k: v for k, v in samples.items() if k[0].startswith("ksp_share_")}
