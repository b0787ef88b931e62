"""What one step did, predicted or measured: the one record the simulator and the runtime both return.

[Note: one record of a step]
A prediction is only as useful as it is comparable with the run it predicts. The simulator's
:class:`~hintpipe.sim.simulator.SimResult` and the runtime's
:class:`~hintpipe.runtime.loop.reports.StepReport` are both a :class:`StepRecord`: the same fields
under the same names and units (the step's ``makespan`` from its first task's start to its last
task's end, its ``lower_bound``, each rank's ``busy`` time, ``peak_live`` and ``budget`` in
admission's units), the same derived figures computed here once (``efficiency``, ``bubble``), and
the same :meth:`StepRecord.timeline`. So ``hintpipe.simulate(...)`` and ``Pipeline.reports[-1]``
compare field by field. Each adds what only it has: the simulator its hint as run and its own
seconds, the runtime the step's loss, bytes, reductions and CPU time.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses

from hintpipe.dispatch.policy import Policy
from hintpipe.observe.trace import Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One step, predicted or measured (see [Note: one record of a step]).

    Attributes:
        policy: the dispatch policy it ran under.
        makespan: from the step's start to its last task's end (seconds measured, or the cost model's unit).
        lower_bound: max(busiest rank, one micro-batch's critical path) of the step's task times.
        busy: per rank, the time its tasks took.
        peak_live: per rank, the most activations it held at once, in admission's units.
        budget: per rank, what admission let it hold, in the same units.
    """

    policy: Policy
    makespan: float
    lower_bound: float
    busy: tuple[float, ...]
    peak_live: tuple[float, ...]
    budget: tuple[float, ...] = ()

    @property
    def efficiency(self) -> float:
        """The lower bound over the makespan: 1.0 is a step no schedule can beat."""
        return self.lower_bound / self.makespan if self.makespan > 0 else 1.0

    @property
    def bubble(self) -> tuple[float, ...]:
        """Per rank, the idle share of the makespan."""
        if self.makespan <= 0:
            return tuple(0.0 for _ in self.busy)
        return tuple(1.0 - b / self.makespan for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """The ranks' mean idle share."""
        bubble = self.bubble
        return sum(bubble) / len(bubble) if bubble else 0.0

    def timeline(self) -> tuple[Record, ...]:
        """``(rank, task, start, end)`` of every task the record holds, in start order."""
        raise NotImplementedError
