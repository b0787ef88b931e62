"""Per-step overhead of the runtime: ``ready`` policy, emulated compute, 8 and 32 ranks.

Every task sleeps a fixed cost (F = B = 4 ms; emulated compute, since 32 ranks
on a 2-core machine cannot compute for real), 1F1B, 32 micro-batches per
step. Per rank and step it measures the wall time of ``Pipeline.step`` and the
time spent outside the dispatch loop (the barrier, the end-of-step agreement,
the report): ``wall - end of the rank's last task``. The ideal step is
``(m + p - 1)(F + B)``.

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


def _pipeline(world: int, microbatches: int, baseline: bool) -> Any:
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
    from hintpipe.runtime.executor import EmulatedCosts
    from hintpipe.runtime.pipeline import Pipeline

    costs = EmulatedCosts((COST,) * world, (COST,) * world, (0.0,) * world, reference_size=1)
    return Pipeline.from_modules(
        modules, loss_fn=lambda o, t: o.sum(), microbatches=microbatches, policy="ready", timeout=300, emulate=costs
    )


def worker(rank: int, world: int, microbatches: int, steps: int, baseline: bool) -> dict[str, list[float]]:
    pipe = _pipeline(world, microbatches, baseline)
    walls, outside = [], []
    for _ in range(steps):
        began = time.perf_counter()
        pipe.step()
        wall = time.perf_counter() - began
        own = [r for r in pipe.reports[-1].records if r[0] == rank]
        walls.append(wall)
        outside.append(wall - max(end for *_, end in own))
    pipe.close()
    return {"wall": walls, "outside": outside}


def measure(ranks: int, microbatches: int, steps: int, baseline: bool) -> dict[str, float]:
    results = _run_ranks()(worker, ranks, microbatches, steps, baseline, timeout_s=600)
    warm = 2  # the first steps build the plan and warm up
    per_rank_outside = [statistics.median(r["outside"][warm:]) for r in results]
    wall = statistics.median(w for r in results for w in r["wall"][warm:])
    ideal = (microbatches + ranks - 1) * 2 * COST
    return {
        "ranks": ranks,
        "microbatches": microbatches,
        "step_ms": wall * 1e3,
        "ideal_ms": ideal * 1e3,
        "overhead_ms": (wall - ideal) * 1e3,
        "outside_loop_mean_ms": statistics.mean(per_rank_outside) * 1e3,
        "outside_loop_max_ms": max(per_rank_outside) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--baseline", action="store_true", help="the checkout on PYTHONPATH has the old API")
    args = parser.parse_args()
    for ranks in args.ranks:
        print(json.dumps(measure(ranks, args.microbatches, args.steps, args.baseline)), flush=True)


if __name__ == "__main__":
    main()
