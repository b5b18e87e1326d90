"""Configuration of ``share-proxy serve``: one frozen dataclass, three sources.

Each option is described once in :data:`OPTIONS` and can be given as a command
line flag (``--max-frame-size``), an environment variable (``KSP_MAX_FRAME_SIZE``)
or a key in a TOML config file (``max_frame_size = ...`` or ``max-frame-size``),
in that order of precedence, falling back to the default.
"""

from __future__ import annotations

import argparse
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import ConfigError

ENV_PREFIX = "KSP_"


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: str) -> HostPort:
    """Parse ``HOST:PORT`` (``[v6addr]:PORT`` for IPv6 literals)."""
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"port in {text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"port in {text!r} is out of range")
    return HostPort(host, port)


def parse_host_ports(text: str | list[str]) -> tuple[HostPort, ...]:
    items = text if isinstance(text, list) else text.split(",")
    result = tuple(parse_host_port(item) for item in items if item.strip())
    if not result:
        raise ConfigError("at least one upstream HOST:PORT is required")
    return result


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"not a boolean: {text!r}")


class Secret:
    """A password or key passphrase: usable through :attr:`value`, never shown by repr/str, so a
    logged config or exception cannot carry it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = str(value)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def parse_choice(*choices: str) -> Callable[[Any], str]:
    """A parser accepting one of `choices`, case-insensitively; returns the canonical spelling."""
    canonical = {choice.lower(): choice for choice in choices}

    def parse(text: Any) -> str:
        key = str(text).strip().lower()
        if key not in canonical:
            raise ConfigError(f"{text!r} is not one of {', '.join(choices)}")
        return canonical[key]

    return parse


def parse_optional_str(text: Any) -> str | None:
    if text is None or str(text).strip() == "":
        return None
    return str(text)


def parse_sasl_mechanism(text: Any) -> str | None:
    value = parse_optional_str(text)
    return value.strip().upper() if value else None


#: The default cut-through size where responses are spliced (docs/benchmarks.md, "Spliced
#: cut-through"): a Fetch response this large is no longer gathered before its first byte goes out.
SPLICED_STREAM_FROM = 128 * 1024


def parse_optional_int(text: str | int | None) -> int | None:
    if text is None or (isinstance(text, str) and text.strip() in ("", "none")):
        return None
    return int(text)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: tuple[HostPort, ...]
    listen: HostPort = HostPort("127.0.0.1", 9092)
    advertised_host: str | None = None
    broker_port_base: int | None = None
    max_frame_size: int = 100 * 1024 * 1024
    max_upstream_frame_size: int = 1024 * 1024 * 1024
    max_in_flight: int = 64
    max_connection_bytes: int = 16 * 1024 * 1024
    stream_responses_from: int | None = None  # None: SPLICED_STREAM_FROM where splice applies, else off
    stream_requests_from: int | None = None  # the same for requests going upstream (Produce)
    heap_retain_bytes: int = 128 * 1024 * 1024
    malloc_arenas: int = 2
    gc_threshold: int = 10_000
    max_connections: int = 1000
    connect_timeout: float = 10.0
    shutdown_grace: float = 5.0
    log_level: str = "info"
    log_json: bool = False
    metrics_port: int | None = None
    metrics_host: str | None = None  # None: the listen host
    metrics_per_partition: bool = False
    # Share groups (KIP-932), served by the proxy itself.
    disable_share_groups: bool = False
    state_topic: str = "__share_proxy_state"
    state_topic_partitions: int = 12  # at most this many instances share work (scale-out)
    state_topic_replication_factor: int | None = None  # None: min(3, brokers)
    state_topic_min_insync_replicas: int | None = None  # None: min(2, replication factor)
    share_auto_offset_reset: str = "latest"
    share_record_lock_duration_ms: int = 30_000
    share_min_record_lock_duration_ms: int = 15_000
    share_delivery_count_limit: int = 5
    share_session_timeout_ms: int = 45_000
    share_min_session_timeout_ms: int = 45_000
    share_heartbeat_interval_ms: int = 5_000
    share_min_heartbeat_interval_ms: int = 5_000
    share_partition_max_record_locks: int = 2_000
    # Bounds on per-group configs (Kafka's group.share.min.* / group.share.max.*, KIP-1240).
    share_max_record_lock_duration_ms: int = 60_000
    share_max_session_timeout_ms: int = 60_000
    share_max_heartbeat_interval_ms: int = 15_000
    share_min_delivery_count_limit: int = 2
    share_max_delivery_count_limit: int = 10
    share_min_partition_max_record_locks: int = 100
    share_max_partition_max_record_locks: int = 4_000
    # IN_PROGRESS (draft KIP KAFKA-20458, docs/in-progress.md): defaults for every group, and bounds.
    share_in_progress_staleness_threshold_ms: int = 90_000
    share_in_progress_max_lock_extension_ms: int = 1_800_000
    share_in_progress_rebalance_grace_ms: int = 5_000
    share_min_in_progress_staleness_threshold_ms: int = 1_000
    share_max_in_progress_staleness_threshold_ms: int = 3_600_000
    share_min_in_progress_max_lock_extension_ms: int = 1_000
    share_max_in_progress_max_lock_extension_ms: int = 86_400_000
    share_min_in_progress_rebalance_grace_ms: int = 0
    share_max_in_progress_rebalance_grace_ms: int = 600_000
    max_share_sessions: int = 2_000
    max_share_session_partitions: int = 10_000
    max_share_session_partitions_total: int = 200_000
    share_metadata_refresh_ms: int = 10_000
    state_write_timeout_ms: int = 30_000
    state_linger_ms: int = 0
    state_writes_in_flight: int = 4
    state_producers: int = 4
    state_deltas: str = "on"  # on | off: cumulative ShareUpdates between snapshots (proxy/share/state_delta.py)
    state_fencing: str = "none"  # none | transactional: a transactional producer per state partition
    # Scale-out (issue 15, docs/scale-out.md): this instance's id and slot in the ownership group.
    instance_id: str | None = None
    instance_slot: int | None = None
    ownership_session_timeout_ms: int = 10_000
    share_config_refresh_ms: int = 2_000
    state_transactional_id_prefix: str = "ksp-state"
    state_snapshot_every: int = 100
    share_read_cache_bytes: int = 64 * 1024 * 1024
    share_upstream_connections: int = 32
    share_long_poll_connections: int = 8
    # The extension RPC DescribeShareGroupInFlight (draft KIP KAFKA-20458) is served under this key.
    describe_in_flight_api_key: int = 82
    # ... and MarkInProgress under this one (the draft's 81; docs/codec.md).
    mark_in_progress_api_key: int = 81
    # The share-group event log (docs/event-log.md).
    share_events_enable: bool = True
    share_events_topic: str = "__share_group_events"
    share_events_buffer_events: int = 100_000
    share_events_linger_ms: int = 100
    share_events_retention_ms: int = 604_800_000
    share_events_partitions: int = 1
    # KIP-1191 dead-letter queues (docs/dead-letters.md): Kafka's broker configs of the same names.
    errors_deadletterqueue_auto_create_topics_enable: bool = False
    errors_deadletterqueue_topic_name_prefix: str = "dlq."
    # Security (docs/security.md). Names follow librdkafka's properties, prefixed by side.
    # Client side: the proxy's listeners serve TLS when a certificate is configured.
    listener_ssl_certificate_location: str | None = None
    listener_ssl_key_location: str | None = None
    listener_ssl_key_password: Secret | None = None
    listener_ssl_ca_location: str | None = None
    listener_ssl_client_auth: str = "none"  # none | requested | required (mTLS)
    listener_ssl_min_version: str = "TLSv1.2"
    listener_ssl_cipher_suites: str | None = None  # OpenSSL cipher list; None: Python's secure defaults
    listener_ssl_handshake_timeout_ms: int = 10_000
    listener_ssl_reload_interval_ms: int = 10_000
    # Scale-out: CA other instances' listener certificates are verified against (peer calls).
    peer_ssl_ca_location: str | None = None
    # Upstream side: every connection to the brokers (clients' pass-through and the proxy's own).
    upstream_security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    upstream_ssl_ca_location: str | None = None  # None: the system's trusted CAs
    upstream_ssl_certificate_location: str | None = None
    upstream_ssl_key_location: str | None = None
    upstream_ssl_key_password: Secret | None = None
    upstream_ssl_endpoint_identification_algorithm: str = "https"  # https | none
    # The proxy's own service credentials (clients authenticate themselves, passed through).
    upstream_sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    upstream_sasl_username: str | None = None
    upstream_sasl_password: Secret | None = None
    # Share operations authorized by the cluster's own ACLs, asked on the client's own connection.
    share_authorization: str = "auto"  # auto | cluster | off
    share_authorization_cache_ms: int = 5_000

    @property
    def listener_tls(self) -> bool:
        """The listeners serve TLS (a certificate is configured)."""
        return self.listener_ssl_certificate_location is not None

    @property
    def effective_stream_responses_from(self) -> int:
        """Cut-through from this response size (0: off). By default on where the bytes can be
        spliced (plaintext listeners and upstream); over TLS the process must copy them, and
        streaming copied pieces measured mixed against gathering (docs/benchmarks.md)."""
        if self.stream_responses_from is not None:
            return self.stream_responses_from
        return 0 if self.listener_tls or self.upstream_tls else SPLICED_STREAM_FROM

    @property
    def effective_stream_requests_from(self) -> int:
        """Cut-through for client requests (large Produce) from this size (0: off). Requests are only
        ever spliced, never streamed as copies, so with TLS on either side it is off."""
        if self.listener_tls or self.upstream_tls:
            return 0
        return SPLICED_STREAM_FROM if self.stream_requests_from is None else self.stream_requests_from

    @property
    def upstream_tls(self) -> bool:
        return self.upstream_security_protocol in ("SSL", "SASL_SSL")

    @property
    def upstream_sasl(self) -> bool:
        return self.upstream_security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def effective_advertised_host(self) -> str:
        """The host clients are told to connect to."""
        if self.advertised_host:
            return self.advertised_host
        if self.listen.host in ("0.0.0.0", "::", ""):
            return socket.getfqdn()
        return self.listen.host

    @property
    def effective_broker_port_base(self) -> int | None:
        """Port of broker 0; None means "pick free ports" (only when listening on port 0)."""
        if self.broker_port_base is not None:
            return self.broker_port_base
        if self.listen.port == 0:
            return None
        return self.listen.port + 1


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    parse: Callable[[Any], Any]
    help: str
    metavar: str | None = None
    flag_is_switch: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("upstream", parse_host_ports, "bootstrap address(es) of the Kafka cluster, comma separated (required)", "HOST:PORT[,HOST:PORT]"),
    Option("listen", parse_host_port, "bootstrap listener address; port 0 picks a free port (default 127.0.0.1:9092)", "HOST:PORT"),
    Option("advertised_host", str, "host name clients are told to connect to (default: the listen host, or this machine's name when listening on all interfaces)", "HOST"),
    Option("broker_port_base", parse_optional_int, "broker N is served on port BASE+N (default: listen port + 1; free ports when listening on port 0)", "BASE"),
    Option("max_frame_size", int, "largest request frame accepted from a client, in bytes; larger closes the connection (default 104857600, as Kafka's socket.request.max.bytes)", "BYTES"),
    Option("max_upstream_frame_size", int, "largest response frame accepted from a broker, in bytes (default 1073741824)", "BYTES"),
    Option("max_in_flight", int, "requests a client may pipeline on one connection before the proxy stops reading it (default 64)", "N"),
    Option("max_connection_bytes", int, "bytes of requests and responses one client connection may hold before the proxy stops reading it (default 16777216); a single larger frame still passes, alone", "BYTES"),
    Option("stream_responses_from", parse_optional_int, "pass upstream responses of at least this many bytes to the client as they arrive (cut-through) when nothing earlier is still being written, socket to socket in the kernel (splice) where both sides are plaintext; 0 gathers every response whole first; default 131072 with plaintext listeners and upstream, 0 with TLS on either side (docs/proxy.md)", "BYTES"),
    Option("stream_requests_from", parse_optional_int, "pass client requests of at least this many bytes (large Produce) upstream as they arrive, socket to socket in the kernel (splice), once their header and topic names have been read; 0 gathers every request whole first; default 131072, off with TLS on either side (docs/proxy.md)", "BYTES"),
    Option("gc_threshold", int, "net allocations between collections of the youngest generation of Python's cyclic garbage collector; once start-up is done the objects alive then are frozen, so later collections do not walk them (measured: full collections of 25 ms or more each were the fragmented commit p99, 60-67 -> 16-20 ms). 0 leaves CPython's defaults, 700 and nothing frozen (default 10000; docs/proxy.md)", "N"),
    Option("heap_retain_bytes", int, "freed memory the C allocator (glibc) keeps for reuse instead of returning it to the OS, and large buffers (up to 32 MiB) served from its heap: a frame's buffer then reuses memory instead of faulting in fresh pages (measured: a 1 MB receive-and-build cycle 1.9-2.5 -> 0.12-0.16 ms, integration.bench.alloc_bench); resident memory stays near its recent peak. 0 leaves glibc's defaults (default 134217728; docs/proxy.md)", "BYTES"),
    Option("malloc_arenas", int, "malloc arenas glibc may make (threads beyond share them): each arena keeps its own freed memory, so the cap bounds what --heap-retain-bytes keeps over the process's threads (measured: resident memory over 20 scale-out moves flat where it climbed 36-50 MiB). 0 leaves glibc's default, 8 per core or the environment's MALLOC_ARENA_MAX (default 2; docs/proxy.md)", "N"),
    Option("max_connections", int, "client connections open at once, over all listeners; more are closed as soon as they are accepted (default 1000)", "N"),
    Option("connect_timeout", float, "seconds to wait for an upstream broker connection (default 10)", "SECONDS"),
    Option("shutdown_grace", float, "seconds open connections get to finish on SIGTERM/SIGINT (default 5)", "SECONDS"),
    Option("log_level", str, "log level: debug, info, warning, error (default info)", "LEVEL"),
    Option("log_json", parse_bool, "log JSON lines instead of human-readable console output", flag_is_switch=True),
    Option("metrics_port", parse_optional_int, "serve Prometheus metrics (/metrics) and health (/healthz, /readyz) on this port (default: off)", "PORT"),
    Option("metrics_host", parse_optional_str, "address the metrics port binds (default: the listen host); e.g. 0.0.0.0 for a sidecar whose Kafka listener is on 127.0.0.1 but whose probes and scrapes come from outside the pod", "HOST"),
    Option("metrics_per_partition", parse_bool, "export share-group series per share-partition (group, topic, partition labels) too, not only per group", flag_is_switch=True),
    Option("disable_share_groups", parse_bool, "do not serve share groups (pure pass-through proxy)", flag_is_switch=True),
    Option("state_topic", str, "compacted topic holding durable share state, created if missing (default __share_proxy_state; Kafka 4.x reserves __share_group_state for itself)", "TOPIC"),
    Option("state_topic_partitions", int, "partitions of a newly created state topic (default 12); with --instance-id, at most this many instances lead share-partitions", "N"),
    Option("state_topic_replication_factor", parse_optional_int, "replication factor of a newly created state topic (default min(3, brokers in the cluster))", "N"),
    Option("state_topic_min_insync_replicas", parse_optional_int, "min.insync.replicas of a newly created state topic (default min(2, its replication factor))", "N"),
    Option("share_auto_offset_reset", str, "where a new share group starts reading: latest, earliest or by_duration:<ISO-8601> (share.auto.offset.reset default, default latest)", "STRATEGY"),
    Option("share_record_lock_duration_ms", int, "acquisition lock duration (group.share.record.lock.duration.ms, default 30000)", "MS"),
    Option("share_min_record_lock_duration_ms", int, "lowest lock duration a group may set (group.share.min.record.lock.duration.ms, default 15000)", "MS"),
    Option("share_delivery_count_limit", int, "deliveries before a record is archived (group.share.delivery.count.limit, default 5, 2-10)", "N"),
    Option("share_session_timeout_ms", int, "member session timeout (group.share.session.timeout.ms, default 45000)", "MS"),
    Option("share_min_session_timeout_ms", int, "lowest session timeout a group may set (default 45000)", "MS"),
    Option("share_heartbeat_interval_ms", int, "member heartbeat interval (group.share.heartbeat.interval.ms, default 5000)", "MS"),
    Option("share_min_heartbeat_interval_ms", int, "lowest heartbeat interval a group may set (default 5000)", "MS"),
    Option("share_partition_max_record_locks", int, "in-flight records per share-partition (group.share.partition.max.record.locks, default 2000, 100-10000)", "N"),
    Option("share_max_record_lock_duration_ms", int, "highest share.record.lock.duration.ms a group may set (group.share.max.record.lock.duration.ms, default 60000)", "MS"),
    Option("share_max_session_timeout_ms", int, "highest share.session.timeout.ms a group may set (group.share.max.session.timeout.ms, default 60000)", "MS"),
    Option("share_max_heartbeat_interval_ms", int, "highest share.heartbeat.interval.ms a group may set (group.share.max.heartbeat.interval.ms, default 15000)", "MS"),
    Option("share_min_delivery_count_limit", int, "lowest share.delivery.count.limit a group may set (group.share.min.delivery.count.limit, default 2)", "N"),
    Option("share_max_delivery_count_limit", int, "highest share.delivery.count.limit a group may set (group.share.max.delivery.count.limit, default 10; at most 10)", "N"),
    Option("share_min_partition_max_record_locks", int, "lowest share.partition.max.record.locks a group may set (group.share.min.partition.max.record.locks, default 100)", "N"),
    Option("share_max_partition_max_record_locks", int, "highest share.partition.max.record.locks a group may set (group.share.max.partition.max.record.locks, default 4000; at most 10000)", "N"),
    Option("share_in_progress_staleness_threshold_ms", int, "an IN_PROGRESS record with no progress signal for this long is released (group.share.in.progress.staleness.threshold.ms, default 90000; docs/in-progress.md)", "MS"),
    Option("share_in_progress_max_lock_extension_ms", int, "longest a record may stay IN_PROGRESS, however often it is marked (group.share.in.progress.max.lock.extension.ms, default 1800000)", "MS"),
    Option("share_in_progress_rebalance_grace_ms", int, "how long fresh IN_PROGRESS records of a member that left stay its own before they are released (group.share.in.progress.rebalance.grace.ms, default 5000)", "MS"),
    Option("share_min_in_progress_staleness_threshold_ms", int, "lowest share.in.progress.staleness.threshold.ms a group may set (default 1000)", "MS"),
    Option("share_max_in_progress_staleness_threshold_ms", int, "highest share.in.progress.staleness.threshold.ms a group may set (default 3600000)", "MS"),
    Option("share_min_in_progress_max_lock_extension_ms", int, "lowest share.in.progress.max.lock.extension.ms a group may set (default 1000)", "MS"),
    Option("share_max_in_progress_max_lock_extension_ms", int, "highest share.in.progress.max.lock.extension.ms a group may set (default 86400000)", "MS"),
    Option("share_min_in_progress_rebalance_grace_ms", int, "lowest share.in.progress.rebalance.grace.ms a group may set (default 0)", "MS"),
    Option("share_max_in_progress_rebalance_grace_ms", int, "highest share.in.progress.rebalance.grace.ms a group may set (default 600000)", "MS"),
    Option("share_metadata_refresh_ms", int, "how often topic metadata is refreshed, so new topics and partitions reach share-group assignments (default 10000)", "MS"),
    Option("share_upstream_connections", int, "connections per upstream broker the share service uses for ListOffsets, ListGroups and record reads (default 32)", "N"),
    Option("share_long_poll_connections", int, "connections per upstream broker the share service may hold in long polls (Fetch waiting for new data), and the most long polls it runs per broker at once, apart from the ones above so that long polls never starve them (default 8)", "N"),
    Option("max_share_sessions", int, "share sessions the proxy keeps (group.share.max.share.sessions, default 2000)", "N"),
    Option("state_linger_ms", int, "how long the state producer waits to batch a state write with others before sending it (its linger.ms). Default 0: the commit pipeline already writes every share-partition changed meanwhile in one write, so waiting only delays the acknowledgements (measured against 1: ShareFetch 0.5-1.3 ms shorter, share streaming 1.00-1.24x, ahead in 8 of 8 pairs; docs/benchmarks.md)", "MS"),
    Option("state_write_timeout_ms", int, "how long one state-topic write may take before it fails; a failed acknowledgement is rolled back and answered with a retriable error (the state producer's delivery timeout, default 30000)", "MS"),
    Option("instance_id", parse_optional_str, "scale-out (issue 15, docs/scale-out.md): run as one of several proxy instances for one cluster; unique per instance (e.g. the StatefulSet pod name ksp-2). Instances form an ordinary consumer group over the state topic's partitions; each serves the share-partitions and groups homed on the partitions it owns, and Metadata / FindCoordinator route clients there (virtual node ids); a group's coordinator reaches the instances leading its share-partitions with Kafka's share-state RPCs (offsets describe/alter/delete, DeleteGroups) and leaders read group configs from it. Implies --state-fencing transactional; needs fixed broker ports (--broker-port-base or a fixed --listen port) and a state topic in layout 2 (a new one is marked; an older one is migrated by starting one instance without --instance-id once). Instances call each other's listeners as clients do: over TLS when they serve it (--peer-ssl-ca-location), with the service credentials under SASL (default: off, one instance serves everything)", "ID"),
    Option("instance_slot", parse_optional_int, "the instance's slot, a small unique integer (default: the trailing digits of --instance-id, e.g. ksp-2 -> 2)", "N"),
    Option("ownership_session_timeout_ms", int, "with --instance-id: how long an instance may go silent before its state partitions move to the others (the ownership group's session timeout, default 10000)", "MS"),
    Option("share_config_refresh_ms", int, "with --instance-id: how often an instance re-reads, from their coordinators, the configs and members of groups whose share-partitions it leads but another instance coordinates (an IncrementalAlterConfigs reaches those leaders within this, and a member fenced at the coordinator loses its records here; default 2000)", "MS"),
    Option("state_fencing", parse_choice("none", "transactional"), "transactional: write each state-topic partition through a transactional producer whose transactional.id (<prefix>.<state topic>.<partition>) is the same for every instance, and take it over before replay, so a second or paused proxy on the same state topic can never overwrite what this one wrote (its writes fail fenced); costs about 3 ms per write and needs transactions on the cluster (default none: one idempotent producer; docs/scale-out.md)", "none|transactional"),
    Option("state_transactional_id_prefix", str, "prefix of the state lanes' transactional ids with --state-fencing transactional; the proxy's principal needs WRITE and DESCRIBE on TransactionalId with this prefix (default ksp-state)", "PREFIX"),
    Option("state_writes_in_flight", int, "how many state writes may be on their way to the broker at once (default 4): an acknowledgement that arrives while a write is in flight is written at once instead of after it; outcomes are applied in order, and a failed write fails every write issued before its failure was known (docs/architecture.md, Durable state). With --state-fencing transactional: always 1", "N"),
    Option("state_producers", int, "idempotent producers (each its own broker connection and poller thread) the state writes are spread over by state partition: librdkafka sends one ProduceRequest per partition and a broker answers one connection's requests one at a time, so a write touching several state partitions waits for each in turn through one producer (default 4; docs/benchmarks.md, \"State writes spread over producers\"). With --state-fencing transactional: not used (a producer per state partition already)", "N"),
    Option("state_deltas", parse_choice("on", "off"), "on: write a share-partition's state changes as cumulative ShareUpdates (everything changed since its last durable snapshot) when clearly smaller than a snapshot, with a snapshot every --state-snapshot-every updates; off: a full ShareSnapshot per change (default on; docs/architecture.md, Durable state)", "on|off"),
    Option("state_snapshot_every", int, "with --state-deltas on: at most this many ShareUpdates per share-partition before a new snapshot; bounds replay before compaction (default 100)", "N"),
    Option("share_read_cache_bytes", int, "log bytes the share-partition read caches may hold in total: records read ahead or for the members queued behind one upstream read, and the windows of share-partitions that redeliver records; raise it while ksp_share_read_cache_evicted_bytes rises (default 67108864)", "BYTES"),
    Option("max_share_session_partitions", int, "share-partitions one share session may hold; a ShareFetch beyond it gets SHARE_SESSION_LIMIT_REACHED (default 10000; no Kafka counterpart)", "N"),
    Option("describe_in_flight_api_key", int, "API key the extension RPC DescribeShareGroupInFlight is served under (default 82, the draft KIP's; must be a Kafka API key flexible from v0 that the proxy does not serve otherwise)", "KEY"),
    Option("mark_in_progress_api_key", int, "API key the extension RPC MarkInProgress is served under (default 81, the draft KIP's; must be a Kafka API key flexible from v0 that the proxy does not serve otherwise, and differ from --describe-in-flight-api-key)", "KEY"),
    Option("errors_deadletterqueue_auto_create_topics_enable", parse_bool, "create a share group's missing dead-letter topic (with errors.deadletterqueue.group.enable=true) instead of archiving without a dead letter (Kafka's errors.deadletterqueue.auto.create.topics.enable, default off; docs/dead-letters.md)", flag_is_switch=True),
    Option("errors_deadletterqueue_topic_name_prefix", str, "dead-letter topic names must start with this; \"\" for no restriction (Kafka's errors.deadletterqueue.topic.name.prefix, default dlq.)", "PREFIX"),
    Option("max_share_session_partitions_total", int, "share-partitions all share sessions together may hold; beyond it SHARE_SESSION_LIMIT_REACHED (default 200000)", "N"),
    Option("share_events_enable", parse_bool, "publish the share-group event log (default true; --share-events-enable false turns it off; docs/event-log.md)", "BOOL"),
    Option("share_events_topic", str, "topic of the share-group event log, created if missing (default __share_group_events)", "TOPIC"),
    Option("share_events_buffer_events", int, "events the event log may hold (buffer and producer queue); beyond it new events are dropped and counted (default 100000)", "N"),
    Option("share_events_linger_ms", int, "how often the event log publishes what it buffered (default 100)", "MS"),
    Option("share_events_retention_ms", int, "retention.ms of the event topic when the proxy creates it (default 604800000, 7 days)", "MS"),
    Option("share_events_partitions", int, "partitions of the event topic when the proxy creates it (default 1)", "N"),
    # Security (docs/security.md).
    Option("listener_ssl_certificate_location", parse_optional_str, "PEM certificate (chain) the listeners serve; setting it makes every listener TLS (default: plaintext listeners)", "FILE"),
    Option("listener_ssl_key_location", parse_optional_str, "PEM private key of the listener certificate (default: in the certificate file)", "FILE"),
    Option("listener_ssl_key_password", Secret, "passphrase of an encrypted listener key (or --listener-ssl-key-password-file)", "PASSWORD"),
    Option("listener_ssl_ca_location", parse_optional_str, "PEM CA bundle client certificates are verified against (with --listener-ssl-client-auth)", "FILE"),
    Option("listener_ssl_client_auth", parse_choice("none", "requested", "required"), "client certificates: none, requested (verified when sent) or required (mTLS) (default none)", "MODE"),
    Option("listener_ssl_min_version", parse_choice("TLSv1.2", "TLSv1.3"), "lowest TLS version the listeners accept (default TLSv1.2)", "VERSION"),
    Option("listener_ssl_cipher_suites", parse_optional_str, "OpenSSL cipher list for TLS 1.2 on the listeners (default: Python's secure default list)", "CIPHERS"),
    Option("listener_ssl_handshake_timeout_ms", int, "a client's TLS handshake must finish within this, or its connection is closed (default 10000)", "MS"),
    Option("listener_ssl_reload_interval_ms", int, "how often the listener certificate, key and CA files are checked for changes; changed files serve new connections (default 10000; SIGHUP reloads at once)", "MS"),
    Option("peer_ssl_ca_location", parse_optional_str, "scale-out over TLS listeners: PEM CA bundle other instances' listener certificates are verified against (default: --listener-ssl-ca-location, else the system's trusted CAs)", "FILE"),
    Option("upstream_security_protocol", parse_choice("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), "how the proxy connects to the brokers: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (default PLAINTEXT); clients' SASL passes through on their own upstream connections", "PROTOCOL"),
    Option("upstream_ssl_ca_location", parse_optional_str, "PEM CA bundle the brokers' certificates are verified against (default: the system's trusted CAs)", "FILE"),
    Option("upstream_ssl_certificate_location", parse_optional_str, "PEM client certificate the proxy presents to the brokers (optional)", "FILE"),
    Option("upstream_ssl_key_location", parse_optional_str, "PEM private key of the upstream client certificate", "FILE"),
    Option("upstream_ssl_key_password", Secret, "passphrase of an encrypted upstream key (or --upstream-ssl-key-password-file)", "PASSWORD"),
    Option("upstream_ssl_endpoint_identification_algorithm", parse_choice("https", "none"), "https: verify broker host names against their certificates; none: do not (default https)", "ALGORITHM"),
    Option("upstream_sasl_mechanism", parse_sasl_mechanism, "SASL mechanism of the proxy's own connections: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (required with SASL_*)", "MECHANISM"),
    Option("upstream_sasl_username", parse_optional_str, "the proxy's own SASL user name (its service principal)", "USER"),
    Option("upstream_sasl_password", Secret, "the proxy's own SASL password (or --upstream-sasl-password-file); never logged", "PASSWORD"),
    Option("share_authorization", parse_choice("auto", "cluster", "off"), "authorize share operations by the cluster's ACLs, asked on the client's own connection: cluster (always), off (never), auto (when the cluster has an authorizer; default)", "MODE"),
    Option("share_authorization_cache_ms", int, "how long one connection's authorization answers are reused (default 5000)", "MS"),
)

#: Secrets that may also be read from a file: option name -> flag/env/TOML name of the file variant.
SECRET_FILES = {
    "listener_ssl_key_password": "listener_ssl_key_password_file",
    "upstream_ssl_key_password": "upstream_ssl_key_password_file",
    "upstream_sasl_password": "upstream_sasl_password_file",
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option; unset flags stay absent so env/file values can apply."""
    parser.add_argument(
        "--config",
        metavar="FILE[,FILE]",
        default=argparse.SUPPRESS,
        help=f"TOML file with any of the options below (keys as flag names); several, comma separated, "
             f"are read in order and later files override earlier ones; env {ENV_PREFIX}CONFIG",
    )
    for option in OPTIONS:
        help_text = f"{option.help}; env {option.env}"
        if option.flag_is_switch:
            parser.add_argument(option.flag, dest=option.name, action="store_true", default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(option.flag, dest=option.name, metavar=option.metavar, default=argparse.SUPPRESS, help=help_text)
    for secret, file_name in SECRET_FILES.items():
        parser.add_argument("--" + file_name.replace("_", "-"), dest=file_name, metavar="FILE", default=argparse.SUPPRESS,
                            help=f"read {secret.replace('_', '-')} from this file (trailing newline ignored); "
                                 f"env {ENV_PREFIX}{file_name.upper()}")


def load_config(
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProxyConfig:
    """Build the config from flags, then environment, then config file, then defaults."""
    given = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    environ = os.environ if environ is None else environ
    file_paths = given.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    # Later files override earlier ones key by key: the container image layers its defaults
    # (listen on all interfaces, the metrics port) under a mounted file this way (docs/deployment.md).
    file_values: dict[str, Any] = {}
    file_of: dict[str, str] = {}
    for file_path in parse_config_paths(file_paths or ""):
        for key, value in _read_config_file(file_path).items():
            file_values[key] = value
            file_of[key] = file_path

    values: dict[str, Any] = {}
    for option in OPTIONS:
        if option.name in given and given[option.name] is not None:
            raw_value, source = given[option.name], option.flag
        elif option.env in environ:
            raw_value, source = environ[option.env], option.env
        elif option.name in file_values:
            raw_value, source = file_values[option.name], file_of[option.name]
        else:
            continue
        try:
            values[option.name] = option.parse(raw_value)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid value for {option.name} from {source}: {raw_value!r}") from exc
    for secret, file_option in SECRET_FILES.items():
        path = given.get(file_option) or environ.get(ENV_PREFIX + file_option.upper()) or file_values.get(file_option)
        if not path:
            continue
        if secret in values:
            raise ConfigError(f"{secret} and {file_option} are both given; use one")
        values[secret] = Secret(_read_secret_file(str(path), file_option))
    if "upstream" not in values:
        raise ConfigError(f"--upstream (or {ENV_PREFIX}UPSTREAM) is required")
    config = ProxyConfig(**values)
    _validate(config)
    return config


def parse_config_paths(text: str) -> list[str]:
    """``--config``/``KSP_CONFIG``: one TOML file, or several separated by commas (later ones win)."""
    return [path.strip() for path in text.split(",") if path.strip()]


def _read_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    values = {key.replace("-", "_"): value for key, value in raw.items()}
    known = {option.name for option in OPTIONS} | set(SECRET_FILES.values())
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown keys in {path}: {', '.join(unknown)}")
    return values


def _read_secret_file(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().rstrip("\r\n")
    except OSError as exc:
        # The path may be shown; the content never is.
        raise ConfigError(f"cannot read {option} {path}: {exc.strerror or exc}") from None


def _validate(config: ProxyConfig) -> None:
    if config.max_frame_size <= 0 or config.max_upstream_frame_size <= 0:
        raise ConfigError("frame size limits must be positive")
    if config.max_in_flight <= 0:
        raise ConfigError("max_in_flight must be positive")
    if config.max_connection_bytes <= 0:
        raise ConfigError("max_connection_bytes must be positive")
    if config.max_connections <= 0:
        raise ConfigError("max_connections must be positive")
    if config.state_writes_in_flight < 1:
        raise ConfigError("state_writes_in_flight must be at least 1")
    if config.state_producers < 1:
        raise ConfigError("state_producers must be at least 1")
    if config.state_linger_ms < 0:
        raise ConfigError("state_linger_ms must be 0 or positive")
    if config.gc_threshold < 0:
        raise ConfigError("gc_threshold must be 0 (CPython's defaults) or positive")
    if config.heap_retain_bytes < 0:
        raise ConfigError("heap_retain_bytes must be 0 (glibc's defaults) or positive")
    if config.malloc_arenas < 0:
        raise ConfigError("malloc_arenas must be 0 (glibc's default) or positive")
    if config.stream_responses_from is not None and config.stream_responses_from < 0:
        raise ConfigError("stream_responses_from must be 0 (off) or positive")
    if config.stream_requests_from is not None and config.stream_requests_from < 0:
        raise ConfigError("stream_requests_from must be 0 (off) or positive")
    if config.share_upstream_connections <= 0 or config.share_long_poll_connections <= 0:
        raise ConfigError("share connection pools need at least one connection per broker")
    if config.max_share_session_partitions <= 0 or config.max_share_session_partitions_total <= 0:
        raise ConfigError("share session partition limits must be positive")
    if config.state_snapshot_every < 1:
        raise ConfigError("state_snapshot_every must be at least 1")
    if config.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError(f"unknown log level {config.log_level!r}")
    for name in ("state_topic_replication_factor", "state_topic_min_insync_replicas"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1")
    _validate_share_bounds(config)
    if config.share_in_progress_max_lock_extension_ms < config.share_in_progress_staleness_threshold_ms:
        raise ConfigError("share_in_progress_max_lock_extension_ms "
                          f"({config.share_in_progress_max_lock_extension_ms}) must be at least "
                          f"share_in_progress_staleness_threshold_ms ({config.share_in_progress_staleness_threshold_ms})")
    for name in ("share_in_progress_staleness_threshold_ms", "share_in_progress_max_lock_extension_ms"):
        if getattr(config, name) < 100:
            raise ConfigError(f"{name} must be at least 100")
    if config.share_in_progress_rebalance_grace_ms < 0:
        raise ConfigError("share_in_progress_rebalance_grace_ms must not be negative")
    if config.state_topic_partitions < 1:
        raise ConfigError("state_topic_partitions must be at least 1")
    if config.instance_id is not None:
        from proxy.share.ownership import slot_of_instance

        if config.disable_share_groups:
            raise ConfigError("instance_id (scale-out) needs share groups; remove disable_share_groups")
        try:
            slot_of_instance(config.instance_id, config.instance_slot)
        except ValueError as exc:
            raise ConfigError(f"instance_id: {exc}") from None
        if config.ownership_session_timeout_ms < 1000:
            raise ConfigError("ownership_session_timeout_ms must be at least 1000")
        if config.share_config_refresh_ms < 100:
            raise ConfigError("share_config_refresh_ms must be at least 100")
        if config.effective_broker_port_base is None:
            raise ConfigError("instance_id (scale-out) needs fixed broker ports, which the other instances compute: "
                              "listen on a fixed port or give broker_port_base")
    _validate_share_events(config)
    _validate_security(config)
    _validate_extension_keys(config.mark_in_progress_api_key, config.describe_in_flight_api_key)
    base = config.effective_broker_port_base
    if base is not None and not 0 < base <= 65535:
        raise ConfigError(f"broker port base {base} out of range")


SERVICE_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _validate_security(config: ProxyConfig) -> None:
    """Combinations that cannot work are refused here; whether the files exist and parse is
    checked when the TLS contexts are built at start-up (proxy/security.py)."""
    if config.listener_ssl_key_location and not config.listener_tls:
        raise ConfigError("listener_ssl_key_location needs listener_ssl_certificate_location")
    if config.listener_ssl_client_auth != "none":
        if not config.listener_tls:
            raise ConfigError(f"listener_ssl_client_auth {config.listener_ssl_client_auth} needs TLS listeners "
                              "(listener_ssl_certificate_location)")
        if not config.listener_ssl_ca_location:
            raise ConfigError(f"listener_ssl_client_auth {config.listener_ssl_client_auth} needs listener_ssl_ca_location "
                              "(the CA client certificates are verified against)")
    if config.peer_ssl_ca_location and not config.listener_tls:
        raise ConfigError("peer_ssl_ca_location needs TLS listeners (listener_ssl_certificate_location): "
                          "instances call each other on their listeners")
    if config.listener_ssl_handshake_timeout_ms < 1:
        raise ConfigError("listener_ssl_handshake_timeout_ms must be at least 1")
    if config.listener_ssl_reload_interval_ms < 0:
        raise ConfigError("listener_ssl_reload_interval_ms must not be negative (0: reload on SIGHUP only)")
    if config.upstream_ssl_key_location and not config.upstream_ssl_certificate_location:
        raise ConfigError("upstream_ssl_key_location needs upstream_ssl_certificate_location")
    if not config.upstream_tls:
        for name in ("upstream_ssl_ca_location", "upstream_ssl_certificate_location"):
            if getattr(config, name):
                raise ConfigError(f"{name} is set but upstream_security_protocol is {config.upstream_security_protocol} "
                                  "(use SSL or SASL_SSL)")
    if config.upstream_sasl:
        missing = [name for name in ("upstream_sasl_mechanism", "upstream_sasl_username", "upstream_sasl_password")
                   if getattr(config, name) is None]
        if missing:
            raise ConfigError(f"upstream_security_protocol {config.upstream_security_protocol} needs the proxy's own "
                              f"credentials: {', '.join(missing)}")
        if config.upstream_sasl_mechanism not in SERVICE_SASL_MECHANISMS:
            raise ConfigError(f"upstream_sasl_mechanism {config.upstream_sasl_mechanism!r}: the proxy's own connections "
                              f"support {', '.join(SERVICE_SASL_MECHANISMS)} (clients' own SASL, OAUTHBEARER included, "
                              "passes through whatever the mechanism)")
    elif config.upstream_sasl_mechanism or config.upstream_sasl_username or config.upstream_sasl_password:
        raise ConfigError(f"upstream SASL credentials are set but upstream_security_protocol is "
                          f"{config.upstream_security_protocol} (use SASL_PLAINTEXT or SASL_SSL)")
    if config.share_authorization_cache_ms < 0:
        raise ConfigError("share_authorization_cache_ms must not be negative")


def _validate_share_events(config: ProxyConfig) -> None:
    if not config.share_events_topic:
        raise ConfigError("share_events_topic must not be empty")
    for name in ("share_events_buffer_events", "share_events_linger_ms", "share_events_partitions"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be at least 1")
    if config.share_events_retention_ms < 1 and config.share_events_retention_ms != -1:
        raise ConfigError("share_events_retention_ms must be positive, or -1 (no time limit)")


def _validate_extension_keys(mark_key: int, describe_key: int) -> None:
    """The connection loop reads request headers by Kafka's table, so an extension key must be one
    Kafka defines as flexible from v0 (e.g. 80-82, the Raft voter APIs brokers do not serve to
    clients), not one the proxy already serves, and the two extension keys must differ."""
    from codec.errors import HeaderError
    from codec.headers import is_flexible
    from codec.registry import STANDARD_APIS

    served = {api.api_key: api.name for api in STANDARD_APIS}
    for name, api_key in (("mark_in_progress_api_key", mark_key), ("describe_in_flight_api_key", describe_key)):
        try:
            flexible = is_flexible(api_key, 0)
        except HeaderError:
            flexible = False
        if not flexible:
            raise ConfigError(f"{name} {api_key} is not a Kafka API key flexible from version 0")
        if api_key in served:
            raise ConfigError(f"{name} {api_key}: the proxy already serves {served[api_key]} under it")
    if mark_key == describe_key:
        raise ConfigError(f"mark_in_progress_api_key and describe_in_flight_api_key are both {mark_key}; "
                          "each extension RPC needs its own key")


# Per-group config bounds: (min option, max option, lowest allowed, highest allowed) -- Kafka's
# ranges for its group.share.* broker configs, capped where the proxy's engine is narrower.
_SHARE_BOUNDS = (
    ("share_min_record_lock_duration_ms", "share_max_record_lock_duration_ms", 1_000, 3_600_000),
    ("share_min_session_timeout_ms", "share_max_session_timeout_ms", 1, 2**31 - 1),
    ("share_min_heartbeat_interval_ms", "share_max_heartbeat_interval_ms", 1, 2**31 - 1),
    ("share_min_delivery_count_limit", "share_max_delivery_count_limit", 2, 10),
    ("share_min_partition_max_record_locks", "share_max_partition_max_record_locks", 100, 10_000),
    # IN_PROGRESS (no Kafka counterpart yet): the sweeper runs every threshold/4, so not below 100 ms.
    ("share_min_in_progress_staleness_threshold_ms", "share_max_in_progress_staleness_threshold_ms", 100, 86_400_000),
    ("share_min_in_progress_max_lock_extension_ms", "share_max_in_progress_max_lock_extension_ms", 100, 604_800_000),
    ("share_min_in_progress_rebalance_grace_ms", "share_max_in_progress_rebalance_grace_ms", 0, 3_600_000),
)


def _validate_share_bounds(config: ProxyConfig) -> None:
    for low_name, high_name, lowest, highest in _SHARE_BOUNDS:
        low, high = getattr(config, low_name), getattr(config, high_name)
        if not lowest <= low <= high <= highest:
            raise ConfigError(f"{low_name} ({low}) and {high_name} ({high}) must satisfy "
                              f"{lowest} <= min <= max <= {highest}")
