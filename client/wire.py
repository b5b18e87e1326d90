"""One blocking Kafka-protocol connection: send a request entity, read its response entity.

The client's public API is synchronous (like confluent_kafka's), so its I/O is plain blocking
sockets, one request at a time per connection (callers serialise with :attr:`Connection.lock`).
Frames, headers and bodies come from the project's codec: :class:`codec.framing.FrameDecoder`,
:mod:`codec.headers`, kio entity classes (and the codec's own for the extension RPCs).
"""

from __future__ import annotations

import io
import socket
import threading
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from codec.errors import CodecError
from codec.framing import FrameDecoder, encode_frame
from codec.headers import API_VERSIONS_KEY, RequestHeader, encode_request_header, parse_response_header
from codec.registry import response_type_for

from .errors import KafkaError, KafkaException
from .security import ClientSecurity, authenticate, secure

MAX_FRAME_BYTES = 256 * 1024 * 1024
_RECEIVE_CHUNK = 1024 * 1024


class ConnectionError_(KafkaException):
    """The connection failed (refused, reset, timed out, undecodable answer); it is closed."""


class Connection:
    """A connection to one proxy listener (``host``, ``port``)."""

    def __init__(self, host: str, port: int, *, client_id: str, connect_timeout_s: float,
                 security: ClientSecurity | None = None) -> None:
        self.host, self.port = host, port
        self.client_id = client_id
        self.lock = threading.Lock()
        self._decoder = FrameDecoder(MAX_FRAME_BYTES)
        self._next_correlation_id = 1
        try:
            self._socket: socket.socket | None = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as error:
            raise ConnectionError_(KafkaError(KafkaError.TRANSPORT, f"connect to {host}:{port} failed: {error}")) from error
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # TLS, then SASL, both inside the connect timeout: a login that hangs is a failed connect.
        self._socket = secure(self._socket, host, security)
        try:
            authenticate(lambda request: self.call(request, timeout_s=connect_timeout_s), f"{host}:{port}", security)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._socket is None

    def call(self, request: Any, *, timeout_s: float, response_type: type | None = None) -> Any:
        """Send ``request`` and return its decoded response; ``response_type`` for extension RPCs."""
        sock = self._socket
        if sock is None:
            raise ConnectionError_(KafkaError(KafkaError.TRANSPORT, f"connection to {self.host}:{self.port} is closed"))
        api_key, api_version = int(request.__api_key__), int(request.__version__)
        correlation_id = self._next_correlation_id
        self._next_correlation_id = correlation_id + 1 if correlation_id < 2**31 - 1 else 1
        buffer = io.BytesIO()
        # Header versions follow the entity's own flexibility, so extension RPCs under any api key work.
        flexible = bool(getattr(request, "__flexible__", False))
        buffer.write(encode_request_header(RequestHeader(api_key, api_version, correlation_id, self.client_id),
                                           2 if flexible else 1))
        entity_writer(type(request))(buffer, request)
        try:
            sock.settimeout(timeout_s)
            sock.sendall(encode_frame(buffer.getvalue()))
            frame = self._receive_frame(sock)
            header, offset = parse_response_header(frame, 1 if flexible and api_key != API_VERSIONS_KEY else 0)
            if header.correlation_id != correlation_id:
                raise CodecError(f"correlation id {header.correlation_id}, expected {correlation_id}")
            entity_type = response_type or _response_type(api_key, api_version)
            response, _ = entity_reader(entity_type)(frame, offset)
            return response
        except TimeoutError as error:
            self.close()
            raise ConnectionError_(KafkaError(
                KafkaError.TIMED_OUT, f"request (api key {api_key}) to {self.host}:{self.port} timed out")) from error
        except (OSError, EOFError, CodecError, ValueError, IndexError) as error:
            self.close()
            raise ConnectionError_(KafkaError(
                KafkaError.TRANSPORT, f"request (api key {api_key}) to {self.host}:{self.port} failed: {error}")) from error

    def _receive_frame(self, sock: socket.socket) -> bytes:
        while (frame := self._decoder.next_frame()) is None:
            data = sock.recv(_RECEIVE_CHUNK)
            if not data:
                raise EOFError("the peer closed the connection")
            self._decoder.feed(data)
        return frame

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _response_type(api_key: int, api_version: int) -> type:
    try:
        return response_type_for(api_key, api_version)
    except CodecError:
        return load_response_schema(api_key, api_version)
