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
    assert orders0.counts == {"AVAILABLE": 2, "ACQUIRED": 3, "ACKNOWLEDGED": 0, "ARCHIVING": 0, "ARCHIVED": 1, "IN_PROGRESS": 0}
    assert rows[2].in_flight == 0 and rows[2].error is None
    assert rows[0].error == "UNKNOWN_TOPIC_OR_PARTITION: Topic id gone."


def test_table_has_one_aligned_line_per_share_partition_and_an_error_column_only_when_needed():
    rows = groups_cli.partition_rows(response())

    lines = groups_cli.render_table("g", rows).splitlines()
    clean = groups_cli.render_table("g", rows[1:]).splitlines()

    assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "END-OFFSET", "IN-FLIGHT", "AVAILABLE",
                                "ACQUIRED", "ACKNOWLEDGED", "ARCHIVING", "ARCHIVED", "IN_PROGRESS", "ERROR"]
    assert lines[1].split()[2:6] == ["0", "-", "-", "0"]
    assert "UNKNOWN_TOPIC_OR_PARTITION" in lines[1]
    assert clean[1].split() == ["g", "orders", "0", "4", "10", "6", "2", "3", "0", "0", "1", "0"]
    assert clean[2].split() == ["g", "orders", "1", "100", "100", "0", "0", "0", "0", "0", "0", "0"]
    assert clean[0].index("START-OFFSET") == clean[1].index("4 ")  # columns line up


def test_empty_group_says_so():
    assert groups_cli.render_table("g", []) == "Share group 'g' has no share-partitions.\n"


