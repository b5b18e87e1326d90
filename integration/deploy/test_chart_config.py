"""The Helm chart's rendered configuration, run by the real `share-proxy serve` against real Kafka.

What `helm template` renders for the pod -- proxy.toml from the ConfigMap, the container's args and
environment, its probes, its Secret volumes -- is run here as the image would run it (entrypoint
`share-proxy serve`, KSP_CONFIG naming the image's defaults and the mounted proxy.toml) against the
session's local broker: the probes the chart configured answer 200 (/healthz, then /readyz once the
share state is replayed), and a client gets metadata through the proxy, with the broker addresses
the chart's advertised host and ports promise. The same for the TLS listener + SASL_SSL example
against the secured broker. A loopback sidecar's config runs as rendered (Kafka on 127.0.0.1,
metrics-host 0.0.0.0): its HTTP probes answer on a non-loopback address of this machine, standing in
for the pod IP the kubelet probes, where its Kafka port refuses connections.

Two things differ from a pod, and only these:
- the listen host becomes 127.0.0.1 and the ports free ones: tests share this machine (and CI
  runs several suites at once), so 9092-9098/9404 may be taken. The chart's ports equal to the
  proxy's are checked by tests/helm/test_chart.py on the rendered manifests; here each probe's
  named port is followed to the rendered port and then to its replacement.
- the Secret mounts under /var/run/secrets/kafka-share-proxy/ become temporary directories holding
  the files each mounted Secret would (by the volumes' secret names, keys and items).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from integration.kafka_fixtures import (
    admin_client, create_topic, log_tail, share_proxy_executable, terminate, unique_name, wait_for_ready_line,
)
from proxy.localkafka.broker import die_with_parent
from proxy.localkafka.config import password
from tests.helm.chart import CI_VALUES, ROOT, SKIP_REASON, Manifests, container_ports, find_helm, render

pytestmark = pytest.mark.skipif(find_helm() is None, reason=SKIP_REASON)

CI = {path.name.removesuffix("-values.yaml"): path for path in CI_VALUES}
CONFIG_MOUNT = "/etc/kafka-share-proxy"
SECRETS_MOUNT = "/var/run/secrets/kafka-share-proxy"
# The image's first KSP_CONFIG file (docker/defaults.toml, owned by the image's Dockerfile); the
# chart's proxy.toml sets every key it does, so without it (a branch before the image) the result
# is the same.
IMAGE_DEFAULTS = ROOT / "docker" / "defaults.toml"
STARTUP_TIMEOUT = 60.0


def values_for(bootstrap: str, **more: str) -> dict[str, str]:
    """The upstream set to the local broker, and a state topic of this test's own: every test's
    proxy has one, since they share the session's broker (one proxy per state topic)."""
    return {"upstream.bootstrapServers": "{" + bootstrap + "}",
            "config.state-topic": f"__share_proxy_state_{unique_name('chart')}", **more}


