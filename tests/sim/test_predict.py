"""The simulator's prediction of a measured step (:mod:`hintpipe.sim.predict`): given a step's own task times, and
for ``ready`` the costs it forecast with, the simulator runs that step again to the same makespan."""

from __future__ import annotations

import pytest

from hintpipe.dispatch.policy import Policy
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.task import B, F
from hintpipe.sim.predict import predict_step_time
from hintpipe.sim.simulate import simulate


@pytest.mark.parametrize(("name", "chunks"), [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)])
@pytest.mark.parametrize("policy", list(Policy))
def test_a_step_given_its_own_task_times_is_predicted_to_its_makespan(name: str, chunks: int, policy: Policy) -> None:
    hint = generate_hint(name, 3, 6, chunks)
    measured = simulate(hint, ranks=3, microbatches=6, policy=policy, variability=["iid:0.3"], seed=2)
    # ``ready`` forecast the step with the simulation's expected costs (all 1): the prediction is told them.
    forecast = [[1.0, 1.0, 1.0]] * hint.stages if policy is Policy.READY else None
    assert predict_step_time(hint, measured.timeline(), forecast, policy) == measured.makespan


def test_each_tasks_time_is_its_end_less_its_start_wherever_it_ran() -> None:
    hint = generate_hint("1f1b", 2, 1)
    # Measured late and out of place (a rank's clock starts at 100): only the durations count.
    records = [(0, F(0, 0), 100.0, 101.0), (1, F(1, 0), 150.0, 152.0), (1, B(1, 0), 160.0, 163.0)]
    records.append((0, B(0, 0), 170.0, 174.0))
    assert predict_step_time(hint, records, None, Policy.FIXED) == 1.0 + 2.0 + 3.0 + 4.0
