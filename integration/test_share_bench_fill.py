"""share_bench's topics against a real broker: filled partition by partition, every partition's
log is cut into the same full batches whatever the machine's timing (goal run 42 on)."""

from __future__ import annotations

from integration.bench.share_bench import FILL_BATCH_BYTES, batch_record_counts, fill_partition_by_partition
from integration.kafka_fixtures import create_topics, unique_name
from proxy.localkafka import LocalKafka

PARTITIONS = 32
RECORDS_PER_PARTITION = 2_500
SIZE = 1024


def test_a_topic_filled_partition_by_partition_holds_full_batches_on_every_partition(kafka: LocalKafka):
    topic = create_topics(kafka.bootstrap, [unique_name("fill")], partitions=PARTITIONS)[0]

    fill_partition_by_partition(kafka.bootstrap, topic, PARTITIONS, PARTITIONS * RECORDS_PER_PARTITION, SIZE)

    per_partition = batch_record_counts(kafka.data_dir / "kraft", topic)
    # A batch of FILL_BATCH_BYTES holds at least this many 1 KiB records (under 64 bytes of
    # overhead each), so 2,500 records make two full batches and a partial one per partition. (A
    # batch's count moves by one with its keys' lengths.)
    full = FILL_BATCH_BYTES // (SIZE + 64)
    assert sorted(per_partition) == list(range(PARTITIONS))
    for partition, counts in per_partition.items():
        assert len(counts) == 3 and min(counts[:2]) >= full, (partition, counts)
        assert sum(counts) == RECORDS_PER_PARTITION, (partition, counts)
