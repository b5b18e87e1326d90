"""The local Kafka launcher's one error type."""

from __future__ import annotations


class LocalKafkaError(Exception):
    """Fetching, formatting, starting or checking the local Kafka broker failed."""
