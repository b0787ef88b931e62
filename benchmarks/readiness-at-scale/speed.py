"""Simulator throughput at 128 ranks x 1024 micro-batches: ``ready`` with its plan computed (cold).

Every repeat builds a fresh ``Simulator``, so a ``ready`` run pays for its plan, as a
study's first run does. Prints the median tasks/s of each policy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Sample, Simulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=1024)
    parser.add_argument("--hint", default="1f1b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variability", default="mb:0.5")
    args = parser.parse_args()
    hint = generate_hint(args.hint, args.ranks, args.microbatches)
    model = CostModel.uniform(hint.stages)
    sample = Sample.draw(hint, model, [parse_variability(args.variability)], np.random.default_rng(0))
    seconds: dict[str, list[float]] = {p.value: [] for p in Policy}
    for _ in range(args.repeats):
        for policy in Policy:
            sim = Simulator(hint, model)  # fresh: ready computes its plan inside the timed run
            began = time.perf_counter()
            sim.run(policy, sample)
            seconds[policy.value].append(time.perf_counter() - began)
    for name, values in seconds.items():
        median = statistics.median(values)
        print(
            f"{args.hint} {args.ranks}x{args.microbatches} {args.variability} {name:7s} "
            f"median {median:.3f} s  {hint.num_tasks / median:,.0f} tasks/s"
        )


if __name__ == "__main__":
    main()
