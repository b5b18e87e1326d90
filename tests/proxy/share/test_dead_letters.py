"""The dead-letter writer's rules: Kafka's topic checks, headers, partitioning, rounds."""

from __future__ import annotations

import pytest

from codec.share_events import ArchiveReason
from proxy.share.dead_letters import (
    TopicFacts,
    TopicProblem,
    _first_records,
    check_topic,
    dead_letter_headers,
    dead_letter_reason,
    dead_letters,
    is_transient,
    offset_ranges,
)
from proxy.share.partition import ArchivingRun

ENABLED = TopicFacts(exists=True, partitions=2, dlq_enabled=True)


@pytest.mark.parametrize(("topic", "facts", "prefix", "auto_create", "expected"), [
    ("", TopicFacts(False), "dlq.", True, TopicProblem.NOT_CONFIGURED),
    ("__consumer_offsets", ENABLED, "", True, TopicProblem.INTERNAL_NAME),
    ("dlq.x", TopicFacts(True, 2, dlq_enabled=False), "dlq.", True, TopicProblem.NOT_ENABLED),
    ("dlq.x", TopicFacts(False), "dlq.", False, TopicProblem.MISSING),
    ("orders-dlq", ENABLED, "dlq.", False, TopicProblem.PREFIX),
    ("orders-dlq", TopicFacts(False), "dlq.", True, TopicProblem.PREFIX),
    # Kafka's order: a topic without the mark fails on the mark before the prefix.
    ("orders-dlq", TopicFacts(True, 1, dlq_enabled=False), "dlq.", True, TopicProblem.NOT_ENABLED),
    ("dlq.x", ENABLED, "dlq.", False, None),
    ("anything", ENABLED, "", False, None),
    ("dlq.x", TopicFacts(False), "dlq.", True, None),  # created on first use
    # A broker without the topic config (Kafka 3.9): the mark cannot be checked, so it is not.
    ("dlq.x", TopicFacts(True, 1, dlq_enabled=None), "dlq.", False, None),
])
def test_topic_checks_are_kafkas_in_kafkas_order(topic, facts, prefix, auto_create, expected):
    assert check_topic(topic, facts, prefix=prefix, auto_create=auto_create) is expected


def test_failure_messages_are_kafkas_wording():
    assert TopicProblem.PREFIX.message("g", "orders-dlq", "dlq.") == (
        "Configured DLQ topic name does not comply with the DLQ topic prefix in share group: g, topic: orders-dlq, "
        "prefix: dlq..")  # Kafka ends every message with a period
    assert TopicProblem.NOT_ENABLED.message("g", "dlq.x", "dlq.") == (
        "DLQ is not enabled on configured DLQ topic for share group: g, topic: dlq.x.")
    assert TopicProblem.MISSING.label == "topic_missing"


def test_headers_are_kafkas_six_as_utf8_strings():
    assert dead_letter_headers("orders", 2, 1234, "billing", 3, ArchiveReason.DELIVERY_LIMIT) == [
        ("__dlq.errors.topic", b"orders"),
        ("__dlq.errors.partition", b"2"),
        ("__dlq.errors.offset", b"1234"),
        ("__dlq.errors.group", b"billing"),
        ("__dlq.errors.delivery.count", b"3"),
        ("__dlq.errors.message", b"Offset delivery count exceeded the threshold."),
    ]
    rejected = dict(dead_letter_headers("t", 0, 0, "g", 1, ArchiveReason.REJECTED))
    assert rejected["__dlq.errors.message"] == b"Offset rejected by client."


def test_one_letter_per_offset_partitioned_by_source_partition_mod_dlq_partitions_with_copies_where_found():
    runs = [ArchivingRun(10, 11, 1, ArchiveReason.REJECTED), ArchivingRun(14, 14, 2, ArchiveReason.DELIVERY_LIMIT)]
    letters = dead_letters("g", "orders", 5, runs, dlq_partitions=2, delivery_count_limit=2,
                           originals={10: (b"k10", b"v10"), 14: (None, b"v14")})
    assert [(x.offset, x.partition, x.key, x.value, x.reason) for x in letters] == [
        (10, 1, b"k10", b"v10", ArchiveReason.REJECTED),
        (11, 1, None, None, ArchiveReason.REJECTED),  # gone from the log, or copy off: headers only
        (14, 1, None, b"v14", ArchiveReason.DELIVERY_LIMIT),
    ]
    assert dict(letters[2].headers)["__dlq.errors.delivery.count"] == b"2"
    assert dict(letters[1].headers)["__dlq.errors.offset"] == b"11"


@pytest.mark.parametrize(("count", "expected"), [(1, ArchiveReason.REJECTED), (3, ArchiveReason.DELIVERY_LIMIT),
                                                 (4, ArchiveReason.DELIVERY_LIMIT)])
def test_an_unknown_reason_is_derived_from_the_count_as_kafka_does(count, expected):
    assert dead_letter_reason(ArchivingRun(0, 0, count, ArchiveReason.NONE), delivery_count_limit=3) is expected
    assert dead_letter_reason(ArchivingRun(0, 0, count, ArchiveReason.REJECTED), 3) is ArchiveReason.REJECTED


def test_offsets_coalesce_into_ranges_and_rounds_are_bounded():
    assert offset_ranges([5, 3, 4, 9, 7, 8]) == [(3, 5), (7, 9)]
    assert offset_ranges([]) == []
    runs = [ArchivingRun(0, 3, 1, ArchiveReason.REJECTED), ArchivingRun(10, 20, 2, ArchiveReason.DELIVERY_LIMIT)]
    assert _first_records(runs, 6) == [runs[0], ArchivingRun(10, 11, 2, ArchiveReason.DELIVERY_LIMIT)]
    assert _first_records(runs, 100) == runs


def test_retriable_produce_errors_are_told_from_those_no_retry_fixes():
    assert is_transient("NOT_ENOUGH_REPLICAS") and is_transient("_MSG_TIMED_OUT")
    assert not is_transient("TOPIC_AUTHORIZATION_FAILED") and not is_transient("MSG_SIZE_TOO_LARGE")
