"""The secured local Kafka's generated configuration: server.properties, format arguments,
client settings, the admin properties file, and the launcher's and CLI's security arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from proxy.localkafka import LocalKafka, LocalKafkaError
from proxy.localkafka import cli as local_kafka_cli
from proxy.localkafka.config import (
    BrokerSettings,
    broker_properties,
    client_properties,
    format_command,
    java_client_properties,
    java_properties_text,
    scram_jaas,
)

KEYSTORE = Path("/d/tls/broker-keystore.pem")
CA = Path("/d/tls/ca.pem")


def settings(security: str | None, version: str = "4.4.0") -> BrokerSettings:
    tls = security == "sasl_ssl"
    return BrokerSettings(
        version=version,
        port=19092,
        controller_port=19093,
        log_dir=Path("/d/kraft"),
        security=security,
        keystore=KEYSTORE if tls else None,
        truststore=CA if tls else None,
    )


def parse_java_properties(text: str) -> dict[str, str]:
    """Enough of java.util.Properties' reading rules for what java_properties_text writes."""
    result = {}
    for line in text.splitlines():
        key, i, escaped = [], 0, False
        while i < len(line):
            char = line[i]
            if escaped:
                key.append(char)
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == "=":
                break
            else:
                key.append(char)
            i += 1
        value, j = [], i + 1
        while j < len(line):
            char = line[j]
            if char == "\\":
                j += 1
                value.append({"n": "\n", "r": "\r"}.get(line[j], line[j]))
            else:
                value.append(char)
            j += 1
        result["".join(key)] = "".join(value)
    return result


# -- server.properties ------------------------------------------------------------------------


def test_sasl_ssl_client_listener_and_sasl_plaintext_controller_listener() -> None:
    props = broker_properties(settings("sasl_ssl"))
    assert props["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:19092"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
    assert props["inter.broker.listener.name"] == "SASL_SSL"


def test_clients_get_scram_and_oauthbearer_and_the_broker_talks_to_itself_as_admin() -> None:
    props = broker_properties(settings("sasl_ssl"))
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,OAUTHBEARER"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    assert props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";'
    )
    assert "OAuthBearerLoginModule required" in props["listener.name.sasl_ssl.oauthbearer.sasl.jaas.config"]


