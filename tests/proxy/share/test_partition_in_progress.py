"""Unit tests for the IN_PROGRESS state in the share-partition engine (draft KIP KAFKA-20458).

Times are the engine's ms clock. The config uses short thresholds: staleness 4000 ms (sweep
every 1000 ms), max extension 10000 ms, rebalance grace 2000 ms, lock 3000 ms.
"""

from __future__ import annotations

import pytest

from proxy.share.partition import (
    INVALID_RECORD_STATE,
    INVALID_REQUEST,
    AckRange,
    BatchHeader,
    InFlightRun,
    InProgressRelease,
    PartitionConfig,
    PersistedBatch,
    ReleaseReason,
    SharePartition,
    ShareStateError,
    StateDelta,
)
from proxy.share.states import TERMINAL_STATES, TRANSITIONS, AcknowledgeType, Event, RecordState, STATE_TRAITS

AVAILABLE = RecordState.AVAILABLE
ACQUIRED = RecordState.ACQUIRED
ACKNOWLEDGED = RecordState.ACKNOWLEDGED
ARCHIVED = RecordState.ARCHIVED
IN_PROGRESS = RecordState.IN_PROGRESS
GAP, ACCEPT, RELEASE, REJECT, RENEW = (int(t) for t in AcknowledgeType)

STALE_MS, MAX_MS, GRACE_MS, LOCK_MS = 4_000, 10_000, 2_000, 3_000
CONFIG = PartitionConfig(record_lock_duration_ms=LOCK_MS, in_progress_staleness_threshold_ms=STALE_MS,
                         in_progress_max_lock_extension_ms=MAX_MS, in_progress_rebalance_grace_ms=GRACE_MS)


def held(config: PartitionConfig = CONFIG, *, now: int = 0) -> SharePartition:
    """Offsets 0-9 acquired by m1 (delivery 1), 10-19 by m2, at ``now``."""
    p = SharePartition(config, 0)
    p.acquire("m1", [BatchHeader(0, 9), BatchHeader(10, 19)], now=now, max_records=10)
    p.acquire("m2", [BatchHeader(10, 19)], now=now, max_records=10)
    return p


def ip(first: int, last: int, count: int, start: int, last_progress: int, member: str = "m1") -> PersistedBatch:
    return PersistedBatch(first, last, IN_PROGRESS, count, start, last_progress, member)


def ack(p: SharePartition, member: str, first: int, last: int, *types: int, now: int) -> StateDelta | None:
    return p.acknowledge(member, [AckRange(first, last, tuple(types))], now=now)


def rebuilt(p: SharePartition) -> SharePartition:
    return SharePartition.from_persisted(p.config, p.snapshot())


# ----- the states table -----------------------------------------------------------------------


def test_in_progress_traits_owner_no_acquisition_lock_persisted_not_terminal():
    traits = STATE_TRAITS[IN_PROGRESS]
    assert int(IN_PROGRESS) == 5
    assert (traits.holds_owner, traits.holds_lock, traits.persisted, traits.terminal, traits.progress_held) == \
        (True, False, True, False, True)
    assert IN_PROGRESS not in TERMINAL_STATES


@pytest.mark.parametrize("state,event,new_state,archive_at_limit", [
    (ACQUIRED, Event.MARK, IN_PROGRESS, False),
    (IN_PROGRESS, Event.MARK, IN_PROGRESS, False),
    (IN_PROGRESS, Event.RENEW, IN_PROGRESS, False),
    (IN_PROGRESS, Event.ACCEPT, ACKNOWLEDGED, False),
    (IN_PROGRESS, Event.RELEASE, AVAILABLE, True),
    (IN_PROGRESS, Event.REJECT, ARCHIVED, False),
    (IN_PROGRESS, Event.GAP, ARCHIVED, False),
    (IN_PROGRESS, Event.STALE, AVAILABLE, True),
    (IN_PROGRESS, Event.MAX_EXTENSION, AVAILABLE, True),
    (IN_PROGRESS, Event.GRACE_EXPIRED, AVAILABLE, True),
    (IN_PROGRESS, Event.ARCHIVE, ARCHIVED, False),
])
def test_in_progress_rows_never_change_the_delivery_count(state, event, new_state, archive_at_limit):
    move = TRANSITIONS[(state, event)]
    assert (move.new_state, move.delivery_delta, move.archive_at_limit) == (new_state, 0, archive_at_limit)


