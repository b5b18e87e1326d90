"""Helpers behind the integration fixtures: the proxy as a subprocess, topics, polling.

Kept out of conftest.py so benchmarks and scripts can use them too.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.localkafka.broker import die_with_parent

READY_LINE = re.compile(r"^ready bootstrap=(?P<host>[^\s:]+):(?P<port>\d+)\b")
KAFKA_VERSION_ENV = "KSP_KAFKA_VERSION"
DEFAULT_KAFKA_VERSION = "4.4.0"


def kafka_version() -> str:
    return os.environ.get(KAFKA_VERSION_ENV) or DEFAULT_KAFKA_VERSION


def share_proxy_executable() -> str:
    """`share-proxy` from the running virtualenv (falls back to PATH)."""
    beside_python = Path(sys.executable).parent / "share-proxy"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("share-proxy")
    if found is None:
        raise RuntimeError("share-proxy is not installed in this environment (run `make venv`)")
    return found


class ReadyTimeout(RuntimeError):
    """A subprocess did not print its ready line in time."""


def wait_for_ready_line(process: subprocess.Popen[str], timeout: float, what: str, log_path: Path | None = None) -> re.Match[str]:
    """Read stdout until the `ready bootstrap=HOST:PORT` line; fail if the process exits first."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=min(0.2, max(0.0, deadline - time.monotonic()))):
                if process.poll() is not None:
                    break
                continue
            line = process.stdout.readline()
            if not line:
                break
            seen.append(line.rstrip("\n"))
            match = READY_LINE.match(line)
            if match:
                return match
    process.poll()
    log = log_tail(log_path, 4000) if log_path else ""
    raise ReadyTimeout(
        f"{what} printed no ready line within {timeout:.0f}s (exit code {process.returncode}); "
        f"stdout {seen!r}; log:\n{log}"
    )


def log_tail(log_path: Path, chars: int = 3000) -> str:
    """The last `chars` characters of a process's log, for a failure message ("" if there is none)."""
    return log_path.read_text(errors="replace")[-chars:] if log_path.exists() else ""


def terminate(process: subprocess.Popen[str], timeout: float = 15.0) -> int:
    """SIGTERM, wait, SIGKILL as a last resort; the exit code (negative for a signal)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()
    return process.returncode


@dataclass
class ProxyProcess:
    """`share-proxy serve` running as a subprocess in front of `upstream`."""

    upstream: str
    log_path: Path
    extra_args: Sequence[str] = ()
    startup_timeout: float = 60.0
    # The command that runs the CLI (default: the venv's `share-proxy`), e.g. another source
    # tree's `python -m proxy.cli` for a before/after benchmark; `env` is added to the environment
    # (e.g. {"PYTHONPATH": tree} to run another checkout's code).
    launcher: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    bootstrap: str = ""
    host: str = ""
    port: int = 0
    process: subprocess.Popen[str] | None = field(default=None, repr=False)
    exit_code: int | None = None

    def command(self) -> list[str]:
        return [
            *(self.launcher or (share_proxy_executable(),)),
            "serve",
            "--upstream",
            self.upstream,
            "--listen",
            "127.0.0.1:0",
            *self.extra_args,
        ]

    def start(self) -> ProxyProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=None if self.env is None else {**os.environ, **self.env},
                start_new_session=True,  # Ctrl-C on pytest must not hit the proxy before teardown
                # ...and a killed pytest must not leave the proxy behind.
                preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        try:
            match = wait_for_ready_line(self.process, self.startup_timeout, "share-proxy serve", self.log_path)
        except BaseException:
            self.stop()
            raise
        self.host, self.port = match["host"], int(match["port"])
        self.bootstrap = f"{self.host}:{self.port}"
        return self

    def stop(self) -> int | None:
        if self.process is not None and self.exit_code is None:
            self.exit_code = terminate(self.process)
        return self.exit_code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def admin_client(bootstrap: str, client_config: dict[str, str] | None = None) -> AdminClient:
    """An AdminClient on `bootstrap`; `client_config` adds settings (a secured broker's credentials)."""
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000, **(client_config or {})})


def topic_id_of(bootstrap: str, topic: str, client_config: dict[str, str] | None = None) -> uuid.UUID:
    """The id the broker gave `topic`."""
    # Keep the client referenced until the future resolves: a client collected mid-call fails it
    # with _DESTROY.
    admin = admin_client(bootstrap, client_config)
    found = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30).topic_id
    mask = (1 << 64) - 1
    return uuid.UUID(int=((found.get_most_significant_bits() & mask) << 64)
                     | (found.get_least_significant_bits() & mask))


def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
    client_config: dict[str, str] | None = None,
) -> list[str]:
    """Create topics (directly against `bootstrap`) and wait until every partition has a leader.

    `client_config`: extra AdminClient settings, e.g. `kafka.client_config()` for a secured broker.
    """
    admin = admin_client(bootstrap, client_config)
    topics = list(names)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {}) for name in topics],
        operation_timeout=timeout,
    )
    for future in futures.values():
        future.result(timeout=timeout)
    wait_for_leaders(admin, topics, partitions, timeout)
    return topics


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: dict[str, str] | None = None,
    client_config: dict[str, str] | None = None,
) -> str:
    return create_topics(bootstrap, [name], partitions, config, client_config=client_config)[0]


def wait_for_leaders(admin: AdminClient, topics: Sequence[str], partitions: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            metadata = admin.list_topics(timeout=5)
        except KafkaException:
            metadata = None
        if metadata is not None and all(
            name in metadata.topics
            and metadata.topics[name].error is None
            and len(metadata.topics[name].partitions) == partitions
            and all(partition.leader >= 0 for partition in metadata.topics[name].partitions.values())
            for name in topics
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {list(topics)} have no leaders after {timeout}s")
        time.sleep(0.05)


# ----- Kafka's command-line tools (not on the broker's classpath) --------------------------------

# kafka-tools releases to try when the broker's own version is not on Maven Central (4.4.0 is not),
# newest first.
TOOLS_FALLBACK_VERSIONS = ("4.3.0", "4.2.0", "4.1.1")


def m2_jar(version: str, artifact: str = "kafka-tools") -> Path:
    return Path.home() / ".m2" / "repository" / "org" / "apache" / "kafka" / artifact / version / f"{artifact}-{version}.jar"


def maven_jar(artifact: str, version: str) -> Path | None:
    """org.apache.kafka:`artifact`:`version` from ~/.m2, fetched with mvn if missing; None if unpublished."""
    jar = m2_jar(version, artifact)
    if jar.is_file():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(f"`mvn` is needed to fetch org.apache.kafka:{artifact}")
    subprocess.run(
        [mvn, "-q", "-B", "dependency:get", f"-Dartifact=org.apache.kafka:{artifact}:{version}", "-Dtransitive=false"],
        capture_output=True, text=True, timeout=300,
    )
    return jar if jar.is_file() else None


def kafka_tools_jar(broker_version: str) -> Path:
    """The kafka-tools jar (perf tools), fetched with mvn into ~/.m2 unless already there."""
    for version in (broker_version, *TOOLS_FALLBACK_VERSIONS):
        jar = maven_jar("kafka-tools", version)
        if jar is not None:
            return jar
    raise RuntimeError(f"no kafka-tools jar among {[broker_version, *TOOLS_FALLBACK_VERSIONS]} on Maven Central")
