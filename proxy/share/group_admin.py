"""Share groups and their offsets for Kafka's admin RPCs: list, describe offsets, alter, delete.

Theory of operation
-------------------
Kafka splits this work between its group coordinator (which share-partitions a group has
initialised, membership) and its share coordinator (the durable SPSO and the count of
delivery-complete records, read with ReadShareGroupStateSummary v1). In the proxy both live in
the :class:`~proxy.share.manager.ShareService`: the coordinator knows groups, members and the
initialised set; the partition registry (:mod:`proxy.share.leaders`) holds every share-partition's
engine, or only its SPSO when parked; the commit pipeline (:mod:`proxy.share.commit`) makes changes
durable on the state topic. This module performs the admin operations on those rooms and says
what the wire routes (:mod:`proxy.share.admin_routes`) must answer; it builds no responses.

Rules taken from Kafka 4.2's ``GroupCoordinatorService`` / ``GroupMetadataManager``:

* **ListGroups** filters by state case-insensitively (lower-cased, trimmed) and by type through
  ``GroupType.parse`` (case-insensitive; an unknown name matches no group).
* **DescribeShareGroupOffsets**: with null topics, every initialised share-partition of the group
  whose topic still exists (an unknown group has none: an empty answer, not an error); with
  topics, a topic missing from metadata gets start offset -1 and a zero topic id, a share-partition
  without state gets start offset -1, leader epoch 0, lag -1. Lag (v1) = partition end offset
  (ListOffsets LATEST, READ_UNCOMMITTED: the high watermark) - start offset - records already
  delivery-complete (Acknowledged or Archived) above the start offset.
* **AlterShareGroupOffsets** creates an unknown group (``getOrMaybeCreateShareGroup(id, true)``),
  refuses a group with members (NON_EMPTY_GROUP) and an id another group type uses
  (GROUP_ID_NOT_FOUND), answers UNKNOWN_TOPIC_OR_PARTITION for a missing topic or partition, and
  initialises the others at the given offsets: in-flight state is discarded (KIP-932), the state
  epoch moves on, and the answer waits for the write.
* **DeleteShareGroupOffsets**: GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP when the *group* has members
  (``ShareGroup.validateDeleteGroup``: state must be Empty, whatever the members subscribe to), per
  topic UNKNOWN_TOPIC_OR_PARTITION for a missing topic or one without share state; the topic's
  share-partitions are tombstoned and leave the initialised set.
* **DeleteGroups**: Empty share groups only (NON_EMPTY_GROUP); group records and every
  share-partition snapshot are tombstoned.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import structlog
import trio
from kio.schema.errors import ErrorCode

from proxy.errors import UpstreamError
from proxy.share import state_store
from proxy.share.cluster import LATEST_TIMESTAMP
from proxy.share.commit import Cause
from proxy.share.coordinator import GroupState
from proxy.share.leaders import Leader, SharePartitionKey
from proxy.share.partition import PartitionSnapshot, SharePartition
from proxy.share.peers import PeerFailure, PeerStateClient, PeerSummary
from proxy.share.persister import PersistError
from proxy.share.states import TERMINAL_STATES

log = structlog.get_logger(__name__)

SHARE_GROUP_TYPE = "share"
SHARE_PROTOCOL_TYPE = "share"
ZERO_UUID = uuid.UUID(int=0)
UNINITIALIZED_START_OFFSET = -1  # Kafka's PartitionFactory constants
UNINITIALIZED_LAG = -1
DEFAULT_LEADER_EPOCH = 0
# Kafka's Group.GroupType names; anything else parses to "unknown", which no group has.
KNOWN_GROUP_TYPES = frozenset({"consumer", "classic", "share", "streams"})
NOT_EMPTY_MESSAGE = "The group is not empty."  # Errors.NON_EMPTY_GROUP.message()
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."  # Errors.UNKNOWN_TOPIC_OR_PARTITION
NO_OFFSETS_MESSAGE = "There is no offset information to delete."


# ----- pure rules ---------------------------------------------------------------------------


def share_group_listed(state: GroupState, states_filter: Iterable[str], types_filter: Iterable[str]) -> bool:
    """Whether ListGroups with these filters lists a share group in `state` (Kafka's rules)."""
    types = {t.lower() if t.lower() in KNOWN_GROUP_TYPES else "unknown" for t in types_filter}
    if types and SHARE_GROUP_TYPE not in types:
        return False
    states = {s.lower().strip() for s in states_filter}
    return not states or state.value.lower() in states


def delivery_complete_count(snapshot: PartitionSnapshot) -> int:
    """Records Acknowledged or Archived above the SPSO (ShareSnapshotValue.DeliveryCompleteCount)."""
    return sum(
        batch.last_offset - max(batch.first_offset, snapshot.start_offset) + 1
        for batch in snapshot.state_batches
        if batch.delivery_state in TERMINAL_STATES and batch.last_offset >= snapshot.start_offset
    )


def share_lag(end_offset: int | None, start_offset: int, delivery_complete: int) -> int:
    """Kafka's share-partition lag; -1 when any input is unknown."""
    if end_offset is None or end_offset < 0 or start_offset < 0 or delivery_complete < 0:
        return UNINITIALIZED_LAG
    return end_offset - start_offset - delivery_complete


# ----- results ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionOffset:
    partition: int
    start_offset: int = UNINITIALIZED_START_OFFSET
    leader_epoch: int = DEFAULT_LEADER_EPOCH
    lag: int = UNINITIALIZED_LAG
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionOffset, ...]


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    group_id: str
    topics: tuple[TopicOffsets, ...] = ()
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionResult:
    partition: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True, slots=True)
