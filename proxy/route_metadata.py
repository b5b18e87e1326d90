"""Metadata answers that route each partition to the instance leading it (issue 15, scale-out).

With several proxy instances, a share consumer must send ShareFetch for a partition to the one
instance that owns it, and Metadata is how it learns where that is. So every node id in a
Metadata answer becomes a virtual one (:mod:`proxy.vnodes`):

* the brokers array lists, for every live instance ``j`` and upstream broker ``b``,
  ``vnode(j, b)`` at ``(host_j, port_base_j + b)``, the rack kept from ``b``;
* each partition's leader, replicas, ISR and offline replicas ``b`` become
  ``vnode(owner_slot(topic, topic id, partition), b)``; the leader epoch is left as the
  upstream's, because Produce / Fetch / ListOffsets carry it to the broker, which checks it;
* the controller ``c`` becomes ``vnode(self_slot, c)``, so it names a node of the brokers array
  (the Java Admin sends controller requests to the node it finds there).

**Theory of operation.** Only the brokers array (small, before the topics in every version) is
re-encoded, as :func:`proxy.rewrite.locate_metadata_brokers` already does. Everything after it is
copied once and walked: strings, tagged fields and fixed-size fields are skipped by their
lengths, topic names and ids are read only to ask ``owner_slot``, and every node id is an int32
overwritten where it lies. Nothing is re-encoded, so the topics array keeps its byte length. The
walk stops after the topics: what follows (authorized operations, error code, tagged fields)
names no node.

Which fields a version has is read from kio's classes for it (topic ids v10+, offline replicas
v5+, leader epochs v7+, authorized operations v8+, compact encoding v9+), and the order the walk
assumes is checked against them once per version.

Pure: the ownership and the instances are passed in.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kio.serial import entity_writer
from kio.serial.writers import write_compact_array_length, write_legacy_array_length
from kio.static.primitive import i32

from codec.registry import nested_types, response_type_for
from proxy.errors import UpstreamError
from proxy.rewrite import METADATA, locate_metadata_brokers
from proxy.vnodes import BROKER_ID_LIMIT, NO_NODE, SLOT_LIMIT, Instance

OwnerSlot = Callable[[str | None, uuid.UUID | None, int], int]
"""(topic name or None, topic id or None, partition) -> slot of the instance that leads it."""

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UUID_SIZE = 16


@dataclass(frozen=True, slots=True)
class _Layout:
    """What a Metadata version has after its brokers array, in the order the walk reads it."""

    flexible: bool
    cluster_id: bool
    controller_id: bool
    topic_id: bool
    is_internal: bool
    leader_epoch: bool
    offline_replicas: bool
    topic_authorized_operations: bool


_RESPONSE_ORDER = ("throttle_time", "brokers", "cluster_id", "controller_id", "topics")
_TOPIC_ORDER = ("error_code", "name", "topic_id", "is_internal", "partitions", "topic_authorized_operations")
_PARTITION_ORDER = ("error_code", "partition_index", "leader_id", "leader_epoch", "replica_nodes", "isr_nodes",
                    "offline_replicas")


def _names_in_order(entity_type: type, order: tuple[str, ...]) -> set[str]:
    names = [f.name for f in dataclasses.fields(entity_type)]
    known = [n for n in names if n in order]
    if known != [n for n in order if n in known] or names[: len(known)] != known:
        raise LookupError(f"{entity_type.__qualname__} v{entity_type.__version__}: fields {names} not in the order "
                          f"the Metadata walk reads ({order})")
    return set(known)


@functools.cache
def metadata_layout(api_version: int) -> _Layout:
    """The walk's view of Metadata ``api_version``, from kio's classes (:class:`LookupError` if
    the schema's field order is not the one the walk assumes)."""
    response_type = response_type_for(METADATA, api_version)
    types = nested_types(response_type)
    response = _names_in_order(response_type, _RESPONSE_ORDER)
    topic = _names_in_order(types["MetadataResponseTopic"], _TOPIC_ORDER)
    partition = _names_in_order(types["MetadataResponsePartition"], _PARTITION_ORDER)
    return _Layout(
        flexible=bool(response_type.__flexible__),
        cluster_id="cluster_id" in response,
        controller_id="controller_id" in response,
        topic_id="topic_id" in topic,
        is_internal="is_internal" in topic,
        leader_epoch="leader_epoch" in partition,
        offline_replicas="offline_replicas" in partition,
        topic_authorized_operations="topic_authorized_operations" in topic,
    )


@functools.cache
def _int32s(count: int) -> struct.Struct:
    return struct.Struct(f">{count}i")


def route_metadata(
    api_version: int,
    payload: bytes,
    owner_slot: OwnerSlot,
    instances: Sequence[Instance],
    self_slot: int,
) -> bytes:
    """A Metadata response frame payload (header included) naming virtual nodes (module doc).

    :class:`UpstreamError` if the response cannot be read or names a broker id of 2**20 or more.
    """
    located = locate_metadata_brokers(api_version, payload)
    brokers = _instances_brokers(located.brokers, located.broker_type, located.flexible, instances)
    tail = bytearray(memoryview(payload)[located.end :])
    try:
        _route_after_brokers(tail, metadata_layout(api_version), owner_slot, self_slot)
    except UpstreamError:
        raise
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise UpstreamError(f"cannot route Metadata v{api_version} response: {exc!r}") from exc
    return b"".join((memoryview(payload)[: located.start], brokers, tail))


def _instances_brokers(upstream: tuple, broker_type: type, flexible: bool, instances: Sequence[Instance]) -> bytes:
    for broker in upstream:
        _check_broker(int(broker.node_id))
    buffer = io.BytesIO()
    count = len(instances) * len(upstream)
    if flexible:
        write_compact_array_length(buffer, count)
    else:
        write_legacy_array_length(buffer, i32(count))
    write = entity_writer(broker_type)
    for instance in instances:
        for broker in upstream:
            b = int(broker.node_id)
            write(buffer, dataclasses.replace(
                broker, node_id=i32(instance.node_for(b)), host=instance.host, port=i32(instance.port_for(b))))
    return buffer.getvalue()


def _check_broker(broker: int) -> None:
    if not -1 <= broker < BROKER_ID_LIMIT:
        raise UpstreamError(f"upstream broker id {broker} is outside 0..{BROKER_ID_LIMIT - 1}, the ids virtual "
                            f"nodes can carry: scale-out needs broker ids below 2**20")


def _high_bits(slot: int) -> int:
    if not 0 <= slot < SLOT_LIMIT:
        raise ValueError(f"instance slot {slot} outside 0..{SLOT_LIMIT - 1}")
    return (slot + 1) << 20


def _route_ids(buf: bytearray, pos: int, count: int, high: int) -> None:
    """Overwrite ``count`` int32 broker ids at ``pos`` with ``id | high`` (-1 kept)."""
    if count <= 0:
        return
    shape = _int32s(count)
    ids = shape.unpack_from(buf, pos)
    if max(ids) >= BROKER_ID_LIMIT or min(ids) < NO_NODE:
        _check_broker(max(ids) if max(ids) >= BROKER_ID_LIMIT else min(ids))
    shape.pack_into(buf, pos, *[b if b == NO_NODE else b | high for b in ids])


def _route_after_brokers(buf: bytearray, layout: _Layout, owner_slot: OwnerSlot, self_slot: int) -> None:
    """Walk ``buf`` (the bytes after the brokers array) and patch every node id in place."""
    flexible = layout.flexible
    pos = 0

    # Lengths: compact (unsigned varint of n + 1, 0 = null) from v9, int16 / int32 before.
    def length(pos: int, legacy: struct.Struct) -> tuple[int, int]:
        if flexible:
            value, size = _uvarint(buf, pos)
            return value - 1, pos + size
        return legacy.unpack_from(buf, pos)[0], pos + legacy.size

    def skip_tagged_fields(pos: int) -> int:
        count, size = _uvarint(buf, pos)
        pos += size
        for _ in range(count):
            _, size = _uvarint(buf, pos)  # tag
            pos += size
            field_size, size = _uvarint(buf, pos)
            pos += size + field_size
        return pos

    if layout.cluster_id:
        size, pos = length(pos, _INT16)
        pos += max(size, 0)
    if layout.controller_id:
        _route_ids(buf, pos, 1, _high_bits(self_slot))
        pos += 4
    topics, pos = length(pos, _INT32)
    for _ in range(max(topics, 0)):
        pos += 2  # error code
        size, pos = length(pos, _INT16)
        name = None if size < 0 else bytes(buf[pos : pos + size]).decode()
        pos += max(size, 0)
        topic_id = None
        if layout.topic_id:
            raw = bytes(buf[pos : pos + _UUID_SIZE])
            if len(raw) != _UUID_SIZE:
                raise IndexError("topic id past the end")
            topic_id = uuid.UUID(bytes=raw) if any(raw) else None  # all zero: none, as kio reads it
            pos += _UUID_SIZE
        if layout.is_internal:
            pos += 1
        partitions, pos = length(pos, _INT32)
        for _ in range(max(partitions, 0)):
            partition = _INT32.unpack_from(buf, pos + 2)[0]  # after the error code
            high = _high_bits(owner_slot(name, topic_id, partition))
            pos += 6
            _route_ids(buf, pos, 1, high)  # leader
            pos += 8 if layout.leader_epoch else 4  # the epoch stays the upstream's
            for _ in range(3 if layout.offline_replicas else 2):  # replicas, ISR, offline replicas
                count, pos = length(pos, _INT32)
                _route_ids(buf, pos, count, high)
                pos += 4 * max(count, 0)
            if flexible:
                pos = skip_tagged_fields(pos)
        if layout.topic_authorized_operations:
            pos += 4
        if flexible:
            pos = skip_tagged_fields(pos)
    if pos > len(buf):
        raise IndexError(f"topics array runs {pos - len(buf)} bytes past the end")


def _uvarint(buf: bytearray, pos: int) -> tuple[int, int]:
    """(value, size) of the unsigned varint at ``pos``."""
    first = buf[pos]
    if first < 0x80:
        return first, 1
    value, shift, size = first & 0x7F, 7, 1
    while True:
        byte = buf[pos + size]
        size += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, size
        shift += 7
        if shift > 28:
            raise ValueError("unsigned varint longer than 5 bytes")


__all__ = ["OwnerSlot", "metadata_layout", "route_metadata"]
