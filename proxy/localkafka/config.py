"""server.properties and storage-format arguments for a local KRaft node (pure): a combined
broker+controller, or a broker-only node joining another node's controller."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path

from proxy.localkafka.jars import major_version

HOST = "127.0.0.1"
NODE_ID = 1

# Kafka 4.x feature that switches KIP-932 share groups on (1) or off (0).
SHARE_FEATURE = "share.version"


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Everything that decides how the broker is configured and formatted."""

    version: str
    port: int
    controller_port: int
    log_dir: Path
    share_groups: bool = False
    auto_create_topics: bool = True
    node_id: int = NODE_ID
    # "id@host:port" of the controller a broker-only node joins; None: this node is its own controller.
    controller_voter: str | None = None


def supports_share_groups(version: str) -> bool:
    """KIP-932 share groups exist (behind the share.version feature) from Kafka 4.x."""
    return major_version(version) >= 4


def broker_properties(settings: BrokerSettings) -> dict[str, str]:
    """The broker's server.properties as an ordered mapping."""
    node = settings.node_id
    broker_only = settings.controller_voter is not None
    props = {
        "node.id": str(node),
        "process.roles": "broker" if broker_only else "broker,controller",
        "listeners": f"PLAINTEXT://{HOST}:{settings.port}" if broker_only
        else f"PLAINTEXT://{HOST}:{settings.port},CONTROLLER://{HOST}:{settings.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{settings.port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        # A static voter set instead of a formatted dynamic quorum: the voter endpoint then lives
        # only in this file, so a kept --data-dir restarts fine on different (free) ports.
        "controller.quorum.voters": settings.controller_voter or f"{node}@{HOST}:{settings.controller_port}",
        "log.dirs": str(settings.log_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Kafka's default; tests still create their topics explicitly.
        "auto.create.topics.enable": "true" if settings.auto_create_topics else "false",
        # Internal topics on a single node: one replica, and few partitions so the first
        # consumer group or transaction does not wait for 50 partitions to be created.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.check.interval.ms": "300000",
        "controlled.shutdown.enable": "true",
    }
    if supports_share_groups(settings.version):
        # Only read by the native share coordinator (share groups enabled); harmless otherwise.
        props |= {
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
        }
    return props


def render_properties(props: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in props.items())


def format_features(settings: BrokerSettings) -> list[str]:
    """`--feature` arguments for `kafka.tools.StorageTool format`.

    Kafka 4.2+ turns share groups on for freshly formatted clusters, so the feature is set
    explicitly either way; Kafka 3.x knows neither the feature nor share groups.
    """
    if not supports_share_groups(settings.version):
        return []
    level = 1 if settings.share_groups else 0
    return ["--feature", f"{SHARE_FEATURE}={level}"]


def format_command(java: str, classpath: str, settings: BrokerSettings, cluster_id: str, config: Path) -> list[str]:
    return [
        java,
        # A short-lived tool: skip the optimising JIT, it only costs start-up time.
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
        "-Xmx256m",
        "-cp",
        classpath,
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(config),
        "--ignore-formatted",
        *format_features(settings),
    ]


def random_cluster_id(random_bytes: bytes | None = None) -> str:
    """A Kafka Uuid in its base64url form, as `kafka-storage random-uuid` prints it."""
    while True:
        raw = random_bytes if random_bytes is not None else os.urandom(16)
        random_bytes = None
        text = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        # Kafka avoids ids that start with "-" (they look like command-line flags) and the
        # reserved all-zero / one ids.
        if not text.startswith("-") and raw not in (bytes(16), bytes(15) + b"\x01"):
            return text
