"""The commit pipeline: stage a change, write it to the state topic, then commit or roll back.

Theory of operation
-------------------
Every engine change that must survive a restart enters here through :meth:`CommitPipeline.record`,
which

1. bumps the leader's *version* and marks it dirty (group commit: the writer task writes one
   record per dirty share-partition, many partitions per producer batch: a ShareSnapshot, or with
   ``--state-deltas on`` a cumulative ShareUpdate over the last durable snapshot when
   :func:`proxy.share.state_delta.plan` says it is clearly smaller, computed from the offsets the
   engine changed since the previous write rather than from the whole window);
2. remembers the engine's *staged* change id, if the change was staged (client acknowledgements:
   Kafka's two-phase ``startStateTransition`` / ``completeStateTransition``);
3. tells every subscriber of the change hook (metrics, the event log, the dead-letter writer)
   what changed and why.

A change's *events* (``Change.events``, for the event log) are published once they are settled:
an unstaged change's at once, a staged change's when it commits (with the COMMITTED change), never
a rolled-back one's. A delta that carries events only (renewals) is published without a write.
Acquisitions write nothing either: :meth:`CommitPipeline.note_delivered` publishes them.

When a write covering versions up to *v* succeeds, the staged changes up to *v* are committed
(the SPSO moves over what they finished, released records become acquirable) and waiters up to
*v* are released. When it fails, those staged changes are **rolled back** -- the records are
Acquired by their member again, the SPSO unmoved -- and the waiters get :class:`PersistError`, so
the client is answered with a retriable error and its retry succeeds. Changes with no client
waiting (lock expiry, a departed member's release, archiving, initialisation) are not rolled back:
the partition stays dirty and is written again with backoff until it is durable, as Kafka goes
ahead with lock-expiry transitions whatever the write's outcome.

:attr:`CommitPipeline.writable` is False from a failed write until the next successful one:
readiness reports it.

Group records (group epoch, initialised partitions, configs, tombstones) are queued by key, so a
long outage holds one pending record per key, not one per change.

Writes in flight
----------------
The writer task does not wait for one write to finish before it issues the next: up to
``max_writes_in_flight`` (``--state-writes-in-flight``) are on their way at once, so an
acknowledgement arriving while a write is in flight is written at once instead of after it.
The writer task hands each write to the producer in the turn it issues it, so the write goes out
while the request that staged the change goes on (a ShareFetch takes its records meanwhile).
Writes reach the producer in the order they were issued; the state producer is idempotent, so
records of one state partition land in the order they were produced, and a share-partition's
records always go to the same state partition: a later write of it lands after an earlier one. A
writer without that ordered ``submit`` (the transactional lanes of ``--state-fencing
transactional``, which commit each partition's transaction on its own) gets one write at a time.
Outcomes are applied in the order the writes were issued, so ``durable`` only ever moves forward
over versions that are durable. When a write fails, every write issued before its failure is
applied counts as failed too, whatever the broker said: a later snapshot of a share-partition
carries the failed write's staged changes, which are rolled back now, and a later group ticket
would claim the failed write's group records durable. Those writes may have landed; as with any
failed write, the rolled-back truth is written again.

A share-partition's records (snapshot, update, tombstones) are routed to the state-topic partition
of its snapshot key (``state_store.share_partition_route``). The *delta base* (the last durable
snapshot, ``Leader.delta_base``) is cleared when a snapshot is issued and set when that snapshot's
write succeeds; any failed write covering the leader clears it (the write's outcome is unknown, so
the next record is a snapshot).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
import trio

from proxy.share import metrics, state_store
from proxy.share.leaders import Leader, SharePartitionKey
from proxy.share.partition import PartitionSnapshot, RecordEvent, StagedChange, StateDelta
from proxy.share.persister import Delivery, PersistError
from proxy.share.state_delta import DeltaBase, DeltaPolicy, Interval, plan, splice

log = structlog.get_logger(__name__)

# Labelled children resolved once: labels() takes a lock and a dict lookup per call, on every write.
_WRITES_OK = metrics.STATE_WRITES.labels(outcome="ok")
_SNAPSHOT_RECORDS = metrics.STATE_PARTITION_RECORDS.labels(kind="snapshot")
_UPDATE_RECORDS = metrics.STATE_PARTITION_RECORDS.labels(kind="update")


class Cause(enum.Enum):
    """Why a share-partition's durable state changed (carried to change-hook subscribers)."""

    INITIALISED = "initialised"
    ACQUIRED = "acquired"  # archived control / aborted records met while acquiring
    ACKNOWLEDGED = "acknowledged"
    LOCK_EXPIRED = "lock-expired"
    MEMBER_RELEASED = "member-released"
    LOG_TRUNCATED = "log-truncated"
    COMMITTED = "committed"  # a staged change became durable (its SPSO move)
    # IN_PROGRESS (docs/in-progress.md); metrics label the last three as release reasons
    # staleness / max_extension / grace_expiry.
    MARKED_IN_PROGRESS = "marked-in-progress"
    STALE_RELEASED = "stale-released"
    MAX_EXTENSION_RELEASED = "max-extension-released"
    GRACE_EXPIRED = "grace-expired"
    # Records handed to a member (note_delivered): nothing to write, no version bump; the change
    # carries only ACQUIRED events.
    DELIVERED = "delivered"
    # The dead-letter writer finished ARCHIVING records (finish_archiving): ARCHIVING -> ARCHIVED.
    DEAD_LETTERED = "dead-lettered"


