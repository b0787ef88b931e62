"""Planner benchmark: memory-aware cuts against the memory-blind baselines, planning time, and plan + readiness.

Three parts, all on CPU:

1. gpt-mini (12 blocks), 4 stages, 1F1B, 8 micro-batches: for several per-stage memory budgets, the
   bottleneck time and the largest micro-batch size that fits for hintpipe's plan and for the ``uniform``,
   ``params`` and ``time`` baselines. Profiled once, the profiles reused for every budget. Each plan is
   checked against an exhaustive search over every placement of the cuts (dynamic programming over the
   allowed cut positions, with the planner's own cost model). At one tight budget with recompute, the
   plan's stages are built and run in this process: predicted against measured activation bytes and
   stage time per micro-batch.
2. Planning time at about 2,000 nodes: ``hintpipe.planner.search`` on synthetic chains of 500, 1,000 and
   2,000 nodes for several budgets, and a real gpt-mini fx graph of about 2,000 nodes through the whole of
   ``plan()``.
3. The combined result on 2 ranks with variable sequence lengths: fixed order on the ``time`` baseline's
   cuts against the planned cuts run with ``ready`` and the plan's room for activations as its byte budget.

Run from the repository root::

    .venv/bin/python benchmarks/planner-gpt-mini/planner_gpt_mini.py [--quick] [--parts 123] [--json FILE]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch
from hintpipe.planner.baselines import balanced_cuts
from hintpipe.planner.capture import capture
from hintpipe.planner.memory import MemoryModel, stage_cost
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.partition import Partition, max_microbatch_size
from hintpipe.planner.plan import Plan, node_tables, plan
from hintpipe.planner.profile import profile
from hintpipe.planner.search import PlanError, search
from hintpipe.planner.tables import NodeTables
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.loop.executor import StageExecutor, as_input
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.runtime.transport.wire import Value
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintName

MiB = 2**20
STAGES = 4
MICROBATCHES = 8
HINT = "1f1b"
REPEATS = 5  # profiling repeats per node
SLOW_SEARCH_S = 2.0  # slower searches are timed once, without the bracketing
SEED = 0
NAMES = ("hintpipe", "uniform", "params", "time")
# Without a terminal rich assumes 80 columns, too narrow for the tables.
console = Console(width=None if sys.stdout.isatty() else 160)


# -- environment and tables ------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """What the figures depend on, read off the machine."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if "model name" in ln), cpu)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cores": cores,
        "cpu": cpu,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
    }


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


def size_text(value: float) -> str:
    """Bytes as MiB (KiB below 1 MiB), or "unbounded"."""
    if math.isinf(value):
        return "unbounded"
    return f"{value / MiB:.2f}MiB" if value >= MiB else f"{value / 1024:.0f}KiB"


def ratio(a: float, b: float) -> str:
    if b == 0:
        return "inf" if a > 0 else "-"
    return f"{a / b:.2f}x"


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[Any, list[float]]:
    """``fn()``'s last result and the wall seconds of each of ``repeats`` calls."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return result, seconds


def memory_model(budget: float, scale: float = 1.0, stages: int = STAGES) -> MemoryModel:
    """The model ``plan()`` builds for a CPU model: Adam (factor 2), no offload."""
    hint = generate_hint(HintName.parse(HINT), stages, MICROBATCHES, 1)
    return MemoryModel(
        inflight=hint.stage_peaks,
        budgets=(budget,) * stages,
        optimizer_factor=2.0,
        host_bandwidth=0.0,
        scale=scale,
    )


# -- exhaustive search (dynamic programming over every cut placement) ------------------------------------


def exhaustive_bottleneck(tables: NodeTables, memory: MemoryModel, stages: int) -> float | None:
    """The smallest bottleneck (seconds) over every placement of the cuts at allowed positions, with
    ``stage_cost``'s own savings per stage; None when no placement fits."""
    n = tables.size
    best: dict[int, float] = {0: 0.0}  # end of the previous stage -> best bottleneck so far
    for s in range(stages):
        ends = [n] if s == stages - 1 else list(tables.allowed)
        reached: dict[int, float] = {}
        for c in ends:
            for a, so_far in best.items():
                if a >= c:
                    continue
                cost = stage_cost(tables, memory, s, a, c)
                if cost.feasible:
                    value = max(so_far, cost.time)
                    if value < reached.get(c, math.inf):
                        reached[c] = value
        best = reached
    return best.get(n)


