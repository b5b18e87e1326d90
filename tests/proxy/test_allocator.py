"""proxy.allocator: freed frame-sized buffers are reused instead of faulted in afresh.

Each case runs in a subprocess (integration.bench.alloc_bench's measuring mode): mallopt changes
the whole process's allocator."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from integration.bench.alloc_bench import in_child
from proxy.allocator import retain_freed_memory

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


@glibc_only
def test_kept_memory_serves_the_next_frame_without_page_faults(monkeypatch):
    monkeypatch.chdir(ROOT)  # the subprocess runs the bench module from the checkout
    kept = in_child(128 * 1024 * 1024, 50)
    default = in_child(0, 50)
    assert kept["tuned"] and not default["tuned"]
    # glibc's defaults: the frame's ~2 MB of buffers are new pages every cycle (~500 faults);
    # kept: the same memory is reused.
    assert default["faults_per_cycle"] > 200
    assert kept["faults_per_cycle"] < default["faults_per_cycle"] / 10


def test_zero_leaves_the_allocator_alone():
    assert retain_freed_memory(0) is False
