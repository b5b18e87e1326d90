"""Share state <-> state-topic records: what is written, and how a restart reads it back.

Record layout on the (compacted) state topic
--------------------------------------------
Per share-partition, keyed by (group, topic id, partition) in Kafka's own ShareSnapshotKey
format, the proxy writes a **ShareSnapshot** carrying the partition's whole durable state (SPSO
and coalesced state batches; Acquired records are written as they were before acquisition, as
KIP-932 prescribes) every time a change must become durable.

Why snapshots and not Kafka's ShareUpdate deltas: Kafka keys every ShareUpdate of a
share-partition with the same key and runs ``__share_group_state`` with ``cleanup.policy=delete``
plus its own pruning. On a *compacted* topic only the newest record per key survives, so a chain
of deltas would silently lose all but the last one. A snapshot is self-contained, so compaction
keeps exactly what recovery needs. The in-flight window is bounded by the record-lock limit, so a
snapshot stays small (a handful of coalesced batches in steady state).

With ``--state-deltas on`` the proxy also writes **cumulative** ShareUpdates
(:mod:`proxy.share.state_delta`): each carries everything that changed since the share-partition's
last durable snapshot, so the newest one per key -- all compaction keeps -- is enough, and a large
fragmented window is not rewritten whole on every change. Replay applies the updates written after
the newest snapshot, matching on ``snapshot_epoch`` (Kafka's own updates replay the same way).

Placement (layout 2, docs/scale-out.md): every record of a share-partition -- snapshot, update,
tombstones -- goes to its **home** state-topic partition, ``crc32(topic id + partition) % N``
(:func:`share_partition_route`), so every group's share-partitions of one topic-partition sit
together and one owner can lead them all (issue 15); a group's three records go to
``crc32("group:" + group id) % N`` (:func:`group_route`). One home per key also keeps a
share-partition's update beside its snapshot: replay reads partitions without an order between
them, and an update read before its snapshot would be dropped. A **layout marker** (record type
32004, on partition 0) names the layout and N the records were placed for.

Layout 1 (before 0.x of issue 15) put a share-partition where librdkafka's default partitioner put
its snapshot key, and each group record where its own key fell. Replay therefore folds each state
partition on its own: for a key seen on its home partition the home fold wins (a tombstone there
included); a key seen only elsewhere is taken from there (the newest snapshot by state and
snapshot epoch if several partitions hold one). :class:`LayoutMigration` lists what a start-up
migration writes to bring such a topic to layout 2: copies of the winning records at home, then
tombstones of the copies left elsewhere, then the marker (:mod:`proxy.share.state_layout`).

Per group, the proxy's own record types (codec.share_state types 32001-32003) hold the group epoch,
the initialised share-partitions and the group's dynamic configs. A deleted group or partition is
a tombstone.

Replay never refuses to start because of one record: a record that does not decode (bad key or
value bytes, an unknown record type or value version) or cannot be applied (a state batch with a
delivery state the proxy does not serve from, offsets out of order, a negative delivery count) is
skipped as if it were not on the topic, logged with its topic-partition and offset, and counted
(``RecoveredState.skipped``, the ``ksp_share_state_records_skipped`` counter). Skipping keeps
whatever an earlier record of the same key established, so a share-partition falls back to its
previous snapshot when one is still on the topic.

IN_PROGRESS batches (state 5) carry their owner and times in the state batch's extension tags
(100 InProgressStartTimestamp, 101 LastProgressTimestamp, 102 InProgressMemberId; docs/codec.md).
On the topic the times are wall-clock ms, so they mean the same after a restart; the engine keeps
them on its monotonic clock. The conversion happens here, at the edge, with ``clock_offset_ms`` =
wall clock - engine clock (:func:`engine_clock_offset_ms` for the service's default clocks):
wall = engine + offset when writing, engine = wall - offset when replaying.

ARCHIVING batches (state 3, KIP-1191: the dead-letter write pending) carry their reason in tag 103
ArchiveReason; they are resumed as ARCHIVING, so a restart dead-letters them again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from codec import share_state as records
from codec.errors import StateRecordError
from codec.share_events import DEAD_LETTER_REASONS, ArchiveReason
from proxy.share.metrics import STATE_RECORDS_SKIPPED
from proxy.share.persister import route_partition
from proxy.share.partition import PartitionSnapshot, PersistedBatch, SharePartitionKey, StateDelta
from proxy.share.states import RecordState

log = structlog.get_logger(__name__)

# The delivery states a share-partition can be rebuilt from. Acquired is never persisted (it is
# written as the state before acquisition); anything else is unknown. ARCHIVING (3) is resumed with
# its reason (tag 103) and dead-lettered again (KIP-1191).
RESUMABLE_STATES: frozenset[int] = frozenset(
    {RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVING, RecordState.ARCHIVED,
     RecordState.IN_PROGRESS}
)


def engine_clock_offset_ms() -> int:
    """Wall clock - engine clock (ms) for the service's default clocks (manager.wall_clock_ms and
    manager.monotonic_ms): what converts IN_PROGRESS times between the engine and the topic."""
    return time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000


class InapplicableStateRecord(StateRecordError):
    """A record that decodes but whose content replay cannot apply (it is skipped)."""


class LoggedRecord(Protocol):
    """A replayed record and where it was on the state topic (persister.ReplayedRecord)."""

    partition: int
    offset: int
    key: bytes
    value: bytes | None


@dataclass(slots=True)
class PartitionRecovery:
    """What replay found for one share-partition."""

    snapshot: PartitionSnapshot
    snapshot_epoch: int
    state_epoch: int
    create_timestamp: int
    updates: list[StateDelta] = field(default_factory=list)


@dataclass(slots=True)
class GroupRecovery:
    group_epoch: int = 0
    initialized: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    configs: dict[str, str] = field(default_factory=dict)
    # False while only configs were seen: configs may be set before a group's first member
    # arrives (as in Kafka), and restoring them must not create the group.
    exists: bool = False


LAYOUT = 2  # the placement this version writes (see the module docstring)


@dataclass(frozen=True, slots=True)
class LayoutMarker:
    """What the marker record says: the placement scheme and the partition count it placed for."""

    layout: int
    partitions: int


@dataclass(slots=True)
class LayoutMigration:
    """What brings a replayed topic to layout 2 (written in this order by state_layout.migrate).

    ``copies``: (key, value, route) of the records whose key's winning copy sits off its home
    partition -- group records, then each share-partition's snapshot followed by the updates replay
    applied after it -- routed like any layout-2 write. ``tombstones``: (key, partition) of every live record off its home
    partition, to delete once the copies are durable (the home copy of the same key is never
    touched: a tombstone is written to the old partition only)."""

    copies: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)
    tombstones: list[tuple[bytes, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.copies or self.tombstones)


@dataclass(slots=True)
class RecoveredState:
    partitions: dict[SharePartitionKey, PartitionRecovery] = field(default_factory=dict)
    groups: dict[str, GroupRecovery] = field(default_factory=dict)
    skipped: int = 0
    # The layout marker found (None: a layout-1 or empty topic), what a migration must write, and
    # records skipped because they were off their home partition (recover(skip_misplaced=True)).
    layout: LayoutMarker | None = None
    migration: LayoutMigration = field(default_factory=LayoutMigration)
    misplaced: int = 0
    records: int = 0  # read and folded, skipped and misplaced ones included

    def needs_migration(self, partitions: int) -> bool:
        """Whether the topic, of ``partitions`` partitions, must be migrated before it is served."""
        return self.layout != LayoutMarker(LAYOUT, partitions) or bool(self.migration)


def snapshot_record(
    key: SharePartitionKey,
    snapshot: PartitionSnapshot,
    *,
    snapshot_epoch: int,
    state_epoch: int,
    create_timestamp: int,
    write_timestamp: int,
    delivery_complete_count: int = -1,
    clock_offset_ms: int | None = None,
) -> tuple[bytes, bytes]:
    """The ShareSnapshot record of one share-partition; IN_PROGRESS times are written as wall-clock
    ms (``clock_offset_ms`` = wall - engine clock, :func:`engine_clock_offset_ms` when None)."""
    offset = engine_clock_offset_ms() if clock_offset_ms is None else clock_offset_ms
    group_id, topic_id, partition = key
    value = records.encode_share_value(
        records.RecordType.SHARE_SNAPSHOT, snapshot_epoch=snapshot_epoch, state_epoch=state_epoch, leader_epoch=-1,
        start_offset=snapshot.start_offset, delivery_complete_count=delivery_complete_count,
        create_timestamp=create_timestamp, write_timestamp=write_timestamp,
        state_batches=[_state_batch(b, offset) for b in snapshot.state_batches])
    return records.encode_key(records.ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition)), value


def _state_batch(b: PersistedBatch, offset: int) -> records.StateBatchView:
    """A state batch as written: the extension tags only on IN_PROGRESS batches (100-102, times as
    wall clock: engine + ``offset``) and ARCHIVING ones (103), defaults (so omitted) elsewhere."""
    state = b.delivery_state
    if state == RecordState.ARCHIVING:
        return (b.first_offset, b.last_offset, int(state), b.delivery_count, -1, -1, None, int(b.archive_reason))
    if state != RecordState.IN_PROGRESS:
        return (b.first_offset, b.last_offset, int(state), b.delivery_count, -1, -1, None, 0)
    return (b.first_offset, b.last_offset, int(state), b.delivery_count, b.in_progress_start + offset,
            b.last_progress + offset, b.member_id, 0)


def update_record(
    key: SharePartitionKey, delta: StateDelta, *, snapshot_epoch: int, clock_offset_ms: int | None = None,
) -> tuple[bytes, bytes]:
    """A ShareUpdate record for ``delta`` over the snapshot of ``snapshot_epoch`` (the commit
    pipeline's cumulative updates, and tools and tests that need Kafka's delta records)."""
    offset = engine_clock_offset_ms() if clock_offset_ms is None else clock_offset_ms
    group_id, topic_id, partition = key
    value = records.encode_share_value(
        records.RecordType.SHARE_UPDATE, snapshot_epoch=snapshot_epoch, leader_epoch=-1,
        start_offset=delta.start_offset, delivery_complete_count=-1,
        state_batches=[_state_batch(b, offset) for b in delta.state_batches])
    return records.encode_key(records.ShareUpdateKey(group_id=group_id, topic_id=topic_id, partition=partition)), value


def share_partition_route(key: SharePartitionKey) -> bytes:
    """What the writer routes a share-partition's records by (layout 2): its topic id and partition,
    not its group, so every group's share-partitions of one topic-partition share a home
    (persister.route_partition of these bytes)."""
    _, topic_id, partition = key
    return topic_id.bytes + partition.to_bytes(4, "big")


def layout1_share_partition_route(key: SharePartitionKey) -> bytes:
    """Where layout 1 put a share-partition: by its ShareSnapshotKey bytes (tests and tools that
    build a layout-1 topic; the proxy no longer writes there)."""
    group_id, topic_id, partition = key
    return records.encode_key(records.ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition))


def group_route(group_id: str) -> bytes:
    """What the writer routes a group's records by (layout 2): all three on one partition."""
    return b"group:" + group_id.encode()


