"""Share-session cache: which partitions each member fetches, and the session epoch.

Theory of operation
-------------------
ShareFetch and ShareAcknowledge are incremental, like the Fetch API's fetch sessions
(KIP-932, "Share sessions"). A session carries the set of share-partitions the member fetches
and the epoch its next request must carry. This module mirrors Kafka's
``SharePartitionManager.newContext`` / ``acknowledgeSessionUpdate`` and ``ShareSessionCache``.

Sessions are per node. In Kafka every broker has its own ``ShareSessionCache`` keyed by
(group id, member id): a consumer whose partitions are led by two brokers keeps one session on
each, opened and advanced independently (the Java client's ``ShareSessionHandler`` is per node).
The proxy stands for every broker at once, one listener per broker id, so its one cache is keyed
by (node id, group id, member id): the node id is the broker id of the listener the request came
in on (``BOOTSTRAP_NODE_ID`` for the bootstrap listener). Ending one node's session leaves the
member's sessions on other nodes alone. The bounds below stay proxy-wide (sessions and
partitions over all nodes together), as ``group.share.max.share.sessions`` bounds one broker.

ShareFetch
  * epoch 0 (initial) opens a session, replacing any session of the same key; it must not
    carry acknowledgements (INVALID_REQUEST); the cache is bounded and a full cache answers
    SHARE_SESSION_LIMIT_REACHED (a replaced session frees its own slot first);
  * epoch -1 (final) closes the session; it must not ask for partitions (INVALID_REQUEST)
    and the session must exist (SHARE_SESSION_NOT_FOUND); the caller processes the
    piggybacked acknowledgements and then releases the member's records;
  * any other epoch must match the session's (SHARE_SESSION_NOT_FOUND /
    INVALID_SHARE_SESSION_EPOCH); the request's partitions are added, its forgotten
    topics removed, and the epoch increments (wrapping from 2^31-1 to 1).

Partitions are bounded too (a proxy addition: Kafka bounds only the number of sessions,
``group.share.max.share.sessions``, and merely reports the partitions they hold). A session
may hold at most ``max_partitions_per_session`` share-partitions and all sessions together
at most ``max_partitions``; a ShareFetch that would go beyond either (opening a session or
adding to one) is refused with SHARE_SESSION_LIMIT_REACHED, the error Kafka uses for a full
session cache, and changes nothing: a session it would have replaced or extended stays as it
was, at its old epoch. Kafka's clients treat that error as retriable and start a new session
(epoch 0) after their back-off, so a member recovers once partitions are freed (sessions
closed, or its assignment shrinks). Without the bound, a client could grow a session
without limit by naming partitions, real or not, in one ShareFetch after another.

ShareAcknowledge
  * epoch 0 is never valid (INVALID_SHARE_SESSION_EPOCH); -1 acknowledges then closes;
    others must match and increment, as for ShareFetch.

A session is bound to the connection it was last used on; when that connection closes
the session is evicted and returned so the caller can release the member's acquired
records on the session's partitions without counting a delivery attempt (Kafka's
``SharePartitionManager.releaseSession`` releases only the session's cached partitions).

Pure: no I/O, no clock needed (Kafka 4.1+ no longer evicts sessions by age).
"""

from __future__ import annotations

import bisect
import enum
import uuid
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

__all__ = [
    "DEFAULT_MAX_SHARE_SESSIONS",
    "DEFAULT_MAX_PARTITIONS_PER_SESSION",
    "DEFAULT_MAX_SESSION_PARTITIONS",
    "BOOTSTRAP_NODE_ID",
    "INITIAL_EPOCH",
    "FINAL_EPOCH",
    "ContextKind",
    "SessionKey",
    "SessionView",
    "FetchContext",
    "AcknowledgeContext",
    "ShareSessionError",
    "ShareSessionCache",
    "ForgottenPartitions",
    "next_epoch",
    "response_order",
]

