"""`share-proxy fetch-kafka`: download (or find cached) Apache Kafka jars and print their directory."""

from __future__ import annotations

import argparse
import os
import sys

from proxy.localkafka.broker import DEFAULT_VERSION
from proxy.localkafka.errors import LocalKafkaError
from proxy.localkafka.jars import cache_root, fetch_kafka


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-version",
        action="append",
        dest="kafka_versions",
        metavar="VERSION",
        help=f"Apache Kafka release (repeatable); default {DEFAULT_VERSION} or env KSP_KAFKA_VERSION",
    )
    parser.epilog = f"Needs `mvn` on PATH. Cache: {cache_root()} (env KSP_KAFKA_CACHE, else XDG_CACHE_HOME)."


def run(args: argparse.Namespace) -> int:
    versions = args.kafka_versions or [os.environ.get("KSP_KAFKA_VERSION", DEFAULT_VERSION)]
    for version in versions:
        try:
            print(fetch_kafka(version), flush=True)
        except LocalKafkaError as error:
            print(f"fetch-kafka: {error}", file=sys.stderr)
            return 1
    return 0
