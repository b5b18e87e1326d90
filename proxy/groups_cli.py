"""``share-proxy groups``: what Kafka's own ``kafka-share-groups`` tool cannot show.

Kafka's tool (ShareGroupCommand) stays the first-class way to list, describe, reset and delete
share groups through the proxy. This command adds the proxy's in-flight view of a group:

    share-proxy groups --bootstrap-server HOST:PORT --describe --group G [--format table|json]

per share-partition: TOPIC, PARTITION, START-OFFSET (SPSO), END-OFFSET (SPEO, exclusive) and the
in-flight records counted by state. With ``--in-flight`` it lists the in-flight ranges themselves
(the draft KIP's ``kafka-share-groups.sh --in-flight``), filtered on the proxy by
``--state`` / ``--held-longer-than-ms`` / ``--progress-stale-longer-than-ms``: TOPIC, PARTITION,
OFFSETS, STATE, MEMBER, DELIVERY-COUNT, HELD-FOR, LAST-PROGRESS, and STALE after an IN_PROGRESS
range whose last progress is older than the group's staleness threshold.

It speaks the Kafka protocol to the proxy over a plain socket with the project's own codec:
ApiVersions first (is the extension RPC served, under which key? the proxy advertises it as the
feature ``kafka-share-proxy.describe-in-flight.api-key``), then DescribeShareGroupInFlight.

Exit codes: 0 described; 1 the proxy refused (e.g. unknown group, GROUP_ID_NOT_FOUND);
2 bad arguments; 3 the proxy cannot be reached or answered garbage; 4 the server does not serve
DescribeShareGroupInFlight (not a share-proxy, or one started with the key moved elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import trio
from kio.schema.errors import ErrorCode

from codec import extensions
from codec.share_state import DeliveryState
from proxy.config import ENV_PREFIX, parse_host_ports
from proxy.errors import ConfigError, UpstreamError

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NO_EXTENSION = 4

# Record states as the wire carries them (codec.share_state.DeliveryState: KIP-932's, KIP-1191's
# ARCHIVING -- dead-letter write pending -- and the draft's IN_PROGRESS), one column each.
STATE_NAMES = {int(state): state.name for state in DeliveryState}
STATE_COLUMNS: tuple[tuple[int, str], ...] = tuple((int(state), state.name) for state in DeliveryState)
API_KEY_ENV = ENV_PREFIX + "DESCRIBE_IN_FLIGHT_API_KEY"  # the same variable `serve` reads
# What --state accepts: every state the wire can carry.
_STATE_CHOICES = tuple(state.name for state in DeliveryState)


class GroupsCommandError(Exception):
    """A failure with the exit code it maps to."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class InFlightFilters:
    """The request's filters as the CLI was given them; -1 / empty means no filter."""

    states: tuple[int, ...] = ()
    held_longer_than_ms: int = -1
    progress_staleness_ms: int = -1

    @property
    def any(self) -> bool:
        return bool(self.states) or self.held_longer_than_ms >= 0 or self.progress_staleness_ms >= 0


