"""State-topic records and recovery: what the proxy writes, and what a restart rebuilds from it."""

from __future__ import annotations

import uuid

import pytest

from codec import share_state as records
from codec.share_events import ArchiveReason
from proxy.share import state_store
from proxy.share.partition import PartitionSnapshot, PersistedBatch, StateDelta
from proxy.share.states import RecordState

TOPIC = uuid.UUID("11111111-2222-3333-4444-555555555555")
OTHER_TOPIC = uuid.UUID("66666666-7777-8888-9999-000000000000")
KEY = ("group-a", TOPIC, 0)

SNAPSHOT = PartitionSnapshot(10, (
    PersistedBatch(10, 14, RecordState.ACKNOWLEDGED, 1),
    PersistedBatch(15, 15, RecordState.AVAILABLE, 3),
    PersistedBatch(16, 20, RecordState.ARCHIVED, 5),
))


def snapshot(key=KEY, value=SNAPSHOT, *, epoch=1, state_epoch=0, created=1_000):
    return state_store.snapshot_record(key, value, snapshot_epoch=epoch, state_epoch=state_epoch,
                                       create_timestamp=created, write_timestamp=created + 1)


def update(key=KEY, *, epoch=1, start_offset=-1, batches=()):
    batch_type = records.ShareUpdateValue.StateBatch
    return records.encode_record(
        records.ShareUpdateKey(group_id=key[0], topic_id=key[1], partition=key[2]),
        records.ShareUpdateValue(
            snapshot_epoch=epoch, leader_epoch=-1, start_offset=start_offset,
            state_batches=tuple(
                batch_type(first_offset=b.first_offset, last_offset=b.last_offset,
                           delivery_state=int(b.delivery_state), delivery_count=b.delivery_count)
                for b in batches
            ),
        ),
    )


def group(group_id="group-a", epoch=3):
    return state_store.group_metadata_record(group_id, epoch, 1_000)


# ----- record round trips ------------------------------------------------------------------


def test_snapshot_record_is_kafkas_share_snapshot_with_every_field():
    key_bytes, value_bytes = state_store.snapshot_record(
        KEY, SNAPSHOT, snapshot_epoch=7, state_epoch=2, create_timestamp=1_000, write_timestamp=2_000,
    )
    decoded = records.decode_record(key_bytes, value_bytes)
    assert decoded.record_type is records.RecordType.SHARE_SNAPSHOT
    assert (decoded.key.group_id, decoded.key.topic_id, decoded.key.partition) == KEY
    value = decoded.value
    assert (value.snapshot_epoch, value.state_epoch, value.start_offset) == (7, 2, 10)
    assert (value.create_timestamp, value.write_timestamp) == (1_000, 2_000)
    assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in value.state_batches] == [
        (10, 14, 2, 1), (15, 15, 0, 3), (16, 20, 4, 5),
    ]


def test_snapshot_key_is_the_same_for_every_write_of_a_partition():
    # Compaction keeps the newest record per key: every snapshot of a partition must share it.
    first, _ = snapshot(epoch=1)
    second, _ = snapshot(value=PartitionSnapshot(21, ()), epoch=2)
    assert first == second
    assert state_store.partition_tombstone(KEY) == (first, None)
    assert snapshot(key=("group-a", TOPIC, 1))[0] != first


def test_group_records_round_trip():
    metadata = records.decode_record(*state_store.group_metadata_record("g", 9, 1_234)[:2])
    assert (metadata.key.group_id, metadata.value.group_epoch, metadata.value.create_timestamp) == ("g", 9, 1_234)

    partitions = records.decode_record(*state_store.group_partitions_record(
        "g", [(TOPIC, 2), (TOPIC, 0), (OTHER_TOPIC, 1)], {TOPIC: "orders"},
    )[:2])
    assert [(t.topic_id, t.topic_name, tuple(t.partitions)) for t in partitions.value.initialized_topics] == sorted(
        [(TOPIC, "orders", (0, 2)), (OTHER_TOPIC, "", (1,))]
    )

    configs = records.decode_record(*state_store.group_config_record("g", {"b": 2, "a": "x"})[:2])
    assert [(c.name, c.value) for c in configs.value.configs] == [("a", "x"), ("b", "2")]


