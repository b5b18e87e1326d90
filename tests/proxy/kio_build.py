"""Build kio entities of any version with plain defaults, overriding what a test cares about."""

from __future__ import annotations

import dataclasses
import datetime
import io
import typing
import uuid

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.static.primitive import i8, i16, i32, i64

from codec.headers import encode_response_header, response_header_version

_PRIMITIVES = {
    "int8": i8(0),
    "int16": i16(0),
    "int32": i32(0),
    "int64": i64(0),
    "string": "",
    "bool": False,
    "uuid": uuid.UUID(int=1),  # kio reads the all-zero UUID back as None
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "bytes": b"",
    "records": b"",
}


def build(cls: type, **overrides: object) -> object:
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in overrides:
            values[field.name] = overrides[field.name]
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            values[field.name] = _default(hints[field.name], field)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    assert not unknown, f"{cls.__name__} has no fields {unknown}"
    return cls(**values)


def _default(hint: object, field: dataclasses.Field) -> object:
    if typing.get_origin(hint) is tuple:
        return ()
    kafka_type = field.metadata.get("kafka_type")
    if kafka_type is not None:
        return _PRIMITIVES[kafka_type]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args and len(args) < len(typing.get_args(hint)):
        return None  # optional nested entity
    return build(hint)


def has_field(cls: type, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))


def encode_body(entity: object) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def response_frame(entity: object, correlation_id: int = 42, header_tags=()) -> bytes:
    version = response_header_version(int(entity.__api_key__), int(entity.__version__))
    return encode_response_header(correlation_id, version, header_tags if version else ()) + encode_body(entity)
