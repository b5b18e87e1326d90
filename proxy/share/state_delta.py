"""Cumulative ShareUpdates: what to write instead of a full ShareSnapshot, and when not to.

Theory of operation
-------------------
The commit pipeline writes a share-partition's durable state as a **ShareSnapshot** (the whole
state) or, when one is durable, as a **cumulative ShareUpdate**: the SPSO and, for every offset at
or above it whose persisted view differs from that snapshot's, the current persisted view. Each
update supersedes the one before it, which is what a *compacted* state topic needs: compaction keeps
only the newest record per key, and recovery is exactly the newest snapshot plus the newest update
with its ``snapshot_epoch`` (``state_store.recover`` applies every update of that epoch in log
order; applying them all gives the same result, see below).

The update is computed by **diff**: :func:`cumulative_delta` compares two
:class:`~proxy.share.partition.PartitionSnapshot` values (the base snapshot and the engine's
snapshot now), so it is exact whatever happened in between -- rollbacks included. What the engine
tracks (see "Changed ranges") only narrows where the diff looks: a superset of the offsets that
moved, never the content written. Where the base has a batch and the current view has none (the records are back to
Available with delivery count 0, e.g. a staged acceptance rolled back) the update carries an
explicit AVAILABLE / count 0 batch, which replay treats exactly as a gap.

*Changed ranges.* Snapshotting and diffing the whole window costs what the window holds (a
fragmented window of 2,000 records: hundreds of batches, milliseconds per write), so the commit
pipeline works from what changed instead. The engine names the offsets it changed since the
previous write (``SharePartition.drain_changed``, a superset), and :class:`DeltaBase` keeps the
snapshot as of that write (``view``). Outside the changed offsets the snapshot is still ``view``:
:func:`splice` rebuilds the current snapshot from ``view`` and the engine's view of the changed
offsets (``SharePartition.persisted_view``), batch for batch what ``snapshot()`` gives. And
outside them the current state differs from the base at most where the newest update differed,
which it carried: so :func:`plan` with ``within`` (the changed offsets) diffs only there and adds
the carried ranges as always -- the same update the whole-window diff gives.

*Carried ranges.* An update also carries (with their current view) every range an earlier update
of the same epoch carried. So the newest update covers every offset any earlier one touched, and
replaying all updates of the epoch in order ends with the newest one's view on each of those
offsets: the same as replaying only the newest (what compaction leaves). Without it, a record whose
view returned to the base's (none does today: persisted views only move forward between
snapshots, a failed write forces a snapshot) would keep an earlier update's view on replay before
compaction and the base's after.

*Policy* (:func:`plan`): a snapshot when there is no durable base (first write, after a restart, a
reset, any failed write), after ``snapshot_every`` updates since the base, when the snapshot has
fewer than ``min_snapshot_batches`` batches (0 by default), or when the update would carry more than
half the snapshot's batches -- a rule that bounds how far cumulative updates grow, applied only to
snapshots of ``halves_from_batches`` batches or more. Below that an update is written even when it
carries every batch: it is still ~20 B smaller (no state epoch, no timestamps), which is the whole
state cost of the easy case of in-order accepts, whose window holds the one batch just acquired.
The diff stops as soon as more than half the batches are certain to change (each changed batch
gives the update one of its own): a fragmented window, whose update nearly always breaks the rule,
is not diffed whole only to be thrown away.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.share.partition import PartitionSnapshot, PersistedBatch, StateDelta, merge_ranges
from proxy.share.states import RecordState

Interval = tuple[int, int]  # (first, last), inclusive

__all__ = ["DeltaBase", "DeltaPolicy", "Interval", "cumulative_delta", "plan", "splice"]


@dataclass(frozen=True, slots=True)
class DeltaPolicy:
    """When a cumulative update is written instead of a snapshot (``--state-deltas on``)."""

    snapshot_every: int = 100  # updates since the base at most: bounds replay before compaction
    min_snapshot_batches: int = 0  # a snapshot with fewer batches is written as it is
    # The rule of halves (an update carrying more than half the snapshot's batches is a snapshot) from
    # this many snapshot batches on. Below, an update is ~20 B smaller than the snapshot whatever it
    # carries: in the easy case (in-order accepts) that is what keeps state bytes at native's.
    halves_from_batches: int = 8

    def __post_init__(self) -> None:
        if self.snapshot_every < 1:
            raise ValueError(f"snapshot_every {self.snapshot_every} < 1")


@dataclass(frozen=True, slots=True)
class DeltaBase:
    """A share-partition's last *durable* snapshot, what updates are computed against.

    ``state_epoch`` / ``create_timestamp``: the snapshot's, which an update does not carry (a reset
    that changes them needs a snapshot). ``updates``: updates issued since; ``carried``: the offset
    ranges the newest of them carried (each later update carries them again); ``view``: the
    share-partition's snapshot when the newest of them was computed (None: ``snapshot``, no update
    yet) -- what the next write splices the changed offsets into (see "Changed ranges")."""

    snapshot: PartitionSnapshot
    epoch: int
    state_epoch: int
    create_timestamp: int
    updates: int = 0
    carried: tuple[Interval, ...] = ()
    view: PartitionSnapshot | None = None

    @property
    def latest(self) -> PartitionSnapshot | None:
        """The snapshot as of the newest record written over this base (the base's own at first);
        None when unknown (an update issued without its view, see :meth:`after`)."""
        if self.view is not None:
            return self.view
        return self.snapshot if self.updates == 0 else None

    def after(self, delta: StateDelta, view: PartitionSnapshot | None = None) -> DeltaBase:
        """This base once ``delta`` (an update computed against it, from the snapshot ``view``) has
        been issued. Without ``view``, :attr:`latest` is unknown: the next write is not spliced."""
        return dataclasses.replace(self, updates=self.updates + 1, view=view,
                                   carried=tuple((b.first_offset, b.last_offset) for b in delta.state_batches))


def plan(base: DeltaBase | None, current: PartitionSnapshot, policy: DeltaPolicy,
         within: Sequence[Interval] | None = None) -> StateDelta | None:
    """The cumulative update to write for ``current``, or None when a snapshot must be written.

    ``within``: offset ranges (sorted, disjoint) outside which ``current`` is known to differ from
    the base at most on ``base.carried`` (the offsets changed since the newest write over the
    base); only they are compared. None: compare everything."""
    if base is None or base.updates >= policy.snapshot_every:
        return None
    batches = len(current.state_batches)
    if batches < policy.min_snapshot_batches:
        return None
    # The rule of halves: an update of more than `most` batches is a snapshot. The diff gives up as
    # soon as that is certain (in a fragmented window it nearly always is), not after it is built.
    most = batches // 2 if batches >= policy.halves_from_batches else None
    delta = _cumulative_delta(base.snapshot, current, base.carried, within, most)
    if delta is None or (most is not None and len(delta.state_batches) > most):
        return None
    return delta


def cumulative_delta(base: PartitionSnapshot, current: PartitionSnapshot,
                     carried: Iterable[Interval] = (), within: Sequence[Interval] | None = None) -> StateDelta:
    """The ShareUpdate that, replayed over ``base``, gives ``current``: its SPSO and, at or above it,
    the current view of every offset whose view differs from the base's or that ``carried`` names.
    Offsets with no current batch (Available, count 0) are carried as an explicit AVAILABLE / 0 batch.
    With ``within`` (sorted, disjoint ranges), offsets outside them and ``carried`` are taken as
    equal, unexamined.

    Cost: batches equal in both (same offsets and content: most of a window between two writes) are
    matched by hashing; only the others are compared offset range by offset range (bisect)."""
    delta = _cumulative_delta(base, current, carried, within, None)
    assert delta is not None  # (gives up only with a limit)
    return delta


def _cumulative_delta(base: PartitionSnapshot, current: PartitionSnapshot, carried: Iterable[Interval],
                      within: Sequence[Interval] | None, most: int | None) -> StateDelta | None:
    """:func:`cumulative_delta`, or None once it is certain to carry more than `most` batches."""
    start = current.start_offset
    if within is None:
        base_batches, current_batches = base.state_batches, current.state_batches
    else:
        base_batches, current_batches = _cut(base.state_batches, within), _cut(current.state_batches, within)
    if most is not None and len(current_batches) <= most:
        most = None  # fewer batches to compare than the limit: the diff cannot pass it, need not count
    changed = _differing(base_batches, current_batches, start, current.state_batches, most)
    if changed is None:
        return None
    changed.extend((max(first, start), last) for first, last in carried if last >= start)
    return StateDelta(start, tuple(_views(merge_ranges(changed), current.state_batches)))


def _differing(base: Sequence[PersistedBatch], current: Sequence[PersistedBatch], start: int,
               whole: Sequence[PersistedBatch], most: int | None) -> list[Interval] | None:
    """Intervals (at or above ``start``, unsorted) where the two batch lists' views differ.
    (A PersistedBatch is a tuple: equal batches -- offsets and content -- hash alike.)

    With `most`: None as soon as more than `most` batches of `whole` (the current snapshot's
    batches, of which `current` may be pieces) hold a differing interval. Each such batch gives
    the update at least one batch of its own (:func:`_views` clips the current batches to the
    changed ranges), so the update would carry more than `most`."""
    in_base, in_current = set(base), set(current)
    out: list[Interval] = []
    whole_firsts = [b[0] for b in whole] if most is not None else []
    touched, last_touched = 0, -1  # batches of `whole` with a differing interval (in offset order)
    # A current batch not in the base as it is: its parts not covered by base batches of its content.
    # (A base batch equal to a current one cannot overlap another current batch: neither list overlaps.)
    base_firsts = [b[0] for b in base]
    for batch in current:
        first, last = batch[0], batch[1]
        if last < start or batch in in_base:
            continue
        found = len(out)
        content = batch[2:]
        cursor = max(first, start)
        k = max(bisect_right(base_firsts, cursor) - 1, 0)
        while k < len(base) and base[k][0] <= last:
            b = base[k]
            if b[1] >= cursor and b[2:] == content:
                if b[0] > cursor:
                    out.append((cursor, b[0] - 1))
                cursor = b[1] + 1
            k += 1
        if cursor <= last:
            out.append((cursor, last))
        if most is not None and len(out) > found:
            owner = bisect_right(whole_firsts, first) - 1
            if owner != last_touched:
                touched, last_touched = touched + 1, owner
                if touched > most:
                    return None
    # A base batch not in the current state as it is: its parts no current batch covers (back to
    # Available, count 0); the covered parts were compared above.
    current_firsts = [c[0] for c in current]
    for batch in base:
        first, last = batch[0], batch[1]
        if last < start or batch in in_current:
            continue
        cursor = max(first, start)
        k = max(bisect_right(current_firsts, cursor) - 1, 0)
        while k < len(current) and current[k][0] <= last:
            c_first, c_last = current[k][0], current[k][1]
            if c_last >= cursor:
                if c_first > cursor:
                    out.append((cursor, c_first - 1))
                cursor = c_last + 1
            k += 1
        if cursor <= last:
            out.append((cursor, last))
    return out


def _views(intervals: Sequence[Interval], current: Sequence[PersistedBatch]) -> list[PersistedBatch]:
    """The current view over ``intervals`` (sorted, disjoint): current batches clipped to them, and
    AVAILABLE / count 0 where no current batch is."""
    out: list[PersistedBatch] = []
    if not intervals:
        return out
    firsts = [b.first_offset for b in current]
    for first, last in intervals:
        cursor = first
        k = max(bisect_right(firsts, first) - 1, 0)
        while k < len(current) and current[k].first_offset <= last:
            c = current[k]
            k += 1
            if c.last_offset < cursor:
                continue
            if c.first_offset > cursor:
                out.append(PersistedBatch(cursor, c.first_offset - 1, RecordState.AVAILABLE, 0))
            piece_first, piece_last = max(c.first_offset, cursor), min(c.last_offset, last)
            if piece_first == c.first_offset and piece_last == c.last_offset:
                out.append(c)
            else:
                out.append(PersistedBatch(piece_first, piece_last, *c[2:]))
            cursor = piece_last + 1
        if cursor <= last:
            out.append(PersistedBatch(cursor, last, RecordState.AVAILABLE, 0))
    return out



def splice(latest: PartitionSnapshot, start: int, ranges: Sequence[Interval],
           view: Sequence[PersistedBatch]) -> PartitionSnapshot:
    """The snapshot with SPSO ``start`` whose batches are ``view`` over ``ranges`` (sorted, disjoint,
    not adjacent, at or above ``start``; what ``SharePartition.persisted_view(ranges)`` gives) and
    ``latest``'s everywhere else, joined where equal neighbours meet: batch for batch the engine's
    ``snapshot()`` when only the offsets in ``ranges`` changed since ``latest`` was taken.

    Cost: a bisect and a slice per range, plus copying the untouched batches' references."""
    batches = latest.state_batches
    firsts = [b.first_offset for b in batches]
    out: list[PersistedBatch] = []
    cursor, k = start, 0  # next offset to fill; next batch of `view`
    for first, last in ranges:
        _join(out, _cut_one(batches, firsts, cursor, first - 1))
        j = k
        while j < len(view) and view[j].first_offset <= last:
            j += 1
        _join(out, view[k:j])
        k, cursor = j, last + 1
    _join(out, _cut_one(batches, firsts, cursor, None))
    return PartitionSnapshot(start, tuple(out))


def _span(b: PersistedBatch, first: int, last: int) -> PersistedBatch:
    """``b`` over [first, last] (cheaper than ``_replace``, which this runs per changed range)."""
    return PersistedBatch(first, last, *b[2:])


def _join(out: list[PersistedBatch], pieces: Sequence[PersistedBatch]) -> None:
    """Append ``pieces`` (each list coalesced already), merging where the two lists meet."""
    if not pieces:
        return
    head = pieces[0]
    if out and out[-1].last_offset + 1 == head.first_offset and out[-1].content == head.content:
        out[-1] = _span(out[-1], out[-1].first_offset, head.last_offset)
        out.extend(pieces[1:])
    else:
        out.extend(pieces)


def _cut_one(batches: Sequence[PersistedBatch], firsts: Sequence[int], first: int,
             last: int | None) -> Sequence[PersistedBatch]:
    """``batches`` (sorted, disjoint; ``firsts`` their first offsets) cut to [first, last]
    (last None: no end)."""
    if last is not None and last < first:
        return ()
    lo = max(bisect_right(firsts, first) - 1, 0)
    hi = len(batches) if last is None else bisect_right(firsts, last)
    if lo < hi and batches[lo].last_offset < first:
        lo += 1
    if lo >= hi:
        return ()
    out = list(batches[lo:hi])
    if out[0].first_offset < first:
        out[0] = _span(out[0], first, out[0].last_offset)
    if last is not None and out[-1].last_offset > last:
        out[-1] = _span(out[-1], out[-1].first_offset, last)
    return out


def _cut(batches: Sequence[PersistedBatch], ranges: Sequence[Interval]) -> list[PersistedBatch]:
    """``batches`` (sorted, disjoint) cut to ``ranges`` (sorted, disjoint)."""
    firsts = [b.first_offset for b in batches]
    out: list[PersistedBatch] = []
    for first, last in ranges:
        out.extend(_cut_one(batches, firsts, first, last))
    return out