def layout_record(partitions: int) -> tuple[bytes, bytes, int]:
    """The layout-2 marker for a topic of ``partitions`` partitions, on partition 0."""
    key, value = records.encode_record(records.ProxyStateLayoutKey(),
                                       records.ProxyStateLayoutValue(layout=LAYOUT, partitions=partitions))
    return key, value, 0


def partition_tombstone(key: SharePartitionKey) -> tuple[bytes, None]:
    """The snapshot key's tombstone alone (the service writes :func:`partition_tombstones`)."""
    group_id, topic_id, partition = key
    return records.encode_key(records.ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition)), None


def partition_tombstones(key: SharePartitionKey) -> list[tuple[bytes, None, bytes]]:
    """Tombstones of a deleted share-partition: its snapshot key and its update key, both routed to
    the snapshot's state-topic partition (an update-key tombstone read there after a later snapshot
    of a re-created share-partition would drop it)."""
    group_id, topic_id, partition = key
    route = share_partition_route(key)
    return [
        (records.encode_key(records.ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition)),
         None, route),
        (records.encode_key(records.ShareUpdateKey(group_id=group_id, topic_id=topic_id, partition=partition)),
         None, route),
    ]


GroupRecord = tuple[bytes, bytes | None, bytes]  # (key, value or tombstone, route): group_route


