"""Simulator scale benchmark: event throughput at 128 ranks, and readiness versus fixed order.

Part 1 times ``Simulator.run`` (the scoreboards plus the virtual clock) for every policy, because
studies at realistic pipeline depths need hundreds of thousands of simulated tasks per second.
Part 2 uses that speed for what the simulator is for: comparing the policies on identical sampled
work under each variability model, with and without slack (room for more micro-batches).

Run from the repository root::

    .venv/bin/python benchmarks/simulator-scale/simulator_scale.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.compare import run_study
from hintpipe.sim.simulator import Sample, Simulator

GOAL = 300_000  # simulated tasks per second the project aims for
HINTS = [("1f1b", 1), ("interleaved-1f1b", 2)]
MODELS = ["iid:0.0", "iid:0.5", "mb:0.5", "straggler:3", "comm:0.2:0.2"]
SLACK = 2.0
REPEATS = 3
# Without a terminal rich assumes 80 columns, too narrow for the throughput table.
console = Console(width=None if sys.stdout.isatty() else 130)


def environment() -> dict[str, Any]:
    """What the figures depend on, read off the machine so the README can quote it."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if "model name" in ln), cpu)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "cpu": cpu, "python": platform.python_version(), "numpy": np.__version__}


def show(title: str, headers: list[str], rows: list[list[str]], left: int) -> str:
    """Print a rich table and return the same table as Markdown (first ``left`` columns text, rest numbers)."""
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i < left else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    align = ["---" if i < left else "---:" for i in range(len(headers))]
    lines = [f"**{title}**", "", *("| " + " | ".join(cells) + " |" for cells in [headers, align, *rows])]
    return "\n".join(lines)


def throughput(ranks: int, microbatches: int) -> list[dict[str, Any]]:
    """Wall seconds of ``Simulator.run`` per hint, cost setting and policy, ``REPEATS`` times each.

    Every repeat builds a fresh simulator, so its first ``ready`` run pays for the plan (a fixed-order
    run on expected costs) and is reported apart as "cold"; later ``ready`` runs reuse the cached plan.
    """
    records: list[dict[str, Any]] = []
    for name, chunks in HINTS:
        hint = generate_hint(name, ranks, microbatches, chunks)
        cost_model = CostModel.uniform(hint.stages)
        noisy = Sample.draw(hint, cost_model, [parse_variability("mb:0.5")], np.random.default_rng(0))
        for costs, sample in [("expected", Sample.expected(hint, cost_model)), ("mb:0.5", noisy)]:
            seconds: dict[str, list[float]] = {"fixed": [], "greedy": [], "ready (cold)": [], "ready (warm)": []}
            builds: list[float] = []
            for _ in range(REPEATS):
                began = time.perf_counter()
                sim = Simulator(hint, cost_model)
                builds.append(time.perf_counter() - began)
                seconds["ready (cold)"].append(sim.run(Policy.READY, sample, slack_microbatches=SLACK).sim_seconds)
                for policy in Policy:
                    key = "ready (warm)" if policy is Policy.READY else policy.value
                    seconds[key].append(sim.run(policy, sample, slack_microbatches=SLACK).sim_seconds)
            for policy_label, values in seconds.items():
                best, median = min(values), statistics.median(values)
                records.append(
                    {
                        "hint": f"{name} x{chunks}",
                        "costs": costs,
                        "policy": policy_label,
                        "tasks": hint.num_tasks,
                        "seconds": values,
                        "best_tasks_per_s": hint.num_tasks / best,
                        "median_tasks_per_s": hint.num_tasks / median,
                        "build_seconds": statistics.median(builds),
                    }
                )
    return records


def study(ranks: int, microbatches: int, trials: int) -> list[dict[str, Any]]:
    """Mean makespans of the three policies on 1F1B under each variability model, for slack 0 and 2."""
    hint = generate_hint("1f1b", ranks, microbatches)
    rows: list[dict[str, Any]] = []
    for spec in MODELS:
        n = 1 if spec == "iid:0.0" else trials  # no noise: every trial would be identical
        for slack in (0.0, SLACK):
            began = time.perf_counter()
            res = run_study(
                hint, list(Policy), variability=[parse_variability(spec)], trials=n, seed=0, slack_microbatches=slack
            )
            fixed = res[Policy.FIXED].makespan
            rows.append(
                {
                    "model": spec,
                    "slack": slack,
                    "trials": n,
                    "fixed_makespan": fixed,
                    "greedy_speedup": fixed / res[Policy.GREEDY].makespan,
                    "ready_speedup": fixed / res[Policy.READY].makespan,
                    "ready_efficiency": res[Policy.READY].efficiency,
                    "fixed_efficiency": res[Policy.FIXED].efficiency,
                    "wall_seconds": time.perf_counter() - began,
                }
            )
    return rows


def perf_row(r: dict[str, Any]) -> list[str]:
    """One throughput record as table cells."""
    best, median = min(r["seconds"]), statistics.median(r["seconds"])
    goal = "yes" if r["median_tasks_per_s"] >= GOAL else "no"
    rate = f"{r['best_tasks_per_s']:,.0f}", f"{r['median_tasks_per_s']:,.0f}"
    return [r["hint"], r["costs"], r["policy"], f"{r['tasks']:,}", f"{best:.3f}", f"{median:.3f}", *rate, goal]


def study_row(r: dict[str, Any]) -> list[str]:
    """One study record as table cells; speedups are fixed makespan / policy makespan."""
    cells = f"{r['greedy_speedup']:.3f}x", f"{r['ready_speedup']:.3f}x", f"{r['ready_efficiency']:.3f}"
    return [r["model"], f"{r['slack']:g}", str(r["trials"]), f"{r['fixed_makespan']:.1f}", *cells]


def main() -> None:
    """Run both parts, print them as rich and Markdown tables, and optionally dump JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="16 ranks x 64 micro-batches, 2 trials (smoke test)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    ranks, microbatches, trials = (16, 64, 2) if args.quick else (128, 1024, 6)
    env = environment()
    console.print(f"environment: {env}")
    began = time.perf_counter()
    with console.status("timing Simulator.run"):
        perf = throughput(ranks, microbatches)
    perf_md = show(
        f"Simulator.run throughput: {ranks} ranks x {microbatches} micro-batches, slack {SLACK:g}, {REPEATS} runs",
        ["hint", "costs", "policy", "tasks", "best s", "median s", "best tasks/s", "median tasks/s", ">= 300k"],
        [perf_row(r) for r in perf],
        left=3,
    )
    builds = ", ".join(f"{r['hint']} ({r['costs']}) {r['build_seconds']:.2f} s" for r in perf if r["policy"] == "fixed")
    console.print(f"Simulator construction per hint and costs (median, not in the figures above): {builds}")
    with console.status("running the readiness study"):
        rows = study(ranks, microbatches, trials)
    study_md = show(
        f"Readiness vs fixed order: 1f1b, {ranks} ranks x {microbatches} micro-batches, mean over trials (seed 0)",
        ["model", "slack", "trials", "fixed makespan", "greedy speedup", "ready speedup", "ready efficiency"],
        [study_row(r) for r in rows],
        left=2,
    )
    total = time.perf_counter() - began
    console.print(f"total wall time {total:.0f} s")
    print(f"\n{perf_md}\n\n{study_md}\n")
    if args.json:
        payload = {"environment": env, "ranks": ranks, "microbatches": microbatches, "trials": trials}
        payload |= {"throughput": perf, "study": rows, "total_seconds": total}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
