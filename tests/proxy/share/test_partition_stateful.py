"""Stateful property test of the share-partition engine against a small model.

Hypothesis drives random members through fetches, acknowledgements of every type (valid and
invalid), progress marks (draft KIP KAFKA-20458), clock advances (lock expiry, the staleness sweep,
rebalance-grace expiry), member departures, log truncation, snapshots and restarts from persisted
state. Every call goes to two engines side by side -- the engine as it runs (per-offset state shared
between equal neighbours and merged back into batches) and one that keeps a state object per offset
and never merges -- and both must answer alike, call by call (results, deltas with their events,
errors) and view by view. After every step the engine must agree with the model and keep the invariants of KIP-932:
the window tiles [SPSO, SPEO), SPSO never passes a held (ACQUIRED or IN_PROGRESS) record, and no
delivery is counted twice (IN_PROGRESS paths never change the count). With a dead-letter queue
(KIP-1191) rejected and limit-archived records go to ARCHIVING: never acquired again, never passed by
the SPSO, kept (through log truncation and restarts) until finish_archiving moves them to ARCHIVED
with their delivery counts unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import GeneratorType

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from codec.share_events import EventKind
from proxy.share.partition import (
    AckRange,
    AcquireMode,
    BatchHeader,
    PartitionConfig,
    SharePartition,
    ShareStateError,
    StateDelta,
    acquisition_mark,
)
from proxy.share.states import TERMINAL_STATES, AcknowledgeType, RecordState

MEMBERS = ("m0", "m1", "m2", "m3")
LOCK_MS = 10_000
STALE_MS, GRACE_MS = 8_000, 3_000
SWEEP_MS = STALE_MS // 4


@dataclass(frozen=True)
class GeneratedLog:
    batches: tuple[BatchHeader, ...]
    aborted: tuple[tuple[int, int], ...]  # (producer_id, first_offset)
    end: int
    undeliverable_always: frozenset[int]  # control records and offsets missing from the log
    aborted_offsets: frozenset[int]


@st.composite
def logs(draw) -> GeneratedLog:
    pieces = draw(
        st.lists(
            st.tuples(
                st.integers(1, 12) | st.integers(20, 40),
                st.sampled_from(["data"] * 6 + ["control", "aborted", "committed", "missing"]),
            ),
            min_size=15,
            max_size=60,
        )
    )
    batches: list[BatchHeader] = []
    aborted: list[tuple[int, int]] = []
    undeliverable: set[int] = set()
    aborted_offsets: set[int] = set()
    offset = 0
    producer = 100
    for size, kind in pieces:
        if kind == "data":
            batches.append(BatchHeader(offset, offset + size - 1))
        elif kind == "control":
            batches.append(BatchHeader(offset, offset, is_control=True, is_transactional=True, producer_id=1))
            undeliverable.add(offset)
            size = 1
        elif kind == "missing":
            undeliverable.update(range(offset, offset + size))  # compacted away: no batch at all
        else:
            producer += 1
            batches.append(BatchHeader(offset, offset + size - 1, is_transactional=True, producer_id=producer))
            marker = offset + size
            batches.append(BatchHeader(marker, marker, is_control=True, is_transactional=True, producer_id=producer))
            undeliverable.add(marker)
            if kind == "aborted":
                aborted.append((producer, offset))
                aborted_offsets.update(range(offset, offset + size))
            size += 1
        offset += size
    # End with data so the window can always grow to the end of the log.
    batches.append(BatchHeader(offset, offset))
    return GeneratedLog(tuple(batches), tuple(aborted), offset + 1, frozenset(undeliverable),
                        frozenset(aborted_offsets))


class UnmergedPartition(SharePartition):
    """The engine with one state object per offset, never merged back into batches."""

    _merge = False


def _comparable(result):
    """A call's result as a value (generators listed; a delta's events, which equality leaves out, kept)."""
    if isinstance(result, GeneratorType):
        return _comparable(list(result))
    if isinstance(result, StateDelta):
        return result, _per_offset(result.events), result.changed
    if isinstance(result, list):
        return [_comparable(r) for r in result]
    if hasattr(result, "delta") and not isinstance(result, type):
        return result, _comparable(result.delta)
    return result


def _per_offset(events) -> list:
    """Events per offset, sorted: IN_PROGRESS holds are released in the order of their lock ids,
    which one counter hands out to both engines in turn, so order and coalescing may differ."""
    return sorted((e.kind, o, e.member_id, e.delivery_count, e.reason)
                  for e in events for o in range(e.first_offset, e.last_offset + 1))


class Twin:
    """Forwards every call to the merged engine and the unmerged one; both must answer alike."""

    def __init__(self, merged: SharePartition, unmerged: SharePartition) -> None:
        assert type(unmerged)._merge is False and type(merged)._merge is True
        self.merged, self.unmerged = merged, unmerged

    def __getattr__(self, name):
        mine, theirs = getattr(self.merged, name), getattr(self.unmerged, name)
        if not callable(mine):
            assert _comparable(mine) == _comparable(theirs), f"{name}: merged and unmerged engines differ"
            return mine

        def call(*args, **kwargs):
            try:
                result = mine(*args, **kwargs)
            except ShareStateError as error:
                try:
                    theirs(*args, **kwargs)
                except ShareStateError as other:
                    assert (other.error_code, str(other)) == (error.error_code, str(error))
                    raise error from None
                raise AssertionError(f"{name}: only the merged engine refused") from error
            if isinstance(result, GeneratorType):
                result = list(result)
            expected = _comparable(theirs(*args, **kwargs))
            assert _comparable(result) == expected, \
                f"{name}{args}: merged and unmerged engines answer differently:\n{_comparable(result)}\n{expected}"
            return result

        return call


def merged_batches_are_merged(p: SharePartition) -> None:
    """Between calls the merged engine has no split batch whose offsets all agree, and each state
    object of a split batch fills one contiguous run of it."""
    for batch in p._batches.values():
        if batch.offsets is None:
            continue
        seen: set[int] = set()
        previous = None
        for holder in batch.offsets:
            if holder is not previous:
                assert id(holder) not in seen, "a state object shared by offsets that are not contiguous"
                seen.add(id(holder))
                assert previous is None or not holder.same_as(previous), "equal neighbours left unmerged"
            previous = holder
        assert len(seen) > 1 or batch.offsets[0].rollback is not None, "a uniform batch left split"


# Weighted towards Release so delivery counts reach the limit and throttling kicks in.
ack_types = st.sampled_from([int(t) for t in AcknowledgeType] + [int(AcknowledgeType.RELEASE)] * 4)


class PartitionMachine(RuleBasedStateMachine):
    @initialize(
        log=logs(),
        limit=st.sampled_from([2, 3, 3, 4, 5, 6]),
        locks=st.sampled_from([100, 130]),
        read_committed=st.booleans(),
        # Just above the staleness threshold (max extension often wins), or far above it.
        max_extension=st.sampled_from([9_000, 30_000]),
        dead_letter=st.booleans(),
    )
    def setup(self, log: GeneratedLog, limit: int, locks: int, read_committed: bool, max_extension: int,
              dead_letter: bool) -> None:
        self.log = log
        self.max_ms = max_extension
        self.config = PartitionConfig(
            delivery_count_limit=limit,
            record_lock_duration_ms=LOCK_MS,
            max_record_locks=locks,
            read_committed=read_committed,
            in_progress_staleness_threshold_ms=STALE_MS,
            in_progress_max_lock_extension_ms=max_extension,
            in_progress_rebalance_grace_ms=GRACE_MS,
            dead_letter=dead_letter,
        )
        # ARCHIVING offsets as last seen; they leave only through finish_archiving.
        self.archiving: set[int] = set()
        self.never = log.undeliverable_always | (log.aborted_offsets if read_committed else frozenset())
        self.p = Twin(SharePartition(self.config, 0), UnmergedPartition(self.config, 0))
        self.snapshot = self.p.snapshot()
        self.deltas: list[StateDelta] = []
        self.now = 0
        self.log_start = 0
        self.highest_start = 0
        # The model: who holds what until when, and each offset's delivery count.
        self.holder: dict[int, str] = {}
        self.deadline: dict[int, int] = {}
        self.count: dict[int, int] = {}
        self.finished: set[int] = set()  # offsets seen Acknowledged or Archived
        # IN_PROGRESS offsets (also in `holder`): [in-progress start, last progress, grace deadline].
        self.progress: dict[int, list[int]] = {}
        self.next_sweep: int | None = None
        self.first_mark = acquisition_mark()  # before every record this engine hands out

    # ----- helpers ---------------------------------------------------------------------

    def _record(self, delta: StateDelta | None) -> None:
        if delta is not None:
            self.deltas.append(delta)

    def _held_by(self, member: str) -> list[int]:
        return sorted(o for o, m in self.holder.items() if m == member)

    def _drop_holding(self, offset: int) -> None:
        self.holder.pop(offset, None)
        self.deadline.pop(offset, None)
        self.progress.pop(offset, None)

    def _may_progress(self, offset: int, member: str) -> bool:
        """A mark (or a renew of an IN_PROGRESS record) of `offset` by `member` is allowed."""
        if self.holder.get(offset) != member:
            return False
        return offset not in self.progress or self.now - self.progress[offset][0] <= self.max_ms

    def _progressed(self, offset: int) -> None:
        """`offset` was marked (or renewed while IN_PROGRESS) now."""
        if not self.progress:
            self.next_sweep = self.now + SWEEP_MS
        start = self.progress[offset][0] if offset in self.progress else self.now
        self.progress[offset] = [start, self.now, -1]
        self.deadline.pop(offset, None)

    def _released_in_progress(self, offset: int) -> None:
        """Released by the sweep, grace expiry or a stale departure: the count stays as it is."""
        self._drop_holding(offset)

    @staticmethod
    def _runs_of(offsets: list[int]) -> list[list[int]]:
        runs: list[list[int]] = []
        for offset in offsets:
            if runs and runs[-1][-1] + 1 == offset:
                runs[-1].append(offset)
            else:
                runs.append([offset])
        return runs

    def _in_progress_view(self) -> list:
        return [r for r in self.p.in_flight_locked() if r.state is RecordState.IN_PROGRESS]

    # ----- rules -----------------------------------------------------------------------

    @rule(
        member=st.sampled_from(MEMBERS),
        max_records=st.integers(1, 40) | st.integers(80, 150),
        batch_size=st.none() | st.integers(1, 20),
        mode=st.sampled_from(list(AcquireMode)),
        read_batches=st.integers(1, 30),
    )
    def fetch(self, member, max_records, batch_size, mode, read_batches):
        self._fetch(member, max_records, batch_size, mode, read_batches)

    # Fetching is what fills the window; a second rule makes it twice as likely as the others.
    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(20, 150))
    def fetch_plenty(self, member, max_records):
        self._fetch(member, max_records, None, AcquireMode.BATCH_OPTIMIZED, 30)

    def _fetch(self, member, max_records, batch_size, mode, read_batches):
        start = self.p.next_fetch_offset()
        batches = [b for b in self.log.batches if b.last_offset >= start and b.base_offset >= self.log_start]
        batches = batches[:read_batches]  # a Fetch is cut by max bytes
        if not batches:
            return
        result = self.p.acquire(
            member, batches, now=self.now, max_records=max_records, batch_size=batch_size, mode=mode,
            aborted_transactions=[a for a in self.log.aborted if a[1] <= batches[-1].last_offset],
        )
        self._record(result.delta)
        acquired = [o for r in result.acquired for o in range(r.first_offset, r.last_offset + 1)]
        assert acquired == sorted(set(acquired)), "acquired ranges overlap or are unordered"
        if mode is AcquireMode.RECORD_LIMIT:
            assert len(acquired) <= max_records
        for r in result.acquired:
            for offset in range(r.first_offset, r.last_offset + 1):
                assert offset not in self.holder, f"{offset} handed to {member} while held by {self.holder[offset]}"
                assert offset not in self.finished, f"finished offset {offset} delivered again"
                assert offset not in self.never, f"undeliverable offset {offset} delivered"
                assert offset >= self.highest_start
                assert batches[0].base_offset <= offset <= batches[-1].last_offset
                self.count[offset] = self.count.get(offset, 0) + 1
                assert r.delivery_count == self.count[offset]
                self.holder[offset] = member
                self.deadline[offset] = self.now + LOCK_MS

    @rule(data=st.data())
    def acknowledge(self, data):
        member = data.draw(st.sampled_from(sorted(set(self.holder.values())) or MEMBERS), label="member")
        held = self._held_by(member)
        chosen = sorted(data.draw(st.sets(st.sampled_from(held), max_size=len(held))) if held else set())
        # Now and then slip in an offset the member may not hold, to test all-or-nothing.
        poison = None
        if data.draw(st.integers(0, 4)) == 0:
            poison = data.draw(st.integers(self.p.start_offset, self.p.end_offset + 3))
        if poison is not None and poison not in chosen:
            chosen = sorted({*chosen, poison})
        if not chosen:
            return
        ranges: list[AckRange] = []
        types_of: dict[int, int] = {}
        run = [chosen[0]]
        for offset in [*chosen[1:], None]:
            if offset is not None and offset == run[-1] + 1:
                run.append(offset)
                continue
            if data.draw(st.booleans()):
                types = (data.draw(ack_types),)
                types_of.update(dict.fromkeys(run, types[0]))
            else:
                types = tuple(data.draw(ack_types) for _ in run)
                types_of.update(zip(run, types))
            ranges.append(AckRange(run[0], run[-1], types))
            if offset is not None:
                run = [offset]
        # Valid when the member holds every offset, and renews only IN_PROGRESS records within the max extension.
        valid = all(self.holder.get(o) == member for o in chosen) and all(
            self._may_progress(o, member) for o, t in types_of.items() if t == AcknowledgeType.RENEW)
        before = (list(self.p.in_flight()), self.p.start_offset, self.p.next_deadline(), self._in_progress_view())
        phase = data.draw(st.sampled_from(["one-call", "staged", "rolled-back"]), label="phase")
        try:
            if phase == "one-call":
                delta = self.p.acknowledge(member, ranges, now=self.now)
            else:
                staged = self.p.stage_acknowledge(member, ranges, now=self.now)
                if phase == "rolled-back":
                    # The state write failed: everything is as it was, and the member may retry.
                    if staged is not None and staged.change_id:
                        assert self.p.start_offset == before[1], "SPSO moved before the write was durable"
                        self.p.rollback(staged.change_id)
                    after = (list(self.p.in_flight()), self.p.start_offset, self.p.next_deadline(),
                             self._in_progress_view())
                    renewed = any(t == AcknowledgeType.RENEW for t in types_of.values())
                    assert after[:2] == before[:2] and (renewed or after[2] == before[2]), "rollback was not exact"
                    assert after[3] == before[3], "rollback did not restore the in-progress times"
                    staged = self.p.stage_acknowledge(member, ranges, now=self.now)
                committed = self.p.commit(staged.change_id) if staged is not None and staged.change_id else None
                delta = None if staged is None else StateDelta(
                    committed.start_offset if committed is not None else -1,
                    tuple(b for b in staged.delta.state_batches if b.last_offset >= self.p.start_offset),
                )
        except ShareStateError:
            assert not valid, f"valid acknowledgement refused: {ranges}"
            assert (list(self.p.in_flight()), self.p.start_offset, self.p.next_deadline(),
                    self._in_progress_view()) == before
            return
        assert valid, f"invalid acknowledgement accepted: {ranges}"
        self._record(delta)
        for offset, ack_type in types_of.items():
            if ack_type == AcknowledgeType.RENEW and offset in self.progress:
                self._progressed(offset)  # a renew of an IN_PROGRESS record is a mark
            elif ack_type == AcknowledgeType.RENEW:
                self.deadline[offset] = self.now + LOCK_MS
            else:
                self._drop_holding(offset)

    @rule(data=st.data())
    def mark_in_progress(self, data):
        member = data.draw(st.sampled_from(sorted(set(self.holder.values())) or MEMBERS), label="member")
        held = self._held_by(member)
        chosen = set(data.draw(st.sets(st.sampled_from(held), max_size=len(held))) if held else set())
        if data.draw(st.integers(0, 4)) == 0:
            chosen.add(data.draw(st.integers(self.p.start_offset, self.p.end_offset + 3)))
        if not chosen:
            return
        chosen_list = sorted(chosen)
        valid = all(self._may_progress(o, member) for o in chosen_list)
        ranges = [(run[0], run[-1]) for run in self._runs_of(chosen_list)]
        before = (list(self.p.in_flight()), self.p.start_offset, self.p.next_deadline(), self._in_progress_view())
        phase = data.draw(st.sampled_from(["one-call", "staged", "rolled-back"]), label="phase")
        try:
            if phase == "one-call":
                delta = self.p.mark_in_progress(member, ranges, now=self.now)
            else:
                staged = self.p.stage_mark_in_progress(member, ranges, now=self.now)
                if phase == "rolled-back":
                    assert staged is not None and staged.change_id
                    self.p.rollback(staged.change_id)
                    after = (list(self.p.in_flight()), self.p.start_offset, self.p.next_deadline(),
                             self._in_progress_view())
                    assert after == before, "rolled-back mark was not undone exactly"
                    staged = self.p.stage_mark_in_progress(member, ranges, now=self.now)
                assert staged is not None
                committed = self.p.commit(staged.change_id)
                assert committed is None  # a mark finishes nothing: the SPSO cannot move
                delta = staged.delta
        except ShareStateError:
            assert not valid, f"valid mark refused: {ranges}"
            assert (list(self.p.in_flight()), self.p.start_offset, self.p.next_deadline(),
                    self._in_progress_view()) == before
            return
        assert valid, f"invalid mark accepted: {ranges} by {member}"
        self._record(delta)
        for offset in chosen_list:
            self._progressed(offset)

    def _model_next_deadline(self) -> int | None:
        due = list(self.deadline.values())
        if self.progress:
            due.append(self.next_sweep)
            due.extend(grace for _, _, grace in self.progress.values() if grace != -1)
        return min(due, default=None)

    @rule(ms=st.integers(0, 2 * LOCK_MS) | st.integers(0, SWEEP_MS))
    def advance_clock(self, ms):
        self.now += ms
        assert self.p.next_deadline() == self._model_next_deadline()
        self._record(self.p.expire(self.now))
        for offset in [o for o, d in self.deadline.items() if d <= self.now]:
            self._drop_holding(offset)
        released = self.p.release_in_progress(self.now)
        for release in released:
            self._record(release.delta)
        # The model's sweep: due every threshold / 4; max extension wins over staleness; grace any time.
        sweep = bool(self.progress) and self.now >= self.next_sweep
        expected: dict[str, int] = {}
        for offset, (start, last, grace) in list(self.progress.items()):
            if sweep and self.now - start >= self.max_ms:
                reason = "max_extension"
            elif sweep and self.now - last > STALE_MS:
                reason = "staleness"
            elif grace != -1 and grace <= self.now:
                reason = "grace_expiry"
            else:
                continue
            expected[reason] = expected.get(reason, 0) + 1
            self._released_in_progress(offset)
        if sweep:
            self.next_sweep = self.now + SWEEP_MS
        assert {r.reason.value: r.records for r in released} == expected

    @rule(member=st.sampled_from(MEMBERS), ms=st.integers(500, SWEEP_MS))
    def keep_working(self, member, ms):
        """A slow worker: time passes and it marks everything it has in progress again, so records
        reach the max extension while fresh (where the refusal and MAX_EXTENSION live)."""
        self.advance_clock(ms)
        offsets = [o for o in self._held_by(member) if o in self.progress]
        if not offsets:
            return
        ranges = [(run[0], run[-1]) for run in self._runs_of(offsets)]
        valid = all(self._may_progress(o, member) for o in offsets)
        try:
            delta = self.p.mark_in_progress(member, ranges, now=self.now)
        except ShareStateError as error:
            assert not valid and "share.in.progress.max.lock.extension.ms" in str(error)
            return
        assert valid
        self._record(delta)
        for offset in offsets:
            self._progressed(offset)

    @rule(member=st.sampled_from(MEMBERS))
    def member_leaves(self, member):
        delta = self.p.release_member(member, now=self.now)
        stale = self.p.last_member_release
        if stale is not None:
            self._record(stale.delta)  # released first, in the same call
        self._record(delta)
        stale_model = 0
        for offset in self._held_by(member):
            if offset in self.progress:
                start, last, grace = self.progress[offset]
                if self.now - last <= STALE_MS:
                    if grace == -1:
                        self.progress[offset][2] = self.now + GRACE_MS  # held for the rebalance grace
                else:
                    stale_model += 1
                    self._released_in_progress(offset)
                continue
            self.count[offset] -= 1  # not a delivery attempt
            self._drop_holding(offset)
        assert (stale.records if stale is not None else 0) == stale_model

    @rule(member=st.sampled_from(MEMBERS), everything=st.booleans())
    def member_abandons(self, member, everything):
        """The records a member will never acknowledge (on a partition its client forgot) released as
        if their locks expired: a mark taken now covers every Acquired record it holds, the mark
        taken before the first fetch none (the usual case, answered without a change)."""
        delta = self.p.release_abandoned(member, acquisition_mark() if everything else self.first_mark)
        self._record(delta)
        if not everything:
            assert delta is None
            return
        for offset in self._held_by(member):
            if offset not in self.progress:  # IN_PROGRESS records hold no lock to expire
                self._drop_holding(offset)

    @precondition(lambda self: self.p.archiving_count > 0)
    @rule(data=st.data())
    def finish_archiving(self, data):
        runs = self.p.archiving()
        run = data.draw(st.sampled_from(runs), label="run")
        first = data.draw(st.integers(run.first_offset - 2, run.last_offset), label="first")
        last = data.draw(st.integers(max(first, run.first_offset), run.last_offset + 2), label="last")
        dead_lettered = data.draw(st.booleans(), label="dead_lettered")
        finishing = {o for o in self.archiving if first <= o <= last}
        counts = {o: self.p.record_state(o)[1] for o in finishing}
        delta = self.p.finish_archiving(first, last, dead_lettered=dead_lettered)
        assert delta is not None
        self._record(delta)
        for offset in finishing:
            if offset >= self.p.start_offset:  # (below it the engine keeps nothing)
                assert self.p.record_state(offset) == (RecordState.ARCHIVED, counts[offset], None)
        archived = {o for e in delta.events if e.kind is EventKind.ARCHIVED for o in range(e.first_offset, e.last_offset + 1)}
        lettered = {o for e in delta.events if e.kind is EventKind.DEAD_LETTERED
                    for o in range(e.first_offset, e.last_offset + 1)}
        assert archived == finishing and lettered == (finishing if dead_lettered else set())
        self.archiving -= finishing
        self.finished |= finishing

    @rule(data=st.data())
    def truncate_log(self, data):
        candidates = [b.base_offset for b in self.log.batches if b.base_offset > self.log_start]
        if not candidates:
            return
        new_start = data.draw(st.sampled_from(candidates[:10]))
        self.log_start = new_start
        self._record(self.p.advance_log_start(new_start))
        # (ARCHIVING records may hold the SPSO below the new log start.)
        for offset in [o for o in self.holder if o < max(new_start, self.p.start_offset)]:
            self._drop_holding(offset)

    @rule()
    def write_snapshot(self):
        self.snapshot = self.p.snapshot()
        self.deltas = []

    @rule()
    def restart_from_persisted_state(self):
        self.p = Twin(SharePartition.from_persisted(self.config, self.snapshot, self.deltas),
                      UnmergedPartition.from_persisted(self.config, self.snapshot, self.deltas))
        for offset in list(self.holder):
            if offset in self.progress:
                self.progress[offset][2] = -1  # IN_PROGRESS survives with owner and times; no grace
                continue
            self.count[offset] -= 1  # the acquisition was never persisted
            self._drop_holding(offset)
        if self.progress:
            # With no `now`, the rebuilt engine's first sweep is when a record could first go stale
            # or over-extend.
            self.next_sweep = min(min(last + STALE_MS + 1, start + self.max_ms) for start, last, _ in self.progress.values())

    # ----- invariants --------------------------------------------------------------------

    @precondition(lambda self: hasattr(self, "p"))
    @invariant()
    def engine_matches_model(self):
        p = self.p
        assert p.start_offset >= self.highest_start, "SPSO moved backwards"
        self.highest_start = p.start_offset
        assert p.start_offset <= p.end_offset
        # Records waiting for their dead-letter write hold the window even past the log start.
        # Batch-optimized acquisition takes the whole log batch that starts inside the limit.
        largest = max((b.last_offset - b.base_offset + 1 for b in self.log.batches), default=1)
        assert p.in_flight_count <= self.config.max_record_locks + largest - 1 or p.archiving_count
        archiving = {o for r in p.archiving() for o in range(r.first_offset, r.last_offset + 1)}
        assert p.archiving_count == len(archiving)  # nothing is staged between steps
        assert self.archiving <= archiving, "ARCHIVING records left without finish_archiving"
        assert not archiving or self.config.dead_letter
        assert all(o >= p.start_offset for o in archiving)
        self.archiving = archiving
        cursor = p.start_offset
        for index, (first, last, state, count, member) in enumerate(p.in_flight()):
            assert (state is RecordState.ARCHIVING) == (first in archiving)
            assert first == cursor, "in-flight batches must tile [SPSO, SPEO)"
            cursor = last + 1
            if index == 0:
                assert state not in TERMINAL_STATES, "SPSO stopped on a terminal record"
            assert 0 <= count <= self.config.delivery_count_limit
            for offset in range(first, last + 1):
                assert self.count.get(offset, 0) == count, f"delivery count of {offset}"
                if state is RecordState.ACQUIRED:
                    assert self.holder.get(offset) == member and offset not in self.progress
                elif state is RecordState.IN_PROGRESS:
                    assert self.holder.get(offset) == member and offset in self.progress
                else:
                    assert offset not in self.holder
                if state in TERMINAL_STATES or state is RecordState.ARCHIVING:
                    self.finished.add(offset)  # never delivered again
                elif self.count.get(offset, 0) >= self.config.delivery_count_limit:
                    assert state in (RecordState.ACQUIRED, RecordState.IN_PROGRESS), \
                        f"{offset} at the limit yet {state.name}"
        assert cursor == p.end_offset
        for run in self._in_progress_view():
            for offset in range(run.first_offset, run.last_offset + 1):
                assert [run.in_progress_start, run.last_progress, run.grace_deadline] == self.progress[offset], \
                    f"in-progress times of {offset}"
        assert p.in_progress_count() == len(self.progress)
        assert p.stale_count(self.now) == sum(1 for _, last, _ in self.progress.values() if self.now - last > STALE_MS)
        assert all(o >= p.start_offset for o in self.holder), "a member holds an offset below SPSO"
        assert all(self.count.get(o, 0) == 0 for o in range(p.end_offset, p.end_offset + 50))

    @precondition(lambda self: hasattr(self, "p"))
    @invariant()
    def merged_and_unmerged_engines_agree(self):
        p = self.p
        for view in ("in_flight_locked", "in_flight", "snapshot", "archiving", "members"):
            getattr(p, view)()  # (Twin compares)
        for name in ("start_offset", "end_offset", "archiving_count", "staged_changes"):
            getattr(p, name)
        assert p.next_fetch_offset() >= p.start_offset
        assert [p.merged.record_state(o) for o in range(p.start_offset, p.end_offset)] == \
            [p.unmerged.record_state(o) for o in range(p.start_offset, p.end_offset)]
        merged_batches_are_merged(p.merged)

    @precondition(lambda self: hasattr(self, "p"))
    @invariant()
    def persisted_state_rebuilds_live_state_minus_acquired(self):
        rebuilt = SharePartition.from_persisted(self.config, self.snapshot, self.deltas)
        assert rebuilt.snapshot() == self.p.snapshot()
        assert UnmergedPartition.from_persisted(self.config, self.snapshot, self.deltas).snapshot() == rebuilt.snapshot()
        assert rebuilt.start_offset == self.p.start_offset


PartitionMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPartitionStateful = PartitionMachine.TestCase
