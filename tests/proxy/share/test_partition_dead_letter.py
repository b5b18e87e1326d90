"""Unit tests for ARCHIVING (KIP-1191 dead-letter queue) in the share-partition engine.

With ``PartitionConfig.dead_letter`` a reject or an archive at the delivery limit goes to ARCHIVING
(state 3): persisted, not terminal (the SPSO waits), never acquired, until the dead-letter writer
calls ``finish_archiving``.
"""

from __future__ import annotations

import pytest

from codec.share_events import ArchiveReason, EventKind
from proxy.share.partition import (
    INVALID_RECORD_STATE,
    AckRange,
    ArchivingRun,
    BatchHeader,
    PartitionConfig,
    PartitionSnapshot,
    PersistedBatch,
    RecordEvent,
    SharePartition,
    ShareStateError,
    StateDelta,
)
from proxy.share.states import STATE_TRAITS, TERMINAL_STATES, TRANSITIONS, AcknowledgeType, Event, RecordState

AVAILABLE = RecordState.AVAILABLE
ACQUIRED = RecordState.ACQUIRED
ACKNOWLEDGED = RecordState.ACKNOWLEDGED
ARCHIVING = RecordState.ARCHIVING
ARCHIVED = RecordState.ARCHIVED
IN_PROGRESS = RecordState.IN_PROGRESS
GAP, ACCEPT, RELEASE, REJECT, RENEW = (int(t) for t in AcknowledgeType)
REJECTED = ArchiveReason.REJECTED
LIMIT = ArchiveReason.DELIVERY_LIMIT
LOCK_MS = 30_000
DLQ = PartitionConfig(delivery_count_limit=2, dead_letter=True)


def held(config: PartitionConfig = DLQ) -> SharePartition:
    """Offsets 0-9 acquired by m1 (delivery 1), 10-19 by m2."""
    p = SharePartition(config, 0)
    p.acquire("m1", [BatchHeader(0, 9), BatchHeader(10, 19)], now=0, max_records=10)
    p.acquire("m2", [BatchHeader(10, 19)], now=0, max_records=10)
    return p


def ack(p: SharePartition, member: str, first: int, last: int, *types: int, now: int = 0) -> StateDelta | None:
    return p.acknowledge(member, [AckRange(first, last, tuple(types))], now=now)


def archiving_pb(first: int, last: int, count: int, reason: ArchiveReason) -> PersistedBatch:
    return PersistedBatch(first, last, ARCHIVING, count, archive_reason=reason)


def kinds(delta: StateDelta | None) -> list[tuple]:
    assert delta is not None
    return [(e.kind, e.first_offset, e.last_offset, e.reason) for e in delta.events]


# ----- the states table -----------------------------------------------------------------------


def test_archiving_is_state_3_persisted_not_terminal_ownerless_and_leaves_only_by_dead_letter():
    traits = STATE_TRAITS[ARCHIVING]
    assert int(ARCHIVING) == 3
    assert (traits.holds_owner, traits.holds_lock, traits.persisted, traits.terminal) == (False, False, True, False)
    assert ARCHIVING not in TERMINAL_STATES
    assert [event for state, event in TRANSITIONS if state is ARCHIVING] == [Event.DEAD_LETTER]
    assert TRANSITIONS[(ARCHIVING, Event.DEAD_LETTER)].new_state is ARCHIVED


# ----- entering ARCHIVING -----------------------------------------------------------------------


def test_reject_with_a_dead_letter_queue_goes_to_archiving_and_holds_the_spso():
    p = held()
    delta = ack(p, "m1", 0, 1, REJECT)
    assert delta == StateDelta(-1, (archiving_pb(0, 1, 1, REJECTED),))
    assert kinds(delta) == [(EventKind.REJECTED, 0, 1, ArchiveReason.NONE), (EventKind.ARCHIVING, 0, 1, REJECTED)]
    assert p.start_offset == 0  # the SPSO never passes ARCHIVING
    assert p.record_state(0) == (ARCHIVING, 1, None)
    assert p.archiving_count == 2
    assert p.archiving() == [ArchivingRun(0, 1, 1, REJECTED)]


