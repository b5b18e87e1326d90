"""The local Kafka launcher's parts that need no broker: cache, Maven call, configuration."""

from __future__ import annotations

import argparse
import base64
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from proxy.localkafka import LocalKafka, LocalKafkaError, broker, free_port
from proxy.localkafka import cli as local_kafka_cli
from proxy.localkafka import cli_fetch as fetch_cli
from proxy.localkafka.config import (
    BrokerSettings,
    broker_properties,
    format_command,
    format_features,
    random_cluster_id,
    render_properties,
)
from proxy.localkafka.jars import (
    COMPLETE_MARKER,
    cache_root,
    check_version,
    fetch_kafka,
    is_cached,
    lib_dir,
    logging_flavour,
    maven_command,
    package_file,
)


def settings(version: str = "4.4.0", **overrides: object) -> BrokerSettings:
    values: dict[str, object] = {
        "version": version,
        "port": 19092,
        "controller_port": 19093,
        "log_dir": Path("/data/kraft"),
    }
    values.update(overrides)
    return BrokerSettings(**values)  # type: ignore[arg-type]


# -- cache location --------------------------------------------------------------------------


def test_cache_root_prefers_explicit_override() -> None:
    env = {"KSP_KAFKA_CACHE": "/srv/kafka-cache", "XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"}
    assert cache_root(env) == Path("/srv/kafka-cache")


def test_cache_root_follows_xdg_cache_home() -> None:
    assert cache_root({"XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"}) == Path("/xdg/kafka-share-proxy")


def test_cache_root_defaults_to_dot_cache_in_home() -> None:
    assert cache_root({"HOME": "/home/u"}) == Path("/home/u/.cache/kafka-share-proxy")


def test_lib_dir_is_per_version() -> None:
    assert lib_dir("3.9.2", {"KSP_KAFKA_CACHE": "/c"}) == Path("/c/kafka-3.9.2/libs")


@pytest.mark.parametrize("bad", ["latest", "4.4", "4.4.0; rm -rf /", "../4.4.0", ""])
def test_only_release_versions_are_accepted(bad: str) -> None:
    with pytest.raises(LocalKafkaError, match="not a Kafka release version"):
        check_version(bad)


# -- cache detection and fetching ------------------------------------------------------------


def test_directory_without_marker_is_not_cached(tmp_path: Path) -> None:
    (tmp_path / "kafka_2.13-4.4.0.jar").write_bytes(b"jar")
    assert not is_cached(tmp_path)


def test_marker_without_broker_jar_is_not_cached(tmp_path: Path) -> None:
    (tmp_path / COMPLETE_MARKER).write_text("4.4.0\n")
    assert not is_cached(tmp_path)


def test_marker_and_broker_jar_mean_cached(tmp_path: Path) -> None:
    (tmp_path / "kafka_2.13-4.4.0.jar").write_bytes(b"jar")
    (tmp_path / COMPLETE_MARKER).write_text("4.4.0\n")
    assert is_cached(tmp_path)


