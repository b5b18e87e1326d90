"""Tests for proxy/share/sessions.py: share-session epochs, limits, eviction."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from proxy import connection
from proxy.share.sessions import (
    BOOTSTRAP_NODE_ID,
    DEFAULT_MAX_SHARE_SESSIONS,
    ContextKind,
    ForgottenPartitions,
    SessionKey,
    ShareSessionCache,
    ShareSessionError,
    next_epoch,
    response_order,
)

N = 1  # the node (proxy listener's broker id) the sessions live on
KEY = SessionKey(N, "g", "m")
T = uuid.UUID(int=9)
P0, P1, P2 = (T, 0), (T, 1), (T, 2)


def error_of(call) -> ErrorCode:
    with pytest.raises(ShareSessionError) as info:
        call()
    return info.value.code


@pytest.fixture
def cache() -> ShareSessionCache:
    return ShareSessionCache(max_sessions=3)


@given(st.lists(st.tuples(st.uuids(), st.integers(0, 2**31 - 1)), max_size=40))
def test_partitions_are_listed_in_the_order_of_their_topic_ids_text(partitions):
    # The order responses list partitions in (and forgotten-partition bookkeeping assumes) stays
    # the topic id's text order, then partition, though it is no longer computed from the text.
    by_text = sorted(partitions, key=lambda tp: (str(tp[0]), tp[1]))
    assert sorted(partitions, key=response_order) == by_text


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
    ctx = cache.share_fetch(N, "g", "m", 0, "conn", fetch_partitions=[P0, P1])
    assert ctx.kind is ContextKind.NEW
    assert ctx.session.epoch == 1
    assert ctx.session.partitions == {P0, P1}
    assert ctx.added == {P0, P1}
    assert ctx.replaced is None
    assert cache.get(N, "g", "m") == ctx.session


def test_initial_fetch_with_acknowledgements_is_invalid(cache):
    code = error_of(lambda: cache.share_fetch(N, "g", "m", 0, "c", has_acknowledgements=True))
    assert code is ErrorCode.invalid_request
    assert len(cache) == 0


def test_initial_fetch_replaces_the_existing_session(cache):
    cache.share_fetch(N, "g", "m", 0, "c1", fetch_partitions=[P0])
    cache.share_fetch(N, "g", "m", 1, "c1", fetch_partitions=[P1])
    ctx = cache.share_fetch(N, "g", "m", 0, "c2", fetch_partitions=[P2])
    assert ctx.kind is ContextKind.NEW
    assert ctx.replaced is not None and ctx.replaced.partitions == {P0, P1}
    assert ctx.session.partitions == {P2} and ctx.session.epoch == 1
    assert len(cache) == 1
    assert cache.sessions_of_connection("c1") == []
    assert [s.key.member_id for s in cache.sessions_of_connection("c2")] == ["m"]


def test_full_cache_answers_limit_reached(cache):
    for member in ("a", "b", "c"):
        cache.share_fetch(N, "g", member, 0, "conn")
    code = error_of(lambda: cache.share_fetch(N, "g", "d", 0, "conn"))
    assert code is ErrorCode.share_session_limit_reached
    assert cache.get(N, "g", "d") is None


def test_replacing_a_session_works_even_when_full(cache):
    for member in ("a", "b", "c"):
        cache.share_fetch(N, "g", member, 0, "conn")
    assert cache.share_fetch(N, "g", "b", 0, "conn").kind is ContextKind.NEW
    assert len(cache) == 3


def test_sessions_are_keyed_by_group_and_member_on_a_node(cache):
    cache.share_fetch(N, "g1", "m", 0, "c")
    cache.share_fetch(N, "g2", "m", 0, "c")
    assert len(cache) == 2
    assert [s.key.group_id for s in cache.sessions_of_group("g1")] == ["g1"]


def test_a_member_keeps_one_session_per_node_with_independent_epochs(cache):
    cache.share_fetch(1, "g", "m", 0, "c1", fetch_partitions=[P0])
    second = cache.share_fetch(2, "g", "m", 0, "c2", fetch_partitions=[P1])
    assert second.kind is ContextKind.NEW and second.replaced is None  # node 1's session stays
    assert cache.share_fetch(1, "g", "m", 1, "c1").session.epoch == 2
    assert cache.share_fetch(1, "g", "m", 2, "c1").session.epoch == 3
    assert cache.share_acknowledge(2, "g", "m", 1, "c2").session.epoch == 2
    # Each node checks its own epoch: node 1's next epoch is no use on node 2.
    assert error_of(lambda: cache.share_acknowledge(2, "g", "m", 3, "c2")) is ErrorCode.invalid_share_session_epoch
    assert error_of(lambda: cache.share_fetch(3, "g", "m", 1, "c3")) is ErrorCode.share_session_not_found
    assert [(s.key, s.epoch, s.partitions) for s in cache.sessions_of_member("g", "m")] == [
        (SessionKey(1, "g", "m"), 3, {P0}), (SessionKey(2, "g", "m"), 2, {P1})]


def test_closing_one_nodes_session_leaves_the_other(cache):
    cache.share_fetch(1, "g", "m", 0, "c1", fetch_partitions=[P0])
    cache.share_fetch(2, "g", "m", 0, "c2", fetch_partitions=[P1, P2])
    closed = cache.share_fetch(1, "g", "m", -1, "c1")
    assert closed.kind is ContextKind.FINAL and closed.session.key.node_id == 1 and closed.session.partitions == {P0}
    assert cache.get(1, "g", "m") is None
    assert cache.share_fetch(2, "g", "m", 1, "c2").session.partitions == {P1, P2}
    # A connection belongs to one listener: closing it evicts that node's session only.
    cache.share_fetch(1, "g", "m", 0, "c1", fetch_partitions=[P0])
    evicted = cache.connection_closed("c2")
    assert [(s.key.node_id, s.partitions) for s in evicted] == [(2, {P1, P2})]
    assert cache.get(1, "g", "m") is not None and cache.total_partitions() == 1


def test_the_bounds_are_proxy_wide_over_all_nodes():
    cache = ShareSessionCache(max_sessions=2, max_partitions_per_session=2, max_partitions=3)
    cache.share_fetch(1, "g", "m", 0, "c1", fetch_partitions=[P0, P1])
    cache.share_fetch(2, "g", "m", 0, "c2", fetch_partitions=[P2])
    assert cache.total_partitions() == 3 and len(cache) == 2
    assert error_of(lambda: cache.share_fetch(3, "g", "m", 0, "c3")) is ErrorCode.share_session_limit_reached
    code = error_of(lambda: cache.share_fetch(2, "g", "m", 1, "c2", fetch_partitions=[(T, 3)]))
    assert code is ErrorCode.share_session_limit_reached


def test_the_bootstrap_listeners_node_id_is_the_connections():
    assert BOOTSTRAP_NODE_ID == connection.BOOTSTRAP_NODE_ID == -1


def test_subsequent_fetch_updates_partitions_and_epoch(cache):
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=[P0, P1])
    ctx = cache.share_fetch(N, "g", "m", 1, "c", fetch_partitions=[P2], forgotten_partitions=[P0])
    assert ctx.kind is ContextKind.UPDATE
    assert ctx.session.partitions == {P1, P2}
    assert ctx.added == {P2} and ctx.removed == {P0}
    assert ctx.session.epoch == 2
    assert cache.share_fetch(N, "g", "m", 2, "c").session.epoch == 3


def test_forgotten_wins_over_fetched_as_in_kafka(cache):
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=[P0])
    ctx = cache.share_fetch(N, "g", "m", 1, "c", fetch_partitions=[P1], forgotten_partitions=[P1])
    assert ctx.session.partitions == {P0}


def test_subsequent_fetch_without_session_is_not_found(cache):
    assert error_of(lambda: cache.share_fetch(N, "g", "m", 1, "c")) is ErrorCode.share_session_not_found


@pytest.mark.parametrize("epoch", [2, 5, -2])
def test_subsequent_fetch_with_wrong_epoch_is_invalid_epoch(cache, epoch):
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=[P0])
    code = error_of(lambda: cache.share_fetch(N, "g", "m", epoch, "c", fetch_partitions=[P1]))
    assert code is ErrorCode.invalid_share_session_epoch
    view = cache.get(N, "g", "m")
    assert view is not None and view.epoch == 1 and view.partitions == {P0}


def test_final_fetch_closes_and_returns_partitions_to_release(cache):
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=[P0, P1])
    ctx = cache.share_fetch(N, "g", "m", -1, "c", has_acknowledgements=True)
    assert ctx.kind is ContextKind.FINAL
    assert ctx.session.partitions == {P0, P1}
    assert cache.get(N, "g", "m") is None
    assert cache.sessions_of_connection("c") == []


def test_final_fetch_must_not_fetch(cache):
    cache.share_fetch(N, "g", "m", 0, "c")
    code = error_of(lambda: cache.share_fetch(N, "g", "m", -1, "c", fetch_partitions=[P0]))
    assert code is ErrorCode.invalid_request
    assert cache.get(N, "g", "m") is not None


def test_final_fetch_without_session_is_not_found(cache):
    assert error_of(lambda: cache.share_fetch(N, "g", "m", -1, "c")) is ErrorCode.share_session_not_found


def test_acknowledge_cannot_open_a_session(cache):
    code = error_of(lambda: cache.share_acknowledge(N, "g", "m", 0, "c"))
    assert code is ErrorCode.invalid_share_session_epoch


def test_acknowledge_without_session_is_not_found(cache):
    assert error_of(lambda: cache.share_acknowledge(N, "g", "m", 1, "c")) is ErrorCode.share_session_not_found
    assert error_of(lambda: cache.share_acknowledge(N, "g", "m", -1, "c")) is ErrorCode.share_session_not_found


def test_acknowledge_checks_and_increments_the_shared_epoch(cache):
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=[P0])
    assert cache.share_acknowledge(N, "g", "m", 1, "c").session.epoch == 2
    assert error_of(lambda: cache.share_acknowledge(N, "g", "m", 1, "c")) is ErrorCode.invalid_share_session_epoch
    assert cache.share_fetch(N, "g", "m", 2, "c").session.epoch == 3


def test_final_acknowledge_closes_the_session(cache):
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=[P0])
    ctx = cache.share_acknowledge(N, "g", "m", -1, "c")
    assert ctx.kind is ContextKind.FINAL and ctx.session.partitions == {P0}
    assert cache.get(N, "g", "m") is None


def test_connection_close_evicts_its_sessions_only(cache):
    cache.share_fetch(N, "g", "a", 0, "c1", fetch_partitions=[P0])
    cache.share_fetch(N, "g", "b", 0, "c1", fetch_partitions=[P1])
    cache.share_fetch(N, "g", "c", 0, "c2", fetch_partitions=[P2])
    evicted = cache.connection_closed("c1")
    assert [(s.key.member_id, s.partitions) for s in evicted] == [("a", {P0}), ("b", {P1})]
    assert len(cache) == 1 and cache.get(N, "g", "c") is not None
    assert cache.connection_closed("c1") == []


def test_session_follows_the_connection_it_is_used_on(cache):
    cache.share_fetch(N, "g", "m", 0, "old")
    cache.share_fetch(N, "g", "m", 1, "new")
    assert cache.connection_closed("old") == []
    assert [s.key.member_id for s in cache.connection_closed("new")] == ["m"]


def test_remove_and_total_partitions(cache):
    cache.share_fetch(N, "g", "a", 0, "c", fetch_partitions=[P0, P1])
    cache.share_fetch(N, "g", "b", 0, "c", fetch_partitions=[P2])
    assert cache.total_partitions() == 3
    removed = cache.remove(N, "g", "a")
    assert removed is not None and removed.partitions == {P0, P1}
    assert cache.remove(N, "g", "a") is None
    assert cache.total_partitions() == 1


# -- partition bounds ----------------------------------------------------------------------


def parts(n: int, start: int = 0) -> list[tuple[uuid.UUID, int]]:
    return [(T, i) for i in range(start, start + n)]


def test_default_partition_bounds():
    cache = ShareSessionCache()
    assert (cache.max_partitions_per_session, cache.max_partitions) == (10_000, 200_000)
    with pytest.raises(ValueError):
        ShareSessionCache(max_partitions_per_session=0)


def test_a_session_cannot_open_with_more_partitions_than_allowed():
    cache = ShareSessionCache(max_partitions_per_session=3)
    code = error_of(lambda: cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=parts(4)))
    assert code is ErrorCode.share_session_limit_reached
    assert len(cache) == 0 and cache.total_partitions() == 0
    assert cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=parts(3)).session.partitions == set(parts(3))


def test_a_session_cannot_grow_beyond_the_bound_and_stays_as_it_was():
    cache = ShareSessionCache(max_partitions_per_session=3)
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=parts(2))
    code = error_of(lambda: cache.share_fetch(N, "g", "m", 1, "c", fetch_partitions=parts(2, start=2)))
    assert code is ErrorCode.share_session_limit_reached
    view = cache.get(N, "g", "m")
    assert view is not None and (view.epoch, view.partitions) == (1, set(parts(2)))
    # Forgetting in the same request keeps it within the bound: allowed.
    ctx = cache.share_fetch(N, "g", "m", 1, "c", fetch_partitions=parts(2, start=2), forgotten_partitions=parts(1))
    assert ctx.session.partitions == {(T, 1), (T, 2), (T, 3)} and ctx.session.epoch == 2


def test_a_refused_reopen_leaves_the_old_session_in_place():
    cache = ShareSessionCache(max_partitions_per_session=3)
    cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=parts(3))
    assert error_of(lambda: cache.share_fetch(N, "g", "m", 0, "c", fetch_partitions=parts(5))) is (
        ErrorCode.share_session_limit_reached
    )
    assert cache.get(N, "g", "m").partitions == set(parts(3))


def test_partitions_over_all_sessions_are_bounded_and_freed_on_close():
    cache = ShareSessionCache(max_partitions_per_session=10, max_partitions=15)
    cache.share_fetch(N, "g", "a", 0, "c1", fetch_partitions=parts(10))
    code = error_of(lambda: cache.share_fetch(N, "g", "b", 0, "c2", fetch_partitions=parts(6, start=10)))
    assert code is ErrorCode.share_session_limit_reached
    cache.share_fetch(N, "g", "b", 0, "c2", fetch_partitions=parts(5, start=10))
    assert cache.total_partitions() == 15
    # Re-opening "a" with as many partitions as it holds fits: its own are freed first.
    cache.share_fetch(N, "g", "a", 0, "c1", fetch_partitions=parts(10, start=20))
    assert cache.total_partitions() == 15
    cache.connection_closed("c1")
    assert cache.total_partitions() == 5
    cache.share_fetch(N, "g", "c", 0, "c3", fetch_partitions=parts(10, start=40))
    assert cache.total_partitions() == 15


def test_a_flood_of_partitions_keeps_the_cache_within_its_bounds():
    """Clients naming a million partitions (real or not) leave at most `max_partitions` in the cache.

    tracemalloc measures what the cache holds after the flood; without the bounds the same flood
    holds every partition named (a few hundred MB).
    """
    import tracemalloc

    cache = ShareSessionCache(max_sessions=100, max_partitions_per_session=1_000, max_partitions=20_000)
    topics = [uuid.UUID(int=i) for i in range(1, 101)]
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        refused = 0
        for member in range(100):
            epoch = 0
            for round_ in range(100):  # 100 requests x 100 new partitions per member
                new = [(topics[round_ % 100], member * 100_000 + round_ * 100 + i) for i in range(100)]
                try:
                    epoch = cache.share_fetch(N, "g", f"m{member}", epoch, "c", fetch_partitions=new).session.epoch
                except ShareSessionError as exc:
                    assert exc.code is ErrorCode.share_session_limit_reached
                    refused += 1
                assert cache.total_partitions() <= 20_000
        held = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert refused >= 100 * 100 - 20_000 // 100
    assert cache.total_partitions() == 20_000
    # ~20k partition entries: ~2.5 MB (the 1M named, unbounded, measured ~140 MB).
    assert held < 16 * 1024 * 1024, held


# -- stateful model ------------------------------------------------------------------------

MEMBERS = st.sampled_from([(1, "m1"), (2, "m1"), (1, "m2"), (2, "m3")])  # (node, member): one member on two nodes
CONNS = st.sampled_from(["c1", "c2"])
PARTS = st.frozensets(st.sampled_from([P0, P1, P2]), max_size=3)


PER_SESSION, TOTAL = 2, 4


class SessionCacheMachine(RuleBasedStateMachine):
    """The cache against a dict model: epochs, bounds and connection binding, per (node, member)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = ShareSessionCache(max_sessions=3, max_partitions_per_session=PER_SESSION, max_partitions=TOTAL)
        self.model: dict[tuple[int, str], tuple[int, str, frozenset]] = {}  # (node, member) -> (epoch, conn, parts)

    def refused_for_partitions(self, member: tuple[int, str], wanted: frozenset) -> bool:
        held_now = len(self.model[member][2]) if member in self.model else 0
        total = sum(len(parts) for _, _, parts in self.model.values())
        return len(wanted) > PER_SESSION or total - held_now + len(wanted) > TOTAL

    @rule(member=MEMBERS, conn=CONNS, parts=PARTS)
    def open(self, member, conn, parts):
        if self.refused_for_partitions(member, parts) or (member not in self.model and len(self.model) >= 3):
            code = error_of(lambda: self.cache.share_fetch(member[0], "g", member[1], 0, conn, fetch_partitions=parts))
            assert code is ErrorCode.share_session_limit_reached
            return
        self.cache.share_fetch(member[0], "g", member[1], 0, conn, fetch_partitions=parts)
        self.model[member] = (1, conn, parts)

    @rule(member=MEMBERS, conn=CONNS, add=PARTS, forget=PARTS, skew=st.sampled_from([0, 0, 0, 1, -1]))
    def fetch(self, member, conn, add, forget, skew):
        if member not in self.model:
            code = error_of(lambda: self.cache.share_fetch(member[0], "g", member[1], 1 + abs(skew), conn))
            assert code is ErrorCode.share_session_not_found
            return
        epoch, _, parts = self.model[member]
        if skew:
            wrong = epoch + skew if epoch + skew > 0 else epoch + 1  # 0 and -1 mean open/close
            code = error_of(lambda: self.cache.share_fetch(member[0], "g", member[1], wrong, conn,
                                                           fetch_partitions=add))
            assert code is ErrorCode.invalid_share_session_epoch
            return
        if self.refused_for_partitions(member, (parts | add) - forget):
            code = error_of(lambda: self.cache.share_fetch(member[0], "g", member[1], epoch, conn,
                                                           fetch_partitions=add, forgotten_partitions=forget))
            assert code is ErrorCode.share_session_limit_reached  # and the session is unchanged
            return
        ctx = self.cache.share_fetch(member[0], "g", member[1], epoch, conn, fetch_partitions=add,
                                     forgotten_partitions=forget)
        self.model[member] = (epoch + 1, conn, (parts | add) - forget)
        assert ctx.session.partitions == self.model[member][2]

    @rule(member=MEMBERS, conn=CONNS)
    def acknowledge(self, member, conn):
        if member not in self.model:
            code = error_of(lambda: self.cache.share_acknowledge(member[0], "g", member[1], 1, conn))
            assert code is ErrorCode.share_session_not_found
            return
        epoch, _, parts = self.model[member]
        self.cache.share_acknowledge(member[0], "g", member[1], epoch, conn)
        self.model[member] = (epoch + 1, conn, parts)

    @rule(member=MEMBERS, conn=CONNS, via_ack=st.booleans())
    def close(self, member, conn, via_ack):
        call = self.cache.share_acknowledge if via_ack else self.cache.share_fetch
        if member not in self.model:
            assert error_of(lambda: call(member[0], "g", member[1], -1, conn)) is ErrorCode.share_session_not_found
            return
        ctx = call(member[0], "g", member[1], -1, conn)
        assert ctx.session.partitions == self.model.pop(member)[2]

    @rule(conn=CONNS)
    def disconnect(self, conn):
        evicted = {(s.key.node_id, s.key.member_id): s.partitions for s in self.cache.connection_closed(conn)}
        expected = {m: parts for m, (_, c, parts) in self.model.items() if c == conn}
        assert evicted == expected
        for member in expected:
            del self.model[member]

    @invariant()
    def matches_model(self):
        assert len(self.cache) == len(self.model) <= 3
        assert self.cache.total_partitions() == sum(len(p) for _, _, p in self.model.values()) <= TOTAL
        for member, (epoch, conn, parts) in self.model.items():
            view = self.cache.get(member[0], "g", member[1])
            assert view is not None
            assert (view.epoch, view.connection_id, view.partitions) == (epoch, conn, parts)


