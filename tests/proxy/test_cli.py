"""The `share-proxy` entry point."""

from __future__ import annotations

import subprocess
import sys

# Runs the entry point in a fresh interpreter, then reports at exit whether hypothesis was imported
# and whether trio's scheduler is in its reproducible test mode (which importing hypothesis sets).
REPORT_AT_EXIT = """
import atexit, sys
def report():
    import trio._core._run as run
    print(sys.modules.get("hypothesis") is not None, run._ALLOW_DETERMINISTIC_SCHEDULING)
atexit.register(report)
from proxy import cli
{call}
"""


def run_reporting(call: str) -> str:
    done = subprocess.run([sys.executable, "-c", REPORT_AT_EXIT.format(call=call)], capture_output=True, text=True,
                          timeout=120)
    return done.stdout.strip().splitlines()[-1]


def test_the_proxy_process_keeps_hypothesis_and_trios_test_scheduling_out():
    assert run_reporting("cli.main(['serve', '--help'])") == "False False"
    # Without the entry point's guard, kio imports the installed test library and trio switches mode.
    assert run_reporting("cli.build_parser()") == "True True"
