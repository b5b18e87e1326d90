"""A real single-node Apache Kafka (KRaft, combined broker+controller) on 127.0.0.1.

Theory of operation: `start()` makes sure the version's jars are cached (`jars.fetch_kafka`),
picks free ports, writes server.properties, puts formatted KRaft storage in place, launches
`java kafka.Kafka server.properties` in its own session with its output in `server.log`, then
polls the port with raw ApiVersions + Metadata requests until the broker lists itself.
Formatting runs a JVM of its own, so each (version, share.version) combination is formatted
once into a template in the cache and copied for every start after that.

A second, broker-only node can join a started one (``LocalKafka(node_id=2, join=first)``): it
uses the first node's controller and is formatted (each start, no template) with the first
node's cluster id. Two brokers let partitions be led by different nodes.

``server_properties`` are written after the node's own settings, so they win (a benchmark's replica
fetch timing, say).

A secured node (``LocalKafka(security="sasl_ssl" | "sasl_plaintext")``) gets a CA and a
broker certificate in `<data-dir>/tls/` (`certs.Certificates`), SCRAM-SHA-512 users written into
the storage at format time, the StandardAuthorizer, and a Java client properties file for admin
(`client_config_path`). The raw probe cannot authenticate, so a secured node's readiness is a
confluent-kafka AdminClient logged in as admin listing the broker; ApiVersions (which Kafka answers
before authentication) still reports the APIs and finalized features.

`stop()` sends SIGTERM to the broker's process group, waits, and falls back to SIGKILL.
Every started broker is also stopped at interpreter exit, and (when started from the main
thread) the JVM gets SIGKILL from the kernel if this Python process dies first.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from proxy.localkafka.certs import Certificates
from proxy.localkafka.config import (
    HOST,
    NODE_ID,
    SECURITY_MODES,
    SHARE_FEATURE,
    SUPER_USER,
    BrokerSettings,
    broker_properties,
    client_properties,
    format_command,
    format_features,
    java_client_properties,
    java_properties_text,
    random_cluster_id,
    render_properties,
    supports_share_groups,
)
from proxy.localkafka.errors import LocalKafkaError
from proxy.localkafka.jars import (
    _exclusive,
    classpath,
    fetch_kafka,
    package_file,
    version_dir,
)
from proxy.localkafka.probe import api_versions, probe, share_group_heartbeat_error

DEFAULT_VERSION = "4.4.0"
# KIP-932 share-group APIs: ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge.
SHARE_API_KEYS = frozenset({76, 77, 78, 79})
UNSUPPORTED_VERSION = 35
FORMATTED_MARKER = ".formatted"

_live: set[LocalKafka] = set()
_live_lock = threading.Lock()


#: Lowest port free_port hands out: below it are well-known services' ports.
FREE_PORT_FLOOR = 10_000


def ephemeral_port_floor() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # the range's usual start (IANA's dynamic ports start at 49152)


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now, for a server started a moment later.

    Picked at random below the kernel's ephemeral range, not by binding port 0: a port from that
    range can be given to some client's outgoing connection between this call and the server's
    bind (it happened: a proxy's --metrics-port taken while two test suites ran side by side)."""
    ceiling = ephemeral_port_floor()
    for _ in range(1000 if ceiling > FREE_PORT_FLOOR + 100 else 0):
        port = random.randrange(FREE_PORT_FLOOR, ceiling)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    # An ephemeral range that starts low, or nothing free below it: the OS's pick.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise LocalKafkaError("`java` (JDK 17+) is not on PATH and JAVA_HOME is not set")
    return java


def die_with_parent() -> None:
    """`preexec_fn` for child processes: the kernel SIGKILLs the child when the launching thread dies.

    Only pass it when launching from the main thread (PDEATHSIG follows the thread, not the process).
    """
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


