"""procfs: the benchmarks' reading of a watched process's CPU and memory from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from integration.bench.procfs import proc_status_kib, process_cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def _gone_pid() -> int:
    """The pid of a child that has exited and been reaped: /proc has no entry for it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_process_cpu_seconds_counts_the_work_this_process_does():
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # 50 ms of CPU at least: five clock ticks
        pass
    after = process_cpu_seconds(os.getpid())
    assert before is not None and after is not None
    assert after - before >= 0.03


def test_process_cpu_seconds_of_a_process_that_is_gone_is_none():
    assert process_cpu_seconds(_gone_pid()) is None


def test_proc_status_kib_reads_resident_memory_and_its_peak():
    before = proc_status_kib(os.getpid(), "VmRSS")
    held = b"\x01" * (32 * 1024 * 1024)  # written, so every page is resident
    rss = proc_status_kib(os.getpid(), "VmRSS")
    peak = proc_status_kib(os.getpid(), "VmHWM")
    assert before is not None and rss is not None and peak is not None
    assert rss - before >= 30 * 1024
    assert peak >= rss
    del held


def test_proc_status_kib_is_none_for_a_field_it_lacks_or_a_process_that_is_gone():
    assert proc_status_kib(os.getpid(), "NoSuchField") is None
    assert proc_status_kib(_gone_pid(), "VmRSS") is None
