"""proxy/security.py: the TLS contexts, their reload, the service credentials, librdkafka's properties."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from proxy.config import Secret, load_config
from proxy.errors import ConfigError
from proxy.security import (
    ListenerTls,
    UpstreamSecurity,
    librdkafka_config,
    listener_context,
    peer_security,
    upstream_context,
)

KEY_PASSWORD = "key-passphrase-42"


class Files:
    """A CA and a certificate for 127.0.0.1/localhost written to a temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_path = self.write("ca.pem", self.ca.cert_pem.bytes())
        self.cert_path, self.key_path = self.issue("server")

    def write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        return str(path)

    def issue(self, name: str, ca: trustme.CA | None = None, hosts=("127.0.0.1", "localhost")) -> tuple[str, str]:
        issued = (ca or self.ca).issue_cert(*hosts)
        cert = self.write(f"{name}.pem", b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        key = self.write(f"{name}.key", issued.private_key_pem.bytes())
        return cert, key

    def encrypted_key(self, key_path: str, password: str) -> str:
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.BestAvailableEncryption(password.encode()))
        return self.write("encrypted.key", data)


@pytest.fixture
def files(tmp_path) -> Files:
    return Files(tmp_path)


def config(**values):
    return load_config({"upstream": "127.0.0.1:9092", **values}, environ={})


def listener_config(files: Files, **values):
    return config(listener_ssl_certificate_location=files.cert_path, listener_ssl_key_location=files.key_path,
                  **values)


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ----- the listener context ---------------------------------------------------------------------

def test_listener_context_serves_the_certificate_with_client_auth_by_config(files):
    context = listener_context(listener_config(files))
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    for mode, expected in (("requested", ssl.CERT_OPTIONAL), ("required", ssl.CERT_REQUIRED)):
        context = listener_context(listener_config(files, listener_ssl_client_auth=mode,
                                                   listener_ssl_ca_location=files.ca_path))
        assert context.verify_mode == expected
        assert context.cert_store_stats()["x509_ca"] == 1  # the client CA is loaded
    strict = listener_context(listener_config(files, listener_ssl_min_version="TLSv1.3"))
    assert strict.minimum_version == ssl.TLSVersion.TLSv1_3