def test_reject_without_a_dead_letter_queue_archives_directly():
    p = held(PartitionConfig(delivery_count_limit=2))
    delta = ack(p, "m1", 0, 1, REJECT)
    assert p.start_offset == 2 and p.archiving_count == 0 and p.archiving() == []
    assert kinds(delta) == [(EventKind.REJECTED, 0, 1, ArchiveReason.NONE), (EventKind.ARCHIVED, 0, 1, REJECTED)]


def test_release_and_lock_expiry_at_the_limit_go_to_archiving_below_it_available():
    p = held()
    ack(p, "m1", 0, 9, RELEASE)  # count 1 < limit 2: available again
    assert p.archiving_count == 0
    assert p.acquire("m1", [BatchHeader(0, 9)], now=0, max_records=10).acquired[0].delivery_count == 2
    delta = ack(p, "m1", 0, 0, RELEASE)
    assert delta.state_batches == (archiving_pb(0, 0, 2, LIMIT),)
    assert kinds(delta) == [(EventKind.RELEASED, 0, 0, ArchiveReason.NONE), (EventKind.ARCHIVING, 0, 0, LIMIT)]
    delta = p.expire(LOCK_MS)  # 1-9 (count 2) archive at the limit; 10-19 (count 1) come back
    assert delta.state_batches == (archiving_pb(1, 9, 2, LIMIT), PersistedBatch(10, 19, AVAILABLE, 1))
    # m2's lock is older than m1's second one: its records expire first (events in the order they happened).
    assert [(e.kind, e.first_offset, e.last_offset, e.member_id) for e in delta.events] == [
        (EventKind.LOCK_EXPIRED, 10, 19, "m2"), (EventKind.LOCK_EXPIRED, 1, 9, "m1"), (EventKind.ARCHIVING, 1, 9, "m1")]
    assert p.archiving() == [ArchivingRun(0, 9, 2, LIMIT)]


def test_runs_split_by_delivery_count_and_reason():
    p = held()
    ack(p, "m1", 5, 5, RELEASE)
    p.acquire("m1", [BatchHeader(0, 9)], now=0, max_records=10)  # 5 again, count 2
    p.acknowledge("m1", [AckRange(3, 6, (REJECT, REJECT, RELEASE, REJECT))], now=0)
    assert p.archiving() == [ArchivingRun(3, 4, 1, REJECTED), ArchivingRun(5, 5, 2, LIMIT),
                             ArchivingRun(6, 6, 1, REJECTED)]
    assert p.archiving_count == 4


def test_in_progress_releases_at_the_limit_go_to_archiving():
    config = PartitionConfig(delivery_count_limit=2, dead_letter=True, in_progress_staleness_threshold_ms=4_000)
    p = held(config)
    ack(p, "m1", 0, 9, RELEASE)
    p.acquire("m1", [BatchHeader(0, 9)], now=0, max_records=10)
    p.mark_in_progress("m1", [(0, 9)], now=0)
    released = p.release_in_progress(10_000)  # stale
    assert [r.delta.state_batches for r in released] == [(archiving_pb(0, 9, 2, LIMIT),)]
    assert kinds(released[0].delta) == [(EventKind.STALE_RELEASED, 0, 9, ArchiveReason.NONE),
                                       (EventKind.ARCHIVING, 0, 9, LIMIT)]
    assert p.in_progress_count() == 0 and p.archiving_count == 10


def test_other_archiving_goes_to_archived_directly_even_with_a_dead_letter_queue():
    p = SharePartition(DLQ, 0)
    result = p.acquire("m1", [BatchHeader(0, 4), BatchHeader(5, 5, is_control=True), BatchHeader(8, 9)],
                       now=0, max_records=10)
    assert p.archiving_count == 0
    assert [(e.kind, e.first_offset, e.last_offset, e.reason) for e in result.events] == [
        (EventKind.ACQUIRED, 0, 4, ArchiveReason.NONE),
        (EventKind.ARCHIVED, 5, 5, ArchiveReason.CONTROL_RECORD),
        (EventKind.ARCHIVED, 6, 7, ArchiveReason.GAP),
        (EventKind.ACQUIRED, 8, 9, ArchiveReason.NONE),
    ]
    delta = ack(p, "m1", 0, 0, GAP)
    assert kinds(delta) == [(EventKind.ARCHIVED, 0, 0, ArchiveReason.GAP)]
    delta = p.advance_log_start(2)
    assert kinds(delta) == [(EventKind.ARCHIVED, 1, 1, ArchiveReason.LOG_TRUNCATED)]
    assert p.archiving_count == 0


