"""The memory-blind partitions the plan is compared with: equal layers per stage, or balanced sums."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.planner.tables import NodeTables


def balanced_cuts(weights: npt.NDArray[np.float64], allowed: Sequence[int], stages: int) -> tuple[int, ...]:
    """Contiguous cuts minimising the largest per-stage sum of ``weights`` (no memory)."""
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    n = len(weights)

    def greedy(limit: float) -> tuple[int, ...] | None:
        cuts, a = [0], 0
        for s in range(stages - 1):
            remaining = stages - 1 - s
            lo = bisect.bisect_right(allowed, a)
            hi = len(allowed) - remaining
            if lo > hi or lo >= len(allowed):
                return None
            best = None
            for c in allowed[lo : hi + 1]:
                if prefix[c] - prefix[a] <= limit:
                    best = c
                else:
                    break
            if best is None:
                return None
            cuts.append(best)
            a = best
        if prefix[n] - prefix[a] > limit:
            return None
        return (*cuts, n)

    lo_t, hi_t = 0.0, float(prefix[n])
    best = greedy(hi_t)
    assert best is not None
    for _ in range(100):
        if hi_t - lo_t <= 1e-12 * max(hi_t, 1e-30):
            break
        mid = (lo_t + hi_t) / 2
        cuts = greedy(mid)
        if cuts is None:
            lo_t = mid
        else:
            hi_t, best = mid, cuts
    return best


def uniform_cuts(tables: NodeTables, stages: int) -> tuple[int, ...]:
    """Equal numbers of parameterised nodes (layers) per stage, snapped to allowed cuts."""
    layered = np.flatnonzero(tables.params > 0)
    if len(layered) < stages:
        layered = np.arange(tables.size)
    cuts = [0]
    for s in range(1, stages):
        target = int(layered[round(s * len(layered) / stages)])
        options = [c for c in tables.allowed if c > cuts[-1]]
        cuts.append(min(options, key=lambda c: (abs(c - target), c)))
    return (*cuts, tables.size)
