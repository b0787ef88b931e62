"""Readiness at scale: which hint, micro-batch order, policy and budget pay, on identical simulated work.

Every trial draws one set of per-micro-batch and per-task factors (seeded) and runs every
configuration on it: hints x orders x policies x budgets. Speedups are over fixed-order 1F1B
in the given order on the same trial's work; memory is compared with fixed 1F1B's busiest rank,
in slots and weighted by each micro-batch's known size (activations grow with sequence length and
image count, so an order that keeps the longest micro-batches in flight together needs more memory
in the same number of slots).
All figures are simulated (cost units, F = B = W = 1), not measured training time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder
from hintpipe.schedule.task import Kind
from hintpipe.scoreboard import Policy
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import Sample, SimResult, Simulator
from hintpipe.sim.variability import parse_variability

HINTS = ("1f1b", "zb-h1", "bf", "bfw")
VARIABILITY = {
    "none": [],
    "iid:0.5": ["iid:0.5"],
    "mb:0.5": ["mb:0.5"],
    "mm:1.0:0.5": ["mm:1.0:0.5"],
    "mm anti (rho -0.8)": ["mm:1.0:0.5:0.25:-0.8"],
    "straggler:3": ["straggler:3"],
    "comm:0.2:0.2": ["comm:0.2:0.2"],
}
#: Budget name -> headroom over the busiest rank's peak (None: each rank its own peak).
BUDGETS: dict[str, float | None] = {"rank": None, "device": 0.0, "device+25%": 0.25}


@dataclasses.dataclass
class Cell:
    """One configuration under one variability, accumulated over trials."""

    makespans: list[float] = dataclasses.field(default_factory=list)
    speedups: list[float] = dataclasses.field(default_factory=list)  # over fixed 1F1B, given order, same trial
    vs_fixed: list[float] = dataclasses.field(default_factory=list)  # over fixed, same hint and order
    efficiency: list[float] = dataclasses.field(default_factory=list)
    peak: float = 0.0  # the most any rank held in any trial (slots)
    sized_peaks: list[float] = dataclasses.field(default_factory=list)  # size-weighted, over fixed 1F1B given's


Positions = list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]]


def positions(hint: Hint) -> Positions:
    """Per rank: the hint positions of its forwards and their micro-batches, and of the tasks that release
    their activations (``W`` when the backward is split, else ``B``) and theirs."""
    release = Kind.W if hint.split_backward else Kind.B
    out: Positions = []
    for tasks in hint.ranks:
        kinds = np.array([int(t.kind) for t in tasks])
        mbs = np.array([t.mb for t in tasks])
        forward, freed = np.flatnonzero(kinds == int(Kind.F)), np.flatnonzero(kinds == int(release))
        out.append((forward, mbs[forward], freed, mbs[freed]))
    return out


def sized_peak(where: Positions, result: SimResult, sizes: np.ndarray[Any, Any]) -> float:
    """The most any rank held at once, each micro-batch weighted by its known size (releases first at a tie)."""
    best = 0.0
    for rank, (forward, forward_mb, freed, freed_mb) in enumerate(where):
        starts, ends = np.asarray(result.starts[rank]), np.asarray(result.ends[rank])
        times = np.concatenate([starts[forward], ends[freed]])
        deltas = np.concatenate([sizes[forward_mb], -sizes[freed_mb]])
        order = np.lexsort((deltas, times))
        best = max(best, float(np.cumsum(deltas[order]).max(initial=0.0)))
    return best


def configurations(orders: list[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for hint in HINTS:
        for order in orders:
            rows.append((hint, order, "fixed", "rank"))
            for policy in ("greedy", "ready"):
                for budget in BUDGETS:
                    rows.append((hint, order, policy, budget))
    return rows


def study(ranks: int, microbatches: int, trials: int, orders: list[str], names: list[str], seed: int) -> dict[str, Any]:
    hints = {h: generate_hint(h, ranks, microbatches) for h in HINTS}
    where = {h: positions(hint) for h, hint in hints.items()}
    sims = {h: Simulator(hint, CostModel.uniform(hint.num_stages)) for h, hint in hints.items()}
    budgets = {
        (h, b): (sims[h].budgets() if headroom is None else sims[h].device_budgets(headroom))
        for h in HINTS
        for b, headroom in BUDGETS.items()
    }
    baseline_peak = max(g.peak for g in sims["1f1b"].graphs)
    cells: dict[tuple[str, str, str, str, str], Cell] = defaultdict(Cell)
    began = time.perf_counter()
    for name in names:
        models = [parse_variability(spec) for spec in VARIABILITY[name]]
        for trial in range(trials):
            trial_seed = (seed, trial)
            base = None
            base_sized = 1.0
            for h in HINTS:
                drawn = Sample.draw(hints[h], sims[h].cost_model, models, np.random.default_rng(trial_seed))
                for order in orders:
                    sample = drawn.ordered(order)
                    sizes = sample.sizes if sample.sizes is not None else np.ones(microbatches)
                    fixed = sims[h].run(Policy.FIXED, sample)
                    if base is None:
                        assert h == "1f1b" and order == "given"
                        base = fixed.makespan
                        base_sized = sized_peak(where[h], fixed, sizes)
                    results = [("fixed", "rank", fixed)]
                    for policy in (Policy.GREEDY, Policy.READY):
                        for b in BUDGETS:
                            results.append((policy.value, b, sims[h].run(policy, sample, budgets=budgets[(h, b)])))
                    for policy_name, b, result in results:
                        cell = cells[(name, h, order, policy_name, b)]
                        cell.makespans.append(result.makespan)
                        cell.speedups.append(base / result.makespan)
                        cell.vs_fixed.append(fixed.makespan / result.makespan)
                        cell.efficiency.append(result.efficiency)
                        cell.peak = max(cell.peak, max(result.peak_live))
                        cell.sized_peaks.append(sized_peak(where[h], result, sizes) / base_sized)
            print(
                f"  {ranks}x{microbatches} {name} trial {trial + 1}/{trials} ({time.perf_counter() - began:.0f} s)",
                file=sys.stderr,
            )
    return {
        "ranks": ranks,
        "microbatches": microbatches,
        "trials": trials,
        "orders": orders,
        "baseline_peak": baseline_peak,
        "seconds": time.perf_counter() - began,
        "cells": [
            {
                "variability": key[0],
                "hint": key[1],
                "order": key[2],
                "policy": key[3],
                "budget": key[4],
                "makespan": float(np.mean(c.makespans)),
                "speedup": float(np.mean(c.speedups)),
                "vs_fixed_same_hint": float(np.mean(c.vs_fixed)),
                "worst_vs_fixed_same_hint": float(np.min(c.vs_fixed)),
                "efficiency": float(np.mean(c.efficiency)),
                "peak_slots": c.peak,
                "sized_peak": float(np.max(c.sized_peaks)),
            }
            for key, c in cells.items()
        ],
    }


def markdown(result: dict[str, Any], names: list[str]) -> str:
    by = {(c["variability"], c["hint"], c["order"], c["policy"], c["budget"]): c for c in result["cells"]}
    lines = [
        f"**{result['ranks']} ranks x {result['microbatches']} micro-batches, {result['trials']} trials: "
        f"speedup over fixed 1F1B in the given order (mean of per-trial ratios); peak: the most any rank held "
        f"(fixed 1F1B's busiest rank: {result['baseline_peak']:g}); by size: the most any rank held, each "
        f"micro-batch weighted by its known size, over fixed 1F1B's (given order) in the same trial, the "
        f"largest over trials and variabilities**",
        "",
        "| hint | order | policy | budget | " + " | ".join(names) + " | peak | by size | eff. (mb:0.5) |",
        "| --- | --- | --- | --- | " + " | ".join("---:" for _ in names) + " | ---: | ---: | ---: |",
    ]
    for hint, order, policy, budget in configurations(result["orders"]):
        cells = [by[(n, hint, order, policy, budget)] for n in names]
        peak = max(c["peak_slots"] for c in cells)
        eff = by.get(("mb:0.5", hint, order, policy, budget))
        efficiency = f"{eff['efficiency']:.3f}" if eff else ""
        lines.append(
            f"| {hint} | {order} | {policy} | {budget if policy != 'fixed' else '-'} | "
            + " | ".join(f"{c['speedup']:.2f}x" for c in cells)
            + f" | {peak:g} | {_sized(cells)} | {efficiency} |"
        )
    worst = min((c for c in result["cells"] if c["policy"] == "ready"), key=lambda c: c["worst_vs_fixed_same_hint"])
    lines += [
        "",
        f"Worst `ready` trial against `fixed` on the same hint, order and work: "
        f"{worst['worst_vs_fixed_same_hint']:.4f}x ({worst['hint']}, {worst['order']}, {worst['budget']}, "
        f"{worst['variability']}); worst cell mean "
        + "{:.4f}x".format(min(c["vs_fixed_same_hint"] for c in result["cells"] if c["policy"] == "ready")),
    ]
    return "\n".join(lines)


def _sized(cells: list[dict[str, Any]]) -> str:
    values = [c["sized_peak"] for c in cells if "sized_peak" in c]
    return f"{max(values):.2f}x" if values else "-"


def headline(result: dict[str, Any], names: list[str], best: str) -> str:
    """The levers one at a time and together, as the issue's table lists them."""
    by = {(c["variability"], c["hint"], c["order"], c["policy"], c["budget"]): c for c in result["cells"]}
    rows = [
        ("1f1b", "given", "fixed", "rank"),
        ("1f1b", "given", "ready", "rank"),
        ("1f1b", "given", "ready", "device"),
        ("bfw", "given", "fixed", "rank"),
        ("bfw", "given", "ready", "rank"),
        ("bfw", "given", "ready", "device"),
        ("1f1b", best, "fixed", "rank"),
        ("bfw", best, "fixed", "rank"),
        ("bfw", best, "ready", "rank"),
        ("bfw", best, "ready", "device"),
        ("bfw", best, "ready", "device+25%"),
        ("1f1b", "balanced", "fixed", "rank"),
        ("bfw", "balanced", "ready", "device"),
    ]
    lines = [
        "| hint | order | policy | budget | " + " | ".join(names) + " | peak | by size |",
        "| --- | --- | --- | --- | " + " | ".join("---:" for _ in names) + " | ---: | ---: |",
    ]
    for hint, order, policy, budget in rows:
        cells = [by[(n, hint, order, policy, budget)] for n in names if (n, hint, order, policy, budget) in by]
        if len(cells) != len(names):
            continue
        lines.append(
            f"| {hint} | {order} | {policy} | {budget if policy != 'fixed' else '-'} | "
            + " | ".join(f"{c['speedup']:.2f}x" for c in cells)
            + f" | {max(c['peak_slots'] for c in cells):g} | {_sized(cells)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--orders",
        default="given,longest-first,shortest-first,balanced",
        help="comma-separated micro-batch orders, given first (default given,longest-first,shortest-first,balanced)",
    )
    parser.add_argument("--variability", default=",".join(VARIABILITY), help="comma-separated names of VARIABILITY")
    parser.add_argument("--best", default="shortest-first", help="the order the headline table shows as the best")
    parser.add_argument("--json", metavar="FILE", help="also write every cell as JSON")
    parser.add_argument("--from-json", metavar="FILE", help="print the tables of an earlier run's JSON")
    args = parser.parse_args()
    names = args.variability.split(",")
    if args.from_json:
        with open(args.from_json) as source:
            result = json.load(source)
    else:
        orders = [MicrobatchOrder.parse(o).value for o in args.orders.split(",")]
        if orders[0] != "given":
            parser.error("--orders must start with given (the baseline's order)")
        result = study(args.ranks, args.microbatches, args.trials, orders, names, args.seed)
        result["environment"] = {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
        }
    print(headline(result, names, args.best) + "\n")
    print(markdown(result, names))
    print(f"\n{result['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
