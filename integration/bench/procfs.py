"""What Linux's /proc says about a process the benchmarks watch: its CPU so far, its memory."""

from __future__ import annotations

import os
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process and all its threads so far, None if it is gone (or not Linux)."""
    try:
        # The command name (field 2) may hold spaces; everything after its ')' splits cleanly.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (fields 14 and 15)


def proc_status_kib(pid: int, field: str) -> int | None:
    """A `VmRSS`-like field of /proc/<pid>/status in KiB, None if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