def exhaustive(tables: NodeTables, memory: MemoryModel, stages: int, profiled: int) -> tuple[float | None, int]:
    """(smallest bottleneck at the profiled size, largest micro-batch size), both by exhaustive search."""
    return exhaustive_bottleneck(tables, memory, stages), exhaustive_largest(tables, memory, stages, profiled)


def exhaustive_largest(tables: NodeTables, memory: MemoryModel, stages: int, profiled: int) -> int:
    """Largest micro-batch size for which some placement of the cuts fits (the planner's bracketing)."""
    return max_microbatch_size(
        tables, memory, stages, profiled, lambda m: exhaustive_bottleneck(tables, m, stages) is not None
    )


# -- part 1: partitions under per-stage budgets ------------------------------------------------------------


def part1(quick: bool) -> tuple[dict[str, Any], list[str]]:
    config = ModelConfig(
        "gpt-mini", layers=4 if quick else 12, hidden=64 if quick else 128, heads=4, vocab=128, max_seq_len=257
    )
    seq_len, size = (64 if quick else 128), 4
    model = nn.Sequential(*build_layers(config))
    xs, ys, _ = make_batch(config, 1, size, SeqLenDist(seq_len), 0)
    example, target = xs[0], ys[0]
    console.print(f"[bold]part 1[/bold]: gpt-mini {config.layers} blocks, hidden {config.hidden}, profiling ...")
    ample, (profile_s,) = timed(
        lambda: plan(model, example, ranks=STAGES, microbatches=MICROBATCHES, hint=HINT, repeats=REPEATS)
    )
    tables = node_tables(list(ample.profiles), ample.graph)
    time_peak = max(s.memory_bytes for s in ample.baselines["time"].stages)
    if quick:
        budgets = [round(f * time_peak / MiB, 1) * MiB for f in (0.5, 0.7, 1.2, 2.4)]
    else:
        budgets = [mib * MiB for mib in (24, 32, 40, 48, 64, 128)]
    records: list[dict[str, Any]] = []
    rows: list[list[str]] = []
    plans: dict[float, Plan] = {}
    for budget in budgets:
        memory = memory_model(budget)
        record: dict[str, Any] = {"budget_bytes": budget}
        try:
            planned, (plan_s,) = timed(
                functools.partial(
                    plan,
                    model,
                    example,
                    ranks=STAGES,
                    microbatches=MICROBATCHES,
                    stage_memory=budget,
                    profiles=ample.profiles,
                )
            )
        except PlanError as exc:
            # Does some placement of the cuts fit? The exhaustive search answers for the cost model.
            (best, largest), (check_s,) = timed(functools.partial(exhaustive, tables, memory, STAGES, size))
            console.print(f"{size_text(budget)}: PlanError: {exc}")
            record |= {
                "error": str(exc),
                "exhaustive_bottleneck_ms": None if best is None else best * 1e3,
                "exhaustive_largest_microbatch": largest,
                "exhaustive_seconds": check_s,
            }
            records.append(record)
            exhaustive_text = f"{'-' if best is None else f'{best * 1e3:.2f}'} / {largest}"
            rows.append([size_text(budget), "hintpipe", "PlanError", *[""] * 8, exhaustive_text])
            continue
        plans[budget] = planned
        (best, largest), (check_s,) = timed(functools.partial(exhaustive, tables, memory, STAGES, size))
        parts: dict[str, Partition] = {"hintpipe": planned.partition, **planned.baselines}
        time_part, params_part = parts["time"], parts["params"]
        record |= {
            "plan_seconds": plan_s,
            "exhaustive_bottleneck_ms": None if best is None else best * 1e3,
            "exhaustive_largest_microbatch": largest,
            "exhaustive_seconds": check_s,
            "partitions": {},
        }
        for name in NAMES:
            part = parts[name]
            peak = max(s.memory_bytes for s in part.stages)
            record["partitions"][name] = {
                "cuts": list(part.cuts),
                "bottleneck_ms": part.bottleneck_ms,
                "peak_stage_bytes": peak,
                "fits": peak <= budget,
                "recomputed_nodes": sum(len(s.recompute) for s in part.stages),
                "largest_microbatch": part.max_microbatch_size,
            }
            rows.append(
                [
                    size_text(budget),
                    name,
                    " ".join(str(c) for c in part.cuts[1:-1]),
                    f"{part.bottleneck_ms:.2f}",
                    ratio(part.bottleneck_ms, time_part.bottleneck_ms),
                    size_text(peak),
                    "yes" if peak <= budget else "no",
                    str(sum(len(s.recompute) for s in part.stages)),
                    str(part.max_microbatch_size),
                    ratio(part.max_microbatch_size, time_part.max_microbatch_size),
                    ratio(part.max_microbatch_size, params_part.max_microbatch_size),
                    "" if name != "hintpipe" else f"{'-' if best is None else f'{best * 1e3:.2f}'} / {largest}",
                ]
            )
        records.append(record)
    headers = [
        "budget/stage",
        "partition",
        "cuts (node index)",
        f"bottleneck ms (B={size})",
        "vs time",
        f"peak stage mem (B={size})",
        f"fits B={size}",
        "recomputed nodes",
        "largest micro-batch",
        "vs time",
        "vs params",
        "exhaustive: ms / largest",
    ]
    title = (
        f"Part 1: gpt-mini {config.layers} blocks, hidden {config.hidden}, {seq_len} tokens x {size} sequences, "
        f"{len(ample.graph.nodes)} nodes, {STAGES} stages, {HINT}, {MICROBATCHES} micro-batches"
    )
    tables_md = [show(title, headers, rows, 3)]

    # Predicted against measured, per stage, at the tightest budget whose plan recomputes.
    tight = [b for b, p in plans.items() if any(st.recompute for st in p.partition.stages)]
    measured: dict[str, Any] | None = None
    if tight:
        budget = min(tight)
        runs = 3 if quick else 11
        console.print(f"[bold]part 1[/bold]: running the stages of the {size_text(budget)} plan ...")
        stage_rows = measure_stages(plans[budget], example, target, runs)
        measured = {"budget_bytes": budget, "runs": runs, "stages": stage_rows}
        tables_md.append(
            show(
                f"Part 1: predicted vs measured per stage, hintpipe at {size_text(budget)}/stage (B={size}; time: "
                f"forward + backward, median of {runs} runs after a warm-up)",
                [
                    "stage",
                    "nodes",
                    "recomputed nodes",
                    "bytes/micro-batch predicted",
                    "measured",
                    "measured / predicted",
                    "stage mem with measured bytes",
                    "time ms predicted",
                    "measured",
                    "measured / predicted",
                ],
                [
                    [
                        str(r["stage"]),
                        f"{r['first']}:{r['end']}",
                        str(r["recomputed_nodes"]),
                        size_text(r["predicted_bytes"]),
                        size_text(r["measured_bytes"]),
                        ratio(r["measured_bytes"], r["predicted_bytes"]),
                        f"{size_text(r['measured_stage_memory'])} "
                        f"({'within' if r['measured_stage_memory'] <= budget else 'over'} budget)",
                        f"{r['predicted_ms']:.2f}",
                        f"{r['measured_ms']:.2f}",
                        ratio(r["measured_ms"], r["predicted_ms"]),
                    ]
                    for r in stage_rows
                ],
                3,
            )
        )
    goals = part1_goals(records, size, measured)
    goal_rows = [[g["goal"], g["where"], g["value"], "yes" if g["met"] else "no"] for g in goals]
    tables_md.append(show("Part 1: goals", ["goal", "where", "measured", "met"], goal_rows, 2))
    result = {
        "model": dataclasses.asdict(config),
        "seq_len": seq_len,
        "microbatch_size": size,
        "nodes": len(ample.graph.nodes),
        "allowed_cuts": len(tables.allowed),
        "profile_seconds": profile_s,
        "time_peak_stage_bytes_unbounded": time_peak,
        "budgets": records,
        "predicted_vs_measured": measured,
        "goals": goals,
    }
    return result, tables_md


