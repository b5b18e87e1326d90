"""server.properties and storage-format arguments for a local KRaft node (pure): a combined
broker+controller, or a broker-only node joining another node's controller; plaintext, or
secured (SASL_SSL / SASL_PLAINTEXT with SCRAM users and the StandardAuthorizer)."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path

from proxy.localkafka.jars import major_version

HOST = "127.0.0.1"
NODE_ID = 1

# Kafka 4.x feature that switches KIP-932 share groups on (1) or off (0).
SHARE_FEATURE = "share.version"

# Secured brokers: the client listener's protocol, by `security` mode.
SECURITY_MODES = ("sasl_ssl", "sasl_plaintext")
# SCRAM users created at format time; `admin` is the super user the broker itself runs as.
USERS = ("admin", "alice", "bob")
SUPER_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"
# Mechanisms the client listener offers. OAUTHBEARER runs with Kafka's default *unsecured* token
# validator (any unsigned JWT is accepted; its `sub` is the principal): for testing pass-through only.
CLIENT_MECHANISMS = (SCRAM_MECHANISM, "OAUTHBEARER")
CONTROLLER_MECHANISM = "PLAIN"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def password(user: str) -> str:
    """The local broker's fixed test password for `user`: the name followed by `-secret`."""
    return f"{user}-secret"


def jaas_quote(value: str) -> str:
    """A JAAS option value in double quotes (backslash and quote escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def scram_jaas(user: str) -> str:
    return f"{SCRAM_LOGIN_MODULE} required username={jaas_quote(user)} password={jaas_quote(password(user))};"


def listener_name(security: str | None) -> str:
    """The client listener's name, which is also its security protocol."""
    return "PLAINTEXT" if security is None else security.upper()


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Everything that decides how the broker is configured and formatted."""

    version: str
    port: int
    controller_port: int
    log_dir: Path
    share_groups: bool = False
    auto_create_topics: bool = True
    node_id: int = NODE_ID
    # "id@host:port" of the controller a broker-only node joins; None: this node is its own controller.
    controller_voter: str | None = None
    # None: plaintext, no authentication. "sasl_ssl" / "sasl_plaintext": a secured node.
    security: str | None = None
    # sasl_ssl: the broker's PEM keystore (unencrypted PKCS#8 key + certificate chain, one file)
    # and the CA certificate it trusts (its own inter-broker client verifies the broker with it).
    keystore: Path | None = None
    truststore: Path | None = None

    def __post_init__(self) -> None:
        if self.security is not None and self.security not in SECURITY_MODES:
            raise ValueError(f"security must be one of {SECURITY_MODES} or None, not {self.security!r}")
        if self.security == "sasl_ssl" and (self.keystore is None or self.truststore is None):
            raise ValueError("sasl_ssl needs a keystore and a truststore")


def supports_share_groups(version: str) -> bool:
    """KIP-932 share groups exist (behind the share.version feature) from Kafka 4.x."""
    return major_version(version) >= 4


def broker_properties(settings: BrokerSettings) -> dict[str, str]:
    """The broker's server.properties as an ordered mapping."""
    node = settings.node_id
    broker_only = settings.controller_voter is not None
    client = listener_name(settings.security)
    controller_protocol = "PLAINTEXT" if settings.security is None else "SASL_PLAINTEXT"
    props = {
        "node.id": str(node),
        "process.roles": "broker" if broker_only else "broker,controller",
        "listeners": f"{client}://{HOST}:{settings.port}" if broker_only
        else f"{client}://{HOST}:{settings.port},CONTROLLER://{HOST}:{settings.controller_port}",
        "advertised.listeners": f"{client}://{HOST}:{settings.port}",
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:{controller_protocol}",
        "inter.broker.listener.name": client,
        "controller.listener.names": "CONTROLLER",
        # A static voter set instead of a formatted dynamic quorum: the voter endpoint then lives
        # only in this file, so a kept --data-dir restarts fine on different (free) ports.
        "controller.quorum.voters": settings.controller_voter or f"{node}@{HOST}:{settings.controller_port}",
        "log.dirs": str(settings.log_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Kafka's default; tests still create their topics explicitly.
        "auto.create.topics.enable": "true" if settings.auto_create_topics else "false",
        # Internal topics on a single node: one replica, and few partitions so the first
        # consumer group or transaction does not wait for 50 partitions to be created.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.check.interval.ms": "300000",
        "controlled.shutdown.enable": "true",
    }
    if supports_share_groups(settings.version):
        # Only read by the native share coordinator (share groups enabled); harmless otherwise.
        props |= {
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
        }
    if settings.security is not None:
        props |= security_properties(settings)
    return props


def security_properties(settings: BrokerSettings) -> dict[str, str]:
    """SASL on both listeners, TLS on the client listener (sasl_ssl), the StandardAuthorizer.

    The client listener offers SCRAM-SHA-512 (users created at format time) and OAUTHBEARER
    (unsecured validator, testing only); the broker's own inter-broker client logs in there as
    admin. The CONTROLLER listener takes SASL_PLAINTEXT with PLAIN and a listener-scoped JAAS
    that both logs in as admin and accepts admin (`user_admin`), so every connection in the
    cluster has an authenticated super user behind it and no ANONYMOUS super user is needed.
    """
    client = listener_name(settings.security).lower()
    admin = SUPER_USER
    props = {
        "sasl.enabled.mechanisms": ",".join(CLIENT_MECHANISMS),
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.{client}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": scram_jaas(admin),
        f"listener.name.{client}.oauthbearer.sasl.jaas.config":
            f"{OAUTHBEARER_LOGIN_MODULE} required unsecuredLoginStringClaim_sub={jaas_quote(admin)};",
        "sasl.mechanism.controller.protocol": CONTROLLER_MECHANISM,
        "listener.name.controller.sasl.enabled.mechanisms": CONTROLLER_MECHANISM,
        f"listener.name.controller.{CONTROLLER_MECHANISM.lower()}.sasl.jaas.config": (
            f"{PLAIN_LOGIN_MODULE} required username={jaas_quote(admin)} password={jaas_quote(password(admin))} "
            f"user_{admin}={jaas_quote(password(admin))};"
        ),
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": f"User:{admin}",
        "allow.everyone.if.no.acl.found": "false",
    }
    if settings.security == "sasl_ssl":
        assert settings.keystore is not None and settings.truststore is not None
        props |= {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(settings.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(settings.truststore),
            "ssl.client.auth": "none",
            # The broker's certificate names 127.0.0.1 and localhost, so its own inter-broker
            # client verifies the host name as any client would.
            "ssl.endpoint.identification.algorithm": "https",
        }
    return props


def client_properties(security: str, bootstrap: str, ca_path: Path | None, user: str = SUPER_USER) -> dict[str, str]:
    """librdkafka (confluent-kafka) settings for `user` on a secured local broker."""
    props = {
        "bootstrap.servers": bootstrap,
        "security.protocol": listener_name(security),
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": password(user),
    }
    if security == "sasl_ssl":
        assert ca_path is not None
        props["ssl.ca.location"] = str(ca_path)
    return props


def java_client_properties(security: str, ca_path: Path | None, user: str = SUPER_USER) -> dict[str, str]:
    """Kafka Java client security settings for `user` (what `--command-config` files hold).

    No `bootstrap.servers`: these settings are applied over a client's own (the Java drivers
    apply them last), and must not silently point a client meant for the proxy at the broker.
    """
    props = {
        "security.protocol": listener_name(security),
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.jaas.config": scram_jaas(user),
    }
    if security == "sasl_ssl":
        assert ca_path is not None
        props |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca_path)}
    return props