def free_port_block(offsets: list[int]) -> int:
    """A base port B such that B + each offset can be bound on 127.0.0.1 now."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + max(offsets) > 65000:
            continue
        try:
            held = []
            for offset in offsets:
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise RuntimeError("no free block of ports")


@dataclass
class RunnableConfig:
    """The rendered pod turned into a command line here: config files, environment, port mapping."""

    command: list[str]
    env: dict[str, str]
    ports: dict[int, int]  # rendered port -> port used here
    toml: dict[str, Any]   # the rendered proxy.toml (before rewriting)
    config_path: Path

    def port(self, rendered: int) -> int:
        return self.ports[rendered]


def materialise(manifests: Manifests, tmp_path: Path, secret_files: dict[str, dict[str, str | Path]]) -> RunnableConfig:
    """Write proxy.toml and the Secret files where this test's stand-in mounts are; map the ports."""
    toml = manifests.proxy_toml()
    text = manifests.proxy_toml_text()
    container = manifests.container()
    pod = manifests.pod_spec()

    # Secret volumes: each mount under SECRETS_MOUNT gets a directory with the Secret's keys as files.
    secrets_root = tmp_path / "secrets"
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert mount["mountPath"].startswith(SECRETS_MOUNT + "/"), mount
        directory = secrets_root / mount["mountPath"].removeprefix(SECRETS_MOUNT + "/")
        directory.mkdir(parents=True)
        contents = secret_files[secret["secretName"]]
        items = secret.get("items") or [{"key": key, "path": key} for key in contents]
        for item in items:
            source = contents[item["key"]]
            if isinstance(source, Path):
                shutil.copyfile(source, directory / item["path"])
            else:
                (directory / item["path"]).write_text(source + "\n")
    text = text.replace(SECRETS_MOUNT + "/", str(secrets_root) + "/")

    # Ports: the bootstrap port, each broker port the chart declares, the metrics port.
    listen_port = int(toml["listen"].rpartition(":")[2])
    rendered_base = toml["broker-port-base"]
    broker_ids = [port - rendered_base for name, port in container_ports(container).items() if "broker-" in name]
    offsets = [0, 1, *(2 + node for node in broker_ids)]
    base = free_port_block(offsets)
    new_listen, new_metrics, new_broker_base = base, base + 1, base + 2
    ports = {listen_port: new_listen, toml["metrics-port"]: new_metrics,
             **{rendered_base + node: new_broker_base + node for node in broker_ids}}
    text = re.sub(r'^listen = .*$', f'listen = "127.0.0.1:{new_listen}"', text, count=1, flags=re.MULTILINE)
    text = re.sub(r'^broker-port-base = .*$', f"broker-port-base = {new_broker_base}", text, count=1, flags=re.MULTILINE)
    text = re.sub(r'^metrics-port = .*$', f"metrics-port = {new_metrics}", text, count=1, flags=re.MULTILINE)

    # The ConfigMap mount: proxy.toml in a directory standing for /etc/kafka-share-proxy.
    config_dir = tmp_path / CONFIG_MOUNT.lstrip("/")
    config_dir.mkdir(parents=True)
    config_path = config_dir / "proxy.toml"
    config_path.write_text(text)

    layers = [str(IMAGE_DEFAULTS)] if IMAGE_DEFAULTS.is_file() else []
    env = {key: value for key, value in os.environ.items() if not key.startswith("KSP_")}
    env["KSP_CONFIG"] = ",".join([*layers, str(config_path)])
    for item in container.get("env", []):
        assert "value" in item, f"env {item['name']} is not a literal; this test would need its source"
        env[item["name"]] = str(item["value"])
    # The image's ENTRYPOINT is `share-proxy serve`; the container's args are appended to it.
    command = [share_proxy_executable(), "serve", *(str(arg) for arg in container.get("args", []))]
    return RunnableConfig(command, env, ports, toml, config_path)


@contextmanager
def running(config: RunnableConfig, log_path: Path) -> Iterator[subprocess.Popen[str]]:
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            config.command, env=config.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
            start_new_session=True,
            preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else None,
        )
    try:
        yield process
    finally:
        terminate(process)


def http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def probe_url(container: dict[str, Any], probe: str, config: RunnableConfig,
              host: str = "127.0.0.1") -> tuple[str, float]:
    """The URL the kubelet would ask for an httpGet probe (named port -> rendered -> port used here)."""
    action = container[probe]["httpGet"]
    port = action["port"]
    rendered = container_ports(container)[port] if isinstance(port, str) else port
    return f"http://{host}:{config.port(rendered)}{action['path']}", float(container[probe]["timeoutSeconds"])


def wait_for_status(url: str, timeout_s: float, budget: float, process: subprocess.Popen[str], log_path: Path) -> float:
    """Poll until 200; the seconds it took."""
    start = time.monotonic()
    seen: list[int | None] = []
    while time.monotonic() - start < budget:
        status = http_status(url, timeout_s)
        if status == 200:
            return time.monotonic() - start
        seen.append(status)
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200 (seen {sorted(set(map(str, seen)))}, exit {process.poll()}):\n"
                         f"{log_tail(log_path)}")


