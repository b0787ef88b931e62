"""Readiness at scale: which hint, micro-batch order, policy and budget pay, on identical simulated work.

Every trial draws one set of per-micro-batch and per-task factors (seeded) and runs every
configuration on it: hints x orders x policies x budgets. Speedups are over fixed-order 1F1B
in the given order on the same trial's work; memory is compared with fixed 1F1B's busiest rank,
in slots and weighted by each micro-batch's known size (activations grow with sequence length and
image count, so an order that keeps the longest micro-batches in flight together needs more memory
in the same number of slots). The ``size`` budget admits by size (each micro-batch weighted by its
known size) within exactly fixed 1F1B's busiest rank's size-weighted peak in the given order, and
runs the hint fitted to it (fixed order too); every cell also gives the lower bound at its memory
(:func:`hintpipe.dispatch.bounds.memory_bound`) as the largest speedup it allows.
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

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder
from hintpipe.schedule.task import Kind
from hintpipe.sim.simulator import Sample, SimResult, Simulator

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
#: Budget name -> headroom over the busiest rank's peak (None: each rank its own peak), all in slots.
BUDGETS: dict[str, float | None] = {"rank": None, "device": 0.0, "device+25%": 0.25}
#: Admission by size within fixed 1F1B's busiest rank's size-weighted peak in the given order, per trial.
SIZE = "size"


@dataclasses.dataclass
class Cell:
    """One configuration under one variability, accumulated over trials."""

    makespans: list[float] = dataclasses.field(default_factory=list)
    speedups: list[float] = dataclasses.field(default_factory=list)  # over fixed 1F1B, given order, same trial
    vs_fixed: list[float] = dataclasses.field(default_factory=list)  # over fixed, same hint and order
    efficiency: list[float] = dataclasses.field(default_factory=list)
    peak: float = 0.0  # the most any rank held in any trial (slots)
    sized_peaks: list[float] = dataclasses.field(default_factory=list)  # size-weighted, over fixed 1F1B given's
    bounds: list[float] = dataclasses.field(default_factory=list)  # the largest speedup the bound at its memory allows


def sized_peak(result: SimResult, sizes: np.ndarray[Any, Any]) -> float:
    """The most any rank held at once, each micro-batch weighted by its known size (releases first at a tie),
    read off the timeline of the hint that ran (under admission by size, the hint fitted to the budget)."""
    hint = result.hint
    release = Kind.W if hint.split_backward else Kind.B
    best = 0.0
    for rank, tasks in enumerate(hint.lists):
        forward, freed = np.flatnonzero(tasks.kind == Kind.F), np.flatnonzero(tasks.kind == release)
        starts, ends = np.asarray(result.starts[rank]), np.asarray(result.ends[rank])
        times = np.concatenate([starts[forward], ends[freed]])
        deltas = np.concatenate([sizes[tasks.mb[forward]], -sizes[tasks.mb[freed]]])
        order = np.lexsort((deltas, times))
        best = max(best, float(np.cumsum(deltas[order]).max(initial=0.0)))
    return best


def _slots(result: SimResult) -> float:
    """The most micro-batches any rank held at once, read off the timeline."""
    return sized_peak(result, np.ones(result.hint.microbatches))


def configurations(orders: list[str], budgets: list[str], hints: list[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for hint in hints:
        for order in orders:
            rows.append((hint, order, "fixed", "rank"))
            if SIZE in budgets:
                rows.append((hint, order, "fixed", SIZE))
            for policy in ("greedy", "ready"):
                for budget in budgets:
                    rows.append((hint, order, policy, budget))
    return rows


def study(
    ranks: int,
    microbatches: int,
    trials: int,
    orders: list[str],
    names: list[str],
    budget_names: list[str],
    hint_names: list[str],
    seed: int,
) -> dict[str, Any]:
    hints = {h: generate_hint(h, ranks, microbatches) for h in hint_names}
    sims = {h: Simulator(hint, CostModel.uniform(hint.stages)) for h, hint in hints.items()}
    slots = [b for b in budget_names if b != SIZE]
    budgets = {}
    for h in hint_names:
        for b in slots:
            headroom = BUDGETS[b]
            budgets[(h, b)] = sims[h].budgets() if headroom is None else sims[h].device_budgets(headroom)
    baseline_peak = max(g.peak for g in sims["1f1b"].graphs)
    cells: dict[tuple[str, str, str, str, str], Cell] = defaultdict(Cell)
    began = time.perf_counter()
    for name in names:
        models = [parse_variability(spec) for spec in VARIABILITY.get(name, [name])]
        for trial in range(trials):
            trial_seed = (seed, trial)
            base = None
            base_sized = 1.0
            by_size: list[float] = []  # fixed 1F1B's busiest rank by size, given order: every rank's budget
            for h in hint_names:
                drawn = Sample.draw(hints[h], sims[h].cost_model, models, np.random.default_rng(trial_seed))
                if h == "1f1b":
                    by_size = sims[h].size_budgets(drawn, device_budget_fraction=0.0)
                for order in orders:
                    sample = drawn.ordered(order)
                    sizes = sample.sizes if sample.sizes is not None else np.ones(microbatches)
                    fixed = sims[h].run(Policy.FIXED, sample)
                    if base is None:
                        assert h == "1f1b" and order == "given"
                        base = fixed.makespan
                        base_sized = sized_peak(fixed, sizes)
                    results = [("fixed", "rank", fixed)]
                    if SIZE in budget_names:
                        results.append(
                            (
                                "fixed",
                                SIZE,
                                sims[h].run(Policy.FIXED, sample, activation_budget=by_size, admission=SIZE),
                            )
                        )
                    for policy in (Policy.GREEDY, Policy.READY):
                        for b in budget_names:
                            if b == SIZE:
                                run = sims[h].run(policy, sample, activation_budget=by_size, admission=SIZE)
                            else:
                                run = sims[h].run(policy, sample, activation_budget=budgets[(h, b)])
                            results.append((policy.value, b, run))
                    same_hint_fixed = {b: r.makespan for p, b, r in results if p == "fixed"}
                    for policy_name, b, result in results:
                        cell = cells[(name, h, order, policy_name, b)]
                        cell.makespans.append(result.makespan)
                        cell.speedups.append(base / result.makespan)
                        # ready and greedy against fixed on the same hint (fitted to the same budget under size)
                        cell.vs_fixed.append(same_hint_fixed[SIZE if b == SIZE else "rank"] / result.makespan)
                        cell.efficiency.append(result.efficiency)
                        cell.peak = max(cell.peak, max(result.peak_live) if b != SIZE else _slots(result))
                        cell.sized_peaks.append(sized_peak(result, sizes) / base_sized)
                        cell.bounds.append(base / result.memory_bound)
            print(
                f"  {ranks}x{microbatches} {name} trial {trial + 1}/{trials} ({time.perf_counter() - began:.0f} s)",
                file=sys.stderr,
            )
    return {
        "ranks": ranks,
        "microbatches": microbatches,
        "trials": trials,
        "orders": orders,
        "budgets": budget_names,
        "hints": hint_names,
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
                "bound_speedup": float(np.mean(c.bounds)),
            }
            for key, c in cells.items()
        ],
    }


def markdown(result: dict[str, Any], names: list[str]) -> str:
    by = {(c["variability"], c["hint"], c["order"], c["policy"], c["budget"]): c for c in result["cells"]}
    rows = configurations(result["orders"], result.get("budgets", list(BUDGETS)), result.get("hints", list(HINTS)))
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
    for hint, order, policy, budget in rows:
        cells = [by[(n, hint, order, policy, budget)] for n in names]
        peak = max(c["peak_slots"] for c in cells)
        eff = by.get(("mb:0.5", hint, order, policy, budget))
        efficiency = f"{eff['efficiency']:.3f}" if eff else ""
        lines.append(
            f"| {hint} | {order} | {policy} | {_budget(policy, budget)} | "
            + " | ".join(f"{c['speedup']:.2f}x" for c in cells)
            + f" | {peak:g} | {_sized(cells)} | {efficiency} |"
        )
    lines += ["", _worst(result)]
    if all("bound_speedup" in c for c in result["cells"]):
        lines += [
            "",
            f"**{result['ranks']} x {result['microbatches']}: the largest speedup over fixed 1F1B the lower bound at "
            "each configuration's memory allows (mean over trials; the bound: the busiest rank's work, a "
            "micro-batch's critical path, or what holding each micro-batch for its chain takes in that memory)**",
            "",
            "| hint | order | policy | budget | " + " | ".join(names) + " |",
            "| --- | --- | --- | --- | " + " | ".join("---:" for _ in names) + " |",
        ]
        for hint, order, policy, budget in rows:
            cells = [by[(n, hint, order, policy, budget)] for n in names]
            lines.append(
                f"| {hint} | {order} | {policy} | {_budget(policy, budget)} | "
                + " | ".join(f"{c['bound_speedup']:.2f}x" for c in cells)
                + " |"
            )
    return "\n".join(lines)


def _budget(policy: str, budget: str) -> str:
    return budget if policy != "fixed" or budget == SIZE else "-"


def _worst(result: dict[str, Any]) -> str:
    """The worst ``ready`` trial and cell against ``fixed`` on the same hint, order and work, in slots and by
    size (there ``fixed`` runs the hint fitted to the same budget)."""
    lines = []
    for label, by_size in (("budgets in slots", False), ("admission by size", True)):
        ready = [c for c in result["cells"] if c["policy"] == "ready" and (c["budget"] == SIZE) == by_size]
        if not ready:
            continue
        worst = min(ready, key=lambda c: c["worst_vs_fixed_same_hint"])
        mean = min(ready, key=lambda c: c["vs_fixed_same_hint"])
        lines.append(
            f"Worst `ready` against `fixed` on the same hint, order and work, {label}: one trial "
            f"{worst['worst_vs_fixed_same_hint']:.4f}x ({worst['hint']}, {worst['order']}, {worst['budget']}, "
            f"{worst['variability']}); a cell's mean {mean['vs_fixed_same_hint']:.4f}x ({mean['hint']}, "
            f"{mean['order']}, {mean['budget']}, {mean['variability']})."
        )
    return "\n".join(lines)


def _sized(cells: list[dict[str, Any]]) -> str:
    values = [c["sized_peak"] for c in cells if "sized_peak" in c]
    return f"{max(values):.2f}x" if values else "-"


def headline(result: dict[str, Any], names: list[str], best: str) -> str:
    """The levers one at a time and together, then the same at fixed 1F1B's memory counted by size."""
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
        ("bfw", "given", "ready", SIZE),
        ("zb-h1", "given", "ready", SIZE),
    ]
    for order in result["orders"][1:]:
        rows += [("bfw", order, "fixed", SIZE), ("bfw", order, "ready", SIZE), ("zb-h1", order, "ready", SIZE)]
    bounded = [n for n in ("mb:0.5", "mm:1.0:0.5") if n in names]
    lines = [
        "| hint | order | policy | budget | "
        + " | ".join(names)
        + " | peak | by size | "
        + " | ".join(f"bound {n}" for n in bounded)
        + " |",
        "| --- | --- | --- | --- | " + " | ".join("---:" for _ in [*names, "", "", *bounded]) + " |",
    ]
    for hint, order, policy, budget in rows:
        cells = [by[(n, hint, order, policy, budget)] for n in names if (n, hint, order, policy, budget) in by]
        if len(cells) != len(names):
            continue
        bounds = [by[(n, hint, order, policy, budget)].get("bound_speedup") for n in bounded]
        lines.append(
            f"| {hint} | {order} | {policy} | {_budget(policy, budget)} | "
            + " | ".join(f"{c['speedup']:.2f}x" for c in cells)
            + f" | {max(c['peak_slots'] for c in cells):g} | {_sized(cells)} | "
            + " | ".join("-" if b is None else f"{b:.2f}x" for b in bounds)
            + " |"
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
    parser.add_argument(
        "--variability",
        default=",".join(VARIABILITY),
        help="comma-separated names of VARIABILITY, or specs of one model each (moe:8:2)",
    )
    parser.add_argument("--hints", default=",".join(HINTS), help="comma-separated hints, 1f1b first")
    parser.add_argument(
        "--budgets",
        default=",".join([*BUDGETS, SIZE]),
        help=f"comma-separated budgets: {', '.join(BUDGETS)} (slots) and {SIZE} (default all)".replace("%", "%%"),
    )
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
        hints = args.hints.split(",")
        if hints[0] != "1f1b":
            parser.error("--hints must start with 1f1b (the baseline)")
        budget_names = args.budgets.split(",")
        unknown = set(budget_names) - {*BUDGETS, SIZE}
        if unknown:
            parser.error(f"unknown budgets {sorted(unknown)}: choose from {', '.join([*BUDGETS, SIZE])}")
        result = study(args.ranks, args.microbatches, args.trials, orders, names, budget_names, hints, args.seed)
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