def java_properties_text(props: dict[str, str]) -> str:
    """A Java .properties file: `key=value` lines. Keys escape the separators; values need only
    backslashes, line breaks and a leading blank escaped (`=` and `:` inside a value are literal)."""
    def escape_key(text: str) -> str:
        out = text.replace("\\", "\\\\")
        for special in ("=", ":", "#", "!", " "):
            out = out.replace(special, "\\" + special)
        return out

    def escape_value(text: str) -> str:
        out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return "\\" + out if out[:1] in (" ", "\t") else out

    return "".join(f"{escape_key(key)}={escape_value(value)}\n" for key, value in props.items())


def scram_format_arguments(settings: BrokerSettings) -> list[str]:
    """`--add-scram` arguments (KIP-900) creating every test user's SCRAM credentials at format time."""
    if settings.security is None:
        return []
    arguments = []
    for user in USERS:
        arguments += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password(user)}]"]
    return arguments


def render_properties(props: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in props.items())


def format_features(settings: BrokerSettings) -> list[str]:
    """`--feature` arguments for `kafka.tools.StorageTool format`.

    Kafka 4.2+ turns share groups on for freshly formatted clusters, so the feature is set
    explicitly either way; Kafka 3.x knows neither the feature nor share groups.
    """
    if not supports_share_groups(settings.version):
        return []
    level = 1 if settings.share_groups else 0
    return ["--feature", f"{SHARE_FEATURE}={level}"]


def format_command(java: str, classpath: str, settings: BrokerSettings, cluster_id: str, config: Path) -> list[str]:
    return [
        java,
        # A short-lived tool: skip the optimising JIT, it only costs start-up time.
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
        "-Xmx256m",
        "-cp",
        classpath,
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(config),
        "--ignore-formatted",
        *format_features(settings),
        *scram_format_arguments(settings),
    ]


def random_cluster_id(random_bytes: bytes | None = None) -> str:
    """A Kafka Uuid in its base64url form, as `kafka-storage random-uuid` prints it."""
    while True:
        raw = random_bytes if random_bytes is not None else os.urandom(16)
        random_bytes = None
        text = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        # Kafka avoids ids that start with "-" (they look like command-line flags) and the
        # reserved all-zero / one ids.
        if not text.startswith("-") and raw not in (bytes(16), bytes(15) + b"\x01"):
            return text
