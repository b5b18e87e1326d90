"""Topic changes reach share-group assignments through the proxy's metadata refresh."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from integration.share.conftest import share_consumer


def test_partitions_added_to_a_subscribed_topic_are_assigned_and_consumed(share_proxy, names, create_topic, kafka):
    proxy = share_proxy("--share-metadata-refresh-ms", "500")
    create_topic(names.topic, partitions=1)
    consumer = share_consumer(proxy.bootstrap, names.group, names.topic)
    try:
        consumer.poll(1.0)  # join the group with the one-partition topic

        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.create_partitions([NewPartitions(names.topic, 2)])[names.topic].result(30)
        producer = Producer({"bootstrap.servers": proxy.bootstrap})
        producer.produce(names.topic, value=b"on-the-new-partition", partition=1)
        assert producer.flush(30) == 0

        deadline = time.monotonic() + 40  # one refresh plus the member's next heartbeat (5 s)
        received = []
        while not received and time.monotonic() < deadline:
            received = [m for m in consumer.poll(0.5) or [] if not m.error()]
        assert [(m.partition(), m.value()) for m in received] == [(1, b"on-the-new-partition")]
    finally:
        consumer.close()
