"""Bounds check of a message body before kio parses it.

kio 0.6.5's native reader sizes its buffers from the length prefixes it reads: a
hostile array count of 2**32 makes it request tens of gigabytes and the process
aborts (a Rust allocation failure cannot be caught). So before handing bytes to kio
we walk the same schema -- the entity class's fields and their ``kafka_type``
metadata -- without building any values, and reject a body whose array counts or
byte lengths exceed the bytes that remain. Walking is cheap: it skips fixed-size
fields and byte strings in O(1) and costs one step per array element.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping

from .errors import MessageDecodeError

# skip(buffer, position, end) -> new position; raises MessageDecodeError.
Skipper = Callable[[memoryview, int, int], int]

_FIXED_SIZES = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


class _RunsPastEnd(MessageDecodeError):
    pass


def advance(position: int, size: int, end: int) -> int:
    """The position `size` bytes on from `position`; MessageDecodeError if that runs past `end`."""
    if size < 0 or position + size > end:
        raise _RunsPastEnd(f"field of {size} bytes at {position} runs past the end of the body ({end})")
    return position + size


def read_uvarint(buffer: memoryview, position: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's UNSIGNED_VARINT)."""
    value = 0
    for shift in range(0, 35, 7):
        if position >= end:
            raise _RunsPastEnd("varint runs past the end of the body")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
    raise MessageDecodeError("varint longer than 5 bytes")


def _int16(buffer: memoryview, position: int, end: int) -> tuple[int, int]:
    advance(position, 2, end)
    return int.from_bytes(buffer[position : position + 2], "big", signed=True), position + 2


def _int32(buffer: memoryview, position: int, end: int) -> tuple[int, int]:
    advance(position, 4, end)
    return int.from_bytes(buffer[position : position + 4], "big", signed=True), position + 4


def _byte_string_skipper(kafka_type: str, flexible: bool) -> Skipper:
    if flexible:

        def skip_compact(buffer: memoryview, position: int, end: int) -> int:
            length_plus_one, position = read_uvarint(buffer, position, end)
            return position if length_plus_one == 0 else advance(position, length_plus_one - 1, end)

        return skip_compact
    read_length = _int16 if kafka_type == "string" else _int32

    def skip_legacy(buffer: memoryview, position: int, end: int) -> int:
        length, position = read_length(buffer, position, end)
        if length < -1:
            raise MessageDecodeError(f"negative length {length}")
        return position if length == -1 else advance(position, length, end)

    return skip_legacy


def _array_skipper(item: Skipper, flexible: bool, nullable: bool) -> Skipper:
    def skip_array(buffer: memoryview, position: int, end: int) -> int:
        if flexible:
            count_plus_one, position = read_uvarint(buffer, position, end)
            count = count_plus_one - 1
        else:
            count, position = _int32(buffer, position, end)
            if count < -1:
                raise MessageDecodeError(f"negative array length {count}")
        # kio reads a null array as None whatever the schema says; Kafka refuses one where the
        # field is not nullable, and so do we (code reading the entity expects a tuple there).
        if count == -1 and not nullable:
            raise MessageDecodeError("null array in a field that is not nullable")
        # Every element takes at least one byte: a longer count is a lie.
        if count > end - position:
            raise MessageDecodeError(f"array of {count} elements in {end - position} remaining bytes")
        for _ in range(count):
            position = item(buffer, position, end)
        return position

    return skip_array


def _strip_optional(annotation: typing.Any) -> typing.Any:
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return args[0]
    return annotation


def _is_optional(annotation: typing.Any) -> bool:
    return typing.get_origin(annotation) in (types.UnionType, typing.Union) and type(None) in typing.get_args(annotation)


def _field_skipper(field: dataclasses.Field, flexible: bool) -> Skipper:
    annotation = _strip_optional(field.type)
    if typing.get_origin(annotation) is tuple:
        inner = _strip_optional(typing.get_args(annotation)[0])
        item = entity_skipper(inner) if dataclasses.is_dataclass(inner) else _primitive_skipper(field, flexible)
        return _array_skipper(item, flexible, _is_optional(field.type))
    if dataclasses.is_dataclass(annotation):
        skip_entity = entity_skipper(annotation)
        if not _is_optional(field.type) or "tag" in field.metadata:
            return skip_entity

        def skip_nullable_entity(buffer: memoryview, position: int, end: int) -> int:
            advance(position, 1, end)
            marker = buffer[position]
            return position + 1 if marker == 0xFF else skip_entity(buffer, position + 1, end)

        return skip_nullable_entity
    return _primitive_skipper(field, flexible)


def _primitive_skipper(field: dataclasses.Field, flexible: bool) -> Skipper:
    kafka_type = field.metadata["kafka_type"]
    if kafka_type in _FIXED_SIZES:
        size = _FIXED_SIZES[kafka_type]
        return lambda buffer, position, end: advance(position, size, end)
    if kafka_type in ("string", "bytes", "records"):
        return _byte_string_skipper(kafka_type, flexible)
    raise MessageDecodeError(f"cannot bound-check kafka_type {kafka_type!r}")


@functools.cache
def entity_skipper(entity_type: type) -> Skipper:
    """A function that checks one ``entity_type`` value and returns where it ends."""
    flexible = entity_type.__flexible__
    # RequestHeader.client_id is a legacy string even in flexible headers (as in kio).
    legacy_client_id = entity_type.__name__ == "RequestHeader"
    plain: list[Skipper] = []
    tagged: dict[int, Skipper] = {}
    for field in dataclasses.fields(entity_type):
        field_flexible = flexible and not (legacy_client_id and field.name == "client_id")
        skipper = _field_skipper(field, field_flexible)
        if "tag" in field.metadata:
            tagged[field.metadata["tag"]] = skipper
        else:
            plain.append(skipper)

    def skip_entity(buffer: memoryview, position: int, end: int) -> int:
        for skip in plain:
            position = skip(buffer, position, end)
        if not flexible:
            return position
        return skip_tagged_fields(buffer, position, end, tagged)

    return skip_entity


def skip_tagged_fields(buffer: memoryview, position: int, end: int,
                       known: Mapping[int, Skipper] | None = None) -> int:
    """Where the tagged fields at `position` end; each tag in `known` is checked to fill its bytes."""
    count, position = read_uvarint(buffer, position, end)
    if count > end - position:
        raise MessageDecodeError(f"{count} tagged fields in {end - position} remaining bytes")
    for _ in range(count):
        tag, position = read_uvarint(buffer, position, end)
        size, position = read_uvarint(buffer, position, end)
        field_end = advance(position, size, end)
        skip = known.get(tag) if known else None
        if skip is not None and skip(buffer, position, field_end) != field_end:
            raise MessageDecodeError(f"tagged field {tag} does not fill its {size} bytes")
        position = field_end
    return position


def check_bounds(entity_type: type, body: bytes | bytearray | memoryview) -> int:
    """Walk ``body`` as ``entity_type``; return the bytes it spans or raise MessageDecodeError."""
    view = memoryview(body)
    return entity_skipper(entity_type)(view, 0, len(view))