@dataclass(frozen=True, slots=True)
class RangeRow:
    """One in-flight range of ``--in-flight``; times are wall-clock ms as the proxy sent them (-1: none)."""

    topic: str
    topic_id: str
    partition: int
    first_offset: int
    last_offset: int
    state: str
    state_id: int
    member_id: str | None
    delivery_count: int
    acquired_timestamp: int
    in_progress_start_timestamp: int
    last_progress_timestamp: int
    lock_deadline_timestamp: int
    stale: bool

    @property
    def records(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass(frozen=True, slots=True)
class PartitionProblem:
    """A share-partition the proxy answered with an error (shown below the ranges)."""

    topic: str
    partition: int
    error: str


@dataclass(slots=True)
class PartitionRow:
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    counts: dict[str, int] = field(default_factory=dict)  # state name -> records
    error: str | None = None

    @property
    def in_flight(self) -> int:
        return sum(self.counts.values())


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT",
                        help="the proxy's bootstrap address (any of its listeners)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true",
                        help="describe a share group's share-partitions: offsets and in-flight records by state")
    parser.add_argument("--group", metavar="GROUP", help="the share group (required with --describe)")
    parser.add_argument("--in-flight", action="store_true",
                        help="with --describe: list the in-flight record ranges (state, owner, delivery count, "
                             "time held, last progress) instead of counts per share-partition")
    parser.add_argument("--state", action="append", metavar="STATE",
                        help="with --in-flight: only ranges in this state (" + ", ".join(_STATE_CHOICES) +
                             "; case-insensitive; repeat for several)")
    parser.add_argument("--held-longer-than-ms", type=int, metavar="MS",
                        help="with --in-flight: only records acquired more than MS ago")
    parser.add_argument("--progress-stale-longer-than-ms", type=int, metavar="MS",
                        help="with --in-flight: only IN_PROGRESS records whose last progress is more than MS ago")
    parser.add_argument("--command-config", metavar="FILE",
                        help="Kafka client properties for a secured proxy, as Kafka's tools take them: "
                             "security.protocol, ssl.truststore.location (PEM) or ssl.ca.location, sasl.mechanism, "
                             "sasl.jaas.config (docs/security.md)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for the proxy")
    parser.add_argument("--api-key", type=int, default=None, metavar="KEY",
                        help=f"API key the proxy serves DescribeShareGroupInFlight under (default: env {API_KEY_ENV}, "
                             f"else the key the proxy advertises in ApiVersions, else "
                             f"{extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY})")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if args.describe:
            if not args.group:
                raise GroupsCommandError(EXIT_USAGE, "--describe needs --group GROUP")
            filters = _filters(args)
            if filters.any and not args.in_flight:
                raise GroupsCommandError(
                    EXIT_USAGE, "--state, --held-longer-than-ms and --progress-stale-longer-than-ms need --in-flight")
            api_key = args.api_key if args.api_key is not None else _api_key_from_env()  # None: ask the proxy
            bootstrap = _bootstrap(args.bootstrap_server)
            security = _security(args.command_config)
            response = trio.run(describe_in_flight, bootstrap, args.group, api_key, args.timeout, filters, security)
            if args.in_flight:
                ranges, problems = range_rows(response)
                now_ms = int(time.time() * 1000)
                out.write(render_ranges_json(args.group, ranges, problems, filters, now_ms)
                          if args.format == "json" else render_ranges_table(args.group, ranges, problems, now_ms))
                return EXIT_OK
            rows = partition_rows(response)
            out.write(render_json(args.group, rows) if args.format == "json" else render_table(args.group, rows))
            return EXIT_OK
        raise GroupsCommandError(EXIT_USAGE, "nothing to do: give --describe")
    except GroupsCommandError as error:
        print(f"share-proxy groups: {error}", file=err)
        return error.exit_code


def _filters(args: argparse.Namespace) -> InFlightFilters:
    states = []
    for name in args.state or ():
        try:
            states.append(int(DeliveryState[name.strip().upper()]))
        except KeyError:
            raise GroupsCommandError(
                EXIT_USAGE, f"unknown --state {name!r}; one of {', '.join(_STATE_CHOICES)}") from None
    for flag, value in (("--held-longer-than-ms", args.held_longer_than_ms),
                        ("--progress-stale-longer-than-ms", args.progress_stale_longer_than_ms)):
        if value is not None and value < 0:
            raise GroupsCommandError(EXIT_USAGE, f"{flag} must be >= 0, not {value}")
    return InFlightFilters(
        states=tuple(sorted(set(states))),
        held_longer_than_ms=-1 if args.held_longer_than_ms is None else args.held_longer_than_ms,
        progress_staleness_ms=-1 if args.progress_stale_longer_than_ms is None else args.progress_stale_longer_than_ms,
    )


