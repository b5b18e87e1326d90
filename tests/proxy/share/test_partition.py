"""Unit tests for the share-partition engine, rule by rule (KIP-932 sections cited beside them)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.share_events import EventKind
from proxy.share.partition import (
    INVALID_RECORD_STATE,
    INVALID_REQUEST,
    AckRange,
    AcquiredRecords,
    AcquireMode,
    BatchHeader,
    PartitionConfig,
    PartitionSnapshot,
    PersistedBatch,
    RecordEvent,
    SharePartition,
    ShareStateError,
    StateDelta,
    _overlaid,
    _persisted_view,
    acquisition_mark,
)
from proxy.share.states import TERMINAL_STATES, TRANSITIONS, AcknowledgeType, Event, RecordState, transition

AVAILABLE = RecordState.AVAILABLE
ACQUIRED = RecordState.ACQUIRED
ACKNOWLEDGED = RecordState.ACKNOWLEDGED
ARCHIVED = RecordState.ARCHIVED
GAP, ACCEPT, RELEASE, REJECT, RENEW = (int(t) for t in AcknowledgeType)
LOCK_MS = 30_000


class Log:
    """A topic-partition's record batches; ``read`` answers like an upstream Fetch."""

    def __init__(self, batches: Sequence[BatchHeader]) -> None:
        self.batches = list(batches)

    @classmethod
    def uniform(cls, start: int, end: int, size: int) -> Log:
        return cls([BatchHeader(o, min(o + size, end) - 1) for o in range(start, end, size)])

    def read(self, offset: int) -> list[BatchHeader]:
        return [b for b in self.batches if b.last_offset >= offset]


def fetch(p: SharePartition, log: Log, member: str, *, now: int = 0, max_records: int = 500, **kw):
    return p.acquire(member, log.read(p.next_fetch_offset()), now=now, max_records=max_records, **kw)


def ack(p: SharePartition, member: str, first: int, last: int, *types: int, now: int = 0) -> StateDelta | None:
    return p.acknowledge(member, [AckRange(first, last, tuple(types))], now=now)


def runs(p: SharePartition) -> list[tuple]:
    return list(p.in_flight())


def pb(first: int, last: int, state: RecordState, count: int) -> PersistedBatch:
    return PersistedBatch(first, last, state, count)


def rebuilt(p: SharePartition, snapshot: PartitionSnapshot, deltas: Sequence[StateDelta | None]) -> SharePartition:
    return SharePartition.from_persisted(p.config, snapshot, [d for d in deltas if d is not None])


# ------------------------------------------------------------------------------------------
# The KIP's worked example (KIP-932 "Managing durable share-partition state", revision A)
# ------------------------------------------------------------------------------------------


def test_kip_worked_example_step_by_step():
    """Offsets 100-120: the batched case, then the messy sequence ending at SPSO=120.

    Every step asserts the cumulative state and the ShareUpdate the step produces. One
    deliberate difference: on "Acknowledge 110" the KIP writes StartOffset -1 plus 110's
    Acknowledged state although SPSO moved to 111; the engine writes the moved SPSO (111) and drops
    state batches below it, as the KIP itself does on the final step.
    """
    log = Log([BatchHeader(100, 109), BatchHeader(110, 112), BatchHeader(113, 118), BatchHeader(119, 119),
               BatchHeader(120, 120)])
    p = SharePartition(PartitionConfig(), start_offset=100)
    initial = p.snapshot()
    deltas: list[StateDelta | None] = []
    # Starting state: latest offset 100 -> SPSO=100, SPEO=100; the initial write is a snapshot.
    assert (p.start_offset, p.end_offset) == (100, 100)
    assert initial == PartitionSnapshot(100, ())

    def step(delta, spso, speo, expected_runs, expected_delta):
        deltas.append(delta)
        assert (p.start_offset, p.end_offset) == (spso, speo)
        assert runs(p) == expected_runs
        assert delta == expected_delta
        # The durable state after every step rebuilds to the live state minus Acquired records.
        assert rebuilt(p, initial, deltas).snapshot() == p.snapshot()

    # Fetch records 100-109: acquired, delivery count 1; Acquired is not persisted.
    r = fetch(p, log, "c1", max_records=10)
    assert r.acquired == (AcquiredRecords(100, 109, 1),)
    step(r.delta, 100, 110, [(100, 109, ACQUIRED, 1, "c1")], None)

    # Acknowledge 100-109: SPSO=110, one state change for the batch.
    step(ack(p, "c1", 100, 109, ACCEPT), 110, 110, [], StateDelta(110, ()))

    # Fetch records 110-119: consumer 1 gets 110-112, consumer 2 gets 113-118, consumer 3 gets 119.
    assert fetch(p, log, "c1", now=0, max_records=3).acquired == (AcquiredRecords(110, 112, 1),)
    assert fetch(p, log, "c2", now=1000, max_records=6).acquired == (AcquiredRecords(113, 118, 1),)
    r = fetch(p, log, "c3", now=1000, max_records=1)
    assert r.acquired == (AcquiredRecords(119, 119, 1),)
    step(r.delta, 110, 120,
         [(110, 112, ACQUIRED, 1, "c1"), (113, 118, ACQUIRED, 1, "c2"), (119, 119, ACQUIRED, 1, "c3")], None)

    # Release 110 (consumer 1): available, delivery count 1.
    step(ack(p, "c1", 110, 110, RELEASE, now=2000), 110, 120,
         [(110, 110, AVAILABLE, 1, None), (111, 112, ACQUIRED, 1, "c1"), (113, 118, ACQUIRED, 1, "c2"),
          (119, 119, ACQUIRED, 1, "c3")],
         StateDelta(-1, (pb(110, 110, AVAILABLE, 1),)))

    # Acknowledge 119 (consumer 3).
    step(ack(p, "c3", 119, 119, ACCEPT, now=2000), 110, 120,
         [(110, 110, AVAILABLE, 1, None), (111, 112, ACQUIRED, 1, "c1"), (113, 118, ACQUIRED, 1, "c2"),
          (119, 119, ACKNOWLEDGED, 1, None)],
         StateDelta(-1, (pb(119, 119, ACKNOWLEDGED, 1),)))

    # Fetch records 110, 120 (consumer 1): 110 redelivered (count 2), 120 read from the log.
    r = fetch(p, log, "c1", now=10_000, max_records=10)
    assert r.acquired == (AcquiredRecords(110, 110, 2), AcquiredRecords(120, 120, 1))
    step(r.delta, 110, 121,
         [(110, 110, ACQUIRED, 2, "c1"), (111, 112, ACQUIRED, 1, "c1"), (113, 118, ACQUIRED, 1, "c2"),
          (119, 119, ACKNOWLEDGED, 1, None), (120, 120, ACQUIRED, 1, "c1")], None)

    # Lock timeout elapsed for 111, 112 (consumer 1's first acquisition at t=0).
    assert p.next_deadline() == LOCK_MS
    step(p.expire(LOCK_MS), 110, 121,
         [(110, 110, ACQUIRED, 2, "c1"), (111, 112, AVAILABLE, 1, None), (113, 118, ACQUIRED, 1, "c2"),
          (119, 119, ACKNOWLEDGED, 1, None), (120, 120, ACQUIRED, 1, "c1")],
         StateDelta(-1, (pb(111, 112, AVAILABLE, 1),)))

    # Acknowledge 113-118 (consumer 2).
    step(ack(p, "c2", 113, 118, ACCEPT, now=LOCK_MS), 110, 121,
         [(110, 110, ACQUIRED, 2, "c1"), (111, 112, AVAILABLE, 1, None), (113, 119, ACKNOWLEDGED, 1, None),
          (120, 120, ACQUIRED, 1, "c1")],
         StateDelta(-1, (pb(113, 118, ACKNOWLEDGED, 1),)))

    # Fetch records 111, 112 (consumer 3): delivery count 2.
    r = fetch(p, log, "c3", now=LOCK_MS, max_records=10)
    assert r.acquired == (AcquiredRecords(111, 112, 2),)
    step(r.delta, 110, 121,
         [(110, 110, ACQUIRED, 2, "c1"), (111, 112, ACQUIRED, 2, "c3"), (113, 119, ACKNOWLEDGED, 1, None),
          (120, 120, ACQUIRED, 1, "c1")], None)

    # Acknowledge 110 (consumer 1): SPSO=111.
    step(ack(p, "c1", 110, 110, ACCEPT, now=LOCK_MS), 111, 121,
         [(111, 112, ACQUIRED, 2, "c3"), (113, 119, ACKNOWLEDGED, 1, None), (120, 120, ACQUIRED, 1, "c1")],
         StateDelta(111, ()))

    # Acknowledge 111, 112 (consumer 3): SPSO=120.
    step(ack(p, "c3", 111, 112, ACCEPT, now=LOCK_MS), 120, 121,
         [(120, 120, ACQUIRED, 1, "c1")],
         StateDelta(120, ()))