def test_no_member_left_row_and_no_mark_from_available_or_terminal_states():
    assert (IN_PROGRESS, Event.MEMBER_LEFT) not in TRANSITIONS
    assert (IN_PROGRESS, Event.LOCK_EXPIRED) not in TRANSITIONS
    assert (IN_PROGRESS, Event.ACQUIRE) not in TRANSITIONS
    for state in (AVAILABLE, ACKNOWLEDGED, ARCHIVED):
        assert (state, Event.MARK) not in TRANSITIONS


def test_config_defaults_and_bounds():
    c = PartitionConfig()
    assert (c.in_progress_staleness_threshold_ms, c.in_progress_max_lock_extension_ms,
            c.in_progress_rebalance_grace_ms, c.sweep_interval_ms) == (90_000, 1_800_000, 5_000, 22_500)
    for bad in ({"in_progress_staleness_threshold_ms": 3}, {"in_progress_max_lock_extension_ms": 0},
                {"in_progress_rebalance_grace_ms": -1}):
        with pytest.raises(ValueError):
            PartitionConfig(**bad)


# ----- marking ----------------------------------------------------------------------------------


def test_mark_moves_acquired_to_in_progress_and_persists_owner_and_times():
    p = held()
    delta = p.mark_in_progress("m1", [(2, 4)], now=500)
    assert delta == StateDelta(-1, (ip(2, 4, 1, 500, 500),))
    assert p.record_state(3) == (IN_PROGRESS, 1, "m1")
    assert p.record_state(5) == (ACQUIRED, 1, "m1")
    assert p.in_progress_count() == 3
    runs = [r for r in p.in_flight_locked() if r.state is IN_PROGRESS]
    assert runs == [InFlightRun(2, 4, IN_PROGRESS, 1, "m1", 0, -1, 500, 500, -1)]
    # The snapshot carries them as state 5 with owner and times; Acquired ones as before acquisition.
    assert p.snapshot().state_batches == (ip(2, 4, 1, 500, 500),)


def test_in_progress_records_are_not_under_the_acquisition_lock():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=500)
    assert p.expire(LOCK_MS + 1) == StateDelta(-1, (PersistedBatch(10, 19, AVAILABLE, 1),))  # m2's only
    assert p.record_state(0) == (IN_PROGRESS, 1, "m1")
    assert p.record_state(10) == (AVAILABLE, 1, None)


def test_mark_refresh_keeps_start_and_moves_last_progress():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=500)
    assert p.mark_in_progress("m1", [(0, 4)], now=1500) == StateDelta(-1, (ip(0, 4, 1, 500, 1500),))
    assert p.snapshot().state_batches == (ip(0, 4, 1, 500, 1500), ip(5, 9, 1, 500, 500))


def test_mark_validates_owner_state_and_range_all_or_nothing():
    p = held()
    with pytest.raises(ShareStateError) as err:
        p.mark_in_progress("m1", [(0, 3), (9, 10)], now=1)  # 10 belongs to m2
    assert err.value.error_code == INVALID_RECORD_STATE
    assert p.record_state(0) == (ACQUIRED, 1, "m1")  # nothing applied
    for ranges in ([(5, 3)], [(4, 6), (6, 8)], [(6, 8), (0, 2)], [(-1, 2)]):
        with pytest.raises(ShareStateError) as err:
            p.mark_in_progress("m1", ranges, now=1)
        assert err.value.error_code == INVALID_REQUEST
    with pytest.raises(ShareStateError) as err:
        p.mark_in_progress("m1", [(15, 25)], now=1)  # beyond SPEO
    assert err.value.error_code == INVALID_RECORD_STATE
    ack(p, "m1", 0, 0, ACCEPT, now=1)  # SPSO 1: offset 0 is finished
    with pytest.raises(ShareStateError) as err:
        p.mark_in_progress("m1", [(0, 1)], now=2)  # a worker must learn it no longer holds 0
    assert err.value.error_code == INVALID_RECORD_STATE
    assert p.record_state(1) == (ACQUIRED, 1, "m1")  # nothing applied
    assert p.mark_in_progress("m1", [(1, 1)], now=2) == StateDelta(-1, (ip(1, 1, 1, 2, 2),))


