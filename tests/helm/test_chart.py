"""The Helm chart (helm/) rendered by the pinned helm and read back as manifests.

Each helm/ci/*-values.yaml is linted (plain and --strict) and rendered once per module; the tests
then check what the issue asks of the chart against the rendered documents: ports equal to the
ports in the rendered proxy.toml, probes on the real health paths of the metrics port, the
security context, Secrets mounted where the config points, the config checksum, sidecar mode
without a Deployment, monitoring resources only when enabled and only on metrics that exist.
Values that break the schema or the chart's own rules are refused.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART, CI_VALUES, KUBE_VERSION, NAMESPACE, ROOT, SKIP_REASON, Manifests, RenderError, container_ports,
    find_helm, helm, mounts_by_path, render, render_text, volumes_by_name, write_values,
)

pytestmark = pytest.mark.skipif(find_helm() is None, reason=SKIP_REASON)

CI = {path.name.removesuffix("-values.yaml"): path for path in CI_VALUES}
SECRETS_DIR = "/var/run/secrets/kafka-share-proxy"
DOCS_METRICS = (ROOT / "docs" / "metrics.md").read_text()


def ci_values(name: str) -> dict[str, Any]:
    return yaml.safe_load(CI[name].read_text())


@pytest.fixture(scope="module")
def rendered() -> dict[str, Manifests]:
    """Every helm/ci values file rendered once: {"default": ..., "sidecar": ..., "tls-sasl": ...}."""
    return {name: render([path]) for name, path in CI.items()}


def test_the_three_example_values_files_exist() -> None:
    assert set(CI) == {"default", "sidecar", "tls-sasl"}


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
@pytest.mark.parametrize("name", sorted(CI))
def test_helm_lint_passes(name: str, strict: bool) -> None:
    result = helm("lint", str(CHART), "-f", str(CI[name]), *(["--strict"] if strict else []))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_helm_template_renders_every_example(rendered: dict[str, Manifests]) -> None:
    for name, manifests in rendered.items():
        assert manifests.docs, name
        for doc in manifests.docs:
            assert doc["apiVersion"] and doc["metadata"]["name"], (name, doc)
            assert doc["metadata"]["namespace"] == NAMESPACE, (name, doc["kind"])
    assert rendered["default"].kinds() == {"ConfigMap", "Deployment", "Service", "ServiceAccount",
                                           "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule"}


def test_kubernetes_before_1_21_is_refused() -> None:
    """Chart.yaml's kubeVersion: the PodDisruptionBudget is policy/v1, GA in Kubernetes 1.21."""
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.21.0-0"
    for version, accepted in (("1.20.0", False), ("1.21.0", True), (KUBE_VERSION, True)):
        result = helm("template", "x", str(CHART), "-f", str(CI["default"]), "--kube-version", version)
        assert (result.returncode == 0) is accepted, (version, result.stderr)
        if not accepted:
            assert "chart requires kubeVersion: >=1.21.0-0" in result.stderr
    assert rendered_pdb_api(KUBE_VERSION) == "policy/v1"


def rendered_pdb_api(kube_version: str) -> str:
    result = helm("template", "x", str(CHART), "-f", str(CI["default"]), "--kube-version", kube_version,
                  "--show-only", "templates/pdb.yaml")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["apiVersion"]


# -- refused values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "complaint"), [
    ("replicaCount: -1\n", "/replicaCount"),
    ("scaleOut:\n  enabled: 'yes'\n", "/scaleOut/enabled"),
    ("mode: bogus\n", "/mode"),
    ("proxy:\n  port: '9092'\n", "/proxy/port"),
    ("proxy:\n  prot: 9092\n", "prot"),  # a misspelt key (additionalProperties false)
    ("upstream:\n  securityProtocol: SASL_TLS\n", "/upstream/securityProtocol"),
    ("listener:\n  tls:\n    clientAuth: optional\n", "/listener/tls/clientAuth"),
    ("pdb:\n  maxUnavailable: 2\n", "/pdb/maxUnavailable"),
    ("config:\n  State.Topic: x\n", "State.Topic"),
], ids=["replicas-negative", "scale-out-string", "mode-bogus", "string-port", "unknown-key", "protocol", "client-auth", "pdb", "config-key"])
def test_a_values_file_that_violates_the_schema_is_refused(tmp_path: Path, text: str, complaint: str) -> None:
    bad = write_values(tmp_path, "bad-values.yaml", text)
    for command in (["template", "x", str(CHART)], ["lint", str(CHART)]):
        result = helm(*command, "-f", str(CI["default"]), "-f", str(bad))
        assert result.returncode != 0, (command, result.stdout)
        assert "schema" in (result.stdout + result.stderr), result.stdout + result.stderr
        assert complaint in result.stdout + result.stderr


