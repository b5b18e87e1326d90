"""The cost-model benchmark's pure helpers (integration/bench/cost_model.py)."""

from __future__ import annotations

import pytest

from integration.bench import cost_model
from integration.bench.cost_model import (
    TOPIC_ID,
    fit_line,
    metric_value,
    parse_shapes,
    placed,
    replayed,
    split_evenly,
    state_batches_for,
    state_partitions,
    state_records,
)
from proxy.share import state_store
from proxy.share.partition import PartitionConfig, SharePartition
from proxy.share.persister import ReplayedRecord
from proxy.share.states import RecordState


def test_parse_shapes() -> None:
    assert parse_shapes("1x10, 100X100") == [(1, 10), (100, 100)]
    for bad in ("10", "0x5", "2x", "ax3"):
        with pytest.raises(ValueError):
            parse_shapes(bad)


def test_fit_line_recovers_an_exact_line_and_handles_one_point() -> None:
    intercept, slope = fit_line([(10, 130), (1000, 3100), (10_000, 30_100)])
    assert intercept == pytest.approx(100)
    assert slope == pytest.approx(3)
    assert fit_line([(4, 10)]) == (0.0, 2.5)
    assert fit_line([(4, 10), (4, 14)]) == (0.0, 2.5)  # no spread in x: through the first point
    with pytest.raises(ValueError):
        fit_line([])


def test_metric_value_reads_unlabelled_samples_only() -> None:
    text = ("# HELP ksp_share_state_replay_seconds x\n# TYPE ksp_share_state_replay_seconds gauge\n"
            "ksp_share_state_replay_seconds 12.5\nksp_share_state_replay_records 1e+06\n"
            'ksp_requests_total{api="Fetch"} 3.0\n')
    assert metric_value(text, "ksp_share_state_replay_seconds") == 12.5
    assert metric_value(text, "ksp_share_state_replay_records") == 1_000_000
    assert metric_value(text, "ksp_share_state_replay") is None
    assert metric_value(text, "ksp_requests_total") is None


def test_split_evenly() -> None:
    assert split_evenly(10, 3) == [4, 3, 3]
    assert sum(split_evenly(1_000_003, 10_000)) == 1_000_003


def test_state_batches_for_tiles_the_window_in_turn() -> None:
    batches = state_batches_for(100, 4, 5)
    assert [(b.first_offset, b.last_offset) for b in batches] == [(100, 104), (105, 109), (110, 114), (115, 119)]
    assert [b.delivery_state for b in batches] == [RecordState.ACKNOWLEDGED, RecordState.AVAILABLE,
                                                   RecordState.ARCHIVED, RecordState.ACKNOWLEDGED]


def test_state_records_replay_to_every_share_partition_at_its_newest_snapshot() -> None:
    records = list(state_records(2, 3, 2 * 2 + 6 * 3 + 2, batches=3))
    assert len(records) == 24
    recovered = state_store.recover(records, clock_offset_ms=0)
    assert not recovered.skipped
    assert set(recovered.groups) == {"cost-group-00000", "cost-group-00001"}
    assert recovered.groups["cost-group-00001"].initialized == {(TOPIC_ID, p) for p in range(3)}
    assert len(recovered.partitions) == 6
    # 20 snapshots over 6 share-partitions: the first two got 4, the rest 3 (epochs count up).
    epochs = [recovered.partitions[(f"cost-group-0000{g}", TOPIC_ID, p)].snapshot_epoch
              for g in range(2) for p in range(3)]
    assert epochs == [4, 4, 3, 3, 3, 3]
    newest = recovered.partitions[("cost-group-00000", TOPIC_ID, 0)].snapshot
    assert newest.start_offset == 4000 and len(newest.state_batches) == 3


def test_state_records_refuses_too_few_records() -> None:
    with pytest.raises(ValueError):
        list(state_records(2, 3, 9))
    with pytest.raises(ValueError):  # a snapshot and an update each
        list(state_records(2, 3, 2 * 2 + 6 * 2 - 1, updated=True))


