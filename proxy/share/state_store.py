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
snapshot stays small (a handful of coalesced batches in steady state). Replay still understands
ShareUpdate records (written by Kafka, or by a future writer) and applies those written after the
newest snapshot, matching on ``snapshot_epoch``.

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

import dataclasses
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
from proxy.share.partition import PartitionSnapshot, PersistedBatch, StateDelta
from proxy.share.states import RecordState

log = structlog.get_logger(__name__)

SharePartitionKey = tuple[str, uuid.UUID, int]  # (group id, topic id, partition)

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


def _to_wall(batch: PersistedBatch, offset: int) -> PersistedBatch:
    if batch.delivery_state != RecordState.IN_PROGRESS:
        return batch
    return dataclasses.replace(batch, in_progress_start=batch.in_progress_start + offset,
                               last_progress=batch.last_progress + offset)


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


@dataclass(slots=True)
class RecoveredState:
    partitions: dict[SharePartitionKey, PartitionRecovery] = field(default_factory=dict)
    groups: dict[str, GroupRecovery] = field(default_factory=dict)
    skipped: int = 0


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
    value_type = records.ShareSnapshotValue
    batch_type = value_type.StateBatch
    value = value_type(
        snapshot_epoch=snapshot_epoch,
        state_epoch=state_epoch,
        leader_epoch=-1,
        start_offset=snapshot.start_offset,
        delivery_complete_count=delivery_complete_count,
        create_timestamp=create_timestamp,
        write_timestamp=write_timestamp,
        state_batches=tuple(_state_batch(batch_type, _to_wall(b, offset)) for b in snapshot.state_batches),
    )
    key_bytes, value_bytes = records.encode_record(
        records.ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition), value
    )
    assert value_bytes is not None
    return key_bytes, value_bytes


def _state_batch(batch_type: type, b: PersistedBatch) -> object:
    """A StateBatch; the extension tags only on IN_PROGRESS batches (100-102) and ARCHIVING ones
    (103), defaults (so omitted) elsewhere."""
    if b.delivery_state == RecordState.ARCHIVING:
        return batch_type(first_offset=b.first_offset, last_offset=b.last_offset,
                          delivery_state=int(b.delivery_state), delivery_count=b.delivery_count,
                          archive_reason=int(b.archive_reason))
    if b.delivery_state != RecordState.IN_PROGRESS:
        return batch_type(first_offset=b.first_offset, last_offset=b.last_offset,
                          delivery_state=int(b.delivery_state), delivery_count=b.delivery_count)
    return batch_type(first_offset=b.first_offset, last_offset=b.last_offset, delivery_state=int(b.delivery_state),
                      delivery_count=b.delivery_count, in_progress_start_timestamp=b.in_progress_start,
                      last_progress_timestamp=b.last_progress, in_progress_member_id=b.member_id)


def update_record(
    key: SharePartitionKey, delta: StateDelta, *, snapshot_epoch: int, clock_offset_ms: int | None = None,
) -> tuple[bytes, bytes]:
    """A ShareUpdate record for ``delta`` (the proxy writes snapshots; this is for tools and tests
    that need Kafka's delta records, e.g. the golden test)."""
    offset = engine_clock_offset_ms() if clock_offset_ms is None else clock_offset_ms
    group_id, topic_id, partition = key
    value_type = records.ShareUpdateValue
    value = value_type(
        snapshot_epoch=snapshot_epoch,
        leader_epoch=-1,
        start_offset=delta.start_offset,
        delivery_complete_count=-1,
        state_batches=tuple(_state_batch(value_type.StateBatch, _to_wall(b, offset)) for b in delta.state_batches),
    )
    key_bytes, value_bytes = records.encode_record(
        records.ShareUpdateKey(group_id=group_id, topic_id=topic_id, partition=partition), value
    )
    assert value_bytes is not None
    return key_bytes, value_bytes


def partition_tombstone(key: SharePartitionKey) -> tuple[bytes, None]:
    group_id, topic_id, partition = key
    return records.encode_key(records.ShareSnapshotKey(group_id=group_id, topic_id=topic_id, partition=partition)), None


def group_metadata_record(group_id: str, group_epoch: int, create_timestamp: int) -> tuple[bytes, bytes | None]:
    return records.encode_record(
        records.ProxyShareGroupMetadataKey(group_id=group_id),
        records.ProxyShareGroupMetadataValue(
            group_epoch=group_epoch, create_timestamp=create_timestamp, metadata_hash=0
        ),
    )


def group_partitions_record(
    group_id: str, initialized: Iterable[tuple[uuid.UUID, int]], topic_names: Mapping[uuid.UUID, str]
) -> tuple[bytes, bytes | None]:
    value_type = records.ProxyShareGroupPartitionsValue
    topic_type = value_type.TopicPartitions
    by_topic: dict[uuid.UUID, list[int]] = {}
    for topic_id, partition in initialized:
        by_topic.setdefault(topic_id, []).append(partition)
    return records.encode_record(
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
    )


