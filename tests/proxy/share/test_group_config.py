"""Pure share-group config rules: bounds with Kafka's wording, alter operations, describe entries."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from proxy.share.coordinator import CoordinatorConfig, ShareGroupCoordinator
from proxy.share.group_config import (
    AlterOp,
    ConfigSource,
    ConfigType,
    GroupConfigError,
    ShareGroupConfig,
    ShareGroupLimits,
    altered_overrides,
    describe_group_config,
)


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("share.delivery.count.limit", "11",
     "share.delivery.count.limit must be less than or equal to group.share.max.delivery.count.limit (10), not 11"),
    ("share.delivery.count.limit", "1",
     "share.delivery.count.limit must be greater than or equal to group.share.min.delivery.count.limit (2), not 1"),
    ("share.partition.max.record.locks", "4001",
     "share.partition.max.record.locks must be less than or equal to "
     "group.share.max.partition.max.record.locks (4000), not 4001"),
    ("share.record.lock.duration.ms", "60001",
     "share.record.lock.duration.ms must be less than or equal to group.share.max.record.lock.duration.ms (60000), "
     "not 60001"),
    ("share.session.timeout.ms", "abc", "Invalid value abc for configuration share.session.timeout.ms: "
                                        "Not a number of type INT"),
])
def test_bounds_are_kip_1240s_with_the_bound_named(name, value, expected):
    with pytest.raises(GroupConfigError) as error:
        ShareGroupConfig().with_overrides({name: value}).validate()
    assert str(error.value) == expected
    assert error.value.code == ErrorCode.invalid_config


def test_the_proxys_limits_decide_not_kafkas():
    limits = ShareGroupLimits(max_delivery_count_limit=6, min_record_lock_duration_ms=1000)
    assert ShareGroupConfig().with_overrides({"share.record.lock.duration.ms": "1000"}).validate(limits)
    with pytest.raises(GroupConfigError, match=r"\(6\), not 7"):
        ShareGroupConfig().with_overrides({"share.delivery.count.limit": "7"}).validate(limits)


def test_set_and_delete_become_override_changes():
    changes = altered_overrides({"share.delivery.count.limit": "3"}, [
        ("share.delivery.count.limit", AlterOp.DELETE, None),
        ("share.auto.offset.reset", AlterOp.SET, " earliest "),
        ("share.isolation.level", AlterOp.DELETE, None),  # not set: Kafka changes nothing either
    ])
    assert changes == {"share.delivery.count.limit": None, "share.auto.offset.reset": "earliest",
                       "share.isolation.level": None}


@pytest.mark.parametrize(("operation", "code", "message"), [
    (("share.isolation.level", AlterOp.APPEND, "read_committed"), ErrorCode.invalid_config,
     "Can't APPEND to key share.isolation.level because its type is not LIST."),
    (("share.isolation.level", AlterOp.SUBTRACT, "x"), ErrorCode.invalid_config,
     "Can't SUBTRACT to key share.isolation.level because its type is not LIST."),
    (("share.colour", AlterOp.SET, "blue"), ErrorCode.invalid_config, "Unknown group config name: share.colour"),
    (("share.session.timeout.ms", AlterOp.SET, None), ErrorCode.invalid_config,
     "Null value not supported for group configs: share.session.timeout.ms"),
    (("consumer.session.timeout.ms", AlterOp.SET, "50000"), ErrorCode.invalid_config,
     "Group config consumer.session.timeout.ms is not served by the share proxy"),
    (("share.session.timeout.ms", 7, "1"), ErrorCode.invalid_request, "Unknown config operation 7"),
])
def test_refused_operations(operation, code, message):
    with pytest.raises(GroupConfigError) as error:
        altered_overrides({}, [operation])
    assert error.value.code == code
    assert str(error.value).startswith(message)


def test_a_key_twice_is_an_invalid_request():
    with pytest.raises(GroupConfigError) as error:
        altered_overrides({}, [("share.session.timeout.ms", AlterOp.SET, "50000"),
                               ("share.session.timeout.ms", AlterOp.DELETE, None)])
    assert error.value.code == ErrorCode.invalid_request


def test_describe_gives_value_source_and_synonyms_per_level():
    proxy_defaults = ShareGroupConfig(record_lock_duration_ms=20_000)
    described = {d.name: d for d in describe_group_config({"share.delivery.count.limit": "3"}, proxy_defaults)}
    assert list(described) == sorted(ShareGroupConfig.NAMES)
    limit = described["share.delivery.count.limit"]
    assert (limit.value, limit.source, limit.config_type) == ("3", ConfigSource.GROUP_CONFIG, ConfigType.INT)
    assert limit.synonyms == (("share.delivery.count.limit", "3", ConfigSource.GROUP_CONFIG),
                              ("group.share.delivery.count.limit", "5", ConfigSource.DEFAULT_CONFIG))
    lock = described["share.record.lock.duration.ms"]
    assert (lock.value, lock.source) == ("20000", ConfigSource.STATIC_BROKER_CONFIG)
    assert lock.synonyms[1] == ("group.share.record.lock.duration.ms", "30000", ConfigSource.DEFAULT_CONFIG)
    reset = described["share.auto.offset.reset"]
    assert (reset.value, reset.source, reset.config_type) == ("latest", ConfigSource.DEFAULT_CONFIG,
                                                              ConfigType.STRING)
    assert reset.documentation


def test_describe_keeps_only_the_keys_asked_for_and_ignores_unknown_ones():
    described = describe_group_config({}, ShareGroupConfig(), ["share.isolation.level", "nope", "share.isolation.level"])
    assert [d.name for d in described] == ["share.isolation.level"]
    assert describe_group_config({}, ShareGroupConfig(), []) == []


def test_validate_only_changes_nothing():
    coordinator = ShareGroupCoordinator()
    config = coordinator.set_group_config("g", {"share.delivery.count.limit": "3"}, validate_only=True)
    assert config.delivery_count_limit == 3
    assert coordinator.group_config_overrides("g") == {}


def test_restored_overrides_outside_todays_bounds_are_dropped_one_by_one():
    coordinator = ShareGroupCoordinator(CoordinatorConfig(limits=ShareGroupLimits(max_delivery_count_limit=6)))
    dropped = coordinator.restore_group_config("g", {"share.delivery.count.limit": "8",
                                                     "share.record.lock.duration.ms": "20000"})
    assert dropped == ["share.delivery.count.limit"]
    assert coordinator.group_config_overrides("g") == {"share.record.lock.duration.ms": "20000"}
    assert not coordinator.has_group("g")


# ----- IN_PROGRESS (docs/in-progress.md) ------------------------------------------------------


def test_in_progress_configs_default_to_the_draft_kip_and_are_overridden_per_group():
    config = ShareGroupConfig()
    assert (config.in_progress_staleness_threshold_ms, config.in_progress_max_lock_extension_ms,
            config.in_progress_rebalance_grace_ms) == (90_000, 1_800_000, 5_000)
    changed = config.with_overrides({"share.in.progress.staleness.threshold.ms": "2000",
                                     "share.in.progress.max.lock.extension.ms": " 8000 ",
                                     "share.in.progress.rebalance.grace.ms": "0"}).validate()
    assert (changed.in_progress_staleness_threshold_ms, changed.in_progress_max_lock_extension_ms,
            changed.in_progress_rebalance_grace_ms) == (2_000, 8_000, 0)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"share.in.progress.staleness.threshold.ms": "999"},
     "share.in.progress.staleness.threshold.ms must be greater than or equal to "
     "group.share.min.in.progress.staleness.threshold.ms (1000), not 999"),
    ({"share.in.progress.staleness.threshold.ms": "3600001", "share.in.progress.max.lock.extension.ms": "7200000"},
     "share.in.progress.staleness.threshold.ms must be less than or equal to "
     "group.share.max.in.progress.staleness.threshold.ms (3600000), not 3600001"),
    ({"share.in.progress.max.lock.extension.ms": "86400001"},
     "share.in.progress.max.lock.extension.ms must be less than or equal to "
     "group.share.max.in.progress.max.lock.extension.ms (86400000), not 86400001"),
    ({"share.in.progress.rebalance.grace.ms": "-1"},
     "share.in.progress.rebalance.grace.ms must be greater than or equal to "
     "group.share.min.in.progress.rebalance.grace.ms (0), not -1"),
    ({"share.in.progress.rebalance.grace.ms": "600001"},
     "share.in.progress.rebalance.grace.ms must be less than or equal to "
     "group.share.max.in.progress.rebalance.grace.ms (600000), not 600001"),
    # The max extension below the staleness threshold would release every record before it could go stale.
    ({"share.in.progress.max.lock.extension.ms": "60000"},
     "share.in.progress.max.lock.extension.ms must be greater than or equal to "
     "share.in.progress.staleness.threshold.ms (60000 < 90000)"),
    ({"share.in.progress.rebalance.grace.ms": "soon"},
     "Invalid value soon for configuration share.in.progress.rebalance.grace.ms: Not a number of type INT"),
])
def test_in_progress_configs_are_bounded_like_the_others(overrides, expected):
    with pytest.raises(GroupConfigError) as error:
        ShareGroupConfig().with_overrides(overrides).validate()
    assert str(error.value) == expected
    assert error.value.code == ErrorCode.invalid_config


def test_in_progress_configs_are_described_with_their_sources():
    proxy_defaults = ShareGroupConfig(in_progress_rebalance_grace_ms=1_000)
    described = {d.name: d for d in describe_group_config(
        {"share.in.progress.staleness.threshold.ms": "2000"}, proxy_defaults)}
    staleness = described["share.in.progress.staleness.threshold.ms"]
    assert (staleness.value, staleness.source, staleness.config_type) == ("2000", ConfigSource.GROUP_CONFIG,
                                                                          ConfigType.INT)
    assert staleness.synonyms == (
        ("share.in.progress.staleness.threshold.ms", "2000", ConfigSource.GROUP_CONFIG),
        ("group.share.in.progress.staleness.threshold.ms", "90000", ConfigSource.DEFAULT_CONFIG))
    grace = described["share.in.progress.rebalance.grace.ms"]
    assert (grace.value, grace.source) == ("1000", ConfigSource.STATIC_BROKER_CONFIG)
    extension = described["share.in.progress.max.lock.extension.ms"]
    assert (extension.value, extension.source) == ("1800000", ConfigSource.DEFAULT_CONFIG)
    assert extension.documentation


def test_in_progress_overrides_are_set_through_the_coordinator_and_refused_as_a_whole():
    coordinator = ShareGroupCoordinator()
    coordinator.set_group_config("g", {"share.in.progress.staleness.threshold.ms": "2000",
                                       "share.in.progress.max.lock.extension.ms": "5000"})
    assert coordinator.group_config("g").in_progress_max_lock_extension_ms == 5_000
    with pytest.raises(GroupConfigError, match="must be greater than or equal to share.in.progress.staleness"):
        coordinator.set_group_config("g", {"share.in.progress.staleness.threshold.ms": "6000"})
    assert coordinator.group_config("g").in_progress_staleness_threshold_ms == 2_000


def test_dead_letter_configs_default_to_no_dlq_and_are_set_per_group():
    assert (ShareGroupConfig().dead_letter_topic, ShareGroupConfig().dead_letter_copy_record) == ("", False)
    config = ShareGroupConfig().with_overrides({"errors.deadletterqueue.topic.name": " dlq.orders ",
                                                "errors.deadletterqueue.copy.record.enable": "TRUE"}).validate()
    assert (config.dead_letter_topic, config.dead_letter_copy_record) == ("dlq.orders", True)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"errors.deadletterqueue.topic.name": "__dlq"},
     "errors.deadletterqueue.topic.name: DLQ topic name must not start with '__'"),
    ({"errors.deadletterqueue.copy.record.enable": "yes"},
     "Invalid value yes for configuration errors.deadletterqueue.copy.record.enable: "
     "Expected value to be either true or false"),
])
def test_dead_letter_configs_are_checked_as_kafka_checks_them_at_alter_time(overrides, expected):
    with pytest.raises(GroupConfigError) as error:
        ShareGroupConfig().with_overrides(overrides).validate()
    assert str(error.value) == expected
    assert error.value.code == ErrorCode.invalid_config


def test_a_topic_name_outside_the_prefix_is_accepted_at_alter_time():
    # Kafka checks the broker's prefix only when it writes (the record is archived regardless).
    config = ShareGroupConfig().with_overrides({"errors.deadletterqueue.topic.name": "orders-dlq"}).validate()
    assert config.dead_letter_topic == "orders-dlq"


def test_dead_letter_configs_are_described_with_their_types():
    described = {d.name: d for d in describe_group_config(
        {"errors.deadletterqueue.topic.name": "dlq.orders"}, ShareGroupConfig())}
    topic = described["errors.deadletterqueue.topic.name"]
    assert (topic.value, topic.source, topic.config_type) == ("dlq.orders", ConfigSource.GROUP_CONFIG,
                                                              ConfigType.STRING)
    copy = described["errors.deadletterqueue.copy.record.enable"]
    assert (copy.value, copy.source, copy.config_type) == ("false", ConfigSource.DEFAULT_CONFIG, ConfigType.BOOLEAN)
    assert copy.documentation


def test_dead_letter_configs_can_be_altered_on_a_share_group():
    changes = altered_overrides({}, [("errors.deadletterqueue.topic.name", AlterOp.SET, "dlq.x"),
                                     ("errors.deadletterqueue.copy.record.enable", AlterOp.SET, "true")])
    assert changes == {"errors.deadletterqueue.topic.name": "dlq.x", "errors.deadletterqueue.copy.record.enable": "true"}
    coordinator = ShareGroupCoordinator()
    with pytest.raises(GroupConfigError, match="must not start with '__'"):
        coordinator.set_group_config("g", {"errors.deadletterqueue.topic.name": "__consumer_offsets"})
    assert coordinator.group_config("g").dead_letter_topic == ""
