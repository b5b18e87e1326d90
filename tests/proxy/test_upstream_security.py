"""open_upstream over TLS with the service's SASL credentials, against an in-process fake broker
that speaks ApiVersions, SaslHandshake and SaslAuthenticate (SCRAM from the RFC, PLAIN).

The real thing -- Kafka's SCRAM-SHA-512 over SASL_SSL -- is in integration/security/.
"""

from __future__ import annotations

import datetime
import functools
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trustme
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.primitive import i16

from codec.headers import RequestHeader, encode_request_header, parse_request_header
from proxy.config import HostPort, load_config
from proxy.errors import UpstreamAuthenticationError, UpstreamError, UpstreamTlsError
from proxy.localkafka import free_port
from proxy.security import UpstreamSecurity
from proxy.serve import check_upstream_credentials
from proxy.server import Proxy
from proxy.upstream import FramedStream, UpstreamClient, open_first_upstream, open_upstream
from tests.codec.test_sasl import ScramServer
from tests.proxy.kio_build import build, response_frame

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, ECHO_API = 17, 36, 18, 32
USERS = {"proxy": "proxy-secret"}
KAFKA_INVALID_CREDENTIALS = ("Authentication failed during authentication due to invalid credentials with SASL "
                             "mechanism {}")


@dataclass
class FakeBroker:
    """A broker on loopback: TLS when given a context, SASL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN)."""

    tls: ssl.SSLContext | None = None
    mechanisms: tuple[str, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
    port: int = 0
    session_lifetime_ms: int = 0  # KIP-368: what SaslAuthenticate v1+ reports
    seen: list[list[int]] = field(default_factory=list)  # API keys asked, per connection
    authenticated: list[str] = field(default_factory=list)

    async def start(self, nursery: trio.Nursery) -> HostPort:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.port = listener.socket.getsockname()[1]
        return HostPort("127.0.0.1", self.port)

    async def _handle(self, tcp: trio.SocketStream) -> None:
        stream: trio.abc.Stream = tcp
        if self.tls is not None:
            stream = trio.SSLStream(tcp, self.tls, server_side=True, https_compatible=True)
        seen: list[int] = []
        self.seen.append(seen)
        state: dict = {}
        try:
            framed = FramedStream(stream, 1 << 20)
            while (frame := await framed.receive_frame()) is not None:
                header, offset = parse_request_header(frame)
                seen.append(header.api_key)
                answer = self._answer(header, frame, offset, state)
                if answer is None:
                    break
                await framed.send_frame(answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    def _answer(self, header, frame: bytes, offset: int, state: dict) -> bytes | None:
        cid, key, version = header.correlation_id, header.api_key, header.api_version
        if key == API_VERSIONS:
            schema = load_response_schema(API_VERSIONS, version)
            api = schema.__dataclass_fields__["api_keys"].type.__args__[0]
            keys = [(API_VERSIONS, 0, 3), (SASL_HANDSHAKE, 0, 1), (SASL_AUTHENTICATE, 0, 2), (ECHO_API, 0, 4)]
            return response_frame(build(schema, api_keys=tuple(
                api(api_key=i16(k), min_version=i16(a), max_version=i16(b)) for k, a, b in keys)), cid)
        if key == SASL_HANDSHAKE:
            request, _ = entity_reader(load_request_schema(key, version))(frame, offset)
            schema = load_response_schema(key, version)
            state["mechanism"] = request.mechanism
            code = ErrorCode.none if request.mechanism in self.mechanisms else ErrorCode.unsupported_sasl_mechanism
            return response_frame(build(schema, error_code=code, mechanisms=self.mechanisms), cid)
        if key == SASL_AUTHENTICATE:
            request, _ = entity_reader(load_request_schema(key, version))(frame, offset)
            schema = load_response_schema(key, version)
            reply, failure = self._sasl_step(state, bytes(request.auth_bytes))
            if failure:
                return response_frame(build(schema, error_code=ErrorCode.sasl_authentication_failed,
                                            error_message=failure), cid)
            extra = {"session_lifetime": datetime.timedelta(milliseconds=self.session_lifetime_ms)} if version else {}
            return response_frame(build(schema, auth_bytes=reply, **extra), cid)
        return cid.to_bytes(4, "big") + b"echo"

    def _sasl_step(self, state: dict, token: bytes) -> tuple[bytes, str | None]:
        mechanism = state["mechanism"]
        invalid = KAFKA_INVALID_CREDENTIALS.format(mechanism)
        if mechanism == "PLAIN":
            _, user, password = token.decode().split("\0")
            if USERS.get(user) != password:
                return b"", invalid
            self.authenticated.append(user)
            return b"", None
        if "scram" not in state:
            state["scram"] = ScramServer(mechanism.removeprefix("SCRAM-").replace("-", "").lower(), USERS)
            return state["scram"].first(token), None
        final = state["scram"].final(token)
        if final.startswith(b"e="):
            return b"", invalid  # Kafka answers a bad proof with an error code, not e=
        self.authenticated.append(state["scram"].user)
        return final, None


class Pki:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_path = str(directory / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)

    def server_context(self, *hosts: str, ca: trustme.CA | None = None) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        (ca or self.ca).issue_cert(*hosts).configure_cert(context)
        return context


@pytest.fixture
def pki(tmp_path) -> Pki:
    return Pki(tmp_path)


def security(protocol: str = "SASL_SSL", ca_path: str | None = None, **values) -> UpstreamSecurity:
    sasl = {"upstream_sasl_mechanism": "SCRAM-SHA-512", "upstream_sasl_username": "proxy",
            "upstream_sasl_password": "proxy-secret"} if protocol.startswith("SASL") else {}
    tls = {"upstream_ssl_ca_location": ca_path} if ca_path else {}
    config = load_config({"upstream": "127.0.0.1:1", "upstream_security_protocol": protocol, **sasl, **tls,
                          **values}, environ={})
    result = UpstreamSecurity.from_config(config)
    assert result is not None
    return result


async def test_sasl_ssl_with_scram_sha_512_authenticates_and_the_connection_is_usable(pki, nursery):
    broker = FakeBroker(tls=pki.server_context("127.0.0.1"))
    address = await broker.start(nursery)
    stream = await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=security(ca_path=pki.ca_path),
                                 authenticate=True)
    assert isinstance(stream.stream, trio.SSLStream)
    assert stream.session_expires_at is None  # the broker grants an unlimited session
    versions = await UpstreamClient(stream).api_versions()  # the connection goes on after SASL
    assert versions[ECHO_API] == (0, 4)
    await stream.aclose()
    assert broker.authenticated == ["proxy"]
    assert broker.seen[0][:5] == [API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE, SASL_AUTHENTICATE, API_VERSIONS]


async def test_a_session_lifetime_marks_when_the_connection_must_be_retired(nursery):
    broker = FakeBroker(session_lifetime_ms=100_000)
    address = await broker.start(nursery)
    limited = await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=security("SASL_PLAINTEXT"),
                                    authenticate=True)
    assert limited.session_expires_at is not None
    assert 84 < limited.session_expires_at - trio.current_time() <= 85
    assert not UpstreamClient(limited).session_expired()
    await limited.aclose()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