def test_cipher_suites_are_applied_and_a_list_matching_none_is_a_config_error(files):
    context = listener_context(listener_config(files, listener_ssl_cipher_suites="ECDHE-RSA-AES256-GCM-SHA384"))
    tls12 = [c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-RSA-AES256-GCM-SHA384"]
    with pytest.raises(ConfigError, match="listener_ssl_cipher_suites 'NO-SUCH-CIPHER'"):
        listener_context(listener_config(files, listener_ssl_cipher_suites="NO-SUCH-CIPHER"))


def test_a_certificate_and_key_in_one_file_load_without_a_key_location(files):
    combined = files.write("combined.pem", Path(files.key_path).read_bytes() + Path(files.cert_path).read_bytes())
    assert listener_context(config(listener_ssl_certificate_location=combined)).verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize("broken", ["certificate", "key", "ca"])
def test_a_missing_file_is_a_config_error_naming_it(files, broken):
    missing = str(files.directory / "nope.pem")
    values = {"listener_ssl_certificate_location": files.cert_path, "listener_ssl_key_location": files.key_path,
              "listener_ssl_client_auth": "required", "listener_ssl_ca_location": files.ca_path}
    values[{"certificate": "listener_ssl_certificate_location", "key": "listener_ssl_key_location",
            "ca": "listener_ssl_ca_location"}[broken]] = missing
    what = {"certificate": "listener certificate", "key": "listener private key", "ca": "listener CA"}[broken]
    with pytest.raises(ConfigError, match=f"cannot read {what} {missing}: No such file"):
        listener_context(config(**values))


def test_garbage_in_a_file_is_a_config_error_naming_that_file(files):
    garbage = files.write("garbage.pem", b"-----BEGIN NOTHING-----\nxx\n")
    with pytest.raises(ConfigError, match=f"cannot load listener certificate {garbage}"):
        listener_context(config(listener_ssl_certificate_location=garbage, listener_ssl_key_location=files.key_path))
    with pytest.raises(ConfigError, match=f"cannot load listener private key {garbage} for certificate"):
        listener_context(config(listener_ssl_certificate_location=files.cert_path, listener_ssl_key_location=garbage))
    with pytest.raises(ConfigError, match=f"cannot load listener CA {garbage}"):
        listener_context(listener_config(files, listener_ssl_client_auth="required", listener_ssl_ca_location=garbage))


def test_a_key_of_another_certificate_is_refused(files):
    _, other_key = files.issue("other")
    with pytest.raises(ConfigError, match="does not belong to the certificate"):
        listener_context(config(listener_ssl_certificate_location=files.cert_path,
                                listener_ssl_key_location=other_key))


def test_an_encrypted_key_needs_its_password_which_no_error_shows(files):
    encrypted = files.encrypted_key(files.key_path, KEY_PASSWORD)
    values = {"listener_ssl_certificate_location": files.cert_path, "listener_ssl_key_location": encrypted}
    listener_context(config(**values, listener_ssl_key_password=KEY_PASSWORD))  # loads
    for wrong in ({}, {"listener_ssl_key_password": "wrong-password"}):
        # Without a password OpenSSL would prompt on the terminal; it must fail instead.
        with pytest.raises(ConfigError, match="wrong or missing key password") as caught:
            listener_context(config(**values, **wrong))
        assert KEY_PASSWORD not in str(caught.value) and "wrong-password" not in str(caught.value)


# ----- reload -----------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _served_certificate(context: ssl.SSLContext, ca_path: str) -> bytes:
    """The certificate `context` presents, from an in-memory handshake with a client trusting `ca_path`."""
    client_context = ssl.create_default_context(cafile=ca_path)
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = context.wrap_bio(server_in, server_out, server_side=True)
    client = client_context.wrap_bio(client_in, client_out, server_hostname="localhost")
    for _ in range(10):
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    return client.getpeercert(binary_form=True)


def test_changed_files_are_reloaded_at_most_once_per_interval(files):
    clock = Clock()
    tls = ListenerTls(listener_config(files, listener_ssl_reload_interval_ms=10_000), clock=clock)
    first = tls.context
    before = _served_certificate(first, files.ca_path)
    files.issue("server")  # rewrites server.pem and server.key in place (new serial, new key)
    _bump_mtime(files.cert_path, files.key_path)
    clock.now += 5
    assert tls.maybe_reload() is False and tls.context is first  # within the interval: not looked at
    successes = sample("ksp_tls_reloads_total", {"result": "success"})
    clock.now += 5
    assert tls.maybe_reload() is True
    assert tls.context is not first
    assert _served_certificate(tls.context, files.ca_path) != before
    assert sample("ksp_tls_reloads_total", {"result": "success"}) == successes + 1
    clock.now += 10
    assert tls.maybe_reload() is False  # unchanged files: nothing to do


def test_a_broken_file_keeps_the_old_context_logs_without_the_password_and_is_retried_once_changed(files):
    encrypted = files.encrypted_key(files.key_path, KEY_PASSWORD)
    clock = Clock()
    tls = ListenerTls(config(listener_ssl_certificate_location=files.cert_path, listener_ssl_key_location=encrypted,
                             listener_ssl_key_password=KEY_PASSWORD, listener_ssl_reload_interval_ms=1_000),
                      clock=clock)
    good = tls.context
    failures = sample("ksp_tls_reloads_total", {"result": "failure"})
    Path(files.cert_path).write_bytes(b"half a certificate")  # e.g. a deploy tool mid-write
    _bump_mtime(files.cert_path)
    clock.now += 1
    with capture_logs() as logged:
        assert tls.maybe_reload() is False
    assert tls.context is good
    assert sample("ksp_tls_reloads_total", {"result": "failure"}) == failures + 1
    (event,) = [e for e in logged if e["log_level"] == "error"]
    assert files.cert_path in event["error"] and KEY_PASSWORD not in repr(logged)
    clock.now += 1
    assert tls.maybe_reload() is False  # the same broken files are not re-read every interval
    assert sample("ksp_tls_reloads_total", {"result": "failure"}) == failures + 1
    cert, _ = files.issue("fixed")
    Path(files.cert_path).write_bytes(Path(cert).read_bytes())
    Path(encrypted).write_bytes(Path(files.encrypted_key(files.directory / "fixed.key", KEY_PASSWORD)).read_bytes())
    _bump_mtime(files.cert_path, encrypted)
    clock.now += 1
    assert tls.maybe_reload() is True and tls.context is not good


def test_interval_zero_reloads_only_when_forced(files):
    clock = Clock()
    tls = ListenerTls(listener_config(files, listener_ssl_reload_interval_ms=0), clock=clock)
    first = tls.context
    files.issue("server")
    _bump_mtime(files.cert_path, files.key_path)
    clock.now += 3600
    assert tls.maybe_reload() is False and tls.context is first
    assert tls.maybe_reload(force=True) is True and tls.context is not first  # SIGHUP


def test_the_client_ca_is_watched_too_when_client_certificates_are_checked(files):
    clock = Clock()
    tls = ListenerTls(listener_config(files, listener_ssl_client_auth="required", listener_ssl_ca_location=files.ca_path,
                                      listener_ssl_reload_interval_ms=1), clock=clock)
    first = tls.context
    Path(files.ca_path).write_bytes(Path(files.ca_path).read_bytes() + trustme.CA().cert_pem.bytes())
    _bump_mtime(files.ca_path)
    clock.now += 1
    assert tls.maybe_reload() is True
    assert tls.context is not first and tls.context.cert_store_stats()["x509_ca"] == 2


def _bump_mtime(*paths) -> None:
    # Rewrites within one timestamp tick would look unchanged; tests move the clock explicitly.
    for path in paths:
        status = os.stat(path)
        os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))