@dataclass(frozen=True, slots=True)
class Change:
    """What the change hook hears: one share-partition's delta and its cause.

    ``events`` are the events now settled for publication: an unstaged change's delta events when
    it is recorded; for a staged change none when it is recorded and all of them when it commits
    (the COMMITTED change); none ever for a change rolled back."""

    key: SharePartitionKey
    cause: Cause
    delta: StateDelta | None
    events: tuple[RecordEvent, ...] = ()


ChangeHook = Callable[[Change], None]


DEFAULT_WRITES_IN_FLIGHT = 4


#: A write handed to the producer (:meth:`CommitPipeline._submit`): its delivery, the error that
#: kept it from the producer, or None for a writer without ``submit`` (it writes and waits at once).
Submitted = Delivery | PersistError | None


@dataclass(slots=True, eq=False)
class _Write:
    """One state write: its records, what it makes durable, and where it sits in issue order."""

    sequence: int
    batch: list[tuple]
    covered: list[tuple[Leader, int]]  # (share-partition, the version this write makes durable)
    snapshots: list[tuple[Leader, int, PartitionSnapshot]]  # (share-partition, epoch, snapshot)
    groups: dict[bytes, tuple]
    group_ticket: int
    previous: _Write | None  # the write issued just before, until it is applied
    issued_at: float = 0.0  # trio time
    submitted: trio.Event = field(default_factory=trio.Event)  # its records are with the producer
    applied: trio.Event = field(default_factory=trio.Event)


