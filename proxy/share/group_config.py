"""Share-group configuration: Kafka's ``share.*`` group configs, their defaults and bounds.

Pure values and parsing (no I/O). The coordinator keeps one :class:`ShareGroupConfig` per group
(defaults with the group's overrides applied); the partition registry turns it into the engine's
``PartitionConfig`` at each acquisition, so a config change reaches share-partitions already in
flight. Names and checks follow Kafka's ``GroupConfig`` (KIP-932 "Group configuration").
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

__all__ = [
    "AlterOp",
    "AutoOffsetReset",
    "ConfigSource",
    "DescribedConfig",
    "GroupConfigError",
    "KAFKA_DEFAULTS",
    "ShareGroupConfig",
    "ShareGroupLimits",
    "altered_overrides",
    "describe_group_config",
    "is_share_group_key",
    "parse_auto_offset_reset",
]


class GroupConfigError(Exception):
    """An invalid group configuration (Kafka answers INVALID_CONFIG unless `code` says otherwise)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.invalid_config) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class AutoOffsetReset:
    """``share.auto.offset.reset``: ``latest``, ``earliest`` or ``by_duration:<ISO-8601>``."""

    strategy: str
    duration_ms: int | None = None

    def __str__(self) -> str:
        return self.strategy if self.duration_ms is None else f"by_duration:{self._iso}"

    @property
    def _iso(self) -> str:
        return f"PT{self.duration_ms / 1000:g}S"


_DURATION = re.compile(
    r"^P(?:(?P<d>\d+)D)?(?:T(?=\d)(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d{1,9})?)S)?)?$"
)


def parse_auto_offset_reset(value: str) -> AutoOffsetReset:
    """Parse ``share.auto.offset.reset`` as Kafka's ``ShareGroupAutoOffsetResetStrategy`` does."""
    text = value.strip().lower()
    if text in ("latest", "earliest"):
        return AutoOffsetReset(text)
    if text.startswith("by_duration:"):
        iso = value.strip()[len("by_duration:"):].strip().upper()
        match = _DURATION.match(iso)
        if match is None or iso in ("P", "PT"):
            raise GroupConfigError(
                f"share.auto.offset.reset duration must be ISO-8601 PnDTnHnMn.nS, not {iso!r}"
            )
        days, hours, minutes = (int(match.group(k) or 0) for k in "dhm")
        seconds = float(match.group("s") or 0)
        ms = round(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)
        return AutoOffsetReset("by_duration", ms)
    raise GroupConfigError(
        f"share.auto.offset.reset must be latest, earliest or by_duration:<duration>, not {value!r}"
    )


@dataclass(frozen=True, slots=True)
class ShareGroupLimits:
    """Broker-level bounds on per-group settings (``group.share.min.*`` / ``group.share.max.*``)."""

    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000
    min_heartbeat_interval_ms: int = 5_000
    max_heartbeat_interval_ms: int = 15_000
    min_record_lock_duration_ms: int = 15_000
    max_record_lock_duration_ms: int = 60_000
    min_delivery_count_limit: int = 2  # KIP-1240 (Kafka 4.3): group.share.min.delivery.count.limit
    max_delivery_count_limit: int = 10  # group.share.max.delivery.count.limit
    min_partition_max_record_locks: int = 100  # group.share.min.partition.max.record.locks
    max_partition_max_record_locks: int = 4_000  # group.share.max.partition.max.record.locks (4.3+ default)
    # IN_PROGRESS (draft KIP KAFKA-20458; no Kafka broker has them): the proxy's own bounds.
    min_in_progress_staleness_threshold_ms: int = 1_000
    max_in_progress_staleness_threshold_ms: int = 3_600_000
    min_in_progress_max_lock_extension_ms: int = 1_000
    max_in_progress_max_lock_extension_ms: int = 86_400_000
    min_in_progress_rebalance_grace_ms: int = 0
    max_in_progress_rebalance_grace_ms: int = 600_000


