"""One group-id namespace: share groups (in the proxy) and consumer groups (upstream) never collide."""

from __future__ import annotations

import contextlib
import time

from confluent_kafka import Consumer, KafkaError, KafkaException

from integration.share.conftest import produce, share_consumer


def _first_error(consumer: Consumer, timeout_s: float = 20.0) -> KafkaError | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error():
            return message.error()
    return None


def _poll_share_until_error(consumer, timeout_s: float = 20.0) -> KafkaError | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for message in consumer.poll(0.5) or []:
                if message.error():
                    return message.error()
        except KafkaException as exc:
            return exc.args[0]
    return None


def test_consumer_group_join_is_refused_for_a_share_group_id(share_proxy, names, create_topic, kafka):
    proxy = share_proxy()
    create_topic(names.topic)
    produce(proxy.bootstrap, names.topic, 1)
    share = share_consumer(proxy.bootstrap, names.group, names.topic)
    try:
        deadline = time.monotonic() + 30
        received = []
        while not received and time.monotonic() < deadline:
            received = [m for m in share.poll(0.5) or [] if not m.error()]
        assert received, "the share group never received its record"

        protocols = ["classic", "consumer"] if not kafka.version.startswith("3.") else ["classic"]
        for protocol in protocols:
            consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": names.group,
                                 "group.protocol": protocol, "auto.offset.reset": "earliest"})
            consumer.subscribe([names.topic])
            try:
                error = _first_error(consumer)
            finally:
                consumer.close()
            assert error is not None, f"{protocol}: the join was not refused"
            if protocol == "classic":
                assert error.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL, error
            else:
                # librdkafka raises GROUP_ID_NOT_FOUND from ConsumerGroupHeartbeat as a fatal error.
                assert error.code() in (KafkaError.GROUP_ID_NOT_FOUND, KafkaError._FATAL), error
                assert "group id does not exist" in error.str(), error
    finally:
        share.close()


def test_share_group_join_is_refused_for_an_upstream_consumer_group_id(share_proxy, names, create_topic):
    proxy = share_proxy()
    create_topic(names.topic)
    produce(proxy.bootstrap, names.topic, 1)
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": names.group,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([names.topic])
    try:
        deadline = time.monotonic() + 30
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and not message.error(), "the consumer group never joined"

        share = share_consumer(proxy.bootstrap, names.group, names.topic)
        try:
            error = _poll_share_until_error(share)
        finally:
            with contextlib.suppress(KafkaException):  # a fenced consumer may fail to leave cleanly
                share.close()
        assert error is not None and error.code() == KafkaError.GROUP_ID_NOT_FOUND, error
    finally:
        consumer.close()