def group_metadata_record(group_id: str, group_epoch: int, create_timestamp: int) -> GroupRecord:
    return (*records.encode_record(
        records.ProxyShareGroupMetadataKey(group_id=group_id),
        records.ProxyShareGroupMetadataValue(
            group_epoch=group_epoch, create_timestamp=create_timestamp, metadata_hash=0
        ),
    ), group_route(group_id))


def group_partitions_record(
    group_id: str, initialized: Iterable[tuple[uuid.UUID, int]], topic_names: Mapping[uuid.UUID, str]
) -> GroupRecord:
    value_type = records.ProxyShareGroupPartitionsValue
    topic_type = value_type.TopicPartitions
    by_topic: dict[uuid.UUID, list[int]] = {}
    for topic_id, partition in initialized:
        by_topic.setdefault(topic_id, []).append(partition)
    return (*records.encode_record(
        records.ProxyShareGroupPartitionsKey(group_id=group_id),
        value_type(
            initializing_topics=(),
            initialized_topics=tuple(
                topic_type(topic_id=topic_id, topic_name=topic_names.get(topic_id, ""),
                           partitions=tuple(sorted(parts)))
                for topic_id, parts in sorted(by_topic.items())
            ),
            deleting_topics=(),
        ),
    ), group_route(group_id))