_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
_STRINGS = frozenset({"auto_offset_reset", "isolation_level", "dead_letter_topic"})
_BOOLEANS = frozenset({"dead_letter_copy_record"})


def _parse_boolean(name: str, raw: object) -> bool:
    """A BOOLEAN group config as Kafka's ConfigDef parses it: true / false, any case."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise GroupConfigError(f"Invalid value {raw} for configuration {name}: Expected value to be either true or false")


@dataclass(frozen=True, slots=True)
class ShareGroupConfig:
    """Per-group share settings with Kafka's defaults (group configs ``share.*``)."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    partition_max_record_locks: int = 2_000
    auto_offset_reset: AutoOffsetReset = AutoOffsetReset("latest")
    isolation_level: str = "read_uncommitted"
    # IN_PROGRESS (docs/in-progress.md): the draft KIP's group.share.in.progress.* defaults.
    in_progress_staleness_threshold_ms: int = 90_000
    in_progress_max_lock_extension_ms: int = 1_800_000
    in_progress_rebalance_grace_ms: int = 5_000
    # KIP-1191 dead-letter queue (docs/dead-letters.md): empty topic name = no DLQ.
    dead_letter_topic: str = ""
    dead_letter_copy_record: bool = False

    #: Kafka's group-config names -> field names.
    NAMES = {
        "share.session.timeout.ms": "session_timeout_ms",
        "share.heartbeat.interval.ms": "heartbeat_interval_ms",
        "share.record.lock.duration.ms": "record_lock_duration_ms",
        "share.delivery.count.limit": "delivery_count_limit",
        "share.partition.max.record.locks": "partition_max_record_locks",
        "share.auto.offset.reset": "auto_offset_reset",
        "share.isolation.level": "isolation_level",
        "share.in.progress.staleness.threshold.ms": "in_progress_staleness_threshold_ms",
        "share.in.progress.max.lock.extension.ms": "in_progress_max_lock_extension_ms",
        "share.in.progress.rebalance.grace.ms": "in_progress_rebalance_grace_ms",
        "errors.deadletterqueue.topic.name": "dead_letter_topic",
        "errors.deadletterqueue.copy.record.enable": "dead_letter_copy_record",
    }

    def with_overrides(self, overrides: Mapping[str, str | int]) -> ShareGroupConfig:
        """Apply Kafka-named overrides (strings as AlterConfigs carries them); not validated."""
        changes: dict[str, object] = {}
        for name, raw in overrides.items():
            attr = self.NAMES.get(name)
            if attr is None:
                raise GroupConfigError(f"Unknown group config name: {name}")
            if attr == "auto_offset_reset":
                changes[attr] = parse_auto_offset_reset(str(raw))
            elif attr == "isolation_level":
                changes[attr] = str(raw).strip().lower()
            elif attr == "dead_letter_topic":
                changes[attr] = str(raw).strip()
            elif attr in _BOOLEANS:
                changes[attr] = _parse_boolean(name, raw)
            else:
                try:
                    changes[attr] = int(str(raw).strip())
                except (TypeError, ValueError):
                    # Kafka's ConfigDef wording for an INT that does not parse.
                    raise GroupConfigError(f"Invalid value {raw} for configuration {name}: "
                                           "Not a number of type INT") from None
        return replace(self, **changes)  # type: ignore[arg-type]

    def validate(self, limits: ShareGroupLimits = ShareGroupLimits()) -> ShareGroupConfig:
        """Check the values against ``limits`` as Kafka's ``GroupConfig.validateValues`` does."""
        for name, (attr, low_attr, high_attr) in _BOUNDED.items():
            value, low, high = getattr(self, attr), getattr(limits, low_attr), getattr(limits, high_attr)
            broker = _BROKER_NAMES[name]
            if value < low:
                raise GroupConfigError(f"{name} must be greater than or equal to {_bound_name(broker, 'min')} "
                                       f"({low}), not {value}")
            if value > high:
                raise GroupConfigError(f"{name} must be less than or equal to {_bound_name(broker, 'max')} "
                                       f"({high}), not {value}")
        if self.session_timeout_ms <= self.heartbeat_interval_ms:
            raise GroupConfigError("share.session.timeout.ms must be greater than share.heartbeat.interval.ms "
                                   f"({self.session_timeout_ms} <= {self.heartbeat_interval_ms})")
        if self.in_progress_max_lock_extension_ms < self.in_progress_staleness_threshold_ms:
            # Else every IN_PROGRESS record would hit the max extension before it could go stale.
            raise GroupConfigError(
                "share.in.progress.max.lock.extension.ms must be greater than or equal to "
                "share.in.progress.staleness.threshold.ms "
                f"({self.in_progress_max_lock_extension_ms} < {self.in_progress_staleness_threshold_ms})")
        if self.dead_letter_topic.startswith("__"):
            # Kafka's GroupConfig check: internal topics can never be a DLQ.
            raise GroupConfigError("errors.deadletterqueue.topic.name: DLQ topic name must not start with '__'")
        if self.isolation_level not in _ISOLATION_LEVELS:
            raise GroupConfigError(f"share.isolation.level must be one of {', '.join(_ISOLATION_LEVELS)}, "
                                   f"not {self.isolation_level!r}")
        return self


