"""ShareConsumer: a KIP-932 share-group consumer on the project's codec, with IN_PROGRESS marks.

Theory of operation
-------------------
The public API is synchronous and single-threaded, like confluent_kafka.ShareConsumer's: one
application thread calls poll / acknowledge / mark_in_progress / commit_* / close. Two helpers
run beside it:

* the **membership thread** (:mod:`client.membership`) heartbeats to the group coordinator at the
  interval it returns and publishes the assignment;
* a small **thread pool** sends requests that must not hold up the caller: ShareFetch to several
  nodes at once, and commit_async's ShareAcknowledge.

Each node (proxy listener) that leads an assigned partition has a :class:`NodeChannel`: one
connection carrying that member's **share session** there (KIP-932 "Share sessions"): epoch 0
opens it with every partition wanted from the node, later requests add / forget partitions
incrementally; every answer without a top-level error moves the epoch on. ShareFetch,
ShareAcknowledge and MarkInProgress (which counts as a ShareAcknowledge for the epoch) are
serialised on the channel's lock. SHARE_SESSION_NOT_FOUND / INVALID_SHARE_SESSION_EPOCH reset the
session (the next fetch reopens it with epoch 0).

Acknowledgements are kept per partition and offset until sent: piggybacked on the next ShareFetch
to the partition's node (poll), or sent in ShareAcknowledge (commit_sync, commit_async, close, and
RENEW, which must travel alone: a ShareFetch with renewals fetches nothing). Implicit mode turns
the previous poll's records into ACCEPTs at the next poll / commit.

Progress marks (mark_in_progress) are queued per partition as contiguous ranges
(:class:`client.ranges.ProgressQueue`) and sent as one MarkInProgress per node at the next
poll(), or at once when more than ``max.in-flight.progress.batches`` ranges are pending, or by
flush_progress(). Results of the implicit flushes go to the progress callback; flush_progress()
raises.
"""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32, i64

from codec import extensions
from codec.errors import CodecError

from .cluster import Cluster
from .config import ConsumerConfig, new_member_id, parse_config
from .errors import KafkaError, KafkaException, broker_error
from .membership import Membership
from .message import AcknowledgeType, Message, TopicPartition
from .ranges import ProgressQueue, acknowledgement_batches
from .records import CONFLUENT_TIMESTAMP_TYPE, acquired_records
from .wire import Connection

log = logging.getLogger("client.consumer")

SHARE_FETCH_VERSION = 2
SHARE_ACKNOWLEDGE_VERSION = 2
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_FETCH_WAIT_MS = 500  # Kafka's fetch.max.wait.ms default: assignment changes are seen this often
METADATA_REFRESH_INTERVAL_S = 0.5
_SESSION_ERRORS = {int(ErrorCode.share_session_not_found), int(ErrorCode.invalid_share_session_epoch)}
_LEADER_ERRORS = {int(ErrorCode.not_leader_or_follower), int(ErrorCode.unknown_topic_id),
                  int(ErrorCode.unknown_topic_or_partition), int(ErrorCode.fenced_leader_epoch)}

TopicIdPartition = tuple[uuid.UUID, int]
AckCallback = Callable[[dict[TopicPartition, set[int]], "KafkaException | None"], None]
ProgressCallback = Callable[[dict[TopicPartition, "KafkaException | None"]], None]

_fetch_schema = load_request_schema(78, SHARE_FETCH_VERSION)
_fetch_types = sys.modules[_fetch_schema.__module__]
_ack_schema = load_request_schema(79, SHARE_ACKNOWLEDGE_VERSION)
_ack_types = sys.modules[_ack_schema.__module__]


