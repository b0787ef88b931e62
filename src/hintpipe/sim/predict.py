"""The simulator's prediction of a measured step: its task times as the sample, the forecast the runtime had.

``ready`` forecasts with the costs the runtime forecast that step with (:mod:`hintpipe.dispatch.expected`,
one definition for both), so a prediction and the run it predicts compare like with like.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hintpipe.dispatch.expected import StageCosts, cost_model_of, stage_medians
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.sample import Sample
from hintpipe.observe.trace import Record
from hintpipe.renamed import renamed
from hintpipe.schedule.hint import Hint
from hintpipe.sim.simulator import Simulator


@renamed(
    "predict_step_time", slack="slack_microbatches", memory_slack="slack_microbatches", plan_costs="forecast_costs"
)
def predict_step_time(
    hint: Hint,
    records: Sequence[Record],
    forecast_costs: StageCosts | None,
    policy: Policy,
    slack_microbatches: float = 0.0,
    *,
    budgets: Sequence[float] | None = None,
    sizes: Sequence[float] | None = None,
    admission: AdmissionUnit | str = AdmissionUnit.SLOTS,
) -> float:
    """The simulator's makespan for a measured step: its measured task times are the
    sample, and ``ready`` forecasts with ``forecast_costs`` (``plan_costs`` before 0.7), the costs the runtime
    forecast that step with (the step's own medians when it had no forecast).

    ``budgets`` (per rank, in admission's units) and ``sizes`` (each slot's input elements) are the step's
    own where the runtime reported them: under ``admission="size"`` the simulator fits the hint to those
    budgets as the runtime did (:func:`hintpipe.dispatch.by_size.fit_step`), and ``ready`` scales its forecast
    by the sizes relative to their median, as the runtime's does."""
    durations = np.zeros((hint.stages, hint.microbatches, 3))
    for _, task, start, end in records:
        durations[task.stage, task.mb, task.kind] = end - start
    costs = forecast_costs if forecast_costs is not None else stage_medians(durations).tolist()
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
        policy,
        sample,
        slack_microbatches=slack_microbatches,
        activation_budget=budgets,
        notices=True,
        admission=admission,
    )
    return result.makespan