# -- bounds, names and descriptions (Kafka's GroupConfig / ShareGroupConfig / KIP-1240) ------------

#: Bounded group configs -> (field, lower-bound field, upper-bound field) of ShareGroupLimits.
_BOUNDED = {
    "share.session.timeout.ms": ("session_timeout_ms", "min_session_timeout_ms", "max_session_timeout_ms"),
    "share.heartbeat.interval.ms": ("heartbeat_interval_ms", "min_heartbeat_interval_ms", "max_heartbeat_interval_ms"),
    "share.record.lock.duration.ms": ("record_lock_duration_ms", "min_record_lock_duration_ms",
                                      "max_record_lock_duration_ms"),
    "share.delivery.count.limit": ("delivery_count_limit", "min_delivery_count_limit", "max_delivery_count_limit"),
    "share.partition.max.record.locks": ("partition_max_record_locks", "min_partition_max_record_locks",
                                         "max_partition_max_record_locks"),
    "share.in.progress.staleness.threshold.ms": ("in_progress_staleness_threshold_ms",
                                                 "min_in_progress_staleness_threshold_ms",
                                                 "max_in_progress_staleness_threshold_ms"),
    "share.in.progress.max.lock.extension.ms": ("in_progress_max_lock_extension_ms",
                                                "min_in_progress_max_lock_extension_ms",
                                                "max_in_progress_max_lock_extension_ms"),
    "share.in.progress.rebalance.grace.ms": ("in_progress_rebalance_grace_ms", "min_in_progress_rebalance_grace_ms",
                                             "max_in_progress_rebalance_grace_ms"),
}

#: Group config -> the broker config that sets its default for every group (Kafka's names).
_BROKER_NAMES = {
    "share.session.timeout.ms": "group.share.session.timeout.ms",
    "share.heartbeat.interval.ms": "group.share.heartbeat.interval.ms",
    "share.record.lock.duration.ms": "group.share.record.lock.duration.ms",
    "share.delivery.count.limit": "group.share.delivery.count.limit",
    "share.partition.max.record.locks": "group.share.partition.max.record.locks",
    # The draft KIP's broker-level names (the proxy's --share-in-progress-* flags set them).
    "share.in.progress.staleness.threshold.ms": "group.share.in.progress.staleness.threshold.ms",
    "share.in.progress.max.lock.extension.ms": "group.share.in.progress.max.lock.extension.ms",
    "share.in.progress.rebalance.grace.ms": "group.share.in.progress.rebalance.grace.ms",
}


