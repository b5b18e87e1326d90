"""The image's entrypoint and configuration path, run without Docker against the session broker.

Nothing here restates the image: the Dockerfile's final stage is parsed (ENV, ENTRYPOINT, CMD,
USER, the COPYs of the two TOML files) and the build context is what .dockerignore lets through.
The steps stand in for `docker build` and `docker run` as closely as a machine without a Docker
engine allows:

* the wheel is built from a copy of the build context only (so a file .dockerignore drops that
  the build needs fails here), and installed with `pip install --no-deps --target DIR`; the
  dependencies come from this virtualenv, as the image's come from constraints.txt;
* docker/defaults.toml and a mounted proxy.toml are placed at temporary paths standing in for
  /opt/kafka-share-proxy and /etc/kafka-share-proxy; only those two paths in KSP_CONFIG are
  rewritten, and in the defaults only the two port numbers (9092 and 9404 may be taken on a
  shared machine, and the proxy serves brokers at listen port + 1 + node id);
* ENTRYPOINT + CMD run with exactly the image's ENV (PATH with DIR/bin where /opt/venv/bin is),
  plus PYTHONPATH=DIR:ABSENT, which in the image the venv's own site-packages provides: without
  DIR the venv behind DIR/bin/share-proxy would import this checkout (its editable install), and
  ABSENT hides every package of this virtualenv that the image does not install (the test and
  spark extras: a runtime import of one of them fails here as it would in the image; and kio
  imports hypothesis when it can, which writes .hypothesis/ into the working directory); nothing
  else of this process's environment, so no KSP_* variable leaks in;
* as USER 10001:10001 when the test runs as root and that uid can run this virtualenv's
  interpreter (as in the image: it can then write neither the working directory, nor HOME, nor
  the installed files); else as the current user (on the development machine the interpreter
  lives under /root, which uid 10001 cannot enter). Either way no file may appear.

Then: the ready line, /healthz and /readyz 200 on the metrics port defaults.toml sets, a producer
and a confluent_kafka.ShareConsumer through the proxy, JSON log lines, and exit 0 on SIGTERM.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from integration.deploy.dockerfile import ROOT, copy_build_context, read_dockerfile
from integration.kafka_fixtures import create_topic, terminate, unique_name, wait_for_ready_line
from integration.share.conftest import poll_until, produce, share_consumer
from ksp_testcontainers import free_port_layout
from proxy.localkafka import LocalKafka
from proxy.localkafka.broker import free_port

pytestmark = pytest.mark.integration

IMAGE_VENV_BIN = "/opt/venv/bin"
# The PATH the python:3.11-slim base image sets; the Dockerfile's ENV PATH=/opt/venv/bin:$PATH extends it.
BASE_IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RECORDS = 20
# librdkafka's log line: %SEVERITY|UNIX-TIME|FACILITY|CLIENT-NAME| message
LIBRDKAFKA_LINE = re.compile(r"^%\d\|\d+\.\d+\|[A-Z_]+\|rdkafka#[a-z]+-\d+\| ")


def replace_once(text: str, pattern: str, replacement: str) -> str:
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"expected one match of {pattern!r} in:\n{text}"
    return new


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_until_ready(port: int, process: subprocess.Popen[str], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    last: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the proxy exited with {process.returncode}"
        try:
            last = get(port, "/readyz")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            last = None
        if last is not None and last[0] == 200:
            return json.loads(last[1])
        time.sleep(0.2)
    raise AssertionError(f"/readyz did not answer 200 within {timeout}s: {last}")


@pytest.fixture(scope="module")
def image_root() -> Iterator[Path]:
    """A world-readable directory (the uid 10001 process must read it), removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="ksp-image-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def installed(image_root: Path) -> Path:
    """The wheel built from the .dockerignore'd context, installed into DIR = image_root/venv."""
    context = image_root / "context"
    files = copy_build_context(context)
    assert "pyproject.toml" in files and not any(f.startswith(("tests/", "integration/", ".git/")) for f in files)
    wheels = image_root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(context)],
                           capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stdout + build.stderr
    # setuptools only warns about a file pyproject.toml names that the context lacks (README.md);
    # in the image that is a failed build.
    assert "Warning" not in build.stdout + build.stderr, build.stdout + build.stderr
    (wheel,) = wheels.glob("kafka_share_proxy-*.whl")
    target = image_root / "venv"
    install = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                             capture_output=True, text=True, timeout=180)
    assert install.returncode == 0, install.stdout + install.stderr
    for path in [image_root, *image_root.rglob("*")]:  # readable (and directories enterable) by uid 10001
        path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    return target


