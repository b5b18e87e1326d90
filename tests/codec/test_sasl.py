"""codec/sasl.py: PLAIN, and SCRAM against RFC 7677's vector and a server written here."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from codec.errors import SaslError
from codec.sasl import (
    ClientLogin,
    ScramClient,
    escape_username,
    parse_attributes,
    plain_initial_response,
    unescape_username,
)

# RFC 7677 section 3: user "user", password "pencil".
RFC7677_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC7677_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC7677_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC7677_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_plain_message_is_authzid_user_password_separated_by_nul():
    assert plain_initial_response("alice", "alice-secret") == b"\0alice\0alice-secret"
    assert plain_initial_response("alice", "pw", authzid="admin") == b"admin\0alice\0pw"
    assert plain_initial_response("jörg", "pässword") == "\0jörg\0pässword".encode()


def test_plain_refuses_nul_inside_a_field_without_showing_the_password():
    with pytest.raises(SaslError, match="username"):
        plain_initial_response("al\0ice", "pw")
    with pytest.raises(SaslError) as caught:
        plain_initial_response("alice", "sec\0ret")
    assert "sec" not in str(caught.value)


def test_rfc7677_scram_sha_256_vector():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC7677_CLIENT_NONCE)
    assert client.first_message() == RFC7677_CLIENT_FIRST
    assert client.final_message(RFC7677_SERVER_FIRST) == RFC7677_CLIENT_FINAL
    client.verify_server_final(RFC7677_SERVER_FINAL)  # does not raise


def test_rfc7677_vector_with_a_wrong_server_signature_is_refused():
    client = ScramClient("scram-sha-256", "user", "pencil", nonce=RFC7677_CLIENT_NONCE)
    client.first_message()
    client.final_message(RFC7677_SERVER_FIRST)
    forged = base64.b64encode(bytes(32)).decode()
    with pytest.raises(SaslError, match="signature does not verify"):
        client.verify_server_final(f"v={forged}".encode())


def test_usernames_are_escaped_and_unescaped():
    assert escape_username("a,b=c") == "a=2Cb=3Dc"
    assert escape_username("=2C") == "=3D2C"  # '=' first, so an escape is not escaped twice
    assert unescape_username("a=2Cb=3Dc") == "a,b=c"
    assert unescape_username(escape_username("=2C,=")) == "=2C,="
    with pytest.raises(SaslError, match="bad escape"):
        unescape_username("a=2Db")
    client = ScramClient("SCRAM-SHA-512", "svc,user=1", "pw", nonce="abc")
    assert client.first_message() == b"n,,n=svc=2Cuser=3D1,r=abc"


class ScramServer:
    """RFC 5802's server side, written from the RFC for this test (Kafka's formulas)."""

    def __init__(self, hash_name: str, users: dict[str, str], *, iterations: int = 4096,
                 salt: bytes = b"salt-for-tests", server_nonce: str = "ServerPart123") -> None:
        self.hash_name = hash_name
        self.credentials = {}
        for user, password in users.items():
            salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
            client_key = hmac.new(salted, b"Client Key", hash_name).digest()
            self.credentials[user] = (
                hashlib.new(hash_name, client_key).digest(),  # StoredKey
                hmac.new(salted, b"Server Key", hash_name).digest(),  # ServerKey
            )
        self.iterations, self.salt, self.server_nonce = iterations, salt, server_nonce

    def first(self, client_first: bytes) -> bytes:
        assert client_first.startswith(b"n,,")
        self.client_first_bare = client_first[3:]
        attributes = parse_attributes(self.client_first_bare)
        self.user = unescape_username(attributes["n"])
        self.nonce = attributes["r"] + self.server_nonce
        self.server_first = (f"r={self.nonce},s={base64.b64encode(self.salt).decode()},"
                             f"i={self.iterations}").encode()
        return self.server_first

    def final(self, client_final: bytes) -> bytes:
        without_proof, _, proof_part = client_final.rpartition(b",p=")
        attributes = parse_attributes(without_proof)
        assert attributes["c"] == "biws" and attributes["r"] == self.nonce
        if self.user not in self.credentials:
            return b"e=unknown-user"
        stored_key, server_key = self.credentials[self.user]
        auth_message = self.client_first_bare + b"," + self.server_first + b"," + without_proof
        signature = hmac.new(stored_key, auth_message, self.hash_name).digest()
        client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof_part), signature))
        if hashlib.new(self.hash_name, client_key).digest() != stored_key:
            return b"e=invalid-proof"
        return b"v=" + base64.b64encode(hmac.new(server_key, auth_message, self.hash_name).digest())


def test_scram_sha_512_round_trip_against_a_server():
    server = ScramServer("sha512", {"alice": "alice-secret"})
    client = ScramClient("SCRAM-SHA-512", "alice", "alice-secret")
    server_final = server.final(client.final_message(server.first(client.first_message())))
    assert server_final.startswith(b"v=")
    client.verify_server_final(server_final)
    assert server.user == "alice"


def test_scram_sha_512_with_an_escaped_user_name_round_trips():
    server = ScramServer("sha512", {"a,b=c": "pw"})
    client = ScramClient("SCRAM-SHA-512", "a,b=c", "pw")
    client.verify_server_final(server.final(client.final_message(server.first(client.first_message()))))


def test_wrong_password_is_refused_by_the_server_and_the_error_surfaces():
    server = ScramServer("sha512", {"alice": "alice-secret"})
    client = ScramClient("SCRAM-SHA-512", "alice", "not-her-password")
    server_final = server.final(client.final_message(server.first(client.first_message())))
    with pytest.raises(SaslError, match="invalid-proof") as caught:
        client.verify_server_final(server_final)
    assert "not-her-password" not in str(caught.value)


def test_a_server_that_does_not_know_the_password_cannot_impersonate_one_that_does():
    impostor = ScramServer("sha512", {"alice": "guessed"})
    client = ScramClient("SCRAM-SHA-512", "alice", "alice-secret")
    client_final = client.final_message(impostor.first(client.first_message()))
    # The impostor signs the real exchange with the keys of the password it guessed.
    without_proof = client_final.rpartition(b",p=")[0]
    auth_message = impostor.client_first_bare + b"," + impostor.server_first + b"," + without_proof
    _, server_key = impostor.credentials["alice"]
    forged = b"v=" + base64.b64encode(hmac.new(server_key, auth_message, "sha512").digest())
    with pytest.raises(SaslError, match="does not verify"):
        client.verify_server_final(forged)


@pytest.mark.parametrize(
    ("server_first", "message"),
    [
        (b"r=someone-elses-nonce,s=c2FsdA==,i=4096", "does not extend"),
        (b"r=abc,s=c2FsdA==,i=4096", "does not extend"),  # the nonce must be extended, not echoed
        (b"r=abcXYZ,s=c2FsdA==,i=4095", "below the minimum 4096"),
        (b"r=abcXYZ,s=c2FsdA==,i=many", "bad salt or iteration"),
        (b"r=abcXYZ,s=!!!,i=4096", "bad salt or iteration"),
        (b"r=abcXYZ,i=4096", "lacks attribute 's'"),
        (b"e=other-error", "server error: other-error"),
        (b"m=ext,r=abcXYZ,s=c2FsdA==,i=4096", "extension"),
        (b"garbage", "malformed"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_server_first_messages_are_refused(server_first, message):
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="abc")
    client.first_message()
    with pytest.raises(SaslError, match=message):
        client.final_message(server_first)


def test_server_final_without_verifier_or_with_bad_base64_is_refused():
    for server_final, message in ((b"x=1", "no verifier"), (b"v=***", "not base64")):
        client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC7677_CLIENT_NONCE)
        client.first_message()
        client.final_message(RFC7677_SERVER_FIRST)
        with pytest.raises(SaslError, match=message):
            client.verify_server_final(server_final)


def test_calls_out_of_order_and_unknown_mechanisms_are_errors():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil")
    with pytest.raises(SaslError, match="out of order"):
        client.final_message(RFC7677_SERVER_FIRST)
    with pytest.raises(SaslError, match="unknown SCRAM mechanism"):
        ScramClient("SCRAM-MD5", "user", "pencil")
    assert "pencil" not in repr(client)


def test_generated_nonces_differ_and_carry_no_comma():
    first = ScramClient("SCRAM-SHA-512", "u", "p").first_message()
    second = ScramClient("SCRAM-SHA-512", "u", "p").first_message()
    assert first != second
    assert first.count(b",") == 3  # "n,,n=u,r=<nonce>": none inside the nonce


def test_client_login_drives_scram_to_a_verified_end():
    server = ScramServer("sha512", {"alice": "alice-secret"})
    login = ClientLogin("scram-sha-512", "alice", "alice-secret")
    token = login.first_token()
    answers = iter([server.first, server.final])
    sent = 0
    while token is not None:
        token = login.next_token(next(answers)(token))
        sent += 1
    assert sent == 2 and server.user == "alice"


def test_client_login_plain_is_one_token_and_unknown_mechanisms_are_refused():
    login = ClientLogin("PLAIN", "alice", "pw")
    assert login.first_token() == b"\0alice\0pw"
    assert login.next_token(b"") is None
    with pytest.raises(SaslError, match="GSSAPI"):
        ClientLogin("GSSAPI", "alice", "pw")
    assert "pw" not in repr(login)


def test_client_login_rejects_a_server_that_cannot_prove_the_password():
    server = ScramServer("sha512", {"alice": "other-password"})
    login = ClientLogin("SCRAM-SHA-512", "alice", "alice-secret")
    final = login.next_token(server.first(login.first_token()))
    with pytest.raises(SaslError):
        login.next_token(server.final(final))
