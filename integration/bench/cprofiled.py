"""Run a Python module (the proxy's CLI) with its main thread profiled by cProfile on demand.

    python integration/bench/cprofiled.py OUT_DIR MODULE [ARG ...]

SIGUSR1 starts a profile of the main thread, where trio runs the proxy's loop, timed by that
thread's CPU clock: time spent waiting in epoll or blocked in a send counts nothing, and the
state producers' librdkafka threads are not in it. SIGUSR2 stops the profile and writes
``OUT_DIR/cprofile-<pid>-<n>.pstats`` (n = 1, 2, ... per profile) under a temporary name first, so
a reader never sees half a file. `share_bench --cprofile` sends the two signals around each
proxied share run.

Run by path, not with ``-m``: a before/after benchmark runs another source tree's proxy (its
``PYTHONPATH``), which need not have this module. cProfile's own cost per call inflates small
functions (a run streams at a third to a half of its unprofiled rate): read the profile for call
counts and where the CPU goes relative to each other, not for absolute times.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import runpy
import signal
import sys
import time
from pathlib import Path


class OnDemandProfile:
    """cProfile of the thread that installs it, started and stopped by signals."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._numbers = itertools.count(1)
        self._profile: cProfile.Profile | None = None

    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._start)
        signal.signal(signal.SIGUSR2, self._stop)

    def _start(self, *_signal: object) -> None:
        if self._profile is None:
            self._profile = cProfile.Profile(timer=time.thread_time)
            self._profile.enable()

    def _stop(self, *_signal: object) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return
        profile.disable()
        path = self.out_dir / f"cprofile-{os.getpid()}-{next(self._numbers)}.pstats"
        partial = path.with_suffix(".partial")
        profile.dump_stats(partial)
        partial.replace(path)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: cprofiled.py OUT_DIR MODULE [ARG ...]")
    out_dir, module, *arguments = argv
    # Run as a script, this file's directory heads sys.path; the module must not see its neighbours.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    OnDemandProfile(Path(out_dir)).install()
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
