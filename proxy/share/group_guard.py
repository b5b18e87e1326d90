"""One group-id namespace: consumer-group joins cannot take an id that is a share group.

Share groups live in the proxy, consumer groups upstream; Kafka keeps one namespace for both, so
the proxy refuses a consumer-group join whose id is one of its share groups, with the error
Kafka gives for a group of another type:

* JoinGroup (classic protocol): INCONSISTENT_GROUP_PROTOCOL;
* ConsumerGroupHeartbeat (KIP-848 protocol): GROUP_ID_NOT_FOUND.

Only these two requests are decoded (to read the group id); anything else, and every join for an
id that is not a share group, is forwarded byte for byte. The other direction (a share group
joining with an id the upstream cluster already uses) is checked in ShareService.heartbeat.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from codec.registry import decode_entity
from proxy.connection import ClientConnection, Request
from proxy.route_split import response_payload
from proxy.share.coordinator import ShareGroupCoordinator

JOIN_GROUP = 11
CONSUMER_GROUP_HEARTBEAT = 68

_REFUSALS = {
    JOIN_GROUP: ErrorCode.inconsistent_group_protocol,
    CONSUMER_GROUP_HEARTBEAT: ErrorCode.group_id_not_found,
}


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerGroupGuard:
    """Route for JoinGroup / ConsumerGroupHeartbeat: refuse share-group ids, forward the rest."""

    coordinator: ShareGroupCoordinator

    async def start(self, request: Request, connection: ClientConnection) -> None:
        header = request.header
        entity = decode_entity(
            load_request_schema(header.api_key, header.api_version),
            memoryview(request.frame)[request.body_offset:],
        )
        group_id = entity.group_id
        if not self.coordinator.has_group(group_id):
            await connection.forward(request)
            return
        response = error_response(
            load_response_schema(header.api_key, header.api_version),
            _REFUSALS[header.api_key],
            f"Group {group_id} is a share group.",
        )
        await connection.respond(request, response_payload(request, response))


def error_response(response_type: type, error_code: ErrorCode, message: str | None = None) -> object:
    """A response carrying only an error: every other required field gets its empty value."""
    hints = typing.get_type_hints(response_type)
    values: dict[str, object] = {}
    for field in dataclasses.fields(response_type):
        if field.name == "error_code":
            values[field.name] = error_code
        elif field.name == "error_message":
            values[field.name] = message
        elif field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            continue
        else:
            values[field.name] = _empty(hints[field.name], field.metadata.get("kafka_type"))
    return response_type(**values)


def _empty(hint: object, kafka_type: str | None) -> object:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or (args and type(None) in args):
        return None
    if origin is tuple:
        return ()
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type in ("int8", "int16", "int32", "int64"):
        return hint(-1) if callable(hint) else -1
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type == "bytes":
        return b""
    if dataclasses.is_dataclass(hint):
        return error_response(hint, ErrorCode.none) if any(f.name == "error_code" for f in dataclasses.fields(hint)) else hint()
    raise TypeError(f"no empty value for {hint!r} ({kafka_type})")
