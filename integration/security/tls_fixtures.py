"""Certificates and client settings for the TLS integration tests (issue 12).

The proxy's listener certificate and the clients' certificates come from a CA made here with
`trustme` (a test dependency), for the plain session `kafka` broker; tests against the secured
broker use the broker's own CA (`secured_kafka.certificates`).
"""

from __future__ import annotations

from pathlib import Path

import trustme


class Pki:
    """A CA and the certificates it issues, as PEM files in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_path = self._write("ca.pem", self.ca.cert_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        return str(path)

    def issue(self, name: str, *hosts: str) -> tuple[str, str]:
        """(certificate chain path, key path) for `hosts` (DNS names or IP addresses)."""
        issued = self.ca.issue_cert(*(hosts or (f"{name}.example",)))
        return (self._write(f"{name}.pem", b"".join(blob.bytes() for blob in issued.cert_chain_pems)),
                self._write(f"{name}.key", issued.private_key_pem.bytes()))


def listener_flags(certificate: str, key: str, *extra: str) -> tuple[str, ...]:
    """`share-proxy serve` flags for TLS listeners with this certificate."""
    return ("--listener-ssl-certificate-location", certificate, "--listener-ssl-key-location", key, *extra)


def tls_client(bootstrap: str, ca_path: str, certificate: tuple[str, str] | None = None,
               **more: object) -> dict[str, object]:
    """librdkafka properties of a client reaching a TLS proxy (host names verified, as by default)."""
    config: dict[str, object] = {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                                 "ssl.ca.location": ca_path}
    if certificate is not None:
        config["ssl.certificate.location"], config["ssl.key.location"] = certificate
    config.update(more)
    return config
