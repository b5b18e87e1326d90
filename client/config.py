"""ShareConsumer configuration: the keys the client understands, their defaults and checks.

Unknown keys are refused (a typo such as ``max.poll.record`` must not silently fall back to a
default); values are checked once, here, so the rest of the client works with typed fields.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping

from codec import extensions

from .errors import KafkaError, KafkaException
from .security import ClientSecurity, build_security


class AcknowledgementMode:
    IMPLICIT = "implicit"
    EXPLICIT = "explicit"


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerConfig:
    bootstrap_servers: tuple[tuple[str, int], ...]
    group_id: str
    client_id: str
    acknowledgement_mode: str
    max_poll_records: int
    max_in_flight_progress_batches: int
    fetch_max_bytes: int
    request_timeout_s: float
    socket_connection_setup_timeout_s: float
    check_crcs: bool
    mark_in_progress_api_key: int
    describe_in_flight_api_key: int
    security: ClientSecurity | None = None

    @property
    def explicit(self) -> bool:
        return self.acknowledgement_mode == AcknowledgementMode.EXPLICIT


# key -> (default, description); None default = required.
OPTIONS: dict[str, tuple[object, str]] = {
    "bootstrap.servers": (None, "comma-separated host:port list of the proxy's bootstrap listeners"),
    "group.id": (None, "the share group to join"),
    "client.id": ("ksp-share-consumer", "sent in every request header"),
    "share.acknowledgement.mode": ("implicit", "implicit | explicit"),
    "max.poll.records": (500, "most records one poll() returns (and one ShareFetch asks for)"),
    "max.in-flight.progress.batches": (100, "pending progress batches above which mark_in_progress() flushes at once"),
    "fetch.max.bytes": (52_428_800, "ShareFetch MaxBytes"),
    "request.timeout.ms": (30_000, "how long one request may take beyond its own wait"),
    "socket.connection.setup.timeout.ms": (10_000, "TCP connect timeout"),
    "check.crcs": (True, "verify each record batch's CRC-32C"),
    "ksp.mark.in.progress.api.key": (extensions.DEFAULT_MARK_IN_PROGRESS_KEY,
                                     "MarkInProgress api key when the proxy does not advertise one"),
    "ksp.describe.in.flight.api.key": (extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY,
                                       "DescribeShareGroupInFlight api key when the proxy does not advertise one"),
    # TLS and SASL, with librdkafka's names and meanings (docs/client.md, docs/security.md).
    "security.protocol": ("plaintext", "plaintext | ssl | sasl_plaintext | sasl_ssl"),
    "ssl.ca.location": (None, "PEM CA bundle the proxy's certificate is verified against (default: the system's)"),
    "ssl.certificate.location": (None, "PEM client certificate (mTLS)"),
    "ssl.key.location": (None, "PEM key of the client certificate"),
    "ssl.key.password": (None, "passphrase of an encrypted client key"),
    "ssl.endpoint.identification.algorithm": ("https", "https: check the proxy's host name against its certificate; none"),
    "sasl.mechanism": (None, "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (passed through to the cluster)"),
    "sasl.mechanisms": (None, "librdkafka's alias of sasl.mechanism"),
    "sasl.username": (None, "SASL user name"),
    "sasl.password": (None, "SASL password (never shown in errors or repr)"),
}


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError.INVALID_ARG, message))


def parse_bootstrap(value: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, str) or not value.strip():
        raise _invalid("bootstrap.servers must be a non-empty 'host:port[,host:port...]' string")
    servers = []
    for item in value.split(","):
        item = item.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _invalid(f"bootstrap.servers entry {item!r} is not host:port")
        servers.append((host.strip("[]"), int(port)))
    return tuple(servers)


def _int(key: str, value: object, minimum: int, maximum: int = 2**31 - 1) -> int:
    if isinstance(value, bool):
        raise _invalid(f"{key} must be an integer, not {value!r}")
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise _invalid(f"{key} must be an integer, not {value!r}") from None
    if isinstance(value, float) and number != value:
        raise _invalid(f"{key} must be an integer, not {value!r}")
    if not minimum <= number <= maximum:
        raise _invalid(f"{key} must be between {minimum} and {maximum}, not {number}")
    return number


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _invalid(f"{key} must be true or false, not {value!r}")


def parse_config(config: Mapping[str, object]) -> ConsumerConfig:
    """Check ``config`` (confluent_kafka-style dotted keys) and return the typed configuration."""
    if not isinstance(config, Mapping):
        raise _invalid(f"the configuration must be a dict, not {type(config).__name__}")
    unknown = sorted(key for key in config if key not in OPTIONS)
    if unknown:
        raise _invalid(f"unknown configuration key(s) {', '.join(map(repr, unknown))}; "
                       f"known: {', '.join(sorted(OPTIONS))}")
    values = {key: config.get(key, default) for key, (default, _) in OPTIONS.items()}
    for key in ("bootstrap.servers", "group.id"):
        if values[key] is None:
            raise _invalid(f"{key} is required")
    group_id = values["group.id"]
    if not isinstance(group_id, str) or not group_id:
        raise _invalid("group.id must be a non-empty string")
    client_id = values["client.id"]
    if not isinstance(client_id, str):
        raise _invalid("client.id must be a string")
    mode = values["share.acknowledgement.mode"]
    if mode not in (AcknowledgementMode.IMPLICIT, AcknowledgementMode.EXPLICIT):
        raise _invalid(f"share.acknowledgement.mode must be 'implicit' or 'explicit', not {mode!r}")
    mark_key = _int("ksp.mark.in.progress.api.key", values["ksp.mark.in.progress.api.key"], 0, 32767)
    describe_key = _int("ksp.describe.in.flight.api.key", values["ksp.describe.in.flight.api.key"], 0, 32767)
    if mark_key == describe_key:
        raise _invalid("ksp.mark.in.progress.api.key and ksp.describe.in.flight.api.key must differ")
    return ConsumerConfig(
        bootstrap_servers=parse_bootstrap(values["bootstrap.servers"]),
        group_id=group_id,
        client_id=client_id,
        acknowledgement_mode=str(mode),
        max_poll_records=_int("max.poll.records", values["max.poll.records"], 1),
        max_in_flight_progress_batches=_int("max.in-flight.progress.batches",
                                            values["max.in-flight.progress.batches"], 0),
        fetch_max_bytes=_int("fetch.max.bytes", values["fetch.max.bytes"], 1),
        request_timeout_s=_int("request.timeout.ms", values["request.timeout.ms"], 1) / 1000,
        socket_connection_setup_timeout_s=_int("socket.connection.setup.timeout.ms",
                                               values["socket.connection.setup.timeout.ms"], 1) / 1000,
        check_crcs=_bool("check.crcs", values["check.crcs"]),
        mark_in_progress_api_key=mark_key,
        describe_in_flight_api_key=describe_key,
        security=build_security(values),
    )


def new_member_id() -> str:
    """A member id as Kafka's clients make one (KIP-1082: the client chooses it, 22 chars)."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