def test_mark_of_an_available_record_is_refused():
    p = held()
    ack(p, "m1", 0, 0, RELEASE, now=1)
    with pytest.raises(ShareStateError) as err:
        p.mark_in_progress("m1", [(0, 0)], now=2)
    assert err.value.error_code == INVALID_RECORD_STATE


def test_mark_past_the_max_extension_is_refused_naming_the_config():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=0)
    p.mark_in_progress("m1", [(0, 9)], now=MAX_MS)  # exactly at the limit: allowed
    with pytest.raises(ShareStateError) as err:
        p.mark_in_progress("m1", [(0, 0), (5, 5)], now=MAX_MS + 1)
    assert err.value.error_code == INVALID_RECORD_STATE
    assert "share.in.progress.max.lock.extension.ms" in str(err.value)
    with pytest.raises(ShareStateError):
        ack(p, "m1", 0, 0, RENEW, now=MAX_MS + 1)  # a renew is a mark: same rule


# ----- acknowledging IN_PROGRESS records ----------------------------------------------------------


def test_accept_release_reject_gap_on_in_progress_records():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=100)
    assert ack(p, "m1", 0, 1, ACCEPT, now=200) == StateDelta(2, ())
    assert ack(p, "m1", 2, 2, RELEASE, now=200) == StateDelta(-1, (PersistedBatch(2, 2, AVAILABLE, 1),))
    assert ack(p, "m1", 3, 3, REJECT, now=200) == StateDelta(-1, (PersistedBatch(3, 3, ARCHIVED, 1),))
    assert ack(p, "m1", 4, 4, GAP, now=200) == StateDelta(-1, (PersistedBatch(4, 4, ARCHIVED, 1),))
    assert p.in_progress_count() == 5
    assert p.drain_in_progress_finished() == [(100, 5)]  # (ms in progress, records)
    assert p.drain_in_progress_finished() == []
    with pytest.raises(ShareStateError) as err:
        ack(p, "m2", 5, 5, ACCEPT, now=200)  # another member's in-progress record
    assert err.value.error_code == INVALID_RECORD_STATE


def test_renew_of_in_progress_refreshes_progress_and_is_persisted():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=100)
    assert ack(p, "m1", 0, 9, RENEW, now=900) == StateDelta(-1, (ip(0, 9, 1, 100, 900),))
    assert p.record_state(0) == (IN_PROGRESS, 1, "m1")


def test_mixed_renew_of_acquired_and_in_progress_records():
    p = held()
    p.mark_in_progress("m1", [(0, 4)], now=100)
    assert ack(p, "m1", 0, 9, RENEW, now=900) == StateDelta(-1, (ip(0, 4, 1, 100, 900),))
    assert p.record_state(5) == (ACQUIRED, 1, "m1")
    assert p.next_deadline() == 1100  # the first sweep: threshold/4 after the first mark
    deadlines = {r.first_offset: r.lock_deadline for r in p.in_flight_locked()}
    assert deadlines[5] == 900 + LOCK_MS


# ----- the sweep ----------------------------------------------------------------------------------


def test_sweep_is_due_every_quarter_threshold_and_releases_stale_records_keeping_the_count():
    p = held()
    p.mark_in_progress("m1", [(0, 4)], now=2000)
    p.mark_in_progress("m1", [(5, 9)], now=2000)
    p.expire(LOCK_MS)  # m2's records go; only m1's in-progress ones remain held
    assert p.next_deadline() == 3000  # first sweep: threshold/4 after the first mark
    assert p.release_in_progress(2999) == []
    p.mark_in_progress("m1", [(5, 9)], now=5000)
    # Sweeps at 3000, 4000, 5000, 6000 find nothing stale (stale means > 4000 ms without progress).
    for t in (3000, 4000, 5000, 6000):
        assert p.release_in_progress(t) == []
        assert p.next_deadline() == t + 1000
    released = p.release_in_progress(7000)  # 0-4: 5000 ms without progress
    assert released == [InProgressRelease(ReleaseReason.STALENESS,
                                          StateDelta(-1, (PersistedBatch(0, 4, AVAILABLE, 1),)), 5)]
    assert p.record_state(0) == (AVAILABLE, 1, None)  # the count is left as it is
    assert p.stale_count(9001) == 5 and p.stale_count(9000) == 0
    assert p.in_progress_count() == 5