def group_config_record(group_id: str, configs: Mapping[str, str]) -> GroupRecord:
    value_type = records.ProxyShareGroupConfigValue
    config_type = value_type.Config
    return (*records.encode_record(
        records.ProxyShareGroupConfigKey(group_id=group_id),
        value_type(configs=tuple(config_type(name=k, value=str(v)) for k, v in sorted(configs.items()))),
    ), group_route(group_id))


def group_tombstones(group_id: str) -> list[GroupRecord]:
    route = group_route(group_id)
    return [
        (records.encode_key(records.ProxyShareGroupMetadataKey(group_id=group_id)), None, route),
        (records.encode_key(records.ProxyShareGroupPartitionsKey(group_id=group_id)), None, route),
        (records.encode_key(records.ProxyShareGroupConfigKey(group_id=group_id)), None, route),
    ]


def _check_batches(state_batches: Iterable[records.StateBatchView]) -> None:
    """InapplicableStateRecord if the engine cannot use one of these state batches."""
    for first, last, state, count, *_ in state_batches:
        if state not in RESUMABLE_STATES:
            raise InapplicableStateRecord(f"state batch {first}-{last} has delivery state {state}, "
                                          "which a share-partition cannot be rebuilt from")
        if not 0 <= first <= last or count < 0:
            raise InapplicableStateRecord(f"state batch {first}-{last} with delivery count {count} is impossible")


def _batches(state_batches: Iterable[records.StateBatchView], clock_offset_ms: int) -> tuple[PersistedBatch, ...]:
    """Persisted state batches from checked ones (see _check_batches). IN_PROGRESS times come back
    on the engine's clock (wall - ``clock_offset_ms``)."""
    batches = []
    for first, last, state, count, start, progress, member_id, reason in state_batches:
        if state == RecordState.IN_PROGRESS:
            # The engine gives a state-5 batch without an owner back as Available (delivered again).
            batches.append(PersistedBatch(first, last, RecordState.IN_PROGRESS, count,
                                          start - clock_offset_ms if start != -1 else -1,
                                          progress - clock_offset_ms if progress != -1 else -1,
                                          member_id))
        elif state == RecordState.ARCHIVING:
            # An unknown reason (0, or one this version does not know) is kept as NONE: the engine
            # then derives it from the count, as Kafka does.
            batches.append(PersistedBatch(first, last, RecordState.ARCHIVING, count,
                                          archive_reason=ArchiveReason(reason) if reason in DEAD_LETTER_REASONS
                                          else ArchiveReason.NONE))
        else:
            batches.append(PersistedBatch(first, last, RecordState(state), count))
    return tuple(batches)


