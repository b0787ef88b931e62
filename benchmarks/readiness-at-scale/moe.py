"""``ready`` against ``fixed`` on mixture-of-experts draws: every stage's cost per micro-batch set by its
busiest expert (``moe:EXPERTS:TOPK[:SKEW[:SHARE]]``, see [Note: expert load] in
:mod:`hintpipe.dispatch.variability`), on the simulator, seeded.

Per ranks, hint and spec, each seed draws one set of expert loads and both policies run it; the table gives
``ready``'s speedup over ``fixed`` on the same hint and work per seed and their mean, and fixed's makespan
over the one without variability (what the imbalance costs). ``ready`` has the hint's own memory (its
default budget) or ``--slack-microbatches`` more micro-batches. All figures are simulated (cost units, F = B = W
= 1). Run from the repository root::

    .venv/bin/python benchmarks/readiness-at-scale/moe.py [--ranks 8,32] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Sample, Simulator

HINTS = ("1f1b", "zb-h1", "bfw")
#: 8 experts top-2 (Mixtral-like) at two skews, and 64 experts top-8 with experts 60% of a stage's cost.
SPECS = ("moe:8:2", "moe:8:2:1.0", "moe:64:8:0.5:0.6")


def row(ranks: int, microbatches: int, hint_name: str, spec: str, seeds: list[int], slack: float) -> list[str]:
    """One row: what ran, fixed's makespan over the one without variability (mean), ready over fixed per seed
    and the mean."""
    hint = generate_hint(hint_name, ranks, microbatches)
    sim = Simulator(hint, CostModel.uniform(hint.stages))
    calm = sim.run(Policy.FIXED).makespan
    cost, speedups = [], []
    for seed in seeds:
        sample = Sample.draw(hint, sim.cost_model, [parse_variability(spec)], np.random.default_rng(seed))
        fixed = sim.run(Policy.FIXED, sample).makespan
        ready = sim.run(Policy.READY, sample, slack_microbatches=slack).makespan
        cost.append(fixed / calm)
        speedups.append(fixed / ready)
    return [
        f"{ranks} x {microbatches}",
        hint_name,
        spec,
        f"{statistics.mean(cost):.3f}x",
        *(f"{s:.4f}x" for s in speedups),
        f"{statistics.mean(speedups):.4f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--ranks", default="8,32", help="comma-separated rank counts (default 8,32)")
    parser.add_argument("--per-rank", type=int, default=4, help="micro-batches per rank (default 4)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--specs", default=",".join(SPECS), help="comma-separated moe specs")
    parser.add_argument("--slack-microbatches", type=float, default=0.0, help="ready's extra micro-batches (default 0)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    headers = ["ranks x mbs", "hint", "spec", "fixed / no variability"]
    headers += [f"ready seed {s}" for s in seeds] + ["ready mean"]
    print("| " + " | ".join(headers) + " |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in headers[3:]) + " |")
    for ranks in (int(r) for r in args.ranks.split(",")):
        for hint in HINTS:
            for spec in args.specs.split(","):
                cells = row(ranks, args.per_rank * ranks, hint, spec, seeds, args.slack_microbatches)
                print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