class TopicResult:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionResult, ...] = ()
    error: ErrorCode = ErrorCode.none  # DeleteShareGroupOffsets reports per topic
    message: str | None = None


@dataclass(frozen=True, slots=True)
class AdminOutcome:
    """A group-level error (then `topics` is empty) or per-topic results."""

    error: ErrorCode = ErrorCode.none
    message: str | None = None
    topics: tuple[TopicResult, ...] = ()


class _WriteTimedOut(Exception):
    pass


WRITE_TIMED_OUT_MESSAGE = "The share state write did not complete in time; it is retried in the background."


def _peer_summary(summary: PeerSummary) -> tuple[int, int] | None:
    return None if summary.start_offset < 0 else (summary.start_offset, summary.delivery_complete_count)


def _with_failures(results: list[TopicResult], failed: dict[tuple[uuid.UUID, int], PeerFailure]) -> list[TopicResult]:
    """Per-partition results with the partitions another instance failed to act on replaced."""
    if not failed:
        return results
    return [TopicResult(t.name, t.topic_id, tuple(
        PartitionResult(r.partition, failed[(t.topic_id, r.partition)].error, failed[(t.topic_id, r.partition)].message)
        if (t.topic_id, r.partition) in failed else r for r in t.partitions), t.error, t.message) for t in results]


# ----- operations ---------------------------------------------------------------------------


