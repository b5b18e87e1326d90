"""The share APIs on the wire: decode a request, call the service, encode the response.

Registered in the proxy's dispatch table (``ServeLocally``) for ShareGroupHeartbeat (76),
ShareGroupDescribe (77), ShareFetch (78) and ShareAcknowledge (79), and advertised in
ApiVersions whatever the upstream broker offers. A request that does not decode closes the
connection (the codec error propagates to the connection loop), as a broker would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from codec.headers import encode_response_header, response_header_version
from codec.registry import DEFAULT_REGISTRY, encode
from proxy.apiversions import VersionRange
from proxy.connection import ClientConnection, Request, ServeLocally
from proxy.share.manager import ShareService

log = structlog.get_logger(__name__)

SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79

# Versions served: those the codec registry decodes (v0, Kafka 4.0's early access, is not served).
SERVED_VERSIONS = {
    api_key: DEFAULT_REGISTRY.supported_versions(api_key)
    for api_key in (SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE)
}

Handler = Callable[[object, Request, ClientConnection], Awaitable[object]]


def _serve(handler: Handler):
    async def serve(request: Request, connection: ClientConnection) -> bytes:
        header = request.header
        body = memoryview(request.frame)[request.body_offset:]
        entity = DEFAULT_REGISTRY.decode_request(header.api_key, header.api_version, body)
        response = await handler(entity, request, connection)
        version = response_header_version(header.api_key, header.api_version)
        return encode_response_header(header.correlation_id, version) + encode(response)

    return serve


def share_routes(service: ShareService) -> dict[int, ServeLocally]:
    async def heartbeat(entity, request: Request, connection: ClientConnection):
        host = connection_peer_host(connection)
        return await service.heartbeat(entity, client_id=request.header.client_id or "", client_host=host)

    async def describe(entity, request: Request, connection: ClientConnection):
        return service.describe(entity)

    async def share_fetch(entity, request: Request, connection: ClientConnection):
        service.watch_connection(connection.id, connection.closed)
        return await service.share_fetch(entity, request.header.api_version, connection.id)

    async def share_acknowledge(entity, request: Request, connection: ClientConnection):
        service.watch_connection(connection.id, connection.closed)
        return await service.share_acknowledge(entity, request.header.api_version, connection.id)

    return {
        SHARE_GROUP_HEARTBEAT: ServeLocally(_serve(heartbeat)),
        SHARE_GROUP_DESCRIBE: ServeLocally(_serve(describe)),
        SHARE_FETCH: ServeLocally(_serve(share_fetch)),
        SHARE_ACKNOWLEDGE: ServeLocally(_serve(share_acknowledge)),
    }


def served_version_ranges() -> dict[int, VersionRange]:
    return {key: VersionRange(low, high) for key, (low, high) in SERVED_VERSIONS.items()}


def connection_peer_host(connection: ClientConnection) -> str:
    peer = getattr(connection, "peer", "") or ""
    return "/" + peer.rsplit(":", 1)[0] if peer else ""


__all__ = ["share_routes", "served_version_ranges", "SERVED_VERSIONS"]
