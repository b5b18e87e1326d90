"""Routing clients to the instance that owns their share-partitions and groups (issue 15, step 4).

With ``--instance-id`` every instance answers Metadata, FindCoordinator and DescribeCluster in
virtual node ids (:mod:`proxy.vnodes`): a partition's leader is ``vnode(owner, b)`` -- the
instance owning the partition's home state partition, forwarding to its upstream leader ``b`` --
and a group's coordinator ``vnode(owner of the group's home, b)``. Whichever instance a client
asks, it is sent to the instance that serves it; Produce, Fetch and every forwarded API work on
any instance (its listener for ``b`` forwards to ``b``).

The owner map comes from the ownership group (:class:`proxy.share.ownership.OwnershipMember`);
while a state partition has no owner (a hand-over), its partitions are named on the instance
asked (right for every client but a share consumer, which is then refused and asks again), and a
group's FindCoordinator answers ``COORDINATOR_NOT_AVAILABLE`` (retriable).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from proxy.route_cluster import route_describe_cluster, route_describe_topic_partitions, route_find_coordinator
from proxy.route_metadata import route_metadata
from proxy.share.ownership import InstanceIdentity, OwnerMap, ServiceOwnership
from proxy.vnodes import Instance

GROUP_KEY_TYPE = 0
_NO_TOPIC_ID = uuid.UUID(int=0)


class InstanceRouting:
    """What this instance tells clients about where things are (see the module docstring)."""

    def __init__(self, ownership: ServiceOwnership, owner_map: Callable[[], OwnerMap], self_instance: Instance,
                 topic_id_of: Callable[[str], uuid.UUID | None]) -> None:
        self.ownership = ownership
        self._owner_map = owner_map
        self.self_instance = self_instance
        self._topic_id_of = topic_id_of

    @property
    def slot(self) -> int:
        return self.self_instance.slot

    def instances(self) -> list[Instance]:
        """Every live instance (this one always included), by slot."""
        found = {identity.slot: Instance(identity.slot, identity.host, identity.port_base)
                 for identity in self._owner_map().instances}
        found[self.slot] = self.self_instance
        return [found[slot] for slot in sorted(found)]

    def live_owner(self, home: int) -> InstanceIdentity | None:
        """The instance owning state partition ``home``, if it is live (in the group, or this one)."""
        owner_map = self._owner_map()
        owner = owner_map.owner_of(home)
        if owner is None or (owner.slot != self.slot and all(i.slot != owner.slot for i in owner_map.instances)):
            return None
        return owner

    def partition_owner(self, topic_id: uuid.UUID, partition: int) -> InstanceIdentity | None:
        """The live instance leading share-partitions of (topic id, partition), or None mid-hand-over."""
        return self.live_owner(self.ownership.home_of_partition(topic_id, partition))

    def group_coordinator(self, group_id: str) -> InstanceIdentity | None:
        """The live instance coordinating ``group_id``, or None mid-hand-over."""
        return self.live_owner(self.ownership.home_of_group(group_id))

    def owner_slot(self, topic_name: str | None, topic_id: uuid.UUID | None, partition: int) -> int:
        if topic_id is None or topic_id == _NO_TOPIC_ID:
            topic_id = self._topic_id_of(topic_name) if topic_name else None
            if topic_id is None:
                return self.slot  # a topic the proxy has not seen: not a share-partition it knows
        owner = self.partition_owner(topic_id, partition)
        return self.slot if owner is None else owner.slot

    def slot_for_key(self, key: str, key_type: int) -> int | None:
        if key_type != GROUP_KEY_TYPE:
            return self.slot  # transactions and share-state keys: forwarded as ever, by this instance
        owner = self.group_coordinator(key)
        return None if owner is None else owner.slot

    # ----- the three responses -----------------------------------------------------------------

    def metadata(self, api_version: int, payload: bytes) -> bytes:
        return route_metadata(api_version, payload, self.owner_slot, self.instances(), self.slot)

    def find_coordinator(self, api_version: int, payload: bytes, request) -> bytes:
        key_type = int(getattr(request, "key_type", GROUP_KEY_TYPE) or GROUP_KEY_TYPE)
        return route_find_coordinator(api_version, payload, key_type, self.slot_for_key, self.instances(),
                                      request_key=getattr(request, "key", None))

    def describe_cluster(self, api_version: int, payload: bytes) -> bytes:
        return route_describe_cluster(api_version, payload, self.instances(), self.slot)

    def describe_topic_partitions(self, api_version: int, payload: bytes) -> bytes:
        return route_describe_topic_partitions(api_version, payload, self.owner_slot)
