"""Start the kafka-share-proxy image beside a Kafka container in your own tests (docs/deployment.md).

::

    from testcontainers.core.network import Network
    from ksp_testcontainers import ApacheKafkaContainer, ShareProxyContainer

    with Network() as network, ApacheKafkaContainer(network=network) as kafka, \\
            ShareProxyContainer(kafka) as proxy:
        consumer = confluent_kafka.ShareConsumer({"bootstrap.servers": proxy.get_bootstrap_server(), ...})

Needs the ``testcontainers`` extra (``pip install 'kafka-share-proxy[testcontainers]'``) and a
Docker engine. The classes only drive images from outside: nothing here imports the proxy.
"""

from ksp_testcontainers.containers import (
    KAFKA_IMAGE,
    PROXY_IMAGE,
    ApacheKafkaContainer,
    ShareProxyContainer,
    free_port_layout,
)

__all__ = ["KAFKA_IMAGE", "PROXY_IMAGE", "ApacheKafkaContainer", "ShareProxyContainer", "free_port_layout"]
