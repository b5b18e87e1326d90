"""Share state survives real log compaction of the state topic.

The proxy writes cumulative ShareUpdates between ShareSnapshots, keyed per share-partition (or,
with ``KSP_STATE_DELTAS=off``, a whole ShareSnapshot per change), so compaction may drop every
record but the newest per key and replay must still rebuild the same state. These
tests make the broker actually compact a state topic (short segments, eager cleaner) and restart
the proxy on what is left.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from confluent_kafka import AcknowledgeType

from integration.share.conftest import (
    EXPLICIT,
    acknowledge_all,
    durable_state,
    poll_until,
    produce,
    share_consumer,
    wait_until,
)
from codec.share_state import RecordType, decode_key
from proxy.share.persister import replay_state_topic

pytestmark = pytest.mark.integration

RECORDS = 200
ACK_CHUNK = 5
# Segments roll after 200 ms of appends and the cleaner takes any log with 1% dirty records, so
# the broker compacts within one cleaner back-off (15 s by default) of the last roll.
EAGER_COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": "200",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}
COMPACTION_TIMEOUT_S = 90


def first_outcome(offset: int) -> AcknowledgeType:
    return {7: AcknowledgeType.RELEASE, 9: AcknowledgeType.REJECT}.get(offset % 10, AcknowledgeType.ACCEPT)


def compacted_away(bootstrap: str, state_topic: str) -> int:
    """How many records compaction has removed from the state topic (gaps in its offsets)."""
    records = replay_state_topic(bootstrap, state_topic, timeout_s=20)
    if not records:
        return 0
    return records[-1].offset + 1 - records[0].offset - len(records)


def test_state_rebuilt_from_a_compacted_state_topic(kafka, share_proxy, create_topic, names):
    state_topic = create_topic(f"__share_proxy_state_compacted_{uuid.uuid4().hex[:12]}",
                               config=EAGER_COMPACTION)
    proxy = share_proxy(state_topic=state_topic)
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, RECORDS)

    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        first = sorted(poll_until(consumer, RECORDS), key=lambda m: m.offset())
        # Many small acknowledgements, spread over several segments: each commit is one durable
        # snapshot of the same share-partition key, all but the newest of which compaction may drop.
        for start in range(0, RECORDS, ACK_CHUNK):
            acknowledge_all(consumer, first[start:start + ACK_CHUNK], lambda m: first_outcome(m.offset()))
            time.sleep(0.05)
        released = [o for o in range(RECORDS) if o % 10 == 7]
        second = poll_until(consumer, len(released))
        assert sorted((m.offset(), m.delivery_count()) for m in second) == [(o, 2) for o in released]
        acknowledge_all(consumer, second, lambda m: AcknowledgeType.RELEASE)
    finally:
        consumer.close()

    before = durable_state(kafka.bootstrap, state_topic, names.group)
    assert before[0].start_offset == 7, before
    if os.environ.get("KSP_STATE_DELTAS", "on").lower() == "on":
        # The proxies run with cumulative ShareUpdates (the default): some were written, and compaction must keep
        # the newest of them beside the newest snapshot.
        kinds = [decode_key(r.key)[0] for r in replay_state_topic(kafka.bootstrap, state_topic, timeout_s=20)]
        assert RecordType.SHARE_UPDATE in kinds, kinds

    wait_until(lambda: compacted_away(kafka.bootstrap, state_topic) >= RECORDS // ACK_CHUNK // 2,
               COMPACTION_TIMEOUT_S, "the broker to compact the state topic", interval=1.0)
    assert durable_state(kafka.bootstrap, state_topic, names.group) == before

    proxy.stop(signal.SIGKILL)
    proxy.start()  # replays the compacted topic
    consumer = share_consumer(proxy.bootstrap, names.group, topic, EXPLICIT)
    try:
        third = poll_until(consumer, len(released))
        assert sorted((m.offset(), m.delivery_count()) for m in third) == [(o, 3) for o in released]
        acknowledge_all(consumer, third)
        # Accepted and rejected records stayed done: the next delivery is what is produced now.
        produce(kafka.bootstrap, topic, 3, start=RECORDS)
        later = poll_until(consumer, 3)
        assert sorted((m.offset(), m.delivery_count()) for m in later) == [(o, 1) for o in range(RECORDS, RECORDS + 3)]
        acknowledge_all(consumer, later)
    finally:
        consumer.close()
    assert durable_state(kafka.bootstrap, state_topic, names.group)[0].start_offset == RECORDS + 3
