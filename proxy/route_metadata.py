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
read with kio, located as :func:`proxy.rewrite.locate_metadata_brokers` does, and written again
(by hand: kio's writer costs ~30 µs a broker). Everything after it is
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
import struct
import typing
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from codec.registry import nested_types, response_type_for
from proxy.errors import UpstreamError
from proxy.rewrite import METADATA, locate_metadata_brokers
from proxy.vnodes import BROKER_ID_LIMIT, SLOT_LIMIT, Instance

OwnerSlot = Callable[[str | None, uuid.UUID | None, int], int]
"""(topic name or None, topic id or None, partition) -> slot of the instance that leads it."""

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UUID_SIZE = 16
_NO_NODE_BYTES = b"\xff\xff\xff\xff"


@dataclass(frozen=True, slots=True)
class _Layout:
    """What of a Metadata version's fields the routing writes or must step over."""

    flexible: bool
    rack: bool
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
        rack=any(f.name == "rack" for f in dataclasses.fields(types["MetadataResponseBroker"])),
        cluster_id="cluster_id" in response,
        controller_id="controller_id" in response,
        topic_id="topic_id" in topic,
        is_internal="is_internal" in topic,
        leader_epoch="leader_epoch" in partition,
        offline_replicas="offline_replicas" in partition,
        topic_authorized_operations="topic_authorized_operations" in topic,
    )


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
    layout = metadata_layout(api_version)
    brokers = _instances_brokers(located.brokers, layout, instances)
    tail = bytearray(memoryview(payload)[located.end :])
    try:
        _route_after_brokers(tail, layout, owner_slot, self_slot)
    except UpstreamError:
        raise
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise UpstreamError(f"cannot route Metadata v{api_version} response: {exc!r}") from exc
    return b"".join((memoryview(payload)[: located.start], brokers, tail))


def _instances_brokers(upstream: tuple, layout: _Layout, instances: Sequence[Instance]) -> bytes:
    """The brokers array naming every (instance, upstream broker) node, encoded here rather than
    by kio's writer, which costs ~30 us a broker (its type checks) on every Metadata answer."""
    for broker in upstream:
        _check_broker(int(broker.node_id))
    count = len(instances) * len(upstream)
    flexible = layout.flexible
    out = [_uvarint_bytes(count + 1) if flexible else _INT32.pack(count)]
    for instance in instances:
        host = _string(instance.host, flexible)
        for broker in upstream:
            b = int(broker.node_id)
            out += (_INT32.pack(instance.node_for(b)), host, _INT32.pack(instance.port_for(b)))
            if layout.rack:
                out.append(_string(broker.rack, flexible))
            if flexible:
                out.append(b"\x00")  # no tagged fields (kio keeps none of the upstream's either)
    return b"".join(out)


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    raw = value.encode()
    return (_uvarint_bytes(len(raw) + 1) if flexible else _INT16.pack(len(raw))) + raw


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _check_broker(broker: int) -> None:
    if not -1 <= broker < BROKER_ID_LIMIT:
        raise UpstreamError(f"upstream broker id {broker} is outside 0..{BROKER_ID_LIMIT - 1}, the ids virtual "
                            f"nodes can carry: scale-out needs broker ids below 2**20")


@functools.cache
def _high_bytes(slot: int) -> tuple[int, int]:
    """The first two bytes ``vnode(slot, b)`` has over ``b`` (big-endian): the first is
    ``(slot + 1) >> 4``, the second gains ``(slot + 1) & 0xF`` in its high nibble."""
    if not 0 <= slot < SLOT_LIMIT:
        raise ValueError(f"instance slot {slot} outside 0..{SLOT_LIMIT - 1}")
    high = (slot + 1) << 20
    return high >> 24, (high >> 16) & 0xF0


def _refuse(buf: bytearray, pos: int) -> typing.NoReturn:
    """A node id that is neither -1 nor a broker id below 2**20 (or is cut off)."""
    if pos + 4 > len(buf):
        raise IndexError("node id past the end")
    _check_broker(_INT32.unpack_from(buf, pos)[0])
    raise AssertionError("unreachable: _check_broker accepted what the patch refused")