# ----- upstream ---------------------------------------------------------------------------------

def test_plaintext_upstream_needs_no_security():
    assert UpstreamSecurity.from_config(config()) is None
    assert librdkafka_config(config()) == {}


def test_ssl_upstream_verifies_against_the_configured_ca_and_host_names(files):
    security = UpstreamSecurity.from_config(config(upstream_security_protocol="SSL", upstream_ssl_ca_location=files.ca_path))
    assert security is not None and security.sasl is None
    context = security.ssl_context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True
    assert context.cert_store_stats()["x509_ca"] == 1  # only the configured CA, not the system's
    relaxed = upstream_context(config(upstream_security_protocol="SSL", upstream_ssl_ca_location=files.ca_path,
                                      upstream_ssl_endpoint_identification_algorithm="none"))
    assert relaxed.check_hostname is False and relaxed.verify_mode == ssl.CERT_REQUIRED  # chain still verified


def test_ssl_upstream_without_a_ca_uses_the_system_trust_store():
    context = upstream_context(config(upstream_security_protocol="SSL"))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True


def test_upstream_client_certificate_and_errors_name_the_file(files):
    encrypted = files.encrypted_key(files.key_path, KEY_PASSWORD)
    context = upstream_context(config(upstream_security_protocol="SSL", upstream_ssl_ca_location=files.ca_path,
                                      upstream_ssl_certificate_location=files.cert_path,
                                      upstream_ssl_key_location=encrypted, upstream_ssl_key_password=KEY_PASSWORD))
    assert context.verify_mode == ssl.CERT_REQUIRED
    missing = str(files.directory / "missing-ca.pem")
    with pytest.raises(ConfigError, match=f"cannot read upstream CA {missing}"):
        UpstreamSecurity.from_config(config(upstream_security_protocol="SSL", upstream_ssl_ca_location=missing))
    with pytest.raises(ConfigError, match="upstream private key .* wrong or missing key password"):
        upstream_context(config(upstream_security_protocol="SSL", upstream_ssl_certificate_location=files.cert_path,
                                upstream_ssl_key_location=encrypted, upstream_ssl_key_password="nope"))


def test_sasl_credentials_are_carried_and_never_printed():
    security = UpstreamSecurity.from_config(config(
        upstream_security_protocol="SASL_PLAINTEXT", upstream_sasl_mechanism="scram-sha-512",
        upstream_sasl_username="proxy", upstream_sasl_password="proxy-secret"))
    assert security is not None and security.ssl_context is None
    assert (security.sasl.mechanism, security.sasl.username) == ("SCRAM-SHA-512", "proxy")
    assert security.sasl.password == Secret("proxy-secret")
    assert "proxy-secret" not in repr(security) and "proxy-secret" not in str(security.sasl)