def test_group_tombstones_cover_all_three_group_records():
    tombstones = state_store.group_tombstones("g")
    assert [value for _, value, _ in tombstones] == [None, None, None]
    # All three on the group's one home partition (layout 2).
    assert {route for _, _, route in tombstones} == {state_store.group_route("g")}
    assert {records.decode_key(key)[0] for key, _, _ in tombstones} == {
        records.RecordType.PROXY_GROUP_METADATA,
        records.RecordType.PROXY_GROUP_PARTITIONS,
        records.RecordType.PROXY_GROUP_CONFIG,
    }


# ----- recover() -----------------------------------------------------------------------------


def test_recover_rebuilds_partitions_and_groups():
    recovered = state_store.recover([
        group(epoch=3),
        state_store.group_partitions_record("group-a", [(TOPIC, 0)], {TOPIC: "orders"}),
        state_store.group_config_record("group-a", {"share.record.lock.duration.ms": 20_000}),
        snapshot(epoch=4, state_epoch=1, created=500),
    ])
    partition = recovered.partitions[KEY]
    assert partition.snapshot == SNAPSHOT
    assert (partition.snapshot_epoch, partition.state_epoch, partition.create_timestamp) == (4, 1, 500)
    assert partition.updates == []
    group_state = recovered.groups["group-a"]
    assert group_state.group_epoch == 3
    assert group_state.initialized == {(TOPIC, 0)}
    assert group_state.configs == {"share.record.lock.duration.ms": "20000"}
    assert recovered.skipped == 0


def test_recover_folds_records_as_an_iterator_yields_them_and_counts_every_one():
    """The proxy feeds recover() straight from the state topic's reader: one pass, nothing held."""
    fed = []

    def reader():
        for record in [group(), snapshot(epoch=4), (snapshot()[0], b"\x00\x00\xff"), snapshot(epoch=5)]:
            fed.append(record)
            yield record

    recovered = state_store.recover(reader())
    assert len(fed) == 4 and recovered.records == 4  # the skipped record counted too
    assert recovered.skipped == 1
    assert recovered.partitions[KEY].snapshot_epoch == 5


def test_newest_snapshot_wins_and_drops_older_updates():
    newer = PartitionSnapshot(21, ())
    recovered = state_store.recover([
        group(),
        snapshot(epoch=1),
        update(epoch=1, batches=[PersistedBatch(15, 15, RecordState.ACKNOWLEDGED, 3)]),
        snapshot(value=newer, epoch=2),
    ])
    assert recovered.partitions[KEY].snapshot == newer
    assert recovered.partitions[KEY].updates == []


def test_updates_after_the_snapshot_with_its_epoch_are_applied_in_order():
    first = PersistedBatch(15, 15, RecordState.ACKNOWLEDGED, 3)
    second = PersistedBatch(10, 20, RecordState.ARCHIVED, 5)
    recovered = state_store.recover([
        group(),
        snapshot(epoch=2),
        update(epoch=2, batches=[first]),
        update(epoch=1, batches=[second]),  # written for an older snapshot: stale
        update(epoch=2, start_offset=21, batches=[second]),
    ])
    assert recovered.partitions[KEY].updates == [StateDelta(-1, (first,)), StateDelta(21, (second,))]


def test_update_without_a_snapshot_is_ignored():
    recovered = state_store.recover([group(), update(epoch=0, batches=[])])
    assert recovered.partitions == {}


def test_partition_tombstone_forgets_the_partition_until_a_new_snapshot():
    assert KEY not in state_store.recover([group(), snapshot(), state_store.partition_tombstone(KEY)]).partitions
    again = state_store.recover([group(), snapshot(), state_store.partition_tombstone(KEY), snapshot(epoch=9)])
    assert again.partitions[KEY].snapshot_epoch == 9


def test_group_tombstone_drops_the_group_and_its_partitions():
    other_key = ("group-b", TOPIC, 0)
    recovered = state_store.recover([
        group("group-a"), group("group-b"), snapshot(), snapshot(key=other_key),
        *state_store.group_tombstones("group-a"),
    ])
    assert set(recovered.groups) == {"group-b"}
    assert set(recovered.partitions) == {other_key}


def test_partitions_and_config_tombstones_clear_only_their_part():
    recovered = state_store.recover([
        group(epoch=5),
        state_store.group_partitions_record("group-a", [(TOPIC, 0)], {}),
        state_store.group_config_record("group-a", {"a": "1"}),
        state_store.group_tombstones("group-a")[1],  # partitions
        state_store.group_tombstones("group-a")[2],  # configs
    ])
    assert recovered.groups["group-a"].group_epoch == 5
    assert recovered.groups["group-a"].initialized == set()
    assert recovered.groups["group-a"].configs == {}