class NodeChannel:
    """The member's connection and share session on one node."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.lock = threading.Lock()
        self.connection: Connection | None = None
        self.epoch = INITIAL_EPOCH
        self.partitions: set[TopicIdPartition] = set()

    def reset(self) -> None:
        """Forget the session (the next ShareFetch opens a new one)."""
        self.epoch = INITIAL_EPOCH
        self.partitions = set()

    def advance(self) -> None:
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        self.reset()


class _Fetched:
    """What one ShareFetch brought back."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.ack_results: list[tuple[dict[TopicPartition, set[int]], KafkaException | None]] = []
        self.requeue: dict[TopicIdPartition, dict[int, int]] = {}
        self.refresh_metadata = False
        self.error: KafkaException | None = None


class ShareConsumer:
    """A share-group consumer shaped like ``confluent_kafka.ShareConsumer`` (see docs/client.md)."""

    def __init__(self, config: Mapping[str, object]) -> None:
        self._config: ConsumerConfig = parse_config(config)
        self._member_id = new_member_id()
        self._cluster = Cluster(self._config)
        self._cluster.bootstrap()
        self._membership = Membership(self._config, self._cluster, self._member_id)
        self._subscription: tuple[str, ...] = ()
        self._channels: dict[int, NodeChannel] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ksp-io")
        self._closed = False
        # Acknowledgements not sent yet: partition -> offset -> type; the node each partition's
        # records came from (acknowledgements go back there when the leader is unknown).
        self._acks: dict[TopicIdPartition, dict[int, int]] = {}
        self._record_node: dict[TopicIdPartition, int] = {}
        # Records handed out and not finally acknowledged (explicit mode), and those of the last
        # poll not acknowledged at all (poll refuses to run while there are any).
        self._held: dict[tuple[uuid.UUID, int, int], Message] = {}
        self._awaiting: set[tuple[uuid.UUID, int, int]] = set()
        self._last_poll: list[Message] = []
        self._buffer: collections.deque[Message] = collections.deque()
        self._progress = ProgressQueue(self._config.max_in_flight_progress_batches)
        self._ack_callback: AckCallback | None = None
        self._progress_callback: ProgressCallback | None = None
        self._callbacks: collections.deque[Callable[[], None]] = collections.deque()
        self._last_metadata = 0.0
        self.acquisition_lock_timeout_ms: int | None = None
        self.progress_lock_timeout_ms: int | None = None
        self._membership.start()

    # -- identity ---------------------------------------------------------------------------------

    def memberid(self) -> str:
        """The member id this consumer joined with (kept across rejoins)."""
        return self._member_id

    @property
    def extension_keys(self):
        """The extension api keys in use (from ApiVersions SupportedFeatures, else the config)."""
        return self._cluster.extensions

    # -- subscription -----------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        self._check_open()
        topics = list(topics)
        if any(not isinstance(t, str) or not t for t in topics) or len(set(topics)) != len(topics):
            raise ValueError("topics must be distinct, non-empty names")
        self._subscription = tuple(sorted(topics))
        self._refresh_metadata(force=True)
        self._membership.subscribe(self._subscription)

    def unsubscribe(self) -> None:
        self.subscribe([])

    def subscription(self) -> list[str]:
        return list(self._subscription)

    def assignment(self) -> list[TopicPartition]:
        """The partitions the coordinator assigned to this member (by name where known)."""
        return sorted(TopicPartition(self._cluster.topic_name(t) or str(t), p) for t, p in self._membership.assignment)

    # -- callbacks --------------------------------------------------------------------------------

    def set_acknowledgement_commit_callback(self, callback: AckCallback | None) -> None:
        """``callback(offsets: {TopicPartition: set[int]}, exception | None)``, called on the
        application thread (inside poll / commit_sync / commit_async / close) for every
        acknowledgement result."""
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable or None")
        self._ack_callback = callback

    def set_progress_callback(self, callback: ProgressCallback | None) -> None:
        """``callback({TopicPartition: exception | None})`` for MarkInProgress results of the
        flushes done by poll() and by mark_in_progress() (on overflow); application thread."""
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable or None")
        self._progress_callback = callback

    # -- poll -------------------------------------------------------------------------------------

    def poll(self, timeout: float = -1) -> list[Message]:
        """Records acquired for this member, at most ``max.poll.records``; [] after ``timeout`` s.

        Sends, first: the previous poll's records as ACCEPT (implicit mode), pending progress
        marks (MarkInProgress), and acknowledgements (on the ShareFetch).
        """
        self._check_open()
        if not self._subscription:
            raise KafkaException(KafkaError(KafkaError.STATE, "poll() before subscribe()"))
        self._run_callbacks()
        if self._membership.fatal is not None:
            raise self._membership.fatal
        if self._config.explicit and self._awaiting:
            raise KafkaException(KafkaError(
                KafkaError.STATE,
                f"{len(self._awaiting)} record(s) of the previous poll are not acknowledged (explicit mode)"))
        self._accept_implicitly()
        if self._progress:
            self._flush_progress_to_callback()
        if any(AcknowledgeType.RENEW in types.values() for types in self._acks.values()):
            self._send_acknowledgements(self._take_acks(), final=False, timeout_s=self._config.request_timeout_s)
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        try:
            while True:
                if self._buffer:
                    return self._deliver()
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                assignment = self._membership.wait_for_assignment(
                    min(remaining, 1.0) if remaining is not None else 1.0)
                if self._membership.fatal is not None:
                    raise self._membership.fatal
                if assignment:
                    self._fetch(assignment, remaining)
                elif self._acks:
                    self._send_acknowledgements(self._take_acks(), final=False,
                                                timeout_s=self._config.request_timeout_s)
                if self._buffer:
                    return self._deliver()
                if deadline is not None and time.monotonic() >= deadline:
                    return []
        finally:
            self._run_callbacks()

    def _deliver(self) -> list[Message]:
        count = min(len(self._buffer), self._config.max_poll_records)
        messages = [self._buffer.popleft() for _ in range(count)]
        self._last_poll = messages
        for message in messages:
            key = message._key_tuple
            self._held[key] = message
            if self._config.explicit:
                self._awaiting.add(key)
        return messages

    def _fetch(self, assignment: frozenset[TopicIdPartition], remaining_s: float | None) -> None:
        by_node: dict[int, list[TopicIdPartition]] = collections.defaultdict(list)
        unknown = False
        for tp in sorted(assignment):
            leader = self._cluster.leader(*tp)
            if leader is None or self._cluster.topic_name(tp[0]) is None:
                unknown = True
                continue
            by_node[leader].append(tp)
        if unknown:
            self._refresh_metadata(all_topics=True)
        # Acknowledgements for partitions no longer fetched from their node go in ShareAcknowledge.
        fetched = {tp for tps in by_node.values() for tp in tps}
        stray = {tp: types for tp, types in self._acks.items() if tp not in fetched}
        if stray:
            for tp in stray:
                del self._acks[tp]
            self._send_acknowledgements(stray, final=False, timeout_s=self._config.request_timeout_s)
        if not by_node:
            if remaining_s:
                time.sleep(min(remaining_s, 0.1))
            return
        wait_ms = MAX_FETCH_WAIT_MS if remaining_s is None else int(min(remaining_s * 1000, MAX_FETCH_WAIT_MS))
        acks = self._take_acks()
        jobs = {node: (tps, {tp: acks.pop(tp) for tp in tps if tp in acks}) for node, tps in by_node.items()}
        if acks:  # partitions whose node changed since: back to pending
            self._restore_acks(acks)
        if len(jobs) == 1:
            [(node, (tps, node_acks))] = jobs.items()
            results = [self._share_fetch(node, tps, node_acks, wait_ms)]
        else:
            futures = [self._pool.submit(self._share_fetch, node, tps, node_acks, wait_ms)
                       for node, (tps, node_acks) in jobs.items()]
            results = [future.result() for future in futures]
        for fetched_result in results:
            self._restore_acks(fetched_result.requeue)
            for offsets, error in fetched_result.ack_results:
                self._queue_ack_callback(offsets, error)
            if fetched_result.refresh_metadata:
                self._refresh_metadata(all_topics=True)
            self._buffer.extend(fetched_result.messages)
            if fetched_result.error is not None:
                log.info("ShareFetch failed: %s", fetched_result.error)

    def _share_fetch(self, node: int, wanted: list[TopicIdPartition], acks: dict[TopicIdPartition, dict[int, int]],
                     wait_ms: int) -> _Fetched:
        """One ShareFetch to ``node`` (its session opened, extended or trimmed as needed)."""
        result = _Fetched()
        channel = self._channel(node)
        with channel.lock:
            opening = channel.epoch == INITIAL_EPOCH
            if opening and acks:
                # The first request of a session may not carry acknowledgements: open it without
                # waiting, the acknowledgements ride on the next one.
                result.requeue.update(acks)
                acks = {}
                wait_ms = 0
            wanted_set = set(wanted)
            adding = wanted_set if opening else (wanted_set - channel.partitions) | set(acks)
            forgetting = set() if opening else channel.partitions - wanted_set
            request = _fetch_schema(
                group_id=self._config.group_id, member_id=self._member_id,
                share_session_epoch=i32(channel.epoch),
                max_wait=datetime.timedelta(milliseconds=wait_ms), min_bytes=i32(1),
                max_bytes=i32(self._config.fetch_max_bytes), max_records=i32(self._config.max_poll_records),
                batch_size=i32(self._config.max_poll_records), share_acquire_mode=i8(0), is_renew_ack=False,
                topics=_fetch_topics(adding, acks), forgotten_topics_data=_forgotten(forgetting))
            try:
                connection = self._connect(channel)
                response = connection.call(request, timeout_s=wait_ms / 1000 + self._config.request_timeout_s)
            except KafkaException as error:
                channel.close()
                result.requeue.update(acks)
                result.error = error
                result.refresh_metadata = True
                return result
            code = int(response.error_code)
            if code:
                error = KafkaException(KafkaError(code, f"ShareFetch: {response.error_message or ErrorCode(code).name}"))
                result.error = error
                if code in _SESSION_ERRORS or KafkaError(code).retriable() or code == ErrorCode.unknown_member_id:
                    if code in _SESSION_ERRORS:
                        channel.reset()
                    result.requeue.update(acks)
                else:
                    for tp, types in acks.items():
                        result.ack_results.append(({self._tp(tp): set(types)}, error))
                return result
            channel.advance()
            channel.partitions = (channel.partitions | adding) - forgetting
            self.acquisition_lock_timeout_ms = int(response.acquisition_lock_timeout.total_seconds() * 1000)
        for topic in response.responses:
            name = self._cluster.topic_name(topic.topic_id)
            for partition in topic.partitions:
                tp = (topic.topic_id, int(partition.partition_index))
                if tp in acks:
                    ack_error = broker_error(partition.acknowledge_error_code, partition.acknowledge_error_message)
                    result.ack_results.append(
                        ({self._tp(tp): set(acks[tp])}, KafkaException(ack_error) if ack_error else None))
                code = int(partition.error_code)
                if code:
                    if code in _LEADER_ERRORS:
                        self._cluster.forget_leader(*tp)
                        result.refresh_metadata = True
                    log.info("ShareFetch %s[%d]: %s", name, tp[1], KafkaError(code, partition.error_message))
                    continue
                if not partition.acquired_records:
                    continue
                ranges = [(int(r.first_offset), int(r.last_offset), int(r.delivery_count))
                          for r in partition.acquired_records]
                try:
                    records = acquired_records(partition.records, ranges, verify_crc=self._config.check_crcs)
                except CodecError as error:
                    result.messages.append(Message(name or str(tp[0]), tp[1], ranges[0][0], None, None, None, (0, -1), 0,
                                                   topic_id=tp[0], node=node,
                                                   error=KafkaError(KafkaError.INCONSISTENT, str(error))))
                    continue
                self._record_node[tp] = node
                for record, delivery_count in records:
                    result.messages.append(Message(
                        name or str(tp[0]), tp[1], record.offset, record.key, record.value, record.headers,
                        (CONFLUENT_TIMESTAMP_TYPE[record.timestamp_type], record.timestamp), delivery_count, topic_id=tp[0], node=node))
        return result

    # -- acknowledgements -------------------------------------------------------------------------

    def acknowledge(self, message: Message, ack_type: AcknowledgeType | int = AcknowledgeType.ACCEPT) -> None:
        """Record how ``message`` is acknowledged (explicit mode); sent at the next poll / commit."""
        self._check_open()
        if not isinstance(message, Message):
            raise TypeError("message must be a client.Message returned by poll()")
        try:
            kind = AcknowledgeType(int(ack_type))
        except (TypeError, ValueError):
            raise ValueError(f"ack_type must be an AcknowledgeType, not {ack_type!r}") from None
        if not self._config.explicit:
            raise KafkaException(KafkaError(
                KafkaError.STATE, "acknowledge() needs share.acknowledgement.mode=explicit"))
        key = message._key_tuple
        if key not in self._held:
            raise KafkaException(KafkaError(
                KafkaError.STATE, f"{message.topic()}[{message.partition()}]@{message.offset()} is not in flight"))
        self._acks.setdefault((key[0], key[1]), {})[key[2]] = int(kind)
        self._awaiting.discard(key)
        if kind is not AcknowledgeType.RENEW:
            del self._held[key]

    def commit_sync(self, timeout: float | None = None) -> dict[TopicPartition, KafkaException | None]:
        """Send every pending acknowledgement now and wait: {partition: None or its error}."""
        self._check_open()
        self._run_callbacks()
        self._accept_implicitly()
        acks = self._take_acks()
        if not acks:
            return {}
        timeout_s = self._config.request_timeout_s if timeout is None or timeout < 0 else timeout
        results = self._send_acknowledgements(acks, final=False, timeout_s=timeout_s)
        self._run_callbacks()
        return results

    def commit_async(self) -> None:
        """Send every pending acknowledgement without waiting; results go to the callback."""
        self._check_open()
        self._run_callbacks()
        self._accept_implicitly()
        acks = self._take_acks()
        if acks:
            self._pool.submit(self._send_acknowledgements, acks, final=False,
                              timeout_s=self._config.request_timeout_s)

    def _accept_implicitly(self) -> None:
        if self._config.explicit or not self._last_poll:
            return
        for message in self._last_poll:
            key = message._key_tuple
            if self._held.pop(key, None) is not None:
                self._acks.setdefault((key[0], key[1]), {})[key[2]] = int(AcknowledgeType.ACCEPT)
        self._last_poll = []

    def _take_acks(self) -> dict[TopicIdPartition, dict[int, int]]:
        acks, self._acks = self._acks, {}
        return acks

    def _restore_acks(self, acks: Mapping[TopicIdPartition, dict[int, int]]) -> None:
        for tp, types in acks.items():
            pending = self._acks.setdefault(tp, {})
            for offset, kind in types.items():
                pending.setdefault(offset, kind)

    def _send_acknowledgements(self, acks: dict[TopicIdPartition, dict[int, int]], *, final: bool,
                               timeout_s: float, close_nodes: Iterable[int] = ()) -> dict[TopicPartition, KafkaException | None]:
        """ShareAcknowledge per node (epoch -1 with ``final``); results also go to the callback."""
        by_node: dict[int, dict[TopicIdPartition, dict[int, int]]] = collections.defaultdict(dict)
        results: dict[TopicPartition, KafkaException | None] = {}
        for tp, types in acks.items():
            node = self._cluster.leader(*tp)
            if node is None:
                node = self._record_node.get(tp)
            if node is None:
                error = KafkaException(KafkaError(KafkaError.STATE, "no node known for the partition"))
                results[self._tp(tp)] = error
                self._queue_ack_callback({self._tp(tp): set(types)}, error)
                continue
            by_node[node][tp] = types
        for node in close_nodes:
            by_node.setdefault(node, {})
        for node, node_acks in by_node.items():
            channel = self._channel(node)
            with channel.lock:
                if channel.epoch == INITIAL_EPOCH:
                    if not node_acks:
                        continue
                    error = KafkaException(KafkaError(
                        int(ErrorCode.share_session_not_found), f"no share session open on node {node}"))
                    for tp, types in node_acks.items():
                        results[self._tp(tp)] = error
                        self._queue_ack_callback({self._tp(tp): set(types)}, error)
                    continue
                try:
                    epoch = FINAL_EPOCH if final else channel.epoch
                    renew = any(AcknowledgeType.RENEW in types.values() for types in node_acks.values())
                    request = _ack_schema(
                        group_id=self._config.group_id, member_id=self._member_id, share_session_epoch=i32(epoch),
                        is_renew_ack=renew, topics=_ack_topics(node_acks))
                    response = self._connect(channel).call(request, timeout_s=timeout_s)
                except KafkaException as error:
                    channel.close()
                    for tp, types in node_acks.items():
                        results[self._tp(tp)] = error
                        self._queue_ack_callback({self._tp(tp): set(types)}, error)
                    continue
                code = int(response.error_code)
                if code:
                    if code in _SESSION_ERRORS:
                        channel.reset()
                    error = KafkaException(KafkaError(code, f"ShareAcknowledge: {response.error_message or ErrorCode(code).name}"))
                    for tp, types in node_acks.items():
                        results[self._tp(tp)] = error
                        self._queue_ack_callback({self._tp(tp): set(types)}, error)
                    continue
                if final:
                    channel.reset()
                else:
                    channel.advance()
                    self.acquisition_lock_timeout_ms = int(response.acquisition_lock_timeout.total_seconds() * 1000)
            answered = {(topic.topic_id, int(p.partition_index)): p for topic in response.responses for p in topic.partitions}
            for tp, types in node_acks.items():
                partition = answered.get(tp)
                failure = (KafkaError(KafkaError.INCONSISTENT, "no answer for the partition") if partition is None
                           else broker_error(partition.error_code, partition.error_message))
                error = KafkaException(failure) if failure else None
                results[self._tp(tp)] = error
                self._queue_ack_callback({self._tp(tp): set(types)}, error)
        return results

    # -- progress (IN_PROGRESS) -------------------------------------------------------------------

    def mark_in_progress(self, message: Message) -> None:
        """Queue a progress signal for ``message`` (draft KIP KAFKA-20458): the proxy moves it
        ACQUIRED -> IN_PROGRESS (or refreshes its progress time), which keeps it held past its
        acquisition lock while progress keeps coming. Sent at the next poll(), at once when more
        than ``max.in-flight.progress.batches`` ranges are pending, or by flush_progress()."""
        self._check_open()
        if not isinstance(message, Message):
            raise TypeError("message must be a client.Message returned by poll()")
        key = message._key_tuple
        if key not in self._held:
            raise KafkaException(KafkaError(
                KafkaError.STATE, f"{message.topic()}[{message.partition()}]@{message.offset()} is not in flight"))
        if self._progress.add((key[0], key[1]), key[2]):
            self._flush_progress_to_callback()

    def flush_progress(self, timeout: float | None = None) -> dict[TopicPartition, None]:
        """Send the pending progress marks now; raises KafkaException naming every partition whose
        mark failed (nothing is retried), else returns {partition: None}."""
        self._check_open()
        results = self._flush_progress(self._config.request_timeout_s if timeout is None else timeout)
        failed = {tp: error for tp, error in results.items() if error is not None}
        if failed:
            first = next(iter(failed.values()))
            detail = "; ".join(f"{tp.topic}[{tp.partition}]: {error}" for tp, error in sorted(failed.items()))
            raise KafkaException(KafkaError(first.error.code(), f"MarkInProgress failed for {detail}"))
        return {tp: None for tp in results}

    def pending_progress_batches(self) -> int:
        return self._progress.batches

    def _flush_progress_to_callback(self) -> None:
        results = self._flush_progress(self._config.request_timeout_s)
        if any(error is not None for error in results.values()):
            log.warning("MarkInProgress failed: %s", {tp: str(e) for tp, e in results.items() if e is not None})
        callback = self._progress_callback
        if callback is not None and results:
            self._callbacks.append(lambda: callback(results))
            self._run_callbacks()

    def _flush_progress(self, timeout_s: float) -> dict[TopicPartition, KafkaException | None]:
        pending = self._progress.drain()
        if not pending:
            return {}
        keys = self._cluster.extensions
        results: dict[TopicPartition, KafkaException | None] = {}
        if keys is None or not keys.mark_in_progress_served:
            error = KafkaException(KafkaError(KafkaError.UNSUPPORTED_FEATURE,
                                              "the proxy does not serve MarkInProgress (not in ApiVersions)"))
            return {self._tp(tp): error for tp in pending}
        api = extensions.mark_in_progress(keys.mark_in_progress)
        request_type, response_type = api.requests[0], api.responses[0]
        by_node: dict[int, dict[TopicIdPartition, list[tuple[int, int]]]] = collections.defaultdict(dict)
        for tp, ranges in pending.items():
            node = self._cluster.leader(*tp)
            if node is None:
                node = self._record_node.get(tp)
            if node is None:
                results[self._tp(tp)] = KafkaException(KafkaError(KafkaError.STATE, "no node known for the partition"))
                continue
            by_node[node][tp] = ranges
        for node, node_ranges in by_node.items():
            channel = self._channel(node)
            with channel.lock:
                if channel.epoch == INITIAL_EPOCH:
                    error = KafkaException(KafkaError(int(ErrorCode.share_session_not_found),
                                                      f"no share session open on node {node}"))
                    results.update({self._tp(tp): error for tp in node_ranges})
                    continue
                request = request_type(
                    group_id=self._config.group_id, member_id=self._member_id, share_session_epoch=i32(channel.epoch),
                    topics=_progress_topics(request_type, node_ranges))
                try:
                    response = self._connect(channel).call(request, timeout_s=timeout_s, response_type=response_type)
                except KafkaException as error:
                    channel.close()
                    results.update({self._tp(tp): error for tp in node_ranges})
                    continue
                code = int(response.error_code)
                if code:
                    if code in _SESSION_ERRORS:
                        channel.reset()
                    error = KafkaException(KafkaError(code, f"MarkInProgress: {response.error_message or ErrorCode(code).name}"))
                    results.update({self._tp(tp): error for tp in node_ranges})
                    continue
                channel.advance()
                self.progress_lock_timeout_ms = int(response.acquisition_lock_timeout_ms)
            answered = {(topic.topic_id, int(p.partition_index)): p for topic in response.responses for p in topic.partitions}
            for tp in node_ranges:
                partition = answered.get(tp)
                failure = (KafkaError(KafkaError.INCONSISTENT, "no answer for the partition") if partition is None
                           else broker_error(partition.error_code, partition.error_message))
                results[self._tp(tp)] = KafkaException(failure) if failure else None
        return results

    # -- close ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Send pending acknowledgements (implicit mode: the last poll's records accepted) in a
        final ShareAcknowledge per node, closing the share sessions, then leave the group
        (heartbeat epoch -1). Records held and not acknowledged are released by the proxy."""
        if self._closed:
            return
        try:
            self._run_callbacks()
            self._accept_implicitly()
            self._pool.shutdown(wait=True)  # commit_async requests still running finish first
            self._run_callbacks()
            open_nodes = [node for node, channel in self._channels.items() if channel.epoch != INITIAL_EPOCH]
            self._send_acknowledgements(self._take_acks(), final=True, timeout_s=self._config.request_timeout_s,
                                        close_nodes=open_nodes)
            self._run_callbacks()
        finally:
            self._closed = True
            self._membership.stop(leave=True, timeout_s=self._config.request_timeout_s)
            for channel in self._channels.values():
                channel.close()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- helpers ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaException(KafkaError(KafkaError.STATE, "the consumer is closed"))

    def _channel(self, node: int) -> NodeChannel:
        channel = self._channels.get(node)
        if channel is None:
            channel = self._channels.setdefault(node, NodeChannel(node))
        return channel

    def _connect(self, channel: NodeChannel) -> Connection:
        if channel.connection is None or channel.connection.closed:
            channel.reset()  # a session belongs to its connection: a new one starts over
            channel.connection = self._cluster.connect(channel.node_id)
        return channel.connection

    def _tp(self, tp: TopicIdPartition) -> TopicPartition:
        return TopicPartition(self._cluster.topic_name(tp[0]) or str(tp[0]), tp[1])

    def _refresh_metadata(self, *, force: bool = False, all_topics: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_metadata < METADATA_REFRESH_INTERVAL_S:
            return
        self._last_metadata = now
        try:
            self._cluster.refresh(None if all_topics else list(self._subscription))
        except KafkaException as error:
            log.info("metadata refresh failed: %s", error)

    def _queue_ack_callback(self, offsets: dict[TopicPartition, set[int]], error: KafkaException | None) -> None:
        callback = self._ack_callback
        if callback is not None:
            self._callbacks.append(lambda: callback(offsets, error))

    def _run_callbacks(self) -> None:
        while self._callbacks:
            self._callbacks.popleft()()


# -- request building ---------------------------------------------------------------------------


def _ack_batches(module, types: Mapping[int, int]) -> tuple:
    return tuple(module.AcknowledgementBatch(first_offset=i64(first), last_offset=i64(last),
                                             acknowledge_types=(i8(kind),))
                 for first, last, kind in acknowledgement_batches(types))


def _fetch_topics(partitions: Iterable[TopicIdPartition], acks: Mapping[TopicIdPartition, Mapping[int, int]]) -> tuple:
    by_topic: dict[uuid.UUID, list[int]] = collections.defaultdict(list)
    for topic_id, partition in sorted(set(partitions)):
        by_topic[topic_id].append(partition)
    return tuple(_fetch_types.FetchTopic(topic_id=topic_id, partitions=tuple(
        _fetch_types.FetchPartition(partition_index=i32(p),
                                    acknowledgement_batches=_ack_batches(_fetch_types, acks.get((topic_id, p), {})))
        for p in parts)) for topic_id, parts in by_topic.items())


def _forgotten(partitions: Iterable[TopicIdPartition]) -> tuple:
    by_topic: dict[uuid.UUID, list[int]] = collections.defaultdict(list)
    for topic_id, partition in sorted(partitions):
        by_topic[topic_id].append(partition)
    return tuple(_fetch_types.ForgottenTopic(topic_id=t, partitions=tuple(i32(p) for p in parts))
                 for t, parts in by_topic.items())


def _ack_topics(acks: Mapping[TopicIdPartition, Mapping[int, int]]) -> tuple:
    by_topic: dict[uuid.UUID, list[int]] = collections.defaultdict(list)
    for topic_id, partition in sorted(acks):
        by_topic[topic_id].append(partition)
    return tuple(_ack_types.AcknowledgeTopic(topic_id=topic_id, partitions=tuple(
        _ack_types.AcknowledgePartition(partition_index=i32(p),
                                        acknowledgement_batches=_ack_batches(_ack_types, acks[(topic_id, p)]))
        for p in parts)) for topic_id, parts in by_topic.items())


def _progress_topics(request_type: type, ranges: Mapping[TopicIdPartition, list[tuple[int, int]]]) -> tuple:
    by_topic: dict[uuid.UUID, list[int]] = collections.defaultdict(list)
    for topic_id, partition in sorted(ranges):
        by_topic[topic_id].append(partition)
    return tuple(request_type.ProgressTopic(topic_id=topic_id, partitions=tuple(
        request_type.ProgressPartition(partition_index=i32(p), progress_batches=tuple(
            request_type.ProgressBatch(first_offset=i64(first), last_offset=i64(last))
            for first, last in ranges[(topic_id, p)]))
        for p in parts)) for topic_id, parts in by_topic.items())