async def test_the_other_mechanisms_authenticate_too(pki, nursery, mechanism):
    broker = FakeBroker()
    address = await broker.start(nursery)
    stream = await open_upstream(address, timeout=5, max_frame_size=1 << 20,
                                 security=security("SASL_PLAINTEXT", upstream_sasl_mechanism=mechanism),
                                 authenticate=True)
    await stream.aclose()
    assert broker.authenticated == ["proxy"]


async def test_a_wrong_password_names_broker_mechanism_user_and_kafkas_message_never_the_password(pki, nursery):
    broker = FakeBroker(tls=pki.server_context("127.0.0.1"))
    address = await broker.start(nursery)
    wrong = security(ca_path=pki.ca_path, upstream_sasl_password="wrong-secret-123")
    with pytest.raises(UpstreamAuthenticationError) as caught:
        await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=wrong, authenticate=True)
    message = str(caught.value)
    assert message == (f"upstream authentication failed as user 'proxy' (SCRAM-SHA-512) at {address}: "
                       + KAFKA_INVALID_CREDENTIALS.format("SCRAM-SHA-512"))
    assert "wrong-secret-123" not in message and "wrong-secret-123" not in repr(caught.value.__cause__)


async def test_a_mechanism_the_listener_does_not_enable_lists_what_it_offers(nursery):
    broker = FakeBroker(mechanisms=("PLAIN",))
    address = await broker.start(nursery)
    with pytest.raises(UpstreamAuthenticationError, match=r"mechanism not enabled on this listener \(it offers: PLAIN\)"):
        await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=security("SASL_PLAINTEXT"),
                            authenticate=True)


async def test_a_broker_certificate_from_an_unknown_ca_is_a_tls_error(pki, nursery):
    broker = FakeBroker(tls=pki.server_context("127.0.0.1", ca=trustme.CA()))
    address = await broker.start(nursery)
    with pytest.raises(UpstreamTlsError) as caught:
        await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=security("SSL", pki.ca_path))
    assert str(caught.value) == (f"TLS handshake with upstream {address} failed: certificate verify failed: "
                                 "unable to get local issuer certificate")


