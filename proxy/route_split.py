"""Splitting one request between the proxy and the cluster, and composing routes that do it.

Some admin requests carry a list of resources of which the proxy answers a few itself (share
groups' configs, refusals for the state topic) while the rest belong to the cluster. Kafka's
clients match the answers by resource, not by position, so such a request can be split: the
cluster's part is re-encoded and sent on through the route that would have handled the whole
request, and the proxy's entries are added to whatever that route answers.

:class:`AnswerView` is what makes this compose: a stand-in for the client connection, given to
an inner route, through which every answer the inner route produces -- forwarded (and perhaps
transformed) or answered locally -- passes a post-processing step before the client sees it.
An outer route that trims a request can thus still let the inner route do its own work on the
rest, however many routes are stacked (state-topic guard around group configs around Forward).
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kio.index import load_response_schema

from codec.headers import encode_response_header, parse_response_header, response_header_version
from codec.registry import decode_entity, encode
from proxy.connection import ClientConnection, LocalHandler, Request, ResponseTransform, Route
from proxy.metrics import count_response_errors

__all__ = ["AnswerView", "MergeEntries", "local_response", "split_request", "trimmed_request"]

#: The proxy's own entries for a response, produced when the answer is due (may await).
EntriesSource = Callable[[], Awaitable[tuple]]


class AnswerView:
    """A client connection as an inner route sees it: its answers pass through `post` first."""

    def __init__(self, connection: ClientConnection, post: ResponseTransform) -> None:
        self._connection = connection
        self._post = post

    async def forward(self, request: Request, transform: ResponseTransform | None = None) -> None:
        post = self._post

        async def then_post(forwarded: Request, payload: bytes) -> bytes:
            if transform is not None:
                payload = await transform(forwarded, payload)
            return await post(forwarded, payload)

        await self._connection.forward(request, then_post)

    async def respond(self, request: Request, payload: bytes) -> None:
        await self._connection.respond(request, await self._post(request, payload))

    async def serve_locally(self, request: Request, handler: LocalHandler) -> None:
        post = self._post

        async def then_post(served: Request, connection: Any) -> bytes | None:
            payload = await handler(served, connection)
            return None if payload is None else await post(served, payload)

        await self._connection.serve_locally(request, then_post)

    def __getattr__(self, name: str) -> Any:  # log, close_in_order, ids: the real connection's
        return getattr(self._connection, name)


@dataclasses.dataclass(frozen=True, slots=True)
class MergeEntries:
    """Response transform: the answer's `field` entries plus the proxy's own (appended)."""

    field: str
    entries: EntriesSource

    async def __call__(self, request: Request, payload: bytes) -> bytes:
        header = request.header
        _, body_offset = parse_response_header(payload, response_header_version(header.api_key, header.api_version))
        response = decode_entity(load_response_schema(header.api_key, header.api_version),
                                 memoryview(payload)[body_offset:])
        extra = await self.entries()
        count_response_errors(header.api_key, tuple(extra))
        merged = dataclasses.replace(response, **{self.field: tuple(getattr(response, self.field)) + tuple(extra)})
        return bytes(payload[:body_offset]) + encode(merged)


def local_response(request: Request, field: str, entries: tuple) -> bytes:
    """A whole response payload (header included) carrying only the proxy's `entries`."""
    header = request.header
    response_type = load_response_schema(header.api_key, header.api_version)
    fields = {f.name for f in dataclasses.fields(response_type)}
    values: dict[str, object] = {field: tuple(entries)}
    if "throttle_time" in fields:
        values["throttle_time"] = datetime.timedelta(0)
    response = response_type(**values)
    count_response_errors(header.api_key, response)
    version = response_header_version(header.api_key, header.api_version)
    return encode_response_header(header.correlation_id, version) + encode(response)


def trimmed_request(request: Request, entity: Any, field: str, kept: Sequence[Any]) -> Request:
    """`request` re-encoded with only the `kept` entries of its `field` list."""
    body = encode(dataclasses.replace(entity, **{field: tuple(kept)}))
    return dataclasses.replace(request, frame=bytes(request.frame[: request.body_offset]) + body)


async def split_request(
    request: Request,
    connection: ClientConnection,
    *,
    entity: Any,
    request_field: str,
    response_field: str,
    forwarded: Sequence[bool],
    local_entries: EntriesSource,
    inner: Route,
) -> None:
    """Answer a request whose `request_field` entries are partly the proxy's, partly the cluster's.

    `forwarded[i]` says entry i goes on through `inner` (normally: upstream); the others are
    answered by `local_entries`, awaited when the answer is due. All forwarded: `inner` gets the
    request untouched. None: answered locally, concurrently (``serve_locally``), in order.
    """
    entries = getattr(entity, request_field) or ()
    if all(forwarded):
        await inner.start(request, connection)
        return
    if not any(forwarded):
        async def answer(served: Request, _connection: Any) -> bytes:
            return local_response(served, response_field, await local_entries())

        await connection.serve_locally(request, answer)
        return
    kept = [entry for entry, forward in zip(entries, forwarded) if forward]
    await inner.start(trimmed_request(request, entity, request_field, kept),
                      AnswerView(connection, MergeEntries(response_field, local_entries)))


def item_type(entity_type: type, field: str) -> type:
    """The entry type of an array field (``tuple[X, ...]``)."""
    return typing.get_args(typing.get_type_hints(entity_type)[field])[0]


def build(entity_type: type, **values: object) -> object:
    """An entity from the values its version has fields for (versions differ in what they carry)."""
    fields = {f.name for f in dataclasses.fields(entity_type)}
    return entity_type(**{name: value for name, value in values.items() if name in fields})