def recover(
    replayed: Iterable[LoggedRecord] | Iterable[tuple[bytes, bytes | None]], *, topic: str | None = None,
    clock_offset_ms: int | None = None, partitions: int | None = None, skip_misplaced: bool = False,
    groups_complete: bool = True,
) -> RecoveredState:
    """Fold state-topic records, in log order per state partition, into what each partition and
    group needs.

    ``replayed`` holds persister.ReplayedRecord (or bare (key, value) pairs, whose position is
    then unknown), iterated once: a reader may yield them as it reads the topic, and only the
    fold's state is held; ``topic`` names the state topic in the log line of a skipped record.
    ``clock_offset_ms`` (wall - engine clock; :func:`engine_clock_offset_ms` when None) brings
    IN_PROGRESS times onto the clock of the engines that will serve them.

    ``partitions`` (the state topic's partition count) turns on placement: each record is judged
    against its layout-2 home partition; a key seen at home is taken from there, one seen only
    elsewhere from there (layout 1, or a migration cut short), and ``migration`` lists what brings
    the topic to layout 2. None: every record counts as at home (bare pairs always do).
    ``skip_misplaced``: records off their home partition are skipped and counted (``misplaced``)
    instead, as an instance must that reads only the partitions it owns. ``groups_complete`` False
    (such an instance again): a group's records may sit on a partition not read, so a
    share-partition is kept even when its group's metadata record was not seen.

    Cost: every record is read and checked in log order (so a damaged one is skipped, logged and
    counted wherever it is), but only what survives -- each share-partition's newest snapshot
    and the updates after it -- is turned into engine values, at the end. Share-state values are
    read by ``codec.share_state.read_share_value`` (no generic bounds walk, no kio entities) and
    fall back to the generic decoder when they are not in the canonical encoding; keys are
    decoded once per distinct key.
    """
    to_engine = engine_clock_offset_ms() if clock_offset_ms is None else clock_offset_ms
    state = RecoveredState()
    fold = _Fold(state, partitions)
    for item in replayed:
        state.records += 1
        if isinstance(item, tuple):
            key_bytes, value_bytes = item[0], item[1]  # (a routed writer record has its route third)
            partition = offset = None
        else:
            key_bytes, value_bytes, partition, offset = item.key, item.value, item.partition, item.offset
        try:
            if not fold.apply(key_bytes, value_bytes, partition, skip_misplaced):
                state.misplaced += 1
        except StateRecordError as error:
            state.skipped += 1
            STATE_RECORDS_SKIPPED.inc()
            log.warning("state record skipped", topic=topic, partition=partition, offset=offset, error=str(error))
    fold.finish()
    # Engine values only for what survived.
    for pkey, (snapshot, updates) in fold.partitions.items():
        state.partitions[pkey] = PartitionRecovery(
            PartitionSnapshot(snapshot.start_offset, _batches(snapshot.state_batches, to_engine)),
            snapshot_epoch=snapshot.snapshot_epoch,
            state_epoch=snapshot.state_epoch,
            create_timestamp=snapshot.create_timestamp,
            updates=[StateDelta(u.start_offset, _batches(u.state_batches, to_engine)) for u in updates],
        )
    # A share-partition whose group is gone (tombstoned) is not served again.
    for pkey in [k for k in state.partitions if groups_complete or k[0] in state.groups]:
        if pkey[0] not in state.groups or not state.groups[pkey[0]].exists:
            del state.partitions[pkey]
    # A group without its metadata record is gone (or was never created: configs may be set before a
    # group's first member arrives, as in Kafka); what is left of it is its configs, if any.
    for group_id, group in list(state.groups.items()):
        if group.exists:
            continue
        group.initialized.clear()
        if not group.configs:
            del state.groups[group_id]
    return state


_SHARE_KINDS = (records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE)
_ShareFold = tuple[records.ShareValueView, list[records.ShareValueView]]  # newest snapshot, updates after it


