"""One step's work: each task's cost and each message's delay, the same for every policy compared.

The simulator draws it (:meth:`Sample.draw`); the runtime's report builds one of the measured task times for
its lower bound (:func:`hintpipe.dispatch.bounds.lower_bound`), and a prediction runs the simulator on it.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.variability import (
    CommDelay,
    Variability,
    comm_delay,
    decision_latency,
    sample_message_delays,
    sample_work,
)
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order


@dataclasses.dataclass(frozen=True)
class Sample:
    """One trial's drawn work: ``costs[stage, mb, kind]``, the delay of the
    message a task sends when it finishes, ``delays[stage, mb, kind]``, each
    micro-batch's size as known before the step (``sizes[mb]``, relative work;
    ``None``: all equal), and its known factor on each stage (``known[stage, mb]``,
    relative; ``None``: its size on every stage)."""

    costs: npt.NDArray[np.float64]
    delays: npt.NDArray[np.float64]
    latency: float
    decision: float = 0.0  # added to every task under greedy and ready (tensor-parallel coordination)
    sizes: npt.NDArray[np.float64] | None = None
    known: npt.NDArray[np.float64] | None = None

    @classmethod
    def draw(
        cls,
        hint: Hint,
        cost_model: CostModel,
        models: Sequence[Variability] = (),
        rng: np.random.Generator | None = None,
    ) -> Sample:
        """Sample costs and message delays for ``hint`` under ``models``."""
        cost_model.check_fits(hint.stages, hint.microbatches)
        rng = rng if rng is not None else np.random.default_rng(0)
        expected = cost_model.expected(hint.microbatches, hint.split_backward)
        costs, sizes, known = sample_work(expected, list(models), rng)
        comm = comm_delay(list(models))
        delays = sample_message_delays(comm, costs.size, rng).reshape(costs.shape)
        return cls(costs, delays, comm.latency, decision_latency(list(models)), sizes, known)

    def reordered(self, perm: Sequence[int]) -> Sample:
        """The same work with slot ``i`` running drawn micro-batch ``perm[i]``."""
        index = np.asarray(perm, dtype=np.int64)
        if sorted(index.tolist()) != list(range(self.costs.shape[1])):
            raise ValueError(f"not a permutation of the {self.costs.shape[1]} micro-batches: {list(perm)}")
        sizes = None if self.sizes is None else self.sizes[index]
        known = None if self.known is None else self.known[:, index]
        return dataclasses.replace(
            self, costs=self.costs[:, index], delays=self.delays[:, index], sizes=sizes, known=known
        )

    def ordered(self, order: MicrobatchOrder | str) -> Sample:
        """The same work, micro-batches run in ``order`` of their known sizes
        (see :func:`~hintpipe.schedule.microbatch_order.microbatch_order`)."""
        sizes = self.sizes if self.sizes is not None else np.ones(self.costs.shape[1])
        ends = None if self.known is None else (self.known[0].tolist(), self.known[-1].tolist())
        return self.reordered(microbatch_order(sizes.tolist(), order, ends=ends))

    @classmethod
    def expected(cls, hint: Hint, cost_model: CostModel, comm: CommDelay | None = None) -> Sample:
        """The expected work: no noise, messages take exactly the latency."""
        cost_model.check_fits(hint.stages, hint.microbatches)
        costs = cost_model.expected(hint.microbatches, hint.split_backward)
        latency = comm.latency if comm is not None else 0.0
        return cls(costs, np.full(costs.shape, latency), latency)
