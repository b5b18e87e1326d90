"""SASL client mechanisms, sans-IO: PLAIN and SCRAM (RFC 5802, RFC 7677).

No sockets and no Kafka framing here: the caller carries the bytes (for Kafka, inside
SaslAuthenticate requests; proxy/upstream.py). A :class:`ScramClient` is one exchange::

    client = ScramClient("SCRAM-SHA-512", "proxy", password)
    send(client.first_message())                  # n,,n=proxy,r=<nonce>
    send(client.final_message(receive()))         # c=biws,r=<nonce>,p=<proof>
    client.verify_server_final(receive())         # v=<server signature>, or raises

Every failure raises :class:`SaslError`; no message ever contains the password.

Not done: SASLprep (RFC 4013) normalisation of the password. Kafka's own SCRAM client and
server do not apply it either (``ScramFormatter`` hashes the UTF-8 bytes as given), so
passwords that Kafka accepts are hashed the same way here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from codec.errors import SaslError

#: Kafka's minimum iteration count for both SCRAM mechanisms (``ScramMechanism.minIterations``),
#: and RFC 7677's recommended minimum. A server asking for fewer is refused.
MIN_ITERATIONS = 4096

#: mechanism name -> hashlib name
SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

# RFC 5802 section 7: gs2-header for a client that does not support channel binding, no authzid.
_GS2_HEADER = b"n,,"


def plain_initial_response(username: str, password: str, authzid: str = "") -> bytes:
    """RFC 4616 PLAIN message: ``authzid NUL authcid NUL passwd`` (UTF-8)."""
    for name, value in (("username", username), ("authorization id", authzid)):
        if "\0" in value:
            raise SaslError(f"PLAIN {name} must not contain NUL")
    if "\0" in password:
        raise SaslError("PLAIN password must not contain NUL")
    return b"\0".join(part.encode("utf-8") for part in (authzid, username, password))


def escape_username(username: str) -> str:
    """RFC 5802 saslname: ``=`` becomes ``=3D`` and ``,`` becomes ``=2C`` (``=`` first)."""
    return username.replace("=", "=3D").replace(",", "=2C")


def unescape_username(saslname: str) -> str:
    """The inverse of :func:`escape_username`; raises on an ``=`` not followed by 2C or 3D."""
    out = []
    index = 0
    while index < len(saslname):
        char = saslname[index]
        if char == "=":
            code = saslname[index + 1:index + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise SaslError(f"bad escape in SCRAM user name at position {index}")
            index += 3
        else:
            out.append(char)
            index += 1
    return "".join(out)


def parse_attributes(message: bytes) -> dict[str, str]:
    """``a=value,b=value`` -> {"a": "value", ...}; SaslError if malformed or not UTF-8."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError("SCRAM message is not UTF-8") from None
    attributes: dict[str, str] = {}
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise SaslError(f"malformed SCRAM attribute {part[:20]!r}")
        attributes.setdefault(part[0], part[2:])
    return attributes


def new_nonce() -> str:
    """A printable random nonce (RFC 5802: any printable ASCII except ``,``); base64 has no ``,``."""
    return base64.b64encode(secrets.token_bytes(24)).decode("ascii")