class CommitPipeline:
    """Writes dirty share-partitions and group records; commits or rolls back staged changes."""

    def __init__(
        self,
        writer,
        state_topic: str,
        *,
        wall_clock: Callable[[], int],
        retry_backoff_s: float = 0.25,
        max_retry_backoff_s: float = 5.0,
        on_settled: Callable[[Leader], None] = lambda leader: None,
        clock: Callable[[], int] | None = None,
        deltas: DeltaPolicy | None = None,
        max_writes_in_flight: int = DEFAULT_WRITES_IN_FLIGHT,
    ) -> None:
        if max_writes_in_flight < 1:
            raise ValueError("max_writes_in_flight must be at least 1")
        self.writer = writer
        # More than one write in flight needs a writer whose submitted writes land in the order
        # submitted (StateLogWriter.submit); the transactional writer's lanes give no such order.
        self.ordered_submit = hasattr(writer, "submit")
        self.max_writes_in_flight = max_writes_in_flight if self.ordered_submit else 1
        self._issued = 0  # writes issued so far: the next one's sequence number
        self._last_write: _Write | None = None  # the newest write not yet applied
        # Writes with a lower sequence number are applied as failed (an earlier one failed).
        self._failed_below = 0
        self._retry_at = 0.0  # trio time before which the writer task issues nothing (backoff)
        # Cumulative ShareUpdates between snapshots (--state-deltas on); None: a snapshot per write.
        self.deltas = deltas
        # The engines' clock: IN_PROGRESS times are written as wall-clock ms (state_store converts
        # with wall - engine clock); None means the service's default monotonic clock.
        self.clock = clock
        self.state_topic = state_topic
        self.wall_clock = wall_clock
        self._retry_backoff_s = retry_backoff_s
        self._max_retry_backoff_s = max_retry_backoff_s
        # Called after a leader's staged changes commit or roll back: records may have become
        # acquirable, and rolled-back records hold locks again (their deadlines must be queued).
        self._on_settled = on_settled
        self._hooks: list[ChangeHook] = []
        self._dirty: set[Leader] = set()
        # key -> the record: (key, value) or routed (key, value, route), e.g. partition tombstones.
        self._group_records: dict[bytes, tuple] = {}
        # Tickets for queued group records: a write that takes every pending group record makes
        # all tickets up to the newest durable (group_records_durable waits for one).
        self._group_ticket = 0
        self._group_durable_ticket = 0
        self._group_written = trio.Event()
        self._wakeup = trio.Event()
        # Scale-out: whether a route's state partition is this instance's to write (None: all are).
        # Records routed elsewhere are dropped, never tried: a write that cannot succeed would fail
        # every record batched with it, every time.
        self.may_write: Callable[[bytes | int], bool] | None = None
        self._failures = 0
        self.writable = True
        # The gauge mirrors `writable` from the start: a Gauge starts at 0, which would report a
        # proxy that has not written yet (nothing failed) as not writable.
        metrics.STATE_WRITABLE.set(1)

    # ----- the change hook ------------------------------------------------------------------

    def subscribe(self, hook: ChangeHook) -> None:
        self._hooks.append(hook)

    def _notify(self, change: Change) -> None:
        for hook in self._hooks:
            try:
                hook(change)
            except Exception:  # noqa: BLE001 - a subscriber must never break a commit
                log.exception("change hook failed", cause=change.cause.value)

    # ----- entering changes -------------------------------------------------------------------

    def record(self, leader: Leader, delta: StateDelta | None, cause: Cause, staged: StagedChange | None = None) -> int:
        """Note a change that must become durable; returns the version to wait for."""
        if staged is not None and staged.change_id:
            leader.version += 1
            # Its events wait for the commit (published with it) or the rollback (dropped).
            leader.staged.append((leader.version, staged.change_id, delta.events if delta is not None else ()))
            self._dirty.add(leader)
            self._wakeup.set()
            self._notify(Change(leader.key, cause, delta))
            return leader.version
        events = delta.events if delta is not None else ()
        if delta is not None and delta.start_offset < 0 and not delta.state_batches:
            # Nothing to write (e.g. only renewals); a caller answering a client still waits for
            # this partition's earlier changes, so an unfinished one is written (again) first.
            self._notify(Change(leader.key, cause, delta, events))
            return self.touch(leader) if leader.durable < leader.version else leader.version
        leader.version += 1
        self._dirty.add(leader)
        self._wakeup.set()
        self._notify(Change(leader.key, cause, delta, events))
        return leader.version

    def note_delivered(self, key: SharePartitionKey, events: tuple[RecordEvent, ...]) -> None:
        """Tell subscribers records were handed to a member (``AcquireResult.events``' ACQUIRED
        events); acquisitions are not persisted, so nothing is written."""
        if events:
            self._notify(Change(key, Cause.DELIVERED, None, events))

    def touch(self, leader: Leader) -> int:
        """Ask for one more write of `leader` (e.g. a retry finding an earlier write failed)."""
        leader.version += 1
        self._dirty.add(leader)
        self._wakeup.set()
        return leader.version

    def queue_group_records(self, records: list[tuple]) -> int:
        """Queue group records -- (key, value), or (key, value, route) to route like a share-partition's
        records -- written with the next batch; returns a ticket to wait on."""
        for record in records:
            key = record[0]
            self._group_records.pop(key, None)  # re-insert: the newest write of a key goes last
            self._group_records[key] = record
        self._group_ticket += 1
        self._wakeup.set()
        return self._group_ticket

    async def group_records_durable(self, ticket: int) -> None:
        """Wait until the group records queued with `ticket` (and all before) are durable.

        Failed writes are retried by the writer, so this waits through an outage; callers bound it.
        """
        while self._group_durable_ticket < ticket:
            await self._group_written.wait()

    def forget(self, leader: Leader) -> None:
        """Drop a removed share-partition from the next write (its tombstone must stay the last word,
        or another instance owns it now); whoever waits for its changes gets PersistError."""
        self._dirty.discard(leader)
        _abandon(leader)

    def forget_group_records(self, gone: Callable[[bytes | int], bool]) -> None:
        """Drop queued group records whose route ``gone`` says another instance now writes
        (scale-out hand-over); unrouted records stay."""
        self._group_records = {key: record for key, record in self._group_records.items()
                               if len(record) != 3 or not gone(record[2])}

    @property
    def pending_group_records(self) -> int:
        return len(self._group_records)

    async def durable(self, leader: Leader, version: int) -> None:
        """Wait until `version` of `leader` is durable; PersistError if its write failed."""
        while leader.durable < version:
            if leader.failed >= version:
                raise PersistError(f"state write for {leader.key} failed")
            await leader.settled.wait()

    async def persist_initial(self, leader: Leader) -> None:
        await self.durable(leader, self.record(leader, None, Cause.INITIALISED))

    @property
    def busy(self) -> bool:
        """Something is waiting to be written."""
        return bool(self._dirty or self._group_records)

    @property
    def writes_issued(self) -> int:
        """State writes issued since start (each one producer batch)."""
        return self._issued

    @property
    def idle(self) -> bool:
        """Nothing waits to be written and no write is in flight."""
        return not self.busy and self._last_write is None

    # ----- the writer task ------------------------------------------------------------------

    async def run(self) -> None:
        """Write whatever is dirty, forever (supervised by the service): a new write as soon as
        something is dirty and fewer than ``max_writes_in_flight`` are on their way, their
        outcomes applied in the order they were issued (see "Writes in flight" above)."""
        slots = trio.Semaphore(self.max_writes_in_flight)
        async with trio.open_nursery() as nursery:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                try:
                    slots.acquire_nowait()  # (acquire() would yield even with a slot free)
                except trio.WouldBlock:
                    await slots.acquire()
                while trio.current_time() < self._retry_at:  # backoff after a failed write (maybe
                    await trio.sleep_until(self._retry_at)  # one that failed while this waited)
                write = self._issue()
                if write is None:
                    slots.release()
                    continue
                # Handed to the producer in this same turn of the writer task, not by the task
                # that waits for it: a task started now runs only after the request that staged
                # the change has gone on to take its records (a ShareFetch's write went out
                # ~0.2 ms later, its whole take, on the critical path of its response).
                try:
                    submitted = await self._submit(write)
                except BaseException:
                    slots.release()
                    raise
                nursery.start_soon(self._complete_releasing, write, submitted, slots)

    async def _complete_releasing(self, write: _Write, submitted: Submitted, slots: trio.Semaphore) -> None:
        try:
            await self._complete(write, submitted)
        finally:
            slots.release()

    async def write_once(self) -> bool:
        """Write what is dirty now and wait for the outcome (after that of every write issued
        before it); True when it succeeded or there was nothing to write."""
        write = self._issue()
        if write is None:
            return True
        return await self._complete(write, await self._submit(write))

    def _issue(self) -> _Write | None:
        """Take everything dirty and build one write of it, or None when nothing is to be written."""
        leaders, self._dirty = self._dirty, set()
        may_write = self.may_write
        for leader in [leader for leader in leaders if leader.removed or (
                may_write is not None and not may_write(state_store.share_partition_route(leader.key)))]:
            leaders.discard(leader)  # removed (e.g. handed over) or led elsewhere: never written here
            _abandon(leader)
        groups, self._group_records = self._group_records, {}
        if may_write is not None:
            groups = {key: record for key, record in groups.items() if len(record) != 3 or may_write(record[2])}
        group_ticket = self._group_ticket  # every group record queued so far is in this batch
        if not leaders and not groups:
            return None
        now = self.wall_clock()
        offset = None if self.clock is None else now - self.clock()
        batch: list[tuple] = list(groups.values())
        covered: list[tuple[Leader, int]] = []
        snapshots: list[tuple[Leader, int, PartitionSnapshot]] = []  # bases, once durable
        for leader in leaders:
            current, within = self._current(leader)
            delta = self._update_for(leader, current, within)
            route = state_store.share_partition_route(leader.key)
            if delta is None:
                leader.snapshot_epoch += 1
                leader.delta_base = None  # unknown until this snapshot is durable
                key, value = state_store.snapshot_record(
                    leader.key, current, snapshot_epoch=leader.snapshot_epoch, state_epoch=leader.state_epoch,
                    create_timestamp=leader.create_timestamp, write_timestamp=now, clock_offset_ms=offset)
                snapshots.append((leader, leader.snapshot_epoch, current))
            else:
                base = leader.delta_base
                assert base is not None
                key, value = state_store.update_record(leader.key, delta, snapshot_epoch=base.epoch,
                                                       clock_offset_ms=offset)
                leader.delta_base = base.after(delta, current)
            batch.append((key, value, route))
            covered.append((leader, leader.version))
        write = _Write(self._issued, batch, covered, snapshots, groups, group_ticket, self._last_write,
                       issued_at=trio.current_time())
        self._issued += 1
        self._last_write = write
        return write

    async def _complete(self, write: _Write, submitted: Submitted) -> bool:
        """Wait for `write` (submitted), then apply its outcome once every write issued before it
        is applied."""
        try:
            error = await self._durable(write, submitted)
            if write.previous is not None:
                if not write.previous.applied.is_set():  # (waiting on a set event would yield)
                    await write.previous.applied.wait()
                write.previous = None  # the chain of applied writes is not kept alive
            if error is None and write.sequence < self._failed_below:
                # Its snapshots carry an earlier write's changes, which were rolled back.
                error = PersistError("a state write issued before this one failed")
            if error is not None:
                self._failed(error, write)
            else:
                self._succeeded(write)
        except BaseException:
            # Cancelled (shutdown): the outcome is unknown and nothing was rolled back; whatever
            # writes next (the shutdown flush) writes it all again.
            self._forget(write, requeue=True)
            raise
        self._forget(write)
        return error is None

    def _forget(self, write: _Write, *, requeue: bool = False) -> None:
        """`write` is settled (applied, or with `requeue` dirty again): the next ones may apply."""
        if requeue:
            self._requeue(write)
        if self._last_write is write:
            self._last_write = None
        write.applied.set()

    async def _submit(self, write: _Write) -> Submitted:
        """Hand `write`'s records to the producer, after the write issued before it: records reach
        the producer in issue order. Yields only when that one is still being handed over or the
        producer's queue is full. None: a writer without ``submit``, written by :meth:`_durable`.
        Cancelled meanwhile (shutdown), the write is dirty again for the flush."""
        if not self.ordered_submit:
            return None
        try:
            if write.previous is not None and not write.previous.submitted.is_set():
                await write.previous.submitted.wait()
            return await self.writer.submit(self.state_topic, write.batch)
        except PersistError as exc:
            return exc
        except BaseException:
            self._forget(write, requeue=True)
            raise
        finally:
            write.submitted.set()

    async def _durable(self, write: _Write, submitted: Submitted) -> PersistError | None:
        """Wait until `write` is durable; the error when it failed."""
        try:
            if isinstance(submitted, PersistError):
                return submitted
            if submitted is None:
                await self.writer.write(self.state_topic, write.batch)
            else:
                await submitted.wait()
            return None
        except PersistError as exc:
            return exc
        finally:
            metrics.STATE_WRITE_SECONDS.observe(trio.current_time() - write.issued_at)

    def _succeeded(self, write: _Write) -> None:
        batch, covered, snapshots = write.batch, write.covered, write.snapshots
        _WRITES_OK.inc()
        metrics.STATE_WRITE_BYTES.inc(sum(len(r[0]) + len(r[1] or b"") for r in batch))
        if snapshots:
            _SNAPSHOT_RECORDS.inc(len(snapshots))
        if len(covered) > len(snapshots):
            _UPDATE_RECORDS.inc(len(covered) - len(snapshots))
        if self.deltas is not None:
            for leader, epoch, current in snapshots:
                # Only if no later snapshot was issued meanwhile and no failed write cleared it since.
                if leader.snapshot_epoch == epoch and leader.delta_base is None:
                    leader.delta_base = DeltaBase(current, epoch, leader.state_epoch, leader.create_timestamp)
        self._failures = 0
        self._set_writable(True)
        if write.group_ticket > self._group_durable_ticket:
            self._group_durable_ticket = write.group_ticket
            self._group_written.set()
            self._group_written = trio.Event()
        for leader, version in covered:
            leader.durable = max(leader.durable, version)
            committed = [(change_id, events) for v, change_id, events in leader.staged if v <= version]
            if committed:
                leader.staged = [entry for entry in leader.staged if entry[0] > version]
                for change_id, events in committed:
                    delta = leader.engine.commit(change_id)
                    if delta is not None and delta.events:
                        events = events + delta.events
                    if delta is not None or events:
                        self._notify(Change(leader.key, Cause.COMMITTED, delta, events))
                # An SPSO move needs no write of its own: the snapshot just written has the
                # finished records at its head, which replay folds into the same SPSO.
                self._on_settled(leader)
            _settle(leader)

    def _requeue(self, write: _Write) -> None:
        """Mark `write`'s share-partitions dirty and its group records queued again."""
        for leader, _ in write.covered:
            leader.delta_base = None  # whatever of it landed, the next record is a snapshot
            if not leader.removed:
                self._dirty.add(leader)
        for key, record in write.groups.items():
            self._group_records.setdefault(key, record)  # a newer queued write of the key wins
        self._wakeup.set()

    def _current(self, leader: Leader) -> tuple[PartitionSnapshot, list[Interval] | None]:
        """`leader`'s snapshot now and, when it was spliced (see below), the offset ranges it
        changed since the previous write, which `plan` then diffs alone.

        With a usable delta base that knows the snapshot of the previous write (`DeltaBase.latest`),
        the snapshot is that one with the engine's view of what changed since spliced in
        (state_delta's "Changed ranges"): a fragmented window is not walked whole on every write.
        The engine's changed ranges are drained on every write, whatever is written, so that they
        always start at the previous write."""
        engine = leader.engine
        changed = engine.drain_changed()
        base = self._usable_base(leader)
        latest = None if base is None else base.latest
        start = engine.start_offset
        if changed is None or latest is None or start < latest.start_offset:
            return engine.snapshot(), None
        changed = [(max(first, start), last) for first, last in changed if last >= start]
        return splice(latest, start, changed, engine.persisted_view(changed)), changed

    def _usable_base(self, leader: Leader) -> DeltaBase | None:
        """The base an update may be written over now, or None: a snapshot is due."""
        base = leader.delta_base
        if self.deltas is None or base is None:
            return None
        if base.state_epoch != leader.state_epoch or base.create_timestamp != leader.create_timestamp:
            return None  # e.g. a reset: an update cannot carry the new state epoch
        return base

    def _update_for(self, leader: Leader, current: PartitionSnapshot,
                    within: list[Interval] | None) -> StateDelta | None:
        """The cumulative update to write for `leader` now, or None for a snapshot."""
        base = self._usable_base(leader)
        if base is None:
            return None
        return plan(base, current, self.deltas, within)

    def _failed(self, exc: PersistError, write: _Write) -> None:
        if write.sequence >= self._failed_below:
            # The first failure since this write was issued: the backoff grows once per attempt,
            # not once per write that was in flight beside it.
            self._failures += 1
            self._retry_at = trio.current_time() + min(
                self._max_retry_backoff_s, self._retry_backoff_s * 2 ** min(self._failures, 10))
            log.error("state write failed; staged acknowledgements rolled back, the rest retried",
                      error=str(exc), partitions=len(write.covered), attempt=self._failures)
        else:
            log.warning("state write in flight behind a failed one counted as failed; written again",
                        error=str(exc), partitions=len(write.covered))
        # Every write issued so far counts as failed too: each may carry, in a snapshot, changes
        # of this one's that are rolled back now.
        self._failed_below = self._issued
        metrics.STATE_WRITES.labels(outcome="failed").inc()
        self._set_writable(False)
        for leader, version in write.covered:
            leader.failed = max(leader.failed, version)
            # Rolled back: the records are as they were, so their events never happened.
            rolled = [change_id for v, change_id, _ in leader.staged if v <= version]
            leader.staged = [entry for entry in leader.staged if entry[0] > version]
            for change_id in rolled:
                leader.engine.rollback(change_id)
            if rolled:
                self._on_settled(leader)
            _settle(leader)
        # Written again (with backoff): unstaged changes in it must become durable, and the failed
        # write may have landed, so the rolled-back truth is re-asserted -- unless a share-partition
        # was removed meanwhile (deleted, or handed to another instance).
        self._requeue(write)

    def _set_writable(self, writable: bool) -> None:
        if writable != self.writable:
            self.writable = writable
            log.info("state topic writable" if writable else "state topic NOT writable")
        metrics.STATE_WRITABLE.set(1 if writable else 0)

    async def flush(self, leaders: list[Leader], timeout_s: float = 10.0) -> None:
        """Shutdown: write what is dirty and wait for writes in flight; gives up after `timeout_s`."""
        with trio.move_on_after(timeout_s):
            while True:
                if self.busy and not await self.write_once():
                    return
                pending = [leader for leader in leaders if leader.durable < leader.version > leader.failed]
                if not pending:
                    return
                await pending[0].settled.wait()  # a write in flight (or one cancelled: dirty again)


def _settle(leader: Leader) -> None:
    leader.settled.set()
    leader.settled = trio.Event()


def _abandon(leader: Leader) -> None:
    """Its pending changes will never be written: fail whoever waits for them."""
    if leader.failed < leader.version:
        leader.failed = leader.version
        _settle(leader)


__all__ = ["DEFAULT_WRITES_IN_FLIGHT", "Cause", "Change", "ChangeHook", "CommitPipeline"]