#: ``group.share.max.share.sessions`` default.
DEFAULT_MAX_SHARE_SESSIONS = 2000
#: Share-partitions one session may hold (no Kafka counterpart).
DEFAULT_MAX_PARTITIONS_PER_SESSION = 10_000
#: Share-partitions all sessions together may hold (no Kafka counterpart).
DEFAULT_MAX_SESSION_PARTITIONS = 200_000
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
#: The node id of sessions opened through the bootstrap listener. It forwards to whichever
#: ``--upstream`` address answers first, so it stands for no fixed broker; Kafka's clients call
#: their first bootstrap server node -1 and keep its connection apart from the brokers' too.
BOOTSTRAP_NODE_ID = -1
_MAX_EPOCH = 2**31 - 1

TopicIdPartition = tuple[uuid.UUID, int]
ConnectionId = Hashable


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: the final epoch stays final; 2^31-1 wraps to 1, never 0."""
    if epoch < 0:
        return epoch
    if epoch >= _MAX_EPOCH:
        return 1
    return epoch + 1


class ShareSessionError(Exception):
    """A share-session rule was broken; ``code`` is the top-level error for the response."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True, order=True)
class SessionKey:
    node_id: int
    """The broker id of the proxy listener the session lives on (``BOOTSTRAP_NODE_ID``: bootstrap)."""
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class SessionView:
    """A snapshot of one session."""

    key: SessionKey
    connection_id: ConnectionId
    epoch: int
    """The epoch the member's next request must carry."""
    partitions: frozenset[TopicIdPartition]


class ContextKind(enum.Enum):
    NEW = "new"
    """Epoch 0: a fresh session (``replaced`` holds the one it replaced, if any)."""
    UPDATE = "update"
    """A matching epoch: the session continues."""
    FINAL = "final"
    """Epoch -1: the session is closed; release ``session.partitions`` for the member."""


@dataclass(frozen=True, slots=True)
class FetchContext:
    """What a ShareFetch's session step decided."""

    kind: ContextKind
    session: SessionView
    """The session after this request (for FINAL: as it was when closed)."""
    added: frozenset[TopicIdPartition] = frozenset()
    removed: frozenset[TopicIdPartition] = frozenset()
    replaced: SessionView | None = None


@dataclass(frozen=True, slots=True)
class AcknowledgeContext:
    kind: ContextKind
    session: SessionView


@dataclass(slots=True)
class _Session:
    key: SessionKey
    connection_id: ConnectionId
    epoch: int
    partitions: set[TopicIdPartition] = field(default_factory=set)

    def view(self) -> SessionView:
        return SessionView(self.key, self.connection_id, self.epoch, frozenset(self.partitions))


