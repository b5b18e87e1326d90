"""spark/cli.py: `share-proxy spark ...` arguments, time parsing, and the error without pyspark."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from proxy.cli import build_parser
from spark import cli


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["spark", *argv])


def test_parse_time_accepts_epoch_ms_and_iso8601() -> None:
    assert cli.parse_time("1767225600000") == 1_767_225_600_000
    assert cli.parse_time("2026-01-01T00:00:00Z") == 1_767_225_600_000
    assert cli.parse_time("2026-01-01T01:00:00+01:00") == 1_767_225_600_000
    assert cli.parse_time("2026-01-01") == 1_767_225_600_000  # no zone: UTC
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_time("yesterday")


def test_audit_arguments() -> None:
    args = parse("audit", "--bootstrap-server", "b:9092", "--output", "/o", "--group", "g",
                 "--since", "2026-01-01", "--master", "spark://m:7077")
    assert (args.bootstrap_server, args.output, args.group, args.since, args.master) == (
        "b:9092", "/o", "g", 1_767_225_600_000, "spark://m:7077")
    assert (args.events_topic, args.state_topic, args.stream) == ("__share_group_events", "__share_proxy_state", False)
    assert args._job == "spark.audit"


def test_dead_letters_arguments_need_a_group() -> None:
    args = parse("dead-letters", "--bootstrap-server", "b", "--group", "g", "--output", "/o", "--to-topic", "dlq.g")
    assert (args.group, args.to_topic, args.master, args._job) == ("g", "dlq.g", None, "spark.dead_letters")
    with pytest.raises(SystemExit):
        parse("dead-letters", "--bootstrap-server", "b", "--output", "/o")


def test_stream_needs_a_checkpoint_and_until_follows_since(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("audit", "--bootstrap-server", "b", "--output", "/o", "--stream")) == 2
    assert "--stream needs --checkpoint" in capsys.readouterr().err
    assert cli.run(parse("audit", "--bootstrap-server", "b", "--output", "/o", "--since", "2000", "--until", "1000")) == 2
    assert "--until must be after --since" in capsys.readouterr().err


def test_without_pyspark_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "pyspark" else real_find_spec(name, *rest))
    assert cli.run(parse("fetch-jars")) == 2
    assert "kafka-share-proxy[spark]" in capsys.readouterr().err


def test_main_argv_is_the_spark_submit_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main_argv(["audit", "--bootstrap-server", "b", "--output", "/o", "--stream"]) == 2
    assert "--stream needs --checkpoint" in capsys.readouterr().err
