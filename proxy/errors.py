"""The proxy runtime's error type: one per layer, as the codec has ``CodecError``.

A :class:`ProxyError` raised while serving a connection closes that connection
only; the listener and every other connection keep running.
"""


class ProxyError(Exception):
    """Base class of errors the proxy runtime raises."""


class ConfigError(ProxyError):
    """The configuration (flags, environment, config file) is invalid."""


class UpstreamError(ProxyError):
    """An upstream broker is unreachable or broke the protocol."""


class ClientProtocolError(ProxyError):
    """A client sent something the proxy cannot serve (bad frame, bad header, ...)."""


class UpstreamAuthenticationError(UpstreamError):
    """The proxy's own SASL authentication at a broker failed (names broker, mechanism and user,
    and Kafka's message; never the password)."""


class UpstreamTlsError(UpstreamError):
    """The TLS handshake with a broker failed: its certificate did not verify, its host name did
    not match, or the two sides share no protocol version or cipher."""
