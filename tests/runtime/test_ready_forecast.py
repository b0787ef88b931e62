"""The ready policy's forecast: rebuilt from measured costs only when they move, looked at ever more rarely; a
step's fit and its forecast made once per distinct step shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hintpipe.dispatch.by_size import FittedStep, fit_step
from hintpipe.dispatch.expected import forecasts_for
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.runtime.loop.admission import Admission
from hintpipe.runtime.loop.ready_forecast import LONGEST_INTERVAL, ReadyForecaster
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint


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


def test_the_fit_and_the_forecast_are_made_once_per_distinct_step_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Steps of variable lengths come back to a few shapes: each shape's fit, and the forecast of a fitted hint,
    # are made once and reused whenever the shape comes back, not only when it repeats the step before.
    import hintpipe.runtime.loop.admission as admission_module
    import hintpipe.runtime.loop.ready_forecast as ready_forecast_module

    hint = generate_hint("1f1b", 4, 8)
    fits: list[int] = []
    forecasts: list[Hint] = []

    def fit(hint: Hint, weights: Any, budgets: Any) -> FittedStep:
        fits.append(1)
        return fit_step(hint, weights, budgets)

    def forecast(hint: Hint, costs: Any) -> list[RankForecast]:
        forecasts.append(hint)
        return forecasts_for(hint, costs)

    monkeypatch.setattr(admission_module, "fit_step", fit)
    monkeypatch.setattr(ready_forecast_module, "forecasts_for", forecast)
    admission = Admission(hint, 1, 1.0, None, unit=AdmissionUnit.SIZE)
    short, long = [16, 64, 32, 64, 8, 64, 64, 48], [64] * 8
    fitted = [admission._fit(shape, shape, step) for step, shape in enumerate([short, long, short, long, short])]
    assert len(fits) == 2
    assert fitted[2] is fitted[0] and fitted[3] is fitted[1] and fitted[4] is fitted[0]

    forecaster = ReadyForecaster(hint, rank=1)
    costs = np.array([[1.0, 2.0, 0.0]] * 4)
    forecaster.update(0, costs)
    assert forecasts == [hint]
    # Two fitted hints of two shapes, in turn (any hints of the same ranks stand in for them here).
    a, b = generate_hint("gpipe", 4, 8), generate_hint("bf", 4, 8)
    got = [forecaster.forecast_for(h) for h in (a, b, a, b, a)]
    assert forecasts == [hint, a, b]
    assert got[0] == forecasts_for(a, costs.tolist())[1] and got[1] == forecasts_for(b, costs.tolist())[1]
    assert got[2] is got[0] and got[3] is got[1] and got[4] is got[0]
