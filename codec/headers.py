"""Kafka request and response headers, sans-IO.

Request header versions (``RequestHeader.json``):
  * v0: api_key int16, api_version int16, correlation_id int32
  * v1: v0 + client_id (nullable int16-length string)
  * v2: v1 + tagged fields. ``client_id`` stays a *legacy* string even in v2.
Response header versions (``ResponseHeader.json``):
  * v0: correlation_id int32
  * v1: v0 + tagged fields

Which version a message uses follows from its API's ``flexibleVersions``:
flexible request -> header v2, otherwise v1; flexible response -> header v1,
otherwise v0. Two exceptions: ControlledShutdown v0 used request header v0, and
ApiVersions responses always use header v0 so that a client can read the error
of a version it sent too high.

The first flexible version of every API is read once from kio's generated
schemas (the ``__flexible__`` flag of ``kio.schema.<api>.vN.request``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from kio.index import load_payload_module
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from codec.errors import HeaderError
from codec.varint import write_uvarint

API_VERSIONS_KEY: Final = 18
CONTROLLED_SHUTDOWN_KEY: Final = 7

TaggedFields = tuple[tuple[int, bytes], ...]

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_FIXED_PREFIX = struct.Struct(">hhi")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    tagged_fields: TaggedFields = ()


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    correlation_id: int
    tagged_fields: TaggedFields = ()


@dataclass(frozen=True, slots=True)
class ApiFlexibility:
    """Versions kio knows for one API and the first flexible one (None: never flexible)."""

    min_version: int
    max_version: int
    first_flexible: int | None


def _payload_class(api_key: int, version: int) -> type:
    module = load_payload_module(api_key, version, EntityType.request)
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is EntityType.request:
            return value
    raise LookupError(f"no request entity in {module.__name__}")


def _build_flexibility_table() -> dict[int, ApiFlexibility]:
    table = {}
    for api_key, name in api_key_map.items():
        versions = sorted(schema_name_map[name])
        # Flexibility is never withdrawn, so binary-search the first flexible version: loading
        # every schema module of every API made importing this module take over a second.
        low, high = 0, len(versions)
        while low < high:
            middle = (low + high) // 2
            if _payload_class(api_key, versions[middle]).__flexible__:
                high = middle
            else:
                low = middle + 1
        table[api_key] = ApiFlexibility(
            min_version=versions[0],
            max_version=versions[-1],
            first_flexible=versions[low] if low < len(versions) else None,
        )
    return table


FLEXIBILITY: Final[dict[int, ApiFlexibility]] = _build_flexibility_table()


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether (api_key, api_version) uses flexible encoding.

    Versions above the newest kio knows count as flexible (flexibility is never
    withdrawn); versions below the oldest count as not flexible.
    """
    try:
        first = FLEXIBILITY[api_key].first_flexible
    except KeyError:
        raise HeaderError(f"unknown API key {api_key}") from None
    return first is not None and api_version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    if api_key == CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


# -- primitives (bounds-checked, raising HeaderError only) ---------------------


