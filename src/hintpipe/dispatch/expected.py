"""What the ``ready`` policy expects, from measured task times: one definition.

The runtime plans ``ready`` with each stage's median measured costs
(:func:`stage_medians`), and :func:`plans_for` turns those into every rank's
:class:`~hintpipe.scoreboard.RankPlan` by a fixed-order run of the hint on the
simulator. The prediction of a measured step uses the very same costs (a
:class:`~hintpipe.runtime.loop.reports.StepReport` carries the ones its step
planned with), so "the simulator predicts the runtime" compares like with like.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.renamed import renamed
from hintpipe.schedule.fit import AdmissionUnit
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind, Task
from hintpipe.scoreboard import Policy, RankPlan
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import Sample, Simulator

#: ``[stage][kind]`` expected cost of one task (kind = :class:`Kind` value).
StageCosts = Sequence[Sequence[float]]


def stage_medians(durations: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Per stage and kind, the median over micro-batches of ``durations[stage, mb, kind]``."""
    return np.median(durations, axis=1)


def cost_model_of(costs: StageCosts) -> CostModel:
    """A cost model with these per-stage costs for every micro-batch."""
    array = np.asarray(costs, dtype=float)
    return CostModel.uniform(
        len(array),
        forward=array[:, Kind.F].tolist(),
        backward=array[:, Kind.B].tolist(),
        weight=array[:, Kind.W].tolist(),
    )


def plans_for(hint: Hint, costs: StageCosts) -> list[RankPlan]:
    """Every rank's plan: the hint run in fixed order on these per-stage costs."""
    return Simulator(hint, cost_model_of(costs)).plans()


def moved(old: StageCosts | None, new: StageCosts, threshold: float) -> bool:
    """Whether any cost moved by more than ``threshold`` (relative) since ``old``:
    the runtime rebuilds its plan only then."""
    if old is None:
        return True
    a, b = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-12)
    return bool((np.abs(a - b) / scale > threshold).any())


@renamed("predict_step_time", slack="memory_slack")
def predict_step_time(
    hint: Hint,
    records: Sequence[tuple[int, Task, float, float]],
    plan_costs: StageCosts | None,
    policy: Policy,
    memory_slack: float = 0.0,
    *,
    budgets: Sequence[float] | None = None,
    sizes: Sequence[float] | None = None,
    admission: AdmissionUnit | str = AdmissionUnit.SLOTS,
) -> float:
    """The simulator's makespan for a measured step: its measured task times are the
    sample, and ``ready`` plans with ``plan_costs``, the costs the runtime planned
    that step with (the step's own medians when it had no plan).

    ``budgets`` (per rank, in admission's units) and ``sizes`` (each slot's input elements) are the step's
    own where the runtime reported them: under ``admission="size"`` the simulator fits the hint to those
    budgets as the runtime did (:func:`hintpipe.schedule.by_size.fit_step`), and ``ready`` scales its plan
    by the sizes relative to their median, as the runtime's does."""
    durations = np.zeros((hint.num_stages, hint.microbatches, 3))
    for _, task, start, end in records:
        durations[task.stage, task.mb, task.kind] = end - start
    costs = plan_costs if plan_costs is not None else stage_medians(durations).tolist()
    relative = None
    if sizes is not None:
        typical = float(np.median(sizes)) or 1.0
        relative = np.asarray(sizes, dtype=float) / typical
        if budgets is not None and AdmissionUnit.parse(admission) is AdmissionUnit.SIZE:
            budgets = [b / typical for b in budgets]
    sample = Sample(durations, np.zeros_like(durations), 0.0, sizes=relative)
    # The runtime's ``ready`` hears its producers start (notices), as the simulator's ranks do.
    simulator = Simulator(hint, cost_model_of(costs))
    result = simulator.run(
        policy, sample, memory_slack=memory_slack, activation_budget=budgets, notices=True, admission=admission
    )
    return result.makespan