def _bound_name(broker_name: str, which: str) -> str:
    """``group.share.session.timeout.ms`` -> ``group.share.min.session.timeout.ms``."""
    return broker_name.replace("group.share.", f"group.share.{which}.", 1)


def is_share_group_key(name: str) -> bool:
    """A group config only share groups use: ``share.*`` and KIP-1191's ``errors.deadletterqueue.*``
    (an alteration setting one on an unknown id is the proxy's, not the cluster's)."""
    return name.startswith("share.") or name.startswith("errors.deadletterqueue.")


#: Other group configs Kafka 4.x knows. Setting one on a share group the proxy serves is refused
#: (it would have no effect); Kafka itself keeps one GroupConfig for every group type.
OTHER_KAFKA_GROUP_CONFIGS = frozenset({
    "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms", "consumer.assignment.interval.ms",
    "streams.session.timeout.ms", "streams.heartbeat.interval.ms", "streams.num.standby.replicas",
    "streams.initial.rebalance.delay.ms", "streams.assignment.interval.ms",
    "share.assignment.interval.ms", "share.renew.acknowledge.enable",
})

_DOCS = {
    "share.session.timeout.ms": "The timeout to detect client failures when using the share group protocol.",
    "share.heartbeat.interval.ms": "The heartbeat interval given to the members of a share group.",
    "share.record.lock.duration.ms": "The record acquisition lock duration in milliseconds for share groups.",
    "share.delivery.count.limit": "The maximum number of delivery attempts for a record delivered to a share group.",
    "share.partition.max.record.locks": "Share-group record lock limit per share-partition.",
    "share.auto.offset.reset": "The strategy to initialize the share-partition start offset: earliest, latest "
                               "or by_duration:<ISO-8601 duration> (PnDTnHnMn.nS).",
    "share.isolation.level": "Controls how to read records written transactionally: read_committed or "
                             "read_uncommitted.",
    "share.in.progress.staleness.threshold.ms": "An IN_PROGRESS record with no progress signal for this long is "
                                                "released (stuck-worker detection).",
    "share.in.progress.max.lock.extension.ms": "The longest a record may stay IN_PROGRESS, however often it is "
                                               "marked (runaway-worker detection).",
    "share.in.progress.rebalance.grace.ms": "How long the fresh IN_PROGRESS records of a member that left stay its "
                                            "own before they are released.",
    "errors.deadletterqueue.topic.name": "The name of the topic to be used as the dead-letter queue (DLQ) topic for "
                                         "this share group. If blank (the default), the group does not have a DLQ "
                                         "topic.",
    "errors.deadletterqueue.copy.record.enable": "When writing onto the dead-letter queue topic, whether to copy the "
                                                 "original record onto the DLQ topic, or just write a record "
                                                 "containing the context information headers.",
}

#: Kafka's own defaults for every share group config (its broker configs' defaults).
KAFKA_DEFAULTS = ShareGroupConfig()


class ConfigSource(enum.IntEnum):
    """DescribeConfigs ``ConfigSource`` ids (Kafka's DescribeConfigsResponse.ConfigSource)."""

    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    GROUP_CONFIG = 8


