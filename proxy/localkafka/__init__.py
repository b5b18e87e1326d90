"""A real local Apache Kafka (KRaft, single node) fetched from Maven Central: see docs/local-kafka.md."""

from proxy.localkafka.broker import DEFAULT_VERSION, SHARE_API_KEYS, LocalKafka, free_port
from proxy.localkafka.errors import LocalKafkaError
from proxy.localkafka.jars import cache_root, fetch_kafka, lib_dir

__all__ = [
    "DEFAULT_VERSION",
    "SHARE_API_KEYS",
    "LocalKafka",
    "LocalKafkaError",
    "cache_root",
    "fetch_kafka",
    "free_port",
    "lib_dir",
]
