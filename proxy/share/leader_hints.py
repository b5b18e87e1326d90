"""Where to go instead: the leader hint of a ShareFetch / ShareAcknowledge refused here (issue 15).

With several proxy instances, a share-partition is led by the instance owning its state
partition. A ShareFetch or ShareAcknowledge for it at another instance is answered
``NOT_LEADER_OR_FOLLOWER`` with the partition's ``CurrentLeader`` -- ``vnode(owner, b)`` and the
upstream leader epoch of ``b``, left unchanged as Metadata leaves it -- and the owner's listener
for ``b`` among the response's ``NodeEndpoints`` (KIP-951; both fields exist in v1 and v2 of both
APIs). A client that applies the hint goes straight there; one that ignores an epoch no newer than
its own (the Java client) refreshes Metadata, which names the same node. While no instance owns
the partition (a hand-over), the hint is ``(-1, -1)`` with no endpoint: the client refreshes.

Pure: builds kio entities of the version being answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.static.primitive import i32

from codec.registry import DEFAULT_REGISTRY, nested_types
from proxy.vnodes import NO_NODE, Instance

SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79


@dataclass(frozen=True, slots=True)
class LeaderHint:
    """A partition's ``CurrentLeader`` and, when it names a node, that node's ``NodeEndpoint``."""

    current_leader: Any
    node_endpoint: Any | None


def not_leader_hint(
    api_key: int, api_version: int, owner: Instance | None, leader: int, leader_epoch: int, rack: str | None = None
) -> LeaderHint:
    """The hint for a partition led by ``owner``'s node for upstream ``leader`` (``rack``: that
    broker's, as Metadata gives it). ``owner`` None or ``leader`` -1: unknown, ``(-1, -1)``."""
    if api_key not in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
        raise ValueError(f"api {api_key} has no leader hints here (ShareFetch 78, ShareAcknowledge 79)")
    types = nested_types(DEFAULT_REGISTRY.response_type(api_key, api_version))
    leader_type, endpoint_type = types["LeaderIdAndEpoch"], types["NodeEndpoint"]
    if owner is None or leader == NO_NODE:
        return LeaderHint(leader_type(leader_id=i32(NO_NODE), leader_epoch=i32(-1)), None)
    node = owner.node_for(leader)
    return LeaderHint(
        leader_type(leader_id=i32(node), leader_epoch=i32(leader_epoch)),
        endpoint_type(node_id=i32(node), host=owner.host, port=i32(owner.port_for(leader)), rack=rack),
    )


def node_endpoints(hints: Iterable[LeaderHint]) -> tuple[Any, ...]:
    """The response's ``NodeEndpoints`` for these hints: one per node, by node id."""
    by_node = {int(h.node_endpoint.node_id): h.node_endpoint for h in hints if h.node_endpoint is not None}
    return tuple(by_node[node] for node in sorted(by_node))


__all__ = ["LeaderHint", "node_endpoints", "not_leader_hint"]