def _security(path: str | None):
    if path is None:
        return None
    from proxy.security import read_client_properties, security_from_client_properties

    try:
        return security_from_client_properties(read_client_properties(path))
    except ConfigError as exc:
        raise GroupsCommandError(EXIT_USAGE, f"--command-config {path}: {exc}") from exc


def _api_key_from_env() -> int | None:
    text = os.environ.get(API_KEY_ENV)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise GroupsCommandError(EXIT_USAGE, f"{API_KEY_ENV}={text!r} is not an API key") from None


def _bootstrap(text: str):
    try:
        return parse_host_ports(text)
    except (ConfigError, ValueError) as exc:
        raise GroupsCommandError(EXIT_USAGE, f"bad --bootstrap-server {text!r}: {exc}") from exc


async def _api_versions(client) -> tuple[dict[int, tuple[int, int]], dict[str, tuple[int, int]]]:
    """(min, max) per API key and the supported features: ApiVersions v3 (which carries the proxy's
    ``kafka-share-proxy.*.api-key`` features), v0 from a server that does not speak v3."""
    from kio.index import load_request_schema

    from proxy.errors import UpstreamError

    try:
        response = await client.call(load_request_schema(18, 3)(
            client_software_name="share-proxy-groups", client_software_version="1"))
    except UpstreamError:
        response = None  # e.g. an UNSUPPORTED_VERSION answer in the v0 shape
    if response is None or int(response.error_code):
        return await client.api_versions(), {}
    versions = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in response.api_keys}
    features = {f.name: (int(f.min_version), int(f.max_version)) for f in response.supported_features or ()}
    return versions, features


def _advertised_key(features: dict[str, tuple[int, int]]) -> int:
    """The key the proxy says it serves DescribeShareGroupInFlight under, else the draft's 82."""
    advertised = features.get(extensions.DESCRIBE_IN_FLIGHT_KEY_FEATURE)
    if advertised is None or advertised[0] != advertised[1]:
        return extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY
    return advertised[0]


async def describe_in_flight(bootstrap, group_id: str, api_key: int | None, timeout: float,
                             filters: InFlightFilters = InFlightFilters(), security=None):
    """ApiVersions, then DescribeShareGroupInFlight for the whole group (filtered); the response entity.

    ``api_key`` None: the key the proxy advertises (ApiVersions feature
    ``kafka-share-proxy.describe-in-flight.api-key``), else 82.
    Raises GroupsCommandError for everything that is not a described group."""
    from proxy.upstream import UpstreamClient, open_first_upstream

    try:
        with trio.fail_after(timeout):
            address, stream = await open_first_upstream(bootstrap, timeout=timeout, max_frame_size=100 * 1024 * 1024,
                                                        security=security, authenticate=security is not None)
            client = UpstreamClient(stream, client_id="share-proxy-groups")
            try:
                versions, features = await _api_versions(client)
                if api_key is None:
                    api_key = _advertised_key(features)
                api = extensions.describe_in_flight(api_key)
                served = versions.get(api_key)
                if served is None or not (served[0] <= api.max_version and api.min_version <= served[1]):
                    raise GroupsCommandError(
                        EXIT_NO_EXTENSION,
                        f"{address} does not serve DescribeShareGroupInFlight (API key {api_key}): it is not a "
                        f"share-proxy, or the proxy serves the extension under another key (--api-key)")
                version = min(served[1], api.max_version)
                request = api.requests[version](
                    group_id=group_id, states=filters.states, held_longer_than_ms=filters.held_longer_than_ms,
                    progress_staleness_ms=filters.progress_staleness_ms)
                try:
                    response = await client.call(request, api.responses[version])
                except UpstreamError as exc:
                    # The key is advertised, but what answers it is not the extension (e.g. a
                    # Kafka API such as AddRaftVoter forwarded to the broker, which hangs up).
                    raise GroupsCommandError(
                        EXIT_NO_EXTENSION,
                        f"{address} advertises API key {api_key} but did not answer DescribeShareGroupInFlight "
                        f"under it ({exc}); is --api-key the key the proxy was started with?") from exc
            finally:
                await client.aclose()
    except trio.TooSlowError:
        raise GroupsCommandError(EXIT_UNREACHABLE, f"the proxy at {_addresses(bootstrap)} did not answer within {timeout:g}s") from None
    except UpstreamError as exc:
        raise GroupsCommandError(EXIT_UNREACHABLE, f"cannot talk to the proxy at {_addresses(bootstrap)}: {exc}") from exc
    code = ErrorCode(int(response.error_code))
    if code is not ErrorCode.none:
        message = response.error_message or code.name
        raise GroupsCommandError(EXIT_REFUSED, f"{code.name.upper()}: {message}")
    return response