# ------------------------------------------------------------------------------------------
# States table
# ------------------------------------------------------------------------------------------


def test_record_states_carry_kafka_wire_ids():
    assert [int(s) for s in RecordState] == [0, 1, 2, 3, 4, 5]  # 3: KIP-1191 ARCHIVING, 5: the draft IN_PROGRESS
    assert TERMINAL_STATES == {ACKNOWLEDGED, ARCHIVED}


def test_missing_transition_is_an_error():
    with pytest.raises(KeyError):
        transition(ACKNOWLEDGED, Event.ACQUIRE)
    with pytest.raises(KeyError):
        transition(AVAILABLE, Event.ACCEPT)
    # Terminal states have no way out at all.
    assert not [key for key in TRANSITIONS if key[0] in TERMINAL_STATES]


def test_acknowledge_types_match_the_wire():
    assert [int(t) for t in AcknowledgeType] == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"delivery_count_limit": 1}, {"delivery_count_limit": 11}, {"max_record_locks": 99},
     {"max_record_locks": 10_001}, {"record_lock_duration_ms": 999}],
)
def test_config_rejects_values_out_of_range(kwargs):
    with pytest.raises(ValueError):
        PartitionConfig(**kwargs)


def test_config_defaults_match_kafka():
    c = PartitionConfig()
    assert (c.delivery_count_limit, c.record_lock_duration_ms, c.max_record_locks) == (5, 30_000, 2000)
    assert [PartitionConfig(delivery_count_limit=n).throttle_delivery_count for n in (2, 3, 5, 6, 10)] == [2, 2, 3, 3, 5]


# ------------------------------------------------------------------------------------------
# Acquisition (KIP-932 "Batching", ShareFetch v2 max_records / batch_size / acquire mode)
# ------------------------------------------------------------------------------------------


def test_acquire_takes_whole_batches_and_may_exceed_max_records():
    p = SharePartition(PartitionConfig(), 0)
    r = fetch(p, Log.uniform(0, 40, 10), "m", max_records=15)
    assert r.acquired == (AcquiredRecords(0, 19, 1),)
    assert p.end_offset == 20


def test_record_limit_mode_acquires_exactly_max_records_and_keeps_the_rest_available():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 40, 10)
    r = fetch(p, log, "m1", max_records=15, mode=AcquireMode.RECORD_LIMIT)
    assert r.acquired == (AcquiredRecords(0, 14, 1),)
    assert p.end_offset == 20
    assert p.record_state(15) == (AVAILABLE, 0, None)
    assert p.next_fetch_offset() == 15
    r = fetch(p, log, "m2", max_records=3, mode=AcquireMode.RECORD_LIMIT)
    assert r.acquired == (AcquiredRecords(15, 17, 1),)


def test_batch_size_splits_acquired_ranges_on_batch_boundaries():
    p = SharePartition(PartitionConfig(), 0)
    r = fetch(p, Log.uniform(0, 40, 5), "m", max_records=20, batch_size=10)
    assert r.acquired == (AcquiredRecords(0, 9, 1), AcquiredRecords(10, 19, 1))


def test_acquire_sets_lock_deadline_from_now():
    p = SharePartition(PartitionConfig(record_lock_duration_ms=5000), 0)
    assert p.next_deadline() is None
    fetch(p, Log.uniform(0, 10, 10), "m", now=1234)
    assert p.next_deadline() == 6234


def test_acquire_skips_records_held_by_others_and_takes_released_ones_first():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 30, 10)
    fetch(p, log, "m1", max_records=10)
    fetch(p, log, "m2", max_records=10)
    ack(p, "m1", 3, 4, RELEASE)
    r = fetch(p, log, "m3", max_records=100)
    assert r.acquired == (AcquiredRecords(3, 4, 2), AcquiredRecords(20, 29, 1))


def test_acquire_only_within_the_batches_the_caller_read():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m1", max_records=20)
    ack(p, "m1", 0, 19, RELEASE)
    # The caller read only the first batch: the second cannot be delivered without its bytes.
    r = p.acquire("m2", log.batches[:1], now=0, max_records=100)
    assert r.acquired == (AcquiredRecords(0, 9, 2),)


def test_control_batches_are_archived_never_delivered():
    p = SharePartition(PartitionConfig(), 0)
    log = Log([BatchHeader(0, 4), BatchHeader(5, 5, is_control=True), BatchHeader(6, 9)])
    r = fetch(p, log, "m")
    assert r.acquired == (AcquiredRecords(0, 4, 1), AcquiredRecords(6, 9, 1))
    assert r.delta == StateDelta(-1, (pb(5, 5, ARCHIVED, 0),))
    assert ack(p, "m", 0, 4, ACCEPT) == StateDelta(6, ())


