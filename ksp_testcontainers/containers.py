"""Containers for integration tests: Apache Kafka (KRaft, one node) and the share proxy in front of it.

testcontainers' own ``KafkaContainer`` drives Confluent images only; :class:`ApacheKafkaContainer`
runs the ``apache/kafka`` image, configured entirely by environment (the image turns every
``KAFKA_X_Y`` variable into the broker property ``x.y``).

The port problem and its fix. A Kafka client asks the bootstrap address for metadata and then
connects to the addresses that metadata names. The proxy names *itself*: ``advertised-host`` with
its bootstrap port, and broker N at ``broker-port-base + N``. Docker, by default, publishes a
container port on a random host port the proxy cannot know, so the addresses it hands out would be
wrong on the host. :class:`ShareProxyContainer` therefore picks ports that are free on this
machine and publishes each one on the *same* number: the proxy listens on ``0.0.0.0:P``, serves
broker N on ``B + N``, advertises the Docker host's address, and Docker binds host ``P`` to
container ``P`` and host ``B + N`` to container ``B + N``. What the proxy advertises is then what
the host can reach. The cost: the ports are only known to be free when picked (another process
could take one before Docker binds it; start again), and they are checked on this machine, so
with a remote Docker engine (``DOCKER_HOST=tcp://...``) pass ``listen_port`` yourself. The metrics
port needs no such care and is published on a random host port.
"""

from __future__ import annotations

import base64
import re
import socket
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network
from testcontainers.core.wait_strategies import HttpWaitStrategy, LogMessageWaitStrategy

# Pinned tags. The proxy's image as docs/deployment.md builds it (no registry publishes it yet:
# build it first, or pass `image=`); Kafka at the newest version the project tests against.
PROXY_IMAGE = "ghcr.io/kafka-share-proxy/kafka-share-proxy:0.1.0"
KAFKA_IMAGE = "apache/kafka:4.4.0"

# `share-proxy serve`'s metrics and health port in the image (docker/defaults.toml).
PROXY_METRICS_PORT = 9404
DEFAULT_STARTUP_TIMEOUT_S = 120.0


def _kafka_major_version(image: str) -> int | None:
    """4 for "apache/kafka:4.4.0"; None when the tag does not say (e.g. "latest")."""
    name = image.rsplit("/", 1)[-1]
    _, _, tag = name.partition(":")
    match = re.match(r"(\d+)\.", tag)
    return int(match.group(1)) if match else None


def _random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as kafka-storage random-uuid)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port_layout(broker_ids: Iterable[int], attempts: int = 200) -> tuple[int, int]:
    """(listen port P, broker port base P + 1) with P and P + 1 + every broker id free on this machine."""
    ids = sorted(set(broker_ids))
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("0.0.0.0", 0))
            listen = sock.getsockname()[1]
        base = listen + 1
        if base + (ids[-1] if ids else 0) <= 65535 and all(_port_is_free(base + i) for i in ids) \
                and _port_is_free(listen):
            return listen, base
    raise RuntimeError(f"no free ports for a bootstrap listener and brokers {ids} after {attempts} attempts")


class ApacheKafkaContainer(DockerContainer):
    """One KRaft node (broker and controller) from the ``apache/kafka`` image, on a Docker network.

    Listeners: ``PLAINTEXT`` on 9092, advertised as ``<alias>:9092`` so that containers on the
    same network (the proxy) reach it; ``CONTROLLER`` on 9093. Replication factors 1. The broker
    is not published to the host: host clients reach it through the proxy, which forwards every
    non-share request (admin, produce, fetch). Kafka 4.x's native share groups are switched off
    after start (``share.version=0``, as the proxy's own test broker has them), so the share
    groups clients see are the proxy's; pass ``share_groups=True`` to leave them on.
    """

    LISTENER_PORT = 9092
    CONTROLLER_PORT = 9093

    def __init__(
        self,
        image: str = KAFKA_IMAGE,
        *,
        network: Network,
        alias: str = "kafka",
        node_id: int = 1,
        share_groups: bool = False,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(image, network=network, network_aliases=[alias], **kwargs)
        self.network = network
        self.alias = alias
        self.node_id = node_id
        self.share_groups = share_groups
        self.with_envs(
            CLUSTER_ID=_random_cluster_id(),
            KAFKA_NODE_ID=str(node_id),
            KAFKA_PROCESS_ROLES="broker,controller",
            KAFKA_LISTENERS=f"PLAINTEXT://0.0.0.0:{self.LISTENER_PORT},CONTROLLER://0.0.0.0:{self.CONTROLLER_PORT}",
            KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://{alias}:{self.LISTENER_PORT}",
            KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            KAFKA_INTER_BROKER_LISTENER_NAME="PLAINTEXT",
            KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
            KAFKA_CONTROLLER_QUORUM_VOTERS=f"{node_id}@localhost:{self.CONTROLLER_PORT}",
            KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
            KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
            KAFKA_LOG_DIRS="/tmp/kraft-combined-logs",
        )
        # Nothing published: on the host the advertised `<alias>:9092` would not resolve anyway.
        self.waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(startup_timeout))

    @property
    def internal_bootstrap(self) -> str:
        """The address containers on the same network use: ``<alias>:9092``."""
        return f"{self.alias}:{self.LISTENER_PORT}"

    def share_groups_off_command(self) -> list[str] | None:
        """The command run in the container after start to switch native share groups off; None
        when there is nothing to do (asked to keep them, or a 3.x image, which has none)."""
        major = _kafka_major_version(self.image)
        if self.share_groups or (major is not None and major < 4):
            return None
        return ["/opt/kafka/bin/kafka-features.sh", "--bootstrap-server", f"localhost:{self.LISTENER_PORT}",
                "downgrade", "--feature", "share.version=0"]

    def start(self) -> ApacheKafkaContainer:
        super().start()
        command = self.share_groups_off_command()
        if command is not None:
            result = self.exec(command)
            if result.exit_code != 0:
                raise RuntimeError(
                    f"could not switch Kafka's native share groups off ({' '.join(command)}, exit {result.exit_code}): "
                    f"{result.output.decode(errors='replace')}; pass share_groups=True to skip this step"
                )
        return self