def test_json_carries_the_same_values():
    document = json.loads(groups_cli.render_json("g", groups_cli.partition_rows(response())))

    assert document["group"] == "g"
    orders0 = document["partitions"][1]
    assert orders0 == {"topic": "orders", "partition": 0, "start_offset": 4, "end_offset": 10, "in_flight": 6,
                       "records_by_state": {"AVAILABLE": 2, "ACQUIRED": 3, "ACKNOWLEDGED": 0, "ARCHIVING": 0, "ARCHIVED": 1,
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


# ----- --in-flight ----------------------------------------------------------------------------

NOW_MS = 1_700_000_100_000
IN_PROGRESS, ACQUIRED, AVAILABLE = 5, 1, 0


def in_flight_response():
    partition = Response.InFlightPartition
    return Response(group_id="g", topics=(
        Response.InFlightTopic(topic_id=TOPIC_ID, topic_name="orders", partitions=(
            partition(partition_index=1, start_offset=0, end_offset=1, records=(
                Response.InFlightRecords(first_offset=0, last_offset=0, state=ACQUIRED, delivery_count=1,
                                         member_id="m-2", acquired_timestamp=NOW_MS - 850,
                                         lock_deadline_timestamp=NOW_MS + 29_150),)),
            partition(partition_index=0, start_offset=4, end_offset=10, records=(
                Response.InFlightRecords(first_offset=7, last_offset=9, state=AVAILABLE, delivery_count=1,
                                         member_id=None),
                Response.InFlightRecords(first_offset=4, last_offset=5, state=IN_PROGRESS, delivery_count=2,
                                         member_id="m-1", acquired_timestamp=NOW_MS - 125_000,
                                         in_progress_start_timestamp=NOW_MS - 120_000,
                                         last_progress_timestamp=NOW_MS - 100_000,
                                         lock_deadline_timestamp=NOW_MS - 10_000, stale=True),
                Response.InFlightRecords(first_offset=6, last_offset=6, state=IN_PROGRESS, delivery_count=1,
                                         member_id="m-1", acquired_timestamp=NOW_MS - 30_000,
                                         in_progress_start_timestamp=NOW_MS - 29_000,
                                         last_progress_timestamp=NOW_MS - 2_500,
                                         lock_deadline_timestamp=NOW_MS + 87_500),
            )),
        )),
        Response.InFlightTopic(topic_id=uuid.uuid4(), topic_name="gone", partitions=(
            partition(partition_index=3, error_code=3, error_message="Topic id gone."),
        )),
    ))


def test_in_flight_rows_are_sorted_by_topic_partition_and_offset_with_every_field():
    ranges, problems = groups_cli.range_rows(in_flight_response())

    assert [(r.topic, r.partition, r.first_offset, r.last_offset, r.state) for r in ranges] == [
        ("orders", 0, 4, 5, "IN_PROGRESS"), ("orders", 0, 6, 6, "IN_PROGRESS"), ("orders", 0, 7, 9, "AVAILABLE"),
        ("orders", 1, 0, 0, "ACQUIRED")]
    stuck = ranges[0]
    assert (stuck.member_id, stuck.delivery_count, stuck.stale, stuck.records) == ("m-1", 2, True, 2)
    assert (stuck.in_progress_start_timestamp, stuck.last_progress_timestamp) == (NOW_MS - 120_000, NOW_MS - 100_000)
    assert [(p.topic, p.partition, p.error) for p in problems] == [
        ("gone", 3, "UNKNOWN_TOPIC_OR_PARTITION: Topic id gone.")]


def test_in_flight_table_shows_held_for_last_progress_and_a_stale_annotation():
    ranges, problems = groups_cli.range_rows(in_flight_response())

    lines = groups_cli.render_ranges_table("g", ranges, problems, NOW_MS).splitlines()

    assert lines[0].split() == ["TOPIC", "PARTITION", "OFFSETS", "STATE", "MEMBER", "DELIVERY-COUNT", "HELD-FOR",
                                "LAST-PROGRESS"]
    assert lines[1].split() == ["orders", "0", "4-5", "IN_PROGRESS", "m-1", "2", "2m05s", "1m40s", "ago", "STALE"]
    assert lines[2].split() == ["orders", "0", "6-6", "IN_PROGRESS", "m-1", "1", "30.0s", "2.5s", "ago"]
    assert lines[3].split() == ["orders", "0", "7-9", "AVAILABLE", "-", "1", "-", "-"]
    assert lines[4].split() == ["orders", "1", "0-0", "ACQUIRED", "m-2", "1", "850ms", "-"]
    assert lines[5] == "gone partition 3: UNKNOWN_TOPIC_OR_PARTITION: Topic id gone."
    assert lines[0].index("HELD-FOR") == lines[1].index("2m05s")  # columns line up
    assert lines[1].index("STALE") > lines[0].index("LAST-PROGRESS")


def test_in_flight_table_without_matches_says_so():
    assert groups_cli.render_ranges_table("g", [], [], NOW_MS) == "Share group 'g' has no in-flight records that match.\n"


def test_in_flight_json_has_every_field_and_the_filters():
    ranges, problems = groups_cli.range_rows(in_flight_response())
    filters = groups_cli.InFlightFilters(states=(IN_PROGRESS,), progress_staleness_ms=60_000)

    document = json.loads(groups_cli.render_ranges_json("g", ranges, problems, filters, NOW_MS))

    assert document["filters"] == {"states": ["IN_PROGRESS"], "held_longer_than_ms": -1,
                                   "progress_staleness_ms": 60_000}
    assert document["ranges"][0] == {
        "topic": "orders", "topic_id": str(TOPIC_ID), "partition": 0, "first_offset": 4, "last_offset": 5,
        "records": 2, "state": "IN_PROGRESS", "state_id": 5, "member_id": "m-1", "delivery_count": 2,
        "acquired_timestamp": NOW_MS - 125_000, "in_progress_start_timestamp": NOW_MS - 120_000,
        "last_progress_timestamp": NOW_MS - 100_000, "lock_deadline_timestamp": NOW_MS - 10_000,
        "held_for_ms": 125_000, "last_progress_ago_ms": 100_000, "stale": True}
    assert document["ranges"][2]["last_progress_ago_ms"] == -1 and document["ranges"][2]["held_for_ms"] == -1
    assert document["errors"] == [{"topic": "gone", "partition": 3,
                                   "error": "UNKNOWN_TOPIC_OR_PARTITION: Topic id gone."}]


@pytest.mark.parametrize(("ms", "text"), [(-1, "-"), (0, "0ms"), (999, "999ms"), (1_000, "1.0s"), (59_949, "59.9s"),
                                          (60_000, "1m00s"), (3_599_999, "59m59s"), (3_600_000, "1h00m"),
                                          (7_620_000, "2h07m")])
def test_durations_are_short_and_human(ms, text):
    assert groups_cli.format_duration(ms) == text


def test_state_names_are_case_insensitive_and_filters_travel_in_the_request(monkeypatch):
    seen = {}

    async def fake_describe(bootstrap, group_id, api_key, timeout, filters, security=None):
        seen.update(group=group_id, api_key=api_key, filters=filters)
        return in_flight_response()

    monkeypatch.setattr(groups_cli, "describe_in_flight", fake_describe)
    code, out, err = run(["--bootstrap-server", "127.0.0.1:9092", "--describe", "--group", "g", "--in-flight",
                          "--state", "in_progress", "--state", "Acquired", "--progress-stale-longer-than-ms", "30000",
                          "--held-longer-than-ms", "0"])

    assert (code, err) == (groups_cli.EXIT_OK, "")
    assert seen["filters"] == groups_cli.InFlightFilters(states=(ACQUIRED, IN_PROGRESS), held_longer_than_ms=0,
                                                         progress_staleness_ms=30_000)
    assert out.splitlines()[0].startswith("TOPIC")


@pytest.mark.parametrize(("argv", "complaint"), [
    (["--state", "BUSY", "--in-flight"], "BUSY"),
    (["--state", "IN_PROGRESS"], "--in-flight"),
    (["--progress-stale-longer-than-ms", "10"], "--in-flight"),
    (["--in-flight", "--held-longer-than-ms", "-3"], "--held-longer-than-ms"),
])
def test_bad_in_flight_arguments_are_usage_errors_before_any_connection(argv, complaint):
    code, out, err = run(["--bootstrap-server", "127.0.0.1:1", "--describe", "--group", "g", *argv])
    assert (code, out) == (groups_cli.EXIT_USAGE, "")
    assert complaint in err


def test_the_describe_key_is_read_from_the_proxys_advertised_feature():
    feature = "kafka-share-proxy.describe-in-flight.api-key"
    assert groups_cli._advertised_key({feature: (10082, 10082)}) == 10082
    assert groups_cli._advertised_key({}) == 82  # not a share-proxy that advertises it: the draft's key
    assert groups_cli._advertised_key({feature: (1, 2)}) == 82  # not a key: ignored