def _skip_tagged_fields(buf: bytearray, pos: int) -> int:
    count, size = _uvarint(buf, pos)
    pos += size
    for _ in range(count):
        _, size = _uvarint(buf, pos)  # tag
        pos += size
        field_size, size = _uvarint(buf, pos)
        pos += size + field_size
    return pos


def _length(buf: bytearray, pos: int, flexible: bool, legacy: struct.Struct) -> tuple[int, int]:
    """(length, position after it): compact (unsigned varint of n + 1, 0 = null) from v9,
    int16 / int32 before; null is -1."""
    if flexible:
        value, size = _uvarint(buf, pos)
        return value - 1, pos + size
    return legacy.unpack_from(buf, pos)[0], pos + legacy.size


def _route_after_brokers(buf: bytearray, layout: _Layout, owner_slot: OwnerSlot, self_slot: int) -> None:
    """Walk ``buf`` (the bytes after the brokers array) and patch every node id in place.

    The hot loop is written out by hand: it runs once per partition (10,000 in a big cluster's
    full Metadata) on the event loop every connection shares. A node id ``b`` below 2**20 has a
    zero first byte and a second below 0x10; ``vnode`` only sets bits above those, so the patch
    writes the first byte and ORs the second. -1 is four 0xFF bytes and stays.
    """
    flexible = layout.flexible
    unpack_i32 = _INT32.unpack_from
    pos = 0
    if layout.cluster_id:
        size, pos = _length(buf, pos, flexible, _INT16)
        pos += max(size, 0)
    if layout.controller_id:
        hi0, hi1 = _high_bytes(self_slot)
        if buf[pos] == 0 and buf[pos + 1] < 0x10:
            buf[pos] = hi0
            buf[pos + 1] |= hi1
        elif buf[pos : pos + 4] != _NO_NODE_BYTES:
            _refuse(buf, pos)
        pos += 4
    after_leader = 8 if layout.leader_epoch else 4  # the epoch stays the upstream's
    id_arrays = 3 if layout.offline_replicas else 2  # replicas, ISR, offline replicas
    topics, pos = _length(buf, pos, flexible, _INT32)
    for _ in range(max(topics, 0)):
        pos += 2  # error code
        size, pos = _length(buf, pos, flexible, _INT16)
        name = None if size < 0 else buf[pos : pos + size].decode()
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
        partitions, pos = _length(buf, pos, flexible, _INT32)
        for _ in range(max(partitions, 0)):
            hi0, hi1 = _high_bytes(owner_slot(name, topic_id, unpack_i32(buf, pos + 2)[0]))  # after the error code
            pos += 6
            if buf[pos] == 0 and buf[pos + 1] < 0x10:  # the leader
                buf[pos] = hi0
                buf[pos + 1] |= hi1
            elif buf[pos : pos + 4] != _NO_NODE_BYTES:
                _refuse(buf, pos)
            pos += after_leader
            for _ in range(id_arrays):
                if flexible:
                    count = buf[pos] - 1
                    if count < 0x7F:
                        pos += 1
                    else:
                        count, pos = _length(buf, pos, True, _INT32)
                else:
                    count = unpack_i32(buf, pos)[0]
                    pos += 4
                end = pos + 4 * count
                while pos < end:
                    if buf[pos] == 0 and buf[pos + 1] < 0x10:
                        buf[pos] = hi0
                        buf[pos + 1] |= hi1
                    elif buf[pos : pos + 4] != _NO_NODE_BYTES:
                        _refuse(buf, pos)
                    pos += 4
            if flexible:
                pos = pos + 1 if buf[pos] == 0 else _skip_tagged_fields(buf, pos)
        if layout.topic_authorized_operations:
            pos += 4
        if flexible:
            pos = _skip_tagged_fields(buf, pos)
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
