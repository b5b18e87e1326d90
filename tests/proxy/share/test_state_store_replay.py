"""Replay's fast path against the fold it replaced: over generated state-topic histories (snapshots,
updates, tombstones, group records, damaged and unusual records) ``state_store.recover`` restores
exactly what decoding every record in full and applying it in log order restores -- the same
share-partitions (in the same order), groups, skip count, and skipped records logged in log order."""

from __future__ import annotations

import dataclasses
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from codec import share_state as records
from codec.errors import StateRecordError
from codec.share_events import DEAD_LETTER_REASONS, ArchiveReason
from proxy.share import state_store
from proxy.share.partition import PartitionSnapshot, PersistedBatch, StateDelta
from proxy.share.persister import ReplayedRecord
from proxy.share.states import RecordState

TOPICS = (uuid.UUID(int=1), uuid.UUID(int=2))
GROUPS = ("g0", "g1")
KEYS = [(g, t, p) for g in GROUPS for t in TOPICS[:1] for p in (0, 1)] + [("g1", TOPICS[1], 0)]
MEMBERS = ("member-a", "m" * 130)  # the long one is not in the fast reader's canonical encoding


# ----- the reference: the fold before the fast path (every record decoded in full, in log order) -----


def _reference_batches(state_batches, clock_offset_ms):
    batches = []
    for b in state_batches:
        first, last, state, count = int(b.first_offset), int(b.last_offset), int(b.delivery_state), int(b.delivery_count)
        if state not in state_store.RESUMABLE_STATES:
            raise state_store.InapplicableStateRecord(f"state {state}")
        if not 0 <= first <= last or count < 0:
            raise state_store.InapplicableStateRecord(f"batch {first}-{last} count {count}")
        if state == RecordState.IN_PROGRESS:
            start, progress = int(b.in_progress_start_timestamp), int(b.last_progress_timestamp)
            batches.append(PersistedBatch(first, last, RecordState.IN_PROGRESS, count,
                                          start - clock_offset_ms if start != -1 else -1,
                                          progress - clock_offset_ms if progress != -1 else -1,
                                          b.in_progress_member_id))
        elif state == RecordState.ARCHIVING:
            reason = int(b.archive_reason)
            batches.append(PersistedBatch(first, last, RecordState.ARCHIVING, count,
                                          archive_reason=ArchiveReason(reason) if reason in DEAD_LETTER_REASONS
                                          else ArchiveReason.NONE))
        else:
            batches.append(PersistedBatch(first, last, RecordState(state), count))
    return tuple(batches)


def _reference_apply(state, record, clock_offset_ms):
    kind, key, value = record.record_type, record.key, record.value
    if kind in (records.RecordType.SHARE_SNAPSHOT, records.RecordType.SHARE_UPDATE):
        pkey = (key.group_id, key.topic_id, int(key.partition))
        if value is None:
            state.partitions.pop(pkey, None)
        elif kind is records.RecordType.SHARE_SNAPSHOT:
            state.partitions[pkey] = state_store.PartitionRecovery(
                PartitionSnapshot(int(value.start_offset), _reference_batches(value.state_batches, clock_offset_ms)),
                snapshot_epoch=int(value.snapshot_epoch), state_epoch=int(value.state_epoch),
                create_timestamp=int(value.create_timestamp))
        else:
            current = state.partitions.get(pkey)
            if current is not None and int(value.snapshot_epoch) == current.snapshot_epoch:
                current.updates.append(StateDelta(int(value.start_offset),
                                                  _reference_batches(value.state_batches, clock_offset_ms)))
        return
    group = state.groups.setdefault(key.group_id, state_store.GroupRecovery())
    if value is None:
        if kind is records.RecordType.PROXY_GROUP_METADATA:
            group.exists, group.group_epoch = False, 0
        elif kind is records.RecordType.PROXY_GROUP_PARTITIONS:
            group.initialized.clear()
        else:
            group.configs.clear()
    elif kind is records.RecordType.PROXY_GROUP_METADATA:
        group.group_epoch, group.exists = int(value.group_epoch), True
    elif kind is records.RecordType.PROXY_GROUP_PARTITIONS:
        group.initialized = {(t.topic_id, int(p)) for t in value.initialized_topics for p in t.partitions}
    else:
        group.configs = {c.name: c.value for c in value.configs if c.value is not None}


def reference_recover(replayed, clock_offset_ms):
    state = state_store.RecoveredState()
    skipped_at = []
    for item in replayed:
        try:
            _reference_apply(state, records.decode_record(item.key, item.value), clock_offset_ms)
        except StateRecordError:
            state.skipped += 1
            skipped_at.append(item.offset)
    for pkey in [k for k in state.partitions if k[0] not in state.groups or not state.groups[k[0]].exists]:
        del state.partitions[pkey]
    for group_id, group in list(state.groups.items()):
        if not group.exists:
            group.initialized.clear()
            if not group.configs:
                del state.groups[group_id]
    return state, skipped_at


# ----- generated histories ------------------------------------------------------------------------

# Weighted towards the states replay resumes from; 1 (Acquired), 9 and -1 make a record inapplicable.
delivery_states = st.sampled_from([0, 0, 2, 2, 4, 4, 3, 5, 5, 1, 9, -1])