def test_a_deleted_group_stays_deleted_whatever_order_its_keys_replay_in():
    """Replay reads the state topic partition by partition: only each key's own history is in
    order. A group's partitions record replayed after its metadata tombstone must not revive it."""
    metadata_key_history = [group(epoch=2), state_store.group_tombstones("group-a")[0]]
    partitions_key_history = [state_store.group_partitions_record("group-a", [(TOPIC, 0)], {}),
                              state_store.group_tombstones("group-a")[1]]
    snapshot_history = [snapshot()]
    for order in ([*metadata_key_history, *partitions_key_history, *snapshot_history],
                  [*partitions_key_history, *snapshot_history, *metadata_key_history],
                  [*snapshot_history, *metadata_key_history, partitions_key_history[0]]):
        recovered = state_store.recover(order)
        assert recovered.groups == {} and recovered.partitions == {}, order


def test_partition_of_a_group_without_group_records_is_not_served():
    assert state_store.recover([snapshot()]).partitions == {}


@pytest.mark.parametrize("bad", [
    (b"\x7f\x00garbage", b"\x00\x00"),  # unknown record type
    (b"\x00", None),  # key shorter than its version prefix
    (snapshot()[0], b"\x00\x00\xff"),  # truncated value
    (snapshot()[0], b"\x00\x09" + snapshot()[1][2:]),  # unsupported value version
])
def test_undecodable_records_are_skipped_and_counted(bad):
    recovered = state_store.recover([group(), bad, snapshot()])
    assert recovered.skipped == 1
    assert recovered.partitions[KEY].snapshot == SNAPSHOT


def raw_snapshot(batches, *, key=KEY, start_offset=10, epoch=5):
    """A ShareSnapshot built from the schema, so a batch may carry any delivery state or offsets."""
    value_type = records.ShareSnapshotValue
    return records.encode_record(
        records.ShareSnapshotKey(group_id=key[0], topic_id=key[1], partition=key[2]),
        value_type(
            snapshot_epoch=epoch, state_epoch=0, leader_epoch=-1, start_offset=start_offset,
            delivery_complete_count=-1, create_timestamp=1, write_timestamp=2,
            state_batches=tuple(
                value_type.StateBatch(first_offset=first, last_offset=last, delivery_state=state, delivery_count=count)
                for first, last, state, count in batches
            ),
        ),
    )


@pytest.mark.parametrize("batch", [
    (10, 12, 9, 1),  # unknown delivery state
    (10, 12, -1, 1),
    (10, 12, 1, 1),  # Acquired: never persisted
    (12, 10, 0, 1),  # last offset before first
    (-3, 10, 0, 1),
    (10, 12, 0, -1),  # negative delivery count
], ids=["state-9", "state-minus-1", "acquired", "reversed", "negative-offset",
        "negative-count"])
def test_a_record_that_cannot_be_applied_is_skipped_and_the_previous_state_kept(batch):
    recovered = state_store.recover([group(), snapshot(epoch=4), raw_snapshot([(15, 15, 0, 2), batch])])
    assert recovered.skipped == 1
    assert recovered.partitions[KEY].snapshot == SNAPSHOT  # the earlier snapshot of the key stands
    assert recovered.partitions[KEY].snapshot_epoch == 4


def test_an_update_that_cannot_be_applied_is_skipped_and_later_ones_still_apply():
    good = PersistedBatch(15, 15, RecordState.ACKNOWLEDGED, 3)
    unknown_state = PersistedBatch(15, 15, 9, 3)  # update() writes int(delivery_state) as is
    recovered = state_store.recover([
        group(), snapshot(epoch=1), update(epoch=1, batches=[unknown_state]), update(epoch=1, batches=[good]),
    ])
    assert recovered.skipped == 1
    assert recovered.partitions[KEY].updates == [StateDelta(-1, (good,))]