class ScramClient:
    """The client side of one SCRAM exchange (module doc). Methods must be called in order."""

    def __init__(self, mechanism: str, username: str, password: str, *, nonce: str | None = None) -> None:
        try:
            self._hash = SCRAM_MECHANISMS[mechanism.upper()]
        except KeyError:
            raise SaslError(f"unknown SCRAM mechanism {mechanism!r}") from None
        self.mechanism = mechanism.upper()
        self.username = username
        self._password = password.encode("utf-8")
        self._nonce = nonce if nonce is not None else new_nonce()
        if not self._nonce or "," in self._nonce:
            raise SaslError("SCRAM client nonce must be non-empty and contain no ','")
        self._client_first_bare = f"n={escape_username(username)},r={self._nonce}".encode("utf-8")
        self._server_signature: bytes | None = None
        self._step = 0

    def __repr__(self) -> str:  # the password never shows, even in a debugger's repr
        return f"ScramClient({self.mechanism!r}, {self.username!r})"

    def first_message(self) -> bytes:
        """client-first-message: ``n,,n=<user>,r=<client nonce>``."""
        self._advance(0)
        return _GS2_HEADER + self._client_first_bare

    def final_message(self, server_first: bytes) -> bytes:
        """client-final-message for the server-first-message: ``c=biws,r=<nonce>,p=<proof>``.

        Checks that the server's nonce extends ours and that its iteration count is at least
        :data:`MIN_ITERATIONS`.
        """
        self._advance(1)
        attributes = parse_attributes(server_first)
        if "e" in attributes:
            raise SaslError(f"SCRAM server error: {attributes['e']}")
        if "m" in attributes:
            raise SaslError("SCRAM server requires an extension this client does not support")
        try:
            nonce, salt_text, iterations_text = attributes["r"], attributes["s"], attributes["i"]
        except KeyError as missing:
            raise SaslError(f"SCRAM server-first-message lacks attribute {missing.args[0]!r}") from None
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslError("SCRAM server nonce does not extend the client nonce")
        try:
            salt = base64.b64decode(salt_text, validate=True)
            iterations = int(iterations_text)
        except ValueError:
            raise SaslError("SCRAM server-first-message has a bad salt or iteration count") from None
        if iterations < MIN_ITERATIONS:
            raise SaslError(f"SCRAM iteration count {iterations} is below the minimum {MIN_ITERATIONS}")
        without_proof = b"c=" + base64.b64encode(_GS2_HEADER) + b",r=" + nonce.encode("utf-8")
        auth_message = self._client_first_bare + b"," + server_first + b"," + without_proof
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        client_signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, client_signature))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return without_proof + b",p=" + base64.b64encode(proof)

    def verify_server_final(self, server_final: bytes) -> None:
        """Accept the server-final-message ``v=<signature>``; SaslError on ``e=`` or a bad signature."""
        self._advance(2)
        attributes = parse_attributes(server_final)
        if "e" in attributes:
            raise SaslError(f"SCRAM server error: {attributes['e']}")
        if "v" not in attributes:
            raise SaslError("SCRAM server-final-message has no verifier")
        try:
            signature = base64.b64decode(attributes["v"], validate=True)
        except ValueError:
            raise SaslError("SCRAM server signature is not base64") from None
        assert self._server_signature is not None
        if not hmac.compare_digest(signature, self._server_signature):
            raise SaslError("SCRAM server signature does not verify: the server does not know the password")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()

    def _advance(self, expected: int) -> None:
        if self._step != expected:
            raise SaslError("SCRAM messages called out of order")
        self._step += 1


class ClientLogin:
    """One client login in any supported mechanism, as a sequence of tokens (sans-IO)::

        login = ClientLogin(mechanism, username, password)
        token = login.first_token()
        while token is not None:
            token = login.next_token(send_and_receive(token))   # SaslAuthenticate round trip

    PLAIN is one token; SCRAM is two, and the server's final answer is verified. Every failure
    raises :class:`SaslError`. The proxy's own connections and the Python client both drive it.
    """

    MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.mechanism = mechanism.upper()
        if self.mechanism not in self.MECHANISMS:
            raise SaslError(f"unsupported SASL mechanism {mechanism!r}")
        self._username, self._password = username, password
        self._scram: ScramClient | None = None
        self._answers = 0

    def __repr__(self) -> str:
        return f"ClientLogin({self.mechanism!r}, {self._username!r})"

    def first_token(self) -> bytes:
        if self.mechanism == "PLAIN":
            return plain_initial_response(self._username, self._password)
        self._scram = ScramClient(self.mechanism, self._username, self._password)
        return self._scram.first_message()

    def next_token(self, server_token: bytes) -> bytes | None:
        """The token answering `server_token`, or None when the login is complete."""
        self._answers += 1
        if self._scram is None:
            return None  # PLAIN: the broker's (empty) answer ends it
        if self._answers == 1:
            return self._scram.final_message(server_token)
        self._scram.verify_server_final(server_token)
        return None
