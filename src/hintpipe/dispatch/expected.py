"""What the ``ready`` policy expects, from measured task times: one definition.

The runtime forecasts for ``ready`` with each stage's median measured costs
(:func:`stage_medians`), and :func:`forecasts_for` turns those into every rank's
:class:`~hintpipe.dispatch.rank_forecast.RankForecast` by a fixed-order run of the hint
on dispatch's engine (:meth:`hintpipe.dispatch.layout.HintLayout.forecasts`, the sweep
the simulator forecasts with too). The prediction of a measured step
(:func:`hintpipe.sim.predict.predict_step_time`) uses the very same costs (a
:class:`~hintpipe.runtime.loop.reports.StepReport` carries the ones its step
planned with), so "the simulator predicts the runtime" compares like with like.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.layout import HintLayout
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind

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


def forecasts_for(hint: Hint, costs: StageCosts) -> list[RankForecast]:
    """Every rank's forecast: the hint run in fixed order on these per-stage costs (memory in slots)."""
    model = cost_model_of(costs)
    model.check_fits(hint.stages, hint.microbatches)
    layout = HintLayout(hint, [RankGraph(hint, r) for r in range(hint.ranks)])
    return layout.forecasts(model.expected(hint.microbatches, hint.split_backward))


def moved(old: StageCosts | None, new: StageCosts, threshold: float) -> bool:
    """Whether any cost moved by more than ``threshold`` (relative) since ``old``:
    the runtime rebuilds its forecast only then."""
    if old is None:
        return True
    a, b = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-12)
    return bool((np.abs(a - b) / scale > threshold).any())
