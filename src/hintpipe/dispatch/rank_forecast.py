"""What the ``ready`` policy expects of a rank's hint: when each task is due and what it costs.

A fixed-order run of the hint (planned on expected costs in the simulator, measured in the runtime)
says when each task would start. The ``ready`` policy reads a task as overdue once it is a little
later than that, and backfills other work by each task's expected cost; this module turns such a
timeline into those figures, position by position.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: The share of a task's expected cost the ``ready`` policy waits beyond its
#: planned arrival before it calls the task overdue.
PATIENCE_TOLERANCE = 0.25


@dataclasses.dataclass(frozen=True)
class RankForecast:
    """What the ``ready`` policy expects of one rank's hint, by position.

    Attributes:
        allowance: how long after its hint predecessor ends a task may take
            to become ready (its planned gap plus the tolerance).
        due: the planned start plus the tolerance: a task is never due
            earlier than this, even when the rank runs ahead of its forecast.
        expected: expected cost, for backfilling.
        producer_cost: for the ETA rule, the expected cost of the remote task
            that feeds each position (0 where there is none; empty: all 0).
        latency: the expected message latency, added to a producer's end.
    """

    allowance: Sequence[float]
    due: Sequence[float]
    expected: Sequence[float]
    producer_cost: Sequence[float] = ()
    latency: float = 0.0

    @classmethod
    def from_timeline(
        cls,
        starts: Sequence[float] | FloatArray,
        ends: Sequence[float] | FloatArray,
        expected: Sequence[float] | FloatArray,
        producer_cost: Sequence[float] | FloatArray | None = None,
        latency: float = 0.0,
    ) -> RankForecast:
        """Build from a fixed-order timeline (planned or measured) of the hint;
        ``producer_cost[i]``: the expected cost of the remote task feeding position ``i``."""
        if not len(starts) == len(ends) == len(expected):
            raise ValueError(f"{len(starts)} starts, {len(ends)} ends and {len(expected)} costs: one each per task")
        begin = np.asarray(starts, dtype=float)
        cost = np.asarray(expected, dtype=float)
        slack = PATIENCE_TOLERANCE * cost
        before = np.concatenate(([0.0], np.asarray(ends, dtype=float)[:-1]))
        gaps = np.maximum(0.0, begin - before)
        return cls(
            _doubles(gaps + slack),
            _doubles(begin + slack),
            _doubles(cost),
            () if producer_cost is None else _doubles(np.asarray(producer_cost, dtype=float)),
            float(latency),
        )


def _doubles(values: FloatArray) -> array[float]:
    """A forecast's per-position figures at 8 bytes each, not a tuple's 32: the simulator holds every rank's
    forecast at once, 8.4 million positions at 1024 x 4096 (an array, unlike a memoryview, pickles)."""
    return array("d", np.ascontiguousarray(values, dtype=np.float64).tobytes())