class ConfigType(enum.IntEnum):
    """DescribeConfigs ``ConfigType`` ids (Kafka's DescribeConfigsResponse.ConfigType)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3


class AlterOp(enum.IntEnum):
    """IncrementalAlterConfigs ``ConfigOperation`` (Kafka's AlterConfigOp.OpType ids)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One DescribeConfigs entry of a share group; synonyms are (name, value, source), highest first."""

    name: str
    value: str
    source: ConfigSource
    synonyms: tuple[tuple[str, str, ConfigSource], ...]
    config_type: ConfigType
    documentation: str


def _value_text(config: ShareGroupConfig, name: str) -> str:
    value = getattr(config, ShareGroupConfig.NAMES[name])
    return str(value).lower() if isinstance(value, bool) else str(value)


def _config_type(attr: str) -> ConfigType:
    if attr in _BOOLEANS:
        return ConfigType.BOOLEAN
    return ConfigType.STRING if attr in _STRINGS else ConfigType.INT


def describe_group_config(
    overrides: Mapping[str, str | int],
    proxy_defaults: ShareGroupConfig,
    names: Iterable[str] | None = None,
) -> list[DescribedConfig]:
    """The share.* entries DescribeConfigs gives for a share group, in Kafka's name order.

    Source: GROUP_CONFIG when set on the group, STATIC_BROKER_CONFIG when the proxy's flag gives
    a value other than Kafka's default, else DEFAULT_CONFIG. Synonyms list every level that has a
    value, the group's first, then the proxy's (under Kafka's broker config name), then Kafka's
    default. `names` keeps only those entries (DescribeConfigs ``configuration_keys``); unknown
    names are left out, as Kafka does.
    """
    wanted = sorted(ShareGroupConfig.NAMES) if names is None else [
        n for n in dict.fromkeys(names) if n in ShareGroupConfig.NAMES]
    described = []
    for name in wanted:
        broker_name = _BROKER_NAMES.get(name, name)
        synonyms: list[tuple[str, str, ConfigSource]] = []
        if name in overrides:
            synonyms.append((name, str(overrides[name]).strip(), ConfigSource.GROUP_CONFIG))
        proxy_value, kafka_value = _value_text(proxy_defaults, name), _value_text(KAFKA_DEFAULTS, name)
        if proxy_value != kafka_value:
            synonyms.append((broker_name, proxy_value, ConfigSource.STATIC_BROKER_CONFIG))
        synonyms.append((broker_name, kafka_value, ConfigSource.DEFAULT_CONFIG))
        attr = ShareGroupConfig.NAMES[name]
        described.append(DescribedConfig(
            name=name,
            value=synonyms[0][1],
            source=synonyms[0][2],
            synonyms=tuple(synonyms),
            config_type=_config_type(attr),
            documentation=_DOCS[name],
        ))
    return described


def altered_overrides(
    current: Mapping[str, str | int],
    operations: Iterable[tuple[str, int, str | None]],
) -> dict[str, str | None]:
    """The override changes an IncrementalAlterConfigs asks for: name -> new value (None: back to default).

    Checked as Kafka's controller checks them (values are validated afterwards, on the result):
    a name twice is INVALID_REQUEST; APPEND/SUBTRACT on these non-list configs, a SET without a
    value, a SET of a name Kafka does not know ("Unknown group config name") or of a Kafka group
    config that is not one of the share configs the proxy serves are INVALID_CONFIG. DELETE of a
    name that is not set changes nothing.
    """
    changes: dict[str, str | None] = {}
    for name, op, value in operations:
        if name in changes:
            raise GroupConfigError(f"Error due to duplicate config keys: {name}", ErrorCode.invalid_request)
        try:
            kind = AlterOp(op)
        except ValueError:
            raise GroupConfigError(f"Unknown config operation {op} for {name}", ErrorCode.invalid_request) from None
        if kind in (AlterOp.APPEND, AlterOp.SUBTRACT):
            raise GroupConfigError(f"Can't {kind.name} to key {name} because its type is not LIST.")
        if kind is AlterOp.DELETE:
            changes[name] = None
            continue
        if value is None:
            raise GroupConfigError(f"Null value not supported for group configs: {name}")
        if name in OTHER_KAFKA_GROUP_CONFIGS:
            raise GroupConfigError(
                f"Group config {name} is not served by the share proxy; a share group takes "
                f"{', '.join(sorted(ShareGroupConfig.NAMES))}")
        if name not in ShareGroupConfig.NAMES:
            raise GroupConfigError(f"Unknown group config name: {name}")
        changes[name] = value.strip()
    return changes
