"""Virtual node ids: round trip, limits, and -1 passing through."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.vnodes import BROKER_ID_LIMIT, SLOT_LIMIT, Instance, broker_of, is_vnode, slot_of, vnode

slots = st.integers(0, SLOT_LIMIT - 1)
brokers = st.integers(0, BROKER_ID_LIMIT - 1)


@given(slots, brokers)
def test_vnode_round_trips_and_is_a_positive_int32_never_a_broker_id(slot, broker):
    node = vnode(slot, broker)
    assert 0 < node < 2**31
    assert node >= BROKER_ID_LIMIT  # above every plain broker id
    assert is_vnode(node)
    assert (slot_of(node), broker_of(node)) == (slot, broker)


@given(brokers)
def test_plain_broker_ids_are_not_vnodes(broker):
    assert not is_vnode(broker)
    with pytest.raises(ValueError, match="not a virtual node id"):
        slot_of(broker)
    with pytest.raises(ValueError, match="not a virtual node id"):
        broker_of(broker)


def test_the_limits_are_the_ones_the_design_states():
    assert (BROKER_ID_LIMIT, SLOT_LIMIT) == (1 << 20, 2047)
    assert vnode(2046, BROKER_ID_LIMIT - 1) == 2**31 - 1


@pytest.mark.parametrize("broker", [BROKER_ID_LIMIT, 2**31 - 1, -2])
def test_a_broker_id_outside_the_limit_is_refused_naming_it(broker):
    with pytest.raises(ValueError, match=r"2\*\*20"):
        vnode(0, broker)


@pytest.mark.parametrize("slot", [-1, SLOT_LIMIT, 5000])
def test_a_slot_outside_0_to_2046_is_refused_naming_the_range(slot):
    with pytest.raises(ValueError, match="0..2046"):
        vnode(slot, 1)
    with pytest.raises(ValueError, match="0..2046"):
        Instance(slot, "h", 1)


def test_no_node_passes_through():
    assert vnode(3, -1) == -1
    assert slot_of(-1) == -1
    assert broker_of(-1) == -1
    assert not is_vnode(-1)


def test_an_instance_addresses_its_listener_for_each_broker():
    instance = Instance(2, "ksp-2.ksp", 19200)
    assert instance.node_for(3) == (3 << 20) | 3
    assert instance.port_for(3) == 19203
