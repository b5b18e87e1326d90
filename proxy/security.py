"""TLS contexts and service credentials, built once at start from the configuration.

* :class:`ListenerTls` -- the server context the listeners hand every accepted connection
  (certificate, key, optional client-certificate verification for mTLS). Its files are
  re-read when they change (:meth:`ListenerTls.maybe_reload`, at most every
  ``listener_ssl_reload_interval_ms``; SIGHUP forces it): new connections get the new
  context, open ones keep theirs, and a reload that fails keeps the old context.
* :class:`UpstreamSecurity` -- what every connection to the brokers needs: the client TLS
  context (CA bundle, hostname verification, optional client certificate) and the proxy's
  own SASL credentials (used only on the proxy's own connections; clients authenticate
  themselves, byte for byte, on theirs).
* :func:`librdkafka_config` -- the same settings as librdkafka properties, for every
  confluent-kafka client the proxy creates.

A certificate, key or CA that cannot be loaded is a :class:`ConfigError` naming the file.
No message, log line or repr here carries a password: passwords are :class:`Secret` values
and go only to OpenSSL's password callback, librdkafka's config and the SASL exchange.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from proxy import metrics
from proxy.config import ProxyConfig, Secret
from proxy.errors import ConfigError

log = structlog.get_logger("proxy.security")

_MIN_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _reason(exc: BaseException) -> str:
    """OpenSSL's reason without Python's decoration (``[SSL: X] x (_ssl.c:123)`` -> ``x``)."""
    if isinstance(exc, ssl.SSLError):
        text = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else str(exc)
        text = text.split("] ", 1)[-1].split(" (_ssl.c", 1)[0]
        return text.strip() or (exc.reason or type(exc).__name__)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def _check_readable(path: str, what: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _password_callback(secret: Secret | None) -> Callable[[], str]:
    # Always a callable: with none, OpenSSL would prompt on the terminal for an encrypted key.
    return lambda: "" if secret is None else secret.value


def _load_certificate_and_key(context: ssl.SSLContext, side: str, certificate: str, key: str | None,
                              password: Secret | None) -> None:
    _check_readable(certificate, f"{side} certificate")
    if key is not None:
        _check_readable(key, f"{side} private key")
    try:  # is there a certificate in the file at all? (names the right file when there is not)
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=certificate)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"cannot load {side} certificate {certificate}: {_reason(exc)}") from None
    try:
        context.load_cert_chain(certificate, key, password=_password_callback(password))
    except (ssl.SSLError, ValueError) as exc:
        reason = _reason(exc)
        hint = ""
        if "PEM lib" in reason or "bad decrypt" in reason.lower() or "BAD_DECRYPT" in str(exc):
            hint = " (not a PEM private key, or an encrypted key with a wrong or missing key password)"
        elif "KEY_VALUES_MISMATCH" in str(exc) or "mismatch" in reason:
            hint = " (the key does not belong to the certificate)"
        raise ConfigError(f"cannot load {side} private key {key or certificate} for certificate "
                          f"{certificate}: {reason}{hint}") from None


def _load_ca(context: ssl.SSLContext, side: str, path: str) -> None:
    _check_readable(path, f"{side} CA")
    try:
        context.load_verify_locations(cafile=path)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"cannot load {side} CA {path}: {_reason(exc)}") from None


def listener_context(config: ProxyConfig) -> ssl.SSLContext:
    """The listeners' server context; :class:`ConfigError` naming the file that does not load."""
    if config.listener_ssl_certificate_location is None:
        raise ConfigError("TLS listeners need listener_ssl_certificate_location")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _MIN_VERSIONS[config.listener_ssl_min_version]
    if config.listener_ssl_cipher_suites:
        try:
            context.set_ciphers(config.listener_ssl_cipher_suites)
        except ssl.SSLError:
            raise ConfigError(f"listener_ssl_cipher_suites {config.listener_ssl_cipher_suites!r}: "
                              "no cipher matches (an OpenSSL cipher list is expected)") from None
    _load_certificate_and_key(context, "listener", config.listener_ssl_certificate_location,
                              config.listener_ssl_key_location, config.listener_ssl_key_password)
    if config.listener_ssl_client_auth != "none":
        assert config.listener_ssl_ca_location is not None  # config validation requires it
        _load_ca(context, "listener", config.listener_ssl_ca_location)
    context.verify_mode = _CLIENT_AUTH[config.listener_ssl_client_auth]
    return context


def _file_stamp(path: str | None) -> tuple | None:
    if path is None:
        return None
    try:
        status = os.stat(path)
    except OSError:
        return ("missing",)
    return status.st_mtime_ns, status.st_size, status.st_ino