class ShareProxyContainer(DockerContainer):
    """The kafka-share-proxy image in front of a Kafka cluster; :meth:`get_bootstrap_server` is
    the address share consumers on the host use.

    ``ShareProxyContainer(kafka)`` joins ``kafka``'s network and points ``KSP_UPSTREAM`` at its
    alias. ``ShareProxyContainer(upstream="broker-1:9092,...", broker_ids=[1, 2, 3])`` fronts a
    cluster of your own (reachable from the container; give ``network=`` if it is on a Docker
    network): the proxy serves broker N on its own port, so it must know which node ids to
    publish. ``env`` adds ``KSP_*`` settings (e.g. ``{"KSP_SHARE_AUTO_OFFSET_RESET": "earliest"}``);
    the module docstring explains the ports. Started, it waits until ``/readyz`` answers 200: the
    share state is replayed and the upstream reachable.
    """

    def __init__(
        self,
        kafka: ApacheKafkaContainer | None = None,
        *,
        upstream: str | None = None,
        broker_ids: Iterable[int] | None = None,
        network: Network | None = None,
        image: str = PROXY_IMAGE,
        env: Mapping[str, str] | None = None,
        advertised_host: str | None = None,
        listen_port: int | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        if kafka is not None and upstream is None:
            upstream = kafka.internal_bootstrap
            network = network or kafka.network
            broker_ids = [kafka.node_id] if broker_ids is None else broker_ids
        elif kafka is not None or upstream is None:
            raise ValueError("give either a Kafka container or an upstream address, not both or neither")
        if broker_ids is None:
            raise ValueError(
                "broker_ids is required with an external upstream: the proxy serves broker N on port base + N, "
                "and each of those ports must be published"
            )
        self.broker_ids = sorted(set(broker_ids))
        if listen_port is None:
            self.listen_port, self.broker_port_base = free_port_layout(self.broker_ids)
        else:
            self.listen_port, self.broker_port_base = listen_port, listen_port + 1
        managed = {"KSP_UPSTREAM", "KSP_LISTEN", "KSP_BROKER_PORT_BASE", "KSP_ADVERTISED_HOST"} & set(env or {})
        if managed:
            raise ValueError(f"{sorted(managed)}: set by the container (use upstream=, listen_port=, advertised_host=)")
        super().__init__(image, network=network, **kwargs)
        self.upstream = upstream
        self.with_envs(
            KSP_UPSTREAM=self.upstream,
            KSP_LISTEN=f"0.0.0.0:{self.listen_port}",
            KSP_BROKER_PORT_BASE=str(self.broker_port_base),
            KSP_METRICS_PORT=str(PROXY_METRICS_PORT),
        )
        if advertised_host is not None:
            self.with_env("KSP_ADVERTISED_HOST", advertised_host)
        for key, value in (env or {}).items():
            self.with_env(key, value)
        for port in self.client_ports():
            self.with_bind_ports(port, port)
        self.with_exposed_ports(PROXY_METRICS_PORT)
        self.waiting_for(HttpWaitStrategy(PROXY_METRICS_PORT, "/readyz").with_startup_timeout(startup_timeout))

    def client_ports(self) -> list[int]:
        """Container ports published on the same host port: the bootstrap and one per broker."""
        return [self.listen_port, *(self.broker_port_base + node_id for node_id in self.broker_ids)]

    def _configure(self) -> None:
        # Called by start() before the container is created: the host the test process reaches
        # published ports on (localhost for a local engine), unless given.
        if "KSP_ADVERTISED_HOST" not in self.env:
            self.with_env("KSP_ADVERTISED_HOST", self.get_docker_client().host())

    def get_bootstrap_server(self) -> str:
        """``host:port`` for Kafka clients on the host (share consumers, producers, admin)."""
        return f"{self.env['KSP_ADVERTISED_HOST']}:{self.listen_port}"

    def get_metrics_url(self) -> str:
        """Base URL of ``/metrics``, ``/healthz`` and ``/readyz``."""
        return f"http://{self.get_container_host_ip()}:{self.get_exposed_port(PROXY_METRICS_PORT)}"