def _transactional_log() -> Log:
    return Log([
        BatchHeader(0, 2, is_transactional=True, producer_id=7),
        BatchHeader(3, 4),
        BatchHeader(5, 5, is_control=True, is_transactional=True, producer_id=7),  # abort marker
        BatchHeader(6, 8, is_transactional=True, producer_id=7),  # a later, committed transaction
    ])


def test_read_committed_archives_aborted_transactions():
    p = SharePartition(PartitionConfig(read_committed=True), 0)
    r = fetch(p, _transactional_log(), "m", aborted_transactions=[(7, 0)])
    assert r.acquired == (AcquiredRecords(3, 4, 1), AcquiredRecords(6, 8, 1))
    # The aborted batch sat at SPSO, so SPSO moved over it; the marker is persisted as Archived.
    assert r.delta == StateDelta(3, (pb(5, 5, ARCHIVED, 0),))


def test_read_uncommitted_delivers_aborted_transactions():
    p = SharePartition(PartitionConfig(read_committed=False), 0)
    r = fetch(p, _transactional_log(), "m", aborted_transactions=[(7, 0)])
    assert r.acquired == (AcquiredRecords(0, 4, 1), AcquiredRecords(6, 8, 1))


def test_offsets_between_batches_are_archived():
    p = SharePartition(PartitionConfig(), 0)
    r = fetch(p, Log([BatchHeader(0, 4), BatchHeader(8, 9)]), "m")
    assert r.acquired == (AcquiredRecords(0, 4, 1), AcquiredRecords(8, 9, 1))
    assert p.record_state(6) == (ARCHIVED, 0, None)


def test_empty_window_skips_offsets_missing_from_the_log():
    p = SharePartition(PartitionConfig(), 0)
    r = fetch(p, Log.uniform(10, 20, 10), "m")
    assert r.acquired == (AcquiredRecords(10, 19, 1),)
    assert r.delta == StateDelta(10, ())
    assert p.start_offset == 10


# ------------------------------------------------------------------------------------------
# Acknowledgement (KIP-932 "Fetching and acknowledging records")
# ------------------------------------------------------------------------------------------


@pytest.fixture
def held() -> SharePartition:
    """Offsets 0-9 acquired by m1 (delivery 1), 10-19 by m2."""
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m1", max_records=10)
    fetch(p, log, "m2", max_records=10)
    return p


def test_accept_acknowledges_and_moves_spso(held):
    assert ack(held, "m1", 0, 9, ACCEPT) == StateDelta(10, ())
    assert held.start_offset == 10


def test_release_makes_records_available_again_with_their_count(held):
    assert ack(held, "m1", 2, 3, RELEASE) == StateDelta(-1, (pb(2, 3, AVAILABLE, 1),))
    assert held.record_state(2) == (AVAILABLE, 1, None)
    assert held.next_fetch_offset() == 2


def test_reject_archives(held):
    assert ack(held, "m1", 0, 0, REJECT) == StateDelta(1, ())
    assert ack(held, "m1", 5, 5, REJECT) == StateDelta(-1, (pb(5, 5, ARCHIVED, 1),))


def test_gap_archives_without_changing_the_delivery_count(held):
    assert ack(held, "m1", 4, 4, GAP) == StateDelta(-1, (pb(4, 4, ARCHIVED, 1),))


def test_renew_restarts_the_lock_and_persists_nothing(held):
    renewed = ack(held, "m1", 0, 9, RENEW, now=20_000)
    # Nothing to write; only the event log hears of it.
    assert renewed == StateDelta(-1, ())
    assert renewed.events == (RecordEvent(EventKind.RENEWED, 0, 9, "m1", 1),)
    assert held.record_state(0) == (ACQUIRED, 1, "m1")
    # m2's lock (from t=0) still expires at 30s; m1's now at 50s.
    assert held.expire(LOCK_MS) == StateDelta(-1, (pb(10, 19, AVAILABLE, 1),))
    assert held.record_state(0) == (ACQUIRED, 1, "m1")
    assert held.next_deadline() == 50_000
    assert held.expire(50_000) == StateDelta(-1, (pb(0, 9, AVAILABLE, 1),))


def test_per_offset_acknowledge_types(held):
    delta = held.acknowledge("m1", [AckRange(0, 4, (ACCEPT, GAP, RELEASE, REJECT, RENEW))], now=0)
    assert delta == StateDelta(2, (pb(2, 2, AVAILABLE, 1), pb(3, 3, ARCHIVED, 1)))
    assert runs(held)[:3] == [(2, 2, AVAILABLE, 1, None), (3, 3, ARCHIVED, 1, None), (4, 9, ACQUIRED, 1, "m1")]


def test_release_at_the_delivery_limit_archives():
    p = SharePartition(PartitionConfig(delivery_count_limit=2), 0)
    log = Log.uniform(0, 1, 1)
    fetch(p, log, "m")
    ack(p, "m", 0, 0, RELEASE)
    assert fetch(p, log, "m").acquired == (AcquiredRecords(0, 0, 2),)
    assert ack(p, "m", 0, 0, RELEASE) == StateDelta(1, ())
    assert p.record_state(0)[0] is ARCHIVED


def test_acknowledging_records_of_another_member_is_invalid_record_state(held):
    with pytest.raises(ShareStateError) as e:
        ack(held, "m1", 10, 10, ACCEPT)
    assert e.value.error_code == INVALID_RECORD_STATE


@pytest.mark.parametrize("first,last", [(25, 25), (15, 25)])
def test_acknowledging_records_never_acquired_is_invalid_record_state(held, first, last):
    with pytest.raises(ShareStateError) as e:
        ack(held, "m2", first, last, ACCEPT)
    assert e.value.error_code == INVALID_RECORD_STATE


def test_acknowledging_twice_is_invalid_record_state(held):
    ack(held, "m1", 5, 5, ACCEPT)
    with pytest.raises(ShareStateError) as e:
        ack(held, "m1", 5, 5, REJECT)
    assert e.value.error_code == INVALID_RECORD_STATE


@pytest.mark.parametrize(
    "ranges",
    [
        [AckRange(5, 9, (ACCEPT,)), AckRange(0, 4, (ACCEPT,))],  # descending
        [AckRange(0, 5, (ACCEPT,)), AckRange(5, 9, (ACCEPT,))],  # overlapping
        [AckRange(4, 3, (ACCEPT,))],  # first > last
        [AckRange(0, 2, (ACCEPT, ACCEPT))],  # types neither one nor one per offset
        [AckRange(0, 0, (9,))],  # unknown type
    ],
)
def test_malformed_acknowledgements_are_invalid_request(held, ranges):
    with pytest.raises(ShareStateError) as e:
        held.acknowledge("m1", ranges, now=0)
    assert e.value.error_code == INVALID_REQUEST