class ListenerTls:
    """The listeners' TLS context, reloaded when its files change (module doc)."""

    def __init__(self, config: ProxyConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._paths = (config.listener_ssl_certificate_location, config.listener_ssl_key_location,
                       config.listener_ssl_ca_location if config.listener_ssl_client_auth != "none" else None)
        stamps = self._stamps()
        self.context = listener_context(config)
        self._loaded = stamps  # what the current context was built from
        self._failed: tuple | None = None  # stamps a reload failed on: not retried until they change
        self._checked_at = clock()
        self.reloads = 0

    def _stamps(self) -> tuple:
        return tuple(_file_stamp(path) for path in self._paths)

    @property
    def interval_s(self) -> float:
        return self._config.listener_ssl_reload_interval_ms / 1000

    def maybe_reload(self, *, force: bool = False) -> bool:
        """Re-read the files if they changed since the last load (checked at most every interval,
        never with interval 0 unless forced). True when a new context was installed."""
        now = self._clock()
        if not force and (self.interval_s <= 0 or now - self._checked_at < self.interval_s):
            return False
        self._checked_at = now
        stamps = self._stamps()
        if not force and (stamps == self._loaded or stamps == self._failed):
            return False
        try:
            context = listener_context(self._config)
        except ConfigError as exc:
            # The message names files only; the key password never reaches it.
            self._failed = stamps
            metrics.TLS_RELOADS.labels(result="failure").inc()
            log.error("listener certificate reload failed; keeping the current certificate", error=str(exc))
            return False
        self.context, self._loaded, self._failed = context, stamps, None
        self.reloads += 1
        metrics.TLS_RELOADS.labels(result="success").inc()
        log.info("listener certificate reloaded", certificate=self._config.listener_ssl_certificate_location,
                 forced=force)
        return True


@dataclass(frozen=True, slots=True)
class ServiceCredentials:
    """The proxy's own SASL identity (its connections, never a client's)."""

    mechanism: str  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str
    password: Secret  # repr shows Secret('***')


@dataclass(frozen=True, slots=True)
class UpstreamSecurity:
    """TLS and the service credentials for connections to the brokers."""

    ssl_context: ssl.SSLContext | None = None
    sasl: ServiceCredentials | None = None

    @classmethod
    def from_config(cls, config: ProxyConfig) -> UpstreamSecurity | None:
        """None for PLAINTEXT; ConfigError naming the file when a CA, certificate or key does not load."""
        context = upstream_context(config) if config.upstream_tls else None
        sasl = None
        if config.upstream_sasl:
            assert config.upstream_sasl_mechanism and config.upstream_sasl_username
            assert config.upstream_sasl_password is not None  # config validation requires all three
            sasl = ServiceCredentials(config.upstream_sasl_mechanism, config.upstream_sasl_username,
                                      config.upstream_sasl_password)
        if context is None and sasl is None:
            return None
        return cls(context, sasl)


def upstream_context(config: ProxyConfig) -> ssl.SSLContext:
    """Client context for the brokers: the CA bundle (or the system's), host names verified
    unless the endpoint identification algorithm is none (the chain is verified regardless,
    as librdkafka does), the client certificate when configured."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if config.upstream_ssl_ca_location is not None:
        # Only the configured bundle is trusted (librdkafka's ssl.ca.location does the same).
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_ca(context, "upstream", config.upstream_ssl_ca_location)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = config.upstream_ssl_endpoint_identification_algorithm == "https"
    context.verify_mode = ssl.CERT_REQUIRED
    if config.upstream_ssl_certificate_location is not None:
        _load_certificate_and_key(context, "upstream", config.upstream_ssl_certificate_location,
                                  config.upstream_ssl_key_location, config.upstream_ssl_key_password)
    return context


def peer_context(config: ProxyConfig) -> ssl.SSLContext:
    """Client context for calls to other instances' TLS listeners (scale-out): their certificates
    verified against ``peer_ssl_ca_location`` (else ``listener_ssl_ca_location``, else the system's
    CAs) with host names checked -- they name the advertised host, as clients verify it; the
    listener certificate presented when the listeners ask clients for one."""
    ca = config.peer_ssl_ca_location or config.listener_ssl_ca_location
    if ca is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_ca(context, "peer", ca)
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = _MIN_VERSIONS[config.listener_ssl_min_version]
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if config.listener_ssl_client_auth != "none" and config.listener_ssl_certificate_location is not None:
        _load_certificate_and_key(context, "peer", config.listener_ssl_certificate_location,
                                  config.listener_ssl_key_location, config.listener_ssl_key_password)
    return context


def peer_security(config: ProxyConfig) -> UpstreamSecurity | None:
    """How one instance reaches another's listener: TLS when the listeners serve it, and the
    service credentials when clients authenticate (the listener passes the exchange through to a
    broker, so a peer call carries the service principal). None: plaintext, unauthenticated."""
    context = peer_context(config) if config.listener_tls else None
    upstream = UpstreamSecurity.from_config(config)
    sasl = upstream.sasl if upstream is not None else None
    if context is None and sasl is None:
        return None
    return UpstreamSecurity(context, sasl)


def librdkafka_config(config: ProxyConfig) -> dict[str, str]:
    """The upstream security settings as librdkafka properties -- only what is set, so a
    PLAINTEXT proxy's clients get exactly the properties they had before."""
    properties: dict[str, str] = {}
    if config.upstream_security_protocol != "PLAINTEXT":
        properties["security.protocol"] = config.upstream_security_protocol
    if config.upstream_tls:
        if config.upstream_ssl_ca_location:
            properties["ssl.ca.location"] = config.upstream_ssl_ca_location
        if config.upstream_ssl_certificate_location:
            properties["ssl.certificate.location"] = config.upstream_ssl_certificate_location
        if config.upstream_ssl_key_location:
            properties["ssl.key.location"] = config.upstream_ssl_key_location
        if config.upstream_ssl_key_password is not None:
            properties["ssl.key.password"] = config.upstream_ssl_key_password.value
        properties["ssl.endpoint.identification.algorithm"] = config.upstream_ssl_endpoint_identification_algorithm
    if config.upstream_sasl:
        assert config.upstream_sasl_password is not None
        properties["sasl.mechanism"] = str(config.upstream_sasl_mechanism)
        properties["sasl.username"] = str(config.upstream_sasl_username)
        properties["sasl.password"] = config.upstream_sasl_password.value
    return properties


def read_client_properties(path: str) -> dict[str, str]:
    """A Kafka client properties file (``key=value`` or ``key: value``, ``#``/``!`` comments), as
    Kafka's tools take with ``--command-config``. Line continuations are not supported."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read command config {path}: {exc.strerror or exc}") from None
    properties: dict[str, str] = {}
    for line in lines:
        text = line.strip()
        if not text or text[0] in "#!":
            continue
        separator = min((index for index in (text.find("="), text.find(":")) if index > 0), default=-1)
        if separator < 0:
            raise ConfigError(f"{path}: not a key=value line: {text.split()[0]!r}")
        properties[text[:separator].strip()] = text[separator + 1:].strip()
    return properties


def security_from_client_properties(properties: dict[str, str]) -> UpstreamSecurity | None:
    """The TLS/SASL settings of a Kafka client properties file (Java's or librdkafka's names) as an
    :class:`UpstreamSecurity` for a connection to the proxy (``share-proxy groups --command-config``).
    Truststores and keystores must be PEM files; SASL needs PLAIN or SCRAM with a user and password
    (``sasl.jaas.config``'s ``username``/``password``, or ``sasl.username``/``sasl.password``)."""
    import re

    from proxy.config import load_config

    def pem_store(kind: str) -> str | None:
        location = properties.get(f"ssl.{kind}.location")
        if location is None:
            return None
        if properties.get(f"ssl.{kind}.type", "JKS").upper() != "PEM":
            raise ConfigError(f"ssl.{kind}.location: only PEM {kind}s are supported here (set ssl.{kind}.type=PEM)")
        return location

    values: dict[str, object] = {"upstream": "127.0.0.1:9092"}  # placeholder: only the security part is used
    values["upstream_security_protocol"] = properties.get("security.protocol", "PLAINTEXT")
    ca = properties.get("ssl.ca.location") or pem_store("truststore")
    keystore = pem_store("keystore")
    certificate = properties.get("ssl.certificate.location") or keystore
    key = properties.get("ssl.key.location") or keystore
    for option, value in (("upstream_ssl_ca_location", ca), ("upstream_ssl_certificate_location", certificate),
                          ("upstream_ssl_key_location", key),
                          ("upstream_ssl_key_password", properties.get("ssl.key.password"))):
        if value:
            values[option] = value
    algorithm = properties.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        values["upstream_ssl_endpoint_identification_algorithm"] = algorithm or "none"  # Java: "" turns it off
    mechanism = properties.get("sasl.mechanism") or properties.get("sasl.mechanisms")
    username, password = properties.get("sasl.username"), properties.get("sasl.password")
    jaas = properties.get("sasl.jaas.config", "")
    if jaas:
        found = dict(re.findall(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"', jaas))
        username = username or found.get("username")
        password = password or found.get("password")
    if values["upstream_security_protocol"].upper().startswith("SASL"):
        values["upstream_sasl_mechanism"] = mechanism or "GSSAPI"  # Kafka's default; refused with a clear message
        for option, value in (("upstream_sasl_username", username), ("upstream_sasl_password", password)):
            if value is not None:
                values[option] = value
    return UpstreamSecurity.from_config(load_config(values, environ={}))