def _addresses(bootstrap) -> str:
    return ",".join(str(address) for address in bootstrap)


def partition_rows(response) -> list[PartitionRow]:
    """One row per share-partition, sorted by topic name and partition; records counted by state."""
    rows = []
    for topic in response.topics:
        name = topic.topic_name or str(topic.topic_id)
        for partition in topic.partitions:
            code = ErrorCode(int(partition.error_code))
            counts = {column: 0 for _, column in STATE_COLUMNS}
            for records in partition.records:
                state = STATE_NAMES.get(int(records.state), f"STATE_{int(records.state)}")
                counts[state] = counts.get(state, 0) + int(records.last_offset) - int(records.first_offset) + 1
            rows.append(PartitionRow(
                topic=name, partition=int(partition.partition_index),
                start_offset=int(partition.start_offset), end_offset=int(partition.end_offset),
                counts=counts,
                error=None if code is ErrorCode.none else f"{code.name.upper()}: {partition.error_message or ''}".rstrip(": "),
            ))
    return sorted(rows, key=lambda row: (row.topic, row.partition))


def render_table(group_id: str, rows: list[PartitionRow]) -> str:
    if not rows:
        return f"Share group '{group_id}' has no share-partitions.\n"
    headers = ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "END-OFFSET", "IN-FLIGHT",
               *(column for _, column in STATE_COLUMNS)]
    with_errors = any(row.error for row in rows)
    if with_errors:
        headers.append("ERROR")
    table = [headers]
    for row in rows:
        cells = [group_id, row.topic, str(row.partition), _offset(row.start_offset), _offset(row.end_offset),
                 str(row.in_flight), *(str(row.counts.get(column, 0)) for _, column in STATE_COLUMNS)]
        if with_errors:
            cells.append(row.error or "")
        table.append(cells)
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    return "".join(" ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() + "\n"
                   for line in table)


def range_rows(response) -> tuple[list[RangeRow], list[PartitionProblem]]:
    """Every described range, sorted by topic, partition and offset; and the partitions in error."""
    ranges, problems = [], []
    for topic in response.topics:
        name = topic.topic_name or str(topic.topic_id)
        for partition in topic.partitions:
            code = ErrorCode(int(partition.error_code))
            if code is not ErrorCode.none:
                problems.append(PartitionProblem(name, int(partition.partition_index),
                                                 f"{code.name.upper()}: {partition.error_message or ''}".rstrip(": ")))
            for records in partition.records:
                state_id = int(records.state)
                ranges.append(RangeRow(
                    topic=name, topic_id=str(topic.topic_id), partition=int(partition.partition_index),
                    first_offset=int(records.first_offset), last_offset=int(records.last_offset),
                    state=STATE_NAMES.get(state_id, f"STATE_{state_id}"), state_id=state_id,
                    member_id=records.member_id, delivery_count=int(records.delivery_count),
                    acquired_timestamp=int(records.acquired_timestamp),
                    in_progress_start_timestamp=int(records.in_progress_start_timestamp),
                    last_progress_timestamp=int(records.last_progress_timestamp),
                    lock_deadline_timestamp=int(records.lock_deadline_timestamp),
                    stale=bool(records.stale),
                ))
    ranges.sort(key=lambda r: (r.topic, r.partition, r.first_offset))
    problems.sort(key=lambda p: (p.topic, p.partition))
    return ranges, problems


