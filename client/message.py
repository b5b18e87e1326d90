"""What poll() returns, and the small value types of the public API (confluent_kafka's shapes)."""

from __future__ import annotations

import enum
import typing
import uuid

from .errors import KafkaError


class AcknowledgeType(enum.IntEnum):
    """How a delivered record is acknowledged (Kafka's wire values).

    ACCEPT: processed, never delivered again. RELEASE: give it back for another delivery attempt.
    REJECT: not processable, never delivered again (archived). RENEW: keep holding it - its
    acquisition lock starts again (KIP-1222); acknowledge it again later with a final type.
    """

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


class TopicPartition(typing.NamedTuple):
    """A topic name and partition, the key of per-partition results."""

    topic: str
    partition: int


class Message:
    """One delivered record; the accessors are confluent_kafka.Message's."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers", "_timestamp",
                 "_delivery_count", "_error", "_topic_id", "_node")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]] | None, timestamp: tuple[int, int], delivery_count: int,
                 *, topic_id: uuid.UUID, node: int, error: KafkaError | None = None) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = timestamp
        self._delivery_count = delivery_count
        self._error = error
        self._topic_id = topic_id
        self._node = node

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """The record's headers as (name, value) pairs, None when it has none."""
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, ms since the epoch): TIMESTAMP_CREATE_TIME (1) or TIMESTAMP_LOG_APPEND_TIME (2)."""
        return self._timestamp

    def delivery_count(self) -> int:
        """How many times this record has been delivered, this time included (1 the first time)."""
        return self._delivery_count

    def error(self) -> KafkaError | None:
        return self._error

    def topic_id(self) -> uuid.UUID:
        return self._topic_id

    @property
    def _key_tuple(self) -> tuple[uuid.UUID, int, int]:
        return (self._topic_id, self._partition, self._offset)

    def __repr__(self) -> str:
        return (f"Message({self._topic}[{self._partition}]@{self._offset}, delivery_count={self._delivery_count}, "
                f"value={self._value[:32] if self._value else self._value!r})")