class _Fold:
    """The log-order fold of state records (one `apply` per record). Share-partitions are kept as
    checked value views -- (newest snapshot, the updates after it with its epoch) -- so a record
    a newer snapshot replaces never becomes engine values.

    Each state partition is folded on its own (a tombstone clears only its own partition's copy):
    records at their home partition (all of them when the partition count is not given) directly
    into the result, records elsewhere per (key, partition) on the side, with their raw bytes (what
    a migration copies). `finish` merges: a share-partition is taken from the live copy with the
    highest (state epoch, snapshot epoch), home first on a tie; a group record from home when it
    is live there, else from the best copy elsewhere. Live copies elsewhere exist only before or
    during a migration, which copies them home unchanged, so the rule never has to choose between
    different contents except where the epochs order them."""

    __slots__ = ("state", "_partitions", "_keys", "_ids", "_count", "_home_group_live", "_away", "_away_groups",
                 "_away_live", "_winners")

    def __init__(self, state: RecoveredState, partitions: int | None = None) -> None:
        self.state = state
        self._count = partitions
        # By share-partition number (an int hashes much faster than a key holding a UUID): the
        # newest checked snapshot and the updates after it, folded at home.
        self._partitions: dict[int, _ShareFold] = {}
        # Key bytes -> (record type, key entity, share-partition number or -1, home partition or -1):
        # a key is decoded once, however many records carry it. (Keys that do not decode are not kept.)
        self._keys: dict[bytes, tuple[records.RecordType, object, int, int]] = {}
        self._ids: dict[SharePartitionKey, int] = {}  # share-partition -> its number
        # Off-home bookkeeping (empty on a layout-2 topic): whether each group key is live at home;
        # share folds per (number, partition); decoded group records per (key, partition); the raw
        # value of every off-home key per (key, partition), None once tombstoned there.
        self._home_group_live: dict[bytes, bool] = {}
        self._away: dict[int, dict[int, tuple]] = {}  # (view, updates, the raw records applied)
        self._away_groups: dict[bytes, dict[int, tuple[records.RecordType, object, object | None]]] = {}
        self._away_live: dict[tuple[bytes, int], bytes | None] = {}
        self._winners: dict[int, int] = {}  # share-partition number -> the partition it was taken from

    @property
    def partitions(self) -> dict[SharePartitionKey, _ShareFold]:
        """What survived, by share-partition, in the order the log left them."""
        by_id = {pid: pkey for pkey, pid in self._ids.items()}
        return {by_id[pid]: kept for pid, kept in self._partitions.items()}

    def _known(self, key_bytes: bytes) -> tuple[records.RecordType, object, int, int]:
        known = self._keys.get(key_bytes)
        if known is None:
            kind, key = records.decode_key(key_bytes)
            pid = home = -1
            if kind in _SHARE_KINDS:
                pkey = (key.group_id, key.topic_id, int(key.partition))
                pid = self._ids.setdefault(pkey, len(self._ids))
                if self._count:
                    home = route_partition(share_partition_route(pkey), self._count)
            elif kind is records.RecordType.PROXY_STATE_LAYOUT:
                home = 0
            elif self._count:
                home = route_partition(group_route(key.group_id), self._count)
            known = self._keys[key_bytes] = (kind, key, pid, home)
        return known

    def apply(self, key_bytes: bytes, value_bytes: bytes | None, partition: int | None = None,
              skip_misplaced: bool = False) -> bool:
        """Apply one record; raises StateRecordError (InapplicableStateRecord included), before
        changing anything, if it cannot be. False: skipped as off its home partition."""
        if type(key_bytes) is not bytes:
            key_bytes = bytes(key_bytes)
        kind, key, pid, home = self._known(key_bytes)
        at_home = partition is None or home < 0 or partition == home
        if not at_home and skip_misplaced:
            return False
        if pid < 0:
            if kind is records.RecordType.PROXY_STATE_LAYOUT:
                marker = records.decode_value(kind, value_bytes)
                self.state.layout = None if marker is None else LayoutMarker(int(marker.layout), int(marker.partitions))
                return True
            value = records.decode_value(kind, value_bytes)
            if at_home:
                self._home_group_live[key_bytes] = value is not None
                _apply_group(self.state, kind, key, value)
            else:
                self._away_groups.setdefault(key_bytes, {})[partition] = (kind, key, value)
                self._away_live[(key_bytes, partition)] = value_bytes
            return True
        if at_home:
            folds = self._partitions
            slot = pid
        else:
            folds = self._away.setdefault(pid, {})
            slot = partition
        if value_bytes is None:
            folds.pop(slot, None)
        elif kind is records.RecordType.SHARE_SNAPSHOT:
            view = _share_view(kind, value_bytes)
            _check_batches(view.state_batches)
            # Off home, the raw records the fold applied come along: a migration copies exactly those.
            folds[slot] = (view, []) if at_home else (view, [], [(key_bytes, value_bytes)])
        else:
            # An update: applied when it follows a snapshot with its epoch; otherwise read only so that
            # a damaged one is skipped (and counted) like any other record.
            view = _share_view(kind, value_bytes)
            current = folds.get(slot)
            if current is not None and view.snapshot_epoch == current[0].snapshot_epoch:
                _check_batches(view.state_batches)
                current[1].append(view)
                if not at_home:
                    current[2].append((key_bytes, value_bytes))
        if not at_home:
            self._away_live[(key_bytes, partition)] = value_bytes
        return True

    def finish(self) -> None:
        """Merge what was found only off its home partition, and list the migration."""
        if not self._away_live:
            return
        for pid, by_partition in self._away.items():
            if not by_partition:
                continue
            # The newest snapshot wins; on a tie the home copy (a migration's copy is identical),
            # then the highest partition, to be deterministic.
            candidates = [(p, kept, 0) for p, kept in by_partition.items()]
            home = self._partitions.get(pid)
            if home is not None:
                candidates.append((-1, home, 1))
            partition, kept, _ = max(candidates, key=lambda c: (c[1][0].state_epoch, c[1][0].snapshot_epoch, c[2], c[0]))
            if partition >= 0:
                self._partitions[pid] = kept[:2]
                self._winners[pid] = partition
        group_winners: dict[bytes, int] = {}
        for key_bytes, by_partition in self._away_groups.items():
            live = {p: record for p, record in by_partition.items() if record[2] is not None}
            if self._home_group_live.get(key_bytes) or not live:
                continue
            partition, (kind, key, value) = max(live.items(), key=_group_record_rank)
            _apply_group(self.state, kind, key, value)
            group_winners[key_bytes] = partition
        self._plan_migration(group_winners)

    def _plan_migration(self, group_winners: dict[bytes, int]) -> None:
        migration = self.state.migration
        for (key_bytes, partition), value_bytes in self._away_live.items():
            if value_bytes is None:
                continue
            migration.tombstones.append((key_bytes, partition))
            kind, key, pid, _ = self._keys[key_bytes]
            if pid < 0 and group_winners.get(key_bytes) == partition:
                migration.copies.append((key_bytes, value_bytes, group_route(key.group_id)))
        # A share-partition's winning snapshot and the updates the fold applied after it, in log
        # order: replayed at home they fold to exactly the same (an update not applied is not copied).
        for pid, partition in self._winners.items():
            view, _, applied = self._away[pid][partition]
            route = None
            for key_bytes, value_bytes in applied:
                if route is None:
                    _, key, _, _ = self._keys[key_bytes]
                    route = share_partition_route((key.group_id, key.topic_id, int(key.partition)))
                migration.copies.append((key_bytes, value_bytes, route))


