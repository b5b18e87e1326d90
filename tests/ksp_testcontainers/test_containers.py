"""What ksp_testcontainers would ask Docker for, read from the container objects before start.

No Docker engine is needed: the objects are built with the Docker API version pinned, so
docker-py does not ask a daemon for it, and nothing is started.
"""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path

import pytest
from testcontainers.core.network import Network
from testcontainers.core.wait_strategies import HttpWaitStrategy, LogMessageWaitStrategy

from integration.kafka_fixtures import DEFAULT_KAFKA_VERSION
from ksp_testcontainers import KAFKA_IMAGE, PROXY_IMAGE, ApacheKafkaContainer, ShareProxyContainer, free_port_layout

ROOT = Path(__file__).resolve().parents[2]
NO_DAEMON = {"version": "1.44"}  # an explicit API version: docker-py then never calls the engine


@pytest.fixture
def network() -> Network:
    return Network(docker_client_kw=NO_DAEMON)


@pytest.fixture
def kafka(network: Network) -> ApacheKafkaContainer:
    return ApacheKafkaContainer(network=network, docker_client_kw=NO_DAEMON)


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_images_are_pinned_to_the_project_and_the_tested_kafka() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert PROXY_IMAGE == f"ghcr.io/kafka-share-proxy/kafka-share-proxy:{version}"
    assert KAFKA_IMAGE == f"apache/kafka:{DEFAULT_KAFKA_VERSION}"


def test_kafka_is_one_kraft_node_advertised_by_its_network_alias(kafka: ApacheKafkaContainer, network: Network) -> None:
    assert kafka.image == KAFKA_IMAGE
    assert kafka._network is network and kafka._network_aliases == ["kafka"]
    env = kafka.env
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_LISTENERS"] == "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@localhost:9093"
    assert env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "PLAINTEXT"
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):
        assert env[key] == "1", key
    # A KRaft cluster id: 16 bytes in URL-safe base64 without padding, new for every container.
    assert len(env["CLUSTER_ID"]) == 22 and "=" not in env["CLUSTER_ID"]
    assert env["CLUSTER_ID"] != ApacheKafkaContainer(network=network, docker_client_kw=NO_DAEMON).env["CLUSTER_ID"]
    assert kafka.internal_bootstrap == "kafka:9092"
    assert kafka.ports == {}  # not published: host clients go through the proxy
    assert isinstance(kafka._wait_strategy, LogMessageWaitStrategy)
    assert kafka._wait_strategy._message.pattern == "Kafka Server started"


def test_kafka_alias_and_node_id_follow_the_arguments(network: Network) -> None:
    kafka = ApacheKafkaContainer(network=network, alias="broker", node_id=3, docker_client_kw=NO_DAEMON)
    assert kafka._network_aliases == ["broker"]
    assert kafka.env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://broker:9092"
    assert kafka.env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "3@localhost:9093"
    assert kafka.internal_bootstrap == "broker:9092"


def test_native_share_groups_are_switched_off_on_4x_only(network: Network) -> None:
    on_4 = ApacheKafkaContainer(network=network, docker_client_kw=NO_DAEMON)
    assert on_4.share_groups_off_command() == [
        "/opt/kafka/bin/kafka-features.sh", "--bootstrap-server", "localhost:9092",
        "downgrade", "--feature", "share.version=0"]
    assert ApacheKafkaContainer("apache/kafka:3.9.2", network=network, docker_client_kw=NO_DAEMON) \
        .share_groups_off_command() is None
    assert ApacheKafkaContainer(network=network, share_groups=True, docker_client_kw=NO_DAEMON) \
        .share_groups_off_command() is None
    # An unversioned tag may be 4.x: switched off (a failure says how to skip it).
    assert ApacheKafkaContainer("apache/kafka:latest", network=network, docker_client_kw=NO_DAEMON) \
        .share_groups_off_command() is not None


