"""Simulation studies: several trials, several policies, identical sampled work.

Every trial draws one :class:`~hintpipe.dispatch.sample.Sample` and runs each policy
on it, so ratios between policies measure the policies, not the dice.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import Variability
from hintpipe.renamed import renamed
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder
from hintpipe.sim.simulator import Sample, SimResult, Simulator


@dataclasses.dataclass(frozen=True)
class Summary:
    """One policy over all trials: means, except ``peak_live`` and ``budget``, the highest per
    rank in any trial (under admission by size each trial's budget is measured on its own
    micro-batches; every trial holds at most its own)."""

    policy: Policy
    makespan: float
    lower_bound: float
    memory_bound: float
    efficiency: float
    bubble_fraction: float
    bubble: tuple[float, ...]
    peak_live: tuple[float, ...]
    budget: tuple[float, ...]
    tasks: int
    sim_seconds: float
    trials: int
    last: SimResult

    def to_json(self, unit: str = "slots") -> dict[str, Any]:
        """The summary as JSON; live memory and the budget in ``unit``: ``peak_live_bytes`` when the
        cost model has activation sizes, ``peak_live_size`` under admission by size without them
        (micro-batches weighted by their known sizes), else ``peak_live_slots`` (micro-batches). Times
        carry their unit in the key: the simulator's cost units (``makespan_cost``: the cost model's unit,
        whatever the ``--costs`` file measured in) or, for the simulator's own run, ``sim_seconds``."""
        return {
            "makespan_cost": self.makespan,
            "lower_bound_cost": self.lower_bound,
            "memory_bound_cost": self.memory_bound,
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
        memory_bound=mean([r.memory_bound for r in results]),
        efficiency=mean([r.efficiency for r in results]),
        bubble_fraction=mean([r.bubble_fraction for r in results]),
        bubble=tuple(mean([r.bubble[i] for r in results]) for i in range(ranks)),
        peak_live=tuple(max(r.peak_live[i] for r in results) for i in range(ranks)),
        budget=tuple(max(r.budget[i] for r in results) for i in range(ranks)),
        tasks=results[0].tasks,
        sim_seconds=mean([r.sim_seconds for r in results]),
        trials=len(results),
        last=results[-1],
    )


@renamed(
    "run_study",
    slack="slack_microbatches",
    memory_slack="slack_microbatches",
    budgets="activation_budget",
    device_budget="device_budget_fraction",
    order="microbatch_order",
)
def run_study(
    hint: Hint,
    policies: Sequence[Policy],
    *,
    cost_model: CostModel | None = None,
    variability: Sequence[Variability] = (),
    trials: int = 1,
    seed: int = 0,
    slack_microbatches: float = 0.0,
    activation_budget: Sequence[float] | None = None,
    device_budget_fraction: float | None = None,
    microbatch_order: MicrobatchOrder | str = MicrobatchOrder.GIVEN,
    admission: AdmissionUnit | str = AdmissionUnit.SLOTS,
    on_trial: Callable[[int], None] | None = None,
) -> dict[Policy, Summary]:
    """Run ``trials`` trials of every policy on the same sampled work.

    Args:
        hint: the schedule.
        policies: the policies to compare.
        cost_model: expected costs; default F = B = W = 1.
        variability: noise models (see :mod:`hintpipe.dispatch.variability`).
        trials: number of independent samples.
        seed: seeds the sampling.
        slack_microbatches: extra micro-batches of room over the hint's own peak.
        activation_budget: explicit per-rank budgets (overrides ``slack_microbatches`` and ``device_budget_fraction``).
        device_budget_fraction: every rank may hold the hint's busiest rank's peak times
            ``1 + device_budget_fraction`` (instead of ``slack_microbatches``).
        microbatch_order: the order in which each trial runs its micro-batches, by their
            known sizes (see :mod:`hintpipe.schedule.microbatch_order`).
        admission: ``slots``, or ``size``: each micro-batch weighs its known size, and
            unless ``activation_budget`` is given each trial's room is measured on its
            micro-batches in the given order (:meth:`Simulator.size_budgets`), so a
            sorted order runs within what the given order holds.
        on_trial: called after each trial with its index (progress bars).
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    cost_model = cost_model or CostModel.uniform(hint.stages)
    if MicrobatchOrder.parse(microbatch_order) is not MicrobatchOrder.GIVEN and cost_model.microbatch_scale is not None:
        raise ValueError(
            "a micro-batch order with a cost model's microbatch_scale: the scales are fixed per micro-batch; "
            "list them in the order to run instead"
        )
    simulator = Simulator(hint, cost_model)
    by_size = AdmissionUnit.parse(admission) is AdmissionUnit.SIZE
    budgets = activation_budget
    if budgets is None and device_budget_fraction is not None and not by_size:
        budgets = simulator.device_budgets(device_budget_fraction)
    rng = np.random.default_rng(seed)
    results: dict[Policy, list[SimResult]] = {p: [] for p in policies}
    for trial in range(trials):
        drawn = Sample.draw(hint, cost_model, variability, rng)
        sample = drawn.ordered(microbatch_order)
        room = budgets
        if by_size and room is None:
            room = simulator.size_budgets(
                drawn, slack_microbatches=slack_microbatches, device_budget_fraction=device_budget_fraction
            )
        for policy in policies:
            run = simulator.run(
                policy, sample, activation_budget=room, slack_microbatches=slack_microbatches, admission=admission
            )
            results[policy].append(run)
        if on_trial is not None:
            on_trial(trial)
    return {p: _summarise(p, rs) for p, rs in results.items()}