def test_the_valid_states_of_a_raw_snapshot_are_applied():
    recovered = state_store.recover([group(), raw_snapshot([(10, 12, 2, 1), (13, 13, 0, 4), (14, 20, 4, 5)])])
    assert recovered.skipped == 0
    assert recovered.partitions[KEY].snapshot == PartitionSnapshot(10, (
        PersistedBatch(10, 12, RecordState.ACKNOWLEDGED, 1),
        PersistedBatch(13, 13, RecordState.AVAILABLE, 4),
        PersistedBatch(14, 20, RecordState.ARCHIVED, 5),
    ))


def test_a_skipped_record_is_logged_with_its_topic_partition_and_offset_and_counted():
    from structlog.testing import capture_logs

    from proxy.share.metrics import STATE_RECORDS_SKIPPED
    from proxy.share.persister import ReplayedRecord

    log = [ReplayedRecord(0, 7, *group()[:2]), ReplayedRecord(2, 41, b"\x00", None),
           ReplayedRecord(2, 42, *raw_snapshot([(10, 10, 9, 1)])), ReplayedRecord(1, 3, *snapshot())]
    before = STATE_RECORDS_SKIPPED._value.get()
    with capture_logs() as logged:
        recovered = state_store.recover(log, topic="__state")
    assert recovered.skipped == 2
    assert recovered.partitions[KEY].snapshot == SNAPSHOT
    assert STATE_RECORDS_SKIPPED._value.get() == before + 2
    skipped = [(e["topic"], e["partition"], e["offset"]) for e in logged if e["event"] == "state record skipped"]
    assert skipped == [("__state", 2, 41), ("__state", 2, 42)]
    assert "delivery state 9" in [e for e in logged if e.get("offset") == 42][0]["error"]


def test_configs_set_before_a_group_exists_are_recovered_without_creating_it():
    recovered = state_store.recover([
        state_store.group_config_record("early", {"share.auto.offset.reset": "earliest"}),
        state_store.group_config_record("gone", {"share.delivery.count.limit": "3"}),
        state_store.group_tombstones("gone")[2],
    ])
    assert set(recovered.groups) == {"early"}
    assert recovered.groups["early"].configs == {"share.auto.offset.reset": "earliest"}
    assert not recovered.groups["early"].exists
    # Once the group's own records appear it exists and keeps its configs.
    later = state_store.recover([
        state_store.group_config_record("early", {"share.auto.offset.reset": "earliest"}),
        group("early", epoch=2),
    ])
    assert later.groups["early"].exists and later.groups["early"].group_epoch == 2
    assert later.groups["early"].configs == {"share.auto.offset.reset": "earliest"}


# ----- IN_PROGRESS: extension tags and the wall / engine clock conversion -----------------------------

WALL_MINUS_ENGINE = 1_700_000_000_000  # wall clock - engine (monotonic) clock, ms
IN_PROGRESS_SNAPSHOT = PartitionSnapshot(10, (
    PersistedBatch(10, 14, RecordState.IN_PROGRESS, 1, 5_000, 6_000, "member-1"),
    PersistedBatch(15, 15, RecordState.AVAILABLE, 3),
))


def test_in_progress_batches_carry_tags_100_to_102_in_wall_clock_time():
    _, value_bytes = state_store.snapshot_record(
        KEY, IN_PROGRESS_SNAPSHOT, snapshot_epoch=1, state_epoch=0, create_timestamp=1, write_timestamp=2,
        clock_offset_ms=WALL_MINUS_ENGINE)
    batches = records.decode_value(records.RecordType.SHARE_SNAPSHOT, value_bytes).state_batches
    assert [(b.delivery_state, b.in_progress_start_timestamp, b.last_progress_timestamp, b.in_progress_member_id)
            for b in batches] == [
        (5, WALL_MINUS_ENGINE + 5_000, WALL_MINUS_ENGINE + 6_000, "member-1"),
        (0, -1, -1, None),  # the tags stay at their defaults (not written) on other states
    ]
    # Tags 100 (0x64), 101 (0x65), 102 (0x66) are on the wire for the state-5 batch only.
    assert value_bytes.count(bytes([0x66, 0x09])) == 1  # tag 102, size 9: compact string "member-1"


