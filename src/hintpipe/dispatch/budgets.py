"""Activation budgets: how much a rank may hold in flight, in slots or bytes.

A rank's default budget is its hint's own peak, so that running ahead never holds more than the
fixed-order pipeline; a per-device budget lends every rank the busiest rank's room.

This module is torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hintpipe.dispatch.fit import BudgetError
from hintpipe.dispatch.rank_graph import RankGraph


def slack_room(graph: RankGraph, slack_microbatches: float = 0.0) -> float:
    """A rank's room: its hint's own peak plus ``slack_microbatches`` of its largest micro-batches (slots, or by
    size: its largest micro-batch's weight). One formula for the simulator and the runtime."""
    return graph.peak + slack_microbatches * graph.unit


def device_budgets(peaks: Sequence[float], device_budget_fraction: float = 0.0) -> list[float]:
    """Per-device budgets: every rank may hold what the hint's busiest rank holds.

    A hint's own peaks differ by rank (1F1B: rank ``r`` of ``p`` holds ``p - r``
    micro-batches), so with equal devices the later ranks' memory sits idle;
    this budget lends it to running ahead, and no device ever holds more than
    the fixed-order pipeline's busiest one (times ``1 + device_budget_fraction``:
    0.25 for 25% more).

    Args:
        peaks: each rank's own fixed-order peak (slots or bytes).
        device_budget_fraction: extra share of the largest peak, >= 0.

    Raises:
        ValueError: for a negative or infinite ``device_budget_fraction``.
    """
    if device_budget_fraction < 0 or not math.isfinite(device_budget_fraction):
        raise ValueError(
            f"device_budget_fraction must be a finite fraction >= 0 (0.25 for 25% more), got {device_budget_fraction!r}"
        )
    room = max(peaks, default=0.0) * (1.0 + device_budget_fraction)
    return [room] * len(peaks)


def rank_budget(graph: RankGraph, budget: float | None) -> float:
    """A rank's budget: ``budget``, or the hint's own peak when ``None``.

    Raises:
        BudgetError: if ``budget`` is below the hint's own peak on the rank.
    """
    if budget is None:
        return graph.peak
    # A peak summed in another order than the budget may differ from it in its last bits: that is not short.
    if budget < graph.peak - abs(graph.peak) * 1e-12:
        raise BudgetError(
            f"memory budget {budget:g} on rank {graph.rank} is below the hint's own peak "
            f"{graph.peak:g}; raise the budget or choose a hint that holds fewer "
            "micro-batches in flight"
        )
    return max(float(budget), graph.peak)
