"""The most readiness can gain over fixed order on part D's workload, from the event simulator.

1f1b, 2 ranks x 8 micro-batches, F = 8 ms and B = 15 ms per stage (part D's measured task times);
each task takes ``(1 + X) t``, with ``X`` a mean-one lognormal factor (sigma 0.5, one per
micro-batch, the same on both stages), as part D's stage wrapper makes it (the wrapper sleeps
``X t`` after a task that computed for ``t``; the runtime's own ``--variability mb:0.5`` differs, see
``hintpipe.runtime.faults``). No runtime overhead: what ``ready`` gains here is what any runtime
following the same hint could gain over fixed order.

    .venv/bin/python benchmarks/runtime-gpt-mini/runtime_ceiling.py
"""

from __future__ import annotations

import statistics

import numpy as np

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import mean_one_lognormal
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Sample, Simulator

FORWARD_MS, BACKWARD_MS, SIGMA, DRAWS = 8.0, 15.0, 0.5, 400


def main() -> None:
    hint = generate_hint("1f1b", 2, 8)
    # Expected costs (E[1 + X] = 2) for the plan `ready` follows.
    model = CostModel.uniform(2, forward=2 * FORWARD_MS, backward=2 * BACKWARD_MS, weight=0.0)
    sim = Simulator(hint, model)
    rng = np.random.default_rng(0)
    gains: dict[str, list[float]] = {"ready, slack 2": [], "greedy, slack 2": [], "greedy, unlimited room": []}
    for _ in range(DRAWS):
        factor = 1 + mean_one_lognormal(rng, SIGMA, (8,))
        costs = np.zeros((2, 8, 3))
        costs[:, :, 0] = FORWARD_MS * factor
        costs[:, :, 1] = BACKWARD_MS * factor
        sample = Sample(costs, np.zeros_like(costs), 0.0)
        fixed = sim.run(Policy.FIXED, sample).makespan
        gains["ready, slack 2"].append(fixed / sim.run(Policy.READY, sample, slack_microbatches=2).makespan)
        gains["greedy, slack 2"].append(fixed / sim.run(Policy.GREEDY, sample, slack_microbatches=2).makespan)
        gains["greedy, unlimited room"].append(fixed / sim.run(Policy.GREEDY, sample, slack_microbatches=100).makespan)
    for name, values in gains.items():
        print(f"{name}: fixed / policy makespan, mean over {DRAWS} draws: {statistics.mean(values):.3f}x")


if __name__ == "__main__":
    main()
