"""Tests for proxy/share/assignor.py: balance, coverage, stickiness, determinism."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.share.assignor import ASSIGNOR_NAME, SimpleAssignor, assign, desired_sharing

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
T3 = uuid.UUID(int=3)


def members(n: int, topics=(T1,)) -> dict[str, list[uuid.UUID]]:
    return {f"m{i:03d}": list(topics) for i in range(n)}


def loads(result) -> list[int]:
    return [len(v) for v in result.values()]


def sharing(result) -> dict[tuple[uuid.UUID, int], int]:
    counts: dict[tuple[uuid.UUID, int], int] = {}
    for parts in result.values():
        for tp in parts:
            counts[tp] = counts.get(tp, 0) + 1
    return counts


# -- examples ------------------------------------------------------------------------------


def test_name_is_simple():
    assert SimpleAssignor().name == ASSIGNOR_NAME == "simple"


def test_no_members_no_assignment():
    assert assign({}, {T1: 3}) == {}


def test_one_member_takes_every_partition():
    assert assign({"a": [T1]}, {T1: 3}) == {"a": frozenset({(T1, 0), (T1, 1), (T1, 2)})}


def test_three_members_share_one_partition():
    result = assign(members(3), {T1: 1})
    assert all(parts == frozenset({(T1, 0)}) for parts in result.values())


def test_five_members_three_partitions_each_partition_shared_by_two():
    result = assign(members(5), {T1: 3})
    assert set(sharing(result).values()) == {2}
    assert sorted(loads(result)) == [1, 1, 1, 1, 2]


def test_more_partitions_than_members_spread_evenly():
    result = assign(members(3), {T1: 10})
    assert sorted(loads(result)) == [3, 3, 4]
    assert set(sharing(result).values()) == {1}


def test_unknown_and_empty_topics_are_ignored():
    result = assign({"a": [T1, T2], "b": [T3]}, {T1: 2, T3: 0})
    assert result == {"a": frozenset({(T1, 0), (T1, 1)}), "b": frozenset()}


def test_member_only_gets_partitions_of_its_topics():
    result = assign({"a": [T1], "b": [T2], "c": [T1, T2]}, {T1: 2, T2: 2})
    assert all(tp[0] == T1 for tp in result["a"])
    assert all(tp[0] == T2 for tp in result["b"])
    assert result["a"] and result["b"] and result["c"]


def test_unsubscribed_topic_is_revoked():
    before = assign({"a": [T1, T2]}, {T1: 1, T2: 1})
    after = assign({"a": [T2]}, {T1: 1, T2: 1}, before)
    assert after == {"a": frozenset({(T2, 0)})}


def test_partitions_of_a_shrunk_or_deleted_topic_are_dropped():
    before = assign(members(2), {T1: 4})
    after = assign(members(2), {T1: 2}, before)
    assert all(p < 2 for parts in after.values() for _, p in parts)
    assert assign(members(2), {}, before) == {"m000": frozenset(), "m001": frozenset()}


def test_adding_a_member_moves_only_what_it_needs():
    before = assign(members(3), {T1: 10})
    after = assign(members(4), {T1: 10}, before)
    moved = sum(len(before[m] - after[m]) for m in before)
    assert len(after["m003"]) == 2  # 10 slots over 4 members: 3, 3, 2, 2
    assert moved == 2


def test_removing_a_member_only_hands_out_its_partitions():
    before = assign(members(4), {T1: 8})
    remaining = members(4)
    del remaining["m001"]
    after = assign(remaining, {T1: 8}, before)
    for m in remaining:
        assert before[m] <= after[m]


def test_desired_sharing():
    assert desired_sharing(5, 3) == 2
    assert desired_sharing(3, 10) == 1
    assert desired_sharing(4, 1) == 4
    assert desired_sharing(0, 3) == 0


# -- properties ----------------------------------------------------------------------------

TOPICS = [uuid.UUID(int=i) for i in range(1, 5)]


@st.composite
def homogeneous(draw):
    num_members = draw(st.integers(1, 25))
    topics = draw(st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3, unique=True))
    counts = {t: draw(st.integers(1, 12)) for t in topics}
    return members(num_members, topics), counts


@st.composite
def heterogeneous(draw):
    counts = {t: draw(st.integers(0, 8)) for t in TOPICS}
    subs = draw(
        st.dictionaries(
            st.text("abcdefgh", min_size=1, max_size=3),
            st.lists(st.sampled_from(TOPICS), min_size=1, max_size=4, unique=True),
            min_size=1,
            max_size=15,
        )
    )
    previous = draw(st.dictionaries(
        st.sampled_from(sorted(subs)),
        st.frozensets(st.tuples(st.sampled_from(TOPICS), st.integers(0, 9)), max_size=6),
    ))
    return subs, counts, previous


@settings(max_examples=400)
@given(homogeneous(), st.data())
def test_homogeneous_meets_kafka_balance_targets(case, data):
    subs, counts = case
    # Whatever the previous assignment (stale members, unknown partitions, lopsided loads).
    previous = data.draw(st.dictionaries(
        st.sampled_from(sorted(subs) + ["gone"]),
        st.frozensets(st.tuples(st.sampled_from(TOPICS), st.integers(0, 13)), max_size=20),
    ))
    result = assign(subs, counts, previous)
    total_partitions = sum(counts.values())
    share = desired_sharing(len(subs), total_partitions)
    # Every partition is shared by exactly ceil(M/P) members ...
    assert sorted(sharing(result)) == sorted((t, p) for t, n in counts.items() for p in range(n))
    assert set(sharing(result).values()) == {share}
    # ... and member loads differ by at most one, every member having work.
    assert max(loads(result)) - min(loads(result)) <= 1
    assert min(loads(result)) >= 1


@settings(max_examples=300)
@given(heterogeneous())
def test_coverage_validity_and_determinism(case):
    subs, counts, previous = case
    result = assign(subs, counts, previous)
    assert set(result) == set(subs)
    for member, parts in result.items():
        for topic, partition in parts:
            assert topic in subs[member] and 0 <= partition < counts[topic]
        if any(counts[t] for t in subs[member]):
            assert parts, f"{member} subscribed to non-empty topics but got nothing"
    subscribed = {t for ts in subs.values() for t in ts}
    assigned = set(sharing(result))
    assert assigned == {(t, p) for t in subscribed for p in range(counts[t])}
    assert assign(dict(reversed(list(subs.items()))), counts, previous) == result


@settings(max_examples=300)
@given(homogeneous(), st.data())
def test_reassigning_the_same_group_moves_nothing(case, data):
    subs, counts = case
    first = assign(subs, counts)
    assert assign(subs, counts, first) == first


@settings(max_examples=300)
@given(homogeneous())
def test_adding_one_member_moves_few_partitions(case):
    subs, counts = case
    before = assign(subs, counts)
    grown = {**subs, "zz-new": next(iter(subs.values()))}
    after = assign(grown, counts, before)
    revoked = sum(len(before[m] - after[m]) for m in before)
    # At most what the newcomer takes: nothing moves between the old members.
    assert revoked <= len(after["zz-new"])


@settings(max_examples=300)
@given(homogeneous())
def test_removing_one_member_moves_little(case):
    subs, counts = case
    before = assign(subs, counts)
    leaver = sorted(subs)[0]
    shrunk = {m: t for m, t in subs.items() if m != leaver}
    after = assign(shrunk, counts, before)
    revoked = sum(len(before[m] - after[m]) for m in shrunk)
    # Each slot the leaver frees is refilled with at most one move (a swap, when every
    # member with room already holds that partition); a lower desired sharing revokes the
    # surplus sharers on top.
    old_share = desired_sharing(len(subs), sum(counts.values()))
    new_share = desired_sharing(len(shrunk), sum(counts.values()))
    assert revoked <= len(before[leaver]) + (old_share - new_share) * sum(counts.values())