def test_proxy_in_front_of_the_kafka_container(kafka: ApacheKafkaContainer, network: Network) -> None:
    proxy = ShareProxyContainer(kafka, env={"KSP_SHARE_AUTO_OFFSET_RESET": "earliest"}, docker_client_kw=NO_DAEMON)
    assert proxy.image == PROXY_IMAGE
    assert proxy._network is network  # kafka's network, so the alias resolves
    listen, base = proxy.listen_port, proxy.broker_port_base
    assert base == listen + 1
    assert proxy.env == {
        "KSP_UPSTREAM": "kafka:9092",
        "KSP_LISTEN": f"0.0.0.0:{listen}",
        "KSP_BROKER_PORT_BASE": str(base),
        "KSP_METRICS_PORT": "9404",
        "KSP_SHARE_AUTO_OFFSET_RESET": "earliest",
    }
    # Bootstrap and broker 1 on the same host port as in the container; metrics on any host port.
    assert proxy.ports == {str(listen): listen, str(base + 1): base + 1, "9404": None}
    assert all(bindable(port) for port in (listen, base + 1))
    assert proxy._command is None  # the image's CMD: KSP_* variables configure it
    assert isinstance(proxy._wait_strategy, HttpWaitStrategy)
    assert (proxy._wait_strategy._port, proxy._wait_strategy._path, proxy._wait_strategy._status_codes) == \
        (9404, "/readyz", {200})


def test_advertised_host_defaults_to_the_docker_host(kafka: ApacheKafkaContainer) -> None:
    proxy = ShareProxyContainer(kafka, docker_client_kw=NO_DAEMON)
    assert "KSP_ADVERTISED_HOST" not in proxy.env
    proxy._configure()  # what start() calls before creating the container
    assert proxy.env["KSP_ADVERTISED_HOST"] == proxy.get_docker_client().host()
    assert proxy.get_bootstrap_server() == f"{proxy.get_docker_client().host()}:{proxy.listen_port}"

    given = ShareProxyContainer(kafka, advertised_host="10.1.2.3", listen_port=30000, docker_client_kw=NO_DAEMON)
    given._configure()
    assert given.env["KSP_ADVERTISED_HOST"] == "10.1.2.3"
    assert given.get_bootstrap_server() == "10.1.2.3:30000"
    assert given.ports == {"30000": 30000, "30002": 30002, "9404": None}


def test_proxy_in_front_of_an_external_cluster(network: Network) -> None:
    proxy = ShareProxyContainer(upstream="b-0.example:9092,b-1.example:9092", broker_ids=[2, 0, 1],
                                network=network, image="kafka-share-proxy:dev", docker_client_kw=NO_DAEMON)
    assert proxy.image == "kafka-share-proxy:dev"
    assert proxy.env["KSP_UPSTREAM"] == "b-0.example:9092,b-1.example:9092"
    base = proxy.broker_port_base
    assert proxy.client_ports() == [proxy.listen_port, base, base + 1, base + 2]
    assert proxy.ports == {**{str(p): p for p in proxy.client_ports()}, "9404": None}


def test_proxy_arguments_that_cannot_work_are_refused(kafka: ApacheKafkaContainer) -> None:
    with pytest.raises(ValueError, match="broker_ids is required"):
        ShareProxyContainer(upstream="b-0.example:9092", docker_client_kw=NO_DAEMON)
    with pytest.raises(ValueError, match="either a Kafka container or an upstream"):
        ShareProxyContainer(docker_client_kw=NO_DAEMON)
    with pytest.raises(ValueError, match="either a Kafka container or an upstream"):
        ShareProxyContainer(kafka, upstream="b-0.example:9092", docker_client_kw=NO_DAEMON)
    with pytest.raises(ValueError, match="KSP_LISTEN"):
        ShareProxyContainer(kafka, env={"KSP_LISTEN": "0.0.0.0:9092"}, docker_client_kw=NO_DAEMON)


def test_free_port_layout_finds_a_bootstrap_and_broker_ports() -> None:
    listen, base = free_port_layout([0, 2])
    assert base == listen + 1
    assert all(bindable(port) for port in (listen, base, base + 2))