def fake_mvn(bin_dir: Path, calls: Path, *, fail: bool = False) -> None:
    """An `mvn` stand-in that records its arguments and drops a broker jar into the output dir."""
    bin_dir.mkdir()
    script = bin_dir / "mvn"
    body = "exit 3" if fail else 'mkdir -p "$out" && : > "$out/kafka_2.13-$version.jar" && : > "$out/kafka-clients-$version.jar"'
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{calls}"\n'
        "for arg in \"$@\"; do case $arg in\n"
        "  -DoutputDirectory=*) out=${arg#-DoutputDirectory=} ;;\n"
        "  -Dkafka.version=*) version=${arg#-Dkafka.version=} ;;\n"
        "esac; done\n"
        f"{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_fetch_downloads_once_then_uses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls.txt"
    fake_mvn(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    env = {"KSP_KAFKA_CACHE": str(tmp_path / "cache")}

    first = fetch_kafka("4.4.0", env)
    second = fetch_kafka("4.4.0", env)

    assert first == second == tmp_path / "cache" / "kafka-4.4.0" / "libs"
    assert sorted(path.name for path in first.iterdir()) == [
        COMPLETE_MARKER,
        "kafka-clients-4.4.0.jar",
        "kafka_2.13-4.4.0.jar",
    ]
    assert len(calls.read_text().splitlines()) == 1
    assert "-Dkafka.version=4.4.0" in calls.read_text()


def test_failed_fetch_leaves_no_cache_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mvn(tmp_path / "bin", tmp_path / "calls.txt", fail=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    env = {"KSP_KAFKA_CACHE": str(tmp_path / "cache")}

    with pytest.raises(LocalKafkaError, match="mvn could not fetch Apache Kafka 3.9.2"):
        fetch_kafka("3.9.2", env)

    assert not (tmp_path / "cache" / "kafka-3.9.2" / "libs").exists()


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalKafkaError, match="mvn"):
        fetch_kafka("4.4.0", {"KSP_KAFKA_CACHE": str(tmp_path / "cache")})


def test_maven_command_pins_version_and_logging_binding(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_mvn(tmp_path / "bin", tmp_path / "calls.txt")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    command = maven_command(Path("/p/pom.xml"), "3.9.2", Path("/out"))
    assert command[1:] == [
        "-q",
        "-B",
        "-f",
        "/p/pom.xml",
        "-Dkafka.version=3.9.2",
        "-Dkafka.logging=reload4j",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        "-DoutputDirectory=/out",
    ]


def test_kafka_4_logs_through_log4j2_and_kafka_3_through_reload4j() -> None:
    assert (logging_flavour("4.4.0"), logging_flavour("3.9.2")) == ("log4j2", "reload4j")


def test_pom_is_shipped_with_a_kafka_version_property() -> None:
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(package_file("pom.xml")).getroot()
    assert root.findtext("m:properties/m:kafka.version", namespaces=namespace) == "4.4.0"
    artifacts = [node.text for node in root.findall("m:dependencies/m:dependency/m:artifactId", namespace)]
    assert artifacts == ["kafka_2.13"]
    assert package_file("log4j2.properties").is_file() and package_file("log4j.properties").is_file()


# -- server.properties and formatting --------------------------------------------------------


def test_properties_describe_a_combined_single_node_on_loopback() -> None:
    props = broker_properties(settings())
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["log.dirs"] == "/data/kraft"
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_a_broker_only_node_joins_the_first_nodes_controller() -> None:
    props = broker_properties(settings(port=19094, controller_port=0, node_id=2, controller_voter="1@127.0.0.1:19093"))
    assert props["process.roles"] == "broker"
    assert props["node.id"] == "2"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19094"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"


def test_internal_topics_fit_a_single_broker() -> None:
    props = broker_properties(settings())
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor", "min.insync.replicas"):
        assert props[key] == "1", key


def test_auto_topic_creation_follows_the_setting() -> None:
    assert broker_properties(settings())["auto.create.topics.enable"] == "true"
    assert broker_properties(settings(auto_create_topics=False))["auto.create.topics.enable"] == "false"


def test_share_coordinator_settings_only_for_kafka_4() -> None:
    assert broker_properties(settings("4.4.0"))["share.coordinator.state.topic.replication.factor"] == "1"
    assert not any(key.startswith("share.") for key in broker_properties(settings("3.9.2")))


def test_render_properties_writes_one_key_per_line_in_order() -> None:
    assert render_properties({"b": "2", "a": "1"}) == "b=2\na=1\n"


@pytest.mark.parametrize(
    ("version", "share_groups", "expected"),
    [
        ("4.4.0", False, ["--feature", "share.version=0"]),
        ("4.4.0", True, ["--feature", "share.version=1"]),
        ("3.9.2", False, []),
    ],
)
def test_format_sets_the_share_feature_explicitly_on_kafka_4(version: str, share_groups: bool, expected: list[str]) -> None:
    assert format_features(settings(version, share_groups=share_groups)) == expected


def test_format_command_runs_the_storage_tool_idempotently() -> None:
    command = format_command("java", "/libs/*", settings(), "abc", Path("/w/server.properties"))
    tool = command.index("kafka.tools.StorageTool")
    assert command[tool:] == [
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        "abc",
        "--config",
        "/w/server.properties",
        "--ignore-formatted",
        "--feature",
        "share.version=0",
    ]


def test_cluster_id_is_a_base64url_kafka_uuid() -> None:
    cluster_id = random_cluster_id()
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_cluster_id_never_starts_with_a_dash() -> None:
    # 0xF8 encodes to a leading "-" in base64url; the generator must draw again.
    cluster_id = random_cluster_id(bytes([0xF8]) + bytes(15))
    assert not cluster_id.startswith("-")


# -- launcher arguments ----------------------------------------------------------------------


def test_native_share_groups_need_kafka_4() -> None:
    with pytest.raises(LocalKafkaError, match="has no share groups"):
        LocalKafka("3.9.2", share_groups=True)


def test_bootstrap_before_start_is_an_error() -> None:
    with pytest.raises(LocalKafkaError, match="not started"):
        _ = LocalKafka("4.4.0").bootstrap


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert port > 0


def test_free_port_stays_out_of_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    # Outgoing connections get ports from the ephemeral range; a port handed out there can be
    # taken by one before the server binds it.
    monkeypatch.setattr(broker, "ephemeral_port_floor", lambda: 20_000)
    ports = {free_port() for _ in range(50)}
    assert all(broker.FREE_PORT_FLOOR <= port < 20_000 for port in ports)
    assert len(ports) > 1  # picked at random, so two suites side by side rarely meet


def test_free_port_falls_back_to_the_os_pick_when_the_ephemeral_range_starts_low(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker, "ephemeral_port_floor", lambda: 1024)
    picked = []
    real_socket = broker.socket.socket

    class Recording(real_socket):
        def bind(self, address):
            picked.append(address[1])
            return super().bind(address)

    monkeypatch.setattr(broker.socket, "socket", Recording)
    port = free_port()
    assert picked == [0] and port > 0


# -- command line ----------------------------------------------------------------------------


def parse_local_kafka(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    local_kafka_cli.configure(parser)
    return parser.parse_args(argv)


def test_local_kafka_flags_default_to_free_ports_and_share_groups_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KSP_KAFKA_VERSION", raising=False)
    args = parse_local_kafka([])
    assert (args.kafka_version, args.port, args.controller_port, args.share_groups, args.data_dir) == (
        "4.4.0",
        0,
        0,
        False,
        None,
    )


def test_local_kafka_version_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSP_KAFKA_VERSION", "3.9.2")
    assert parse_local_kafka([]).kafka_version == "3.9.2"


def test_local_kafka_refuses_native_share_groups_on_kafka_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = local_kafka_cli.run(parse_local_kafka(["--kafka-version", "3.9.2", "--share-groups"]))
    assert code == 2
    assert "has no share groups" in capsys.readouterr().err


def test_fetch_kafka_prints_each_cached_lib_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KSP_KAFKA_CACHE", str(tmp_path))
    for version in ("4.4.0", "3.9.2"):
        libs = tmp_path / f"kafka-{version}" / "libs"
        libs.mkdir(parents=True)
        (libs / f"kafka_2.13-{version}.jar").write_bytes(b"jar")
        (libs / COMPLETE_MARKER).write_text(version)
    parser = argparse.ArgumentParser()
    fetch_cli.configure(parser)

    code = fetch_cli.run(parser.parse_args(["--kafka-version", "4.4.0", "--kafka-version", "3.9.2"]))

    assert code == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "kafka-4.4.0" / "libs"), str(tmp_path / "kafka-3.9.2" / "libs")]