def test_image_entrypoint_and_configuration_path(kafka: LocalKafka, installed: Path, image_root: Path,
                                                record_property) -> None:
    dockerfile = read_dockerfile()
    final = dockerfile.final
    image_env = final.env({"PATH": BASE_IMAGE_PATH})
    command = final.last("ENTRYPOINT").exec_form() + final.last("CMD").exec_form()
    uid, _, gid = final.last("USER").arguments.partition(":")

    # The two TOML files at the paths the Dockerfile COPYs them to, under a stand-in root.
    fs_root = image_root / "fs"
    copied = {dest: sources[0] for flags, sources, dest in final.copies() if "from" not in flags}
    config_paths = image_env["KSP_CONFIG"].split(",")
    assert config_paths == list(copied), (config_paths, copied)  # KSP_CONFIG names exactly the files it COPYs
    defaults_path, mounted_path = config_paths
    # The image listens on all interfaces: its bootstrap port and broker port (base = listen + 1) must be free there.
    listen_port, _ = free_port_layout([kafka.broker_id])
    metrics_port = free_port("0.0.0.0")
    defaults = (ROOT / copied[defaults_path]).read_text()
    defaults = replace_once(defaults, r'^listen = "0\.0\.0\.0:9092"$', f'listen = "0.0.0.0:{listen_port}"')
    defaults = replace_once(defaults, r"^metrics-port = 9404$", f"metrics-port = {metrics_port}")
    (fs_root / defaults_path.lstrip("/")).parent.mkdir(parents=True)
    (fs_root / defaults_path.lstrip("/")).write_text(defaults)
    # What an operator mounts over the placeholder: the upstream and the advertised host; a fresh
    # state topic so other tests' proxies on the session broker never share it; earliest, so the
    # records produced before the consumer joins are delivered.
    state_topic = f"__share_proxy_state_{uuid.uuid4().hex[:12]}"
    (fs_root / mounted_path.lstrip("/")).parent.mkdir(parents=True)
    (fs_root / mounted_path.lstrip("/")).write_text(
        f'upstream = "{kafka.bootstrap}"\nadvertised-host = "127.0.0.1"\n'
        f'state-topic = "{state_topic}"\nshare-auto-offset-reset = "earliest"\n'
    )
    assert tomllib.loads((fs_root / mounted_path.lstrip("/")).read_text())["upstream"] == kafka.bootstrap
    for path in [fs_root, *fs_root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)

    env = dict(image_env)
    env["PATH"] = env["PATH"].replace(IMAGE_VENV_BIN, str(installed / "bin"), 1)
    env["KSP_CONFIG"] = ",".join(str(fs_root / p.lstrip("/")) for p in config_paths)
    absent = image_root / "absent"
    hidden = hide_packages_the_image_lacks(installed, absent)
    assert "hypothesis" in hidden and "trio" not in hidden, hidden
    env["PYTHONPATH"] = f"{installed}:{absent}"
    env["HOME"] = "/nonexistent"  # the ksp account's home, which does not exist
    assert env["PATH"].startswith(str(installed / "bin") + ":")
    assert shutil.which(command[0], path=env["PATH"]) == str(installed / "bin" / command[0])

    # `import proxy` in that environment comes from DIR, not from this checkout.
    where = subprocess.run([_interpreter(installed / "bin" / command[0]), "-c", "import proxy; print(proxy.__file__)"],
                           env=env, capture_output=True, text=True, timeout=60, cwd="/")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve().is_relative_to(installed.resolve()), where.stdout

    workdir = image_root / "cwd"  # empty, and not writable by uid 10001
    workdir.mkdir(mode=0o755)
    before = sorted(p.relative_to(image_root) for p in image_root.rglob("*"))
    as_image_user = os.geteuid() == 0 and can_run_as(int(uid), int(gid), _interpreter(installed / "bin" / command[0]))
    record_property("ran_as", f"{uid}:{gid}" if as_image_user else f"{os.geteuid()}:{os.getegid()} (current user)")
    log_path = image_root / "stderr.log"
    with log_path.open("w") as stderr:
        process = subprocess.Popen(command, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=stderr, text=True, start_new_session=True,
                                   user=int(uid) if as_image_user else None, group=int(gid) if as_image_user else None,
                                   extra_groups=[] if as_image_user else None)
    try:
        ready = wait_for_ready_line(process, 60, "share-proxy serve (image entrypoint)", log_path)
        assert (ready["host"], int(ready["port"])) == ("127.0.0.1", listen_port)
        bootstrap = f"127.0.0.1:{listen_port}"

        readiness = wait_until_ready(metrics_port, process)
        assert all(readiness["checks"].values()), readiness
        assert get(metrics_port, "/healthz")[0] == 200
        status, metrics = get(metrics_port, "/metrics")
        assert status == 200 and "ksp_" in metrics

        topic = create_topic(kafka.bootstrap, unique_name("image-entrypoint"))
        values = produce(bootstrap, topic, RECORDS)  # its producer is closed on return: no reconnects while the proxy stops

        consumer = share_consumer(bootstrap, unique_name("image-group"), topic)
        try:
            received = [message.value() for message in poll_until(consumer, RECORDS, timeout=30)]
        finally:
            consumer.close()
        assert sorted(received) == sorted(values)
    finally:
        exit_code = terminate(process, timeout=20)  # SIGTERM, as `docker stop` sends
    log = log_path.read_text()
    assert exit_code == 0, f"exit code {exit_code} after SIGTERM; log:\n{log[-3000:]}"

    # log-json = true from defaults.toml: every line the proxy logs is one JSON object. The one
    # exception is librdkafka's own lines from the confluent-kafka clients inside the proxy (state
    # producer, replay consumer), which librdkafka prints to stderr itself in its own format
    # (docs/deployment.md says so); anything else that is not JSON fails.
    lines = [line for line in log.splitlines() if line.strip()]
    not_json = [line for line in lines if not _is_json_object(line)]
    assert all(LIBRDKAFKA_LINE.match(line) for line in not_json), not_json[:5]
    records = [json.loads(line) for line in lines if line not in not_json]
    assert len(records) >= 3, lines
    assert all(isinstance(r, dict) and "event" in r and "level" in r for r in records), lines[:5]
    events = [r["event"] for r in records]
    assert "signal" in events and any(r.get("signal") == signal.SIGTERM.name for r in records), events

    # Nothing was written: no new file in DIR, the config root or the working directory.
    after = sorted(p.relative_to(image_root) for p in image_root.rglob("*") if p != log_path)
    assert after == before, set(after) ^ set(before)