def test_acknowledgement_is_all_or_nothing(held):
    before = runs(held)
    with pytest.raises(ShareStateError):
        held.acknowledge("m1", [AckRange(0, 4, (ACCEPT,)), AckRange(8, 12, (ACCEPT,))], now=0)
    assert runs(held) == before
    with pytest.raises(ShareStateError):
        held.acknowledge("m1", [AckRange(0, 3, (RELEASE, ACCEPT, RENEW, 5))], now=0)
    assert runs(held) == before
    assert held.start_offset == 0


def test_acknowledging_offsets_below_spso_is_skipped():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 20, 10), "m")
    assert p.advance_log_start(5) == StateDelta(5, ())
    assert ack(p, "m", 0, 9, ACCEPT) == StateDelta(10, ())


# ------------------------------------------------------------------------------------------
# Lock expiry and member departure
# ------------------------------------------------------------------------------------------


def test_lock_expiry_releases_at_the_deadline_not_before(held):
    assert held.expire(LOCK_MS - 1) is None
    assert held.expire(LOCK_MS) == StateDelta(-1, (pb(0, 19, AVAILABLE, 1),))
    assert held.next_deadline() is None


def test_lock_expiry_at_the_limit_archives():
    p = SharePartition(PartitionConfig(delivery_count_limit=2), 0)
    log = Log.uniform(0, 10, 10)
    fetch(p, log, "m", now=0)
    p.expire(LOCK_MS)
    fetch(p, log, "m", now=LOCK_MS)
    assert p.expire(2 * LOCK_MS) == StateDelta(10, ())


def test_member_departure_undoes_the_delivery_count_and_never_archives():
    p = SharePartition(PartitionConfig(delivery_count_limit=2), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m1", max_records=10)
    ack(p, "m1", 0, 9, RELEASE)
    fetch(p, log, "m1", max_records=10)  # 0-9 on its last attempt (count 2 = limit)
    fetch(p, log, "m2", max_records=10)
    assert p.record_state(0) == (ACQUIRED, 2, "m1")
    released = p.release_member("m1")
    assert released == StateDelta(-1, (pb(0, 9, AVAILABLE, 1),))
    # The event log hears the former holder and the count after the release (docs/event-log.md).
    assert released.events == (RecordEvent(EventKind.MEMBER_RELEASED, 0, 9, "m1", 1),)
    assert p.record_state(0) == (AVAILABLE, 1, None)
    assert p.record_state(10) == (ACQUIRED, 1, "m2")
    assert p.release_member("m1") is None


def test_acquisition_marks_order_acquisitions_across_share_partitions():
    p, q = SharePartition(PartitionConfig(), 0), SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m", max_records=10)  # p 0-9
    mark = acquisition_mark()
    fetch(q, log, "m", max_records=10)  # q 0-9, after the mark
    fetch(p, log, "m", max_records=10)  # p 10-19, after the mark
    assert 0 < p.newest_acquisition("m", 0, 9) < mark < q.newest_acquisition("m", 0, 9)
    assert mark < p.newest_acquisition("m", 0, 19) == p.newest_acquisition("m", 10, 10)
    assert p.newest_acquisition("other", 0, 19) == 0  # held by someone else: nothing of theirs
    ack(p, "m", 10, 19, ACCEPT)
    assert p.newest_acquisition("m", 10, 19) == 0  # no longer Acquired


def test_newest_acquisition_sees_single_offsets_of_a_split_batch():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 10, 10)
    fetch(p, log, "m")
    ack(p, "m", 3, 3, RELEASE)  # splits the batch
    before = p.newest_acquisition("m", 0, 9)
    assert fetch(p, log, "m").acquired == (AcquiredRecords(3, 3, 2),)
    assert p.newest_acquisition("m", 3, 3) > before == p.newest_acquisition("m", 4, 9)


def test_release_abandoned_releases_only_what_the_member_acquired_up_to_the_mark():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 30, 10)
    fetch(p, log, "m1", max_records=10)  # 0-9
    fetch(p, log, "m2", max_records=10)  # 10-19
    mark = acquisition_mark()
    fetch(p, log, "m1", max_records=10)  # 20-29, after the mark: kept
    assert p.release_abandoned("m1", mark) == StateDelta(-1, (pb(0, 9, AVAILABLE, 1),))
    assert p.record_state(0) == (AVAILABLE, 1, None)  # like an expired lock: the delivery counts
    assert p.record_state(10) == (ACQUIRED, 1, "m2")
    assert p.record_state(20) == (ACQUIRED, 1, "m1")
    assert p.next_fetch_offset() == 0
    assert p.release_abandoned("m1", mark) is None


def test_members_are_those_holding_records_acquired_or_in_progress():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m1", max_records=10)  # 0-9
    fetch(p, log, "m2", max_records=10)  # 10-19
    assert p.members() == {"m1", "m2"}
    ack(p, "m1", 0, 4, ACCEPT)  # a per-offset batch: 5-9 still held
    assert "m1" in p.members()
    p.mark_in_progress("m1", [(5, 9)], now=0)
    assert "m1" in p.members()
    ack(p, "m1", 5, 9, ACCEPT)
    assert p.members() == {"m2"}


def test_release_abandoned_archives_at_the_delivery_limit_as_lock_expiry_does():
    p = SharePartition(PartitionConfig(delivery_count_limit=2), 0)
    log = Log.uniform(0, 10, 10)
    fetch(p, log, "m")
    ack(p, "m", 0, 9, RELEASE)
    fetch(p, log, "m")  # the last attempt
    assert p.release_abandoned("m", acquisition_mark()) == StateDelta(10, ())
    assert p.start_offset == 10


def test_explicit_release_counts_as_a_delivery_attempt():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 10, 10)
    fetch(p, log, "m")
    ack(p, "m", 0, 9, RELEASE)
    assert fetch(p, log, "m").acquired == (AcquiredRecords(0, 9, 2),)
    p.release_member("m")
    assert fetch(p, log, "m").acquired == (AcquiredRecords(0, 9, 2),)


# ------------------------------------------------------------------------------------------
# Throttled redelivery near the limit
# ------------------------------------------------------------------------------------------