def test_sweep_archives_at_the_delivery_limit():
    config = PartitionConfig(delivery_count_limit=2, in_progress_staleness_threshold_ms=STALE_MS)
    p = SharePartition(config, 0)
    p.acquire("m1", [BatchHeader(0, 0)], now=0, max_records=1)
    ack(p, "m1", 0, 0, RELEASE, now=0)
    p.acquire("m1", [BatchHeader(0, 0)], now=0, max_records=1)  # delivery 2 = the limit
    p.mark_in_progress("m1", [(0, 0)], now=0)
    assert p.release_in_progress(5000) == [
        InProgressRelease(ReleaseReason.STALENESS, StateDelta(1, ()), 1)]
    assert p.record_state(0) == (ARCHIVED, 0, None)  # below SPSO now


def test_max_extension_releases_regardless_of_progress_and_wins_over_staleness():
    p = held()
    p.mark_in_progress("m1", [(0, 4)], now=0)
    p.mark_in_progress("m1", [(5, 9)], now=4000)
    for t in range(1000, 9000, 1000):
        p.mark_in_progress("m1", [(0, 4)], now=t - 1)  # keep 0-4 fresh
        assert p.release_in_progress(t) == []
    assert [(r.reason, r.records) for r in p.release_in_progress(9000)] == [(ReleaseReason.STALENESS, 5)]  # 5-9
    p.mark_in_progress("m1", [(0, 4)], now=MAX_MS - 1)
    # 0-4 have fresh progress, but have been in progress since 0: released at the max extension.
    released = p.release_in_progress(MAX_MS)
    assert released == [InProgressRelease(ReleaseReason.MAX_EXTENSION,
                                          StateDelta(-1, (PersistedBatch(0, 4, AVAILABLE, 1),)), 5)]


def test_stale_and_over_extended_counts_as_max_extension():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=0)
    assert [(r.reason, r.records) for r in p.release_in_progress(MAX_MS)] == [(ReleaseReason.MAX_EXTENSION, 10)]
    assert p.next_deadline() == LOCK_MS  # m2's lock; no sweep once nothing is in progress


def test_reconfigure_applies_new_thresholds_at_the_next_sweep():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=0)
    assert p.release_in_progress(1000) == []
    p.reconfigure(PartitionConfig(record_lock_duration_ms=LOCK_MS, in_progress_staleness_threshold_ms=400))
    assert p.next_deadline() == 1100  # the shorter interval brings the sweep forward
    assert [(r.reason, r.records) for r in p.release_in_progress(1100)] == [(ReleaseReason.STALENESS, 10)]


# ----- member departure and the rebalance grace -----------------------------------------------------


def test_member_leaving_releases_acquired_and_stale_at_once_holds_fresh_for_grace():
    p = held()
    p.mark_in_progress("m1", [(0, 2)], now=0)  # will be stale at 5000
    p.mark_in_progress("m1", [(3, 5)], now=4500)  # fresh
    delta = p.release_member("m1", now=5000)
    assert delta == StateDelta(-1, (PersistedBatch(6, 9, AVAILABLE, 0),))  # acquired: count undone
    assert p.last_member_release == InProgressRelease(
        ReleaseReason.STALENESS, StateDelta(-1, (PersistedBatch(0, 2, AVAILABLE, 1),)), 3)
    assert p.record_state(3) == (IN_PROGRESS, 1, "m1")
    assert [r.grace_deadline for r in p.in_flight_locked() if r.state is IN_PROGRESS] == [5000 + GRACE_MS]
    p.expire(5000)  # m2's acquisition lock, out of the way
    assert p.next_deadline() == 1000  # the sweep due since 1000 (nobody called it): at once
    assert p.release_in_progress(5000) == []  # 0-2 are gone already, 3-5 are fresh
    assert p.next_deadline() == 6000  # the next sweep comes before the grace deadline (7000)
    assert p.release_in_progress(6000) == []
    # A second departure event does not extend the grace.
    assert p.release_member("m1", now=6500) is None and p.last_member_release is None
    released = p.release_in_progress(7000)
    assert released == [InProgressRelease(ReleaseReason.GRACE_EXPIRY,
                                          StateDelta(-1, (PersistedBatch(3, 5, AVAILABLE, 1),)), 3)]
    assert p.in_progress_count() == 0