def group_config_record(group_id: str, configs: Mapping[str, str]) -> tuple[bytes, bytes | None]:
    value_type = records.ProxyShareGroupConfigValue
    config_type = value_type.Config
    return records.encode_record(
        records.ProxyShareGroupConfigKey(group_id=group_id),
        value_type(configs=tuple(config_type(name=k, value=str(v)) for k, v in sorted(configs.items()))),
    )


def group_tombstones(group_id: str) -> list[tuple[bytes, None]]:
    return [
        (records.encode_key(records.ProxyShareGroupMetadataKey(group_id=group_id)), None),
        (records.encode_key(records.ProxyShareGroupPartitionsKey(group_id=group_id)), None),
        (records.encode_key(records.ProxyShareGroupConfigKey(group_id=group_id)), None),
    ]


def _batches(state_batches: Iterable[object], clock_offset_ms: int) -> tuple[PersistedBatch, ...]:
    """Persisted state batches, checked; InapplicableStateRecord if the engine cannot use one.
    IN_PROGRESS times come back on the engine's clock (wall - ``clock_offset_ms``)."""
    batches = []
    for b in state_batches:
        first, last, state, count = int(b.first_offset), int(b.last_offset), int(b.delivery_state), int(b.delivery_count)
        if state not in RESUMABLE_STATES:
            raise InapplicableStateRecord(f"state batch {first}-{last} has delivery state {state}, "
                                          "which a share-partition cannot be rebuilt from")
        if not 0 <= first <= last or count < 0:
            raise InapplicableStateRecord(f"state batch {first}-{last} with delivery count {count} is impossible")
        if state == RecordState.IN_PROGRESS:
            # The engine gives a state-5 batch without an owner back as Available (delivered again).
            start, progress = int(b.in_progress_start_timestamp), int(b.last_progress_timestamp)
            batches.append(PersistedBatch(first, last, RecordState.IN_PROGRESS, count,
                                          start - clock_offset_ms if start != -1 else -1,
                                          progress - clock_offset_ms if progress != -1 else -1,
                                          b.in_progress_member_id))
        elif state == RecordState.ARCHIVING:
            # An unknown reason (0, or one this version does not know) is kept as NONE: the engine
            # then derives it from the count, as Kafka does.
            reason = int(b.archive_reason)
            batches.append(PersistedBatch(first, last, RecordState.ARCHIVING, count,
                                          archive_reason=ArchiveReason(reason) if reason in DEAD_LETTER_REASONS
                                          else ArchiveReason.NONE))
        else:
            batches.append(PersistedBatch(first, last, RecordState(state), count))
    return tuple(batches)


def recover(
    replayed: Iterable[LoggedRecord] | Iterable[tuple[bytes, bytes | None]], *, topic: str | None = None,
    clock_offset_ms: int | None = None,
) -> RecoveredState:
    """Fold state-topic records, in log order, into what each partition and group needs.

    ``replayed`` holds persister.ReplayedRecord (or bare (key, value) pairs, whose position is
    then unknown); ``topic`` names the state topic in the log line of a skipped record.
    ``clock_offset_ms`` (wall - engine clock; :func:`engine_clock_offset_ms` when None) brings
    IN_PROGRESS times onto the clock of the engines that will serve them.
    """
    to_engine = engine_clock_offset_ms() if clock_offset_ms is None else clock_offset_ms
    state = RecoveredState()
    for item in replayed:
        if isinstance(item, tuple):
            key_bytes, value_bytes = item
            partition = offset = None
        else:
            key_bytes, value_bytes, partition, offset = item.key, item.value, item.partition, item.offset
        try:
            _apply(state, records.decode_record(key_bytes, value_bytes), to_engine)
        except StateRecordError as error:
            state.skipped += 1
            STATE_RECORDS_SKIPPED.inc()
            log.warning("state record skipped", topic=topic, partition=partition, offset=offset, error=str(error))
    # A share-partition whose group is gone (tombstoned) is not served again.
    for pkey in [k for k in state.partitions if k[0] not in state.groups or not state.groups[k[0]].exists]:
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


def _apply(state: RecoveredState, record: records.StateRecord, clock_offset_ms: int) -> None:
    """Apply one decoded record; raises InapplicableStateRecord, before changing anything, if it cannot be."""
    kind, key, value = record.record_type, record.key, record.value
    if kind in (records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE):
        pkey: SharePartitionKey = (key.group_id, key.topic_id, int(key.partition))
        if value is None:
            state.partitions.pop(pkey, None)
        elif kind is records.RecordType.SHARE_SNAPSHOT:
            state.partitions[pkey] = PartitionRecovery(
                PartitionSnapshot(int(value.start_offset), _batches(value.state_batches, clock_offset_ms)),
                snapshot_epoch=int(value.snapshot_epoch),
                state_epoch=int(value.state_epoch),
                create_timestamp=int(value.create_timestamp),
            )
        else:
            current = state.partitions.get(pkey)
            if current is not None and int(value.snapshot_epoch) == current.snapshot_epoch:
                current.updates.append(StateDelta(int(value.start_offset),
                                                  _batches(value.state_batches, clock_offset_ms)))
        return
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
