"""Cumulative ShareUpdates: the diff against the last durable snapshot, and when a snapshot is written instead."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.share_events import ArchiveReason
from proxy.share.partition import PartitionConfig, PartitionSnapshot, PersistedBatch, SharePartition, StateDelta
from proxy.share.state_delta import DeltaBase, DeltaPolicy, _cumulative_delta, cumulative_delta, plan, splice
from proxy.share.states import RecordState

A, Q, K, D, X, P = (RecordState.AVAILABLE, RecordState.ACQUIRED, RecordState.ACKNOWLEDGED, RecordState.ARCHIVING,
                    RecordState.ARCHIVED, RecordState.IN_PROGRESS)


def b(first, last, state, count, *rest, **kw) -> PersistedBatch:
    return PersistedBatch(first, last, state, count, *rest, **kw)


def replayed(base: PartitionSnapshot, *updates: StateDelta) -> PartitionSnapshot:
    """What a restart rebuilds from the snapshot and the updates after it."""
    return SharePartition.from_persisted(PartitionConfig(), base, updates).snapshot()


def rebuilt(snapshot: PartitionSnapshot) -> PartitionSnapshot:
    return SharePartition.from_persisted(PartitionConfig(), snapshot).snapshot()


# ----- cumulative_delta ----------------------------------------------------------------------------


def test_an_unchanged_state_gives_an_update_with_the_spso_and_no_batches():
    state = PartitionSnapshot(10, (b(12, 12, A, 1), b(13, 20, K, 1)))
    assert cumulative_delta(state, state) == StateDelta(10, ())


def test_only_the_offsets_whose_view_changed_are_carried():
    base = PartitionSnapshot(10, (b(10, 19, A, 1),))
    current = PartitionSnapshot(10, (b(10, 14, A, 1), b(15, 15, K, 2), b(16, 19, A, 1)))
    delta = cumulative_delta(base, current)
    assert delta == StateDelta(10, (b(15, 15, K, 2),))
    assert replayed(base, delta) == rebuilt(current)


def test_a_delivery_count_change_alone_is_a_change():
    base = PartitionSnapshot(0, (b(3, 9, A, 1),))
    current = PartitionSnapshot(0, (b(3, 5, A, 1), b(6, 9, A, 2)))
    assert cumulative_delta(base, current).state_batches == (b(6, 9, A, 2),)


def test_the_spso_moves_and_nothing_below_it_is_carried():
    base = PartitionSnapshot(10, (b(10, 10, A, 1), b(11, 11, K, 1), b(15, 15, A, 2)))
    current = PartitionSnapshot(12, (b(15, 15, A, 2),))
    delta = cumulative_delta(base, current)
    assert delta == StateDelta(12, ())
    assert replayed(base, delta) == rebuilt(current)


def test_a_batch_straddling_the_new_spso_is_compared_from_the_spso_on():
    base = PartitionSnapshot(0, (b(0, 9, A, 1),))
    current = PartitionSnapshot(5, (b(5, 9, A, 2),))
    delta = cumulative_delta(base, current)
    assert delta == StateDelta(5, (b(5, 9, A, 2),))
    assert replayed(base, delta) == rebuilt(current)


def test_records_back_to_available_count_0_are_carried_as_an_explicit_available_0_batch():
    # e.g. a staged acceptance of records delivered once, rolled back after a write that may have landed
    base = PartitionSnapshot(10, (b(12, 13, K, 1), b(14, 20, A, 2)))
    current = PartitionSnapshot(10, (b(14, 20, A, 2),))
    delta = cumulative_delta(base, current)
    assert delta == StateDelta(10, (b(12, 13, A, 0),))
    assert replayed(base, delta) == rebuilt(current) == current


def test_an_explicit_available_0_batch_at_the_end_rebuilds_the_same_engine_as_the_gap():
    base = PartitionSnapshot(0, (b(2, 3, A, 1), b(8, 9, K, 1)))
    current = PartitionSnapshot(0, (b(2, 3, A, 1),))
    delta = cumulative_delta(base, current)
    assert delta.state_batches == (b(8, 9, A, 0),)
    with_update = SharePartition.from_persisted(PartitionConfig(), base, [delta])
    alone = SharePartition.from_persisted(PartitionConfig(), current)
    assert list(with_update.in_flight()) == list(alone.in_flight())
    assert with_update.end_offset == alone.end_offset == 4


def test_in_progress_batches_are_carried_with_owner_and_times():
    base = PartitionSnapshot(0, (b(0, 4, P, 1, 100, 150, "m1"), b(5, 9, A, 1)))
    current = PartitionSnapshot(0, (b(0, 4, P, 1, 100, 180, "m1"), b(5, 9, P, 2, 170, 170, "m2")))
    delta = cumulative_delta(base, current)
    assert delta.state_batches == current.state_batches
    assert replayed(base, delta) == rebuilt(current)


def test_archiving_batches_are_carried_with_their_reason():
    base = PartitionSnapshot(0, (b(0, 1, A, 1),))
    current = PartitionSnapshot(0, (b(0, 0, D, 2, archive_reason=ArchiveReason.REJECTED),
                                    b(1, 1, D, 5, archive_reason=ArchiveReason.DELIVERY_LIMIT)))
    delta = cumulative_delta(base, current)
    assert delta.state_batches == current.state_batches
    assert replayed(base, delta) == rebuilt(current)
    # The reason alone differing is a change.
    again = PartitionSnapshot(0, (b(0, 1, D, 2, archive_reason=ArchiveReason.DELIVERY_LIMIT),))
    assert cumulative_delta(PartitionSnapshot(0, (b(0, 1, D, 2, archive_reason=ArchiveReason.REJECTED),)),
                            again).state_batches == again.state_batches


def test_carried_ranges_come_again_with_their_current_view_even_when_back_to_the_base():
    base = PartitionSnapshot(0, (b(2, 5, A, 1),))
    first = PartitionSnapshot(0, (b(2, 3, A, 1), b(4, 5, K, 1)))
    u1 = cumulative_delta(base, first)
    assert u1.state_batches == (b(4, 5, K, 1),)
    # Back to the base's view at 4-5 (no path does this today; the update must still supersede u1).
    u2 = cumulative_delta(base, base, [(4, 5)])
    assert u2.state_batches == (b(4, 5, A, 1),)
    assert replayed(base, u1, u2) == replayed(base, u2) == rebuilt(base)
    # A carried range where nothing is now: back to Available, count 0.
    assert cumulative_delta(base, base, [(7, 8)]).state_batches == (b(7, 8, A, 0),)
    # Carried ranges below the SPSO are dropped, straddling ones clipped.
    moved = PartitionSnapshot(5, (b(5, 5, A, 1),))
    assert cumulative_delta(base, moved, [(0, 6)]).state_batches == (b(5, 5, A, 1), b(6, 6, A, 0))


def test_a_reset_to_an_earlier_spso_carries_what_differs_above_it():
    base = PartitionSnapshot(50, (b(52, 60, K, 1),))
    current = PartitionSnapshot(0, ())
    delta = cumulative_delta(base, current)
    assert delta == StateDelta(0, (b(52, 60, A, 0),))
    assert replayed(base, delta) == rebuilt(current)


def test_many_scattered_changes_in_a_fragmented_window():
    base = PartitionSnapshot(0, tuple(b(o, o, K, 1) for o in range(1, 200, 2)))
    current = PartitionSnapshot(0, tuple(b(o, o, K, 1) for o in range(1, 200, 2) if o % 10 != 1)
                                + (b(100, 100, A, 3),))
    current = PartitionSnapshot(0, tuple(sorted(current.state_batches, key=lambda x: x.first_offset)))
    delta = cumulative_delta(base, current)
    assert replayed(base, delta) == rebuilt(current)
    assert len(delta.state_batches) == 21  # 20 accepts undone (Available, count 0) and offset 100


# ----- plan: update or snapshot --------------------------------------------------------------------

FRAGMENTED = PartitionSnapshot(0, tuple(b(o, o, K, 1) for o in range(1, 41, 2)))  # 20 batches
CHANGED = PartitionSnapshot(0, FRAGMENTED.state_batches + (b(50, 50, K, 1),))


def base(snapshot=FRAGMENTED, **kw) -> DeltaBase:
    return DeltaBase(snapshot, epoch=4, state_epoch=0, create_timestamp=1, **kw)


def test_no_durable_base_means_a_snapshot():
    assert plan(None, CHANGED, DeltaPolicy()) is None


def test_a_clearly_smaller_update_is_planned_over_the_base():
    assert plan(base(), CHANGED, DeltaPolicy()) == StateDelta(0, (b(50, 50, K, 1),))


def test_a_snapshot_after_snapshot_every_updates():
    policy = DeltaPolicy(snapshot_every=3)
    assert plan(base(updates=2), CHANGED, policy) is not None
    assert plan(base(updates=3), CHANGED, policy) is None


def test_a_small_snapshot_is_an_update_by_default_and_a_snapshot_below_min_snapshot_batches():
    # The easy case (in-order accepts): the snapshot has next to no batches.
    small = PartitionSnapshot(7, (b(9, 9, A, 1),))
    before = base(PartitionSnapshot(5, (b(9, 9, A, 1),)))
    assert plan(before, small, DeltaPolicy()) == StateDelta(7, ())
    assert plan(before, small, DeltaPolicy(min_snapshot_batches=8)) is None


def test_a_small_window_writes_an_update_even_when_it_carries_every_batch():
    # The easy case: the window holds the batch acquired since the base, and nothing else.
    base_window = base(PartitionSnapshot(5, (b(5, 9, A, 1),)))
    next_batch = PartitionSnapshot(10, (b(10, 19, A, 1),))
    assert plan(base_window, next_batch, DeltaPolicy()) == StateDelta(10, (b(10, 19, A, 1),))
    assert plan(base_window, next_batch, DeltaPolicy(halves_from_batches=1)) is None


def test_an_update_carrying_more_than_half_the_snapshots_batches_is_a_snapshot():
    every_other_changed = PartitionSnapshot(0, tuple(b(o, o, K, 2 if o % 4 == 1 else 1) for o in range(1, 41, 2)))
    assert plan(base(), every_other_changed, DeltaPolicy()) is not None  # 10 of 20
    most_changed = PartitionSnapshot(0, tuple(b(o, o, K, 2 if o % 8 != 7 else 1) for o in range(1, 41, 2)))
    assert plan(base(), most_changed, DeltaPolicy()) is None


def test_the_base_counts_updates_and_remembers_what_the_newest_one_carried():
    delta = StateDelta(0, (b(50, 50, K, 1), b(60, 62, A, 0)))
    after = base(updates=1).after(delta)
    assert after.updates == 2 and after.carried == ((50, 50), (60, 62))
    assert after.snapshot is FRAGMENTED and after.epoch == 4


def test_the_policy_refuses_a_snapshot_interval_below_one():
    with pytest.raises(ValueError):
        DeltaPolicy(snapshot_every=0)


# ----- against a per-offset reference ------------------------------------------------------------------

CONTENTS = [(A, 1), (A, 2), (K, 1), (X, 3), (P, 1, 100, 120, "m1"), (P, 1, 100, 130, "m1"),
            (D, 2, -1, -1, None, ArchiveReason.REJECTED)]


@st.composite
def snapshots(draw) -> PartitionSnapshot:
    """Sorted, disjoint, coalesced batches over offsets 0-59 (gaps allowed), and an SPSO."""
    start = draw(st.integers(0, 20))
    batches: list[PersistedBatch] = []
    offset = start
    while offset < 60:
        size = draw(st.integers(1, 6))
        if draw(st.booleans()):
            content = draw(st.sampled_from(CONTENTS))
            if not (batches and batches[-1].last_offset == offset - 1 and batches[-1].content == b(0, 0, *content).content):
                batches.append(b(offset, min(offset + size, 60) - 1, *content))
        offset += size
    return PartitionSnapshot(start, tuple(batches))


def per_offset(snapshot: PartitionSnapshot) -> dict[int, tuple]:
    return {o: batch.content for batch in snapshot.state_batches for o in range(batch.first_offset, batch.last_offset + 1)}


@settings(max_examples=300, deadline=None)
@given(snapshots(), snapshots(), st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=3))
def test_the_delta_carries_exactly_the_changed_and_carried_offsets_and_replays_to_the_current_state(
        base, current, carried):
    carried = [(first, first + size) for first, size in carried]
    delta = cumulative_delta(base, current, carried)
    old, new = per_offset(base), per_offset(current)
    nothing = b(0, 0, A, 0).content
    expected = {o for o in set(old) | set(new) if o >= current.start_offset and old.get(o) != new.get(o)}
    expected |= {o for first, last in carried for o in range(max(first, current.start_offset), last + 1)}
    carried_offsets = {o: batch.content for batch in delta.state_batches
                       for o in range(batch.first_offset, batch.last_offset + 1)}
    assert set(carried_offsets) == expected
    assert all(view == new.get(o, nothing) for o, view in carried_offsets.items())
    assert delta.start_offset == current.start_offset
    assert replayed(base, delta) == rebuilt(current)


def covering(offsets: set[int]) -> list[tuple[int, int]]:
    """Sorted, merged ranges of exactly these offsets."""
    ranges: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if ranges and ranges[-1][1] + 1 == o:
            ranges[-1] = (ranges[-1][0], o)
        else:
            ranges.append((o, o))
    return ranges


def cut(snapshot: PartitionSnapshot, ranges: list[tuple[int, int]]) -> tuple[PersistedBatch, ...]:
    """What SharePartition.persisted_view gives over `ranges` for the state `snapshot`: its batches cut to them."""
    return tuple(PersistedBatch(max(x.first_offset, first), min(x.last_offset, last), *x.content)
                 for first, last in ranges for x in snapshot.state_batches
                 if x.first_offset <= last and x.last_offset >= first)


def from_spso(snapshot: PartitionSnapshot, start: int) -> PartitionSnapshot:
    """The same state with its SPSO raised to ``start`` (batches below it dropped)."""
    if snapshot.start_offset >= start:
        return snapshot
    return PartitionSnapshot(start, tuple(x for x in snapshot.state_batches if x.first_offset >= start))


@settings(max_examples=300, deadline=None)
@given(snapshots(), snapshots(), st.sets(st.integers(0, 64), max_size=12))
def test_the_snapshot_spliced_from_the_changed_offsets_is_the_current_one(latest, current, extra):
    """What the commit pipeline rebuilds from the previous write's snapshot and the engine's view
    of the offsets changed since (every offset whose view changed, and any others) is the current
    snapshot, batch for batch."""
    current = from_spso(current, latest.start_offset)
    old, new = per_offset(latest), per_offset(current)
    changed = [(max(first, current.start_offset), last)
               for first, last in covering({o for o in set(old) | set(new) if old.get(o) != new.get(o)} | extra)
               if last >= current.start_offset]
    assert splice(latest, current.start_offset, changed, cut(current, changed)) == current


@settings(max_examples=300, deadline=None)
@given(snapshots(), snapshots(), st.sets(st.integers(0, 64), max_size=12),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=3))
def test_diffing_within_the_changed_offsets_gives_the_whole_windows_update(base, current, extra, carried):
    """Offsets outside ``within`` that differ from the base are all carried (the newest update
    carried them): comparing only ``within`` gives the update (and the plan) the whole diff gives."""
    carried = tuple((first, first + size) for first, size in carried)
    carried_offsets = {o for first, last in carried for o in range(first, last + 1)}
    old, new = per_offset(base), per_offset(current)
    uncarried = {o for o in set(old) | set(new) if old.get(o) != new.get(o)} - carried_offsets
    within = covering(uncarried | extra)
    assert cumulative_delta(base, current, carried, within) == cumulative_delta(base, current, carried)
    delta_base = DeltaBase(base, 1, 0, 0, carried=carried)
    policy = DeltaPolicy(halves_from_batches=2)
    assert plan(delta_base, current, policy, within) == plan(delta_base, current, policy)


def test_the_latest_snapshot_is_the_base_then_the_view_of_the_newest_update():
    base = DeltaBase(PartitionSnapshot(0, (b(0, 1, K, 1),)), 1, 0, 0)
    assert base.latest == base.snapshot
    view = PartitionSnapshot(2, ())
    assert base.after(StateDelta(2, ()), view).latest == view
    assert base.after(StateDelta(2, ())).latest is None  # unknown: the next write is not spliced


def test_splice_joins_equal_neighbours_where_the_view_meets_the_base():
    base = PartitionSnapshot(0, (b(0, 4, K, 1), b(5, 5, A, 1), b(6, 9, K, 1)))
    spliced = splice(base, 0, [(5, 5)], (b(5, 5, K, 1),))
    assert spliced == PartitionSnapshot(0, (b(0, 9, K, 1),))


def reference_plan(base: DeltaBase, current: PartitionSnapshot, policy: DeltaPolicy,
                   within: list[tuple[int, int]] | None) -> StateDelta | None:
    """plan's rules applied to the whole update, built first (as plan did before it gave up early)."""
    batches = len(current.state_batches)
    if base.updates >= policy.snapshot_every or batches < policy.min_snapshot_batches:
        return None
    delta = cumulative_delta(base.snapshot, current, base.carried, within)
    if batches >= policy.halves_from_batches and 2 * len(delta.state_batches) > batches:
        return None
    return delta