def _group_record_rank(item: tuple[int, tuple[records.RecordType, object, object | None]]) -> tuple[int, int]:
    """Which off-home copy of a group record wins when several partitions hold one: the highest group
    epoch for metadata (it only grows), else the highest partition (deterministic)."""
    partition, (kind, _, value) = item
    epoch = int(value.group_epoch) if kind is records.RecordType.PROXY_GROUP_METADATA and value is not None else -1
    return epoch, partition


def _share_view(kind: records.RecordType, value_bytes: bytes) -> records.ShareValueView:
    """The value read by the fast reader, else by the generic decoder (which raises on damage)."""
    view = records.read_share_value(kind, value_bytes)
    if view is None:
        view = records.share_value_view(records.decode_value(kind, value_bytes))
    return view


def _apply_group(state: RecoveredState, kind: records.RecordType, key: object, value: object | None) -> None:
    """Apply one decoded group record (types 32001-32003)."""
    # The three group records have keys of their own, so they may sit on different partitions of
    # the state topic, and replay reads partition by partition: only each key's own history is in
    # order. Each record therefore sets (or, as a tombstone, clears) only its own part; whether the
    # group exists is decided by its metadata record alone (see `recover`).
    group = state.groups.setdefault(key.group_id, GroupRecovery())
    if value is None:
        if kind is records.RecordType.PROXY_GROUP_METADATA:
            group.exists = False
            group.group_epoch = 0
        elif kind is records.RecordType.PROXY_GROUP_PARTITIONS:
            group.initialized.clear()
        else:
            group.configs.clear()
        return
    if kind is records.RecordType.PROXY_GROUP_METADATA:
        group.group_epoch = int(value.group_epoch)
        group.exists = True
    elif kind is records.RecordType.PROXY_GROUP_PARTITIONS:
        group.initialized = {
            (t.topic_id, int(p)) for t in value.initialized_topics for p in t.partitions
        }
    elif kind is records.RecordType.PROXY_GROUP_CONFIG:
        group.configs = {c.name: c.value for c in value.configs if c.value is not None}
