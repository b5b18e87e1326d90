"""The testcontainers example: an apache/kafka container, the proxy image in front of it on one
Docker network, and a confluent_kafka.ShareConsumer on the host reading records produced through
the proxy.

Needs a Docker engine; skipped with the reason when none answers (as on the development machines
of this project, which have the docker client but no daemon). The proxy image is the one named by
KSP_TEST_IMAGE if set, else ksp_testcontainers.PROXY_IMAGE built from this checkout's Dockerfile
(Docker's layer cache makes later runs quick). Its Kafka is its own container, not the session
broker: that is what the example shows.
"""

from __future__ import annotations

import gc
import json
import os
import time
import urllib.request
import warnings
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from integration.deploy.dockerfile import ROOT
from integration.kafka_fixtures import unique_name

pytestmark = pytest.mark.integration

RECORDS = 10


@pytest.fixture(scope="module")
def docker_client() -> Iterator[object]:
    import docker

    # docker-py leaves the socket of a failed attempt for the garbage collector; collect it here,
    # where its ResourceWarning is expected, not in some later test (warnings are errors).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env()
            client.ping()
            problem = None
        except Exception as error:  # any failure to reach an engine: DockerException, connection errors
            problem = f"{type(error).__name__}: {error}"
        finally:
            gc.collect()
    if problem is not None:
        pytest.skip(f"no Docker engine answers (docker.from_env().ping(): {problem}); "
                    "the testcontainers example needs one")
    yield client
    client.close()


@pytest.fixture(scope="module")
def proxy_image(docker_client) -> str:
    from ksp_testcontainers import PROXY_IMAGE

    named = os.environ.get("KSP_TEST_IMAGE")
    if named:
        return named
    docker_client.images.build(path=str(ROOT), tag=PROXY_IMAGE, rm=True)
    return PROXY_IMAGE


def test_share_consumer_reads_through_the_proxy_container(proxy_image: str) -> None:
    from testcontainers.core.network import Network

    from ksp_testcontainers import ApacheKafkaContainer, ShareProxyContainer

    with Network() as network, ApacheKafkaContainer(network=network) as kafka, \
            ShareProxyContainer(kafka, image=proxy_image, env={"KSP_SHARE_AUTO_OFFSET_RESET": "earliest"}) as proxy:
        bootstrap = proxy.get_bootstrap_server()
        with urllib.request.urlopen(f"{proxy.get_metrics_url()}/readyz", timeout=5) as response:
            assert response.status == 200 and json.loads(response.read())["ready"] is True

        topic = unique_name("containers")
        admin = AdminClient({"bootstrap.servers": bootstrap})  # through the proxy, which forwards it
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=60)

        producer = Producer({"bootstrap.servers": bootstrap})
        values = [f"value-{i}".encode() for i in range(RECORDS)]
        for value in values:
            producer.produce(topic, value=value)
        assert producer.flush(60) == 0

        consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": unique_name("containers-group")})
        received: list[bytes] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 60
            while len(received) < RECORDS and time.monotonic() < deadline:
                for message in consumer.poll(1.0):
                    assert message.error() is None, message.error()
                    received.append(message.value())
        finally:
            consumer.close()
        assert sorted(received) == sorted(values)