@settings(max_examples=400, deadline=None)
@given(snapshots(), snapshots(), st.sets(st.integers(0, 64), max_size=12),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=3), st.integers(0, 12), st.booleans())
def test_the_plan_giving_up_early_decides_as_the_whole_update_would(base, current, extra, carried, halves_from,
                                                                      narrowed):
    """plan stops diffing once more than half the snapshot's batches are certain to change (each
    changed batch gives the update one of its own at least): the same decision, and the same update,
    as building the whole update and counting it."""
    carried = tuple((first, first + size) for first, size in carried)
    carried_offsets = {o for first, last in carried for o in range(first, last + 1)}
    old, new = per_offset(base), per_offset(current)
    within = covering(({o for o in set(old) | set(new) if old.get(o) != new.get(o)} - carried_offsets) | extra) \
        if narrowed else None
    delta_base = DeltaBase(base, 1, 0, 0, carried=carried)
    policy = DeltaPolicy(halves_from_batches=halves_from)
    assert plan(delta_base, current, policy, within) == reference_plan(delta_base, current, policy, within)


def test_the_diff_gives_up_on_the_batch_past_half_and_not_before():
    """Twenty batches, one offset each: ten changed is an update (the rule of halves' edge), and
    the diff itself gives up on the eleventh changed batch."""
    base = PartitionSnapshot(0, tuple(b(2 * i, 2 * i, A, 1) for i in range(20)))
    ten = PartitionSnapshot(0, tuple(b(2 * i, 2 * i, K if i < 10 else A, 1) for i in range(20)))
    eleven = PartitionSnapshot(0, tuple(b(2 * i, 2 * i, K if i < 11 else A, 1) for i in range(20)))
    delta_base, policy = DeltaBase(base, 1, 0, 0), DeltaPolicy(halves_from_batches=8)
    assert plan(delta_base, ten, policy).state_batches == ten.state_batches[:10]
    assert plan(delta_base, eleven, policy) is None
    assert _cumulative_delta(base, ten, (), None, 10) == cumulative_delta(base, ten)
    assert _cumulative_delta(base, eleven, (), None, 10) is None


def test_a_batch_cut_in_two_by_the_changed_ranges_counts_once_when_a_carried_range_joins_them():
    """Diffing within the changed ranges sees a changed batch as two pieces; the carried range
    between them joins them into one batch of the update: one, not two, towards the limit."""
    base = PartitionSnapshot(0, (b(0, 9, A, 1), b(10, 10, A, 1), b(12, 12, A, 1)))
    current = PartitionSnapshot(0, (b(0, 9, K, 1), b(10, 10, A, 1), b(12, 12, A, 1)))
    delta_base = DeltaBase(base, 1, 0, 0, carried=((3, 5),))
    delta = plan(delta_base, current, DeltaPolicy(halves_from_batches=2), [(0, 2), (6, 9)])
    assert delta is not None and delta.state_batches == (b(0, 9, K, 1),)
