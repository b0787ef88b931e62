"""Lower bounds on a step's makespan: what no policy can beat, with any memory or with a budget.

- :func:`lower_bound`: the busiest rank's work, or the longest single
  micro-batch's critical path, whichever is longer.
- :func:`memory_bound`: the same at a memory budget. A forward's activations
  are held from the start of the ``F`` until its releaser (``W`` when split,
  else ``B``) ends, which is at least that micro-batch's chain: its forwards
  from that stage to the last, its backwards back, and the ``W``, with the
  latency of every hop between ranks. A rank that may hold ``M`` at once holds
  at most ``M T`` size-time in a step of makespan ``T``, so
  ``T >= sum(size x chain) / M`` over the rank's forwards (Little's law, per
  rank). It shows why a budget caps a speedup that the work alone would allow.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind

if TYPE_CHECKING:
    from hintpipe.dispatch.layout import HintLayout
    from hintpipe.dispatch.sample import Sample

FloatArray = npt.NDArray[np.float64]


def _hops_after(hint: Hint) -> tuple[FloatArray, float]:
    """Per stage, the cross-rank hops from it up to the last stage; and all of them."""
    stage_rank = hint.placement.stage_rank
    cross = np.array([stage_rank[s] != stage_rank[s + 1] for s in range(hint.stages - 1)] + [False], dtype=float)
    return np.cumsum(cross[::-1])[::-1], float(cross.sum())


def lower_bound(hint: Hint, sample: Sample, busy: Sequence[float] | None = None) -> float:
    """max(busiest rank's work, longest single micro-batch critical path).

    A micro-batch's path runs its forwards through every stage, its backwards
    back to some stage ``s`` and that stage's ``W``; each hop between ranks
    costs at least the latency.
    """
    costs = sample.costs
    busiest = max(busy if busy is not None else _busy(hint, costs))
    hops_after, hops = _hops_after(hint)
    forward = costs[:, :, Kind.F].sum(axis=0) + hops * sample.latency
    backward_suffix = np.cumsum(costs[::-1, :, Kind.B], axis=0)[::-1]
    tail = backward_suffix + costs[:, :, Kind.W] + (hops_after * sample.latency)[:, None]
    path = float((forward + tail.max(axis=0)).max())
    return max(busiest, path)


def _busy(hint: Hint, costs: FloatArray) -> list[float]:
    return [float(costs[tasks.stage, tasks.mb, tasks.kind].sum()) for tasks in hint.lists]


def memory_bound(layout: HintLayout, sample: Sample, budgets: Sequence[float]) -> float:
    """The makespan no policy can beat while each rank ``r`` holds at most ``budgets[r]``
    (in the units of the layout's graphs: slots, bytes or sizes); see the module docstring.
    Not below :func:`lower_bound`'s memory-free terms, which it leaves to the caller."""
    costs = sample.costs
    hops_after, _ = _hops_after(layout.hint)
    forward_suffix = np.cumsum(costs[::-1, :, Kind.F], axis=0)[::-1]
    backward_suffix = np.cumsum(costs[::-1, :, Kind.B], axis=0)[::-1]
    chain = forward_suffix + backward_suffix + costs[:, :, Kind.W] + (2 * hops_after * sample.latency)[:, None]
    best = 0.0
    for r, graph in enumerate(layout.graphs):
        held = np.maximum(graph.delta_array, 0.0)
        if budgets[r] > 0 and held.any():
            best = max(best, float((held * chain[layout.stage[r], layout.mb[r]]).sum()) / budgets[r])
    return best