class ShareSessionCache:
    """Bounded cache of share sessions, indexed by key and by connection.

    Bounded in sessions (``max_sessions``), in partitions per session and in partitions
    over all sessions; see the module documentation.
    """

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SHARE_SESSIONS,
        *,
        max_partitions_per_session: int = DEFAULT_MAX_PARTITIONS_PER_SESSION,
        max_partitions: int = DEFAULT_MAX_SESSION_PARTITIONS,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self._sessions: dict[SessionKey, _Session] = {}
        self._by_connection: dict[ConnectionId, set[SessionKey]] = {}
        self._partition_count = 0
        self.set_partition_limits(max_partitions_per_session, max_partitions)

    def set_partition_limits(self, per_session: int, total: int) -> None:
        """Change the partition bounds (they apply to the next request that adds partitions)."""
        if per_session < 1 or total < 1:
            raise ValueError("partition limits must be at least 1")
        self.max_partitions_per_session = per_session
        self.max_partitions = total

    # -- queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, node_id: int, group_id: str, member_id: str) -> SessionView | None:
        session = self._sessions.get(SessionKey(node_id, group_id, member_id))
        return session.view() if session else None

    def sessions_of_member(self, group_id: str, member_id: str) -> list[SessionView]:
        """The member's sessions on every node, by node id."""
        return [s.view() for k, s in sorted(self._sessions.items())
                if k.group_id == group_id and k.member_id == member_id]

    def sessions_of_connection(self, connection_id: ConnectionId) -> list[SessionView]:
        keys = sorted(self._by_connection.get(connection_id, ()))
        return [self._sessions[k].view() for k in keys]

    def sessions_of_group(self, group_id: str) -> list[SessionView]:
        return [s.view() for k, s in sorted(self._sessions.items()) if k.group_id == group_id]

    def total_partitions(self) -> int:
        """Share-partitions held by all sessions (kept as a count, O(1))."""
        return self._partition_count

    # -- ShareFetch ----------------------------------------------------------------------

    def share_fetch(
        self,
        node_id: int,
        group_id: str,
        member_id: str,
        epoch: int,
        connection_id: ConnectionId,
        *,
        fetch_partitions: Iterable[TopicIdPartition] = (),
        forgotten_partitions: Iterable[TopicIdPartition] = (),
        has_acknowledgements: bool = False,
    ) -> FetchContext:
        """Apply a ShareFetch request's session metadata (sent to ``node_id``); raise :class:`ShareSessionError`."""
        key = SessionKey(node_id, group_id, member_id)
        fetch = frozenset(fetch_partitions)
        if epoch == INITIAL_EPOCH:
            if has_acknowledgements:
                raise ShareSessionError(
                    ErrorCode.invalid_request,
                    "Acknowledgements are not allowed in the initial ShareFetch of a share session.",
                )
            existing = self._sessions.get(key)
            self._check_partitions(len(fetch), len(existing.partitions) if existing else 0)
            replaced = self._remove(key)
            if len(self._sessions) >= self.max_sessions:
                raise ShareSessionError(
                    ErrorCode.share_session_limit_reached,
                    f"The share session cache is full ({self.max_sessions} sessions).",
                )
            session = _Session(key, connection_id, next_epoch(INITIAL_EPOCH), set(fetch))
            self._insert(session)
            return FetchContext(
                ContextKind.NEW,
                session.view(),
                added=fetch,
                replaced=replaced.view() if replaced else None,
            )
        if epoch == FINAL_EPOCH:
            if fetch:
                raise ShareSessionError(
                    ErrorCode.invalid_request,
                    "The final ShareFetch of a share session must not fetch partitions.",
                )
            closed = self._remove(key)
            if closed is None:
                raise self._not_found(key)
            return FetchContext(ContextKind.FINAL, closed.view())

        session = self._expect(key, epoch)
        before = session.partitions
        # As in Kafka's ShareSession.update: add what is fetched, then drop what is forgotten.
        after = (before | fetch) - set(forgotten_partitions)
        self._check_partitions(len(after), len(before))
        session.partitions = after
        self._partition_count += len(after) - len(before)
        session.epoch = next_epoch(session.epoch)
        self._rebind(session, connection_id)
        return FetchContext(
            ContextKind.UPDATE,
            session.view(),
            added=frozenset(session.partitions - before),
            removed=frozenset(before - session.partitions),
        )

    # -- ShareAcknowledge ----------------------------------------------------------------

    def share_acknowledge(
        self,
        node_id: int,
        group_id: str,
        member_id: str,
        epoch: int,
        connection_id: ConnectionId,
    ) -> AcknowledgeContext:
        """Apply a ShareAcknowledge request's session metadata; raise :class:`ShareSessionError`.

        For FINAL the session is already closed when this returns: the caller applies the
        acknowledgements and then releases the member's remaining acquired records.
        """
        key = SessionKey(node_id, group_id, member_id)
        if epoch == INITIAL_EPOCH:
            raise ShareSessionError(
                ErrorCode.invalid_share_session_epoch,
                "ShareAcknowledge cannot open a share session (epoch 0).",
            )
        if epoch == FINAL_EPOCH:
            closed = self._remove(key)
            if closed is None:
                raise self._not_found(key)
            return AcknowledgeContext(ContextKind.FINAL, closed.view())
        session = self._expect(key, epoch)
        session.epoch = next_epoch(session.epoch)
        self._rebind(session, connection_id)
        return AcknowledgeContext(ContextKind.UPDATE, session.view())

    # -- eviction ------------------------------------------------------------------------

    def connection_closed(self, connection_id: ConnectionId) -> list[SessionView]:
        """Evict and return the sessions bound to a closed connection.

        The caller releases each member's acquired records on ``partitions`` without
        counting a delivery attempt. A connection belongs to one listener, so all its sessions
        are on one node.
        """
        keys = sorted(self._by_connection.pop(connection_id, ()))
        evicted = []
        for key in keys:
            session = self._sessions.pop(key)
            self._partition_count -= len(session.partitions)
            evicted.append(session.view())
        return evicted

    def remove(self, node_id: int, group_id: str, member_id: str) -> SessionView | None:
        """Drop one session (e.g. the group was deleted); returns it if it existed."""
        session = self._remove(SessionKey(node_id, group_id, member_id))
        return session.view() if session else None

    # -- internals -----------------------------------------------------------------------

    def _expect(self, key: SessionKey, epoch: int) -> _Session:
        session = self._sessions.get(key)
        if session is None:
            raise self._not_found(key)
        if session.epoch != epoch:
            raise ShareSessionError(
                ErrorCode.invalid_share_session_epoch,
                f"Share session epoch {epoch} does not match the expected epoch {session.epoch}.",
            )
        return session

    @staticmethod
    def _not_found(key: SessionKey) -> ShareSessionError:
        return ShareSessionError(
            ErrorCode.share_session_not_found,
            f"No share session for member {key.member_id} of group {key.group_id} on node {key.node_id}.",
        )

    def _check_partitions(self, wanted: int, held_now: int) -> None:
        """Refuse a session of `wanted` partitions that replaces one of `held_now`."""
        if wanted > self.max_partitions_per_session:
            raise ShareSessionError(
                ErrorCode.share_session_limit_reached,
                f"A share session may hold at most {self.max_partitions_per_session} partitions; "
                f"this request asks for {wanted}.",
            )
        if self._partition_count - held_now + wanted > self.max_partitions:
            raise ShareSessionError(
                ErrorCode.share_session_limit_reached,
                f"The share session cache is full ({self.max_partitions} partitions over all sessions).",
            )

    def _insert(self, session: _Session) -> None:
        self._partition_count += len(session.partitions)
        self._sessions[session.key] = session
        self._by_connection.setdefault(session.connection_id, set()).add(session.key)

    def _remove(self, key: SessionKey) -> _Session | None:
        session = self._sessions.pop(key, None)
        if session is not None:
            self._partition_count -= len(session.partitions)
            self._unbind(session)
        return session

    def _unbind(self, session: _Session) -> None:
        keys = self._by_connection.get(session.connection_id)
        if keys is not None:
            keys.discard(session.key)
            if not keys:
                del self._by_connection[session.connection_id]

    def _rebind(self, session: _Session, connection_id: ConnectionId) -> None:
        # A session follows the connection the member last used, so closing an old,
        # idle connection does not take a live session with it.
        if session.connection_id != connection_id:
            self._unbind(session)
            session.connection_id = connection_id
            self._by_connection.setdefault(connection_id, set()).add(session.key)


