"""The image's contract, read from Dockerfile and .dockerignore (no Docker needed).

What docs/deployment.md promises and the Helm chart relies on: a pinned slim base, two stages
with only the virtualenv copied into the runtime, a numeric non-root user, `share-proxy serve` as
the entrypoint, the layered KSP_CONFIG, the ports, and a build context that holds what
`pip install .` needs and nothing local.
"""

from __future__ import annotations

import re
import tomllib

import pytest

from integration.deploy.dockerfile import (
    ROOT,
    build_context_files,
    dockerignore_patterns,
    logical_lines,
    parse_dockerfile,
    read_dockerfile,
)

DOCKERFILE = read_dockerfile()
FINAL = DOCKERFILE.final
IMAGE_DEFAULTS = "/opt/kafka-share-proxy/defaults.toml"
IMAGE_CONFIG = "/etc/kafka-share-proxy/proxy.toml"
# What the base image (python:3.11-slim) sets: ENV PATH=...:$PATH expands from it.
BASE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_the_parser_joins_continuations_and_drops_comments() -> None:
    text = "# syntax=docker/dockerfile:1\nARG A=1\nFROM x:${A} AS one\nRUN a \\\n  # inside\n  && b\n\nFROM one\nENV K=v \\\n    P=/x:$K\n"
    assert logical_lines(text) == ["ARG A=1", "FROM x:${A} AS one", "RUN a && b", "FROM one", "ENV K=v P=/x:$K"]
    parsed = parse_dockerfile(text)
    assert parsed.global_args == {"A": "1"}
    assert [(s.base, s.name) for s in parsed.stages] == [("x:${A}", "one"), ("one", None)]
    assert parsed.resolve(parsed.stages[0].base) == "x:1"
    assert parsed.final.env({}) == {"K": "v", "P": "/x:v"}


def test_base_is_pinned_by_an_exact_version_tag() -> None:
    assert DOCKERFILE.global_args["PYTHON_IMAGE"] == "python:3.11.14-slim-bookworm"
    for stage in DOCKERFILE.stages:
        assert stage.base == "${PYTHON_IMAGE}", stage.base
        image = DOCKERFILE.resolve(stage.base)
        repository, _, tag = image.partition(":")
        assert repository == "python"
        # major.minor.patch, a slim variant and a named Debian release: never `latest` or `3.11`.
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim-[a-z]+", tag), tag
        # The same requirement pyproject.toml states (requires-python >= 3.11).
        assert tag.startswith("3.11.")


def test_two_stages_and_only_the_virtualenv_reaches_the_runtime() -> None:
    assert [stage.name for stage in DOCKERFILE.stages] == ["build", "runtime"]
    build = DOCKERFILE.stage("build")
    installs = " ".join(i.arguments for i in build.all("RUN"))
    assert "pip install --no-cache-dir -c constraints.txt" in installs
    assert re.search(r"-c constraints\.txt (--build-constraint constraints\.txt )?\.( |$)", installs), installs
    assert "[" not in installs.split("constraints.txt .")[0].split()[-1], "no extras"
    copies = FINAL.copies()
    from_build = [(flags, sources, dest) for flags, sources, dest in copies if "from" in flags]
    assert from_build == [({"from": "build"}, ["/opt/venv"], "/opt/venv")]
    # The rest of the runtime's COPYs are the two TOML files, no source tree.
    assert sorted((tuple(sources), dest) for flags, sources, dest in copies if "from" not in flags) == [
        (("docker/defaults.toml",), IMAGE_DEFAULTS),
        (("docker/proxy.toml",), IMAGE_CONFIG),
    ]
    # No compiler or package manager in the runtime stage.
    runtime_runs = " ".join(i.arguments for i in FINAL.all("RUN"))
    assert "apt-get" not in runtime_runs and "pip " not in runtime_runs, runtime_runs