@pytest.mark.parametrize(("values", "complaint"), [
    ({"upstream.securityProtocol": "SASL_SSL", "upstream.sasl.username": "p"}, "needs upstream.sasl.existingSecret"),
    ({"upstream.securityProtocol": "SASL_SSL", "upstream.sasl.existingSecret": "s"}, "needs upstream.sasl.username"),
    ({"upstream.tls.existingSecret": "ca"}, "upstream.tls.existingSecret is set but upstream.securityProtocol is PLAINTEXT"),
    ({"listener.tls.clientAuth": "required"}, "needs listener.tls.existingSecret"),
    ({"config.listen": "0.0.0.0:1"}, "config.listen is set by the chart"),
    ({"config.upstream_sasl_password": "hunter2"}, "config.upstream_sasl_password is set by the chart"),
    ({"config.my-password": "hunter2"}, "passwords do not go into the ConfigMap"),
    ({"service.type": "NodePort"}, "node-port range 30000-32767"),
    ({"proxy.metricsPort": "9094"}, "collides with proxy.port or proxy.metricsPort"),
    ({"proxy.brokerPortBase": "65531"}, "beyond 65535"),
    ({"mode": "sidecar", "sidecar.podSelector.app": "orders", "service.exposeMetrics": "false"},
     "the Service would have no port: the Kafka ports of a proxy listening on 127.0.0.1"),
    ({"proxy.metricsHost": "127.0.0.1"}, "the kubelet's HTTP probes come to the pod IP"),
    ({"proxy.metricsHost": "::1", "startupProbe.enabled": "false", "livenessProbe.enabled": "false",
      "readinessProbe.enabled": "false"}, "cannot be reached through the Service's metrics port"),
    ({"config.metrics_host": "0.0.0.0"}, "config.metrics_host is set by the chart"),
    ({"metrics.serviceMonitor.enabled": "true", "service.exposeMetrics": "false"}, "needs a Service with the metrics port"),
    ({"replicaCount": "2"}, "replicaCount above 1 needs scaleOut.enabled"),
    ({"mode": "sidecar", "sidecar.podSelector.app": "orders", "scaleOut.enabled": "true"},
     "cannot be combined with sidecar mode"),
], ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_values_the_proxy_could_not_run_with_are_refused(values: dict[str, str], complaint: str) -> None:
    with pytest.raises(RenderError) as refused:
        render([CI["default"]], values)
    assert complaint in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_the_upstream_cluster_is_required() -> None:
    with pytest.raises(RenderError, match="upstream.bootstrapServers is required"):
        render()  # values.yaml alone: no upstream


# -- ports ------------------------------------------------------------------------------------------


def expected_ports(toml: dict[str, Any], node_ids: list[int]) -> dict[str, int]:
    """What the proxy listens on, by the chart's port names, computed from the rendered proxy.toml."""
    listen_port = int(toml["listen"].rpartition(":")[2])
    base = toml.get("broker-port-base", listen_port + 1)
    return {"kafka": listen_port, **{f"broker-{n}": base + n for n in node_ids}}


@pytest.mark.parametrize("name", ["default", "tls-sasl"])
def test_container_and_service_ports_are_the_ports_in_proxy_toml(rendered: dict[str, Manifests], name: str) -> None:
    manifests = rendered[name]
    toml = manifests.proxy_toml()
    node_ids = (ci_values(name).get("proxy") or {}).get("brokerNodeIds") or yaml.safe_load(
        (CHART / "values.yaml").read_text())["proxy"]["brokerNodeIds"]
    expected = expected_ports(toml, node_ids) | {"metrics": toml["metrics-port"]}

    assert container_ports(manifests.container()) == expected
    service = manifests.one("Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == expected
    # No translation: the proxy advertises its own ports, so a Service port must equal its target.
    assert all(p["targetPort"] == p["port"] for p in service["spec"]["ports"])
    assert service["spec"]["selector"] == manifests.one("Deployment")["spec"]["selector"]["matchLabels"]
    assert toml["listen"].startswith("0.0.0.0:")
    assert toml["advertised-host"] == f"{manifests.fullname}.{NAMESPACE}.svc"


def test_broker_node_ids_and_port_base_follow_the_values() -> None:
    manifests = render([CI["default"]], {"proxy.port": "19092", "proxy.brokerPortBase": "20000",
                                         "proxy.brokerNodeIds": "{1,2,3}", "proxy.advertisedHost": "queues.example.com"})
    toml = manifests.proxy_toml()
    assert (toml["listen"], toml["broker-port-base"], toml["advertised-host"]) == \
        ("0.0.0.0:19092", 20000, "queues.example.com")
    ports = {p["name"]: p["port"] for p in manifests.one("Service")["spec"]["ports"]}
    assert ports == {"kafka": 19092, "broker-1": 20001, "broker-2": 20002, "broker-3": 20003, "metrics": 9404}


def test_node_port_service_pins_each_node_port_to_its_port() -> None:
    manifests = render([CI["default"]], {"service.type": "NodePort", "proxy.port": "30092",
                                         "proxy.brokerNodeIds": "{0,1,2}"})
    ports = manifests.one("Service")["spec"]["ports"]
    kafka_ports = [p for p in ports if p["name"] != "metrics"]
    assert [(p["port"], p["nodePort"]) for p in kafka_ports] == [(30092, 30092), (30093, 30093), (30094, 30094), (30095, 30095)]
    assert "nodePort" not in next(p for p in ports if p["name"] == "metrics")


# -- probes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "tls-sasl"])
def test_probes_ask_healthz_and_readyz_on_the_metrics_port(rendered: dict[str, Manifests], name: str) -> None:
    manifests = rendered[name]
    container = manifests.container()
    metrics_port = manifests.proxy_toml()["metrics-port"]
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = container[probe]["httpGet"]
        assert container_ports(container)[action["port"]] == metrics_port, probe
        paths[probe] = action["path"]
    assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}


def test_a_loopback_sidecar_keeps_kafka_on_loopback_but_is_probed_over_http(rendered: dict[str, Manifests]) -> None:
    """Kafka on 127.0.0.1 (the pod's own containers only); metrics and health on 0.0.0.0, so the
    kubelet's httpGet probes reach them on the pod IP."""
    manifests = rendered["sidecar"]
    toml = manifests.proxy_toml()
    assert toml["listen"].startswith("127.0.0.1:") and toml["advertised-host"] == "127.0.0.1"
    assert toml["metrics-host"] == "0.0.0.0"
    container = manifests.container()
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "ksp-metrics"}, probe
        assert "exec" not in container[probe], probe
    assert container_ports(container)["ksp-metrics"] == toml["metrics-port"]


