"""One simulated trial's timelines: fixed 1F1B in the given order, the recommended configuration, a sorted one.

Draws one trial of the multimodal-like work (``mm:1.0:0.5``) the way the study
does (same seed for every hint) and plots the runs on one time axis.

Run from the repository root::

    .venv/bin/python benchmarks/readiness-at-scale/picture.py [--ranks 16] [--microbatches 64] [--out FILE.png]
"""

from __future__ import annotations

import argparse

import numpy as np

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.observe.timeline import plot_timelines
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Sample, Simulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--variability", default="mm:1.0:0.5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/readiness-at-scale/timelines.png")
    args = parser.parse_args()
    models = [parse_variability(args.variability)]
    panels = []
    runs = [
        ("1f1b", "given", Policy.FIXED, False),
        ("bfw", "given", Policy.READY, True),
        ("bfw", "shortest-first", Policy.READY, True),
    ]
    for name, order, policy, device in runs:
        hint = generate_hint(name, args.ranks, args.microbatches)
        simulator = Simulator(hint, CostModel.uniform(hint.stages))
        drawn = Sample.draw(hint, simulator.cost_model, models, np.random.default_rng((args.seed, 0)))
        budgets = simulator.device_budgets() if device else None
        result = simulator.run(policy, drawn.ordered(order), activation_budget=budgets)
        budget = ", per-device budget" if device else ""
        title = f"{name}, {order} order, {policy.value}{budget}: makespan {result.makespan:.0f}"
        panels.append((title, result.timeline()))
        print(title)
    plot_timelines(panels, args.out)


if __name__ == "__main__":
    main()
