"""client.ranges: progress marks coalesced into ranges, the flush rule, acknowledgement batches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.ranges import OffsetRanges, ProgressQueue, acknowledgement_batches

TP = ("topic-id", 0)
OTHER = ("topic-id", 1)


def test_contiguous_marks_coalesce_into_one_batch():
    queue = ProgressQueue(max_batches=100)
    for offset in (5, 7, 6, 6, 9):
        queue.add(TP, offset)
    assert queue.batches == 2
    assert queue.drain() == {TP: [(5, 7), (9, 9)]}
    assert queue.batches == 0 and not queue


def test_a_mark_bridging_two_ranges_merges_them():
    queue = ProgressQueue(max_batches=100)
    for offset in (1, 2, 4, 5):
        queue.add(TP, offset)
    assert queue.batches == 2
    queue.add(TP, 3)
    assert queue.batches == 1
    assert queue.drain() == {TP: [(1, 5)]}


def test_partitions_are_kept_apart():
    queue = ProgressQueue(max_batches=100)
    queue.add(TP, 1)
    queue.add(OTHER, 2)
    assert queue.batches == 2
    assert queue.drain() == {TP: [(1, 1)], OTHER: [(2, 2)]}


def test_flush_is_due_only_when_more_than_the_maximum_batches_are_pending():
    queue = ProgressQueue(max_batches=2)
    assert queue.add(TP, 0) is False
    assert queue.add(TP, 10) is False
    assert queue.add(TP, 11) is False  # coalesced: still two batches
    assert queue.add(TP, 20) is True  # a third batch: more than two pending


def test_zero_maximum_flushes_on_every_mark():
    queue = ProgressQueue(max_batches=0)
    assert queue.add(TP, 0) is True


def test_requeue_merges_with_marks_queued_since():
    queue = ProgressQueue(max_batches=100)
    queue.add(TP, 1)
    drained = queue.drain()
    queue.add(TP, 2)
    queue.requeue(drained)
    assert queue.batches == 1
    assert queue.drain() == {TP: [(1, 2)]}


@given(st.lists(st.integers(0, 200), max_size=80))
def test_offset_ranges_hold_exactly_the_added_offsets_as_maximal_runs(offsets):
    ranges = OffsetRanges()
    for offset in offsets:
        ranges.add(offset)
    runs = ranges.ranges()
    covered = {o for first, last in runs for o in range(first, last + 1)}
    assert covered == set(offsets)
    assert all(runs[i][1] + 1 < runs[i + 1][0] for i in range(len(runs) - 1))  # disjoint, never adjacent
    assert all(offset in ranges for offset in offsets)
    assert ranges.offsets() == len(set(offsets))


def test_empty_range_is_refused():
    with pytest.raises(ValueError):
        OffsetRanges().add(5, 4)


def test_acknowledgement_batches_are_runs_of_one_type():
    types = {0: 1, 1: 1, 2: 2, 3: 2, 5: 2, 6: 3, 7: 1}
    assert acknowledgement_batches(types) == [(0, 1, 1), (2, 3, 2), (5, 5, 2), (6, 6, 3), (7, 7, 1)]
    assert acknowledgement_batches({}) == []
