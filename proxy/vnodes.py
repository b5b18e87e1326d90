"""Virtual node ids: one proxy instance forwarding to one upstream broker (issue 15, scale-out).

With several proxy instances in front of one cluster, a client must be able to tell "instance 2's
listener for broker 3" from "instance 0's listener for broker 3", because only one instance leads
a given share-partition. Every node id the proxy advertises is then a *virtual* one::

    vnode(slot, b) = ((slot + 1) << 20) | b

so broker ids below 2**20 and slots 0..2046 fit a positive int32, and the top bits are never
zero: a virtual id is never mistaken for a plain broker id. ``-1`` (no leader, an error
placeholder) is not a node and passes through every function here unchanged.

An instance is reached at its own host, on ``port_base + b`` for broker ``b`` (docs/scale-out.md,
section c): :class:`Instance` carries that.

Pure: no sockets, no trio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

BROKER_BITS: Final = 20
BROKER_ID_LIMIT: Final = 1 << BROKER_BITS  # broker ids must be below this
SLOT_LIMIT: Final = (1 << (31 - BROKER_BITS)) - 1  # slots 0..2046: (slot + 1) must fit 11 bits
NO_NODE: Final = -1


def vnode(slot: int, broker: int) -> int:
    """The virtual node id of instance ``slot`` forwarding to upstream broker ``broker``."""
    if broker == NO_NODE:
        return NO_NODE
    if not 0 <= broker < BROKER_ID_LIMIT:
        raise ValueError(f"broker id {broker} outside 0..{BROKER_ID_LIMIT - 1}: scale-out needs broker ids below 2**20")
    if not 0 <= slot < SLOT_LIMIT:
        raise ValueError(f"instance slot {slot} outside 0..{SLOT_LIMIT - 1}")
    return ((slot + 1) << BROKER_BITS) | broker


def is_vnode(node_id: int) -> bool:
    """Whether ``node_id`` is a virtual node id (not a plain broker id, not -1)."""
    return node_id > 0 and node_id >> BROKER_BITS != 0


def _checked(node_id: int) -> int:
    if not is_vnode(node_id):
        raise ValueError(f"node id {node_id} is not a virtual node id (its top 11 bits are zero)")
    return node_id


def slot_of(node_id: int) -> int:
    """The instance slot a virtual node id names (-1 stays -1)."""
    if node_id == NO_NODE:
        return NO_NODE
    return (_checked(node_id) >> BROKER_BITS) - 1


def broker_of(node_id: int) -> int:
    """The upstream broker a virtual node id forwards to (-1 stays -1)."""
    if node_id == NO_NODE:
        return NO_NODE
    return _checked(node_id) & (BROKER_ID_LIMIT - 1)


@dataclass(frozen=True, slots=True)
class Instance:
    """A live proxy instance as its peers address it: slot, advertised host, port base."""

    slot: int
    host: str
    port_base: int

    def __post_init__(self) -> None:
        vnode(self.slot, 0)  # the slot's limit, checked once where instances are made

    def port_for(self, broker: int) -> int:
        return self.port_base + broker

    def node_for(self, broker: int) -> int:
        return vnode(self.slot, broker)


__all__ = ["BROKER_ID_LIMIT", "SLOT_LIMIT", "NO_NODE", "Instance", "broker_of", "is_vnode", "slot_of", "vnode"]
