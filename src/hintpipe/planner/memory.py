"""The memory model: what a range of nodes costs as one stage, with the savings that make it fit.

Memory of stage ``s`` (bytes, per device)::

    params x (2 + optimizer_factor)                 weights, gradients, optimizer state
    + inflight(s) x (kept activations + boundary)   what the in-flight micro-batches hold
                                                    (the received inputs and the send buffer)

``inflight(s)`` is what the hint's fixed-order run holds on that stage at most
(1F1B: ``min(p - s, m)``), read off the scoreboard's own accounting.

Savings per segment (the nodes between two neighbouring allowed cuts):
recompute frees its saved bytes for its forward time again in backward;
offload frees them for ``2 x bytes / host_bandwidth`` minus the segment's own
compute it overlaps with. A stage over budget takes the cheapest savings per
byte until it fits.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from hintpipe.planner.tables import NodeTables


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """How stage memory is counted.

    Attributes:
        inflight: per stage, the micro-batches the hint holds at most.
        budgets: per stage, bytes.
        optimizer_factor: optimizer state per parameter byte (Adam: 2).
        host_bandwidth: bytes/s to host memory, for offload; 0 disables offload.
        scale: micro-batch size / profiled micro-batch size (costs scale linearly).
    """

    inflight: tuple[int, ...]
    budgets: tuple[float, ...]
    optimizer_factor: float = 2.0
    host_bandwidth: float = 10e9
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class StageCost:
    """One range as one stage: its time (seconds per micro-batch, savings included) and memory (bytes)."""

    feasible: bool
    time: float
    memory: float
    activation: float
    recompute: tuple[int, ...] = ()
    offload: tuple[int, ...] = ()
    shortfall: float = 0.0


def stage_cost(
    tables: NodeTables, model: MemoryModel, stage: int, a: int, b: int, *, savings: bool = True
) -> StageCost:
    """Time and memory of nodes ``a:b`` as stage ``stage``, with the cheapest savings that fit it."""
    return range_cost(tables, model, stage, a, b, tables.boundary(a, b), savings=savings)


def range_cost(
    tables: NodeTables, model: MemoryModel, stage: int, a: int, b: int, boundary: float, *, savings: bool = True
) -> StageCost:
    """:func:`stage_cost` with the boundary bytes given (the search bounds ranges with a boundary it picks).

    Everything but ``boundary`` is a sum of non-negative per-node or
    per-segment terms over ``a:b``, which is what makes feasibility monotone:
    with the same ``boundary``, a sub-range of a range that fits fits too,
    and takes no longer (a sub-range's memory falls by at least what the
    dropped segments could free, and its cheapest savings are a subset of the
    range's).
    """
    scale = model.scale
    k = model.inflight[stage]
    act = float(tables.saved[a:b].sum()) * scale
    boundary *= scale
    base_time = float(tables.compute[a:b].sum()) * scale
    fixed = float(tables.params[a:b].sum()) * (2.0 + model.optimizer_factor)
    memory = fixed + k * (act + boundary)
    budget = model.budgets[stage]
    if memory <= budget:
        return StageCost(True, base_time, memory, act + boundary)
    if not savings:
        return StageCost(False, base_time, memory, act + boundary, shortfall=memory - budget)
    return _with_savings(tables, model, stage, a, b, StageCost(True, base_time, memory, act + boundary))


def _with_savings(tables: NodeTables, model: MemoryModel, stage: int, a: int, b: int, plain: StageCost) -> StageCost:
    """``plain`` (over budget) with the cheapest segments per byte recomputed or offloaded until it fits."""
    scale = model.scale
    k = model.inflight[stage]
    need = plain.memory - model.budgets[stage]
    bounds = tables.segment_bounds
    first, last = bisect.bisect_left(bounds, a), bisect.bisect_left(bounds, b)
    saved = tables.segment_free[first:last] * scale * k
    recompute_cost = tables.segment_forward[first:last] * scale
    if model.host_bandwidth > 0:
        transfer = 2.0 * tables.segment_free[first:last] * scale / model.host_bandwidth
        offload_cost = np.maximum(0.0, transfer - tables.segment_compute[first:last] * scale)
    else:  # no host to offload to
        offload_cost = np.full(last - first, np.inf)
    cost = np.minimum(recompute_cost, offload_cost)
    useful = saved > 0
    if saved[useful].sum() < need:
        shortfall = need - float(saved.sum())
        return StageCost(False, plain.time, plain.memory - saved.sum(), plain.activation, shortfall=shortfall)
    order = np.flatnonzero(useful)[np.argsort(cost[useful] / saved[useful], kind="stable")]
    freed = extra = 0.0
    recompute: list[int] = []
    offload: list[int] = []
    for i in order:
        freed += saved[i]
        extra += cost[i]
        nodes = range(bounds[first + int(i)], bounds[first + int(i) + 1])
        (recompute if recompute_cost[i] <= offload_cost[i] else offload).extend(nodes)
        if freed >= need:
            break
    recompute.sort()
    offload.sort()
    kept = plain.activation - freed / k
    return StageCost(True, plain.time + extra, plain.memory - freed, kept, tuple(recompute), tuple(offload))
