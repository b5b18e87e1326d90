"""The `share-proxy` command line.

Each subcommand lives in its own module that exposes two functions:
``configure(parser)`` adds its flags, ``run(args) -> int`` does the work.
Modules are imported lazily so `share-proxy --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("proxy.serve", "run the proxy in front of a Kafka cluster"),
    "local-kafka": (
        "proxy.localkafka.cli",
        "start a local single-node Apache Kafka (KRaft) from Maven Central jars",
    ),
    "groups": (
        "proxy.groups_cli",
        "describe a share group's in-flight records through a running proxy (Kafka's kafka-share-groups does the rest)",
    ),
    "spark": (
        "spark.cli",
        "PySpark jobs over the share-group event log: audit tables and report, dead-letter export (docs/spark.md)",
    ),
    "fetch-kafka": (
        "proxy.localkafka.cli_fetch",
        "download (and cache) the Apache Kafka jars for a version, then exit",
    ),
}


class _DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default only when it has one ("(default: None)" on a required option is noise)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="share-proxy",
        description="Kafka-protocol proxy that gives an ordinary Kafka cluster share groups (KIP-932).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command_parser = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            formatter_class=_DefaultsHelpFormatter,
        )
        module = importlib.import_module(module_name)
        module.configure(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def keep_test_libraries_out() -> None:
    """Make hypothesis unimportable in this process unless it is loaded already (a test run).

    The proxy has no use for it, but kio imports it whenever it is installed (the project's test
    extra), and importing it switches trio's scheduler into the reproducible mode trio keeps for
    tests: every batch of ready tasks sorted and shuffled. It also cost 14 MiB of memory
    (docs/benchmarks.md, stop 48)."""
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    keep_test_libraries_out()
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
