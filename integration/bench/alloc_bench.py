"""What a large frame costs the allocator, with glibc's defaults and with ``--heap-retain-bytes``
(a script, not a test; docs/benchmarks.md, "Freed memory kept for reuse").

One cycle is what a proxied 1 MB frame does to memory: it arrives in 256 KiB pieces, is joined,
sliced and prefixed, and all of it is freed before the next frame. Each setting runs in a process
of its own (mallopt changes the whole process) and reports milliseconds and page faults per cycle.

    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.alloc_bench [--cycles 300]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from proxy.allocator import retain_freed_memory

RETAINED = 128 * 1024 * 1024
FRAME = bytes(1_000_000)


def cycle() -> bytes:
    pieces = [bytes(FRAME[i:i + 262144]) for i in range(0, len(FRAME), 262144)]
    frame = b"".join(pieces)
    del pieces
    return b"xx" + frame[10:]


def measure(retain_bytes: int, cycles: int) -> dict[str, object]:
    """In this process: apply the setting, warm up, then time `cycles` cycles."""
    tuned = retain_freed_memory(retain_bytes)
    for _ in range(5):
        cycle()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter()
    for _ in range(cycles):
        cycle()
    elapsed = time.perf_counter() - started
    return {"tuned": tuned, "ms_per_cycle": elapsed / cycles * 1e3,
            "faults_per_cycle": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / cycles}


def in_child(retain_bytes: int, cycles: int) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "integration.bench.alloc_bench", "--child", str(retain_bytes),
                          "--cycles", str(cycles)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # measure here with this setting
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.cycles)))
        return 0
    for label, retain in (("glibc defaults (--heap-retain-bytes 0)", 0), ("--heap-retain-bytes 128 MiB", RETAINED)):
        result = in_child(retain, args.cycles)
        print(f"{label:40s} {result['ms_per_cycle']:.3f} ms and {result['faults_per_cycle']:.0f} page faults "
              f"per 1 MB cycle (applied: {result['tuned']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
