"""Running the pinned helm on helm/ (the chart) and reading what it renders.

Used by the chart's unit checks (tests/helm/test_chart.py) and by the integration test that runs
the rendered configuration (integration/deploy/test_chart_config.py). helm is found at
``$KSP_HELM``, else where ``make helm`` builds it; there is no fallback to a ``helm`` on PATH, whose
version would be anyone's.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
HELM_VERSION = "v3.22.0"  # the Makefile's HELM_VERSION
CACHED_HELM = Path.home() / ".cache" / "kafka-share-proxy" / f"helm-{HELM_VERSION}" / "helm"
HELM_ENV = "KSP_HELM"
RELEASE = "ksp"
NAMESPACE = "queues"
# The Kubernetes version `helm template`/`lint` render for. Chart.yaml requires >=1.21 (policy/v1
# PodDisruptionBudget), and a helm built with `go install` carries no version stamp: its default
# Kubernetes version is v1.20.0, which the chart refuses. So every render names one explicitly.
KUBE_VERSION = "1.30.0"


def find_binary(env: str, cached: Path) -> Path | None:
    """``$env`` if set (it must exist), else `cached` (where a make target builds it); None if neither."""
    explicit = os.environ.get(env)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{env}={explicit} is not an executable file")
        return path
    return cached if cached.is_file() and os.access(cached, os.X_OK) else None


def find_helm() -> Path | None:
    """``$KSP_HELM`` if set (it must exist), else the binary ``make helm`` caches; None if neither."""
    return find_binary(HELM_ENV, CACHED_HELM)


SKIP_REASON = (f"no helm binary: run `make helm` (builds helm {HELM_VERSION} with `go install` into "
               f"{CACHED_HELM.parent}) or set {HELM_ENV}")

# Prometheus's promtool, for the alert rules (tests/helm/test_alert_rules.py): ``make promtool``, not `make test`.
PROMTOOL_VERSION = "v0.316.0"  # the Makefile's PROMTOOL_VERSION (the Go module's version of Prometheus 3.16.0)
CACHED_PROMTOOL = Path.home() / ".cache" / "kafka-share-proxy" / f"promtool-{PROMTOOL_VERSION}" / "promtool"
PROMTOOL_ENV = "KSP_PROMTOOL"
PROMTOOL_SKIP_REASON = (f"no promtool: run `make promtool` (builds promtool {PROMTOOL_VERSION} with `go install` "
                        f"into {CACHED_PROMTOOL.parent}) or set {PROMTOOL_ENV}")


def find_promtool() -> Path | None:
    """``$KSP_PROMTOOL`` if set (it must exist), else the binary ``make promtool`` caches; None if neither."""
    return find_binary(PROMTOOL_ENV, CACHED_PROMTOOL)


class RenderError(RuntimeError):
    """helm refused the values (schema, or a template's `fail`); the message is helm's stderr."""


def helm(*args: str, helm_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm; `template` and `lint` get `--kube-version KUBE_VERSION` unless args name one."""
    binary = helm_path or find_helm()
    if binary is None:
        raise FileNotFoundError(SKIP_REASON)
    if args and args[0] in ("template", "lint") and "--kube-version" not in args:
        args = (*args, "--kube-version", KUBE_VERSION)
    # HOME and the XDG dirs are not touched: `helm template`/`lint` of a local chart read no repos.
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60)


def set_args(values: dict[str, str] | None) -> list[str]:
    return [arg for key, value in (values or {}).items() for arg in ("--set", f"{key}={value}")]


def render(values_files: Iterable[Path | str] = (), set_values: dict[str, str] | None = None,
           *, chart: Path = CHART, release: str = RELEASE, namespace: str = NAMESPACE) -> Manifests:
    """`helm template` the chart with these values; the manifests, or RenderError."""
    args = ["template", release, str(chart), "--namespace", namespace]
    for path in values_files:
        args += ["-f", str(path)]
    result = helm(*args, *set_args(set_values))
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return Manifests([doc for doc in yaml.safe_load_all(result.stdout) if doc])


def render_text(values_files: Iterable[Path | str] = (), set_values: dict[str, str] | None = None,
                *, chart: Path = CHART, show_only: str, release: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """One template's rendered text (`helm template --show-only`)."""
    args = ["template", release, str(chart), "--namespace", namespace, "--show-only", show_only]
    for path in values_files:
        args += ["-f", str(path)]
    result = helm(*args, *set_args(set_values))
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return result.stdout


@dataclass
class Manifests:
    """The documents one `helm template` rendered."""

    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [doc for doc in self.of_kind(kind) if name is None or doc["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        return found[0]

    def kinds(self) -> set[str]:
        return {doc["kind"] for doc in self.docs}

    @property
    def fullname(self) -> str:
        """The proxy ConfigMap's name: the chart's full name (the ConfigMap without a suffix)."""
        names = [doc["metadata"]["name"] for doc in self.of_kind("ConfigMap")]
        return min(names, key=len)

    def proxy_toml_text(self) -> str:
        return self.one("ConfigMap", self.fullname)["data"]["proxy.toml"]

    def proxy_toml(self) -> dict[str, Any]:
        """proxy.toml parsed, keys as written (dashes)."""
        return tomllib.loads(self.proxy_toml_text())

    def pod_spec(self) -> dict[str, Any]:
        """The Deployment's (scale-out: StatefulSet's) pod spec; in sidecar mode, a pod made of the
        sidecar ConfigMap's snippets."""
        deployments = self.of_kind("Deployment") or self.of_kind("StatefulSet")
        if deployments:
            return deployments[0]["spec"]["template"]["spec"]
        snippets = self.one("ConfigMap", f"{self.fullname}-sidecar")["data"]
        return {"containers": yaml.safe_load(snippets["container.yaml"]),
                "volumes": yaml.safe_load(snippets["volumes.yaml"])}

    def container(self) -> dict[str, Any]:
        (container,) = [c for c in self.pod_spec()["containers"] if c["name"] == "kafka-share-proxy"]
        return container


def container_ports(container: dict[str, Any]) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container["ports"]}


def mounts_by_path(container: dict[str, Any]) -> dict[str, str]:
    """mountPath -> volume name."""
    return {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}


def volumes_by_name(pod_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {volume["name"]: volume for volume in pod_spec.get("volumes", [])}


def write_values(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's literal environment (valueFrom entries are left out: no literal value)."""
    return {item["name"]: str(item["value"]) for item in container.get("env", []) if "value" in item}


def args_of(container: dict[str, Any]) -> Sequence[str]:
    return [str(arg) for arg in container.get("args", [])]
