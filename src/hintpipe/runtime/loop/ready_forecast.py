"""The ``ready`` policy's forecast: what each task is expected to cost and when it is due.

Built from each stage's median measured costs with
:func:`hintpipe.dispatch.expected.forecasts_for` (the same function the prediction of
a step uses), and rebuilt only when those medians move by more than
:data:`REFRESH_THRESHOLD`: rebuilding runs the whole hint once, which at
hundreds of ranks is far too much work to repeat every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hintpipe.dispatch.expected import forecasts_for, moved
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.schedule.hint import Hint

#: Relative change of any stage's median cost that makes the forecast be rebuilt.
REFRESH_THRESHOLD = 0.1
#: The most steps between two looks at the measured costs once they have settled.
LONGEST_INTERVAL = 16
#: The fitted hints whose forecasts are kept (one per distinct step shape: see :meth:`ReadyForecaster.forecast_for`).
FITTED_KEPT = 64


class ReadyForecaster:
    """One rank's current forecast, kept in step with the measured costs.

    Every rank sees the same medians (they are all-reduced), so every rank
    rebuilds at the same step, and from the same numbers. The costs are
    looked at after steps 0, 1, 3, 7, ...: at intervals that double up to
    :data:`LONGEST_INTERVAL`, whether or not they moved. Timings on a busy
    machine move by more than the threshold all the time, and a forecast rebuilt
    (and costs all-reduced) every step costs more than it saves; so steady
    training pays for a look on one step in 16 at most, and a real change of
    costs is taken up within 16 steps.
    """

    def __init__(self, hint: Hint, rank: int, threshold: float = REFRESH_THRESHOLD) -> None:
        self.hint = hint
        self.rank = rank
        self.threshold = threshold
        self.costs: tuple[tuple[float, ...], ...] | None = None
        self.forecast: RankForecast | None = None
        self.rebuilds = 0
        self._interval = 1
        self._next = 0
        #: Forecasts of fitted hints, by the hint's identity, with the hint and the costs they were made on.
        self._fitted: dict[int, tuple[Hint, tuple[tuple[float, ...], ...], RankForecast]] = {}

    def forecast_for(self, fitted: Hint | None) -> RankForecast | None:
        """The forecast for a step that runs ``fitted``, the hint fitted to the step's budgets by size (see
        [Note: byte admission] in :mod:`hintpipe.runtime.loop.admission`; None: the hint itself): its
        positions are another order's, so it is forecast afresh on the same costs, once per fitted hint and
        costs: admission keeps one fitted hint per distinct step shape, and steps that come back to a shape
        reuse its forecast)."""
        if fitted is None or fitted is self.hint or self.costs is None:
            return self.forecast
        kept = self._fitted.get(id(fitted))
        if kept is not None and kept[0] is fitted and kept[1] == self.costs:
            return kept[2]
        if kept is None and len(self._fitted) >= FITTED_KEPT:
            del self._fitted[next(iter(self._fitted))]
        forecast = forecasts_for(fitted, self.costs)[self.rank]
        self._fitted[id(fitted)] = (fitted, self.costs, forecast)
        return forecast

    def due(self, step: int) -> bool:
        """Whether the step that just ended should share its measured costs."""
        return step >= self._next

    def update(self, step: int, medians: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Per-stage ``[F, B, W]`` medians of ``step``, the step that just ended."""
        costs = tuple(tuple(float(v) for v in row) for row in medians)
        if moved(self.costs, costs, self.threshold):
            self.costs = costs
            self.forecast = forecasts_for(self.hint, costs)[self.rank]
            self.rebuilds += 1
        self._next = step + self._interval
        self._interval = min(2 * self._interval, LONGEST_INTERVAL)
