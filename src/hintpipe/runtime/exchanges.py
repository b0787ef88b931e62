"""A rank's exchanges with its neighbours: the training steps and evaluations it runs, one after another.

Steps and evaluations share one count of exchanges (messages carry it, so that a neighbour's early
message is never taken for this one's); the first starts with every rank (a barrier that names a rank
that never came); an error in one tells the neighbours at once, so that they end too instead of waiting
out their watchdogs; the end is told to them, and waits for them. :class:`~hintpipe.runtime.pipeline.Pipeline`
keeps one and asks it for each step: what a step does is :func:`hintpipe.runtime.training_step.run_step`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from hintpipe.runtime.evaluation import evaluating, evaluation_state, run_evaluation
from hintpipe.runtime.loop.microbatch import Batch, check_ends, order_step, prepare_step
from hintpipe.runtime.parts import Parts
from hintpipe.runtime.training_step import broadcast, meet, run_step
from hintpipe.runtime.transport.wire import Message
from hintpipe.schedule.microbatch_order import MicrobatchOrder

T = TypeVar("T")


class Exchanges:
    """The exchanges of one rank's pipeline (``parts``), in order, until it is closed.

    Attributes:
        steps: training steps run so far (the number of the next).
    """

    def __init__(self, parts: Parts, order: MicrobatchOrder) -> None:
        self.parts = parts
        self.order = order
        self.steps = 0
        self.closed = False
        self._round = 0
        self._stash: list[Message] = []  # messages of later exchanges that came early

    def step(
        self,
        inputs: Batch | None,
        target: Batch | None,
        loss_divisor: float | None,
        broadcast_loss: bool,
        ends: tuple[Sequence[float], Sequence[float]] | None,
    ) -> torch.Tensor | None:
        """One training step (see :meth:`Pipeline.step <hintpipe.runtime.pipeline.Pipeline.step>`)."""
        return self._guarded(lambda: self._step(inputs, target, loss_divisor, broadcast_loss, ends))

    def evaluate(
        self, inputs: Batch | None, target: Batch | None, loss_divisor: float | None, broadcast_loss: bool
    ) -> torch.Tensor | None:
        """One evaluation (see :meth:`Pipeline.eval_step <hintpipe.runtime.pipeline.Pipeline.eval_step>`)."""
        return self._guarded(lambda: self._evaluate(inputs, target, loss_divisor, broadcast_loss))

    def _step(
        self,
        inputs: Batch | None,
        target: Batch | None,
        loss_divisor: float | None,
        broadcast_loss: bool,
        ends: tuple[Sequence[float], Sequence[float]] | None,
    ) -> torch.Tensor | None:
        round_ = self._next_round()  # first: a rank refusing its inputs then reaches its neighbours' step
        state = prepare_step(self.steps, self.parts, inputs, target, loss_divisor)
        state.round = round_
        check_ends(ends, self.order, self.parts.microbatches)
        order_step(state, self.parts, self.order, ends)
        loss = run_step(self.parts, state, self._stash)
        self.steps += 1
        return broadcast(self.parts, loss, f"step {state.step}") if broadcast_loss else loss

    def _evaluate(
        self, inputs: Batch | None, target: Batch | None, loss_divisor: float | None, broadcast_loss: bool
    ) -> torch.Tensor | None:
        with evaluating(self.parts.modules.values()):
            round_ = self._next_round()
            state = evaluation_state(self.parts, self.steps, inputs, target, loss_divisor)
            state.round = round_
            loss = run_evaluation(self.parts, state, self._stash)
        return broadcast(self.parts, loss, f"evaluation {self.steps}") if broadcast_loss else loss

    def _guarded(self, run: Callable[[], T]) -> T:
        """``run()`` (a step or an evaluation); on an error, the neighbours hear at once and it is raised."""
        if self.closed:
            raise RuntimeError("this Pipeline is closed")
        try:
            return run()
        except Exception as exc:
            self.abort(exc)
            raise

    def _next_round(self) -> int:
        """The next exchange of messages (a step or an evaluation); the first starts with every rank."""
        if self._round == 0:  # later ones meet at the end of the one before
            meet(self.parts, self.steps)
        self._round += 1
        return self._round

    def abort(self, exc: BaseException) -> None:
        """Tell the neighbours at once that this rank failed (``exc``, named by its rank), and stop."""
        if not self.closed:
            self.closed = True
            rank = self.parts.rank
            text = str(exc) if re.match(rf"rank {rank}\b", str(exc)) else f"rank {rank}: {exc}"
            self.parts.post_office.close(timeout=5.0, error=text)
            if self.parts.coordination is not None and not self.parts.coordination.is_leader:
                self.parts.coordination.close(timeout=5.0)

    def close(self) -> None:
        """Tell the neighbours this rank is done and stop its mailboxes."""
        if not self.closed:
            self.closed = True
            if self.parts.coordination is not None:
                self.parts.coordination.close(self.parts.timeout)
            self.parts.post_office.close(timeout=self.parts.timeout)
