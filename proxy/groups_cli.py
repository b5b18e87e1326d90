"""``share-proxy groups``: what Kafka's own ``kafka-share-groups`` tool cannot show.

Kafka's tool (ShareGroupCommand) stays the first-class way to list, describe, reset and delete
share groups through the proxy. This command adds the proxy's in-flight view of a group:

    share-proxy groups --bootstrap-server HOST:PORT --describe --group G [--format table|json]

per share-partition: TOPIC, PARTITION, START-OFFSET (SPSO), END-OFFSET (SPEO, exclusive) and the
in-flight records counted by state. It speaks the Kafka protocol to the proxy over a plain socket
with the project's own codec: ApiVersions first (is the extension RPC served, under which key?),
then DescribeShareGroupInFlight.

Exit codes: 0 described; 1 the proxy refused (e.g. unknown group, GROUP_ID_NOT_FOUND);
2 bad arguments; 3 the proxy cannot be reached or answered garbage; 4 the server does not serve
DescribeShareGroupInFlight (not a share-proxy, or one started with the key moved elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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

# Record states as the wire carries them (codec.share_state.DeliveryState: KIP-932's and the
# draft's IN_PROGRESS), one column each; ARCHIVING is never in flight for long and has none.
STATE_NAMES = {int(state): state.name for state in DeliveryState}
STATE_COLUMNS: tuple[tuple[int, str], ...] = tuple(
    (int(state), state.name) for state in DeliveryState if state is not DeliveryState.ARCHIVING)
API_KEY_ENV = ENV_PREFIX + "DESCRIBE_IN_FLIGHT_API_KEY"  # the same variable `serve` reads


class GroupsCommandError(Exception):
    """A failure with the exit code it maps to."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
    parser.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for the proxy")
    parser.add_argument("--api-key", type=int, default=None, metavar="KEY",
                        help=f"API key the proxy serves DescribeShareGroupInFlight under (default: env {API_KEY_ENV}, "
                             f"else {extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY})")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if args.describe:
            if not args.group:
                raise GroupsCommandError(EXIT_USAGE, "--describe needs --group GROUP")
            api_key = args.api_key if args.api_key is not None else _api_key_from_env()
            bootstrap = _bootstrap(args.bootstrap_server)
            response = trio.run(describe_in_flight, bootstrap, args.group, api_key, args.timeout)
            rows = partition_rows(response)
            out.write(render_json(args.group, rows) if args.format == "json" else render_table(args.group, rows))
            return EXIT_OK
        raise GroupsCommandError(EXIT_USAGE, "nothing to do: give --describe")
    except GroupsCommandError as error:
        print(f"share-proxy groups: {error}", file=err)
        return error.exit_code


def _api_key_from_env() -> int:
    text = os.environ.get(API_KEY_ENV)
    if not text:
        return extensions.DEFAULT_DESCRIBE_IN_FLIGHT_KEY
    try:
        return int(text)
    except ValueError:
        raise GroupsCommandError(EXIT_USAGE, f"{API_KEY_ENV}={text!r} is not an API key") from None


def _bootstrap(text: str):
    try:
        return parse_host_ports(text)
    except (ConfigError, ValueError) as exc:
        raise GroupsCommandError(EXIT_USAGE, f"bad --bootstrap-server {text!r}: {exc}") from exc


async def describe_in_flight(bootstrap, group_id: str, api_key: int, timeout: float):
    """ApiVersions, then DescribeShareGroupInFlight for the whole group; the response entity.

    Raises GroupsCommandError for everything that is not a described group."""
    from proxy.upstream import UpstreamClient, open_first_upstream

    api = extensions.describe_in_flight(api_key)
    try:
        with trio.fail_after(timeout):
            address, stream = await open_first_upstream(bootstrap, timeout=timeout, max_frame_size=100 * 1024 * 1024)
            client = UpstreamClient(stream, client_id="share-proxy-groups")
            try:
                versions = await client.api_versions()
                served = versions.get(api_key)
                if served is None or not (served[0] <= api.max_version and api.min_version <= served[1]):
                    raise GroupsCommandError(
                        EXIT_NO_EXTENSION,
                        f"{address} does not serve DescribeShareGroupInFlight (API key {api_key}): it is not a "
                        f"share-proxy, or the proxy serves the extension under another key (--api-key)")
                version = min(served[1], api.max_version)
                request = api.requests[version](group_id=group_id)
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
           "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "EXIT_UNREACHABLE", "EXIT_NO_EXTENSION"]