def test_updated_state_records_end_each_share_partition_in_an_update_over_its_newest_snapshot() -> None:
    records = list(state_records(2, 3, 2 * 2 + 6 * 3 + 2, batches=3, updated=True))
    assert len(records) == 24
    recovered = state_store.recover(records, clock_offset_ms=0)
    assert not recovered.skipped and len(recovered.partitions) == 6
    # 14 snapshots over 6 share-partitions (the first two got 3), then an update each.
    newest = recovered.partitions[("cost-group-00000", TOPIC_ID, 0)]
    assert newest.snapshot_epoch == 3 and newest.snapshot.start_offset == 3000
    assert [(b.first_offset, b.last_offset, b.delivery_state) for u in newest.updates for b in u.state_batches] == \
        [(3005, 3007, RecordState.ACKNOWLEDGED)]
    engine = SharePartition.from_persisted(PartitionConfig(), newest.snapshot, newest.updates)
    # Acknowledged from the SPSO on through the update's part of the second batch: the SPSO passed it.
    assert engine.start_offset == 3008
    assert [(first, last, state) for first, last, state, _, _ in engine.in_flight()] == [
        (3008, 3009, RecordState.AVAILABLE), (3010, 3014, RecordState.ARCHIVED)]


def test_state_partitions_is_what_the_proxy_gives_a_new_state_topic() -> None:
    from proxy.config import load_config

    assert state_partitions() == load_config({"upstream": "k:1"}, environ={}).state_topic_partitions


def test_placed_records_replay_in_layout_2_without_a_migration() -> None:
    """The records the end-to-end replay writes must be a topic the proxy serves as it is: were they
    off their home partitions, the proxy would migrate them at start and replay would time that."""
    partitions = 12
    rows = list(placed(state_records(2, 3, 2 * 2 + 6 * 3 + 2, batches=3), partitions))
    assert rows[0][0] == 0 and len(rows) == 25  # the layout marker first, on partition 0
    assert len({partition for partition, _, _ in rows}) > 1  # homes spread over the topic
    recovered = state_store.recover(replayed(rows, partitions), clock_offset_ms=0, partitions=partitions)
    assert recovered.layout == state_store.LayoutMarker(state_store.LAYOUT, partitions)
    assert not recovered.needs_migration(partitions) and not recovered.misplaced and not recovered.skipped
    assert len(recovered.partitions) == 6


def test_records_on_a_partition_other_than_their_home_would_be_migrated() -> None:
    """The check above can fail: the same records round-robin over the partitions need a migration."""
    partitions = 12
    rows = list(placed(state_records(2, 3, 2 * 2 + 6 * 3 + 2, batches=3), partitions))
    replayed = [ReplayedRecord(0 if i == 0 else 1 + i % (partitions - 1), i, key, value)
                for i, (_, key, value) in enumerate(rows)]
    assert state_store.recover(replayed, clock_offset_ms=0, partitions=partitions).needs_migration(partitions)


def test_scrape_costs_time_a_scrape_of_the_share_series_with_and_without_per_partition_series() -> None:
    import trio

    async def costs(groups: int) -> dict:
        service = cost_model.new_service()
        leaders = [leader for g in range(groups) for leader in cost_model.add_group(service, g, 3)]
        return await cost_model.scrape_costs(service, leaders)

    one, two = trio.run(costs, 1), trio.run(costs, 2)
    for row in (one, two):
        assert row["scrape_read_s"] > 0 and row["scrape_format_s"] > 0
        assert row["scrape_per_partition_bytes"] > row["scrape_bytes"]  # ~30 series per share-partition
    # Each group adds its series; per share-partition, three more share-partitions add theirs.
    assert two["scrape_bytes"] > one["scrape_bytes"]
    assert (two["scrape_per_partition_bytes"] - two["scrape_bytes"]
            > 1.5 * (one["scrape_per_partition_bytes"] - one["scrape_bytes"]))


def test_wakeups_a_fire_wakes_no_fetch_of_other_groups_where_a_broadcast_woke_them_all() -> None:
    row = cost_model.child_wakeups({"groups": 3, "partitions": 4, "fires": 5, "batch": 100})
    assert row["keyed_woken"] == 0
    assert row["broadcast_woken"] == 3  # each woken fetch looked once and waited again
    assert row["keyed_s"] > 0 and row["broadcast_s"] > 0