class LocalKafka:
    """A local Kafka broker for tests, the demo and `share-proxy local-kafka`.

    Use as a context manager (``with LocalKafka() as kafka: kafka.bootstrap``) or call
    `start()` / `stop()`. `data_dir=None` uses a temporary directory removed on stop; a given
    directory is kept and reused (formatted only the first time). Port 0 picks a free port.
    """

    def __init__(
        self,
        version: str = DEFAULT_VERSION,
        share_groups: bool = False,
        data_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
        controller_port: int = 0,
        *,
        auto_create_topics: bool = True,
        heap: str = "512m",
        jvm_options: tuple[str, ...] = (),
        startup_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        node_id: int = NODE_ID,
        join: LocalKafka | None = None,
        security: str | None = None,
        server_properties: Mapping[str, str] | None = None,
    ) -> None:
        if share_groups and not supports_share_groups(version):
            raise LocalKafkaError(f"Apache Kafka {version} has no share groups (KIP-932 needs 4.x)")
        if security == "none":
            security = None
        if security is not None and security not in SECURITY_MODES:
            raise LocalKafkaError(f"security must be one of {', '.join(SECURITY_MODES)} or None, not {security!r}")
        if security is not None and share_groups:
            # The share-groups-off check sends a raw ShareGroupHeartbeat, which a SASL listener
            # refuses before authentication; native share groups are for plaintext comparisons.
            raise LocalKafkaError("native share groups are not offered on a secured local Kafka")
        if security is not None and join is not None:
            raise LocalKafkaError("a secured local Kafka is a single node (join= is not supported with security)")
        self.security = security
        self.version = version
        self.share_groups = share_groups
        self.broker_id = node_id
        # The started combined node whose controller (and cluster) this broker-only node joins.
        self.join = join
        self.server_properties = dict(server_properties or {})
        if join is not None and (not join.running or join.join is not None or join.broker_id == node_id):
            raise LocalKafkaError("a joining node needs a started controller node with another node id")
        self._requested_dir = Path(data_dir) if data_dir is not None else None
        self._requested_port = port
        self._requested_controller_port = controller_port
        self._auto_create_topics = auto_create_topics
        self._heap = heap
        self._jvm_options = tuple(jvm_options)
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._owned_dir: Path | None = None
        self.port = 0
        self.controller_port = 0
        self.data_dir: Path | None = None
        self.log_path: Path | None = None
        self.lib_dir: Path | None = None
        self.api_keys: frozenset[int] = frozenset()
        self.finalized_features: dict[str, int] = {}
        self.killed = False
        # Secured nodes only (None otherwise): the CA (also for minting the proxy's and clients'
        # certificates), its PEM when the broker speaks TLS (sasl_ssl), the admin client-config file.
        self.certificates: Certificates | None = None
        self.ca_path: Path | None = None
        self.client_config_path: Path | None = None

    # -- public surface -------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        if not self.port:
            raise LocalKafkaError("the broker is not started")
        return f"{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        """The broker JVM's process id (also its process group: it runs in its own session)."""
        if self._process is None:
            raise LocalKafkaError("the broker is not started")
        return self._process.pid

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self.bootstrap if self.running else "stopped"
        security = f", security={self.security!r}" if self.security else ""
        return f"LocalKafka(version={self.version!r}, share_groups={self.share_groups}{security}, {state})"

    def client_config(self, user: str = SUPER_USER) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings to reach this broker as `user` (admin, alice, bob).

        A plaintext broker needs only `bootstrap.servers`.
        """
        if self.security is None:
            return {"bootstrap.servers": self.bootstrap}
        return client_properties(self.security, self.bootstrap, self.ca_path, user)

    def java_properties(self, user: str = SUPER_USER) -> dict[str, str]:
        """Kafka Java client security settings for `user` (PEM truststore, SCRAM JAAS).

        Without `bootstrap.servers` (unlike `client_config`): they go on top of a client's own
        settings, e.g. a Java driver pointed at the proxy (`property=kafka.java_properties("alice")`).
        """
        if self.security is None:
            return {"security.protocol": "PLAINTEXT"}
        return java_client_properties(self.security, self.ca_path, user)

    def start(self) -> LocalKafka:
        if self._process is not None:
            raise LocalKafkaError("the broker is already started")
        self.lib_dir = fetch_kafka(self.version)
        try:
            self._prepare_directory()
            self._launch()
            self._wait_until_ready()
            self._check_share_apis()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL) and remove a temporary data directory.

        Afterwards `killed` tells whether SIGKILL was needed (the broker ignored SIGTERM).
        """
        process, self._process = self._process, None
        if process is not None:
            self.killed = _terminate(process, self._stop_timeout)
            with _live_lock:
                _live.discard(self)
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the broker process exits (or `timeout`); its exit code, None if still running."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # -- steps ----------------------------------------------------------------------------

    def _prepare_directory(self) -> None:
        if self._requested_dir is None:
            self._owned_dir = Path(tempfile.mkdtemp(prefix=f"ksp-kafka-{self.version}-"))
            self.data_dir = self._owned_dir
        else:
            self.data_dir = self._requested_dir.resolve()
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self._requested_port or free_port()
        self.controller_port = 0 if self.join is not None else self._requested_controller_port or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        log_dir = self.data_dir / "kraft"
        if self.security is not None:
            if (log_dir / "meta.properties").exists() and not (self.data_dir / "tls").is_dir():
                raise LocalKafkaError(
                    f"{self.data_dir} holds storage formatted without security (no SCRAM users); "
                    f"use a fresh data directory for a secured broker"
                )
            self._prepare_security()
        settings = self._settings(log_dir)
        config = self.data_dir / "server.properties"
        # Extra settings last, so they win (e.g. a benchmark's replica fetch timing).
        config.write_text(render_properties({**broker_properties(settings), **self.server_properties}))
        if self.security is not None:
            self.client_config_path = self.data_dir / "client-admin.properties"
            self.client_config_path.write_text(java_properties_text(self.java_properties()))
        self.log_path = self.data_dir / "server.log"
        if self.join is not None:
            if not (log_dir / "meta.properties").exists():
                self._format(settings, config, self.join.cluster_id(), log_dir)
        elif not (log_dir / "meta.properties").exists():
            template = self._formatted_template()
            shutil.copytree(template, log_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(FORMATTED_MARKER))

    def _prepare_security(self) -> None:
        """The CA (kept with a kept data dir) and the broker's PEM keystore: key and chain in one file."""
        assert self.data_dir is not None
        self.certificates = Certificates(self.data_dir / "tls")
        if self.security == "sasl_ssl":
            self.ca_path = self.certificates.ca_cert
            cert, key = self.certificates.issue("broker", hosts=("localhost", HOST))
            keystore = self.certificates.directory / "broker-keystore.pem"
            keystore.write_bytes(key.read_bytes() + cert.read_bytes() + self.ca_path.read_bytes())
            keystore.chmod(0o600)

    def _settings(self, log_dir: Path) -> BrokerSettings:
        return BrokerSettings(
            version=self.version,
            port=self.port,
            controller_port=self.controller_port,
            log_dir=log_dir,
            share_groups=self.share_groups,
            auto_create_topics=self._auto_create_topics,
            node_id=self.broker_id,
            controller_voter=f"{self.join.broker_id}@{HOST}:{self.join.controller_port}" if self.join else None,
            security=self.security,
            keystore=self.certificates.directory / "broker-keystore.pem" if self.security == "sasl_ssl" and self.certificates else None,
            truststore=self.ca_path if self.security == "sasl_ssl" else None,
        )

    def cluster_id(self) -> str:
        """The cluster id this node's storage was formatted with."""
        assert self.data_dir is not None
        meta = (self.data_dir / "kraft" / "meta.properties").read_text()
        return next(line.split("=", 1)[1].strip() for line in meta.splitlines() if line.startswith("cluster.id="))

    def _format(self, settings: BrokerSettings, config: Path, cluster_id: str, log_dir: Path) -> None:
        assert self.lib_dir is not None
        command = format_command(find_java(), classpath(self.lib_dir), settings, cluster_id, config)
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0 or not (log_dir / "meta.properties").exists():
            output = (result.stdout + result.stderr).strip()
            raise LocalKafkaError(f"formatting KRaft storage failed (exit {result.returncode}):\n{output[-4000:]}")

    def _formatted_template(self) -> Path:
        """KRaft storage formatted once per (version, share.version, SCRAM users), shared by every start.

        sasl_ssl and sasl_plaintext format the same storage (the SCRAM users are the only
        difference a format makes), so they share the `-scram` template.
        """
        share_level = 1 if self.share_groups else 0
        users = "-scram" if self.security is not None else ""
        template = version_dir(self.version) / f"formatted-node{self.broker_id}-share{share_level}{users}"
        if (template / FORMATTED_MARKER).exists():
            return template
        with _exclusive(template.parent / f".{template.name}.lock"):
            if (template / FORMATTED_MARKER).exists():
                return template
            with tempfile.TemporaryDirectory(prefix="format-", dir=template.parent) as scratch:
                staging = Path(scratch) / "kraft"
                settings = self._settings(staging)
                config = Path(scratch) / "server.properties"
                config.write_text(render_properties(broker_properties(settings)))
                assert self.lib_dir is not None
                command = format_command(find_java(), classpath(self.lib_dir), settings, random_cluster_id(), config)
                result = subprocess.run(command, capture_output=True, text=True, timeout=120)
                if result.returncode != 0 or not (staging / "meta.properties").exists():
                    output = (result.stdout + result.stderr).strip()
                    raise LocalKafkaError(f"formatting KRaft storage failed (exit {result.returncode}):\n{output[-4000:]}")
                features = " ".join(format_features(settings)) or "(no features)"
                scram = " and SCRAM users" if self.security is not None else ""
                (staging / FORMATTED_MARKER).write_text(f"formatted for Kafka {self.version} with {features}{scram}\n")
                shutil.rmtree(template, ignore_errors=True)
                staging.rename(template)
        return template

    def _launch(self) -> None:
        assert self.data_dir is not None and self.log_path is not None and self.lib_dir is not None
        command = [
            find_java(),
            f"-Xmx{self._heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            # Both logging configs are passed; Kafka 4 reads the log4j2 one, Kafka 3 the log4j 1 one.
            f"-Dlog4j2.configurationFile={package_file('log4j2.properties')}",
            f"-Dlog4j.configuration=file:{package_file('log4j.properties')}",
            f"-Dkafka.logs.dir={self.data_dir}",
            *self._jvm_options,
            "-cp",
            classpath(self.lib_dir),
            "kafka.Kafka",
            str(self.data_dir / "server.properties"),
        ]
        on_main_thread = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                # PDEATHSIG follows the launching *thread*; only safe from the main thread.
                preexec_fn=die_with_parent if on_main_thread else None,
            )
        with _live_lock:
            _live.add(self)

    def _wait_until_ready(self) -> None:
        if self.security is not None:
            self._wait_until_ready_secured()
            return
        deadline = time.monotonic() + self._startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise LocalKafkaError(
                    f"Kafka {self.version} exited with code {self._process.returncode} during start-up; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                info = probe(HOST, self.port, timeout=2.0)
            except (OSError, LocalKafkaError) as error:
                last_error = error
            else:
                if self.broker_id in info.broker_ids:
                    self.api_keys = info.api_keys
                    self.finalized_features = info.finalized_features
                    return
                last_error = LocalKafkaError(f"Metadata lists brokers {sorted(info.broker_ids)}, not {self.broker_id} yet")
            time.sleep(0.05)
        raise LocalKafkaError(
            f"Kafka {self.version} did not answer on {self.bootstrap} within {self._startup_timeout:.0f}s "
            f"(last error: {last_error}); log {self.log_path}:\n{self.log_tail()}"
        )

    def _wait_until_ready_secured(self) -> None:
        """An AdminClient logged in as admin lists this broker; then ApiVersions (pre-authentication)."""
        # Imported here: plaintext brokers (and `share-proxy local-kafka` without --security)
        # never load librdkafka.
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self._startup_timeout
        last_error: Exception | None = None
        admin = AdminClient(self.client_config() | {"socket.timeout.ms": "5000", "log_level": "0"})
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise LocalKafkaError(
                    f"Kafka {self.version} exited with code {self._process.returncode} during start-up; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=2.0)
            except KafkaException as error:
                last_error = error
            else:
                if self.broker_id in metadata.brokers:
                    try:
                        info = api_versions(HOST, self.port, ca_path=self.ca_path)
                    except (OSError, LocalKafkaError) as error:
                        last_error = error
                    else:
                        self.api_keys = info.api_keys
                        self.finalized_features = info.finalized_features
                        return
                else:
                    last_error = LocalKafkaError(f"Metadata lists brokers {sorted(metadata.brokers)}, not {self.broker_id} yet")
            time.sleep(0.1)
        raise LocalKafkaError(
            f"Kafka {self.version} did not answer admin on {self.bootstrap} within {self._startup_timeout:.0f}s "
            f"(last error: {last_error}); log {self.log_path}:\n{self.log_tail()}"
        )

    def _check_share_apis(self) -> None:
        """Make sure share groups are off (or on, when asked for) on this broker.

        Kafka 4.x lists the share-group APIs in ApiVersions even with share.version=0, so the
        API list alone proves nothing there: check the finalized feature level, and that a
        ShareGroupHeartbeat is refused with UNSUPPORTED_VERSION. Kafka 3.x has no share APIs.
        """
        level = self.finalized_features.get(SHARE_FEATURE, 0)
        advertised = SHARE_API_KEYS & self.api_keys
        if self.share_groups:
            if level < 1 or advertised != SHARE_API_KEYS:
                raise LocalKafkaError(
                    f"Kafka {self.version} was asked for native share groups but has {SHARE_FEATURE}={level} "
                    f"and advertises share APIs {sorted(advertised)}"
                )
            return
        if level >= 1:
            raise LocalKafkaError(f"Kafka {self.version} has share groups enabled ({SHARE_FEATURE}={level})")
        # A secured listener refuses a ShareGroupHeartbeat before authentication; there the
        # finalized feature level (share.version=0, read above from ApiVersions) is the check.
        if advertised and self.security is None:
            error = share_group_heartbeat_error(HOST, self.port)
            if error != UNSUPPORTED_VERSION:
                raise LocalKafkaError(
                    f"Kafka {self.version} accepted a ShareGroupHeartbeat (error code {error}) although "
                    f"it was formatted with {SHARE_FEATURE}=0; the proxy must be the only share-group provider"
                )

def _terminate(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """SIGTERM the process group, SIGKILL it after `timeout`; True when SIGKILL was needed."""
    if process.poll() is not None:
        return False
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        process.wait()
        return False
    try:
        process.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        return True


def _stop_all() -> None:
    with _live_lock:
        brokers = list(_live)
    for broker in brokers:
        broker.stop()


atexit.register(_stop_all)
