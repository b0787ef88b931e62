"""Admission by size, the part the simulator and the runtime share: what each task weighs, what each rank
may hold, and the hint fitted to that.

Under admission by size (see [Note: admission by size] in :mod:`hintpipe.dispatch.fit`) a forward weighs
its micro-batch's known size (input elements: tokens, rows, image patches), times a per-stage factor where
one is known (the cost model's activation bytes in the simulator, the measured bytes per element in the
runtime). Without a byte budget, a rank may hold what the hint holds by size *in the step's given order*
(plus ``slack_microbatches`` of its largest micro-batches, or every rank the busiest rank's, times
``1 + device_budget_fraction``): a sorted order of the same micro-batches then holds no more than the order they
came in would. The simulator (:meth:`Simulator.run(admission="size")
<hintpipe.sim.simulator.Simulator.run>`) and the runtime
(:class:`~hintpipe.runtime.loop.admission.Admission`) both call :func:`fit_step`, so that the runtime runs
the order the simulator predicts.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.budgets import device_budgets, slack_room
from hintpipe.dispatch.fit import fit_hint
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def size_weights(
    hint: Hint, sizes: Sequence[float] | FloatArray | None, factors: FloatArray | None = None
) -> list[FloatArray]:
    """Per rank and hint position, what admission by size counts the task as: a forward its micro-batch's
    size (``sizes[mb]``; 1 each where None) times ``factors[stage]`` (one per stage) or
    ``factors[stage, mb]`` (per stage and micro-batch) where given; every other task 0."""
    known = np.ones(hint.microbatches) if sizes is None else np.asarray(sizes, dtype=float)
    weights = []
    for tasks in hint.lists:
        weight = known[tasks.mb]
        if factors is not None:
            weight = weight * (factors[tasks.stage] if factors.ndim == 1 else factors[tasks.stage, tasks.mb])
        weights.append(np.where(tasks.kind == Kind.F, weight, 0.0))
    return weights


def size_room(
    hint: Hint,
    given: Sequence[FloatArray],
    *,
    slack_microbatches: float = 0.0,
    device_budget_fraction: float | None = None,
) -> list[float]:
    """Per rank, the room by size measured on ``given`` (:func:`size_weights` of the step's micro-batches in the
    order they came): the rank's own fixed-order peak plus ``slack_microbatches`` of its largest micro-batches, or
    with ``device_budget_fraction`` every rank the busiest rank's peak times ``1 + device_budget_fraction``."""
    graphs = [RankGraph(hint, r, w) for r, w in enumerate(given)]
    if device_budget_fraction is not None:
        return device_budgets([g.peak for g in graphs], device_budget_fraction)
    return [slack_room(g, slack_microbatches) for g in graphs]


@dataclasses.dataclass(frozen=True)
class FittedStep:
    """A step's hint fitted to its budgets by size.

    Attributes:
        hint: the fitted hint (the given hint itself where every rank fits already).
        graphs: per rank, the fitted hint's graph, each forward weighted by its size.
        budgets: per rank, what it may hold, in the weights' units.
        orders: per rank, position ``i`` of the fitted list is the given hint's position ``orders[r][i]``.
    """

    hint: Hint
    graphs: tuple[RankGraph, ...]
    budgets: tuple[float, ...]
    orders: tuple[IntArray, ...]

    @property
    def moved(self) -> bool:
        """Whether fitting changed any rank's order."""
        return any(bool((order != np.arange(len(order))).any()) for order in self.orders)


def fit_step(hint: Hint, weights: Sequence[FloatArray], budgets: Sequence[float]) -> FittedStep:
    """``hint`` fitted into ``budgets`` with each task weighing ``weights[rank][position]``.

    Raises:
        BudgetError: where a budget cannot hold what the hint needs at once (see :func:`fit_hint`).
    """
    graphs = [RankGraph(hint, r, w) for r, w in enumerate(weights)]
    fitted, orders = fit_hint(hint, graphs, budgets)
    if fitted is not hint:
        graphs = [RankGraph(fitted, r, w[order]) for r, (w, order) in enumerate(zip(weights, orders, strict=True))]
    return FittedStep(fitted, tuple(graphs), tuple(float(b) for b in budgets), tuple(orders))
