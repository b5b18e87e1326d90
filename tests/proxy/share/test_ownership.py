"""The ownership group's pure parts: identities in client.id, slots, the owner map from a group
description (the group itself runs against a broker in integration/share/test_ownership.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.share.ownership import MAX_SLOT, InstanceIdentity, owner_map, slot_conflict, slot_of_instance

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
