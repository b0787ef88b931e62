"""``hintpipe.simulate`` (:mod:`hintpipe.sim.simulate`): one step of a schedule by name, file or object, as the
command line simulates it; exact makespans on uniform costs, and a seed that draws the same step."""

from __future__ import annotations

import pytest

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulate import simulate


def test_gpipe_on_uniform_costs_takes_its_fill_and_drain_exactly() -> None:
    # (m + p - 1) forwards of 1 and as many backwards of 2 (W folded into B): 5 + 10; each rank busy 4 x 3.
    result = simulate("gpipe", ranks=2, microbatches=4, policy="fixed")
    assert (result.policy, result.makespan, result.busy, result.lower_bound) == (Policy.FIXED, 15.0, (12.0, 12.0), 12.0)
    assert result.peak_live == (4.0, 4.0)  # every forward held before the first backward
    assert simulate("1f1b", ranks=2, microbatches=4, policy="fixed").peak_live == (2.0, 1.0)


def test_a_hint_object_and_costs_run_as_given() -> None:
    hint = generate_hint("1f1b", 2, 1)
    costs = CostModel.uniform(2, forward=[1.0, 2.0], backward=[4.0, 3.0], weight=0.0)
    assert simulate(hint, ranks=2, microbatches=1, costs=costs).makespan == 1.0 + 2.0 + 3.0 + 4.0


def test_a_seed_draws_the_same_step_and_another_seed_another() -> None:
    runs = [simulate("1f1b", ranks=2, microbatches=4, variability=["mb:0.5"], seed=seed).makespan for seed in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]


def test_an_unknown_policy_or_a_wrong_size_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^unknown policy 'best': choose one of fixed, greedy, ready$"):
        simulate("1f1b", ranks=2, microbatches=4, policy="best")
    with pytest.raises(ValueError, match=r"^hint '1f1b' is for 2 ranks and 1 micro-batches, the run has 2 ranks and 4"):
        simulate(generate_hint("1f1b", 2, 1), ranks=2, microbatches=4)
