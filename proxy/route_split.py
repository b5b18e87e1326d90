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

It is also the one place where the proxy's own answers are built and framed
(:func:`response_payload`, which counts their error codes for ``ksp_response_errors_total``).
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from codec.headers import encode_response_header, response_header_version
from codec.registry import encode, response_type_for
from proxy.connection import FORWARD, ClientConnection, LocalHandler, Request, ResponseTransform, Route
from proxy.metrics import count_response_errors
from proxy.rewrite import decode_response, encode_response

__all__ = ["AnswerView", "MergeEntries", "build", "constant", "item_type", "local_response", "response_payload",
           "split_request", "trimmed_request"]

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


def response_payload(request: Request, response: object) -> bytes:
    """A response the proxy built, framed for `request` (header included), its error codes counted."""
    header = request.header
    count_response_errors(header.api_key, response)
    version = response_header_version(header.api_key, header.api_version)
    return encode(response, header=encode_response_header(header.correlation_id, version))


@dataclasses.dataclass(frozen=True, slots=True)
class MergeEntries:
    """Response transform: the answer's `field` entries plus the proxy's own.

    Appended, or with `order` (the ids the request named, read from each entry's `key` field)
    sorted into request order.
    """

    field: str
    entries: EntriesSource
    order: Sequence[str] | None = None
    key: str = "group_id"

    async def __call__(self, request: Request, payload: bytes) -> bytes:
        header, response = decode_response(request.header.api_key, request.header.api_version, payload)
        extra = tuple(await self.entries())
        count_response_errors(request.header.api_key, extra)
        merged = [*getattr(response, self.field), *extra]
        if self.order is not None:
            rank = {entry_id: i for i, entry_id in enumerate(self.order)}
            merged.sort(key=lambda entry: rank.get(getattr(entry, self.key), len(rank)))
        return encode_response(header, dataclasses.replace(response, **{self.field: tuple(merged)}))


def constant(entries: Sequence[Any]) -> EntriesSource:
    """An entries source for answers that are ready now."""
    ready = tuple(entries)

    async def entries_source() -> tuple:
        return ready

    return entries_source


def local_response(request: Request, field: str, entries: Sequence[Any]) -> bytes:
    """A whole response payload (header included) carrying only the proxy's `entries`."""
    header = request.header
    response_type = response_type_for(header.api_key, header.api_version)
    return response_payload(request, build(response_type, throttle_time=datetime.timedelta(0),
                                           **{field: tuple(entries)}))


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
    inner: Route = FORWARD,
    order: Sequence[str] | None = None,
) -> None:
    """Answer a request whose `request_field` entries are partly the proxy's, partly the cluster's.

    `forwarded[i]` says entry i goes on through `inner` (normally: upstream); the others are
    answered by `local_entries`, awaited when the answer is due. All forwarded: `inner` gets the
    request untouched. None: answered locally, concurrently (``serve_locally``), in order.
    `order`: see :class:`MergeEntries`.
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
                      AnswerView(connection, MergeEntries(response_field, local_entries, order)))


def item_type(entity_type: type, field: str) -> type:
    """The entry type of an array field (``tuple[X, ...]``)."""
    return typing.get_args(typing.get_type_hints(entity_type)[field])[0]


def build(entity_type: type, **values: object) -> object:
    """An entity from the values its version has fields for (versions differ in what they carry)."""
    fields = {f.name for f in dataclasses.fields(entity_type)}
    return entity_type(**{name: value for name, value in values.items() if name in fields})