# ----- ARCHIVING is never served ----------------------------------------------------------------


def test_archiving_records_are_never_acquired_nor_acknowledged_and_count_in_flight():
    p = SharePartition(PartitionConfig(delivery_count_limit=2, dead_letter=True, max_record_locks=100), 0)
    p.acquire("m1", [BatchHeader(0, 99)], now=0, max_records=100)
    ack(p, "m1", 0, 99, REJECT)
    assert p.next_fetch_offset() == 100
    assert p.in_flight_count == 100 and not p.can_acquire()  # the record-lock limit counts ARCHIVING
    assert p.acquire("m1", [BatchHeader(0, 99), BatchHeader(100, 109)], now=0, max_records=10).acquired == ()
    with pytest.raises(ShareStateError) as refused:
        ack(p, "m1", 0, 0, ACCEPT)
    assert refused.value.error_code == INVALID_RECORD_STATE


# ----- staged changes -----------------------------------------------------------------------


def test_a_staged_reject_is_not_offered_for_dead_lettering_before_it_commits():
    p = held()
    staged = p.stage_acknowledge("m1", [AckRange(0, 1, (REJECT,))], now=0)
    assert p.archiving_count == 2 and p.archiving() == []
    assert p.finish_archiving(0, 1, dead_lettered=True) is None  # nothing the writer could have seen
    p.commit(staged.change_id)
    assert p.archiving() == [ArchivingRun(0, 1, 1, REJECTED)]
    assert p.start_offset == 0


def test_a_rolled_back_reject_leaves_archiving():
    p = held()
    staged = p.stage_acknowledge("m1", [AckRange(0, 1, (REJECT,))], now=0)
    p.rollback(staged.change_id)
    assert p.archiving_count == 0 and p.record_state(0) == (ACQUIRED, 1, "m1")


# ----- finishing -------------------------------------------------------------------------------


def test_finish_archiving_archives_moves_the_spso_and_reports_dead_lettered_then_archived():
    p = held()
    ack(p, "m1", 0, 3, REJECT)
    delta = p.finish_archiving(0, 3, dead_lettered=True)
    assert delta == StateDelta(4, ())
    assert delta.events == (RecordEvent(EventKind.DEAD_LETTERED, 0, 3, None, 1, REJECTED),
                            RecordEvent(EventKind.ARCHIVED, 0, 3, None, 1, REJECTED))
    assert p.start_offset == 4 and p.archiving_count == 0 and p.archiving() == []


def test_finish_archiving_given_up_archives_without_dead_lettered():
    p = held()
    ack(p, "m1", 0, 0, REJECT)
    delta = p.finish_archiving(0, 0, dead_lettered=False)
    assert kinds(delta) == [(EventKind.ARCHIVED, 0, 0, REJECTED)]
    assert p.start_offset == 1


def test_finish_archiving_of_part_of_a_run_and_of_other_states_leaves_the_rest():
    p = held()
    ack(p, "m1", 2, 5, REJECT)
    delta = p.finish_archiving(0, 3, dead_lettered=True)  # 0-1 are ACQUIRED: untouched
    assert delta == StateDelta(-1, (PersistedBatch(2, 3, ARCHIVED, 1),))
    assert p.archiving() == [ArchivingRun(4, 5, 1, REJECTED)]
    assert p.record_state(0) == (ACQUIRED, 1, "m1")
    assert p.finish_archiving(2, 3, dead_lettered=True) is None  # already finished
    assert p.archiving_count == 2


# ----- the log start, configuration changes, resets -------------------------------------------------


def test_log_start_passing_archiving_records_leaves_them_and_the_spso():
    p = held()
    ack(p, "m1", 2, 3, REJECT)
    delta = p.advance_log_start(5)
    assert p.start_offset == 2 and p.archiving() == [ArchivingRun(2, 3, 1, REJECTED)]
    assert [(e.kind, e.first_offset, e.last_offset) for e in delta.events] == [
        (EventKind.ARCHIVED, 0, 1, ), (EventKind.ARCHIVED, 4, 4)]
    assert p.advance_log_start(5) is None  # reported again on every fetch: nothing to do
    assert p.finish_archiving(2, 3, dead_lettered=True).start_offset == 5


