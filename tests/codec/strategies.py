"""Hypothesis strategies that build any kio entity (kio's own classes or ours) from its fields."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import types
import typing

from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import (
    Records,
    TZAware,
    f64,
    i8,
    i16,
    i32,
    i32Timedelta,
    i64,
    i64Timedelta,
    u8,
    u16,
    u32,
    u64,
)

_MAX_ITEMS = 3

_INTS = {
    "int8": (i8, -(2**7), 2**7 - 1),
    "int16": (i16, -(2**15), 2**15 - 1),
    "int32": (i32, -(2**31), 2**31 - 1),
    "int64": (i64, -(2**63), 2**63 - 1),
    "uint8": (u8, 0, 2**8 - 1),
    "uint16": (u16, 0, 2**16 - 1),
    "uint32": (u32, 0, 2**32 - 1),
    "uint64": (u64, 0, 2**64 - 1),
}


def _primitive(kafka_type: str, python_type: type) -> st.SearchStrategy:
    if kafka_type in _INTS:
        wrap, low, high = _INTS[kafka_type]
        return st.integers(low, high).map(wrap)
    match kafka_type:
        case "string":
            return st.text(max_size=12)
        case "bytes":
            return st.binary(max_size=24)
        case "records":
            return st.binary(max_size=64).map(Records)
        case "uuid":
            # kio reads the all-zero UUID back as None, so generate None for it.
            return st.one_of(st.none(), st.uuids().filter(lambda u: u.int != 0))
        case "bool":
            return st.booleans()
        case "float64":
            return st.floats(allow_nan=False, allow_infinity=False).map(f64)
        case "error_code":
            return st.sampled_from(list(ErrorCode))
        case "timedelta_i32":
            return st.integers(-(2**31), 2**31 - 1).map(lambda ms: i32Timedelta.parse(datetime.timedelta(milliseconds=ms)))
        case "timedelta_i64":
            return st.integers(-(2**40), 2**40).map(lambda ms: i64Timedelta.parse(datetime.timedelta(milliseconds=ms)))
        case "datetime_i64":
            return st.integers(0, 2**41).map(
                lambda ms: TZAware.parse(datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc))
            )
    raise NotImplementedError(f"no strategy for kafka_type {kafka_type!r} ({python_type})")


def _split_optional(annotation: typing.Any) -> tuple[typing.Any, bool]:
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return args[0], True
    return annotation, False


def _field_strategy(field: dataclasses.Field) -> st.SearchStrategy:
    annotation, optional = _split_optional(field.type)
    is_tag = "tag" in field.metadata
    if typing.get_origin(annotation) is tuple:
        inner, _ = typing.get_args(annotation)
        inner_plain, inner_optional = _split_optional(inner)
        if dataclasses.is_dataclass(inner_plain):
            item = entities(inner_plain)
        else:
            item = _primitive(field.metadata["kafka_type"], inner_plain)
            if inner_optional and field.metadata["kafka_type"] not in ("uuid", "records"):
                item = st.one_of(st.none(), item)
        strategy = st.lists(item, max_size=_MAX_ITEMS).map(tuple)
    elif dataclasses.is_dataclass(annotation):
        strategy = entities(annotation)
    else:
        strategy = _primitive(field.metadata["kafka_type"], annotation)
        if optional and field.metadata["kafka_type"] == "records":
            strategy = st.one_of(st.none(), strategy)
    if optional and not is_tag and field.metadata.get("kafka_type") not in ("uuid", "records"):
        strategy = st.one_of(st.none(), strategy)
    return strategy


@functools.cache
def entities(entity_type: type) -> st.SearchStrategy:
    """A strategy for instances of ``entity_type`` with every field drawn at random."""
    return st.builds(
        entity_type,
        **{field.name: st.deferred(lambda field=field: _field_strategy(field)) for field in dataclasses.fields(entity_type)},
    )
