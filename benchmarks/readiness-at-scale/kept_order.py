"""Does ``ready`` keep the hint's order when every task costs what was planned? The runtime, emulated.

On 4 emulated ranks (every task sleeps ``--unit-ms``, a backward twice that
without a split W; no injected variability), each hint runs 2 steps under
``fixed`` and under ``ready`` (whose plan, from step 0's measured costs, is in
use in step 1), and each rank's order of tasks in step 1 is compared. Prints
every rank whose orders differ, at the first task where they do.

With no variability `ready` has nothing to gain by leaving the hint's order
except where the hint itself leaves a task ready while its next one waits
(zb-h1: the simulator's `ready` fills those gaps at the same makespan). See
the README, "Kept order", for what it found.

Run from the repository root::

    .venv/bin/python benchmarks/readiness-at-scale/kept_order.py [--unit-ms 10] [--runs 3]
"""

from __future__ import annotations

import argparse

from torch import nn

from hintpipe.apps.models import lm_loss
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.loop.emulated import EmulatedCosts
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintName

Orders = dict[str, tuple[list[str], list[str], str]]


def orders(rank: int, world: int, unit: float) -> Orders:
    """Per hint: this rank's order of tasks in step 1 under ``fixed`` and ``ready``, and the policy step 1 ran."""
    out = {}
    for name in HintName:
        hint = generate_hint(name, world, 8)
        stages = hint.stages
        b, w = (unit, unit) if hint.split_backward else (2 * unit, 0.0)
        costs = EmulatedCosts((unit,) * stages, (b,) * stages, (w,) * stages, reference_size=1)
        runs = []
        for policy in ("fixed", "ready"):
            modules = {s: nn.Identity() for s in hint.placement.stages_of(rank)}
            pipe = Pipeline(modules, loss_fn=lm_loss, microbatches=8, hint=hint, policy=policy, emulate=costs)
            with pipe:
                for _ in range(2):
                    pipe.step()
            report = pipe.reports[-1]
            runs.append([str(task) for r, task, _, _ in report.records if r == rank])
        out[name.value] = (runs[0], runs[1], report.policy.value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit-ms", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for run in range(args.runs):
        per_rank: list[Orders] = run_ranks(orders, 4, args.unit_ms * 1e-3, timeout=600)
        kept = {name: True for name in per_rank[0]}
        for rank, per_hint in enumerate(per_rank):
            for name, (fixed, ready, policy) in per_hint.items():
                assert policy == "ready", f"{name}: step 1 ran {policy}"
                if ready != fixed:
                    kept[name] = False
                    at = next(i for i, (a, b) in enumerate(zip(fixed, ready, strict=True)) if a != b)
                    print(f"run {run}, {name}, rank {rank}: fixed {fixed[at : at + 3]} ready {ready[at : at + 3]}")
        print(f"run {run}: kept by " + ", ".join(n for n, k in kept.items() if k), flush=True)


if __name__ == "__main__":
    main()