def test_log_start_beyond_the_window_keeps_archiving_and_fills_up_to_the_log_start():
    p = held()
    ack(p, "m1", 0, 0, REJECT)
    delta = p.advance_log_start(50)
    assert p.start_offset == 0 and p.end_offset == 50 and p.archiving_count == 1
    assert PersistedBatch(20, 49, ARCHIVED, 0) in delta.state_batches
    assert all(e.last_offset < 20 for e in delta.events)  # offsets never read are not events
    assert p.next_fetch_offset() == 50
    assert p.finish_archiving(0, 0, dead_lettered=True).start_offset == 50
    assert p.in_flight_count == 0


def test_turning_the_dead_letter_queue_off_keeps_archiving_records_for_the_writer():
    p = held()
    ack(p, "m1", 0, 0, REJECT)
    p.reconfigure(PartitionConfig(delivery_count_limit=2))
    assert p.archiving() == [ArchivingRun(0, 0, 1, REJECTED)]
    ack(p, "m1", 1, 1, REJECT)  # a new reject archives directly
    assert p.record_state(1) == (ARCHIVED, 1, None)
    assert p.finish_archiving(0, 0, dead_lettered=False).start_offset == 2
    p.reconfigure(DLQ)
    ack(p, "m1", 2, 2, REJECT)
    assert p.record_state(2) == (ARCHIVING, 1, None)


def test_reset_drops_archiving_records():
    p = held()
    ack(p, "m1", 0, 0, REJECT)
    assert p.reset(30) == PartitionSnapshot(30, ())
    assert p.archiving_count == 0 and p.archiving() == []


# ----- persistence -------------------------------------------------------------------------------


def test_snapshot_and_rebuild_keep_archiving_with_its_reason():
    p = held()
    ack(p, "m1", 0, 0, REJECT)
    ack(p, "m1", 1, 1, RELEASE)
    p.acquire("m2", [BatchHeader(0, 19)], now=0, max_records=1)  # 1 again, count 2
    ack(p, "m2", 1, 1, RELEASE)
    snapshot = p.snapshot()
    assert snapshot.state_batches[:2] == (archiving_pb(0, 0, 1, REJECTED), archiving_pb(1, 1, 2, LIMIT))
    rebuilt = SharePartition.from_persisted(DLQ, snapshot)
    assert rebuilt.archiving() == [ArchivingRun(0, 0, 1, REJECTED), ArchivingRun(1, 1, 2, LIMIT)]
    assert rebuilt.archiving_count == 2 and rebuilt.start_offset == 0
    assert rebuilt.snapshot() == snapshot


@pytest.mark.parametrize("count,reason", [(1, REJECTED), (2, LIMIT), (3, LIMIT)])
def test_rebuild_of_archiving_without_a_reason_uses_kafkas_rule_from_the_count(count, reason):
    snapshot = PartitionSnapshot(0, (PersistedBatch(0, 4, ARCHIVING, count),))
    p = SharePartition.from_persisted(DLQ, snapshot)
    assert p.archiving() == [ArchivingRun(0, 4, count, reason)]


def test_updates_with_archiving_then_archived_replay_to_the_final_state():
    p = held()
    initial = p.snapshot()
    deltas = [ack(p, "m1", 0, 4, REJECT), p.finish_archiving(0, 2, dead_lettered=True)]
    rebuilt = SharePartition.from_persisted(DLQ, initial, deltas)
    assert rebuilt.start_offset == 3 and rebuilt.archiving() == [ArchivingRun(3, 4, 1, REJECTED)]
    assert rebuilt.snapshot() == p.snapshot()


def test_in_flight_views_show_archiving():
    p = held()
    ack(p, "m1", 0, 1, REJECT)
    assert list(p.in_flight())[0] == (0, 1, ARCHIVING, 1, None)
    run = next(p.in_flight_locked())
    assert (run.first_offset, run.last_offset, run.state, run.member_id, run.lock_deadline) == (0, 1, ARCHIVING, None, -1)
