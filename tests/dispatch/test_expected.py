"""What ``ready`` expects from measured task times (:mod:`hintpipe.dispatch.expected`): each stage's median
costs, a forecast made from them by the same sweep the simulator forecasts with, and rebuilt only when they move."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hintpipe.dispatch.expected import cost_model_of, forecasts_for, moved, stage_medians
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Simulator


@pytest.mark.parametrize(("name", "chunks"), [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("zbv", 2)])
def test_the_runtime_s_forecast_is_the_simulator_s_on_the_same_costs(name: str, chunks: int) -> None:
    # The runtime forecasts with dispatch's engine alone (no simulator); a simulation's ``ready`` forecasts with
    # the same sweep: on the same per-stage costs the two are one forecast, position for position.
    hint = generate_hint(name, 3, 6, chunks)
    costs = [[1.0 + 0.25 * s, 2.0 - 0.1 * s, 0.5 * (s % 2)] for s in range(hint.stages)]
    simulated = Simulator(hint, cost_model_of(costs)).forecasts()
    planned = forecasts_for(hint, costs)
    assert [dataclasses.astuple(p) for p in planned] == [dataclasses.astuple(p) for p in simulated]
    assert [len(p.due) for p in planned] == [len(tasks) for tasks in hint.lists]


def test_each_stages_cost_is_the_median_over_its_micro_batches() -> None:
    durations = np.array([[[1.0, 2.0, 0.0], [9.0, 3.0, 0.0], [2.0, 4.0, 1.0]]])  # [stage, mb, kind]
    assert stage_medians(durations).tolist() == [[2.0, 3.0, 0.0]]  # a slow micro-batch moves no median
    model = cost_model_of([[1.0, 2.0, 0.5], [3.0, 4.0, 0.0]])
    assert (model.forward, model.backward, model.weight) == ((1.0, 3.0), (2.0, 4.0), (0.5, 0.0))


def test_costs_have_moved_only_past_the_relative_threshold() -> None:
    costs = [[1.0, 2.0, 0.0]]
    assert moved(None, costs, 0.1)  # nothing forecast yet
    assert not moved(costs, [[1.09, 1.9, 0.0]], 0.1)
    assert moved(costs, [[1.0, 2.0, 0.5]], 0.1)  # from nothing to something: all of it moved
    assert moved(costs, [[1.0, 2.3, 0.0]], 0.1)
