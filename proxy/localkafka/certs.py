"""A throwaway certificate authority for the secured local Kafka and the tests around it.

`Certificates(directory)` creates a CA (`ca.pem`, `ca.key`) the first time and reuses it after
that; `issue(name, hosts)` mints a leaf certificate signed by it, with the hosts as subject
alternative names (DNS names, or IP addresses for anything that parses as one). Keys are
unencrypted PKCS#8 PEM, which both Kafka's PEM keystores (`ssl.keystore.type=PEM`) and OpenSSL
read. Pure file work with `cryptography`: no subprocess, no keytool. For tests and demos only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
VALIDITY = datetime.timedelta(days=365)
CA_VALIDITY = datetime.timedelta(days=3650)
# Certificates valid from a little in the past: a clock a few seconds behind must not reject them.
BACKDATE = datetime.timedelta(hours=1)
CA_COMMON_NAME = "kafka-share-proxy local test CA"


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write a key readable by its owner only (written next to it first, then renamed into place)."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    scratch.replace(path)


def _write_public(path: Path, data: bytes) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.write_bytes(data)
    scratch.replace(path)


def subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """IP addresses as IPAddress entries, everything else as DNSName entries."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


class Certificates:
    """A CA kept in `directory` and the leaf certificates it issued there (`<name>.pem`, `<name>.key`)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_cert = self.directory / "ca.pem"
        self.ca_key = self.directory / "ca.key"
        if not (self.ca_cert.is_file() and self.ca_key.is_file()):
            self._create_ca()
        self._ca_certificate = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, rsa.RSAPrivateKey)
        self._ca_private_key = ca_key

    def _create_ca(self) -> None:
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        # The key first: a CA certificate without its key would be "present" but useless.
        _write_private(self.ca_key, _key_pem(key))
        _write_public(self.ca_cert, certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: Iterable[str] = DEFAULT_HOSTS) -> tuple[Path, Path]:
        """A fresh leaf certificate for `name` (its common name) valid for `hosts`: (cert_path, key_path).

        Usable both as a server and as a client certificate (mTLS). Issuing the same name again
        replaces the files.
        """
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"certificate name {name!r} must be a plain file name")
        hosts = tuple(hosts)
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._ca_certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=True,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_private_key.public_key()),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(subject_alternative_names(hosts)), critical=False)
        certificate = builder.sign(self._ca_private_key, hashes.SHA256())
        cert_path = self.directory / f"{name}.pem"
        key_path = self.directory / f"{name}.key"
        _write_private(key_path, _key_pem(key))
        _write_public(cert_path, certificate.public_bytes(serialization.Encoding.PEM))
        return cert_path, key_path
