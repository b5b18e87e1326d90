"""The codec's error types: one base class, one subclass per kind of bad input.

Every parser in ``codec`` raises only subclasses of :class:`CodecError`; no
``IndexError``, ``struct.error`` or kio exception escapes. Callers that only need
"this input is bad" catch ``CodecError``.
"""


class CodecError(Exception):
    """Base class of every error the codec raises."""


class FrameError(CodecError):
    """A size prefix is negative, oversized, or otherwise unusable."""


class HeaderError(CodecError):
    """A request or response header cannot be parsed or encoded."""


class UnsupportedApi(CodecError):
    """The (api key, version) pair is not served by the registry."""

    def __init__(self, api_key: int, api_version: int | None = None) -> None:
        self.api_key = api_key
        self.api_version = api_version
        what = f"api_key={api_key}" if api_version is None else f"api_key={api_key} version={api_version}"
        super().__init__(f"unsupported API: {what}")


class MessageDecodeError(CodecError):
    """A request or response body does not parse against its schema."""


class MessageEncodeError(CodecError):
    """An entity cannot be serialized (a value out of range for its wire type, ...)."""


class SchemaDefinitionError(CodecError):
    """A JSON message definition in ``codec/schemas`` is malformed (a programming error)."""


class RecordBatchError(CodecError):
    """Record bytes are malformed: bad batch length, unknown magic, bad control record."""


class CorruptRecordBatch(RecordBatchError):
    """A v2 record batch's CRC-32C does not match its contents."""


class StateRecordError(CodecError):
    """A share-state (or proxy group metadata) record key or value cannot be parsed."""


class ShareEventError(CodecError):
    """A share-group event-log record key or value cannot be parsed or encoded."""


class SaslError(CodecError):
    """A SASL exchange cannot go on: the server's message is malformed, untrusted or an error."""
