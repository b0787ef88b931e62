"""Simulator speed and memory, two source trees measured in one run: ``hintpipe simulate`` as a user runs it.

Each measurement is one ``python -m hintpipe simulate ... --json`` process under ``/usr/bin/time`` (wall
seconds and peak resident memory), with ``PYTHONPATH`` set to one tree's ``src``. The trees alternate
(before, after, before, after, ...), so that a machine shared with other work slows both alike, and the
table quotes medians and after / before ratios. Every pair of runs must give the same makespan to the last
bit (the simulator's results do not change, only its speed).

Run from the repository root, with the older tree checked out beside it::

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/simulator-scale/before_after.py --before /tmp/before/src [--only ready]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

#: (label, simulate arguments, repeats: "small" or "big").
CASES: list[tuple[str, list[str], str]] = [
    (
        "128 x 1024, 1f1b, ready, iid:0.2",
        ["--ranks", "128", "--microbatches", "1024", "--hint", "1f1b", "--policy", "ready", "--variability", "iid:0.2"],
        "small",
    ),
    (
        "128 x 1024, 1f1b, ready, mb:0.5",
        ["--ranks", "128", "--microbatches", "1024", "--hint", "1f1b", "--policy", "ready", "--variability", "mb:0.5"],
        "small",
    ),
    (
        "128 x 1024, 1f1b, fixed, iid:0.2",
        ["--ranks", "128", "--microbatches", "1024", "--hint", "1f1b", "--policy", "fixed", "--variability", "iid:0.2"],
        "small",
    ),
    (
        "1024 x 4096, 1f1b, fixed, mb:0.5",
        ["--ranks", "1024", "--microbatches", "4096", "--hint", "1f1b", "--policy", "fixed", "--variability", "mb:0.5"],
        "big",
    ),
    (
        "1024 x 4096, 1f1b, ready, mb:0.5",
        ["--ranks", "1024", "--microbatches", "4096", "--hint", "1f1b", "--policy", "ready", "--variability", "mb:0.5"],
        "big",
    ),
]


def measure(src: str, arguments: list[str]) -> dict[str, Any]:
    """One ``simulate`` process on the tree at ``src``: its JSON, wall seconds and peak resident bytes."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        command = ["/usr/bin/time", "-f", "%e %M", "-o", timing.name, sys.executable, "-m", "hintpipe", "simulate"]
        env = dict(os.environ, PYTHONPATH=src)
        done = subprocess.run([*command, *arguments, "--json"], capture_output=True, text=True, env=env, check=True)
        wall, rss_kib = timing.read().split()[-2:]
    out = json.loads(done.stdout)
    return {
        "wall_s": float(wall),
        "max_rss_bytes": int(rss_kib) * 1024,
        "sim_seconds": out["sim_seconds"],
        "tasks": out["tasks"],
        "makespan": out["makespan_cost"] if "makespan_cost" in out else out["makespan"],  # 0.6 named its unit
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, help="the older tree's src folder")
    parser.add_argument("--after", default="src", help="the newer tree's src folder (default: this one)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per tree of the 128 x 1024 cases (default 5)")
    parser.add_argument("--big-repeats", type=int, default=2, help="runs per tree of 1024 x 4096 (default 2)")
    parser.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    parser.add_argument("--only", action="append", metavar="TEXT", help="only cases whose label has TEXT")
    args = parser.parse_args()
    loads = [os.getloadavg()[0]]
    trees = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for label, arguments, size in CASES:
        if args.only and not any(text in label for text in args.only):
            continue
        runs[label] = {"before": [], "after": []}
        for i in range(args.repeats if size == "small" else args.big_repeats):
            for name, src in trees.items():
                run = measure(src, arguments)
                runs[label][name].append(run)
                loads.append(os.getloadavg()[0])
                print(f"{label} {name} #{i + 1}: {run}", file=sys.stderr, flush=True)
        makespans = {r["makespan"].hex() for name in trees for r in runs[label][name]}
        assert len(makespans) == 1, f"{label}: the trees disagree on the makespan: {makespans}"
    print(
        "| case | tree | tasks/s (median) | sim s | wall s | max RSS | runs |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    )
    ratios = ["| case | tasks/s | wall | peak memory |", "| --- | ---: | ---: | ---: |"]
    for label, by_tree in runs.items():
        medians = {}
        for name, results in by_tree.items():
            sim = statistics.median(r["sim_seconds"] for r in results)
            wall = statistics.median(r["wall_s"] for r in results)
            rss = max(r["max_rss_bytes"] for r in results)
            medians[name] = (sim, wall, rss)
            tasks = results[0]["tasks"]
            print(
                f"| {label} | {name} | {tasks / sim:,.0f} | {sim:.2f} | {wall:.1f} | {rss / 2**30:.2f} GiB | "
                f"{len(results)} |"
            )
        (sim_b, wall_b, rss_b), (sim_a, wall_a, rss_a) = medians["before"], medians["after"]
        ratios.append(f"| {label} | {sim_b / sim_a:.2f}x | {wall_b / wall_a:.2f}x faster | {rss_a / rss_b:.2f}x |")
    print("\nAfter over before (ratios of the medians above):\n\n" + "\n".join(ratios))
    print(
        f"\nPython {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cores, load average "
        f"(1 minute) {min(loads):.1f}-{max(loads):.1f} over the runs; the makespans agree to the bit"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"trees": trees, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