def _since(timestamp: int, now_ms: int) -> int:
    """ms from ``timestamp`` to ``now_ms`` (-1 when there is none; 0 if the clocks disagree)."""
    return -1 if timestamp < 0 else max(0, now_ms - timestamp)


def format_duration(ms: int) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h07m; ``-`` for none (-1)."""
    if ms < 0:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def render_ranges_table(group_id: str, ranges: list[RangeRow], problems: list[PartitionProblem], now_ms: int) -> str:
    """The --in-flight table; ``now_ms`` (wall clock) is what HELD-FOR and LAST-PROGRESS count from."""
    lines = []
    if ranges:
        headers = ["TOPIC", "PARTITION", "OFFSETS", "STATE", "MEMBER", "DELIVERY-COUNT", "HELD-FOR", "LAST-PROGRESS"]
        table = [headers]
        for row in ranges:
            last_progress = _since(row.last_progress_timestamp, now_ms)
            table.append([
                row.topic, str(row.partition), f"{row.first_offset}-{row.last_offset}", row.state,
                row.member_id or "-", str(row.delivery_count),
                format_duration(_since(row.acquired_timestamp, now_ms)),
                "-" if last_progress < 0 else f"{format_duration(last_progress)} ago",
                "STALE" if row.stale else "",
            ])
        widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
        lines.extend(" ".join(cell.ljust(width) for cell, width in zip(line, widths + [0])).rstrip()
                     for line in table)
    else:
        lines.append(f"Share group '{group_id}' has no in-flight records that match.")
    for problem in problems:
        lines.append(f"{problem.topic} partition {problem.partition}: {problem.error}")
    return "".join(line + "\n" for line in lines)


def render_ranges_json(group_id: str, ranges: list[RangeRow], problems: list[PartitionProblem],
                       filters: InFlightFilters, now_ms: int) -> str:
    return json.dumps({
        "group": group_id,
        "filters": {
            "states": [STATE_NAMES.get(s, f"STATE_{s}") for s in filters.states],
            "held_longer_than_ms": filters.held_longer_than_ms,
            "progress_staleness_ms": filters.progress_staleness_ms,
        },
        "now_ms": now_ms,
        "ranges": [
            {
                "topic": row.topic,
                "topic_id": row.topic_id,
                "partition": row.partition,
                "first_offset": row.first_offset,
                "last_offset": row.last_offset,
                "records": row.records,
                "state": row.state,
                "state_id": row.state_id,
                "member_id": row.member_id,
                "delivery_count": row.delivery_count,
                "acquired_timestamp": row.acquired_timestamp,
                "in_progress_start_timestamp": row.in_progress_start_timestamp,
                "last_progress_timestamp": row.last_progress_timestamp,
                "lock_deadline_timestamp": row.lock_deadline_timestamp,
                "held_for_ms": _since(row.acquired_timestamp, now_ms),
                "last_progress_ago_ms": _since(row.last_progress_timestamp, now_ms),
                "stale": row.stale,
            }
            for row in ranges
        ],
        "errors": [{"topic": p.topic, "partition": p.partition, "error": p.error} for p in problems],
    }, indent=2) + "\n"


def _offset(offset: int) -> str:
    return "-" if offset < 0 else str(offset)


def render_json(group_id: str, rows: list[PartitionRow]) -> str:
    return json.dumps({
        "group": group_id,
        "partitions": [
            {
                "topic": row.topic,
                "partition": row.partition,
                "start_offset": row.start_offset,
                "end_offset": row.end_offset,
                "in_flight": row.in_flight,
                "records_by_state": row.counts,
                "error": row.error,
            }
            for row in rows
        ],
    }, indent=2) + "\n"


__all__ = ["configure", "run", "describe_in_flight", "partition_rows", "render_table", "render_json",
           "range_rows", "render_ranges_table", "render_ranges_json", "format_duration", "InFlightFilters",
           "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "EXIT_UNREACHABLE", "EXIT_NO_EXTENSION"]
