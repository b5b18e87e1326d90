"""The IN_PROGRESS extension RPCs: MarkInProgress and DescribeShareGroupInFlight.

Defined as Kafka-style JSON in ``codec/schemas`` (draft KIP KAFKA-20458) and
serialized by kio through classes built by :mod:`codec.schema`. The draft assigns
api keys 81 and 82, which Apache Kafka already uses for RemoveRaftVoter and
UpdateRaftVoter; the keys are therefore parameters (see docs/codec.md).
"""

from __future__ import annotations

import dataclasses
import functools

from .schema import MessageDefinition

DEFAULT_MARK_IN_PROGRESS_KEY = 81
DEFAULT_DESCRIBE_IN_FLIGHT_KEY = 82

# ApiVersions (v3+) SupportedFeatures entries naming the keys the proxy serves the extension RPCs
# under: MinVersion = MaxVersion = the api key. Clients read them instead of hard-coding 81/82.
MARK_IN_PROGRESS_KEY_FEATURE = "kafka-share-proxy.mark-in-progress.api-key"
DESCRIBE_IN_FLIGHT_KEY_FEATURE = "kafka-share-proxy.describe-in-flight.api-key"

# Kafka's own users of the draft's keys (Kafka 4.4): who is shadowed while we own them.
KAFKA_APIS_SHADOWED = {
    80: "AddRaftVoter (controller and broker listeners)",
    81: "RemoveRaftVoter (controller and broker listeners)",
    82: "UpdateRaftVoter (controller listener only)",
}


@dataclasses.dataclass(frozen=True, slots=True)
class ExtensionApi:
    """One extension RPC: its name, api key, versions and entity classes per version."""

    name: str
    api_key: int
    min_version: int
    max_version: int
    requests: dict[int, type]
    responses: dict[int, type]


@functools.cache
def _extension(name: str, api_key: int) -> ExtensionApi:
    request = MessageDefinition.bundled(f"{name}Request", api_key=api_key)
    response = MessageDefinition.bundled(f"{name}Response", api_key=api_key)
    low, high = request.valid_versions
    return ExtensionApi(
        name=name,
        api_key=api_key,
        min_version=low,
        max_version=high,
        requests={version: request.entity(version) for version in request.versions},
        responses={version: response.entity(version) for version in response.versions},
    )


def mark_in_progress(api_key: int = DEFAULT_MARK_IN_PROGRESS_KEY) -> ExtensionApi:
    """MarkInProgress served under ``api_key``."""
    return _extension("MarkInProgress", api_key)


def describe_in_flight(api_key: int = DEFAULT_DESCRIBE_IN_FLIGHT_KEY) -> ExtensionApi:
    """DescribeShareGroupInFlight served under ``api_key``."""
    return _extension("DescribeShareGroupInFlight", api_key)


# The v0 classes under the default keys, for callers that just build values.
MarkInProgressRequest = mark_in_progress().requests[0]
MarkInProgressResponse = mark_in_progress().responses[0]
DescribeShareGroupInFlightRequest = describe_in_flight().requests[0]
DescribeShareGroupInFlightResponse = describe_in_flight().responses[0]