def test_recovery_brings_in_progress_times_onto_the_engine_clock_of_the_new_process():
    written = state_store.snapshot_record(
        KEY, IN_PROGRESS_SNAPSHOT, snapshot_epoch=1, state_epoch=0, create_timestamp=1, write_timestamp=2,
        clock_offset_ms=WALL_MINUS_ENGINE)
    # The restarted process's monotonic clock started 1 000 000 ms later relative to the wall clock.
    recovered = state_store.recover([group(), written], clock_offset_ms=WALL_MINUS_ENGINE + 1_000_000)
    assert recovered.partitions[KEY].snapshot == PartitionSnapshot(10, (
        PersistedBatch(10, 14, RecordState.IN_PROGRESS, 1, 5_000 - 1_000_000, 6_000 - 1_000_000, "member-1"),
        PersistedBatch(15, 15, RecordState.AVAILABLE, 3),
    ))


def test_in_progress_updates_round_trip_through_update_record():
    delta = StateDelta(-1, (PersistedBatch(15, 15, RecordState.IN_PROGRESS, 3, 7, 8, "m"),))
    recovered = state_store.recover([
        group(), snapshot(epoch=2),
        state_store.update_record(KEY, delta, snapshot_epoch=2, clock_offset_ms=100),
    ], clock_offset_ms=100)
    assert recovered.partitions[KEY].updates == [delta]


def test_default_clock_offset_is_wall_minus_monotonic():
    import time
    expected = time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000
    assert abs(state_store.engine_clock_offset_ms() - expected) <= 2


def test_an_in_progress_batch_without_owner_is_recovered_and_delivered_again():
    from proxy.share.partition import PartitionConfig, SharePartition
    recovered = state_store.recover([group(), raw_snapshot([(10, 12, 5, 2)])])
    assert recovered.skipped == 0
    engine = SharePartition.from_persisted(PartitionConfig(), recovered.partitions[KEY].snapshot)
    assert engine.record_state(11) == (RecordState.AVAILABLE, 2, None)


ARCHIVING_SNAPSHOT = PartitionSnapshot(10, (
    PersistedBatch(10, 11, RecordState.ARCHIVING, 2, archive_reason=ArchiveReason.REJECTED),
    PersistedBatch(12, 12, RecordState.ARCHIVING, 5, archive_reason=ArchiveReason.DELIVERY_LIMIT),
    PersistedBatch(13, 13, RecordState.ACKNOWLEDGED, 1),
))


def test_archiving_batches_round_trip_with_their_reason_in_tag_103():
    written = state_store.snapshot_record(
        KEY, ARCHIVING_SNAPSHOT, snapshot_epoch=1, state_epoch=0, create_timestamp=1, write_timestamp=2)
    batches = records.decode_value(records.RecordType.SHARE_SNAPSHOT, written[1]).state_batches
    assert [(b.delivery_state, b.archive_reason) for b in batches] == [(3, 1), (3, 2), (2, 0)]
    # Tag 103 (0x67), size 1, on the two state-3 batches only (the default 0 is not written).
    assert written[1].count(bytes([0x67, 0x01, 0x01])) == 1 and written[1].count(bytes([0x67, 0x01, 0x02])) == 1
    recovered = state_store.recover([group(), written])
    assert recovered.skipped == 0
    assert recovered.partitions[KEY].snapshot == ARCHIVING_SNAPSHOT


def test_archiving_updates_round_trip_through_update_record():
    delta = StateDelta(-1, (PersistedBatch(15, 15, RecordState.ARCHIVING, 3, archive_reason=ArchiveReason.REJECTED),))
    recovered = state_store.recover([
        group(), snapshot(epoch=2), state_store.update_record(KEY, delta, snapshot_epoch=2),
    ])
    assert recovered.partitions[KEY].updates == [delta]


def test_kafkas_archiving_batch_without_a_reason_gets_kafkas_rule_from_the_count():
    from proxy.share.partition import PartitionConfig, SharePartition
    # Kafka writes state 3 without tag 103: the count decides (>= the limit: delivery limit).
    recovered = state_store.recover([group(), raw_snapshot([(10, 11, 3, 2), (12, 12, 3, 5)])])
    assert recovered.skipped == 0
    snapshot_read = recovered.partitions[KEY].snapshot
    assert [b.archive_reason for b in snapshot_read.state_batches] == [ArchiveReason.NONE, ArchiveReason.NONE]
    engine = SharePartition.from_persisted(PartitionConfig(delivery_count_limit=5), snapshot_read)
    assert [(r.first_offset, r.last_offset, r.reason) for r in engine.archiving()] == [
        (10, 11, ArchiveReason.REJECTED), (12, 12, ArchiveReason.DELIVERY_LIMIT)]
    assert engine.start_offset == 10 and engine.archiving_count == 3
