"""certs.py: a CA made once and reused, leaf certificates that real TLS stacks accept."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from proxy.localkafka.certs import Certificates, subject_alternative_names


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> ssl.SSLObject:
    """A complete TLS handshake in memory (no sockets); the client's end, or the ssl error raised."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server_end = server.wrap_bio(server_in, server_out, server_side=True)
    client_end = client.wrap_bio(client_in, client_out, server_hostname=server_hostname)
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, end in (("client", client_end), ("server", server_end)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            return client_end
    raise AssertionError("handshake did not finish")


def test_the_ca_is_created_once_and_reused(tmp_path: Path) -> None:
    first = Certificates(tmp_path / "tls")
    ca_pem = first.ca_cert.read_bytes()

    second = Certificates(tmp_path / "tls")

    assert second.ca_cert == tmp_path / "tls" / "ca.pem"
    assert second.ca_key == tmp_path / "tls" / "ca.key"
    assert second.ca_cert.read_bytes() == ca_pem
    ca = load(second.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.subject == ca.issuer


def test_a_leaf_names_its_hosts_as_dns_and_ip_entries_and_is_signed_by_the_ca(tmp_path: Path) -> None:
    certificates = Certificates(tmp_path)

    cert_path, key_path = certificates.issue("broker", hosts=("localhost", "127.0.0.1", "::1", "kafka.test"))

    assert (cert_path, key_path) == (tmp_path / "broker.pem", tmp_path / "broker.key")
    leaf = load(cert_path)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "kafka.test"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    assert leaf.issuer == load(certificates.ca_cert).subject
    leaf.verify_directly_issued_by(load(certificates.ca_cert))
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_a_leaf_is_valid_for_a_year_from_about_now(tmp_path: Path) -> None:
    leaf = load(Certificates(tmp_path).issue("broker")[0])
    now = datetime.datetime.now(datetime.UTC)
    assert leaf.not_valid_before_utc <= now
    assert datetime.timedelta(days=364) < leaf.not_valid_after_utc - now <= datetime.timedelta(days=365)


def test_keys_are_unencrypted_pkcs8_pem_readable_by_the_owner_only(tmp_path: Path) -> None:
    certificates = Certificates(tmp_path)
    _, key_path = certificates.issue("client")

    for path in (key_path, certificates.ca_key):
        text = path.read_bytes()
        assert text.startswith(b"-----BEGIN PRIVATE KEY-----"), path  # PKCS#8, not "RSA PRIVATE KEY"
        serialization.load_pem_private_key(text, password=None)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_issuing_a_name_again_replaces_its_certificate(tmp_path: Path) -> None:
    certificates = Certificates(tmp_path)
    first = load(certificates.issue("proxy")[0])
    second = load(certificates.issue("proxy")[0])
    assert first.serial_number != second.serial_number


@pytest.mark.parametrize("name", ["", "a/b", ".hidden"])
def test_a_certificate_name_must_be_a_plain_file_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        Certificates(tmp_path).issue(name)


def test_openssl_completes_a_verified_handshake_by_name_and_by_ip_with_a_client_certificate(tmp_path: Path) -> None:
    certificates = Certificates(tmp_path)
    server_cert, server_key = certificates.issue("server")
    client_cert, client_key = certificates.issue("client", hosts=())
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_cert, server_key)
    server.load_verify_locations(certificates.ca_cert)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=str(certificates.ca_cert))
    client.load_cert_chain(client_cert, client_key)

    for host in ("localhost", "127.0.0.1"):
        end = handshake(server, client, host)
        assert end.getpeercert()["subject"] == ((("commonName", "server"),),)


def test_a_host_the_certificate_does_not_name_is_refused(tmp_path: Path) -> None:
    certificates = Certificates(tmp_path)
    server_cert, server_key = certificates.issue("server")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_cert, server_key)
    client = ssl.create_default_context(cafile=str(certificates.ca_cert))

    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(server, client, "other.example")


def test_a_certificate_from_another_ca_is_not_trusted(tmp_path: Path) -> None:
    ours, theirs = Certificates(tmp_path / "ours"), Certificates(tmp_path / "theirs")
    server_cert, server_key = theirs.issue("server")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_cert, server_key)
    client = ssl.create_default_context(cafile=str(ours.ca_cert))

    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(server, client, "localhost")


def test_subject_alternative_names_tell_addresses_from_names() -> None:
    assert subject_alternative_names(["10.0.0.1", "example.org"]) == [
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        x509.DNSName("example.org"),
    ]