def _fetch_release_loop(limit: int, size: int, max_records: int) -> list[AcquiredRecords]:
    p = SharePartition(PartitionConfig(delivery_count_limit=limit), 0)
    log = Log([BatchHeader(0, size - 1), BatchHeader(size, 2 * size - 1)])
    seen = []
    while p.start_offset < size:
        r = fetch(p, log, "m", max_records=max_records)
        assert r.acquired and all(a.last_offset < size for a in r.acquired)
        seen.extend(r.acquired)
        for a in r.acquired:
            ack(p, "m", a.first_offset, a.last_offset, RELEASE)
    return seen


def test_throttling_halves_batches_and_isolates_the_last_attempt():
    # limit 5 -> throttle from delivery count 3: a batch of 8 goes out as 8, 8, 8, then 4, and each
    # record on its 5th (last) attempt goes alone.
    assert _fetch_release_loop(limit=5, size=8, max_records=8) == [
        AcquiredRecords(0, 7, 1), AcquiredRecords(0, 7, 2), AcquiredRecords(0, 7, 3),
        AcquiredRecords(0, 3, 4),
        AcquiredRecords(0, 0, 5), AcquiredRecords(1, 1, 5), AcquiredRecords(2, 2, 5), AcquiredRecords(3, 3, 5),
        AcquiredRecords(4, 7, 4),
        AcquiredRecords(4, 4, 5), AcquiredRecords(5, 5, 5), AcquiredRecords(6, 6, 5), AcquiredRecords(7, 7, 5),
    ]


def test_throttling_with_limit_ten_halves_with_each_attempt():
    seen = _fetch_release_loop(limit=10, size=64, max_records=64)
    first_record = [a for a in seen if a.first_offset == 0]
    sizes = [a.last_offset - a.first_offset + 1 for a in first_record]
    # Attempts 1-5 whole; attempt 6 (count 5 = threshold) half; then quarter, eighth, sixteenth; last alone.
    assert sizes == [64, 64, 64, 64, 64, 32, 16, 8, 4, 1]
    assert [a.delivery_count for a in first_record] == list(range(1, 11))


def test_a_throttled_batch_is_fetched_on_its_own():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 30, 10)
    fetch(p, log, "m", max_records=10)
    for _ in range(2):
        ack(p, "m", 0, 9, RELEASE)
        fetch(p, log, "m", max_records=10)
    ack(p, "m", 0, 9, RELEASE)  # 0-9 now Available with count 3: throttled
    r = fetch(p, log, "m", max_records=100)
    assert r.acquired == (AcquiredRecords(0, 4, 4),)
    assert p.end_offset == 10  # no new records joined a throttled fetch


def test_throttled_records_wait_for_the_next_fetch_when_others_came_first():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m", max_records=20, batch_size=10)
    ack(p, "m", 0, 9, RELEASE)
    for _ in range(2):
        fetch(p, log, "m", max_records=10)
        ack(p, "m", 0, 9, RELEASE)
    ack(p, "m", 10, 19, RELEASE)
    # 0-9 Available with count 3 (throttled), 10-19 with count 1. The throttled batch comes first
    # and goes alone; the next fetch takes 10-19.
    assert fetch(p, log, "m2", max_records=100).acquired == (AcquiredRecords(0, 4, 4),)
    assert fetch(p, log, "m3", max_records=100).acquired == (AcquiredRecords(5, 9, 4),)
    assert fetch(p, log, "m4", max_records=100).acquired == (AcquiredRecords(10, 19, 2),)


# ------------------------------------------------------------------------------------------
# Record-lock limit (group.share.partition.max.record.locks)
# ------------------------------------------------------------------------------------------


def test_record_lock_limit_takes_the_whole_log_batch_that_starts_inside_it():
    """As Kafka's acquireNewBatchRecords: the window may exceed the limit by the rest of one log
    batch rather than cut it (a cut batch goes to the client whole for a sliver of records)."""
    p = SharePartition(PartitionConfig(max_record_locks=100), 0)
    log = Log.uniform(0, 300, 30)
    r = fetch(p, log, "m1", max_records=1000)
    assert r.acquired == (AcquiredRecords(0, 119, 1),)  # batch 90-119 starts inside the limit
    assert p.in_flight_count == 120
    assert not p.can_acquire()
    assert fetch(p, log, "m2").acquired == ()
    # Only records released inside the window can be acquired again.
    ack(p, "m1", 50, 59, RELEASE)
    assert p.can_acquire()
    assert fetch(p, log, "m2").acquired == (AcquiredRecords(50, 59, 2),)
    # Finishing the head of the window makes room for new records once the span is below the limit.
    ack(p, "m1", 0, 9, ACCEPT)
    assert p.in_flight_count == 110 and fetch(p, log, "m3").acquired == ()
    ack(p, "m1", 10, 29, ACCEPT)
    assert fetch(p, log, "m3").acquired == (AcquiredRecords(120, 149, 1),)
    assert p.in_flight_count == 120


def test_pinned_by_names_the_member_holding_the_spso_of_a_full_window():
    """Only the holder of the Acquired record at the SPSO can let anyone acquire again (by
    acknowledging it, or its lock expiring); the reader answers that member's fetches early."""
    p = SharePartition(PartitionConfig(max_record_locks=100), 0)
    log = Log.uniform(0, 300, 30)
    assert p.pinned_by() is None  # empty window
    fetch(p, log, "m1", max_records=30)
    assert p.can_acquire() and p.pinned_by() is None  # room left: nobody pins
    fetch(p, log, "m2", max_records=30)
    fetch(p, log, "m3", max_records=60)
    assert not p.can_acquire() and p.pinned_by() == "m1"
    ack(p, "m2", 30, 59, ACCEPT)  # acknowledging above the SPSO frees nothing
    assert p.pinned_by() == "m1"
    staged = p.stage_acknowledge("m1", [AckRange(0, 29, (ACCEPT,))], now=0)
    # Staged, the SPSO waits for the write, but m1 has done its part: nobody pins.
    assert p.start_offset == 0 and not p.can_acquire() and p.pinned_by() is None
    p.rollback(staged.change_id)
    assert p.pinned_by() == "m1"
    ack(p, "m1", 0, 29, ACCEPT)
    assert p.start_offset == 60 and p.can_acquire() and p.pinned_by() is None
    fetch(p, log, "m1", max_records=60)
    assert not p.can_acquire() and p.pinned_by() == "m3"
    ack(p, "m3", 60, 60, RELEASE)  # a released record at the SPSO can be acquired: nobody pins
    assert p.can_acquire() and p.pinned_by() is None


def test_record_limit_mode_cuts_at_the_record_lock_limit():
    p = SharePartition(PartitionConfig(max_record_locks=100), 0)
    log = Log.uniform(0, 300, 30)
    r = fetch(p, log, "m1", max_records=1000, mode=AcquireMode.RECORD_LIMIT)
    assert r.acquired == (AcquiredRecords(0, 99, 1),)  # cut inside batch 90-119
    assert p.in_flight_count == 100
    assert not p.can_acquire()