def check_probes(manifests: Manifests, config: RunnableConfig, process: subprocess.Popen[str], log_path: Path,
                 host: str = "127.0.0.1") -> None:
    """The chart's three probes answer 200 on `host` (the stand-in for the pod IP)."""
    container = manifests.container()
    startup = container["startupProbe"]
    # /healthz within the startup probe's whole budget, as the kubelet would allow.
    url, timeout = probe_url(container, "startupProbe", config, host)
    assert url.endswith("/healthz")
    wait_for_status(url, timeout, startup["periodSeconds"] * startup["failureThreshold"], process, log_path)
    url, timeout = probe_url(container, "livenessProbe", config, host)
    assert url.endswith("/healthz") and http_status(url, timeout) == 200
    # /readyz once the share state is replayed and the listeners are open.
    url, timeout = probe_url(container, "readinessProbe", config, host)
    assert url.endswith("/readyz")
    wait_for_status(url, timeout, STARTUP_TIMEOUT, process, log_path)
    match = wait_for_ready_line(process, STARTUP_TIMEOUT, "share-proxy serve (chart config)", log_path)
    assert int(match["port"]) == config.port(int(config.toml["listen"].rpartition(":")[2]))


def check_metadata(config: RunnableConfig, client_config: dict[str, str], broker_id: int, expect_topic: str | None,
                   log_path: Path, advertised_host: str | None = None) -> None:
    """A client bootstrapping from the proxy gets metadata naming the chart's advertised addresses."""
    bootstrap = f"127.0.0.1:{config.port(int(config.toml['listen'].rpartition(':')[2]))}"
    admin = admin_client(bootstrap, client_config)
    try:
        metadata = admin.list_topics(timeout=20)
    except KafkaException as error:  # what the proxy saw is the cause worth reading
        raise AssertionError(f"no metadata through the proxy: {error}; its log:\n"
                             f"{log_tail(log_path)}") from error
    advertised = {(broker.host, broker.port) for broker in metadata.brokers.values()}
    host = advertised_host or config.toml["advertised-host"]
    assert advertised == {(host, config.port(config.toml["broker-port-base"] + broker_id))}
    if expect_topic is not None:
        assert expect_topic in metadata.topics


def test_the_default_values_run_the_proxy_against_kafka(kafka, tmp_path: Path) -> None:
    # extraArgs and extraEnv reach the proxy as the image would pass them: a flag over the file's
    # advertised-host, a KSP_* variable for an option the file does not set.
    manifests = render([CI["default"]], values_for(kafka.bootstrap, **{
        "extraArgs": "{--advertised-host,localhost}",
        "extraEnv[0].name": "KSP_SHARE_AUTHORIZATION", "extraEnv[0].value": "off"}))
    config = materialise(manifests, tmp_path, {})
    assert config.toml["upstream"] == [kafka.bootstrap]
    assert config.toml["advertised-host"] == f"{manifests.fullname}.queues.svc"
    assert config.command[-2:] == ["--advertised-host", "localhost"] and config.env["KSP_SHARE_AUTHORIZATION"] == "off"
    topic = create_topic(kafka.bootstrap, unique_name("chart-default"))
    log_path = tmp_path / "serve.log"
    with running(config, log_path) as process:
        check_probes(manifests, config, process, log_path)
        check_metadata(config, {}, kafka.broker_id, topic, log_path, advertised_host="localhost")
    log = log_path.read_text()
    assert "Traceback" not in log
    assert '"event": "share authorization: off' in log  # a JSON line (log-json = true)


