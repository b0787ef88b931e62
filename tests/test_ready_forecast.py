"""The ready policy's forecast: rebuilt from measured costs only when they move, looked at ever more rarely."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hintpipe.dispatch.expected import cost_model_of, forecasts_for
from hintpipe.runtime.loop.ready_forecast import LONGEST_INTERVAL, ReadyForecaster
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Simulator


def test_the_forecast_is_rebuilt_only_when_costs_move_and_costs_are_looked_at_ever_more_rarely() -> None:
    hint = generate_hint("1f1b", 4, 8)
    forecaster = ReadyForecaster(hint, rank=1)
    costs = np.array([[1.0, 2.0, 0.0]] * 4)
    looked = []
    for step in range(60):
        if forecaster.due(step):
            looked.append(step)
            # 5% noise: below the 10% threshold, no rebuild; a jump at step 40 rebuilds.
            scale = 1.5 if step >= 40 else 1.0 + 0.05 * (step % 2)
            forecaster.update(step, costs * scale)
    assert forecaster.rebuilds == 2
    assert looked == [0, 1, 3, 7, 15, 31, 47]  # the jump at step 40 is taken up at 47
    assert LONGEST_INTERVAL == 16
    assert forecaster.forecast == forecasts_for(hint, (costs * 1.5).tolist())[1]


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