@pytest.mark.parametrize("name", sorted(CI))
def test_metrics_host_is_always_in_proxy_toml(rendered: dict[str, Manifests], name: str) -> None:
    assert rendered[name].proxy_toml()["metrics-host"] == "0.0.0.0"


def test_metrics_host_follows_the_value() -> None:
    assert render([CI["default"]], {"proxy.metricsHost": "::"}).proxy_toml()["metrics-host"] == "::"


def test_a_loopback_sidecar_with_a_pod_selector_gets_a_metrics_only_service() -> None:
    """Prometheus can scrape a loopback sidecar through a Service; its Kafka ports stay out of it."""
    manifests = render([CI["sidecar"]], {"sidecar.podSelector.app": "orders",
                                         "metrics.serviceMonitor.enabled": "true"})
    service = manifests.one("Service")
    assert service["spec"]["selector"] == {"app": "orders"}
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [("metrics", 9404, 9404)]
    assert manifests.one("ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"
    assert manifests.proxy_toml()["listen"].startswith("127.0.0.1:")


def test_a_sidecar_on_all_interfaces_with_a_service_gets_http_probes_and_a_service() -> None:
    manifests = render([CI["sidecar"]], {"sidecar.podSelector.app": "orders", "proxy.listenHost": "0.0.0.0",
                                         "proxy.advertisedHost": "orders-queue.apps.svc"})
    container = manifests.container()
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ksp-metrics"}
    assert container_ports(container)["ksp-metrics"] == 9404
    service = manifests.one("Service")
    assert service["spec"]["selector"] == {"app": "orders"}
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}["kafka"] == 9092


