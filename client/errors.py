"""The client's one error type, shaped like confluent_kafka's KafkaError / KafkaException.

Broker error codes keep Kafka's numbers and names (from kio's ErrorCode); problems found by the
client itself use librdkafka's negative local codes (``_STATE``, ``_INVALID_ARG``, ...), so code
written against confluent_kafka reads the same.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

# librdkafka's local (negative) codes the client raises itself.
_LOCAL_NAMES = {
    -195: "_TRANSPORT",
    -181: "_SSL",
    -169: "_AUTHENTICATION",
    -192: "_MSG_TIMED_OUT",
    -186: "_INVALID_ARG",
    -185: "_TIMED_OUT",
    -172: "_STATE",
    -170: "_UNSUPPORTED_FEATURE",
    -188: "_UNKNOWN_TOPIC",
    -150: "_FATAL",
    -151: "_INCONSISTENT",
}


class KafkaError:
    """An error code, its name, a message, and whether retrying may help."""

    TRANSPORT = -195
    SSL = -181
    AUTHENTICATION = -169
    INVALID_ARG = -186
    TIMED_OUT = -185
    STATE = -172
    UNSUPPORTED_FEATURE = -170
    UNKNOWN_TOPIC = -188
    FATAL = -150
    INCONSISTENT = -151

    __slots__ = ("_code", "_message", "_retriable")

    def __init__(self, code: int, message: str | None = None, *, retriable: bool | None = None) -> None:
        self._code = int(code)
        self._message = message
        if retriable is None:
            retriable = _broker_error(self._code).retriable if self._code > 0 and _broker_error(self._code) else (
                self._code in (self.TRANSPORT, self.TIMED_OUT))
        self._retriable = retriable

    def code(self) -> int:
        return self._code

    def name(self) -> str:
        if self._code in _LOCAL_NAMES:
            return _LOCAL_NAMES[self._code]
        known = _broker_error(self._code)
        return known.name.upper() if known is not None else f"ERROR_{self._code}"

    def str(self) -> str:
        return self._message or self.name()

    def retriable(self) -> bool:
        return self._retriable

    def fatal(self) -> bool:
        return self._code == self.FATAL

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __str__(self) -> str:
        return f"{self.name()}: {self._message}" if self._message else self.name()

    def __repr__(self) -> str:
        return f"KafkaError({self.name()}, {self._message!r})"


def _broker_error(code: int) -> ErrorCode | None:
    try:
        return ErrorCode(code)
    except ValueError:
        return None


class KafkaException(Exception):
    """Raised by the client; ``args[0]`` is the :class:`KafkaError` (as in confluent_kafka)."""

    def __init__(self, error: KafkaError | int, message: str | None = None) -> None:
        if not isinstance(error, KafkaError):
            error = KafkaError(error, message)
        super().__init__(error)

    @property
    def error(self) -> KafkaError:
        return self.args[0]

    def __str__(self) -> str:
        return str(self.args[0])


def broker_error(code: int, message: str | None = None) -> KafkaError | None:
    """The KafkaError for a response's error code, None for 0."""
    code = int(code)
    if code == 0:
        return None
    return KafkaError(code, message)
