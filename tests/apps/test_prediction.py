"""What the simulator predicts for a step the runtime ran (:mod:`hintpipe.apps.prediction`): from the step's report
alone, within the budgets it ran under where every rank's is known, and refused where its timelines were not kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from hintpipe.apps.prediction import predict_step_time
from hintpipe.dispatch.fit import BudgetError
from hintpipe.dispatch.policy import Policy
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulate import simulate

HINT = generate_hint("gpipe", 2, 4)


def _report(**changes: object) -> Any:
    """A report of the step the simulator ran under greedy (uniform costs: a makespan of 15)."""
    step = simulate(HINT, ranks=2, microbatches=4, policy="greedy")
    fields = {"records": step.timeline(), "step": 3, "budget": (), "forecast_costs": None, "sizes": ()}
    return cast(Any, SimpleNamespace(**{**fields, **changes}))


def test_a_step_is_predicted_from_its_report() -> None:
    assert predict_step_time(HINT, _report(), Policy.GREEDY) == 15.0
    # A budget known for some ranks only (a rank's report of its own) is no budget for the prediction.
    assert predict_step_time(HINT, _report(budget=(2.0, float("inf"))), Policy.GREEDY) == 15.0
    assert predict_step_time(HINT, _report(budget=(2.0,)), Policy.GREEDY) == 15.0


def test_every_ranks_budget_binds_the_prediction() -> None:
    # GPipe holds all 4 forwards: 2 slots a rank is below what the hint itself needs.
    with pytest.raises(BudgetError, match=r"^memory budget 2 on rank 0 is below the hint's own peak 4; raise"):
        predict_step_time(HINT, _report(budget=(2.0, 2.0)), Policy.GREEDY)


def test_a_step_without_its_timelines_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError) as refused:
        predict_step_time(HINT, _report(records=_report().records[:-1]), Policy.GREEDY)
    assert str(refused.value) == (
        "step 3's timelines were not kept; train with timelines=True (--trace or --timeline) and predict from "
        "rank 0's reports"
    )
