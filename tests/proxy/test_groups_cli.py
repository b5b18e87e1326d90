"""`share-proxy groups`: formatting of a DescribeShareGroupInFlight answer, and argument errors."""

from __future__ import annotations

import io
import json
import uuid

import pytest

from codec.extensions import DescribeShareGroupInFlightResponse as Response
from proxy import groups_cli
from proxy.cli import build_parser

TOPIC_ID = uuid.UUID("0b6c1f4e-0000-4000-8000-000000000002")


def records(first, last, state, count=1, member=None):
    return Response.InFlightRecords(first_offset=first, last_offset=last, state=state, delivery_count=count,
                                    member_id=member)


def response():
    partition = Response.InFlightPartition
    return Response(group_id="g", topics=(
        Response.InFlightTopic(topic_id=TOPIC_ID, topic_name="orders", partitions=(
            partition(partition_index=1, start_offset=100, end_offset=100),
            partition(partition_index=0, start_offset=4, end_offset=10, records=(
                records(4, 5, 0), records(6, 6, 4), records(7, 9, 1, member="m-1"))),
        )),
        Response.InFlightTopic(topic_id=uuid.uuid4(), topic_name=None, partitions=(
            partition(partition_index=0, error_code=3, error_message="Topic id gone."),
        )),
    ))


def test_rows_count_records_by_state_sorted_by_topic_and_partition():
    rows = groups_cli.partition_rows(response())

    assert [(r.topic, r.partition) for r in rows][1:] == [("orders", 0), ("orders", 1)]
    orders0 = rows[1]
    assert (orders0.start_offset, orders0.end_offset, orders0.in_flight) == (4, 10, 6)
    assert orders0.counts == {"AVAILABLE": 2, "ACQUIRED": 3, "ACKNOWLEDGED": 0, "ARCHIVED": 1, "IN_PROGRESS": 0}
    assert rows[2].in_flight == 0 and rows[2].error is None
    assert rows[0].error == "UNKNOWN_TOPIC_OR_PARTITION: Topic id gone."


def test_table_has_one_aligned_line_per_share_partition_and_an_error_column_only_when_needed():
    rows = groups_cli.partition_rows(response())

    lines = groups_cli.render_table("g", rows).splitlines()
    clean = groups_cli.render_table("g", rows[1:]).splitlines()

    assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "END-OFFSET", "IN-FLIGHT", "AVAILABLE",
                                "ACQUIRED", "ACKNOWLEDGED", "ARCHIVED", "IN_PROGRESS", "ERROR"]
    assert lines[1].split()[2:6] == ["0", "-", "-", "0"]
    assert "UNKNOWN_TOPIC_OR_PARTITION" in lines[1]
    assert clean[1].split() == ["g", "orders", "0", "4", "10", "6", "2", "3", "0", "1", "0"]
    assert clean[2].split() == ["g", "orders", "1", "100", "100", "0", "0", "0", "0", "0", "0"]
    assert clean[0].index("START-OFFSET") == clean[1].index("4 ")  # columns line up


def test_empty_group_says_so():
    assert groups_cli.render_table("g", []) == "Share group 'g' has no share-partitions.\n"


def test_json_carries_the_same_values():
    document = json.loads(groups_cli.render_json("g", groups_cli.partition_rows(response())))

    assert document["group"] == "g"
    orders0 = document["partitions"][1]
    assert orders0 == {"topic": "orders", "partition": 0, "start_offset": 4, "end_offset": 10, "in_flight": 6,
                       "records_by_state": {"AVAILABLE": 2, "ACQUIRED": 3, "ACKNOWLEDGED": 0, "ARCHIVED": 1,
                                            "IN_PROGRESS": 0},
                       "error": None}


def run(argv: list[str]) -> tuple[int, str, str]:
    args = build_parser().parse_args(["groups", *argv])
    out, err = io.StringIO(), io.StringIO()
    return groups_cli.run(args, out, err), out.getvalue(), err.getvalue()


def test_describe_needs_a_group():
    code, out, err = run(["--bootstrap-server", "127.0.0.1:9092", "--describe"])
    assert (code, out) == (groups_cli.EXIT_USAGE, "")
    assert "--group" in err


def test_a_bad_bootstrap_address_is_a_usage_error():
    code, _, err = run(["--bootstrap-server", "no-port-here", "--describe", "--group", "g"])
    assert code == groups_cli.EXIT_USAGE and "no-port-here" in err


def test_a_bad_api_key_in_the_environment_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(groups_cli.API_KEY_ENV, "eighty-two")
    code, _, err = run(["--bootstrap-server", "127.0.0.1:9092", "--describe", "--group", "g"])
    assert code == groups_cli.EXIT_USAGE and "eighty-two" in err


def test_an_action_is_required():
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["groups", "--bootstrap-server", "127.0.0.1:9092", "--group", "g"])
    assert exited.value.code == 2


def test_nothing_listening_is_unreachable_not_a_crash():
    code, out, err = run(["--bootstrap-server", "127.0.0.1:1", "--describe", "--group", "g", "--timeout", "2"])
    assert (code, out) == (groups_cli.EXIT_UNREACHABLE, "")
    assert "127.0.0.1:1" in err