# ------------------------------------------------------------------------------------------
# SPSO advancement, truncation, reset
# ------------------------------------------------------------------------------------------


def test_spso_advances_over_contiguous_terminal_records_only():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 30, 10), "m")
    assert ack(p, "m", 10, 19, ACCEPT) == StateDelta(-1, (pb(10, 19, ACKNOWLEDGED, 1),))
    assert p.start_offset == 0
    assert ack(p, "m", 0, 4, REJECT) == StateDelta(5, ())
    assert ack(p, "m", 5, 9, ACCEPT) == StateDelta(20, ())
    assert runs(p) == [(20, 29, ACQUIRED, 1, "m")]


def test_finished_batches_release_their_memory():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 10_000, 100)
    for first in range(0, 10_000, 100):
        fetch(p, log, "m", max_records=100)
        ack(p, "m", first, first + 99, ACCEPT)
    assert p.start_offset == p.end_offset == 10_000
    assert runs(p) == []
    assert len(p._batches) == 0


def test_log_truncation_moves_spso_and_archives_what_was_deleted():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 30, 10)
    fetch(p, log, "m1", max_records=10)
    fetch(p, log, "m2", max_records=10)
    ack(p, "m2", 10, 19, RELEASE)
    assert p.advance_log_start(15) == StateDelta(15, ())
    assert p.record_state(14) == (ARCHIVED, 0, None)
    assert p.record_state(15) == (AVAILABLE, 1, None)
    assert p.members() == set()
    # m1's acknowledgement of deleted records is skipped, not an error.
    assert ack(p, "m1", 0, 9, ACCEPT) is None
    assert p.advance_log_start(10) is None
    assert p.advance_log_start(50) == StateDelta(50, ())
    assert (p.start_offset, p.end_offset, runs(p)) == (50, 50, [])


def test_reset_discards_all_state():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 30, 10), "m")
    assert p.reset(7) == PartitionSnapshot(7, ())
    assert (p.start_offset, p.end_offset, runs(p), p.next_deadline()) == (7, 7, [], None)
    assert p.expire(10 * LOCK_MS) is None


# ------------------------------------------------------------------------------------------
# Persistence
# ------------------------------------------------------------------------------------------


def test_snapshot_writes_acquired_records_as_available_with_the_previous_count():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    fetch(p, log, "m", max_records=20)
    ack(p, "m", 0, 9, RELEASE)
    ack(p, "m", 15, 15, ACCEPT)
    fetch(p, log, "m", max_records=10)  # 0-9 acquired again, count 2
    assert p.snapshot() == PartitionSnapshot(0, (pb(0, 9, AVAILABLE, 1), pb(15, 15, ACKNOWLEDGED, 1)))
    restarted = SharePartition.from_persisted(p.config, p.snapshot())
    assert restarted.record_state(0) == (AVAILABLE, 1, None)
    assert restarted.record_state(12) == (AVAILABLE, 0, None)
    assert restarted.record_state(15) == (ACKNOWLEDGED, 1, None)
    assert restarted.next_fetch_offset() == 0
    assert restarted.snapshot() == p.snapshot()


def test_changed_ranges_are_unknown_at_first_then_name_what_moved_since_the_last_drain():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 20, 10)
    assert p.drain_changed() is None  # a new engine: the caller compares the whole window once
    fetch(p, log, "m", max_records=20)
    assert p.drain_changed() == [(0, 19)]  # (acquired: a superset, the persisted view did not move)
    ack(p, "m", 3, 3, RELEASE)
    ack(p, "m", 7, 8, ACCEPT)
    ack(p, "m", 4, 4, ACCEPT)
    assert p.drain_changed() == [(3, 4), (7, 8)]
    assert p.drain_changed() == []
    p.reset(30)
    assert p.drain_changed() is None


def test_a_rolled_back_acknowledgement_is_a_change():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 10, 10), "m", max_records=10)
    staged = p.stage_acknowledge("m", [AckRange(5, 6, (ACCEPT,))], now=0)
    p.drain_changed()
    p.rollback(staged.change_id)
    assert p.drain_changed() == [(5, 6)]


def test_the_persisted_view_of_some_ranges_is_the_snapshot_cut_to_them():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 30, 10)
    fetch(p, log, "m", max_records=30)
    ack(p, "m", 0, 29, *([ACCEPT, ACCEPT, RELEASE] * 10))
    fetch(p, log, "m", max_records=1)  # 2 acquired again: persisted as it was, Available / 1
    assert p.snapshot().state_batches[:2] == (pb(2, 2, AVAILABLE, 1), pb(3, 4, ACKNOWLEDGED, 1))
    assert p.persisted_view([(1, 4), (20, 40)]) == (
        pb(2, 2, AVAILABLE, 1), pb(3, 4, ACKNOWLEDGED, 1), pb(20, 20, AVAILABLE, 1), pb(21, 22, ACKNOWLEDGED, 1),
        pb(23, 23, AVAILABLE, 1), pb(24, 25, ACKNOWLEDGED, 1), pb(26, 26, AVAILABLE, 1), pb(27, 28, ACKNOWLEDGED, 1),
        pb(29, 29, AVAILABLE, 1))


def test_adjacent_ranges_of_different_types_move_the_records_as_one_range_with_a_type_per_offset_does():
    """Clients send one range per run of equal types; the engine joins adjacent ones (one lookup per
    run of offsets): the moves, the delta and its events are those of the one range."""
    types = (ACCEPT,) * 5 + (RELEASE,) + (ACCEPT,) * 14
    deltas, views = [], []
    for ranges in ([AckRange(0, 4, (ACCEPT,)), AckRange(5, 5, (RELEASE,)), AckRange(6, 19, (ACCEPT,))],
                   [AckRange(0, 19, types)]):
        p = SharePartition(PartitionConfig(), 0)
        fetch(p, Log.uniform(0, 20, 10), "m", max_records=20)
        delta = p.acknowledge("m", ranges, now=0)
        deltas.append((delta, delta.events))
        views.append((p.snapshot(), runs(p), p.start_offset))
    assert deltas[0] == deltas[1] and views[0] == views[1]
    assert views[0][2] == 5  # 0-4 accepted and passed; 5 released; 6-19 accepted (10-19 moved whole)


def test_later_updates_overwrite_earlier_state():
    snapshot = PartitionSnapshot(0, (pb(0, 9, AVAILABLE, 2),))
    updates = [StateDelta(-1, (pb(3, 4, ACKNOWLEDGED, 2),)), StateDelta(-1, (pb(0, 2, ARCHIVED, 2),))]
    p = SharePartition.from_persisted(PartitionConfig(), snapshot, updates)
    assert p.start_offset == 5
    assert runs(p) == [(5, 9, AVAILABLE, 2, None)]
    assert p.end_offset == 10


