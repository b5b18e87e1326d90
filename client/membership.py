"""Group membership: ShareGroupHeartbeat in a background thread, the assignment it brings.

KIP-932's share-group protocol: the member chooses its id (KIP-1082) and joins with epoch 0 and
its subscription; the coordinator answers the member epoch, the heartbeat interval and, when it
changes, the whole assignment (topic ids and partitions). A member takes a new assignment at once
(share groups have no revocation step). Errors:

* UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: the coordinator forgot or fenced us - rejoin with the
  SAME member id and epoch 0 (the records we hold stay ours; our acknowledgements stay valid);
* NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / a broken connection: find the coordinator again,
  then rejoin with epoch 0;
* COORDINATOR_LOAD_IN_PROGRESS and other retriable codes: retry after a back-off;
* anything else (GROUP_AUTHORIZATION_FAILED, INVALID_REQUEST, ...): fatal, raised from poll().

``leave()`` sends epoch -1 (the coordinator then releases the member's records).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from .cluster import Cluster
from .config import ConsumerConfig
from .errors import KafkaError, KafkaException
from .wire import Connection

log = logging.getLogger("client.membership")

HEARTBEAT_VERSION = 1
LEAVE_EPOCH = -1
_REJOIN = {int(ErrorCode.unknown_member_id), int(ErrorCode.fenced_member_epoch)}
_REDISCOVER = {int(ErrorCode.not_coordinator), int(ErrorCode.coordinator_not_available)}
_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 1.0

Assignment = frozenset[tuple[uuid.UUID, int]]


class Membership(threading.Thread):
    """Heartbeats for one member until stopped; ``assignment`` is what the coordinator gave it."""

    def __init__(self, config: ConsumerConfig, cluster: Cluster, member_id: str) -> None:
        super().__init__(name=f"ksp-heartbeat-{member_id[:8]}", daemon=True)
        self.config = config
        self.cluster = cluster
        self.member_id = member_id
        self.member_epoch = 0
        self.assignment: Assignment = frozenset()
        self.fatal: KafkaException | None = None
        self.joins = 0
        self._subscription: tuple[str, ...] = ()
        self._subscription_sent: tuple[str, ...] | None = None
        self._interval_s = 1.0
        self._connection: Connection | None = None
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._changed = threading.Condition()

    # -- called by the consumer ---------------------------------------------------------------

    def subscribe(self, topics: tuple[str, ...]) -> None:
        with self._changed:
            self._subscription = topics
        self._wake.set()

    def wait_for_assignment(self, timeout_s: float) -> Assignment:
        """The assignment, waiting up to ``timeout_s`` for a first non-empty one."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not self.assignment and self.fatal is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self.assignment

    def stop(self, leave: bool, timeout_s: float) -> None:
        """Stop heartbeating; with ``leave`` send epoch -1 first (best effort within ``timeout_s``)."""
        self._stop_requested.set()
        self._wake.set()
        self.join(timeout_s)
        if leave and self.member_epoch > 0:
            try:
                self._heartbeat(LEAVE_EPOCH, timeout_s=timeout_s)
            except KafkaException as error:
                log.info("leaving the group failed: %s", error)
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- the thread -----------------------------------------------------------------------------

    def run(self) -> None:
        backoff = _BACKOFF_S
        while not self._stop_requested.is_set():
            try:
                self._beat()
                backoff = _BACKOFF_S
                wait = self._interval_s
            except KafkaException as error:
                if self.fatal is not None:
                    return
                log.debug("heartbeat failed: %s", error)
                wait = backoff
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            self._wake.wait(wait)
            self._wake.clear()

    def _beat(self) -> None:
        with self._changed:
            subscription = self._subscription
        if not subscription:
            # Not subscribed (yet, or any more): a member with no subscription is not in the group.
            if self.member_epoch > 0:
                self._heartbeat(LEAVE_EPOCH, timeout_s=self.config.request_timeout_s)
                self._set(epoch=0, assignment=frozenset())
                self._subscription_sent = None
            self._interval_s = 3600.0  # woken by subscribe()
            return
        send_topics = subscription if (self.member_epoch == 0 or subscription != self._subscription_sent) else None
        response = self._heartbeat(self.member_epoch, topics=send_topics, timeout_s=self.config.request_timeout_s)
        code = int(response.error_code)
        if code in _REJOIN:
            log.info("rejoining with member id %s after %s", self.member_id, ErrorCode(code).name)
            self._set(epoch=0, assignment=self.assignment)
            self._subscription_sent = None
            raise KafkaException(KafkaError(code, response.error_message))
        if code in _REDISCOVER:
            self._drop_connection()
            self._set(epoch=0, assignment=self.assignment)
            raise KafkaException(KafkaError(code, response.error_message))
        if code:
            error = KafkaError(code, response.error_message)
            if error.retriable():
                raise KafkaException(error)
            with self._changed:
                self.fatal = KafkaException(KafkaError(code, f"ShareGroupHeartbeat: {response.error_message or error.name()}"))
                self._changed.notify_all()
            raise self.fatal
        if send_topics is not None:
            self._subscription_sent = send_topics
        self._interval_s = max(response.heartbeat_interval.total_seconds(), 0.05)
        assignment = self.assignment
        if response.assignment is not None:
            assignment = frozenset((tp.topic_id, int(p)) for tp in response.assignment.topic_partitions
                                   for p in tp.partitions)
        if self.member_epoch == 0:
            self.joins += 1
        self._set(epoch=int(response.member_epoch), assignment=assignment)

    def _set(self, *, epoch: int, assignment: Assignment) -> None:
        with self._changed:
            self.member_epoch = epoch
            self.assignment = assignment
            self._changed.notify_all()

    def _heartbeat(self, epoch: int, *, timeout_s: float, topics: tuple[str, ...] | None = None):
        request = load_request_schema(76, HEARTBEAT_VERSION)(
            group_id=self.config.group_id, member_id=self.member_id, member_epoch=i32(epoch), rack_id=None,
            subscribed_topic_names=topics)
        connection = self._coordinator_connection()
        try:
            with connection.lock:
                return connection.call(request, timeout_s=timeout_s)
        except KafkaException:
            self._drop_connection()
            if epoch != LEAVE_EPOCH:
                self._set(epoch=0, assignment=self.assignment)
                self._subscription_sent = None
            raise

    def _coordinator_connection(self) -> Connection:
        if self._connection is None or self._connection.closed:
            node = self.cluster.find_coordinator(self.config.group_id)
            self._connection = self.cluster.connect(node)
        return self._connection

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