def response_order(tp: TopicIdPartition) -> tuple[int, int]:
    """The order in which a ShareFetch response lists partitions (and clients hand their records out):
    by topic id as its text sorts, which is its 128-bit value's order (fixed-width lowercase hex),
    without building the text for every partition of every fetch."""
    return tp[0].int, tp[1]


class ForgottenPartitions:
    """Partitions members dropped from their share sessions, and where each member's ShareFetches began.

    A member that drops a partition from its share session (ShareFetch ForgottenTopicsData, e.g.
    after the group revoked it) may still hold records it acquired there, and may even be handed
    more: acknowledging them puts the partition back in the session, as in Kafka, although the
    client no longer fetches it. Apache Kafka's Java client before 4.4 never acknowledges records of
    a partition outside its session when the acknowledgements travel in a ShareAcknowledge
    (commitAsync/commitSync send only the session's partitions and fail the rest locally), so they
    stay Acquired until their locks expire -- and, at the record-lock limit, block the partition for
    everyone that long.

    A client hands records to the application in the order it got them -- responses in order, a
    response's partitions in ``response_order`` -- and acknowledges them in that order. So once a
    member acknowledges a record, whatever it still holds on a forgotten partition that it was
    handed before that record will never be acknowledged: the caller releases it. A forgotten
    partition stays watched until the member's records are all released (its session closes or it
    leaves the group), or until the member holds nothing there while its session does not fetch it
    (:meth:`settled`): a group's first members are handed every partition and forget most of them
    at the next rebalance, and each watched partition costs every acknowledging request a scan.

    Marks are ``partition.acquisition_mark()`` values: ``fetch_started`` notes the mark at the
    start of each ShareFetch of a watched session, which places an acknowledged record (by its lock
    id) in the ShareFetch that handed it out. Pure: marks are plain integers.

    Watches are per share session (node, group, member): a client keeps one ShareFetch in flight
    per node, so one node's ShareFetches follow each other and their marks order them; the
    ShareFetches of a member's sessions on two nodes overlap, and their marks in one list would
    place a record in the wrong ShareFetch. Records a session handed out are acknowledged to the
    same node (the partition's leader), so a watch only looks at acknowledgements sent there.
    """

    MAX_FETCH_MARKS = 64

    def __init__(self) -> None:
        self._watches: dict[SessionKey, _ForgottenWatch] = {}

    def forgot(self, key: SessionKey, partitions: Iterable[TopicIdPartition]) -> None:
        """Session ``key`` dropped ``partitions`` (call before its ShareFetch starts)."""
        partitions = set(partitions)
        if partitions:
            self._watches.setdefault(key, _ForgottenWatch()).partitions |= partitions

    def watching(self, key: SessionKey) -> bool:
        return key in self._watches

    def fetch_started(self, key: SessionKey, mark: int) -> None:
        """A ShareFetch of a watched session starts acquiring; ``mark`` precedes all it acquires."""
        watch = self._watches.get(key)
        if watch is not None:
            watch.fetch_marks.append(mark)
            del watch.fetch_marks[:-self.MAX_FETCH_MARKS]

    def abandoned(self, key: SessionKey, acknowledged: Iterable[tuple[TopicIdPartition, int]],
                  now_mark: int) -> list[tuple[TopicIdPartition, int]]:
        """(forgotten partition, mark): release what the member holds there acquired before the mark.

        ``acknowledged`` has, per partition a request acknowledged records of, the newest lock id
        among them; ``now_mark`` is a mark taken now (after everything handed out so far).
        """
        watch = self._watches.get(key)
        if watch is None:
            return []
        marks = watch.fetch_marks
        last: tuple[int, tuple[str, int]] | None = None  # (ShareFetch, partition order) handed out last
        for tp, lock_id in acknowledged:
            fetch = bisect.bisect_left(marks, lock_id) - 1
            if fetch >= 0 and (last is None or (fetch, response_order(tp)) > last):
                last = fetch, response_order(tp)
        if last is None:
            return []
        fetch, order = last
        fetch_end = marks[fetch + 1] if fetch + 1 < len(marks) else now_mark
        del marks[:fetch]  # acknowledgements from older ShareFetches can release nothing new
        # Partitions listed before the acknowledged one in its response were handed out before it.
        return [(tp, fetch_end if response_order(tp) < order else marks[0])
                for tp in sorted(watch.partitions, key=response_order)]

    def settled(self, key: SessionKey, partitions: Iterable[TopicIdPartition]) -> None:
        """Stop watching ``partitions``: the member holds nothing there and its session no longer
        fetches them, so nothing there can be abandoned (a later forget watches them again). A
        session left with nothing watched is as one that never forgot anything."""
        watch = self._watches.get(key)
        if watch is None:
            return
        watch.partitions.difference_update(partitions)
        if not watch.partitions:
            del self._watches[key]

    def drop(self, key: SessionKey) -> frozenset[TopicIdPartition]:
        """Stop watching a session (it ended and its records were released); returns the partitions
        it was watching, whose records the caller releases with the session's own."""
        watch = self._watches.pop(key, None)
        return frozenset(watch.partitions) if watch else frozenset()

    def drop_member(self, group_id: str, member_id: str) -> None:
        """Stop watching the member's sessions on every node (it left the group: all released)."""
        for key in [k for k in self._watches if k.group_id == group_id and k.member_id == member_id]:
            del self._watches[key]

    def __len__(self) -> int:
        return len(self._watches)


@dataclass(slots=True)
class _ForgottenWatch:
    partitions: set[TopicIdPartition] = field(default_factory=set)
    fetch_marks: list[int] = field(default_factory=list)  # ascending: where its ShareFetches began
