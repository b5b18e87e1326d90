"""client/security.py: settings checked up front; SASL PLAIN and SCRAM logins against a fake broker."""

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from client.config import parse_config
from client.errors import KafkaError, KafkaException
from client.security import authenticate, build_security
from tests.codec.test_sasl import ScramServer

BASE = {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"}


def settings(**overrides):
    return parse_config({**BASE, **{key.replace("_", "."): value for key, value in overrides.items()}})


def test_plaintext_has_no_security():
    assert settings().security is None


def test_sasl_needs_a_mechanism_and_credentials():
    with pytest.raises(KafkaException, match="needs sasl.mechanism") as caught:
        settings(security_protocol="sasl_plaintext", sasl_username="alice", sasl_password="pw")
    assert caught.value.args[0].code() == KafkaError.INVALID_ARG
    with pytest.raises(KafkaException, match="needs sasl.username and sasl.password"):
        settings(security_protocol="sasl_plaintext", sasl_mechanism="SCRAM-SHA-512")
    with pytest.raises(KafkaException, match="not supported"):
        settings(security_protocol="sasl_plaintext", sasl_mechanism="GSSAPI", sasl_username="a", sasl_password="b")


def test_credentials_without_sasl_are_refused_rather_than_ignored():
    with pytest.raises(KafkaException, match="security.protocol is plaintext"):
        settings(sasl_username="alice", sasl_password="pw")


def test_a_missing_ca_file_is_named_and_the_password_is_not_in_the_repr(tmp_path):
    with pytest.raises(KafkaException, match="ssl.ca.location="):
        settings(security_protocol="ssl", ssl_ca_location=str(tmp_path / "missing.pem"))
    config = settings(security_protocol="sasl_ssl", sasl_mechanisms="scram-sha-256", sasl_username="alice",
                      sasl_password="hunter2-secret")
    assert config.security.sasl_mechanism == "SCRAM-SHA-256"  # librdkafka's alias, any case
    assert config.security.ssl_context is not None and config.security.ssl_context.check_hostname
    assert "hunter2" not in repr(config)


class FakeBroker:
    """Answers SaslHandshake v1 and SaslAuthenticate v1 like Kafka's SCRAM/PLAIN authenticators."""

    def __init__(self, mechanisms=("SCRAM-SHA-512", "PLAIN"), users=None):
        self.mechanisms = mechanisms
        self.users = users or {"alice": "alice-secret"}
        self.scram = ScramServer("sha512", self.users)
        self.step = 0
        self.mechanism = None

    def __call__(self, request):
        if request.__api_key__ == 17:
            self.mechanism = request.mechanism
            code = ErrorCode.none if request.mechanism in self.mechanisms else ErrorCode.unsupported_sasl_mechanism
            return load_response_schema(17, 1)(error_code=code, mechanisms=tuple(self.mechanisms))
        assert request.__api_key__ == 36
        response = load_response_schema(36, 1)
        if self.mechanism == "PLAIN":
            _, user, password = bytes(request.auth_bytes).decode().split("\0")
            ok = self.users.get(user) == password
            return response(error_code=ErrorCode.none if ok else ErrorCode.sasl_authentication_failed,
                            error_message=None if ok else "Authentication failed: Invalid username or password",
                            auth_bytes=b"", session_lifetime=0)
        self.step += 1
        if self.step == 1:
            return response(error_code=ErrorCode.none, error_message=None,
                            auth_bytes=self.scram.first(bytes(request.auth_bytes)), session_lifetime=0)
        final = self.scram.final(bytes(request.auth_bytes))
        if final.startswith(b"e="):
            return response(error_code=ErrorCode.sasl_authentication_failed, auth_bytes=b"", session_lifetime=0,
                            error_message="Authentication failed during authentication due to invalid credentials "
                                          "with SASL mechanism SCRAM-SHA-512")
        return response(error_code=ErrorCode.none, error_message=None, auth_bytes=final, session_lifetime=0)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_login_succeeds_with_the_right_password(mechanism):
    broker = FakeBroker()
    security = build_security({**parse_defaults(), "security.protocol": "sasl_plaintext", "sasl.mechanism": mechanism,
                               "sasl.username": "alice", "sasl.password": "alice-secret"})
    authenticate(broker, "proxy:9092", security)
    assert broker.mechanism == mechanism


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_a_wrong_password_is_a_non_retriable_authentication_error_without_the_password(mechanism):
    security = build_security({**parse_defaults(), "security.protocol": "sasl_plaintext", "sasl.mechanism": mechanism,
                               "sasl.username": "alice", "sasl.password": "wrong-guess-123"})
    with pytest.raises(KafkaException) as caught:
        authenticate(FakeBroker(), "proxy:9092", security)
    error = caught.value.args[0]
    assert error.code() == KafkaError.AUTHENTICATION and error.name() == "_AUTHENTICATION"
    assert not error.retriable()
    assert "alice" in error.str() and "proxy:9092" in error.str() and "Authentication failed" in error.str()
    assert "wrong-guess-123" not in error.str()


def test_a_mechanism_the_server_does_not_offer_names_what_it_offers():
    security = build_security({**parse_defaults(), "security.protocol": "sasl_plaintext",
                               "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": "x"})
    with pytest.raises(KafkaException, match="UNSUPPORTED_SASL_MECHANISM; the server offers SCRAM-SHA-512, PLAIN"):
        authenticate(FakeBroker(), "proxy:9092", security)


def parse_defaults():
    from client.config import OPTIONS
    return {key: default for key, (default, _) in OPTIONS.items()}
