"""Run one benchmark against an older checkout and this one, alternating, in one run; print ratios.

The machine is shared, so a before/after comparison is only fair when both sides run under the
same load: rounds alternate (before, after, then after, before, ...) and every figure the benchmark
writes to its ``--json`` file is reported as the median per side and after / before.

    # the older code checked out beside this one:
    git worktree add --detach /tmp/before <base-commit>
    PYTHONPATH=$PWD .venv/bin/python -m integration.bench.side_by_side --before /tmp/before --rounds 3 \\
        -- integration.bench.cost_model --parts replay --shapes 10x100 --replay-records 200000

Each side runs ``python -m MODULE ARGS --json FILE`` in a fresh interpreter with PYTHONPATH (and
the working directory) set to its checkout, so both import their own ``codec`` and ``proxy``. With
``--bench-from-after`` the benchmark module itself is taken from this checkout for both sides (for
a benchmark the older checkout does not have yet; it must import only ``codec`` / ``proxy``).
Load (``os.getloadavg``) is recorded before and after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

LABEL_FIELDS = ("groups", "partitions", "kind", "scenario", "method")


def flatten(value: object, path: str = "") -> Iterator[tuple[str, float]]:
    """(path, number) for every numeric leaf of a JSON value; list items of dicts are named by their
    label fields (groups, partitions, kind, scenario, method) when they have them."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield path, float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            label = str(index)
            if isinstance(item, dict):
                parts = [str(item[f]) for f in LABEL_FIELDS if f in item and not isinstance(item[f], list)]
                if parts:
                    label = " ".join(parts)
            yield from flatten(item, f"{path}[{label}]")


def compare(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]],
            keys: re.Pattern[str] | None = None) -> list[tuple[str, float, float, float | None]]:
    """(key, median before, median after, after / before) for keys present on both sides."""
    rows = []
    common = [k for k in before[0] if all(k in side for side in (*before, *after))]
    for key in common:
        if keys is not None and not keys.search(key):
            continue
        b = statistics.median(run[key] for run in before)
        a = statistics.median(run[key] for run in after)
        rows.append((key, b, a, a / b if b else None))
    return rows


def run_side(label: str, tree: Path, module: str, args: Sequence[str], bench_dir: Path | None,
             out: Path) -> dict:
    env = dict(os.environ)
    if bench_dir is not None:
        env["PYTHONPATH"] = f"{bench_dir}{os.pathsep}{tree}"
        module = "_side_by_side_bench"
    else:
        env["PYTHONPATH"] = str(tree)
    load_before = os.getloadavg()
    command = [sys.executable, "-m", module, *args, "--json", str(out)]
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    load_after = os.getloadavg()
    for line in result.stdout.splitlines():
        print(f"  [{label}] {line}", flush=True)
    if result.returncode != 0:
        raise RuntimeError(f"{label} ({tree}) failed:\n{result.stderr[-4000:]}")
    print(f"  [{label}] load {load_before[0]:.2f} -> {load_after[0]:.2f}", flush=True)
    return {"values": json.loads(out.read_text()), "load_before": load_before, "load_after": load_after}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: side_by_side [options] -- MODULE [ARGS...]")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--after", type=Path, default=Path.cwd(), help="the newer checkout (default: here)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench-from-after", action="store_true",
                        help="run the newer checkout's benchmark module against both sides' code")
    parser.add_argument("--keys", type=re.compile, help="report only keys matching this regex")
    parser.add_argument("--json", type=Path, help="write every run's figures and load here")
    args = parser.parse_args(argv[:split])
    module, *bench_args = argv[split + 1:]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        bench_dir = None
        if args.bench_from_after:
            bench_dir = Path(tmp) / "bench"
            bench_dir.mkdir()
            source = trees["after"].joinpath(*module.split(".")).with_suffix(".py")
            shutil.copy(source, bench_dir / "_side_by_side_bench.py")
        for round_index in range(args.rounds):
            order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for side in order:
                print(f"round {round_index + 1}/{args.rounds}: {side} ({trees[side]})", flush=True)
                out = Path(tmp) / f"{side}-{round_index}.json"
                runs[side].append(run_side(side, trees[side], module, bench_args, bench_dir, out))
    flat = {side: [dict(flatten(run["values"])) for run in side_runs] for side, side_runs in runs.items()}
    rows = compare(flat["before"], flat["after"], args.keys)
    loads = [load for side_runs in runs.values() for run in side_runs for load in (run["load_before"][0],
                                                                                     run["load_after"][0])]
    print(f"\n{module} {' '.join(bench_args)}: {args.rounds} rounds per side, alternating; "
          f"load average {min(loads):.2f}-{max(loads):.2f}")
    width = max((len(key) for key, *_ in rows), default=10)
    print(f"{'figure':{width}s} {'before':>14s} {'after':>14s} {'after/before':>12s}")
    for key, before, after, ratio in rows:
        print(f"{key:{width}s} {before:14,.6g} {after:14,.6g} {ratio if ratio is None else f'{ratio:12.3f}'}")
    if args.json:
        args.json.write_text(json.dumps({"module": module, "args": bench_args, "trees": {k: str(v) for k, v in
                                         trees.items()}, "runs": runs, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
