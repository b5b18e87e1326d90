"""A Python share consumer for kafka-share-proxy, shaped like ``confluent_kafka.ShareConsumer``.

Written on the project's codec (no librdkafka), it speaks KIP-932 share groups to the proxy and
the draft KIP's IN_PROGRESS extension: ``ShareConsumer.mark_in_progress`` and the admin call
``describe_share_group_in_flight``. See docs/client.md.
"""

from .admin import InFlightRange, describe_share_group_in_flight
from .consumer import ShareConsumer
from .errors import KafkaError, KafkaException
from .message import AcknowledgeType, Message, TopicPartition
from .records import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE

__all__ = [
    "ShareConsumer", "Message", "AcknowledgeType", "TopicPartition", "KafkaError", "KafkaException",
    "InFlightRange", "describe_share_group_in_flight",
    "TIMESTAMP_NOT_AVAILABLE", "TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME",
]