class GroupAdmin:
    """Admin operations on the share service's rooms (all engine calls on the trio thread)."""

    def __init__(self, service, *, write_timeout_s: float = 30.0) -> None:
        self.service = service
        self.coordinator = service.coordinator
        self.leaders = service.leaders
        self.commits = service.commits
        self.cluster = service.cluster
        self.write_timeout_s = write_timeout_s
        # Scale-out (--instance-id): share-partitions led by other instances are asked through them
        # (proxy/share/peers.py); None on a single instance, which leads every share-partition.
        self.peers: PeerStateClient | None = None

    def _remote(self, partitions: Iterable[tuple[uuid.UUID, int]]) -> list[tuple[uuid.UUID, int]]:
        return [] if self.peers is None else self.peers.remote(partitions)

    # -- ListGroups --------------------------------------------------------------------------

    def list_groups(self, states_filter: Iterable[str] = (), types_filter: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of the share groups ListGroups with these filters lists."""
        states_filter, types_filter = list(states_filter), list(types_filter)
        return [
            (group_id, state.value)
            for group_id, state in self.coordinator.list_groups()
            if share_group_listed(state, states_filter, types_filter)
        ]

    def is_share_group(self, group_id: str) -> bool:
        return self.coordinator.has_group(group_id)

    # -- DescribeShareGroupOffsets -------------------------------------------------------------

    async def describe_offsets(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]] | None, *, with_lag: bool = True,
    ) -> GroupOffsets:
        """Start offset, leader epoch and (if `with_lag`) lag per share-partition; `topics` None = all initialised."""
        snapshot = self.cluster.snapshot
        wanted: list[tuple[str, uuid.UUID, list[int]]] = []
        missing: list[TopicOffsets] = []
        if topics is None:
            by_topic: dict[uuid.UUID, list[int]] = {}
            for topic_id, partition in self.coordinator.initialized_partitions(group_id):
                by_topic.setdefault(topic_id, []).append(partition)
            for topic_id, partitions in by_topic.items():
                topic = snapshot.topics_by_id.get(topic_id)
                if topic is not None:  # Kafka: share state of a deleted topic is not reported
                    wanted.append((topic.name, topic_id, sorted(partitions)))
        else:
            await self._know_topics(name for name, _ in topics)
            snapshot = self.cluster.snapshot
            for name, partitions in topics:
                topic = snapshot.topics_by_name.get(name)
                if topic is None:
                    missing.append(TopicOffsets(name, ZERO_UUID, tuple(PartitionOffset(p) for p in partitions)))
                else:
                    wanted.append((name, topic.topic_id, list(partitions)))

        asked = [(topic_id, p) for _, topic_id, partitions in wanted for p in partitions]
        remote = set(self._remote(asked))
        summaries: dict[tuple[uuid.UUID, int], tuple[int, int] | PeerFailure | None] = {
            tp: self._summary((group_id, *tp)) for tp in asked if tp not in remote}
        if remote:
            for tp, answer in (await self.peers.summaries(group_id, remote)).items():
                summaries[tp] = answer if isinstance(answer, PeerFailure) else _peer_summary(answer)
        ends: dict[tuple[uuid.UUID, int], int] = {}
        if with_lag:
            await self._end_offsets([tp for tp, s in summaries.items() if isinstance(s, tuple)], ends)
        found = []
        for name, topic_id, partitions in wanted:
            topic = self.cluster.snapshot.topics_by_id.get(topic_id)
            rows = []
            for p in partitions:
                summary = summaries[(topic_id, p)]
                if summary is None:
                    rows.append(PartitionOffset(p))
                    continue
                if isinstance(summary, PeerFailure):
                    rows.append(PartitionOffset(p, error=summary.error, message=summary.message))
                    continue
                start, complete = summary
                info = topic.partitions.get(p) if topic is not None else None
                rows.append(PartitionOffset(
                    p, start_offset=start,
                    leader_epoch=max(info.leader_epoch, 0) if info is not None else DEFAULT_LEADER_EPOCH,
                    lag=share_lag(ends.get((topic_id, p)), start, complete),
                ))
            found.append(TopicOffsets(name, topic_id, tuple(rows)))
        return GroupOffsets(group_id, tuple(found) + tuple(missing))

    def local_summary(self, group_id: str, topic_id: uuid.UUID, partition: int) -> tuple[int, int, int] | None:
        """(SPSO, delivery-complete count, state epoch) of a share-partition led here, else None
        (ReadShareGroupStateSummary at the owner, proxy/share/peers.py)."""
        summary = self._summary((group_id, topic_id, partition))
        if summary is None:
            return None
        leader = self.leaders.active((group_id, topic_id, partition))
        return summary[0], summary[1], leader.state_epoch if leader is not None else 0

    def _summary(self, key: SharePartitionKey) -> tuple[int, int] | None:
        """(SPSO, delivery-complete count) of a share-partition with state, else None."""
        leader = self.leaders.active(key)
        if leader is not None:
            snapshot = leader.engine.snapshot()
            return snapshot.start_offset, delivery_complete_count(snapshot)
        parked = self.leaders.parked_start_offset(key)
        if parked is not None:
            return parked, 0  # parked: nothing in flight, so nothing delivery-complete above the SPSO
        return None

    async def _end_offsets(self, partitions: list[tuple[uuid.UUID, int]], into: dict) -> None:
        async def one(topic_id: uuid.UUID, partition: int) -> None:
            topic = self.cluster.topic_by_id(topic_id)
            if topic is None or partition not in topic.partitions:
                return
            try:
                into[(topic_id, partition)] = await self.cluster.list_offset(topic, partition, LATEST_TIMESTAMP)
            except UpstreamError as exc:  # lag unknown (-1), the start offset is still reported
                log.warning("end offset for share lag unavailable", topic=topic.name, partition=partition,
                            error=str(exc))

        async with trio.open_nursery() as nursery:
            for topic_id, partition in partitions:
                nursery.start_soon(one, topic_id, partition)

    async def _know_topics(self, names: Iterable[str]) -> None:
        """Refresh metadata once if a named topic is not known yet (it may have just been created)."""
        if any(name not in self.cluster.snapshot.topics_by_name for name in names):
            await self.service.refresher.refresh_if_due("admin")

    # -- AlterShareGroupOffsets ----------------------------------------------------------------

    async def alter_offsets(self, group_id: str, topics: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> AdminOutcome:
        """Start the group's share-partitions at these offsets (group must be empty; created if unknown)."""
        if not group_id:
            return AdminOutcome(ErrorCode.invalid_group_id, "The group id must not be empty.")
        if self.coordinator.has_members(group_id):
            return AdminOutcome(ErrorCode.non_empty_group, NOT_EMPTY_MESSAGE)
        if not self.coordinator.has_group(group_id):
            refusal = await self._other_group_type(group_id)
            if refusal is not None:
                return refusal
        await self._know_topics(name for name, _ in topics)
        snapshot = self.cluster.snapshot
        results: list[TopicResult] = []
        starts: dict[tuple[uuid.UUID, int], int] = {}
        for name, partitions in topics:
            topic = snapshot.topics_by_name.get(name)
            if topic is None:
                results.append(TopicResult(name, ZERO_UUID, tuple(
                    PartitionResult(p, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE)
                    for p, _ in partitions)))
                continue
            rows = []
            for p, offset in partitions:
                if p not in topic.partitions:
                    rows.append(PartitionResult(p, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE))
                elif offset < 0:
                    rows.append(PartitionResult(p, ErrorCode.invalid_request,
                                                f"Start offset {offset} of {name}-{p} is negative."))
                else:
                    rows.append(PartitionResult(p))
                    starts[(topic.topic_id, p)] = offset
            results.append(TopicResult(name, topic.topic_id, tuple(rows)))

        # The group may have gained a member while we awaited the topic check.
        if self.coordinator.has_members(group_id):
            return AdminOutcome(ErrorCode.non_empty_group, NOT_EMPTY_MESSAGE)
        self.service.handle_events(self.coordinator.create_empty_group(group_id))
        remote = set(self._remote(starts))
        local_starts = {tp: offset for tp, offset in starts.items() if tp not in remote}
        failed: dict[tuple[uuid.UUID, int], PeerFailure] = {}
        try:
            with trio.fail_after(self.write_timeout_s):
                await self._settle_staged(group_id, local_starts)
                if self.coordinator.has_members(group_id):
                    return AdminOutcome(ErrorCode.non_empty_group, NOT_EMPTY_MESSAGE)
                waits = [self._reset(group_id, tp, offset) for tp, offset in local_starts.items()]
                if remote:  # the instances leading them start them afresh and answer once durable
                    answers = await self.peers.initialize(group_id, {tp: starts[tp] for tp in remote})
                    failed = {tp: answer for tp, answer in answers.items() if answer is not None}
                self.coordinator.mark_initialized(group_id, {tp: o for tp, o in starts.items() if tp not in failed})
                group_write = self.commits.queue_group_records([self.service.partitions_record(group_id)])
                for leader, version in waits:
                    await self.commits.durable(leader, version)
                await self.commits.group_records_durable(group_write)
        except trio.TooSlowError:
            return AdminOutcome(ErrorCode.coordinator_not_available,
                                "The share state write did not complete in time; it is retried in the background.")
        except PersistError as exc:  # the write failed; the pipeline retries it in the background
            return AdminOutcome(ErrorCode.kafka_storage_error, f"Share state write failed: {exc}")
        for (topic_id, partition), offset in starts.items():
            if (topic_id, partition) not in failed:
                log.info("share-partition start offset altered", group=group_id, topic_id=str(topic_id),
                         partition=partition, start_offset=offset, here=(topic_id, partition) not in remote)
        return AdminOutcome(topics=tuple(_with_failures(results, failed)))

    async def _other_group_type(self, group_id: str) -> AdminOutcome | None:
        """GROUP_ID_NOT_FOUND when an upstream group of another type owns the id (one namespace)."""
        try:
            other = await self.cluster.upstream_group_type(group_id)
        except UpstreamError as exc:
            return AdminOutcome(ErrorCode.coordinator_not_available, f"Cannot check upstream groups: {exc}")
        if other is not None:
            return AdminOutcome(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
        return None

    async def _settle_staged(self, group_id: str, starts: Iterable[tuple[uuid.UUID, int]]) -> None:
        """Wait until no acknowledgement is half-written on the share-partitions about to be reset."""
        for topic_id, partition in starts:
            leader = self.leaders.active((group_id, topic_id, partition))
            while leader is not None and leader.staged:
                await leader.settled.wait()

    def _reset(self, group_id: str, tp: tuple[uuid.UUID, int], offset: int) -> tuple[Leader, int]:
        """A share-partition starting afresh at `offset`: in-flight state discarded, new state epoch."""
        key = (group_id, tp[0], tp[1])
        engine = SharePartition(self.leaders.config_for(group_id), offset)
        leader = self.leaders.get(key)  # brings a parked one back
        if leader is None:
            leader = self.leaders.add(Leader(key, engine, create_timestamp=self.service.wall_clock()))
        else:
            leader.engine = engine
            leader.state_epoch += 1
            leader.staged = []
            self.service.reader.cache_budget.drop(leader)
        return leader, self.commits.record(leader, None, Cause.INITIALISED)

    # -- DeleteShareGroupOffsets ---------------------------------------------------------------

    async def delete_offsets(self, group_id: str, topic_names: Sequence[str]) -> AdminOutcome:
        """Forget the group's share state of these topics (group must exist and be empty)."""
        if not group_id:
            return AdminOutcome(ErrorCode.invalid_group_id, "The group id must not be empty.")
        if not self.coordinator.has_group(group_id):
            return AdminOutcome(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        if self.coordinator.has_members(group_id):
            return AdminOutcome(ErrorCode.non_empty_group, NOT_EMPTY_MESSAGE)
        await self._know_topics(topic_names)
        if not self.coordinator.has_group(group_id):
            return AdminOutcome(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        if self.coordinator.has_members(group_id):
            return AdminOutcome(ErrorCode.non_empty_group, NOT_EMPTY_MESSAGE)
        snapshot = self.cluster.snapshot
        results = []
        records: list[tuple] = []  # (key, value) and routed (key, value, route) records
        for name in topic_names:
            topic = snapshot.topics_by_name.get(name)
            if topic is None:
                results.append(TopicResult(name, ZERO_UUID, error=ErrorCode.unknown_topic_or_partition,
                                           message=UNKNOWN_TOPIC_MESSAGE))
                continue
            initialised = [tp for tp in self.coordinator.initialized_partitions(group_id) if tp[0] == topic.topic_id]
            if not initialised:
                results.append(TopicResult(name, ZERO_UUID, error=ErrorCode.unknown_topic_or_partition,
                                           message=NO_OFFSETS_MESSAGE))
                continue
            # Share-partitions led elsewhere first (every partition of the topic: a leader may have
            # initialised one the coordinator has not recorded yet); a failure leaves it all in
            # place, and a retry finishes it (deleting is idempotent).
            failure = await self._delete_remote(group_id, [(topic.topic_id, p) for p in topic.partitions])
            if failure is not None:
                results.append(TopicResult(name, topic.topic_id, error=failure.error, message=failure.message))
                continue
            gone = self.coordinator.forget_topic(group_id, topic.topic_id)
            remote = set(self._remote(gone))
            keys = {(group_id, t, p) for t, p in gone if (t, p) not in remote} | {
                key for key in self.leaders.keys() if key[0] == group_id and key[1] == topic.topic_id}
            for key in sorted(keys, key=lambda k: k[2]):
                records.extend(self._forget(key))
            results.append(TopicResult(name, topic.topic_id))
            log.info("share group offsets deleted", group=group_id, topic=name, partitions=len(keys))
        if records:
            records.append(self.service.partitions_record(group_id))
            try:
                await self._await_group_records(self.commits.queue_group_records(records))
            except _WriteTimedOut:
                return AdminOutcome(ErrorCode.coordinator_not_available,
                                    "The share state write did not complete in time; it is retried in the background.")
        return AdminOutcome(topics=tuple(results))

    async def _delete_remote(self, group_id: str, partitions: Iterable[tuple[uuid.UUID, int]]) -> PeerFailure | None:
        """Have the instances leading these share-partitions tombstone them; the first failure."""
        remote = self._remote(partitions)
        if not remote:
            return None
        answers = await self.peers.delete(group_id, remote)
        return next((answer for answer in answers.values() if answer is not None), None)

    def _forget(self, key: SharePartitionKey) -> list[tuple[bytes, None, bytes]]:
        leader = self.leaders.active(key)
        if leader is not None:
            self.commits.forget(leader)  # a snapshot written after the tombstone would revive it
            self.service.reader.cache_budget.drop(leader)
        self.leaders.remove(key)
        return state_store.partition_tombstones(key)

    async def _await_group_records(self, number: int) -> None:
        with trio.move_on_after(self.write_timeout_s) as scope:
            await self.commits.group_records_durable(number)
        if scope.cancelled_caught:
            raise _WriteTimedOut()

    # -- DeleteGroups --------------------------------------------------------------------------

    async def delete_group(self, group_id: str) -> tuple[ErrorCode, str | None]:
        """Delete an Empty share group and tombstone all of its state."""
        if self.peers is not None and self.coordinator.has_group(group_id):
            if self.coordinator.has_members(group_id):
                return ErrorCode.non_empty_group, NOT_EMPTY_MESSAGE
            # Share-partitions led elsewhere first (every partition of the group's topics), so a
            # failure leaves the group in place for a retry.
            topics = {topic_id for topic_id, _ in self.coordinator.initialized_partitions(group_id)}
            snapshot = self.cluster.snapshot
            partitions = [(topic_id, p) for topic_id in topics
                          for p in (snapshot.topics_by_id[topic_id].partitions if topic_id in snapshot.topics_by_id
                                    else ())]
            partitions += [tp for tp in self.coordinator.initialized_partitions(group_id) if tp not in partitions]
            failure = await self._delete_remote(group_id, partitions)
            if failure is not None:
                return failure.error, failure.message
        code, events = self.coordinator.delete_group(group_id)
        if code is ErrorCode.group_id_not_found:
            return code, f"Group {group_id} not found."
        if code is ErrorCode.non_empty_group:
            return code, NOT_EMPTY_MESSAGE
        keys = {(group_id, t, p) for event in events for t, p in event.partitions
                if not self._remote([(t, p)])} | {key for key in self.leaders.keys() if key[0] == group_id}
        records: list[tuple] = [tombstone for key in keys for tombstone in self._forget(key)]
        records.extend(state_store.group_tombstones(group_id))
        self.service.group_deleted(group_id)
        log.info("share group deleted", group=group_id, partitions=len(keys))
        try:
            await self._await_group_records(self.commits.queue_group_records(records))
        except _WriteTimedOut:
            return ErrorCode.coordinator_not_available, (
                "The share state write did not complete in time; it is retried in the background.")
        return ErrorCode.none, None

    # -- the owner's side of the peer RPCs (proxy/share/peers.py) -------------------------------

    async def delete_led(self, group_id: str, partitions: list[tuple[uuid.UUID, int]]) -> PeerFailure | None:
        """DeleteShareGroupState at the owner: tombstone these share-partitions (led here)."""
        records = [tombstone for tp in partitions for tombstone in self._forget((group_id, *tp))]
        log.info("share-partition state deleted for the group's coordinator", group=group_id,
                 partitions=len(partitions))
        try:
            await self._await_group_records(self.commits.queue_group_records(records))
        except _WriteTimedOut:
            return PeerFailure(ErrorCode.coordinator_not_available, WRITE_TIMED_OUT_MESSAGE)
        return None

    async def initialize_led(self, group_id: str, starts: dict[tuple[uuid.UUID, int], int]) -> PeerFailure | None:
        """InitializeShareGroupState at the owner: start these share-partitions (led here) afresh."""
        try:
            with trio.fail_after(self.write_timeout_s):
                await self._settle_staged(group_id, starts)
                waits = [self._reset(group_id, tp, offset) for tp, offset in starts.items()]
                for leader, version in waits:
                    await self.commits.durable(leader, version)
        except trio.TooSlowError:
            return PeerFailure(ErrorCode.coordinator_not_available, WRITE_TIMED_OUT_MESSAGE)
        except PersistError as exc:
            return PeerFailure(ErrorCode.kafka_storage_error, f"Share state write failed: {exc}")
        for (topic_id, partition), offset in starts.items():
            log.info("share-partition start offset altered for the group's coordinator", group=group_id,
                     topic_id=str(topic_id), partition=partition, start_offset=offset)
        return None


__all__ = [
    "GroupAdmin", "GroupOffsets", "TopicOffsets", "PartitionOffset", "AdminOutcome", "TopicResult",
    "PartitionResult", "share_group_listed", "delivery_complete_count", "share_lag", "ZERO_UUID",
    "SHARE_GROUP_TYPE", "SHARE_PROTOCOL_TYPE",
]
