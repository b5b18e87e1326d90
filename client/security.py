"""TLS and SASL for the client's connections (librdkafka's property names and meanings).

The proxy passes a client's SASL exchange through to the cluster, so the cluster authenticates
this client itself (docs/security.md); the client speaks TLS to the proxy's listener when the
proxy serves TLS. Mechanisms: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (codec.sasl). A failed login is
a non-retriable ``_AUTHENTICATION`` error, a failed TLS handshake ``_SSL``; neither message ever
carries the password.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
from typing import Any, Callable

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from codec.errors import SaslError
from codec.sasl import ClientLogin

from .errors import KafkaError, KafkaException

PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
MECHANISMS = ClientLogin.MECHANISMS
# SaslHandshake v1 / SaslAuthenticate v1: every broker from 1.0 to 4.x answers them (v0 of both is gone in 4.0).
_HANDSHAKE_VERSION = 1
_AUTHENTICATE_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class ClientSecurity:
    protocol: str
    ssl_context: ssl.SSLContext | None
    sasl_mechanism: str | None
    sasl_username: str | None
    sasl_password: str | None = dataclasses.field(default=None, repr=False)


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError.INVALID_ARG, message))


def build_security(values: dict[str, object]) -> ClientSecurity | None:
    """The security settings from the configuration values (librdkafka keys); None for plain plaintext."""
    protocol = str(values["security.protocol"]).lower()
    if protocol not in PROTOCOLS:
        raise _invalid(f"security.protocol must be one of {', '.join(PROTOCOLS)}, not {values['security.protocol']!r}")
    tls = protocol in ("ssl", "sasl_ssl")
    sasl = protocol.startswith("sasl_")
    context = _ssl_context(values) if tls else None
    if not tls and any(values[key] for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")):
        raise _invalid(f"ssl.* locations are set but security.protocol is {protocol}")
    mechanism = values["sasl.mechanism"] or values["sasl.mechanisms"]
    username, password = values["sasl.username"], values["sasl.password"]
    if sasl:
        if not mechanism:
            raise _invalid(f"security.protocol {protocol} needs sasl.mechanism ({', '.join(MECHANISMS)})")
        mechanism = str(mechanism).upper()
        if mechanism not in MECHANISMS:
            raise _invalid(f"sasl.mechanism {mechanism!r} is not supported; use one of {', '.join(MECHANISMS)}")
        if not isinstance(username, str) or not isinstance(password, str):
            raise _invalid(f"sasl.mechanism {mechanism} needs sasl.username and sasl.password")
    elif username or password:
        raise _invalid(f"sasl.username/sasl.password are set but security.protocol is {protocol}")
    if protocol == "plaintext":
        return None
    return ClientSecurity(protocol, context, mechanism if sasl else None, username if sasl else None,
                          password if sasl else None)


def _ssl_context(values: dict[str, object]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    verify_names = str(values["ssl.endpoint.identification.algorithm"]).lower()
    if verify_names not in ("https", "none"):
        raise _invalid("ssl.endpoint.identification.algorithm must be https or none")
    context.check_hostname = verify_names == "https"
    ca, certificate, key = values["ssl.ca.location"], values["ssl.certificate.location"], values["ssl.key.location"]
    try:
        if ca:
            context.load_verify_locations(cafile=str(ca))
        if certificate:
            password = values["ssl.key.password"]
            context.load_cert_chain(str(certificate), str(key) if key else None,
                                    password=str(password) if password is not None else None)
        elif key:
            raise _invalid("ssl.key.location needs ssl.certificate.location")
    except (OSError, ssl.SSLError) as error:
        raise _invalid(f"cannot load the TLS files (ssl.ca.location={ca}, ssl.certificate.location={certificate}): "
                       f"{getattr(error, 'strerror', None) or error}") from None
    return context


def secure(sock: socket.socket, host: str, security: ClientSecurity | None) -> socket.socket:
    """The TLS-wrapped socket (handshake done within the socket's timeout), or ``sock`` itself."""
    if security is None or security.ssl_context is None:
        return sock
    try:
        return security.ssl_context.wrap_socket(
            sock, server_hostname=host if security.ssl_context.check_hostname else None)
    except ssl.SSLCertVerificationError as error:
        sock.close()
        raise KafkaException(KafkaError(KafkaError.SSL, f"TLS handshake with {host} failed: "
                                        f"{error.verify_message or error}", retriable=False)) from None
    except (ssl.SSLError, OSError) as error:
        sock.close()
        raise KafkaException(KafkaError(KafkaError.SSL, f"TLS handshake with {host} failed: {error}",
                                        retriable=False)) from None


def authenticate(call: Callable[[Any], Any], where: str, security: ClientSecurity | None) -> None:
    """SASL login over a fresh connection; ``call(request) -> response`` is the connection's call."""
    if security is None or security.sasl_mechanism is None:
        return
    mechanism, username, password = security.sasl_mechanism, security.sasl_username, security.sasl_password
    assert username is not None and password is not None
    handshake = call(load_request_schema(17, _HANDSHAKE_VERSION)(mechanism=mechanism))
    code = int(handshake.error_code)
    if code:
        raise _authentication_failed(where, mechanism, username,
                                     f"{_name(code)}; the server offers {', '.join(handshake.mechanisms) or 'none'}")
    authenticate_request = load_request_schema(36, _AUTHENTICATE_VERSION)
    try:
        login = ClientLogin(mechanism, username, password)
        token = login.first_token()
        while token is not None:
            token = login.next_token(_exchange(call, authenticate_request, token, where, mechanism, username))
    except SaslError as error:
        raise _authentication_failed(where, mechanism, username, str(error)) from None


def _exchange(call, request_type, token: bytes, where: str, mechanism: str, username: str) -> bytes:
    response = call(request_type(auth_bytes=token))
    code = int(response.error_code)
    if code:
        raise _authentication_failed(where, mechanism, username, response.error_message or _name(code))
    return bytes(response.auth_bytes)


def _authentication_failed(where: str, mechanism: str, username: str, reason: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError.AUTHENTICATION,
                                     f"authentication as {username!r} ({mechanism}) at {where} failed: {reason}",
                                     retriable=False))


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"