TestSessionCacheMachine = SessionCacheMachine.TestCase


# ----- partitions forgotten while records were held ------------------------------------------


def test_records_handed_out_before_an_acknowledged_one_are_abandoned_on_forgotten_partitions():
    watch = ForgottenPartitions()
    watch.forgot(KEY, [P2])
    assert watch.watching(KEY) and not watch.watching(SessionKey(N, "g", "other"))
    watch.fetch_started(KEY, 10)  # the ShareFetch that forgot P2 acquires above 10
    # Acknowledging records from before it (lock ids below 10, e.g. P2's own): nothing is known.
    assert watch.abandoned(KEY, [(P2, 9)], now_mark=11) == []
    # A P1 record that ShareFetch handed out is acknowledged: what the member holds on P2 from
    # before that ShareFetch will never be (P2 comes after P1 in a response: only earlier ones count).
    assert watch.abandoned(KEY, [(P1, 12)], now_mark=13) == [(P2, 10)]
    watch.fetch_started(KEY, 20)
    watch.fetch_started(KEY, 30)
    assert watch.abandoned(KEY, [(P1, 25)], now_mark=40) == [(P2, 20)]
    assert watch.watching(KEY)  # records may still be handed out there (see the class doc)


def test_a_forgotten_partition_listed_before_the_acknowledged_one_counts_its_whole_fetch():
    watch = ForgottenPartitions()
    watch.forgot(KEY, [P0, P2])
    watch.fetch_started(KEY, 10)
    watch.fetch_started(KEY, 20)
    # One response handed out P0 (lock 21), P1 (22) and P2 (23), in that order; P1 is acknowledged:
    # P0's records of that response were handed out before it, P2's after it.
    assert watch.abandoned(KEY, [(P1, 22)], now_mark=24) == [(P0, 24), (P2, 20)]
    # The record handed out last decides (P2 of that response); a later ShareFetch bounds it.
    watch.fetch_started(KEY, 30)
    assert watch.abandoned(KEY, [(P2, 23), (P1, 15)], now_mark=31) == [(P0, 30), (P2, 20)]
    assert watch.abandoned(KEY, [(P1, 15)], now_mark=32) == []  # that ShareFetch's mark is pruned


