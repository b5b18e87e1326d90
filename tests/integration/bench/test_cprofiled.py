"""cprofiled.py: a module run under it is profiled between SIGUSR1 and SIGUSR2, one file each time;
share_bench's window around a run and its summary per ShareFetch."""

from __future__ import annotations

import cProfile
import os
import pstats
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from integration.bench.share_bench import CPROFILED, cprofile_summary, cprofile_window, cprofiled_launcher

# Works until a file named "stop" appears beside it; `spin` is the function to find in the profile.
TARGET = textwrap.dedent("""
    import sys, time
    from pathlib import Path

    def spin():
        return sum(range(200))

    if __name__ == "__main__":
        here = Path(__file__).parent
        print("ready", __name__, sys.argv[1:], sys.path[0], flush=True)
        deadline = time.monotonic() + 30
        while not (here / "stop").exists() and time.monotonic() < deadline:
            spin()
""")


@pytest.fixture
def target(tmp_path):
    (tmp_path / "spinning_target.py").write_text(TARGET)
    # The proxy's launcher with the spinning target in place of the proxy's CLI.
    *launcher, module = cprofiled_launcher(tmp_path / "profiles")
    assert module == "proxy.cli"
    with subprocess.Popen([*launcher, "spinning_target", "--flag"], cwd=tmp_path, stdout=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}) as process:
        yield process, process.stdout.readline().split()
        (tmp_path / "stop").touch()
        process.wait(timeout=30)


def spin_calls(path: Path) -> int:
    return sum(calls for (_file, _line, name), (_primitive, calls, *_rest) in pstats.Stats(str(path)).stats.items()
               if name == "spin")


def test_the_module_runs_as_main_with_its_arguments_and_without_the_bench_directory_on_its_path(target):
    _process, ready = target
    assert ready[:3] == ["ready", "__main__", "['--flag']"]
    assert Path(ready[3]).resolve() != CPROFILED.parent.resolve()


def test_each_signalled_window_writes_its_own_profile_of_the_work_done_in_it(target, tmp_path):
    process, _ready = target
    profiles = tmp_path / "profiles"
    time.sleep(0.2)
    assert not list(profiles.glob("*.pstats"))  # nothing profiled until asked
    for window in (1, 2):
        with cprofile_window(profiles, process.pid, tmp_path / f"window{window}.pstats"):
            time.sleep(0.3)
        assert spin_calls(tmp_path / f"window{window}.pstats") > 100
    assert not list(profiles.glob("*.pstats"))  # each moved to its window's name


def test_a_window_without_a_profiling_proxy_is_nothing(tmp_path):
    with cprofile_window(None, os.getpid(), tmp_path / "unused.pstats"):
        pass
    assert not (tmp_path / "unused.pstats").exists()


def test_the_summary_gives_cpu_and_calls_per_share_fetch(tmp_path):
    def leaf():
        return sum(range(1000))

    def branch():
        for _ in range(3):
            leaf()

    profile = cProfile.Profile()
    profile.runcall(lambda: [branch() for _ in range(10)])
    profile.dump_stats(tmp_path / "run.pstats")

    lines = cprofile_summary(tmp_path / "run.pstats", share_fetches=5, top=40).splitlines()
    assert "over 5 ShareFetches" in lines[0]
    own = lines[1:lines.index("by including calls:")]
    leaf_row = next(line for line in own if line.endswith("(leaf)"))
    branch_row = next(line for line in own if line.endswith("(branch)"))
    assert leaf_row.split()[2] == "6.00"  # 30 calls over 5 ShareFetches
    assert branch_row.split()[2] == "2.00"
    assert float(branch_row.split()[1]) >= float(leaf_row.split()[1])  # branch's total includes its leaves

    in_all = cprofile_summary(tmp_path / "run.pstats", share_fetches=None, top=40).splitlines()
    assert "ms in all" in in_all[0]
    assert next(line for line in in_all if line.endswith("(leaf)")).split()[2] == "30.00"
