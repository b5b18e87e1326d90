"""proxy.security: Kafka client properties files (--command-config) to an UpstreamSecurity."""

import pytest
import trustme

from proxy.errors import ConfigError
from proxy.security import read_client_properties, security_from_client_properties


@pytest.fixture
def ca_file(tmp_path):
    path = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return str(path)


def test_java_properties_with_a_pem_truststore_and_a_jaas_line(tmp_path, ca_file):
    path = tmp_path / "client.properties"
    path.write_text(
        "# Kafka tools style\nsecurity.protocol=SASL_SSL\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location : {ca_file}\nsasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="alice" password="p=w:d";\n')
    security = security_from_client_properties(read_client_properties(str(path)))
    assert security.ssl_context is not None and security.ssl_context.check_hostname
    assert (security.sasl.mechanism, security.sasl.username, security.sasl.password.value) == \
        ("SCRAM-SHA-512", "alice", "p=w:d")
    assert "p=w:d" not in repr(security)


def test_librdkafka_names_and_java_empty_endpoint_identification(ca_file):
    security = security_from_client_properties({
        "security.protocol": "SSL", "ssl.ca.location": ca_file, "ssl.endpoint.identification.algorithm": ""})
    assert security.sasl is None and not security.ssl_context.check_hostname


def test_plaintext_needs_nothing_and_jks_truststores_are_refused_clearly(tmp_path):
    assert security_from_client_properties({}) is None
    with pytest.raises(ConfigError, match="only PEM truststores"):
        security_from_client_properties({"security.protocol": "SSL", "ssl.truststore.location": "x.jks"})
    with pytest.raises(ConfigError, match="GSSAPI"):
        security_from_client_properties({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "a",
                                         "sasl.password": "b"})


def test_a_line_without_a_separator_is_named_and_a_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "bad.properties"
    path.write_text("security.protocol=SSL\njustakey\n")
    with pytest.raises(ConfigError, match="justakey"):
        read_client_properties(str(path))
    with pytest.raises(ConfigError, match="cannot read command config"):
        read_client_properties(str(tmp_path / "missing"))
