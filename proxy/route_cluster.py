"""FindCoordinator and DescribeCluster answers naming virtual nodes (issue 15, scale-out).

* **FindCoordinator** (every version, v4+ batched): a coordinator ``b`` for key ``k`` becomes
  ``vnode(slot_for_key(k, key_type), b)`` at that instance's host and ``port_base + b``: the
  instance owning the key's state partition coordinates the group (docs/scale-out.md, section b),
  and whatever it does not serve itself it forwards to ``b``, the real coordinator. While no live
  instance owns the key (mid-rebalance) the entry is ``COORDINATOR_NOT_AVAILABLE``, the retriable
  answer Kafka gives while a coordinator loads. An upstream error entry (node -1) is kept as it is.
  Responses before v4 carry no key: the request's is passed in.
* **DescribeCluster**: the brokers become every ``vnode(j, b)`` at ``(host_j, port_base_j + b)``,
  rack and fencing kept from ``b``; the controller ``c`` becomes ``vnode(self_slot, c)``.
* **DescribeTopicPartitions** (KIP-966; the Java Admin's describeTopics on 3.7+ brokers): as
  Metadata's partitions, each partition's leader, replicas, ISR, eligible leader replicas, last
  known ELR and offline replicas ``b`` become ``vnode(owner_slot(topic, topic id, partition), b)``
  (a leader -1 stays -1): without it the Admin finds no broker of the cluster leading the partition
  ("have no leader" in ``kafka-share-groups --reset-offsets``).

Both are small, so they are decoded and encoded whole with kio, as :mod:`proxy.rewrite` does.
Pure: the ownership and the instances are passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from proxy.errors import UpstreamError
from proxy.rewrite import DESCRIBE_CLUSTER, FIND_COORDINATOR, decode_response, encode_response

DESCRIBE_TOPIC_PARTITIONS: Final = 75
OwnerSlot = Callable[[str | None, Any, int], int]
"""(topic name, topic id, partition) -> slot of the instance leading its share-partitions."""
from proxy.vnodes import NO_NODE, Instance, vnode

SlotForKey = Callable[[str, int], int | None]
"""(coordinator key, key type) -> slot of the instance that coordinates it, None while none does."""

GROUP_KEY: Final = 0  # FindCoordinator v0 has no key type: its keys are group ids
NO_OWNER_MESSAGE: Final = "no proxy instance owns this key yet; retry"


def route_find_coordinator(
    api_version: int,
    payload: bytes,
    key_type: int,
    slot_for_key: SlotForKey,
    instances: Sequence[Instance],
    request_key: str | None = None,
) -> bytes:
    """A FindCoordinator response frame payload with each coordinator moved to its instance.

    ``request_key`` is the request's key, needed before v4 (whose answers do not repeat it).
    """
    header, entity = decode_response(FIND_COORDINATOR, api_version, payload)
    by_slot = {instance.slot: instance for instance in instances}

    def routed(item: Any, key: str) -> Any:
        if int(item.node_id) == NO_NODE or item.error_code is not ErrorCode.none:
            return item
        slot = slot_for_key(key, key_type)
        instance = by_slot.get(slot) if slot is not None else None
        if instance is None:  # no live owner: a slot missing from the instances is none either
            changes = {"error_code": ErrorCode.coordinator_not_available, "node_id": i32(NO_NODE), "host": "",
                       "port": i32(-1)}
            if any(f.name == "error_message" for f in dataclasses.fields(item)):
                changes["error_message"] = NO_OWNER_MESSAGE
            return dataclasses.replace(item, **changes)
        broker = int(item.node_id)
        return dataclasses.replace(item, node_id=i32(_vnode(instance.slot, broker)), host=instance.host,
                                   port=i32(instance.port_for(broker)))

    if hasattr(entity, "coordinators"):
        entity = dataclasses.replace(entity, coordinators=tuple(routed(c, c.key) for c in entity.coordinators))
    else:
        if request_key is None:
            raise ValueError(f"FindCoordinator v{api_version} answers carry no key: pass the request's")
        entity = routed(entity, request_key)
    return encode_response(header, entity)


def route_describe_cluster(api_version: int, payload: bytes, instances: Sequence[Instance], self_slot: int) -> bytes:
    """A DescribeCluster response frame payload listing every instance's node for every broker."""
    header, entity = decode_response(DESCRIBE_CLUSTER, api_version, payload)
    brokers = tuple(
        dataclasses.replace(b, broker_id=i32(_vnode(j.slot, int(b.broker_id))), host=j.host,
                            port=i32(j.port_for(int(b.broker_id))))
        for j in instances for b in entity.brokers
    )
    controller = i32(_vnode(self_slot, int(entity.controller_id)))
    return encode_response(header, dataclasses.replace(entity, brokers=brokers, controller_id=controller))


def route_describe_topic_partitions(api_version: int, payload: bytes, owner_slot: OwnerSlot) -> bytes:
    """A DescribeTopicPartitions response frame payload with each partition's nodes moved to the
    instance leading it (see the module doc)."""
    header, entity = decode_response(DESCRIBE_TOPIC_PARTITIONS, api_version, payload)

    def routed_topic(topic: Any) -> Any:
        def routed(partition: Any) -> Any:
            slot = owner_slot(topic.name, topic.topic_id, int(partition.partition_index))

            def ids(nodes):
                return None if nodes is None else tuple(i32(_vnode(slot, int(b))) for b in nodes)

            leader = int(partition.leader_id)
            return dataclasses.replace(
                partition, leader_id=i32(leader if leader < 0 else _vnode(slot, leader)),
                replica_nodes=ids(partition.replica_nodes), isr_nodes=ids(partition.isr_nodes),
                eligible_leader_replicas=ids(partition.eligible_leader_replicas),
                last_known_elr=ids(partition.last_known_elr), offline_replicas=ids(partition.offline_replicas))

        return dataclasses.replace(topic, partitions=tuple(routed(p) for p in topic.partitions))

    return encode_response(header, dataclasses.replace(entity, topics=tuple(routed_topic(t) for t in entity.topics)))


def _vnode(slot: int, broker: int) -> int:
    try:
        return vnode(slot, broker)
    except ValueError as exc:
        raise UpstreamError(f"cannot name a virtual node: {exc}") from exc


__all__ = ["GROUP_KEY", "NO_OWNER_MESSAGE", "SlotForKey", "OwnerSlot", "DESCRIBE_TOPIC_PARTITIONS",
           "route_describe_cluster", "route_describe_topic_partitions", "route_find_coordinator"]
