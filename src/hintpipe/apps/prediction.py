"""What the simulator predicts for a step the runtime ran: the runtime's own report in, a step time out.

Kept beside the training loop (benchmarks and tests call it on :func:`~hintpipe.apps.training.train`'s
reports) but apart from it: it reads only a report, and the simulator's side of it is
:func:`hintpipe.sim.predict.predict_step_time`.
"""

from __future__ import annotations

import math

from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.policy import Policy
from hintpipe.renamed import renamed
from hintpipe.runtime.loop.reports import StepReport
from hintpipe.schedule.hint import Hint
from hintpipe.sim.predict import predict_step_time as _predict


@renamed("predict_step_time", slack="slack_microbatches", memory_slack="slack_microbatches")
def predict_step_time(
    hint: Hint,
    report: StepReport,
    policy: Policy,
    slack_microbatches: float = 0.0,
    *,
    admission: AdmissionUnit | str = "slots",
) -> float:
    """What the simulator predicts for a measured step (see :func:`hintpipe.sim.predict.predict_step_time`),
    within the budgets the step ran under where its report has every rank's (rank 0's reports), and under
    ``admission="size"`` with the hint fitted to them as the runtime fitted it.

    Raises:
        ValueError: if the step's timelines were not kept (``TrainConfig(timelines=True)``, on rank 0).
    """
    if len(report.records) != hint.num_tasks:
        raise ValueError(
            f"step {report.step}'s timelines were not kept; train with timelines=True (--trace or --timeline) "
            "and predict from rank 0's reports"
        )
    budgets = report.budget
    whole = len(budgets) == hint.ranks and all(math.isfinite(b) for b in budgets)
    return _predict(
        hint,
        report.records,
        report.forecast_costs,
        policy,
        slack_microbatches,
        budgets=budgets if whole else None,
        sizes=report.sizes or None,
        admission=admission,
    )