def runtime_distributions(installed: Path) -> set[str]:
    """The project's distribution in `installed`, its requirements without extras, theirs, ...
    plus pip and setuptools (a Python 3.11 venv, as the image's, has both): what the image holds."""
    (project,) = [d for d in importlib.metadata.distributions(path=[str(installed)])
                  if canonicalize_name(d.metadata["Name"]) == "kafka-share-proxy"]
    found = {"kafka-share-proxy", "pip", "setuptools"}
    pending = list(project.requires or [])
    while pending:
        requirement = Requirement(pending.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in found:
            found.add(name)
            pending.extend(importlib.metadata.distribution(name).requires or [])
    return found


def hide_packages_the_image_lacks(installed: Path, directory: Path) -> list[str]:
    """Put an importable stand-in that raises ImportError in `directory` for each top-level module
    of this virtualenv whose distributions are all outside the image; their names."""
    keep = runtime_distributions(installed)
    hidden = []
    for module, distributions in importlib.metadata.packages_distributions().items():
        if not module.isidentifier() or any(canonicalize_name(d) in keep for d in distributions):
            continue
        package = directory / module
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise ImportError({module + ' is not installed in the image'!r})\n")
        hidden.append(module)
    return sorted(hidden)


def can_run_as(uid: int, gid: int, interpreter: str) -> bool:
    """Whether `interpreter` starts as uid:gid (its directories may be closed to that user)."""
    try:
        return subprocess.run([interpreter, "-c", ""], user=uid, group=gid, extra_groups=[], cwd="/",
                              capture_output=True, timeout=30).returncode == 0
    except PermissionError:
        return False


def _interpreter(script: Path) -> str:
    """The interpreter a console script's shebang names (the venv the dependencies come from)."""
    first = script.read_text().splitlines()[0]
    assert first.startswith("#!"), first
    return first[2:].strip().split()[0]


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
