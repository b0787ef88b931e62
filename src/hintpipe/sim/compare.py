"""Simulation studies: several trials, several policies, identical sampled work.

Every trial draws one :class:`~hintpipe.simulator.Sample` and runs each policy
on it, so ratios between policies measure the policies, not the dice.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder
from hintpipe.scoreboard import Policy
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import Sample, SimResult, Simulator
from hintpipe.sim.variability import Variability


@dataclasses.dataclass(frozen=True)
class Summary:
    """One policy over all trials: means, except ``peak_live`` (the highest
    peak per rank seen in any trial)."""

    policy: Policy
    makespan: float
    lower_bound: float
    efficiency: float
    bubble_fraction: float
    bubble: tuple[float, ...]
    peak_live: tuple[float, ...]
    budget: tuple[float, ...]
    tasks: int
    sim_seconds: float
    trials: int
    last: SimResult

    def to_json(self, in_bytes: bool = False) -> dict[str, Any]:
        """The summary as JSON; live memory is ``peak_live_bytes`` when the cost model has
        activation sizes, else ``peak_live_slots`` (micro-batches), and so is ``budget``."""
        unit = "bytes" if in_bytes else "slots"
        return {
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "efficiency": self.efficiency,
            "bubble_fraction": self.bubble_fraction,
            "bubble": list(self.bubble),
            f"peak_live_{unit}": list(self.peak_live),
            f"budget_{unit}": list(self.budget),
            "tasks": self.tasks,
            "sim_seconds": self.sim_seconds,
            "trials": self.trials,
        }


def _summarise(policy: Policy, results: Sequence[SimResult]) -> Summary:
    def mean(values: Sequence[float]) -> float:
        return float(np.mean(values))

    ranks = len(results[0].busy)
    return Summary(
        policy=policy,
        makespan=mean([r.makespan for r in results]),
        lower_bound=mean([r.lower_bound for r in results]),
        efficiency=mean([r.efficiency for r in results]),
        bubble_fraction=mean([r.bubble_fraction for r in results]),
        bubble=tuple(mean([r.bubble[i] for r in results]) for i in range(ranks)),
        peak_live=tuple(max(r.peak_live[i] for r in results) for i in range(ranks)),
        budget=results[0].budget,
        tasks=results[0].tasks,
        sim_seconds=mean([r.sim_seconds for r in results]),
        trials=len(results),
        last=results[-1],
    )


def run_study(
    hint: Hint,
    policies: Sequence[Policy],
    *,
    cost_model: CostModel | None = None,
    variability: Sequence[Variability] = (),
    trials: int = 1,
    seed: int = 0,
    slack: float = 0.0,
    budgets: Sequence[float] | None = None,
    order: MicrobatchOrder | str = MicrobatchOrder.GIVEN,
    on_trial: Callable[[int], None] | None = None,
) -> dict[Policy, Summary]:
    """Run ``trials`` trials of every policy on the same sampled work.

    Args:
        hint: the schedule.
        policies: the policies to compare.
        cost_model: expected costs; default F = B = W = 1.
        variability: noise models (see :mod:`hintpipe.sim.variability`).
        trials: number of independent samples.
        seed: seeds the sampling.
        slack: extra micro-batches of room over the hint's own peak.
        budgets: explicit per-rank budgets (overrides ``slack``).
        order: the order in which each trial runs its micro-batches, by their
            known sizes (see :mod:`hintpipe.schedule.microbatch_order`).
        on_trial: called after each trial with its index (progress bars).
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    cost_model = cost_model or CostModel.uniform(hint.num_stages)
    if MicrobatchOrder.parse(order) is not MicrobatchOrder.GIVEN and cost_model.microbatch_scale is not None:
        raise ValueError(
            "a micro-batch order with a cost model's microbatch_scale: the scales are fixed per micro-batch; "
            "list them in the order to run instead"
        )
    simulator = Simulator(hint, cost_model)
    rng = np.random.default_rng(seed)
    results: dict[Policy, list[SimResult]] = {p: [] for p in policies}
    for trial in range(trials):
        sample = Sample.draw(hint, cost_model, variability, rng).ordered(order)
        for policy in policies:
            results[policy].append(simulator.run(policy, sample, budgets=budgets, slack=slack))
        if on_trial is not None:
            on_trial(trial)
    return {p: _summarise(p, rs) for p, rs in results.items()}