def test_runs_as_a_numeric_non_root_user() -> None:
    user = FINAL.last("USER")
    assert user is not None
    uid, _, gid = user.arguments.partition(":")
    assert (uid, gid) == ("10001", "10001")
    # USER comes after every RUN and COPY, so nothing later runs as root.
    keywords = [i.keyword for i in FINAL.instructions]
    assert all(k not in ("RUN", "COPY", "ADD") for k in keywords[keywords.index("USER"):])
    # The account exists in /etc/passwd with the same ids (for tools that look the user up).
    creates = " ".join(i.arguments for i in FINAL.all("RUN"))
    assert "--uid 10001" in creates and "--gid 10001" in creates and " ksp" in creates


def test_entrypoint_is_share_proxy_serve_and_cmd_appends_flags() -> None:
    assert FINAL.last("ENTRYPOINT").exec_form() == ["share-proxy", "serve"]
    assert FINAL.last("CMD").exec_form() == []


def test_environment_layers_the_defaults_under_the_mounted_file() -> None:
    env = FINAL.env({"PATH": BASE_PATH})
    assert env == {
        "PATH": f"/opt/venv/bin:{BASE_PATH}",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "KSP_CONFIG": f"{IMAGE_DEFAULTS},{IMAGE_CONFIG}",
    }


def test_defaults_toml_listens_everywhere_with_metrics_and_json_logs() -> None:
    defaults = tomllib.loads((ROOT / "docker" / "defaults.toml").read_text())
    assert defaults == {"listen": "0.0.0.0:9092", "metrics-port": 9404, "log-json": True}


def test_proxy_toml_is_a_comment_only_placeholder() -> None:
    text = (ROOT / "docker" / "proxy.toml").read_text()
    assert tomllib.loads(text) == {}
    assert "upstream" in text and "/etc/kafka-share-proxy" in text


def test_ports_and_healthcheck() -> None:
    exposed = " ".join(i.arguments for i in FINAL.all("EXPOSE")).split()
    assert exposed == ["9092", "9093-9101", "9404"]
    healthcheck = FINAL.last("HEALTHCHECK")
    assert healthcheck is not None
    assert "http://127.0.0.1:9404/healthz" in healthcheck.arguments
    assert "urllib.request" in healthcheck.arguments


def test_oci_labels() -> None:
    labels = dict(pair for i in FINAL.all("LABEL") for pair in i.pairs())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    for key in ("title", "description", "licenses", "source"):
        assert labels[f"org.opencontainers.image.{key}"], key


@pytest.fixture(scope="module")
def context_files() -> list[str]:
    return build_context_files()


def test_dockerignore_keeps_what_pip_install_needs(context_files: list[str]) -> None:
    top = {path.split("/")[0] for path in context_files}
    for needed in ("pyproject.toml", "README.md", "constraints.txt", "docker", "proxy", "codec", "client"):
        assert needed in top, needed
    # Every package pyproject.toml ships is in the context, with its package data.
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        name = pattern.rstrip("*")
        assert (ROOT / name).is_dir(), name
        assert f"{name}/__init__.py" in context_files, name
    assert "codec/schemas" in " ".join(context_files)
    # Every file the Dockerfile COPYs from the context is there.
    for stage in DOCKERFILE.stages:
        for flags, sources, _ in stage.copies():
            if "from" not in flags:
                for source in sources:
                    assert any(p == source or p.startswith(source.rstrip("/") + "/") for p in context_files), source


def test_dockerignore_drops_local_state(context_files: list[str]) -> None:
    patterns = dockerignore_patterns()
    for excluded in (".git", ".venv", "tests", "integration"):
        assert excluded in patterns
    top = {path.split("/")[0] for path in context_files}
    assert not top & {".git", ".venv", "tests", "integration", "docs", "helm", ".pytest_cache", ".hypothesis"}, top
    assert not [p for p in context_files if "__pycache__" in p or p.endswith(".pyc") or ".egg-info" in p]