def test_the_controller_listener_authenticates_admin_with_plain_so_no_anonymous_super_user() -> None:
    props = broker_properties(settings("sasl_ssl"))
    assert props["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert props["listener.name.controller.sasl.enabled.mechanisms"] == "PLAIN"
    jaas = props["listener.name.controller.plain.sasl.jaas.config"]
    assert 'username="admin" password="admin-secret"' in jaas
    assert 'user_admin="admin-secret"' in jaas
    assert props["super.users"] == "User:admin"
    assert "ANONYMOUS" not in "".join(props.values())


def test_acls_are_enforced_by_the_standard_authorizer_and_deny_by_default() -> None:
    props = broker_properties(settings("sasl_plaintext"))
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"


def test_sasl_ssl_uses_a_pem_keystore_and_truststore_without_client_certificates() -> None:
    props = broker_properties(settings("sasl_ssl"))
    assert props["ssl.keystore.type"] == "PEM"
    assert props["ssl.keystore.location"] == str(KEYSTORE)
    assert props["ssl.truststore.type"] == "PEM"
    assert props["ssl.truststore.location"] == str(CA)
    assert props["ssl.client.auth"] == "none"
    # A PEM keystore file with an unencrypted key takes no passwords at all.
    assert not any(key.endswith("password") for key in props)


def test_sasl_plaintext_has_no_tls_settings() -> None:
    props = broker_properties(settings("sasl_plaintext"))
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert not any(key.startswith("ssl.") for key in props)


def test_a_plaintext_node_has_no_security_settings() -> None:
    props = broker_properties(settings(None))
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert not any(key.startswith(("sasl.", "ssl.", "listener.name.", "authorizer.", "super.")) for key in props)


def test_settings_refuse_unknown_modes_and_tls_without_files() -> None:
    with pytest.raises(ValueError, match="security must be one of"):
        settings("ssl")
    with pytest.raises(ValueError, match="keystore"):
        BrokerSettings(version="4.4.0", port=1, controller_port=2, log_dir=Path("/d"), security="sasl_ssl")


# -- formatting -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["4.4.0", "3.9.2"])
def test_format_adds_the_three_scram_users(version: str) -> None:
    command = format_command("java", "/libs/*", settings("sasl_ssl", version), "abc", Path("/d/server.properties"))
    scram = [command[i + 1] for i, arg in enumerate(command) if arg == "--add-scram"]
    assert scram == [
        "SCRAM-SHA-512=[name=admin,password=admin-secret]",
        "SCRAM-SHA-512=[name=alice,password=alice-secret]",
        "SCRAM-SHA-512=[name=bob,password=bob-secret]",
    ]


def test_format_without_security_adds_no_users() -> None:
    assert "--add-scram" not in format_command("java", "/libs/*", settings(None), "abc", Path("/d/s.properties"))


# -- client settings --------------------------------------------------------------------------


def test_librdkafka_settings_per_user() -> None:
    assert client_properties("sasl_ssl", "127.0.0.1:9", CA, "alice") == {
        "bootstrap.servers": "127.0.0.1:9",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
        "ssl.ca.location": str(CA),
    }
    assert "ssl.ca.location" not in client_properties("sasl_plaintext", "127.0.0.1:9", None, "bob")


def test_java_settings_trust_the_ca_as_a_pem_truststore() -> None:
    props = java_client_properties("sasl_ssl", CA, "bob")
    assert "bootstrap.servers" not in props  # applied over a client's own: it must not redirect it
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.jaas.config"] == scram_jaas("bob")
    assert 'username="bob" password="bob-secret"' in props["sasl.jaas.config"]
    assert (props["ssl.truststore.type"], props["ssl.truststore.location"]) == ("PEM", str(CA))


def test_properties_file_reads_back_as_written_and_keeps_values_readable() -> None:
    props = java_client_properties("sasl_ssl", CA) | {"odd key=:": " lead\\back\nline", "url": "h:1"}
    text = java_properties_text(props)
    assert parse_java_properties(text) == props
    assert "url=h:1\n" in text  # ':' and '=' need no escape in values
    assert f"sasl.jaas.config={scram_jaas('admin')}\n" in text


# -- launcher and command line ----------------------------------------------------------------


def test_the_launcher_refuses_unknown_modes_native_share_groups_and_joining() -> None:
    with pytest.raises(LocalKafkaError, match="security must be one of"):
        LocalKafka("4.4.0", security="ssl")
    with pytest.raises(LocalKafkaError, match="native share groups"):
        LocalKafka("4.4.0", share_groups=True, security="sasl_ssl")
    with pytest.raises(LocalKafkaError, match="single node"):
        LocalKafka("4.4.0", node_id=2, join=LocalKafka("4.4.0"), security="sasl_plaintext")


def test_none_means_a_plaintext_broker_whose_client_config_is_just_the_bootstrap() -> None:
    kafka = LocalKafka("4.4.0", security="none", port=19092)
    kafka.port = 19092  # as start() would set it
    assert kafka.security is None
    assert (kafka.ca_path, kafka.client_config_path, kafka.certificates) == (None, None, None)
    assert kafka.client_config("alice") == {"bootstrap.servers": "127.0.0.1:19092"}
    assert kafka.java_properties("alice") == {"security.protocol": "PLAINTEXT"}


def parse_local_kafka(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    local_kafka_cli.configure(parser)
    return parser.parse_args(argv)


def test_security_flag_defaults_to_none_and_takes_the_two_modes() -> None:
    assert parse_local_kafka([]).security == "none"
    assert parse_local_kafka(["--security", "sasl_plaintext"]).security == "sasl_plaintext"
    with pytest.raises(SystemExit):
        parse_local_kafka(["--security", "ssl"])


def test_ready_line_adds_the_ca_and_client_config_only_when_secured(tmp_path: Path) -> None:
    plain = LocalKafka("4.4.0")
    plain.port = 1234
    assert local_kafka_cli.ready_line(plain) == "ready bootstrap=127.0.0.1:1234 version=4.4.0"

    secured = LocalKafka("3.9.2", security="sasl_ssl")
    secured.port = 1234
    secured.ca_path, secured.client_config_path = tmp_path / "ca.pem", tmp_path / "client-admin.properties"
    assert local_kafka_cli.ready_line(secured) == (
        f"ready bootstrap=127.0.0.1:1234 version=3.9.2 ca={tmp_path / 'ca.pem'} "
        f"client-config={tmp_path / 'client-admin.properties'}"
    )

    no_tls = LocalKafka("4.4.0", security="sasl_plaintext")
    no_tls.port = 1234
    no_tls.client_config_path = tmp_path / "c.properties"
    assert local_kafka_cli.ready_line(no_tls) == f"ready bootstrap=127.0.0.1:1234 version=4.4.0 client-config={tmp_path / 'c.properties'}"


def test_storage_formatted_without_security_is_not_reused_for_a_secured_broker(tmp_path: Path) -> None:
    (tmp_path / "kraft").mkdir()
    (tmp_path / "kraft" / "meta.properties").write_text("cluster.id=abc\n")
    kafka = LocalKafka("4.4.0", security="sasl_ssl", data_dir=tmp_path)
    with pytest.raises(LocalKafkaError, match="formatted without security"):
        kafka._prepare_directory()
    assert not (tmp_path / "tls").exists()
