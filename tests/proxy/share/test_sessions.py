"""Tests for proxy/share/sessions.py: share-session epochs, limits, eviction."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from proxy.share.sessions import (
    DEFAULT_MAX_SHARE_SESSIONS,
    ContextKind,
    ShareSessionCache,
    ShareSessionError,
    next_epoch,
)

T = uuid.UUID(int=9)
P0, P1, P2 = (T, 0), (T, 1), (T, 2)


def error_of(call) -> ErrorCode:
    with pytest.raises(ShareSessionError) as info:
        call()
    return info.value.code


@pytest.fixture
def cache() -> ShareSessionCache:
    return ShareSessionCache(max_sessions=3)


def test_default_limit_is_kafkas():
    assert DEFAULT_MAX_SHARE_SESSIONS == 2000
    assert ShareSessionCache().max_sessions == 2000


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        ShareSessionCache(max_sessions=0)


def test_next_epoch_increments_wraps_to_one_and_keeps_final():
    assert next_epoch(0) == 1
    assert next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(-1) == -1


def test_initial_fetch_opens_a_session_expecting_epoch_one(cache):
    ctx = cache.share_fetch("g", "m", 0, "conn", fetch_partitions=[P0, P1])
    assert ctx.kind is ContextKind.NEW
    assert ctx.session.epoch == 1
    assert ctx.session.partitions == {P0, P1}
    assert ctx.added == {P0, P1}
    assert ctx.replaced is None
    assert cache.get("g", "m") == ctx.session


def test_initial_fetch_with_acknowledgements_is_invalid(cache):
    code = error_of(lambda: cache.share_fetch("g", "m", 0, "c", has_acknowledgements=True))
    assert code is ErrorCode.invalid_request
    assert len(cache) == 0


def test_initial_fetch_replaces_the_existing_session(cache):
    cache.share_fetch("g", "m", 0, "c1", fetch_partitions=[P0])
    cache.share_fetch("g", "m", 1, "c1", fetch_partitions=[P1])
    ctx = cache.share_fetch("g", "m", 0, "c2", fetch_partitions=[P2])
    assert ctx.kind is ContextKind.NEW
    assert ctx.replaced is not None and ctx.replaced.partitions == {P0, P1}
    assert ctx.session.partitions == {P2} and ctx.session.epoch == 1
    assert len(cache) == 1
    assert cache.sessions_of_connection("c1") == []
    assert [s.key.member_id for s in cache.sessions_of_connection("c2")] == ["m"]


def test_full_cache_answers_limit_reached(cache):
    for member in ("a", "b", "c"):
        cache.share_fetch("g", member, 0, "conn")
    code = error_of(lambda: cache.share_fetch("g", "d", 0, "conn"))
    assert code is ErrorCode.share_session_limit_reached
    assert cache.get("g", "d") is None


def test_replacing_a_session_works_even_when_full(cache):
    for member in ("a", "b", "c"):
        cache.share_fetch("g", member, 0, "conn")
    assert cache.share_fetch("g", "b", 0, "conn").kind is ContextKind.NEW
    assert len(cache) == 3


def test_sessions_are_keyed_by_group_and_member(cache):
    cache.share_fetch("g1", "m", 0, "c")
    cache.share_fetch("g2", "m", 0, "c")
    assert len(cache) == 2
    assert [s.key.group_id for s in cache.sessions_of_group("g1")] == ["g1"]


def test_subsequent_fetch_updates_partitions_and_epoch(cache):
    cache.share_fetch("g", "m", 0, "c", fetch_partitions=[P0, P1])
    ctx = cache.share_fetch("g", "m", 1, "c", fetch_partitions=[P2], forgotten_partitions=[P0])
    assert ctx.kind is ContextKind.UPDATE
    assert ctx.session.partitions == {P1, P2}
    assert ctx.added == {P2} and ctx.removed == {P0}
    assert ctx.session.epoch == 2
    assert cache.share_fetch("g", "m", 2, "c").session.epoch == 3


def test_forgotten_wins_over_fetched_as_in_kafka(cache):
    cache.share_fetch("g", "m", 0, "c", fetch_partitions=[P0])
    ctx = cache.share_fetch("g", "m", 1, "c", fetch_partitions=[P1], forgotten_partitions=[P1])
    assert ctx.session.partitions == {P0}


def test_subsequent_fetch_without_session_is_not_found(cache):
    assert error_of(lambda: cache.share_fetch("g", "m", 1, "c")) is ErrorCode.share_session_not_found


@pytest.mark.parametrize("epoch", [2, 5, -2])
def test_subsequent_fetch_with_wrong_epoch_is_invalid_epoch(cache, epoch):
    cache.share_fetch("g", "m", 0, "c", fetch_partitions=[P0])
    code = error_of(lambda: cache.share_fetch("g", "m", epoch, "c", fetch_partitions=[P1]))
    assert code is ErrorCode.invalid_share_session_epoch
    view = cache.get("g", "m")
    assert view is not None and view.epoch == 1 and view.partitions == {P0}


def test_final_fetch_closes_and_returns_partitions_to_release(cache):
    cache.share_fetch("g", "m", 0, "c", fetch_partitions=[P0, P1])
    ctx = cache.share_fetch("g", "m", -1, "c", has_acknowledgements=True)
    assert ctx.kind is ContextKind.FINAL
    assert ctx.session.partitions == {P0, P1}
    assert cache.get("g", "m") is None
    assert cache.sessions_of_connection("c") == []


def test_final_fetch_must_not_fetch(cache):
    cache.share_fetch("g", "m", 0, "c")
    code = error_of(lambda: cache.share_fetch("g", "m", -1, "c", fetch_partitions=[P0]))
    assert code is ErrorCode.invalid_request
    assert cache.get("g", "m") is not None


def test_final_fetch_without_session_is_not_found(cache):
    assert error_of(lambda: cache.share_fetch("g", "m", -1, "c")) is ErrorCode.share_session_not_found


def test_acknowledge_cannot_open_a_session(cache):
    code = error_of(lambda: cache.share_acknowledge("g", "m", 0, "c"))
    assert code is ErrorCode.invalid_share_session_epoch


def test_acknowledge_without_session_is_not_found(cache):
    assert error_of(lambda: cache.share_acknowledge("g", "m", 1, "c")) is ErrorCode.share_session_not_found
    assert error_of(lambda: cache.share_acknowledge("g", "m", -1, "c")) is ErrorCode.share_session_not_found


def test_acknowledge_checks_and_increments_the_shared_epoch(cache):
    cache.share_fetch("g", "m", 0, "c", fetch_partitions=[P0])
    assert cache.share_acknowledge("g", "m", 1, "c").session.epoch == 2
    assert error_of(lambda: cache.share_acknowledge("g", "m", 1, "c")) is ErrorCode.invalid_share_session_epoch
    assert cache.share_fetch("g", "m", 2, "c").session.epoch == 3


def test_final_acknowledge_closes_the_session(cache):
    cache.share_fetch("g", "m", 0, "c", fetch_partitions=[P0])
    ctx = cache.share_acknowledge("g", "m", -1, "c")
    assert ctx.kind is ContextKind.FINAL and ctx.session.partitions == {P0}
    assert cache.get("g", "m") is None


def test_connection_close_evicts_its_sessions_only(cache):
    cache.share_fetch("g", "a", 0, "c1", fetch_partitions=[P0])
    cache.share_fetch("g", "b", 0, "c1", fetch_partitions=[P1])
    cache.share_fetch("g", "c", 0, "c2", fetch_partitions=[P2])
    evicted = cache.connection_closed("c1")
    assert [(s.key.member_id, s.partitions) for s in evicted] == [("a", {P0}), ("b", {P1})]
    assert len(cache) == 1 and cache.get("g", "c") is not None
    assert cache.connection_closed("c1") == []


def test_session_follows_the_connection_it_is_used_on(cache):
    cache.share_fetch("g", "m", 0, "old")
    cache.share_fetch("g", "m", 1, "new")
    assert cache.connection_closed("old") == []
    assert [s.key.member_id for s in cache.connection_closed("new")] == ["m"]


def test_remove_and_total_partitions(cache):
    cache.share_fetch("g", "a", 0, "c", fetch_partitions=[P0, P1])
    cache.share_fetch("g", "b", 0, "c", fetch_partitions=[P2])
    assert cache.total_partitions() == 3
    removed = cache.remove("g", "a")
    assert removed is not None and removed.partitions == {P0, P1}
    assert cache.remove("g", "a") is None
    assert cache.total_partitions() == 1


# -- stateful model ------------------------------------------------------------------------

MEMBERS = st.sampled_from(["m1", "m2", "m3", "m4"])
CONNS = st.sampled_from(["c1", "c2"])
PARTS = st.frozensets(st.sampled_from([P0, P1, P2]), max_size=3)


class SessionCacheMachine(RuleBasedStateMachine):
    """The cache against a dict model: epochs, bounds and connection binding."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = ShareSessionCache(max_sessions=3)
        self.model: dict[str, tuple[int, str, frozenset]] = {}  # member -> (epoch, conn, parts)

    @rule(member=MEMBERS, conn=CONNS, parts=PARTS)
    def open(self, member, conn, parts):
        if member not in self.model and len(self.model) >= 3:
            code = error_of(lambda: self.cache.share_fetch("g", member, 0, conn, fetch_partitions=parts))
            assert code is ErrorCode.share_session_limit_reached
            return
        self.cache.share_fetch("g", member, 0, conn, fetch_partitions=parts)
        self.model[member] = (1, conn, parts)

    @rule(member=MEMBERS, conn=CONNS, add=PARTS, forget=PARTS, skew=st.sampled_from([0, 0, 0, 1, -1]))
    def fetch(self, member, conn, add, forget, skew):
        if member not in self.model:
            code = error_of(lambda: self.cache.share_fetch("g", member, 1 + abs(skew), conn))
            assert code is ErrorCode.share_session_not_found
            return
        epoch, _, parts = self.model[member]
        if skew:
            wrong = epoch + skew if epoch + skew > 0 else epoch + 1  # 0 and -1 mean open/close
            code = error_of(lambda: self.cache.share_fetch("g", member, wrong, conn, fetch_partitions=add))
            assert code is ErrorCode.invalid_share_session_epoch
            return
        ctx = self.cache.share_fetch("g", member, epoch, conn, fetch_partitions=add, forgotten_partitions=forget)
        self.model[member] = (epoch + 1, conn, (parts | add) - forget)
        assert ctx.session.partitions == self.model[member][2]

    @rule(member=MEMBERS, conn=CONNS)
    def acknowledge(self, member, conn):
        if member not in self.model:
            assert error_of(lambda: self.cache.share_acknowledge("g", member, 1, conn)) is ErrorCode.share_session_not_found
            return
        epoch, _, parts = self.model[member]
        self.cache.share_acknowledge("g", member, epoch, conn)
        self.model[member] = (epoch + 1, conn, parts)

    @rule(member=MEMBERS, conn=CONNS, via_ack=st.booleans())
    def close(self, member, conn, via_ack):
        call = self.cache.share_acknowledge if via_ack else self.cache.share_fetch
        if member not in self.model:
            assert error_of(lambda: call("g", member, -1, conn)) is ErrorCode.share_session_not_found
            return
        ctx = call("g", member, -1, conn)
        assert ctx.session.partitions == self.model.pop(member)[2]

    @rule(conn=CONNS)
    def disconnect(self, conn):
        evicted = {s.key.member_id: s.partitions for s in self.cache.connection_closed(conn)}
        expected = {m: parts for m, (_, c, parts) in self.model.items() if c == conn}
        assert evicted == expected
        for member in expected:
            del self.model[member]

    @invariant()
    def matches_model(self):
        assert len(self.cache) == len(self.model) <= 3
        for member, (epoch, conn, parts) in self.model.items():
            view = self.cache.get("g", member)
            assert view is not None
            assert (view.epoch, view.connection_id, view.partitions) == (epoch, conn, parts)


TestSessionCacheMachine = SessionCacheMachine.TestCase