def test_librdkafka_config_has_only_what_is_set(files):
    assert librdkafka_config(config(upstream_security_protocol="SSL")) == {
        "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "https"}
    full = config(upstream_security_protocol="SASL_SSL", upstream_ssl_ca_location=files.ca_path,
                  upstream_ssl_certificate_location=files.cert_path, upstream_ssl_key_location=files.key_path,
                  upstream_ssl_key_password=KEY_PASSWORD, upstream_ssl_endpoint_identification_algorithm="none",
                  upstream_sasl_mechanism="SCRAM-SHA-256", upstream_sasl_username="proxy",
                  upstream_sasl_password="proxy-secret")
    assert librdkafka_config(full) == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": files.ca_path,
        "ssl.certificate.location": files.cert_path,
        "ssl.key.location": files.key_path,
        "ssl.key.password": KEY_PASSWORD,
        "ssl.endpoint.identification.algorithm": "none",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "proxy",
        "sasl.password": "proxy-secret",
    }
    assert librdkafka_config(config(upstream_security_protocol="SASL_PLAINTEXT", upstream_sasl_mechanism="PLAIN",
                                    upstream_sasl_username="proxy", upstream_sasl_password="pw")) == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "proxy",
        "sasl.password": "pw"}


# ----- share-proxy serve --------------------------------------------------------------------------

def test_serve_exits_2_with_one_line_naming_a_certificate_that_does_not_load(files):
    import subprocess
    import sys

    missing = str(files.directory / "missing.pem")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from proxy.cli import main; sys.exit(main())", "serve",
         "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--listener-ssl-certificate-location", missing,
         "--listener-ssl-key-password", KEY_PASSWORD],
        capture_output=True, text=True, timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"share-proxy: cannot read listener certificate {missing}: No such file or directory"]
    assert result.stdout == ""
    assert KEY_PASSWORD not in result.stderr


# ----- calls between instances (scale-out) ------------------------------------------------------

def test_peers_reach_plaintext_listeners_plainly_and_authenticate_where_clients_do():
    assert peer_security(config()) is None
    assert peer_security(config(upstream_security_protocol="SSL")) is None  # upstream TLS: not the listeners'
    security = peer_security(config(upstream_security_protocol="SASL_PLAINTEXT", upstream_sasl_mechanism="PLAIN",
                                    upstream_sasl_username="proxy", upstream_sasl_password="proxy-secret"))
    assert security is not None and security.ssl_context is None and security.sasl.username == "proxy"


def test_peer_ca_needs_tls_listeners(files):
    with pytest.raises(ConfigError, match="peer_ssl_ca_location needs TLS listeners"):
        config(peer_ssl_ca_location=files.ca_path)


async def _handshake(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> bytes | None:
    """A TLS handshake between the two contexts (client verifying 127.0.0.1); the server's view of
    the client certificate. Raises what the client's side raises when it fails."""
    import trio
    import trio.testing

    client_end, server_end = trio.testing.memory_stream_pair()
    client = trio.SSLStream(client_end, client_context, server_hostname="127.0.0.1")
    server = trio.SSLStream(server_end, server_context, server_side=True)
    seen: list = []

    async def serve() -> None:
        try:
            await server.do_handshake()
            seen.append(server.getpeercert(binary_form=True))
        except (trio.BrokenResourceError, ssl.SSLError):
            pass

    failure: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            await client.do_handshake()
            await client.send_all(b"x")  # TLS 1.3: the server checks the client certificate now
            await server.receive_some(1)
        except (ssl.SSLError, trio.BrokenResourceError) as exc:
            failure.append(exc)
        nursery.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return seen[0] if seen else None


async def test_a_peer_verifies_the_other_instances_listener_and_presents_its_own_certificate_under_mtls(files):
    import trio

    mtls = listener_config(files, listener_ssl_ca_location=files.ca_path, listener_ssl_client_auth="required")
    security = peer_security(mtls)
    assert security is not None and security.sasl is None
    assert security.ssl_context.check_hostname and security.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert await _handshake(listener_context(mtls), security.ssl_context)  # presented and accepted

    # --peer-ssl-ca-location wins over the client CA; a listener whose certificate another CA
    # issued is refused.
    other = trustme.CA()
    other_cert, other_key = files.issue("other-instance", ca=other)
    elsewhere = config(listener_ssl_certificate_location=other_cert, listener_ssl_key_location=other_key)
    with pytest.raises((ssl.SSLError, trio.BrokenResourceError)):
        await _handshake(listener_context(elsewhere), security.ssl_context)
    trusting_other = peer_security(listener_config(files, peer_ssl_ca_location=files.write("other-ca.pem",
                                                                                            other.cert_pem.bytes())))
    assert await _handshake(listener_context(elsewhere), trusting_other.ssl_context) is None  # no client auth asked