def test_an_explicit_available_count_0_batch_rebuilds_like_a_gap_in_the_middle_and_at_the_end():
    # A cumulative ShareUpdate writes "back to nothing" as Available / 0 (proxy.share.state_delta).
    snapshot = PartitionSnapshot(0, (pb(2, 3, ACKNOWLEDGED, 1), pb(6, 9, AVAILABLE, 2), pb(12, 14, ARCHIVED, 1)))
    update = StateDelta(0, (pb(2, 3, AVAILABLE, 0), pb(12, 14, AVAILABLE, 0)))
    with_update = SharePartition.from_persisted(PartitionConfig(), snapshot, [update])
    gaps = SharePartition.from_persisted(PartitionConfig(), PartitionSnapshot(0, (pb(6, 9, AVAILABLE, 2),)))
    assert runs(with_update) == runs(gaps) == [(0, 5, AVAILABLE, 0, None), (6, 9, AVAILABLE, 2, None)]
    assert with_update.end_offset == gaps.end_offset == 10
    assert with_update.snapshot() == gaps.snapshot()


def test_rebuild_joins_adjacent_persisted_batches_of_equal_content():
    # An update splitting a snapshot batch with pieces of the same content rebuilds what one snapshot would.
    snapshot = PartitionSnapshot(0, (pb(0, 9, AVAILABLE, 2), pb(10, 10, ACKNOWLEDGED, 1)))
    update = StateDelta(0, (pb(4, 5, AVAILABLE, 2), pb(10, 10, AVAILABLE, 2)))
    p = SharePartition.from_persisted(PartitionConfig(), snapshot, [update])
    alone = SharePartition.from_persisted(PartitionConfig(), PartitionSnapshot(0, (pb(0, 10, AVAILABLE, 2),)))
    assert sorted(p._batches) == sorted(alone._batches) == [0]
    assert runs(p) == runs(alone) == [(0, 10, AVAILABLE, 2, None)]


def test_a_snapshot_with_overlapping_batches_rebuilds_with_the_later_batch_on_top():
    # The proxy writes a snapshot's batches in order; one that is not (another writer, damage) must
    # still rebuild as the overlay of its batches in the order written, not as a list taken on trust.
    snapshot = PartitionSnapshot(0, (pb(0, 9, AVAILABLE, 2), pb(3, 4, ACKNOWLEDGED, 2), pb(0, 1, ARCHIVED, 1)))
    p = SharePartition.from_persisted(PartitionConfig(), snapshot)
    assert p.start_offset == 2
    assert runs(p) == [(2, 2, AVAILABLE, 2, None), (3, 4, ACKNOWLEDGED, 2, None), (5, 9, AVAILABLE, 2, None)]


_states = st.sampled_from([AVAILABLE, ACKNOWLEDGED, ARCHIVED])
_any_batches = st.lists(st.builds(lambda first, size, state, count: pb(first, first + size, state, count),
                                  st.integers(0, 40), st.integers(-1, 6), _states, st.integers(0, 3)), max_size=8)


@st.composite
def _in_order_batches(draw) -> list[PersistedBatch]:
    """Batches in offset order without overlaps, as the proxy writes them (gaps allowed)."""
    batches, first = [], draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 8))):
        first += draw(st.integers(0, 3))
        last = first + draw(st.integers(0, 6))
        batches.append(pb(first, last, draw(_states), draw(st.integers(0, 3))))
        first = last + 1
    return batches


_written_batches = st.one_of(_in_order_batches(), _any_batches)


@settings(max_examples=500, deadline=None)
@given(start=st.integers(0, 10), snapshot=_written_batches,
       updates=st.lists(st.tuples(st.integers(-1, 12), _written_batches), max_size=4))
def test_a_rebuild_starts_from_the_updates_overlaid_on_the_snapshot_in_order(start, snapshot, updates):
    # What the proxy writes (in order, no overlaps) is merged in one pass instead of laid over a
    # sorted map (a restore's engines in half the time): it must give exactly the map's result.
    deltas = [StateDelta(spso, tuple(batches)) for spso, batches in updates]
    expected_start = next((d.start_offset for d in reversed(deltas) if d.start_offset >= 0), start)
    view_start, view = _persisted_view(PartitionSnapshot(start, tuple(snapshot)), deltas)
    assert (view_start, list(view)) == (expected_start, list(_overlaid(snapshot, deltas)))


@pytest.mark.parametrize("state", [ACQUIRED, 5, 9, -1], ids=["acquired", "in-progress", "9", "-1"])
def test_rebuild_resumes_a_batch_in_a_state_it_cannot_serve_from_as_available(state):
    # Acquired is never persisted and 5 (without an owner)/9 are not states the engine has: such a batch is taken
    # as unfinished (delivered again, its delivery count kept), never a crash at start-up.
    snapshot = PartitionSnapshot(0, (pb(0, 1, ACKNOWLEDGED, 1), pb(2, 4, state, 2), pb(5, 5, ARCHIVED, 3)))
    p = SharePartition.from_persisted(PartitionConfig(), snapshot)
    assert runs(p) == [(2, 4, AVAILABLE, 2, None), (5, 5, ARCHIVED, 3, None)]
    assert p.record_state(3)[0] is AVAILABLE
    assert p.next_fetch_offset() == 2


def test_rebuilt_partition_redelivers_unfinished_records():
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 30, 10)
    initial = p.snapshot()
    deltas = [fetch(p, log, "m", max_records=30).delta, ack(p, "m", 10, 19, ACCEPT)]
    restarted = rebuilt(p, initial, deltas)
    assert restarted.snapshot() == p.snapshot()
    assert restarted.next_fetch_offset() == 0
    r = restarted.acquire("m2", log.read(0), now=0, max_records=100)
    assert r.acquired == (AcquiredRecords(0, 9, 1), AcquiredRecords(20, 29, 1))