def test_the_tls_sasl_values_run_the_proxy_against_a_sasl_ssl_cluster(secured_kafka, tmp_path: Path) -> None:
    manifests = render([CI["tls-sasl"]], values_for(secured_kafka.bootstrap, **{"upstream.sasl.username": "admin"}))
    values = manifests.proxy_toml()
    assert values["upstream-security-protocol"] == "SASL_SSL"
    certificate, key = secured_kafka.certificates.issue(
        "chart-proxy", hosts=("127.0.0.1", "localhost", values["advertised-host"]))
    container = manifests.container()
    secret_names = {volume["name"]: volume["secret"]["secretName"]
                    for volume in manifests.pod_spec()["volumes"] if "secret" in volume}
    # What each existing Secret would hold in a cluster: a kubernetes.io/tls listener certificate,
    # the cluster CA, the service user's password (the secured broker's admin).
    config = materialise(manifests, tmp_path, {
        secret_names["ksp-listener-tls"]: {"tls.crt": Path(certificate), "tls.key": Path(key), "ca.crt": secured_kafka.ca_path},
        secret_names["ksp-upstream-tls"]: {"ca.crt": secured_kafka.ca_path},
        secret_names["ksp-upstream-sasl"]: {"password": password("admin")},
    })
    assert "admin-secret" not in config.config_path.read_text()
    assert not any("PASSWORD" in name for name in config.env if name.startswith("KSP_")), container.get("env")
    log_path = tmp_path / "serve.log"
    with running(config, log_path) as process:
        check_probes(manifests, config, process, log_path)
        # alice, over TLS to the proxy (its certificate from the cluster's CA), her SCRAM passed through.
        alice = secured_kafka.client_config("alice")
        check_metadata(config, {key: value for key, value in alice.items() if key != "bootstrap.servers"},
                       secured_kafka.broker_id, None, log_path)
    log = log_path.read_text()
    assert "Traceback" not in log and password("admin") not in log


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than 127.x, to stand in for a pod IP: the host name's,
    else the first of `hostname -I`, else of `ip -4 addr`; None if there is none."""
    candidates: list[str] = []
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    for command in (["hostname", "-I"], ["ip", "-4", "-o", "addr", "show"]):
        try:
            output = subprocess.run(command, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        candidates += re.findall(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])", output)
    for address in candidates:
        if address.startswith("127.") or address.startswith("0.") or address.endswith(".255"):
            continue
        with socket.socket() as sock:
            try:
                sock.bind((address, 0))  # one of this machine's own addresses
            except OSError:
                continue
        return address
    return None


def test_a_loopback_sidecar_is_probed_on_the_pod_ip_while_kafka_stays_on_loopback(kafka, tmp_path: Path) -> None:
    """The sidecar's rendered config: Kafka listeners on 127.0.0.1, metrics-host 0.0.0.0. The
    kubelet's httpGet probes, asked at another address of this machine (the pod IP's stand-in),
    answer 200; the Kafka bootstrap port at that address refuses the connection, while clients in
    the pod (127.0.0.1) get metadata."""
    pod_ip = non_loopback_address()
    if pod_ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to stand in for a pod IP")
    manifests = render([CI["sidecar"]], values_for(kafka.bootstrap))
    config = materialise(manifests, tmp_path, {})
    assert config.toml["listen"].startswith("127.0.0.1:") and config.toml["advertised-host"] == "127.0.0.1"
    assert config.toml["metrics-host"] == "0.0.0.0"
    assert 'metrics-host = "0.0.0.0"' in config.config_path.read_text()  # run as rendered
    container = manifests.container()
    assert all("httpGet" in container[probe] for probe in ("startupProbe", "livenessProbe", "readinessProbe"))
    log_path = tmp_path / "serve.log"
    with running(config, log_path) as process:
        check_probes(manifests, config, process, log_path, host=pod_ip)
        metrics_url = f"http://{pod_ip}:{config.port(config.toml['metrics-port'])}/metrics"
        assert http_status(metrics_url, 5) == 200  # a scrape from outside the pod
        # Kafka stays inside the pod: its bootstrap port is not open on the pod IP...
        bootstrap_port = config.port(int(config.toml["listen"].rpartition(":")[2]))
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((pod_ip, bootstrap_port), timeout=5).close()
        # ...and is on loopback, advertising 127.0.0.1 to the pod's applications.
        check_metadata(config, {}, kafka.broker_id, None, log_path)
    log = log_path.read_text()
    assert "Traceback" not in log
