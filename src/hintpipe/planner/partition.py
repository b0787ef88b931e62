"""A partition as the plan reports it: stage boundaries, each stage's time, memory and savings.

Also :func:`max_microbatch_size`, the bracketing that turns "does it fit" into
the largest micro-batch that fits, for the plan and for its baselines alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hintpipe.planner.memory import MemoryModel, stage_cost
from hintpipe.planner.tables import NodeTables


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage of a plan (JSON-serialisable)."""

    first_node: str
    last_node: str
    nodes: int
    time_ms: float
    memory_bytes: float
    budget_bytes: float
    inflight: int
    activation_bytes: float
    recompute: tuple[str, ...]
    offload: tuple[str, ...]

    @property
    def spare_bytes(self) -> float:
        return self.budget_bytes - self.memory_bytes


@dataclasses.dataclass(frozen=True)
class Partition:
    """Stage boundaries as node indices: stage ``s`` covers ``cuts[s]:cuts[s+1]``."""

    cuts: tuple[int, ...]
    bottleneck_ms: float
    stages: tuple[StagePlan, ...]
    max_microbatch_size: int


def describe(
    tables: NodeTables, model: MemoryModel, cuts: Sequence[int], *, savings: bool = True
) -> tuple[StagePlan, ...]:
    """Each stage of ``cuts`` as :func:`stage_cost` sees it (``savings=False``: as cut, nothing recomputed)."""
    out = []
    for s in range(len(cuts) - 1):
        a, b = cuts[s], cuts[s + 1]
        cost = stage_cost(tables, model, s, a, b, savings=savings)
        out.append(
            StagePlan(
                first_node=tables.names[a],
                last_node=tables.names[b - 1],
                nodes=b - a,
                time_ms=cost.time * 1e3,
                memory_bytes=cost.memory,
                budget_bytes=model.budgets[s],
                inflight=model.inflight[s],
                activation_bytes=cost.activation,
                recompute=tuple(tables.names[i] for i in cost.recompute),
                offload=tuple(tables.names[i] for i in cost.offload),
            )
        )
    return tuple(out)


def max_microbatch_size(
    tables: NodeTables,
    model: MemoryModel,
    stages: int,
    profiled_size: int,
    fits: Callable[[MemoryModel], bool],
    limit: int = 1 << 16,
) -> int:
    """The largest micro-batch size (a multiple of 1) for which ``fits`` holds; 0 if none."""

    def at(size: int) -> bool:
        return fits(dataclasses.replace(model, scale=size / profiled_size))

    if not at(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and at(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid):
            lo = mid
        else:
            hi = mid
    return lo


def summary(partition: Partition) -> dict[str, Any]:
    """The partition as JSON: per stage its nodes, time, memory and how many nodes it saves on."""
    return {
        "stages": [
            {
                "first_node": s.first_node,
                "last_node": s.last_node,
                "nodes": s.nodes,
                "time_ms": s.time_ms,
                "memory_bytes": s.memory_bytes,
                "budget_bytes": s.budget_bytes,
                "inflight": s.inflight,
                "recompute": len(s.recompute),
                "offload": len(s.offload),
            }
            for s in partition.stages
        ],
        "cuts": list(partition.cuts),
        "bottleneck_ms": partition.bottleneck_ms,
        "max_microbatch_size": partition.max_microbatch_size,
    }