def test_engine_imports_no_io():
    """The engine stays pure (the import-linter contract, checked directly in a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, proxy.share.partition; "
        "print(sorted(m for m in ('trio', 'socket', 'confluent_kafka', 'proxy.server') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----- staged changes (Kafka's two-phase state transitions) -------------------------------------


def stage(p: SharePartition, member: str, first: int, last: int, *types: int, now: int = 0):
    return p.stage_acknowledge(member, [AckRange(first, last, tuple(types))], now=now)


def test_rollback_of_an_ack_that_does_not_move_spso_restores_it_for_the_members_retry():
    p = SharePartition(PartitionConfig(), start_offset=0)
    fetch(p, Log.uniform(0, 10, 10), "m", now=0)
    staged = stage(p, "m", 5, 7, ACCEPT)
    assert staged is not None and staged.change_id
    assert staged.delta == StateDelta(-1, (pb(5, 7, ACKNOWLEDGED, 1),))
    assert p.record_state(6) == (ACKNOWLEDGED, 1, None)  # the state the write carries
    assert p.snapshot().state_batches == (pb(5, 7, ACKNOWLEDGED, 1),)

    p.rollback(staged.change_id)

    assert runs(p) == [(0, 9, ACQUIRED, 1, "m")]
    assert p.start_offset == 0 and p.staged_changes == 0
    assert p.snapshot().state_batches == ()
    # The same member's retry is accepted, and its lock still expires as before.
    assert ack(p, "m", 5, 7, ACCEPT) == StateDelta(-1, (pb(5, 7, ACKNOWLEDGED, 1),))
    p.expire(LOCK_MS)
    assert p.record_state(4) == (AVAILABLE, 1, None)
    assert p.record_state(6) == (ACKNOWLEDGED, 1, None)


def test_a_staged_accept_moves_spso_only_when_committed():
    p = SharePartition(PartitionConfig(), start_offset=0)
    fetch(p, Log.uniform(0, 10, 5), "m")
    staged = stage(p, "m", 0, 4, ACCEPT)
    assert p.start_offset == 0, "SPSO must not pass records whose state is not durable"
    assert p.commit(staged.change_id) == StateDelta(5, ())
    assert p.start_offset == 5


def test_a_staged_release_is_not_acquired_again_until_committed():
    p = SharePartition(PartitionConfig(), start_offset=0)
    log = Log.uniform(0, 10, 10)
    fetch(p, log, "a")
    staged = stage(p, "a", 0, 9, RELEASE)
    assert fetch(p, log, "b").acquired == ()
    p.commit(staged.change_id)
    assert fetch(p, log, "b").acquired == (AcquiredRecords(0, 9, 2),)


def test_rolled_back_records_regain_a_lock_that_was_dropped_and_expire_on_it():
    p = SharePartition(PartitionConfig(), start_offset=0)
    fetch(p, Log.uniform(0, 5, 5), "m", now=0)
    staged = stage(p, "m", 0, 4, REJECT)  # every record left the lock: it was dropped
    assert p.next_deadline() is None
    p.rollback(staged.change_id)
    assert p.next_deadline() == LOCK_MS
    p.expire(LOCK_MS)
    assert runs(p) == [(0, 4, AVAILABLE, 1, None)]


def test_rollback_after_a_split_restores_each_offset():
    p = SharePartition(PartitionConfig(), start_offset=0)
    fetch(p, Log.uniform(0, 10, 10), "m")
    staged = stage(p, "m", 0, 9, ACCEPT)
    # The log start passes part of the staged range: truncation supersedes the staged state there.
    p.advance_log_start(3)
    p.rollback(staged.change_id)
    assert p.start_offset == 3
    assert runs(p) == [(3, 9, ACQUIRED, 1, "m")]


def test_renew_only_acknowledgement_stages_nothing():
    p = SharePartition(PartitionConfig(), start_offset=0)
    fetch(p, Log.uniform(0, 5, 5), "m", now=0)
    staged = stage(p, "m", 0, 4, RENEW, now=1_000)
    assert staged.change_id == 0 and staged.delta == StateDelta(-1, ())
    assert [e.kind for e in staged.delta.events] == [EventKind.RENEWED]
    assert p.staged_changes == 0 and p.next_deadline() == 1_000 + LOCK_MS


# ------------------------------------------------------------------------------------------
# Per-offset state shared between equal neighbours, and merged back into batches
# ------------------------------------------------------------------------------------------


def state_objects(p: SharePartition) -> list[int]:
    """Per in-flight batch, how many state objects it holds (0: uniform, one state for the batch)."""
    return [0 if b.offsets is None else len({id(h) for h in b.offsets}) for b in p._batches.values()]


def test_a_batch_split_by_a_release_holds_one_state_object_per_run_not_per_offset():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 300, 100), "m1")
    assert state_objects(p) == [0]  # one in-flight batch, acquired whole
    for offset in (50, 150, 250):
        ack(p, "m1", offset, offset, RELEASE)
    assert state_objects(p) == [7]  # acquired 0-49, available 50, acquired 51-149, ..., acquired 251-299
    assert runs(p)[:3] == [(0, 49, ACQUIRED, 1, "m1"), (50, 50, AVAILABLE, 1, None), (51, 149, ACQUIRED, 1, "m1")]


def test_a_split_batch_whose_offsets_agree_again_becomes_one_batch():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 100, 100), "m1")
    ack(p, "m1", 10, 10, RELEASE)
    assert state_objects(p) == [3]
    p.expire(LOCK_MS)  # the other 99 are released too: every offset Available with count 1
    assert state_objects(p) == [0]
    assert runs(p) == [(0, 99, AVAILABLE, 1, None)]


def test_a_merged_batch_is_acquired_and_reported_as_its_offsets_would_be():
    """Acquired whole, a batch merged back joins a contiguous range with its count, exactly as the
    per-offset acquisition it replaces would report it."""
    p = SharePartition(PartitionConfig(), 0)
    log = Log.uniform(0, 200, 100)
    fetch(p, log, "m1", max_records=100)
    fetch(p, log, "m1", max_records=100)
    ack(p, "m1", 0, 0, RELEASE)
    ack(p, "m1", 100, 100, RELEASE)
    p.expire(LOCK_MS)
    assert state_objects(p) == [0, 0]
    result = fetch(p, log, "m2", now=LOCK_MS)
    assert result.acquired == (AcquiredRecords(0, 199, 2),)


def test_staged_offsets_are_not_merged_with_others_until_committed():
    p = SharePartition(PartitionConfig(), 0)
    fetch(p, Log.uniform(0, 100, 100), "m1")
    ack(p, "m1", 0, 0, RELEASE)
    change = p.stage_acknowledge("m1", [AckRange(1, 99, (RELEASE,))], now=0)
    # 1-99 moved together share one (staged) state; it stays apart from offset 0's equal one.
    assert state_objects(p) == [2]
    assert runs(p) == [(0, 99, AVAILABLE, 1, None)]
    p.rollback(change.change_id)
    assert state_objects(p) == [2]
    assert runs(p) == [(0, 0, AVAILABLE, 1, None), (1, 99, ACQUIRED, 1, "m1")]
    change = p.stage_acknowledge("m1", [AckRange(1, 99, (RELEASE,))], now=0)
    p.commit(change.change_id)
    assert state_objects(p) == [0]
    assert runs(p) == [(0, 99, AVAILABLE, 1, None)]