def test_fetches_are_only_marked_for_watched_members_and_drop_ends_a_watch():
    watch = ForgottenPartitions()
    watch.fetch_started(KEY, 10)
    watch.forgot(KEY, [])
    assert not watch.watching(KEY) and len(watch) == 0
    assert watch.abandoned(KEY, [(P1, 99)], now_mark=100) == []
    watch.forgot(KEY, [P0])
    watch.fetch_started(KEY, 10)
    watch.drop(KEY)  # the member's records were all released (session closed, member left)
    assert not watch.watching(KEY)
    assert watch.abandoned(KEY, [(P1, 99)], now_mark=100) == []


def test_only_the_latest_fetch_marks_are_kept():
    watch = ForgottenPartitions()
    watch.forgot(KEY, [P2])
    marks = [10 * (i + 1) for i in range(ForgottenPartitions.MAX_FETCH_MARKS + 10)]
    for mark in marks:
        watch.fetch_started(KEY, mark)
    assert watch.abandoned(KEY, [(P1, 15)], now_mark=10**6) == []  # that ShareFetch is forgotten
    assert watch.abandoned(KEY, [(P1, marks[-1] + 1)], now_mark=10**6) == [(P2, marks[-1])]


def test_settled_partitions_leave_the_watch_and_an_empty_watch_ends():
    watch = ForgottenPartitions()
    watch.forgot(KEY, [P0, P2])
    watch.fetch_started(KEY, 10)
    watch.settled(KEY, [P0])  # the member holds nothing on P0 and no longer fetches it
    assert watch.abandoned(KEY, [(P1, 12)], now_mark=13) == [(P2, 10)]
    watch.settled(KEY, [P2])
    assert not watch.watching(KEY) and len(watch) == 0
    assert watch.abandoned(KEY, [(P1, 22)], now_mark=23) == []
    watch.settled(KEY, [P1])  # nothing watched: nothing to do
    watch.forgot(KEY, [P2])  # forgotten again: watched again, from its next ShareFetch on
    watch.fetch_started(KEY, 30)
    assert watch.abandoned(KEY, [(P1, 31)], now_mark=32) == [(P2, 30)]


def test_forgotten_partitions_are_watched_per_session():
    watch = ForgottenPartitions()
    on_two = SessionKey(2, "g", "m")
    watch.forgot(KEY, [P2])
    watch.forgot(on_two, [P0])
    assert watch.watching(KEY) and watch.watching(on_two) and len(watch) == 2
    watch.fetch_started(KEY, 10)
    watch.fetch_started(on_two, 15)  # node 2's ShareFetch overlaps node 1's: its mark is not node 1's
    assert watch.abandoned(KEY, [(P1, 20)], now_mark=30) == [(P2, 10)]
    assert watch.drop(KEY) == {P2} and watch.drop(KEY) == set()
    assert watch.watching(on_two)
    watch.forgot(KEY, [P1])
    watch.drop_member("g", "m")  # the member left: every node's watch ends
    assert len(watch) == 0
