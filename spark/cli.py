"""`share-proxy spark audit | dead-letters | fetch-jars` (wired into proxy/cli.py).

Parsing needs no pyspark; running a job does, and without it the command says which extra to install.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys

DEFAULT_EVENTS_TOPIC = "__share_group_events"
DEFAULT_STATE_TOPIC = "__share_proxy_state"
MISSING_PYSPARK = ("share-proxy spark needs pyspark, which is in the 'spark' extra: "
                   "pip install 'kafka-share-proxy[spark]' (or `make venv`, which installs .[test,spark])")


def parse_time(text: str) -> int:
    """Epoch milliseconds from epoch ms digits or an ISO-8601 date/time (UTC when no zone is given)."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        moment = datetime.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch milliseconds nor ISO-8601") from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", required=True, metavar="B",
                        help="the Kafka cluster (host:port[,...]); through the proxy works too")
    parser.add_argument("--output", required=True, metavar="DIR", help="output directory (Parquet)")
    parser.add_argument("--master", default=None, metavar="URL",
                        help="Spark master: local[*] (default), spark://host:7077, yarn, k8s://...")
    parser.add_argument("--events-topic", default=DEFAULT_EVENTS_TOPIC, help="the proxy's share-group event topic")


def configure(parser: argparse.ArgumentParser) -> None:
    jobs = parser.add_subparsers(dest="spark_command", required=True, metavar="JOB")
    audit = jobs.add_parser("audit", help="audit tables (Parquet) and report.html from the event log",
                            description="Audit tables (Parquet) and report.html from the event log and state topic.")
    _common(audit)
    audit.add_argument("--group", default=None, metavar="G", help="only this share group")
    audit.add_argument("--since", type=parse_time, default=None, metavar="T",
                       help="events from this time (ISO-8601 or epoch ms), read from the event topic by timestamp")
    audit.add_argument("--until", type=parse_time, default=None, metavar="T",
                       help="events before this time (ISO-8601 or epoch ms)")
    audit.add_argument("--starting-offsets", default="earliest",
                       help="event-topic start: earliest, or Spark's JSON {\"topic\":{\"0\":offset}}")
    audit.add_argument("--ending-offsets", default="latest",
                       help="event-topic end (exclusive): latest, or Spark's JSON {\"topic\":{\"0\":offset}}")
    audit.add_argument("--state-topic", default=DEFAULT_STATE_TOPIC, help="the proxy's share-state topic")
    audit.add_argument("--stream", action="store_true",
                       help="run as Structured Streaming (needs --checkpoint); tables rewritten every trigger")
    audit.add_argument("--checkpoint", default=None, metavar="DIR", help="streaming checkpoint directory")
    audit.add_argument("--trigger-seconds", type=int, default=60, help="streaming trigger interval")
    audit.add_argument("--available-now", action="store_true",
                       help="streaming: process what the topic holds, then stop")
    audit.set_defaults(_job="spark.audit")

    dead = jobs.add_parser("dead-letters", help="archived records of a group with their payloads, to Parquet",
                           description="Records of group G archived as rejected or at the delivery limit, joined "
                                       "with their payloads from the source topics; idempotent on re-run.")
    _common(dead)
    dead.add_argument("--group", required=True, metavar="G", help="the share group")
    dead.add_argument("--to-topic", default=None, metavar="T",
                      help="also write them to topic T as Kafka dead-letter records (skipping those in T already)")
    dead.set_defaults(_job="spark.dead_letters")

    fetch = jobs.add_parser("fetch-jars", help="resolve the Kafka connector jars from Maven Central into the cache")
    fetch.set_defaults(_job="spark.session")


def check(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot run, or None."""
    if getattr(args, "stream", False) and not args.checkpoint:
        return "--stream needs --checkpoint DIR"
    since, until = getattr(args, "since", None), getattr(args, "until", None)
    if since is not None and until is not None and until <= since:
        return "--until must be after --since"
    return None


def run(args: argparse.Namespace) -> int:
    problem = check(args)
    if problem:
        print(f"share-proxy spark: {problem}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("pyspark") is None:
        print(MISSING_PYSPARK, file=sys.stderr)
        return 2
    module = importlib.import_module(args._job)
    if args._job == "spark.session":
        return module.fetch_jars()
    return int(module.run(args))


def main_argv(argv: list[str]) -> int:
    """`share-proxy spark ARGV` without the proxy's CLI: the entry point of a spark-submit driver script."""
    parser = argparse.ArgumentParser(prog="share-proxy spark")
    configure(parser)
    return run(parser.parse_args(argv))