async def test_a_broker_certificate_for_another_host_is_a_hostname_mismatch_unless_identification_is_off(pki, nursery):
    broker = FakeBroker(tls=pki.server_context("kafka.example"))
    address = await broker.start(nursery)
    by_name = HostPort("localhost", address.port)
    with pytest.raises(UpstreamTlsError, match="certificate verify failed: hostname mismatch, certificate is not "
                                               "valid for 'localhost'"):
        await open_upstream(by_name, timeout=5, max_frame_size=1 << 20, security=security("SSL", pki.ca_path))
    relaxed = security("SSL", pki.ca_path, upstream_ssl_endpoint_identification_algorithm="none")
    stream = await open_upstream(by_name, timeout=5, max_frame_size=1 << 20, security=relaxed)
    await stream.aclose()


async def test_without_authenticate_a_connection_gets_tls_but_sends_no_sasl(pki, nursery):
    """Clients' pass-through connections: the client sends its own SASL frames."""
    broker = FakeBroker(tls=pki.server_context("127.0.0.1"))
    address = await broker.start(nursery)
    stream = await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=security(ca_path=pki.ca_path))
    await UpstreamClient(stream).api_versions()
    await stream.aclose()
    assert broker.seen == [[API_VERSIONS]] and broker.authenticated == []


async def test_a_plaintext_broker_behind_an_ssl_config_is_not_reachable_rather_than_a_tls_error(pki, nursery):
    class Closing:
        async def __call__(self, stream):
            await stream.receive_some(10)
            await stream.aclose()

    (listener,) = await nursery.start(functools.partial(trio.serve_tcp, Closing(), 0, host="127.0.0.1"))
    address = HostPort("127.0.0.1", listener.socket.getsockname()[1])
    with pytest.raises(UpstreamError, match="closed the connection during the TLS handshake") as caught:
        await open_upstream(address, timeout=5, max_frame_size=1 << 20, security=security("SSL", pki.ca_path))
    assert not isinstance(caught.value, UpstreamTlsError)


async def test_open_first_upstream_keeps_the_authentication_error_when_no_address_works(pki, nursery):
    broker = FakeBroker()
    address = await broker.start(nursery)
    wrong = security("SASL_PLAINTEXT", upstream_sasl_password="nope")
    with pytest.raises(UpstreamAuthenticationError, match="as user 'proxy'"):
        await open_first_upstream([HostPort("127.0.0.1", free_port()), address], timeout=5, max_frame_size=1 << 20,
                                  security=wrong, authenticate=True)


def proxy_config(broker_port: int, ca_path: str, **values):
    return load_config({
        "upstream": f"127.0.0.1:{broker_port}", "listen": "127.0.0.1:0", "connect_timeout": "2",
        "upstream_security_protocol": "SASL_SSL", "upstream_ssl_ca_location": ca_path,
        "upstream_sasl_mechanism": "SCRAM-SHA-512", "upstream_sasl_username": "proxy",
        "upstream_sasl_password": "proxy-secret", "disable_share_groups": "true", **values}, environ={})


async def test_the_start_up_check_raises_on_refused_credentials_and_passes_on_good_ones(pki, nursery):
    broker = FakeBroker(tls=pki.server_context("127.0.0.1"))
    await broker.start(nursery)
    await check_upstream_credentials(Proxy(proxy_config(broker.port, pki.ca_path)))
    assert broker.authenticated == ["proxy"]
    with pytest.raises(UpstreamAuthenticationError, match="invalid credentials"):
        await check_upstream_credentials(Proxy(proxy_config(broker.port, pki.ca_path, upstream_sasl_password="x")))
    # Unreachable is an outage, not a configuration error: start-up goes on (and waits, as always).
    await check_upstream_credentials(Proxy(proxy_config(free_port(), pki.ca_path)))


async def test_a_proxy_discovers_as_itself_and_forwards_clients_without_sasl_of_its_own(pki, nursery):
    broker = FakeBroker(tls=pki.server_context("127.0.0.1"))
    await broker.start(nursery)
    proxy = Proxy(proxy_config(broker.port, pki.ca_path))
    bootstrap = await nursery.start(proxy.run)
    assert broker.authenticated == ["proxy"]  # broker discovery: the proxy's own connection
    client = FramedStream(await trio.open_tcp_stream(bootstrap.host, bootstrap.port), 1 << 20)
    await client.send_frame(encode_request_header(RequestHeader(ECHO_API, 1, 4, "client")))
    with trio.fail_after(5):
        assert await client.receive_frame() == (4).to_bytes(4, "big") + b"echo"
    await client.aclose()
    assert broker.seen[-1] == [ECHO_API]  # the client's upstream connection: TLS, no SASL from the proxy
    assert broker.authenticated == ["proxy"]
    proxy.shutdown()
