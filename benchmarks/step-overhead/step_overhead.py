"""Per-step overhead of the runtime: ``ready`` policy, emulated compute, 8 and 32 ranks.

Every task sleeps a fixed cost (F = B = 4 ms; emulated compute, since 32 ranks
on a 2-core machine cannot compute for real), 1F1B, 32 micro-batches per
step. On rank 0 it measures each step's wall time (``Pipeline.step``, call to
return) and the time outside every rank's dispatch loop: the wall time minus
the step's span from the first loop start to the last task's end (the
report's ``step_time``, the slowest rank's loop). That is the per-step cost of
the runtime itself (start of step, end-of-step agreement, report), the
quantity that must not grow with the ranks. The ideal step is
``(m + p - 1)(F + B)``; wall minus ideal adds the per-task overheads on the
critical path (dispatch, messages), which grow with its length ``m + p - 1``.

Run with ``--baseline SRC`` to measure another checkout (its ``src``) with the
API it had before the reorganisation (``emulate=`` took a callable).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from torch import nn

COST = 0.004


def _module(new: str, old: str) -> Any:
    """``new``, or ``old`` in a checkout from before the reorganisation."""
    try:
        return importlib.import_module(new)
    except ImportError:
        return importlib.import_module(old)


def _run_ranks() -> Callable[..., list[Any]]:
    run: Callable[..., list[Any]] = _module("hintpipe.runtime.launch", "hintpipe.launch").run_ranks
    return run


def _pipeline(world: int, microbatches: int, baseline: bool, report_every: int) -> Any:
    pipeline = _module("hintpipe.runtime.pipeline", "hintpipe.pipeline").Pipeline
    modules: list[nn.Module] = [nn.Identity() for _ in range(world)]
    if baseline:  # the API before the reorganisation: a callable of (stage, kind, mb)
        return pipeline.from_modules(
            modules,
            loss_fn=lambda o, t: o.sum(),
            microbatches=microbatches,
            policy="ready",
            timeout=300,
            emulate=lambda s, k, mb: COST,
        )
    from hintpipe.runtime.loop.emulated import EmulatedCosts
    from hintpipe.runtime.pipeline import Pipeline

    costs = EmulatedCosts((COST,) * world, (COST,) * world, (0.0,) * world, reference_size=1)
    return Pipeline.from_modules(
        modules,
        loss_fn=lambda o, t: o.sum(),
        microbatches=microbatches,
        policy="ready",
        timeout=300,
        emulate=costs,
        report_every=report_every,
    )


def worker(
    rank: int, world: int, microbatches: int, steps: int, baseline: bool, report_every: int
) -> dict[str, list[float]]:
    pipe = _pipeline(world, microbatches, baseline, report_every)
    walls, outside = [], []
    for _ in range(steps):
        began = time.perf_counter()
        pipe.step()
        wall = time.perf_counter() - began
        walls.append(wall)
        outside.append(wall - pipe.reports[-1].makespan)
    pipe.close()
    return {"wall": walls, "outside": outside}


def measure(ranks: int, microbatches: int, steps: int, baseline: bool, report_every: int) -> dict[str, float]:
    results = _run_ranks()(worker, ranks, microbatches, steps, baseline, report_every, timeout=600)
    warm = 2  # the first steps build the plan and warm up
    rank0 = results[0]
    wall = statistics.median(rank0["wall"][warm:])
    ideal = (microbatches + ranks - 1) * 2 * COST
    return {
        "report_every": report_every,
        "ranks": ranks,
        "microbatches": microbatches,
        "step_ms": wall * 1e3,
        "ideal_ms": ideal * 1e3,
        "over_ideal_ms": (wall - ideal) * 1e3,
        "outside_loops_ms": statistics.median(rank0["outside"][warm:]) * 1e3,
        "outside_loops_mean_ms": statistics.mean(rank0["outside"][warm:]) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--report-every", type=int, nargs="+", default=[1], help="Pipeline(report_every=...)")
    parser.add_argument("--baseline", action="store_true", help="the checkout on PYTHONPATH has the old API")
    args = parser.parse_args()
    for every in [1] if args.baseline else args.report_every:
        for ranks in args.ranks:
            print(json.dumps(measure(ranks, args.microbatches, args.steps, args.baseline, every)), flush=True)


if __name__ == "__main__":
    main()