def measure_stages(planned: Plan, example: torch.Tensor, target: torch.Tensor, runs: int) -> list[dict[str, Any]]:
    """Build the plan's stages and run them in this process as the runtime does, one micro-batch at a time:
    each forward through ``StageExecutor.forward`` (bytes per micro-batch: ``live_bytes`` after minus before),
    the received tensors made leaf inputs, then each backward with the next stage's input gradients. Stage
    time: forward + backward, median of ``runs`` runs after one warm-up."""
    n = planned.stages
    modules = {s: planned.build_stage(s) for s in range(n)}
    executor = StageExecutor(modules, n - 1, lm_loss, split_backward=False)
    live: list[list[int]] = [[] for _ in range(n)]
    seconds: list[list[float]] = [[] for _ in range(n)]
    for run in range(runs + 1):
        spent = [0.0] * n
        inputs: list[Value] = [example]
        for s in range(n):
            before = executor.live_bytes
            start = time.perf_counter()
            outputs, _ = executor.forward(s, run, inputs, target, 1.0)
            spent[s] += time.perf_counter() - start
            live[s].append(executor.live_bytes - before)
            inputs = [as_input(t) for t in outputs]
        grads = None
        for s in reversed(range(n)):
            start = time.perf_counter()
            grads = executor.backward(s, run, grads)
            spent[s] += time.perf_counter() - start
        for module in modules.values():
            module.zero_grad(set_to_none=True)
        if run:
            for s in range(n):
                seconds[s].append(spent[s])
    out = []
    for s, stage in enumerate(planned.partition.stages):
        measured_bytes = statistics.median(live[s])
        fixed = stage.memory_bytes - stage.inflight * stage.activation_bytes
        out.append(
            {
                "stage": s,
                "first": planned.partition.cuts[s],
                "end": planned.partition.cuts[s + 1],
                "recomputed_nodes": len(stage.recompute),
                "inflight": stage.inflight,
                "predicted_bytes": stage.activation_bytes,
                "measured_bytes": measured_bytes,
                "measured_bytes_all_runs": sorted(set(live[s])),
                "predicted_stage_memory": stage.memory_bytes,
                "measured_stage_memory": fixed + stage.inflight * measured_bytes,
                "predicted_ms": stage.time_ms,
                "measured_ms": statistics.median(seconds[s]) * 1e3,
                "measured_ms_runs": [x * 1e3 for x in seconds[s]],
            }
        )
    return out