def test_rejoin_within_grace_marks_and_acknowledges_its_records_again():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=0)
    p.release_member("m1", now=1000)
    p.mark_in_progress("m1", [(0, 4)], now=2000)  # the same member id back: grace cleared for these
    assert ack(p, "m1", 5, 5, ACCEPT, now=2500) == StateDelta(-1, (PersistedBatch(5, 5, ACKNOWLEDGED, 1),))
    released = p.release_in_progress(3000)
    assert [(r.reason, r.records) for r in released] == [(ReleaseReason.GRACE_EXPIRY, 4)]
    assert p.record_state(0) == (IN_PROGRESS, 1, "m1")
    assert p.record_state(6) == (AVAILABLE, 1, None)


def test_release_member_without_now_treats_in_progress_as_stale():
    p = held()
    p.mark_in_progress("m1", [(0, 4)], now=0)
    assert p.release_member("m1") == StateDelta(-1, (PersistedBatch(5, 9, AVAILABLE, 0),))
    assert p.last_member_release is not None and p.last_member_release.records == 5
    assert p.record_state(0) == (AVAILABLE, 1, None)


def test_other_members_in_progress_records_are_untouched_by_a_departure():
    p = held()
    p.mark_in_progress("m2", [(10, 19)], now=0)
    p.release_member("m1", now=100)
    assert p.record_state(10) == (IN_PROGRESS, 1, "m2")
    assert [r.grace_deadline for r in p.in_flight_locked() if r.state is IN_PROGRESS] == [-1]


# ----- staging -----------------------------------------------------------------------------------


def test_staged_mark_commit_keeps_and_rollback_restores_acquired_under_its_lock():
    p = held()
    staged = p.stage_mark_in_progress("m1", [(0, 4)], now=100)
    assert staged is not None and staged.change_id
    assert staged.delta == StateDelta(-1, (ip(0, 4, 1, 100, 100),))
    p.rollback(staged.change_id)
    assert p.record_state(0) == (ACQUIRED, 1, "m1")
    assert p.in_progress_count() == 0
    assert {r.first_offset: r.lock_deadline for r in p.in_flight_locked()}[0] == LOCK_MS
    assert p.expire(LOCK_MS) is not None and p.record_state(0) == (AVAILABLE, 1, None)
    q = held()
    staged = q.stage_mark_in_progress("m1", [(0, 4)], now=100)
    assert q.commit(staged.change_id) is None
    assert q.record_state(0) == (IN_PROGRESS, 1, "m1")


def test_staged_refresh_rollback_restores_previous_times():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=100)
    staged = p.stage_mark_in_progress("m1", [(0, 9)], now=900)
    p.rollback(staged.change_id)
    assert p.snapshot().state_batches == (ip(0, 9, 1, 100, 100),)
    assert p.in_progress_count() == 10


def test_staged_accept_of_in_progress_rollback_puts_it_back_in_progress():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=100)
    staged = p.stage_acknowledge("m1", [AckRange(0, 9, (ACCEPT,))], now=200)
    assert p.start_offset == 0  # not durable yet
    p.rollback(staged.change_id)
    assert p.record_state(0) == (IN_PROGRESS, 1, "m1")
    assert p.in_progress_count() == 10
    assert p.snapshot().state_batches == (ip(0, 9, 1, 100, 100),)


# ----- persistence ------------------------------------------------------------------------------