def _read_uvarint(buf: bytes, offset: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 35, 7):
        if offset >= len(buf):
            raise HeaderError("truncated varint")
        byte = buf[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > 0xFFFFFFFF:
                raise HeaderError("varint exceeds 32 bits")
            return value, offset
    raise HeaderError("varint longer than 5 bytes")


def _read_tagged_fields(buf: bytes, offset: int) -> tuple[TaggedFields, int]:
    count, offset = _read_uvarint(buf, offset)
    fields = []
    # Each field costs at least two bytes, so a hostile count ends in a truncation
    # error long before it could cost memory.
    for _ in range(count):
        tag, offset = _read_uvarint(buf, offset)
        size, offset = _read_uvarint(buf, offset)
        end = offset + size
        if end > len(buf):
            raise HeaderError("truncated tagged field")
        fields.append((tag, bytes(buf[offset:end])))
        offset = end
    return tuple(fields), offset


def _write_tagged_fields(fields: TaggedFields) -> bytes:
    parts = [write_uvarint(len(fields))]
    for tag, value in fields:
        parts += (write_uvarint(tag), write_uvarint(len(value)), value)
    return b"".join(parts)


# -- request header -----------------------------------------------------------


def peek_request_prefix(frame: bytes) -> tuple[int, int, int]:
    """Read (api_key, api_version, correlation_id), which every header version starts with."""
    if len(frame) < _FIXED_PREFIX.size:
        raise HeaderError(f"request frame of {len(frame)} bytes is shorter than a header")
    return _FIXED_PREFIX.unpack_from(frame, 0)


def parse_request_header(frame: bytes, version: int | None = None) -> tuple[RequestHeader, int]:
    """Parse the request header at the start of ``frame``; return it and the body offset.

    ``version`` defaults to the header version Kafka uses for the frame's API and version.
    """
    api_key, api_version, correlation_id = peek_request_prefix(frame)
    if api_version < 0:
        raise HeaderError(f"negative api version {api_version}")
    if version is None:
        version = request_header_version(api_key, api_version)
    offset = _FIXED_PREFIX.size
    client_id = None
    tagged: TaggedFields = ()
    if version >= 1:
        if offset + 2 > len(frame):
            raise HeaderError("truncated client id length")
        (length,) = _INT16.unpack_from(frame, offset)
        offset += 2
        if length >= 0:
            end = offset + length
            if end > len(frame):
                raise HeaderError("truncated client id")
            try:
                client_id = bytes(frame[offset:end]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise HeaderError("client id is not UTF-8") from exc
            offset = end
        elif length != -1:
            raise HeaderError(f"invalid client id length {length}")
    if version >= 2:
        tagged, offset = _read_tagged_fields(frame, offset)
    if version not in (0, 1, 2):
        raise HeaderError(f"unknown request header version {version}")
    return RequestHeader(api_key, api_version, correlation_id, client_id, tagged), offset


def encode_request_header(header: RequestHeader, version: int | None = None) -> bytes:
    """Encode ``header``; ``version`` defaults to the one Kafka uses for its API and version."""
    if version is None:
        version = request_header_version(header.api_key, header.api_version)
    if version not in (0, 1, 2):
        raise HeaderError(f"unknown request header version {version}")
    try:
        parts = [_FIXED_PREFIX.pack(header.api_key, header.api_version, header.correlation_id)]
    except struct.error as exc:
        raise HeaderError(str(exc)) from exc
    if version >= 1:
        if header.client_id is None:
            parts.append(_INT16.pack(-1))
        else:
            encoded = header.client_id.encode("utf-8")
            if len(encoded) > 0x7FFF:
                raise HeaderError("client id longer than 32767 bytes")
            parts += (_INT16.pack(len(encoded)), encoded)
    if version >= 2:
        parts.append(_write_tagged_fields(header.tagged_fields))
    return b"".join(parts)


# -- response header ----------------------------------------------------------


def parse_response_header(frame: bytes, version: int) -> tuple[ResponseHeader, int]:
    """Parse a response header of the given version; return it and the body offset."""
    if version not in (0, 1):
        raise HeaderError(f"unknown response header version {version}")
    if len(frame) < 4:
        raise HeaderError(f"response frame of {len(frame)} bytes is shorter than a header")
    (correlation_id,) = _INT32.unpack_from(frame, 0)
    if version == 0:
        return ResponseHeader(correlation_id), 4
    tagged, offset = _read_tagged_fields(frame, 4)
    return ResponseHeader(correlation_id, tagged), offset


def encode_response_header(
    correlation_id: int, version: int, tagged_fields: TaggedFields = ()
) -> bytes:
    if version not in (0, 1):
        raise HeaderError(f"unknown response header version {version}")
    try:
        prefix = _INT32.pack(correlation_id)
    except struct.error as exc:
        raise HeaderError(str(exc)) from exc
    if version == 0:
        return prefix
    return prefix + _write_tagged_fields(tagged_fields)


# -- the one body field the forwarding path must know --------------------------

PRODUCE_KEY: Final = 0


def request_expects_response(header: RequestHeader, frame: bytes, body_offset: int) -> bool:
    """False only for Produce with acks=0, which the broker never answers."""
    if header.api_key != PRODUCE_KEY:
        return True
    # Produce body starts with transactional_id (nullable string) then acks int16.
    offset = body_offset
    if header.api_version < 3:
        pass  # transactional_id arrived in v3
    elif is_flexible(PRODUCE_KEY, header.api_version):
        length_plus_one, offset = _read_uvarint(frame, offset)
        offset += max(length_plus_one - 1, 0)
    else:
        if offset + 2 > len(frame):
            raise HeaderError("truncated produce request")
        (length,) = _INT16.unpack_from(frame, offset)
        offset += 2 + max(length, 0)
    if offset + 2 > len(frame):
        raise HeaderError("truncated produce request")
    (acks,) = _INT16.unpack_from(frame, offset)
    return acks != 0