def part1_goals(records: list[dict[str, Any]], size: int, measured: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Largest micro-batch >= 2x time and >= 1.5x params at some tight budget (the baselines fit at
    least size 1 there but not the planned size); bottleneck within 5% of time's where time fits the
    planned size without recompute; measured activation bytes within 10% and stage times within 20% of
    the plan's figures on every stage of the measured plan."""
    goals = []
    tight = [
        r
        for r in records
        if "partitions" in r
        and 1 <= r["partitions"]["time"]["largest_microbatch"] < size
        and r["partitions"]["params"]["largest_microbatch"] >= 1
    ]
    best = None
    for r in tight:
        p = r["partitions"]
        vs_time = p["hintpipe"]["largest_microbatch"] / p["time"]["largest_microbatch"]
        vs_params = p["hintpipe"]["largest_microbatch"] / p["params"]["largest_microbatch"]
        if best is None or min(vs_time / 2, vs_params / 1.5) > min(best[1] / 2, best[2] / 1.5):
            best = (r["budget_bytes"], vs_time, vs_params)
    goals.append(
        {
            "goal": "largest micro-batch >= 2x time and >= 1.5x params (tight budget)",
            "where": "-" if best is None else size_text(best[0]),
            "value": "-" if best is None else f"{best[1]:.1f}x time, {best[2]:.1f}x params",
            "met": best is not None and best[1] >= 2 and best[2] >= 1.5,
        }
    )
    ample = [r for r in records if "partitions" in r and r["partitions"]["time"]["largest_microbatch"] >= size]
    for r in ample:
        p = r["partitions"]
        over = p["hintpipe"]["bottleneck_ms"] / p["time"]["bottleneck_ms"]
        goals.append(
            {
                "goal": "bottleneck within 5% of time's (ample budget)",
                "where": size_text(r["budget_bytes"]),
                "value": f"{over:.3f}x",
                "met": over <= 1.05,
            }
        )
    if measured is not None:
        for key, what, tolerance in (("bytes", "activation bytes/micro-batch", 0.10), ("ms", "stage time", 0.20)):
            worst = max(measured["stages"], key=lambda r: abs(r[f"measured_{key}"] / r[f"predicted_{key}"] - 1))
            off = worst[f"measured_{key}"] / worst[f"predicted_{key}"]
            goals.append(
                {
                    "goal": f"measured {what} within {tolerance:.0%} of predicted (every stage)",
                    "where": size_text(measured["budget_bytes"]),
                    "value": f"worst {off:.3f}x (stage {worst['stage']})",
                    "met": abs(off - 1) <= tolerance,
                }
            )
    return goals


# -- part 2: planning time at 2,000 nodes -------------------------------------------------------------------


def synthetic_chain(n: int, seed: int = SEED) -> list[NodeProfile]:
    """A chain shaped like a transformer: blocks of 30 nodes, linears with parameters and large outputs,
    cheap element-wise nodes, boundaries of different sizes (1x or 4x the hidden width)."""
    rng = np.random.default_rng(seed)
    width = 256 * 1024  # bytes of one hidden-width activation of one micro-batch
    profiles = []
    for i in range(n):
        position = i % 30
        linear = position in (2, 9, 20, 24)
        wide = position in (21, 22, 23)  # the MLP's 4x-wide middle
        forward = float(rng.lognormal(math.log(4e-4 if linear else 6e-5), 0.3))
        profiles.append(
            NodeProfile(
                name=f"n{i}",
                forward_s=forward,
                backward_s=2.0 * forward,
                saved_bytes=0,
                param_bytes=int(rng.integers(1, 5)) * 65_536 if linear else 0,
                output_bytes=4 * width if wide else width,
                tensor_output=True,
                internal_bytes=int(rng.integers(0, 3)) * width // 2,
                saves_output=bool(rng.random() < 0.3),
                saved_inputs=(f"n{i - 1}",) if i and (linear or rng.random() < 0.3) else (),
            )
        )
    return profiles


def search_rows(
    label: str, tables: NodeTables, budgets: list[tuple[str, float]], repeats: int
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Time ``search`` for each budget (median of ``repeats``), and ``plan()``'s largest-micro-batch bracketing.

    A search slower than ``SLOW_SEARCH_S`` is timed once and its bracketing (a full search per size tried)
    is not run, so that the part ends in reasonable time whatever the search costs.
    """
    unbounded = None
    records, rows = [], []
    for name, budget in budgets:
        memory = memory_model(budget)
        console.print(f"  {label}, {name}: search ...")
        try:
            cuts, seconds = timed(functools.partial(search, tables, memory, STAGES))
            if seconds[0] < SLOW_SEARCH_S:
                cuts, more = timed(functools.partial(search, tables, memory, STAGES), repeats - 1)
                seconds += more
        except PlanError as exc:
            records.append({"graph": label, "budget": name, "budget_bytes": budget, "error": str(exc)})
            rows.append([label, name, size_text(budget), "PlanError", "", "", "", "", "", ""])
            continue
        costs = [stage_cost(tables, memory, s, cuts[s], cuts[s + 1]) for s in range(STAGES)]
        bottleneck = max(c.time for c in costs) * 1e3
        unbounded = unbounded or bottleneck
        recomputed = sum(len(c.recompute) for c in costs)

        def fits(m: MemoryModel) -> bool:
            try:
                search(tables, m, STAGES)
            except PlanError:
                return False
            return True

        largest: int | None = None
        largest_s: float | None = None
        if seconds[0] < SLOW_SEARCH_S:
            largest, (largest_s,) = timed(functools.partial(max_microbatch_size, tables, memory, STAGES, 1, fits))
        records.append(
            {
                "graph": label,
                "nodes": tables.size,
                "allowed_cuts": len(tables.allowed),
                "budget": name,
                "budget_bytes": budget,
                "search_seconds": seconds,
                "bottleneck_ms": bottleneck,
                "recomputed_nodes": recomputed,
                "largest_microbatch": largest,
                "largest_microbatch_seconds": largest_s,
            }
        )
        rows.append(
            [
                label,
                name,
                size_text(budget),
                str(len(seconds)),
                f"{statistics.median(seconds):.3f}",
                f"{max(seconds):.3f}",
                f"{bottleneck:.2f}",
                ratio(bottleneck, unbounded),
                str(recomputed),
                f"not run (search > {SLOW_SEARCH_S:g} s)" if largest_s is None else f"{largest_s:.2f}",
            ]
        )
    return records, rows


def time_peak_bytes(tables: NodeTables) -> float:
    """Largest stage memory of the time-balanced (memory-blind) cuts, no savings."""
    cuts = balanced_cuts(np.asarray(tables.compute), tables.allowed, STAGES)
    memory = memory_model(math.inf)
    return max(stage_cost(tables, memory, s, cuts[s], cuts[s + 1], savings=False).memory for s in range(STAGES))


def part2(quick: bool) -> tuple[dict[str, Any], list[str]]:
    n = 300 if quick else 2000
    repeats = 3
    console.print(f"[bold]part 2[/bold]: synthetic chains of {n // 4}, {n // 2} and {n} nodes ...")
    rows: list[list[str]] = []
    chain_records: list[dict[str, Any]] = []
    chain_tables_s = 0.0
    # Shorter chains first (unbounded and one recompute budget): how search time grows with the length.
    for length, fractions in ((n // 4, (0.5,)), (n // 2, (0.5,)), (n, (1.0, 0.7, 0.5, 0.35))):
        profiles = synthetic_chain(length)
        chain, (tables_s,) = timed(functools.partial(NodeTables.chain, profiles))
        if length == n:
            chain_tables_s = tables_s
        peak = time_peak_bytes(chain)
        budgets = [("unbounded", math.inf)] + [(f"{f:.2f} x time peak", f * peak) for f in fractions]
        records, chain_rows = search_rows(f"synthetic chain, {length} nodes", chain, budgets, repeats)
        chain_records += records
        rows += chain_rows

    layers = 8 if quick else 69
    config = ModelConfig("gpt-mini", layers=layers, hidden=32, heads=2, vocab=128, max_seq_len=65)
    model = nn.Sequential(*build_layers(config))
    example = make_batch(config, 1, 2, SeqLenDist(32), 0)[0][0]
    console.print(f"[bold]part 2[/bold]: gpt-mini {layers} blocks through plan() ...")
    graph, (capture_s,) = timed(lambda: capture(model))
    node_profiles, (profile_s,) = timed(lambda: profile(graph, (example,), repeats=REPEATS))
    real, (real_tables_s,) = timed(lambda: node_tables(node_profiles, graph))
    label = f"gpt-mini fx graph, {len(graph.nodes)} nodes"
    real_peak = time_peak_bytes(real)
    real_fractions = (1.0, 0.85, 0.7)
    real_budgets = [("unbounded", math.inf)] + [(f"{f:.2f} x time peak", f * real_peak) for f in real_fractions]
    real_records, real_rows = search_rows(label, real, real_budgets, repeats)
    rows += real_rows
    headers = [
        "graph",
        "budget",
        "bytes/stage",
        "runs",
        "search s (median)",
        "search s (max)",
        "bottleneck ms",
        "vs unbounded",
        "recomputed nodes",
        "largest-micro-batch bracketing s",
    ]
    md = [show(f"Part 2a: hintpipe.planner.search, {STAGES} stages, {HINT}", headers, rows, 3)]

    # The whole plan(), end to end, at the tightest of those budgets that search could meet (recompute if
    # any); then again on the same profiles.
    feasible = [r for r in real_records[1:] if "search_seconds" in r]
    chosen = min(feasible, key=lambda r: r["budget_bytes"])
    budget, budget_name = chosen["budget_bytes"], chosen["budget"]

    def whole() -> Plan:
        return plan(model, example, ranks=STAGES, microbatches=MICROBATCHES, stage_memory=budget, repeats=REPEATS)

    console.print(f"[bold]part 2[/bold]: plan() at {budget_name} ...")
    planned, (plan_s,) = timed(whole)
    _, (replan_s,) = timed(
        lambda: plan(
            model, example, ranks=STAGES, microbatches=MICROBATCHES, stage_memory=budget, profiles=planned.profiles
        )
    )
    whole_rows = [
        ["capture (torch.fx)", f"{capture_s:.2f}"],
        [f"profile every node ({REPEATS} repeats + warm-up)", f"{profile_s:.2f}"],
        ["cost tables", f"{real_tables_s:.2f}"],
        [f"search ({budget_name}, median of part 2a)", f"{statistics.median(chosen['search_seconds']):.2f}"],
        [f"plan() end to end ({budget_name})", f"{plan_s:.2f}"],
        ["plan(profiles=...) on the same graph: capture, search, baselines, largest micro-batch", f"{replan_s:.2f}"],
    ]
    md.append(
        show(
            f"Part 2b: plan() on gpt-mini {layers} blocks (hidden 32, 32 tokens x 2), {len(graph.nodes)} nodes, "
            f"{len(real.allowed)} allowed cuts, budget {size_text(budget)}/stage",
            ["phase", "seconds"],
            whole_rows,
            1,
        )
    )
    result = {
        "chain_nodes": n,
        "chain_tables_seconds": chain_tables_s,
        "chain": chain_records,
        "gpt_mini": {
            "model": dataclasses.asdict(config),
            "nodes": len(graph.nodes),
            "allowed_cuts": len(real.allowed),
            "capture_seconds": capture_s,
            "profile_seconds": profile_s,
            "tables_seconds": real_tables_s,
            "search": real_records,
            "plan_budget": budget_name,
            "plan_budget_bytes": budget,
            "plan_seconds": plan_s,
            "plan_with_profiles_seconds": replan_s,
            "plan_recomputed_nodes": sum(len(s.recompute) for s in planned.partition.stages),
            "plan_largest_microbatch": planned.partition.max_microbatch_size,
        },
    }
    return result, md


# -- part 3: plan + readiness on 2 ranks ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One training run: a plan, the policy, and the slack (None: the plan's room as a byte budget)."""

    label: str
    plan: Plan
    policy: str
    slack: float | None


@dataclasses.dataclass(frozen=True)
class Workload:
    config: ModelConfig
    microbatch_size: int
    seq_len: SeqLenDist
    steps: int


def train_worker(rank: int, world: int, cases: list[Case], work: Workload) -> list[dict[str, Any]] | None:
    """Train every case in turn on the same data; each starts from the plan's own (untrained) weights."""
    out = []
    for case in cases:
        planned = copy.deepcopy(case.plan)  # fresh weights: the cases share one captured graph
        kwargs: dict[str, Any] = {"policy": case.policy, "timeout": 120.0}
        if case.slack is not None:
            kwargs["slack_microbatches"] = case.slack
        pipe = Pipeline.from_plan(planned, loss_fn=lm_loss, **kwargs)
        params = [p for s in pipe.stages for p in pipe.modules[s].parameters()]
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        losses, tokens = [], []
        try:
            for step in range(work.steps):
                xs, ys, counts = make_batch(work.config, MICROBATCHES, work.microbatch_size, work.seq_len, step, SEED)
                loss = pipe.step(xs, ys, broadcast_loss=True)
                assert loss is not None
                losses.append(float(loss))
                tokens.append(sum(counts))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        finally:
            pipe.close()
        room: list[Any] = [None] * world
        torch.distributed.all_gather_object(room, pipe.parts.admission.activation_budget)
        reports = pipe.reports
        out.append(
            {
                "label": case.label,
                "policy": case.policy,
                "activation_budget": room,
                "step_times": [r.makespan for r in reports],
                "tokens": tokens,
                "losses": losses,
                "peak_live_bytes": [max(r.peak_live_bytes[i] for r in reports) for i in range(len(reports[0].ranks))],
                "peak_live_slots": [max(r.peak_live[i] for r in reports) for i in range(len(reports[0].ranks))],
            }
        )
    return out if rank == 0 else None


def part3(quick: bool) -> tuple[dict[str, Any], list[str]]:
    ranks = 2
    config = ModelConfig(
        "gpt-mini", layers=2 if quick else 8, hidden=32 if quick else 96, heads=4, vocab=128, max_seq_len=257
    )
    work = Workload(config, microbatch_size=4, seq_len=SeqLenDist(96, 0.5), steps=3 if quick else 10)
    model = nn.Sequential(*build_layers(config))
    example = make_batch(config, 1, work.microbatch_size, SeqLenDist(work.seq_len.mean), 0)[0][0]
    console.print(f"[bold]part 3[/bold]: gpt-mini {config.layers} blocks on {ranks} ranks, planning ...")
    ample = plan(model, example, ranks=ranks, microbatches=MICROBATCHES, hint=HINT, repeats=REPEATS)
    time_stages = ample.baselines["time"].stages
    no_room = math.ceil(max(s.memory_bytes for s in time_stages) / (MiB / 10)) * (MiB / 10)
    one_mb = no_room + 1.05 * time_stages[0].activation_bytes
    settings = {"no room": no_room, "one micro-batch of room": one_mb}
    lengths = [
        t // work.microbatch_size
        for step in range(work.steps)
        for t in make_batch(config, MICROBATCHES, work.microbatch_size, work.seq_len, step, SEED)[2]
    ]
    plans: dict[str, Plan] = {}
    cases: list[Case] = []
    for name, budget in settings.items():
        planned = plan(
            model, example, ranks=ranks, microbatches=MICROBATCHES, stage_memory=budget, profiles=ample.profiles
        )
        plans[name] = planned
        baseline = dataclasses.replace(planned, partition=planned.baselines["time"])
        cases.append(Case(f"{name}: time cuts, fixed", baseline, "fixed", 0.0))
        cases.append(Case(f"{name}: planned cuts, ready", planned, "ready", None))
    # Two rounds, the second in reverse order, so that neither policy always runs first.
    schedule = cases + cases[::-1]
    console.print(f"[bold]part 3[/bold]: training {len(schedule)} runs of {work.steps} steps ...")
    results, (train_s,) = timed(lambda: run_ranks(train_worker, ranks, schedule, work, timeout=600.0)[0])
    runs: list[dict[str, Any]] = []
    for i, (case, res) in enumerate(zip(schedule, results, strict=True)):
        measured = res["step_times"][1:]
        res |= {
            "round": 1 if i < len(cases) else 2,
            "tokens_per_s": sum(res["tokens"][1:]) / sum(measured),
            "step_time_median": statistics.median(measured),
            "cuts": list(case.plan.partition.cuts),
        }
        runs.append(res)
    rows, mem_rows = [], []
    for name, budget in settings.items():
        planned = plans[name]
        pair: dict[str, list[dict[str, Any]]] = {}
        for rnd in (1, 2):
            fixed = next(r for r in runs if r["round"] == rnd and r["label"] == f"{name}: time cuts, fixed")
            ready = next(r for r in runs if r["round"] == rnd and r["label"] == f"{name}: planned cuts, ready")
            pair.setdefault("fixed", []).append(fixed)
            pair.setdefault("ready", []).append(ready)
            rows.append(
                [
                    name,
                    size_text(budget),
                    str(rnd),
                    " ".join(str(c) for c in fixed["cuts"][1:-1]),
                    " ".join(str(c) for c in ready["cuts"][1:-1]),
                    " ".join("-" if b is None else size_text(b) for b in ready["activation_budget"]),
                    f"{fixed['tokens_per_s']:,.0f}",
                    f"{ready['tokens_per_s']:,.0f}",
                    ratio(ready["tokens_per_s"], fixed["tokens_per_s"]),
                    f"{fixed['losses'][-1]:.4f} / {ready['losses'][-1]:.4f}",
                ]
            )
        for key, part in (("fixed", planned.baselines["time"]), ("ready", planned.partition)):
            both = pair[key]
            for r, stage in enumerate(part.stages):
                fixed_bytes = stage.memory_bytes - stage.inflight * stage.activation_bytes
                room = budget - fixed_bytes
                per_mb = stage.activation_bytes
                peaks = [run["peak_live_bytes"][r] for run in both]
                mem_rows.append(
                    [
                        name,
                        both[0]["label"].split(": ")[1],
                        str(r),
                        size_text(budget),
                        size_text(fixed_bytes),
                        size_text(room),
                        f"{stage.inflight} x {size_text(per_mb)} = {size_text(stage.inflight * per_mb)}",
                        " / ".join(size_text(p) for p in peaks),
                        " / ".join(f"{run['peak_live_slots'][r]:g}" for run in both),
                        " / ".join(ratio(p, room) for p in peaks),
                    ]
                )
    headers = [
        "budget",
        "bytes/stage",
        "round",
        "time cuts",
        "planned cuts",
        "ready activation budget/rank",
        "fixed tokens/s",
        "ready tokens/s",
        "ready / fixed",
        "final loss fixed / ready",
    ]
    title = (
        f"Part 3: gpt-mini {config.layers} blocks, hidden {config.hidden}, {ranks} ranks, {HINT}, "
        f"{MICROBATCHES} micro-batches of {work.microbatch_size} x lognormal({work.seq_len.mean}, "
        f"{work.seq_len.sigma}) tokens (here {min(lengths)} to {max(lengths)}, mean {statistics.mean(lengths):.0f}), "
        f"{work.steps} steps (tokens/s without the first)"
    )
    md = [show(title, headers, rows, 6)]
    mem_headers = [
        "budget",
        "run",
        "rank",
        "bytes/stage",
        "params+grads+Adam",
        "room for activations",
        f"hint's planned peak (in flight x bytes/micro-batch at {work.seq_len.mean} tokens)",
        "measured peak live (round 1 / 2)",
        "peak in flight",
        "measured / room",
    ]
    md.append(show("Part 3: peak live activation bytes per rank against the budget", mem_headers, mem_rows, 3))
    result = {
        "model": dataclasses.asdict(config),
        "ranks": ranks,
        "steps": work.steps,
        "microbatch_size": work.microbatch_size,
        "seq_len": dataclasses.asdict(work.seq_len),
        "budgets": settings,
        "lengths": lengths,
        "train_seconds": train_s,
        "plans": {name: p.to_json() for name, p in plans.items()},
        "spare_slots": {name: [p.spare_slots(s) for s in range(ranks)] for name, p in plans.items()},
        "runs": runs,
    }
    return result, md


# -- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a check that everything runs")
    parser.add_argument("--parts", default="123", help="which parts to run (default 123)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as hintpipe plan does, and as every rank does
    env = environment()
    console.print(env)
    start = time.perf_counter()
    payload: dict[str, Any] = {"environment": env, "quick": args.quick}
    markdown: list[str] = []
    for key, fn in (("1", part1), ("2", part2), ("3", part3)):
        if key in args.parts:
            part_start = time.perf_counter()
            result, md = fn(args.quick)
            result["seconds"] = time.perf_counter() - part_start
            payload[f"part{key}"] = result
            markdown += md
    payload["seconds"] = time.perf_counter() - start
    console.print(f"total {payload['seconds']:.0f} s")
    print("\n" + "\n\n".join(markdown) + "\n")
    print(f"(one run, {payload['seconds']:.0f} s wall)")
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