def test_snapshot_round_trip_keeps_in_progress_with_owner_and_times():
    p = held()
    p.mark_in_progress("m1", [(0, 4)], now=100)
    p.mark_in_progress("m2", [(12, 12)], now=300)
    q = rebuilt(p)
    assert q.snapshot() == p.snapshot()
    assert q.record_state(2) == (IN_PROGRESS, 1, "m1")
    assert q.record_state(12) == (IN_PROGRESS, 1, "m2")
    assert q.record_state(5) == (AVAILABLE, 0, None)  # Acquired is not persisted
    assert q.in_progress_count() == 6
    # The owner rejoining under the same member id keeps marking and acknowledges.
    q.mark_in_progress("m1", [(0, 4)], now=1000)
    assert ack(q, "m1", 0, 4, ACCEPT, now=1100) == StateDelta(5, ())
    # No grace from recovery: only staleness releases m2's record. The first sweep is due when the
    # first recovered record could go stale (m1's, marked at 100), then every threshold / 4.
    assert q.next_deadline() == 100 + STALE_MS + 1
    assert q.release_in_progress(100 + STALE_MS + 1) == []
    assert q.next_deadline() == 100 + STALE_MS + 1 + STALE_MS // 4
    assert [(r.reason, r.records) for r in q.release_in_progress(q.next_deadline())] == \
        [(ReleaseReason.STALENESS, 1)]


def test_from_persisted_in_progress_without_owner_is_delivered_again():
    q = SharePartition.from_persisted(CONFIG, type(held().snapshot())(0, (
        PersistedBatch(0, 4, IN_PROGRESS, 2, 10, 20, None), ip(5, 6, 1, 10, 20))))
    assert q.record_state(0) == (AVAILABLE, 2, None)
    assert q.record_state(5) == (IN_PROGRESS, 1, "m1")


def test_deltas_replayed_over_a_snapshot_equal_the_live_snapshot():
    p = held()
    base = p.snapshot()
    deltas = [p.mark_in_progress("m1", [(0, 9)], now=100), p.mark_in_progress("m1", [(3, 5)], now=200),
              ack(p, "m1", 0, 1, ACCEPT, now=300)]
    deltas += [r.delta for r in p.release_in_progress(5000)]
    q = SharePartition.from_persisted(CONFIG, base, [d for d in deltas if d is not None])
    assert q.snapshot() == p.snapshot()


def test_log_truncation_archives_in_progress_records():
    p = held()
    p.mark_in_progress("m1", [(0, 9)], now=0)
    assert p.advance_log_start(5) == StateDelta(5, ())
    assert p.in_progress_count() == 5
    assert p.drain_in_progress_finished() == [(0, 5)]


def test_spso_never_passes_in_progress_and_fetch_never_hands_it_out():
    p = held()
    p.mark_in_progress("m1", [(0, 0)], now=0)
    ack(p, "m1", 1, 9, ACCEPT, now=0)
    assert p.start_offset == 0
    p.release_member("m2", now=0)
    r = p.acquire("m3", [BatchHeader(0, 9), BatchHeader(10, 19)], now=0, max_records=100)
    assert [(a.first_offset, a.last_offset) for a in r.acquired] == [(10, 19)]


def test_newest_acquisition_ignores_in_progress_records():
    p = held()
    acquired_lock = p.newest_acquisition("m1", 0, 9)
    p.mark_in_progress("m1", [(0, 4)], now=100)
    assert p.newest_acquisition("m1", 0, 9) == acquired_lock  # 5-9 still under their acquisition
    assert p.newest_acquisition("m1", 0, 4) == 0


def test_in_flight_locked_splits_runs_by_in_progress_times_and_grace():
    p = held()
    p.mark_in_progress("m1", [(0, 3)], now=100)
    p.mark_in_progress("m1", [(2, 3)], now=200)
    p.release_member("m1", now=250)
    assert [(r.first_offset, r.last_offset, r.state, r.in_progress_start, r.last_progress, r.grace_deadline)
            for r in p.in_flight_locked() if r.first_offset < 10] == [
        (0, 1, IN_PROGRESS, 100, 100, 250 + GRACE_MS),
        (2, 3, IN_PROGRESS, 100, 200, 250 + GRACE_MS),
        (4, 9, AVAILABLE, -1, -1, -1),
    ]
