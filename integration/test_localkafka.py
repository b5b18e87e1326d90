"""The local Kafka launcher against real brokers: share groups off by default, the CLI contract."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource

from integration.kafka_fixtures import kafka_version, share_proxy_executable, terminate, wait_for_ready_line
from proxy.localkafka import SHARE_API_KEYS, LocalKafka
from proxy.localkafka.config import supports_share_groups
from proxy.localkafka.probe import probe, share_group_heartbeat_error

UNSUPPORTED_VERSION = 35
NOT_COORDINATOR = 16


def test_session_broker_has_share_groups_disabled(kafka: LocalKafka) -> None:
    info = probe("127.0.0.1", kafka.port)

    assert info.finalized_features.get("share.version", 0) == 0
    if supports_share_groups(kafka.version):
        # Kafka 4.x keeps listing the APIs; with share.version=0 it refuses to serve them.
        assert share_group_heartbeat_error("127.0.0.1", kafka.port) == UNSUPPORTED_VERSION
    else:
        assert not SHARE_API_KEYS & info.api_keys


def test_native_share_groups_flag_enables_kafkas_own_share_groups(native_kafka: LocalKafka) -> None:
    info = probe("127.0.0.1", native_kafka.port)

    assert info.finalized_features["share.version"] >= 1
    assert SHARE_API_KEYS <= info.api_keys
    # Accepted, and answered as share groups are: ask the group's coordinator.
    assert share_group_heartbeat_error("127.0.0.1", native_kafka.port) == NOT_COORDINATOR


def java_processes_using(path: Path) -> list[int]:
    """Pids of java processes whose command line mentions `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "java" in cmdline and str(path) in cmdline:
            found.append(int(entry.name))
    return found


def test_local_kafka_command_prints_ready_serves_and_stops_cleanly(tmp_path: Path) -> None:
    version = kafka_version()
    data_dir = tmp_path / "kafka-data"
    process = subprocess.Popen(
        [share_proxy_executable(), "local-kafka", "--kafka-version", version, "--port", "0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = wait_for_ready_line(process, 90, "share-proxy local-kafka", data_dir / "server.log")
        line = ready.string.strip()
        assert re.fullmatch(rf"ready bootstrap=127\.0\.0\.1:\d+ version={re.escape(version)}", line), line
        port = int(ready["port"])
        assert 1 in probe("127.0.0.1", port).broker_ids
        assert java_processes_using(data_dir)

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert process.stderr is not None
        assert "local-kafka: broker stopped" in process.stderr.read()
    finally:
        terminate(process)
        if process.stderr is not None:
            process.stderr.close()

    assert java_processes_using(data_dir) == []
    assert (data_dir / "kraft" / "meta.properties").is_file(), "a given --data-dir is kept"


def test_killing_the_launcher_takes_the_broker_with_it(tmp_path: Path) -> None:
    """Even a SIGKILLed launcher (a crashed test run) leaves no orphan JVM behind."""
    data_dir = tmp_path / "kafka-data"
    process = subprocess.Popen(
        [share_proxy_executable(), "local-kafka", "--kafka-version", kafka_version(), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for_ready_line(process, 90, "share-proxy local-kafka", data_dir / "server.log")
        [broker_pid] = java_processes_using(data_dir)

        process.kill()
        process.wait(timeout=10)

        deadline = time.monotonic() + 10
        while java_processes_using(data_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert java_processes_using(data_dir) == [], f"broker {broker_pid} outlived its launcher"
    finally:
        terminate(process)
        for pid in java_processes_using(data_dir):  # only this test's broker: its data dir is unique
            os.kill(pid, signal.SIGKILL)


def test_server_properties_override_the_nodes_own_settings(tmp_path: Path) -> None:
    with LocalKafka(version=kafka_version(), data_dir=tmp_path / "kafka-data",
                    server_properties={"replica.fetch.wait.max.ms": "123", "num.partitions": "3"}) as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        resource = ConfigResource(ConfigResource.Type.BROKER, str(kafka.broker_id))
        configs = admin.describe_configs([resource])[resource].result(timeout=30)
        assert configs["replica.fetch.wait.max.ms"].value == "123"
        assert configs["num.partitions"].value == "3"  # one the launcher sets itself (1) is overridden too
