"""The ownership group's pure parts: identities in client.id, slots, the owner map from a group
description (the group itself runs against a broker in integration/share/test_ownership.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from structlog.testing import capture_logs

from proxy.share.ownership import (
    MAX_SLOT,
    UNSETTLED_REFRESH_S,
    InstanceIdentity,
    OwnershipMember,
    owner_map,
    slot_conflict,
    slot_of_instance,
)

names = st.text(st.characters(blacklist_characters=";=", blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(names, st.integers(0, MAX_SLOT), names, st.integers(1, 65535), st.integers(1, 65535))
def test_an_identity_comes_back_from_its_client_id(instance_id, slot, host, bootstrap, base):
    identity = InstanceIdentity(instance_id, slot, host, bootstrap, base)
    assert InstanceIdentity.parse(identity.client_id) == identity


def test_what_is_not_an_identity_parses_to_none_and_bad_identities_are_refused():
    assert InstanceIdentity.parse("rdkafka") is None
    assert InstanceIdentity.parse("ksp;v=2;slot=1;id=a;host=h;bootstrap=1;base=2") is None  # a newer format
    assert InstanceIdentity.parse("ksp;v=1;slot=x;id=a;host=h;bootstrap=1;base=2") is None
    with pytest.raises(ValueError, match="outside"):
        InstanceIdentity("a", MAX_SLOT + 1, "h", 1, 2)
    with pytest.raises(ValueError, match="';'"):
        InstanceIdentity("a;b", 0, "h", 1, 2)


def test_the_slot_is_explicit_or_the_trailing_digits_of_the_instance_id():
    assert slot_of_instance("ksp-2") == 2
    assert slot_of_instance("share-proxy-17") == 17
    assert slot_of_instance("anything", explicit=5) == 5
    with pytest.raises(ValueError, match="does not end in digits"):
        slot_of_instance("ksp")
    with pytest.raises(ValueError, match="outside"):
        slot_of_instance("ksp-5000")


def member(identity: InstanceIdentity | str, *partitions: tuple[str, int]):
    client_id = identity if isinstance(identity, str) else identity.client_id
    return SimpleNamespace(client_id=client_id, assignment=SimpleNamespace(
        topic_partitions=[SimpleNamespace(topic=t, partition=p) for t, p in partitions]))


def test_the_owner_map_is_read_from_the_members_assignments():
    a = InstanceIdentity("ksp-0", 0, "a.local", 9092, 19000)
    b = InstanceIdentity("ksp-1", 1, "b.local", 9092, 19000)
    members = [member(a, ("state", 0), ("state", 2)), member(b, ("state", 1), ("other", 7)),
               member("some-other-client", ("state", 3))]
    owners = owner_map(members, "state")
    assert owners.owners == {0: a, 2: a, 1: b}
    assert owners.instances == (a, b)
    assert owners.owned_by(0) == {0, 2} and owners.owner_of(3) is None


def test_a_slot_claimed_by_another_instance_is_a_conflict_but_not_by_this_instance_earlier():
    me = InstanceIdentity("ksp-1", 1, "b.local", 9092, 19000)
    assert slot_conflict([member(InstanceIdentity("ksp-1", 1, "old.local", 9092, 19000))], me) is None
    other = InstanceIdentity("other-1", 1, "c.local", 9092, 19000)
    assert slot_conflict([member(other)], me) == other


async def test_an_instance_that_can_own_nothing_says_so_once_and_again_when_it_recurs():
    """Four instances, three state partitions: the fourth leads nothing (scale-out's cap)."""
    ids = [InstanceIdentity(f"ksp-{n}", n, "h.local", 9092, 19000) for n in range(4)]
    me = ids[3]
    crowded = [member(ids[0], ("state", 0)), member(ids[1], ("state", 1)), member(ids[2], ("state", 2)),
               member(me)]
    after_one_left = [member(ids[0], ("state", 0)), member(ids[1], ("state", 1)), member(me, ("state", 2))]
    described = iter([crowded, crowded, after_one_left, crowded])
    instance = OwnershipMember("unused:9092", "state", me, on_gained=None, on_revoked=None, on_lost=None,
                               partitions=3)
    instance._describe_members = lambda: next(described)
    with capture_logs() as logged:
        for _ in range(4):
            await instance.refresh()
    warnings = [e for e in logged if e["log_level"] == "warning"]
    assert [(w["instances"], w["partitions"]) for w in warnings] == [(4, 3), (4, 3)]  # runs 1 and 4, not 2
    assert "more instances than state-topic partitions" in warnings[0]["event"]


async def test_an_instance_with_partitions_or_an_unknown_partition_count_does_not_warn():
    ids = [InstanceIdentity(f"ksp-{n}", n, "h.local", 9092, 19000) for n in range(3)]
    crowded = [member(ids[0], ("state", 0)), member(ids[1], ("state", 1)), member(ids[2])]
    for me, partitions in ((ids[0], 2), (ids[2], None)):
        instance = OwnershipMember("unused:9092", "state", me, on_gained=None, on_revoked=None, on_lost=None,
                                   partitions=partitions)
        instance._describe_members = lambda: crowded
        with capture_logs() as logged:
            await instance.refresh()
        assert not [e for e in logged if e["log_level"] == "warning"]


async def test_the_owner_map_is_described_again_quickly_while_a_partition_has_no_owner():
    """A revoking member's describe can come before the others' new assignments show: it must not
    go on answering "no owner" for a whole refresh interval."""
    a, b = (InstanceIdentity(f"ksp-{n}", n, "h.local", 9092, 19000) for n in range(2))
    mid_rebalance = [member(a, ("state", 3), ("state", 4), ("state", 5)), member(b)]
    settled = [member(a, ("state", 3), ("state", 4), ("state", 5)), member(b, ("state", 0), ("state", 1), ("state", 2))]
    described = iter([mid_rebalance, settled])
    instance = OwnershipMember("unused:9092", "state", a, on_gained=None, on_revoked=None, on_lost=None,
                               refresh_s=2.0, partitions=6)
    instance._describe_members = lambda: next(described)
    await instance.refresh()
    assert instance.next_refresh_s() == UNSETTLED_REFRESH_S
    await instance.refresh()
    assert instance.next_refresh_s() == 2.0
    unknown_count = OwnershipMember("unused:9092", "state", a, on_gained=None, on_revoked=None, on_lost=None,
                                    refresh_s=2.0)
    assert unknown_count.next_refresh_s() == 2.0