# -- security context -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CI))
def test_the_container_runs_unprivileged_on_a_read_only_root(rendered: dict[str, Manifests], name: str) -> None:
    manifests = rendered[name]
    context = manifests.container()["securityContext"]
    assert context["runAsNonRoot"] is True
    assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    # The only writable place is an emptyDir on /tmp.
    tmp_volume = volumes_by_name(manifests.pod_spec())[mounts_by_path(manifests.container())["/tmp"]]
    assert "emptyDir" in tmp_volume
    if name != "sidecar":
        pod = manifests.pod_spec()
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["automountServiceAccountToken"] is False


def test_the_deployment_never_runs_two_proxies(rendered: dict[str, Manifests]) -> None:
    deployment = rendered["default"].one("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert rendered["default"].one("PodDisruptionBudget")["spec"]["selector"] == deployment["spec"]["selector"]
    # The ci file's spread constraint gets the chart's selector when it names none.
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"] == deployment["spec"]["selector"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"


def test_scale_out_runs_a_stateful_set_of_instances_each_advertised_at_its_own_dns_name() -> None:
    manifests = render([CI["default"]], {"scaleOut.enabled": "true", "replicaCount": "3",
                                         "scaleOut.ownershipSessionTimeoutMs": "15000"})
    assert "Deployment" not in manifests.kinds()
    stateful = manifests.one("StatefulSet")
    fullname = manifests.fullname
    assert stateful["spec"]["replicas"] == 3
    assert stateful["spec"]["serviceName"] == f"{fullname}-pods"
    assert stateful["spec"]["podManagementPolicy"] == "Parallel"
    assert stateful["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    (container,) = stateful["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["KSP_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KSP_ADVERTISED_HOST"]["value"] == f"$(KSP_INSTANCE_ID).{fullname}-pods.{NAMESPACE}.svc"
    assert env["KSP_OWNERSHIP_SESSION_TIMEOUT_MS"]["value"] == "15000"
    # The variable it expands is defined before it (Kubernetes expands only earlier ones).
    names = [e["name"] for e in container["env"]]
    assert names.index("KSP_INSTANCE_ID") < names.index("KSP_ADVERTISED_HOST")
    headless = manifests.one("Service", f"{fullname}-pods")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == stateful["spec"]["selector"]["matchLabels"]
    ordinary = manifests.one("Service", fullname)  # clients still bootstrap through it
    assert {p["port"] for p in headless["spec"]["ports"]} <= {p["port"] for p in ordinary["spec"]["ports"]}
    # A fixed broker port base is in proxy.toml: every instance computes the others' ports from it.
    assert "broker-port-base" in manifests.proxy_toml()
    assert manifests.one("PodDisruptionBudget")["spec"]["selector"] == stateful["spec"]["selector"]


def test_without_scale_out_no_stateful_set_or_headless_service_is_rendered(rendered: dict[str, Manifests]) -> None:
    for manifests in rendered.values():
        assert "StatefulSet" not in manifests.kinds()
        assert not [s for s in manifests.of_kind("Service") if s["metadata"]["name"].endswith("-pods")]


def test_tmp_without_a_size_limit_is_still_an_empty_dir() -> None:
    manifests = render([CI["default"]], {"tmpSizeLimit": "null"})
    assert volumes_by_name(manifests.pod_spec())["ksp-tmp"] == {"name": "ksp-tmp", "emptyDir": {}}


# -- configuration and Secrets ----------------------------------------------------------------------


def test_the_config_map_is_mounted_where_the_image_reads_proxy_toml(rendered: dict[str, Manifests]) -> None:
    for manifests in rendered.values():
        volume = volumes_by_name(manifests.pod_spec())[mounts_by_path(manifests.container())["/etc/kafka-share-proxy"]]
        assert volume["configMap"]["name"] == manifests.fullname
        assert "proxy.toml" in manifests.one("ConfigMap", manifests.fullname)["data"]


def secret_file(manifests: Manifests, path: str) -> tuple[str, str]:
    """(Secret name, key) behind a file path inside the container, from its mounts and volumes."""
    directory, _, key = path.rpartition("/")
    volume = volumes_by_name(manifests.pod_spec())[mounts_by_path(manifests.container())[directory]]
    secret = volume["secret"]
    if "items" in secret:
        (item,) = [i for i in secret["items"] if i["path"] == key]
        key = item["key"]
    return secret["secretName"], key


def test_tls_and_sasl_settings_point_into_the_mounted_existing_secrets(rendered: dict[str, Manifests]) -> None:
    manifests, values = rendered["tls-sasl"], ci_values("tls-sasl")
    toml = manifests.proxy_toml()
    listener, up_tls, sasl = values["listener"]["tls"], values["upstream"]["tls"], values["upstream"]["sasl"]
    expected = {
        "listener-ssl-certificate-location": (listener["existingSecret"], "tls.crt", "listener-tls"),
        "listener-ssl-key-location": (listener["existingSecret"], "tls.key", "listener-tls"),
        "upstream-ssl-ca-location": (up_tls["existingSecret"], up_tls["caKey"], "upstream-tls"),
        "upstream-sasl-password-file": (sasl["existingSecret"], sasl["passwordKey"], "upstream-sasl"),
    }
    for option, (secret, key, mount) in expected.items():
        assert toml[option] == f"{SECRETS_DIR}/{mount}/{key}", option
        assert secret_file(manifests, toml[option]) == (secret, key), option
    assert toml["upstream-security-protocol"] == "SASL_SSL"
    assert (toml["upstream-sasl-mechanism"], toml["upstream-sasl-username"]) == ("SCRAM-SHA-512", sasl["username"])
    assert toml["listener-ssl-client-auth"] == "none" and toml["listener-ssl-reload-interval-ms"] > 0
    # Whole Secrets are mounted (a subPath mount would not see a renewed certificate).
    assert all("subPath" not in mount for mount in manifests.container()["volumeMounts"])


def test_mtls_options_add_the_client_ca_and_upstream_client_certificate() -> None:
    manifests = render([CI["tls-sasl"]], {"listener.tls.clientAuth": "required", "upstream.tls.clientCertificate": "true",
                                          "upstream.tls.keyPasswordKey": "key-password"})
    toml = manifests.proxy_toml()
    assert toml["listener-ssl-ca-location"] == f"{SECRETS_DIR}/listener-tls/ca.crt"
    assert toml["listener-ssl-client-auth"] == "required"
    assert secret_file(manifests, toml["upstream-ssl-certificate-location"]) == ("my-cluster-cluster-ca-cert", "tls.crt")
    assert secret_file(manifests, toml["upstream-ssl-key-password-file"]) == ("my-cluster-cluster-ca-cert", "key-password")


def test_no_password_in_any_config_map_or_env(rendered: dict[str, Manifests]) -> None:
    for name, manifests in rendered.items():
        for config_map in manifests.of_kind("ConfigMap"):
            for key, value in config_map["data"].items():
                if key == "proxy.toml":
                    secrets = [k for k in manifests.proxy_toml() if "password" in k and not k.endswith("-file")]
                    assert secrets == [], (name, secrets)
        for item in manifests.container().get("env", []):
            assert "PASSWORD" not in item["name"] or item["name"].endswith("_FILE"), (name, item)


def test_the_free_form_config_map_renders_typed_toml() -> None:
    manifests = render([CI["default"]], {"config.state-topic": "orders-state", "config.share_events_enable": "false",
                                         "config.share-read-cache-bytes": "134217728"})
    toml = manifests.proxy_toml()
    assert toml["state-topic"] == "orders-state"
    assert toml["share-events-enable"] is False
    assert toml["share-read-cache-bytes"] == 134217728  # an integer, not 1.34217728e+08
    assert toml["share-delivery-count-limit"] == 5 and toml["state-topic-partitions"] == 6  # the ci file's


def test_checksum_annotation_is_the_config_hash_and_follows_config_changes(rendered: dict[str, Manifests]) -> None:
    manifests = rendered["default"]
    annotation = manifests.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert annotation == hashlib.sha256(manifests.proxy_toml_text().encode()).hexdigest()
    changed = render([CI["default"]], {"config.share-delivery-count-limit": "6"})
    unchanged = render([CI["default"]], {"resources.requests.cpu": "1"})
    assert changed.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != annotation
    assert unchanged.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"] == annotation


# -- sidecar mode -----------------------------------------------------------------------------------


def test_sidecar_mode_renders_no_deployment_of_its_own(rendered: dict[str, Manifests]) -> None:
    manifests = rendered["sidecar"]
    assert manifests.kinds() == {"ConfigMap"}
    sidecar = manifests.one("ConfigMap", f"{manifests.fullname}-sidecar")["data"]
    (container,) = yaml.safe_load(sidecar["container.yaml"])
    volumes = {v["name"]: v for v in yaml.safe_load(sidecar["volumes.yaml"])}
    assert container["name"] == "kafka-share-proxy"
    assert {m["name"] for m in container["volumeMounts"]} <= set(volumes)
    assert volumes["ksp-config"]["configMap"]["name"] == manifests.fullname
    assert sidecar["checksum"] == hashlib.sha256(manifests.proxy_toml_text().encode()).hexdigest()
    # Names that cannot collide with the host pod's own ports and volumes.
    assert all(port["name"].startswith("ksp-") for port in container["ports"])
    assert all(name.startswith("ksp-") for name in volumes)


def test_a_parent_chart_can_include_the_sidecar_templates(tmp_path: Path) -> None:
    """An application chart with this chart as a dependency puts the proxy into its own pod."""
    parent = tmp_path / "orders"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "kafka-share-proxy", ignore=shutil.ignore_patterns("ci"))
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: orders\nversion: 1.0.0\n"
                                       "dependencies:\n  - name: kafka-share-proxy\n    version: 0.1.0\n")
    (parent / "values.yaml").write_text("kafka-share-proxy:\n  mode: sidecar\n  upstream:\n"
                                        "    bootstrapServers: [kafka:9092]\n")
    (parent / "templates" / "deployment.yaml").write_text("""\
{{- $ksp := dict "Values" (index .Values "kafka-share-proxy") "Release" .Release "Chart" (dict "Name" "kafka-share-proxy" "AppVersion" "0.1.0" "Version" "0.1.0") }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: orders
spec:
  replicas: 1
  selector:
    matchLabels: {app: orders}
  template:
    metadata:
      labels: {app: orders}
      annotations:
        checksum/kafka-share-proxy: {{ include "kafka-share-proxy.configChecksum" $ksp }}
    spec:
      containers:
        - name: orders
          image: orders:1
          env:
            - {name: BOOTSTRAP_SERVERS, value: "localhost:9092"}
        {{- include "kafka-share-proxy.container" $ksp | nindent 8 }}
      volumes:
        {{- include "kafka-share-proxy.volumes" $ksp | nindent 8 }}
""")
    manifests = render(chart=parent, release="orders")
    pod = manifests.one("Deployment", "orders")["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["orders", "kafka-share-proxy"]
    config_map = manifests.one("ConfigMap", "orders-kafka-share-proxy")
    assert volumes_by_name(pod["spec"])["ksp-config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert pod["metadata"]["annotations"]["checksum/kafka-share-proxy"] == \
        hashlib.sha256(config_map["data"]["proxy.toml"].encode()).hexdigest()
    assert manifests.of_kind("Deployment") == [manifests.one("Deployment", "orders")]


# -- NOTES.txt ------------------------------------------------------------------------------------


def test_install_notes_render_for_every_example(tmp_path: Path) -> None:
    """NOTES.txt is only rendered by `helm install`, which needs a cluster; its text is the named
    template kafka-share-proxy.notes, rendered here through a copy of the chart with one more file."""
    chart = tmp_path / "kafka-share-proxy"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "notes-check.yaml").write_text('notes: {{ include "kafka-share-proxy.notes" . | toJson }}\n')
    assert (CHART / "templates" / "NOTES.txt").read_text().strip() == '{{ include "kafka-share-proxy.notes" . }}'
    for name, path in CI.items():
        notes = yaml.safe_load(render_text([path], chart=chart, show_only="templates/notes-check.yaml"))["notes"]
        assert "ONE proxy per Kafka cluster" in notes, name
        if name == "sidecar":
            assert "127.0.0.1:9092" in notes and "container\\.yaml" in notes
            assert "served\non 0.0.0.0:9404 (the pod IP)" in notes, notes
        else:
            assert f"ksp-kafka-share-proxy.{NAMESPACE}.svc:9092" in notes, notes


# -- monitoring -------------------------------------------------------------------------------------


def test_monitoring_resources_only_when_enabled(rendered: dict[str, Manifests]) -> None:
    assert not {"ServiceMonitor", "PrometheusRule"} & (rendered["tls-sasl"].kinds() | rendered["sidecar"].kinds())
    monitor = rendered["default"].one("ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    service_labels = rendered["default"].one("Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()


def test_every_alert_uses_metrics_and_labels_that_docs_metrics_md_documents(rendered: dict[str, Manifests]) -> None:
    (group,) = rendered["default"].one("PrometheusRule")["spec"]["groups"]
    rules = {rule["alert"]: rule["expr"] for rule in group["rules"]}
    used: set[str] = set()
    for alert, expr in rules.items():
        names = set(re.findall(r"\bksp_[a-z_]+", expr))
        assert names, alert
        for metric in names:
            assert f"`{metric}" in DOCS_METRICS, (alert, metric)
        used |= names
    # The four concerns the issue names: state-write failures, archiving, stale IN_PROGRESS, lag growth.
    assert {"ksp_share_state_writes_total", "ksp_share_state_writable", "ksp_share_group_records_archived_total",
            "ksp_share_group_records_in_progress_stale", "ksp_share_group_lag_records"} <= used
    assert 'outcome="failed"' in rules["KafkaShareProxyStateWriteFailures"] and "`failed`" in DOCS_METRICS
    for reason in re.search(r'reason=~"([^"]+)"', rules["KafkaShareProxyRecordsArchived"])[1].split("|"):
        assert f"`{reason}`" in DOCS_METRICS, reason
    assert "deriv(ksp_share_group_lag_records" in rules["KafkaShareProxyLagGrowing"]
    # The read-cache budget: what it drops against what is read, per pod, over the values' window.
    assert re.fullmatch(r"\(sum by \(namespace, pod\) \(rate\(ksp_share_read_cache_evicted_bytes_total\{[^}]*\}\[15m\]\)\)"
                        r" / sum by \(namespace, pod\) \(rate\(ksp_share_upstream_fetch_bytes_total\{[^}]*\}\[15m\]\)\)\)"
                        r" > 0\.25", rules["KafkaShareProxyReadCacheTooSmall"]), rules["KafkaShareProxyReadCacheTooSmall"]


def test_read_cache_alert_takes_its_threshold_window_and_duration_from_values(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"  # a file: `--set` passes 0.5 as a string, which the schema refuses
    values.write_text(yaml.safe_dump({"metrics": {"prometheusRule": {"readCacheTooSmall": {
        "threshold": 0.5, "window": "1h", "for": "2h"}}}}))
    manifests = render([CI["default"], values])
    (group,) = manifests.one("PrometheusRule")["spec"]["groups"]
    (rule,) = [rule for rule in group["rules"] if rule["alert"] == "KafkaShareProxyReadCacheTooSmall"]
    assert rule["expr"].endswith(") > 0.5") and rule["expr"].count("[1h]") == 2, rule["expr"]
    assert rule["for"] == "2h"


def test_scale_out_over_tls_listeners_verifies_the_other_pods_with_the_secrets_ca() -> None:
    """Instances call each other on their TLS listeners (share-state RPCs): the Secret's CA
    (cert-manager puts it in ca.crt) verifies the other pods' certificates."""
    manifests = render([CI["tls-sasl"]], {"scaleOut.enabled": "true", "replicaCount": "3"})
    toml = manifests.proxy_toml()
    assert toml["peer-ssl-ca-location"] == f"{SECRETS_DIR}/listener-tls/ca.crt"
    assert secret_file(manifests, toml["peer-ssl-ca-location"]) == (ci_values("tls-sasl")["listener"]["tls"]["existingSecret"],
                                                                    "ca.crt")
    assert "peer-ssl-ca-location" not in render([CI["tls-sasl"]], {}).proxy_toml()  # one instance: no peers
