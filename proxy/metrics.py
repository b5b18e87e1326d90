"""Process-wide counters (prometheus-client), exposed with ``--metrics-port``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Gauge, Histogram

#: Awaited on the event loop's thread before each scrape of the default registry, which the metrics
#: endpoint then formats in a worker thread: collectors that read the loop's state read it here.
SCRAPE_PREPARERS: list[Callable[[], Awaitable[None]]] = []

CONNECTIONS_ACCEPTED = Counter(
    "ksp_client_connections", "Client connections accepted", ["listener"]
)
CONNECTIONS_OPEN = Gauge("ksp_client_connections_open", "Client connections currently open")
BAD_FRAMES = Counter(
    "ksp_bad_frames", "Connections closed because of a malformed or oversized frame", ["reason"]
)
UPSTREAM_FAILURES = Counter(
    "ksp_upstream_failures", "Upstream connections that could not be opened or broke"
)
REWRITES = Counter("ksp_response_rewrites", "Responses whose broker endpoints were rewritten", ["api_key"])
CONNECTION_BACKPRESSURE = Counter(
    "ksp_connection_backpressure",
    "Times a client connection paused reading because it held its byte budget (--max-connection-bytes)",
)
RESPONSES_STREAMED = Counter(
    "ksp_responses_streamed",
    "Large upstream responses written to the client as they arrived (cut-through) instead of gathered whole",
)
RESPONSES_SPLICED = Counter(
    "ksp_responses_spliced",
    "Of the streamed responses, those moved socket to socket inside the kernel (splice), never copied through the proxy",
)
REQUESTS_STREAMED = Counter(
    "ksp_requests_streamed",
    "Large client requests (Produce) spliced upstream socket to socket as they arrived (cut-through) instead of gathered whole",
)
CONNECTIONS_REFUSED = Counter(
    "ksp_client_connections_refused",
    "Client connections closed as soon as accepted because --max-connections were open",
    ["listener"],
)
TLS_HANDSHAKE_FAILURES = Counter(
    "ksp_tls_handshake_failures",
    "Client connections closed because their TLS handshake failed or took too long "
    "(reason: timeout, bad_certificate, no_certificate, protocol, closed)",
    ["listener", "reason"],
)
TLS_RELOADS = Counter(
    "ksp_tls_reloads",
    "Reloads of the listener certificate, key and CA files (result: success, failure; a failure keeps the old ones)",
    ["result"],
)

# ----- per API: requests, latency, errors in the responses the proxy builds ----------------------

MAX_API_KEY = 127  # keys above (and keys Kafka does not define) are labelled "other"

REQUESTS = Counter("ksp_requests", "Requests received from clients, forwarded or served by the proxy", ["api"])
REQUEST_SECONDS = Histogram(
    "ksp_request_seconds",
    "Time from a request read off the client connection to its response written back",
    ["api"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RESPONSE_ERRORS = Counter(
    "ksp_response_errors",
    "Error codes in responses the proxy builds itself (top-level and per-partition), by API and code",
    ["api", "error"],
)


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def _api_names() -> dict[int, str]:
    from kio.index import api_key_map

    from codec.extensions import DEFAULT_DESCRIBE_IN_FLIGHT_KEY, DEFAULT_MARK_IN_PROGRESS_KEY

    names = {key: _camel(name) for key, name in api_key_map.items()}
    # Clients never send the KRaft voter APIs (81, 82) to a broker listener; on the proxy's
    # listeners those keys are its extension RPCs.
    names[DEFAULT_MARK_IN_PROGRESS_KEY] = "MarkInProgress"
    names[DEFAULT_DESCRIBE_IN_FLIGHT_KEY] = "DescribeShareGroupInFlight"
    return names


API_NAMES: dict[int, str] = _api_names()


def api_name(api_key: int) -> str:
    """The label of an API key: Kafka's name, or "other" (the label set stays bounded)."""
    return API_NAMES.get(api_key, "other")


class ApiInstruments:
    """The request counter and latency histogram of one API, resolved once.

    Resolving a labelled child costs a dict lookup under a lock per call; the connection's hot
    path instead indexes a list by API key (see :func:`instruments`).
    """

    __slots__ = ("requests", "latency")

    def __init__(self, name: str) -> None:
        self.requests = REQUESTS.labels(api=name)
        self.latency = REQUEST_SECONDS.labels(api=name)


_BY_KEY: list[ApiInstruments | None] = [None] * (MAX_API_KEY + 1)
_OTHER: list[ApiInstruments] = []


def instruments(api_key: int) -> ApiInstruments:
    """Instruments of `api_key` (created on first use, so unused APIs export no series)."""
    if 0 <= api_key <= MAX_API_KEY:
        found = _BY_KEY[api_key]
        if found is None:
            found = _BY_KEY[api_key] = ApiInstruments(api_name(api_key))
        return found
    if not _OTHER:
        _OTHER.append(ApiInstruments("other"))
    return _OTHER[0]


def error_name(code: object) -> str:
    """Kafka's name of an error code, e.g. ``UNKNOWN_MEMBER_ID`` (the numeric code when unknown)."""
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(int(getattr(code, "value", code))).name.upper()
    except ValueError:
        return str(int(getattr(code, "value", code)))


def count_response_errors(api_key: int, response: object) -> None:
    """Count every non-zero ``error_code`` / ``acknowledge_error_code`` in a response entity.

    For responses the proxy builds itself (share APIs, admin RPCs); forwarded responses are
    never decoded, so their errors are the broker's to count.
    """
    count_error_codes(api_key, _error_codes(response))


def count_error_codes(api_key: int, codes) -> None:
    """Count each of `codes` (non-zero error codes) as an error `api_key`'s response carried."""
    api = api_name(api_key)
    for code in codes:
        RESPONSE_ERRORS.labels(api=api, error=error_name(code)).inc()


_ERROR_FIELDS = ("error_code", "acknowledge_error_code")


def _error_codes(entity: object):
    if isinstance(entity, tuple):
        for item in entity:
            yield from _error_codes(item)
        return
    fields = getattr(entity, "__dataclass_fields__", None)
    if fields is None:
        return
    for name in fields:
        value = getattr(entity, name)
        if name in _ERROR_FIELDS:
            if value is not None and int(getattr(value, "value", value)) != 0:
                yield value
        elif isinstance(value, tuple) or hasattr(value, "__dataclass_fields__"):
            yield from _error_codes(value)
GC_PAUSE_SECONDS = Histogram(
    "ksp_gc_pause_seconds",
    "How long each collection of Python's cyclic garbage collector stopped the proxy, per generation "
    "(--gc-threshold)",
    ["generation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, float("inf")),
)
