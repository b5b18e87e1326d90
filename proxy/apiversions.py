"""ApiVersions: what the proxy advertises, and the answer to a version it does not know.

The advertised range of an API is

* for APIs the proxy *forwards*: the broker's range intersected with
  :data:`FORWARDABLE` (what the proxy can parse headers for and may pass on);
* for APIs the proxy *serves itself* (registered with
  :meth:`ApiVersionTable.register_local`, e.g. the share APIs 76-79 and 90-92 in
  later issues): the proxy's own range, whether or not the broker has the API.

From ApiVersions v3 (flexible) the answer may also carry *supported features* the proxy adds
(:meth:`ApiVersionTable.register_feature`): the extension RPCs' api keys travel that way, as
``kafka-share-proxy.*.api-key`` features whose min and max version are the key, so clients read
the keys instead of hard-coding them (docs/codec.md). Stock clients store feature names they do
not know and otherwise ignore them.

An ApiVersions request with a version the proxy does not know is answered the way
Kafka answers it: response header v0, a v0 body with UNSUPPORTED_VERSION and one
entry telling the client the ApiVersions range to retry with.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_payload_module, load_response_schema
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from codec.headers import API_VERSIONS_KEY, FLEXIBILITY, encode_response_header

UNSUPPORTED_VERSION: Final = 35


@dataclass(frozen=True, slots=True)
class VersionRange:
    min_version: int
    max_version: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min_version <= version <= self.max_version

    def intersect(self, other: VersionRange) -> VersionRange | None:
        low, high = max(self.min_version, other.min_version), min(self.max_version, other.max_version)
        return VersionRange(low, high) if low <= high else None


# Share-group APIs (client-facing 76-79, 90-92) and the broker-to-share-coordinator
# state APIs (83-87): the proxy provides share groups itself, so native ones are
# never passed through; later issues register the client-facing ones as local.
NOT_FORWARDED: Final = frozenset({76, 77, 78, 79, 83, 84, 85, 86, 87, 90, 91, 92})

# Why some forwarded ranges are narrower than kio's schemas:
#  * Produce v10+ and Fetch v16+ may carry KIP-951 NodeEndpoints (upstream
#    addresses). Capping costs nothing per response; rewriting would mean decoding
#    every Fetch response (see docs/benchmarks/rewrite.md).
#  * SaslHandshake v0 is followed by unframed SASL tokens the frame reader cannot carry.
VERSION_CAPS: Final[Mapping[int, VersionRange]] = {
    0: VersionRange(0, 9),
    1: VersionRange(0, 15),
    17: VersionRange(1, 1),
}


def _forwardable() -> dict[int, VersionRange]:
    table = {}
    for api_key, flexibility in FLEXIBILITY.items():
        if api_key in NOT_FORWARDED:
            continue
        known = VersionRange(flexibility.min_version, flexibility.max_version)
        cap = VERSION_CAPS.get(api_key)
        narrowed = known.intersect(cap) if cap else known
        if narrowed is not None:
            table[api_key] = narrowed
    return table


FORWARDABLE: Final[Mapping[int, VersionRange]] = _forwardable()


class ApiVersionTable:
    """The proxy's own view: forwardable ranges plus locally served APIs."""

    def __init__(self, forwardable: Mapping[int, VersionRange] = FORWARDABLE) -> None:
        self._forwardable = dict(forwardable)
        self._local: dict[int, VersionRange] = {}
        self._features: dict[str, VersionRange] = {}
        #: Changes whenever the table does: what was narrowed with an older table is stale.
        self.generation = 0

    def register_local(self, api_key: int, versions: VersionRange) -> None:
        """Declare an API the proxy serves itself (advertised even if the broker lacks it)."""
        self._local[api_key] = versions
        self.generation += 1

    def register_feature(self, name: str, versions: VersionRange) -> None:
        """Advertise a supported feature of the proxy's own (ApiVersions v3+ SupportedFeatures)."""
        self._features[name] = versions
        self.generation += 1

    @property
    def features(self) -> dict[str, VersionRange]:
        return dict(self._features)

    @property
    def api_versions_range(self) -> VersionRange:
        return self._forwardable[API_VERSIONS_KEY]

    def accepts(self, api_key: int, api_version: int) -> bool:
        """Whether a client request of this API and version may be served or forwarded."""
        versions = self._local.get(api_key) or self._forwardable.get(api_key)
        return versions is not None and api_version in versions

    def narrow(self, broker: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """Combine the broker's (api_key, min, max) list with the proxy's abilities."""
        result: dict[int, VersionRange] = {}
        for api_key, low, high in broker:
            if api_key in self._local:
                continue
            proxy_range = self._forwardable.get(api_key)
            if proxy_range is None:
                continue
            common = proxy_range.intersect(VersionRange(low, high))
            if common is not None:
                result[api_key] = common
        result.update(self._local)
        return [(key, r.min_version, r.max_version) for key, r in sorted(result.items())]


def _nested(entity: Any, name: str) -> type:
    """A nested struct class of an ApiVersions response: kio's module, or the codec's class (v5)."""
    nested = getattr(type(entity), name, None)
    if isinstance(nested, type):
        return nested
    return getattr(load_payload_module(API_VERSIONS_KEY, entity.__version__, EntityType.response), name)


def narrow_response(entity: Any, table: ApiVersionTable) -> Any:
    """Return an ApiVersions response entity listing only what the proxy can handle (and its features)."""
    api_version_type = _nested(entity, "ApiVersion")
    narrowed = table.narrow((int(a.api_key), int(a.min_version), int(a.max_version)) for a in entity.api_keys)
    changes: dict[str, Any] = {
        "api_keys": tuple(
            api_version_type(api_key=i16(key), min_version=i16(low), max_version=i16(high))
            for key, low, high in narrowed
        ),
    }
    features = table.features
    if features and hasattr(entity, "supported_features"):
        feature_type = _nested(entity, "SupportedFeatureKey")
        kept = tuple(f for f in entity.supported_features if f.name not in features)
        changes["supported_features"] = kept + tuple(
            feature_type(name=name, min_version=i16(r.min_version), max_version=i16(r.max_version))
            for name, r in sorted(features.items())
        )
    return dataclasses.replace(entity, **changes)


def unsupported_version_response(correlation_id: int, supported: VersionRange) -> bytes:
    """Kafka's answer to an ApiVersions request of an unknown version (header v0, body v0)."""
    schema = load_response_schema(API_VERSIONS_KEY, 0)
    module = load_payload_module(API_VERSIONS_KEY, 0, EntityType.response)
    body = schema(
        error_code=ErrorCode(UNSUPPORTED_VERSION),
        api_keys=(
            module.ApiVersion(
                api_key=i16(API_VERSIONS_KEY),
                min_version=i16(supported.min_version),
                max_version=i16(supported.max_version),
            ),
        ),
    )
    buffer = io.BytesIO()
    buffer.write(encode_response_header(correlation_id, 0))
    entity_writer(schema)(buffer, body)
    return buffer.getvalue()