@st.composite
def state_batch(draw, batch_type):
    first = draw(st.integers(-2, 60))
    last = first + draw(st.integers(-1, 8))  # now and then before `first`: inapplicable
    state = draw(delivery_states)
    fields = dict(first_offset=first, last_offset=last, delivery_state=state,
                  delivery_count=draw(st.integers(-1, 6)))
    if state == 5 or draw(st.integers(0, 9)) == 0:  # IN_PROGRESS carries its owner and times (others rarely)
        fields.update(in_progress_start_timestamp=draw(st.sampled_from([-1, 1_000, 5_000])),
                      last_progress_timestamp=draw(st.sampled_from([-1, 2_000, 6_000])),
                      in_progress_member_id=draw(st.sampled_from((None, *MEMBERS))))
    if state == 3 or draw(st.integers(0, 9)) == 0:
        fields["archive_reason"] = draw(st.integers(-1, 4))
    return batch_type(**fields)


@st.composite
def share_record(draw):
    key = draw(st.sampled_from(KEYS))
    epoch = draw(st.integers(0, 3))
    batches = tuple(draw(st.lists(state_batch(records.ShareSnapshotValue.StateBatch), max_size=4)))
    kind = draw(st.sampled_from(["snapshot", "snapshot", "update", "update", "tombstone", "update-tombstone"]))
    if kind == "snapshot":
        value = records.ShareSnapshotValue(
            snapshot_epoch=epoch, state_epoch=draw(st.integers(0, 2)), leader_epoch=-1,
            start_offset=draw(st.integers(0, 20)), delivery_complete_count=draw(st.sampled_from([-1, 7])),
            create_timestamp=draw(st.integers(0, 9)), write_timestamp=draw(st.integers(0, 9)), state_batches=batches)
        return records.encode_record(records.ShareSnapshotKey(group_id=key[0], topic_id=key[1], partition=key[2]), value)
    update_key = records.ShareUpdateKey(group_id=key[0], topic_id=key[1], partition=key[2])
    if kind == "tombstone":
        return state_store.partition_tombstone(key)
    if kind == "update-tombstone":
        return records.encode_key(update_key), None
    batch_type = records.ShareUpdateValue.StateBatch
    value = records.ShareUpdateValue(
        snapshot_epoch=epoch, leader_epoch=-1, start_offset=draw(st.sampled_from([-1, 5, 12])),
        delivery_complete_count=draw(st.sampled_from([-1, 3])),
        state_batches=tuple(batch_type(**{f.name: getattr(b, f.name) for f in dataclasses.fields(b)}) for b in batches))
    return records.encode_record(update_key, value)


@st.composite
def group_record(draw):
    """A group record as (key, value): the route (its third item) is not what replay reads."""
    return draw(routed_group_record())[:2]


@st.composite
def routed_group_record(draw):
    group_id = draw(st.sampled_from(GROUPS))
    kind = draw(st.sampled_from(["metadata", "metadata", "partitions", "config", "tombstones"]))
    if kind == "metadata":
        return state_store.group_metadata_record(group_id, draw(st.integers(0, 5)), 1_000)
    if kind == "partitions":
        return state_store.group_partitions_record(group_id, [(TOPICS[0], 0), (TOPICS[1], 0)], {})
    if kind == "config":
        return state_store.group_config_record(group_id, {"share.record.lock.duration.ms": "15000"})
    return draw(st.sampled_from(state_store.group_tombstones(group_id)))


def damage(draw, record):
    key, value = record
    how = draw(st.sampled_from(["truncate-value", "flip-value", "version", "truncate-key", "unknown-type",
                                "trailing-byte"]))
    at = draw(st.integers(0, 200))
    if value and how == "truncate-value":
        return key, value[:at % len(value)]
    if value and how == "flip-value":
        at %= len(value)
        return key, value[:at] + bytes([draw(st.integers(0, 255))]) + value[at + 1:]
    if value and how == "version":
        return key, b"\x00\x05" + value[2:]
    if value and how == "trailing-byte":
        return key, value + b"\x00"
    if how == "unknown-type":
        return b"\x7e\x00" + key[2:], value
    return key[:at % max(1, len(key))], value


@st.composite
def histories(draw):
    out = []
    for _ in range(draw(st.integers(1, 25))):
        record = draw(st.one_of(share_record(), share_record(), group_record()))
        if draw(st.integers(0, 7)) == 0:
            record = damage(draw, record)
        out.append(record)
    return [ReplayedRecord(i % 3, i, key, value) for i, (key, value) in enumerate(out)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from([0, 400]))
def test_fast_replay_restores_exactly_what_the_full_decode_restores(history, clock_offset_ms):
    expected, expected_skips = reference_recover(history, clock_offset_ms)
    with capture_logs() as logged:
        recovered = state_store.recover(history, topic="__state", clock_offset_ms=clock_offset_ms)
    assert recovered.partitions == expected.partitions
    assert list(recovered.partitions) == list(expected.partitions)  # the order too
    assert recovered.groups == expected.groups
    assert recovered.skipped == expected.skipped
    assert [e["offset"] for e in logged if e["event"] == "state record skipped"] == expected_skips


def test_a_damaged_snapshot_a_newer_one_replaces_is_still_skipped_and_counted():
    """Superseded records are still read and checked (not turned into engine values): damage in one
    is skipped, logged and counted as before, and the newer snapshot stands."""
    key = KEYS[0]
    good = state_store.snapshot_record(key, PartitionSnapshot(3, (PersistedBatch(3, 4, RecordState.ACKNOWLEDGED, 1),)),
                                       snapshot_epoch=2, state_epoch=0, create_timestamp=1, write_timestamp=2,
                                       clock_offset_ms=0)
    history = [ReplayedRecord(0, 0, *state_store.group_metadata_record(key[0], 1, 1)[:2]),
               ReplayedRecord(0, 1, good[0], good[1][:-3]), ReplayedRecord(0, 2, *good)]
    recovered = state_store.recover(history, clock_offset_ms=0)
    assert recovered.skipped == 1
    assert recovered.partitions[key].snapshot_epoch == 2
