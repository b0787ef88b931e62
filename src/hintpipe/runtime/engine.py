"""One rank's step engine: the training steps and evaluations it runs, one after another, each one
:class:`~hintpipe.runtime.loop.step_loop.StepLoop` over a scoreboard.

:class:`~hintpipe.runtime.pipeline.Pipeline` checks its options and hands each step here; a step then runs
facade -> :class:`StepEngine` -> ``StepLoop``. What the engine keeps between exchanges of messages:

- **one count** of exchanges for steps and evaluations (messages carry it, so that a neighbour's early message
  is never taken for this one's), the stash of such early messages, and the training steps run;
- **the first exchange starts with every rank** (:func:`meet`: a barrier that names a rank that never came);
- **an error tells the neighbours at once** (:meth:`StepEngine.abort`), so that they end too instead of waiting
  out their watchdogs; the end is told to them, and waits for them (:meth:`StepEngine.close`).

A training step calls ``begin_step`` on every step hook, runs the loop over the step's scoreboard (the hint's
tasks, under the policy; ``ready`` runs the hint in order until it has a forecast from measured costs), then
``end_step`` on every hook (:mod:`hintpipe.runtime.loop.hooks`: reductions, admission, the ranks' agreement,
the report).

An evaluation runs on the same ranks, transport and readiness: each rank's forwards in the hint's order
(:meth:`Hint.forwards <hintpipe.schedule.hint.Hint.forwards>`), any of them as soon as its input is there
unless the pipeline runs ``fixed``. Nothing is held for a backward, so no memory admission applies and no step
hook runs; the modules are in eval mode for it (dropout off), and every module's mode is restored after.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.options import PipelineConfig
from hintpipe.runtime import liveness
from hintpipe.runtime.errors import WatchdogTimeout, backend_reason
from hintpipe.runtime.loop.asked_notices import AskedNotices
from hintpipe.runtime.loop.hooks import StepHook
from hintpipe.runtime.loop.microbatch import Batch, check_ends, order_step, prepare_step, relative_sizes
from hintpipe.runtime.loop.step_loop import StepLoop
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.parts import Parts
from hintpipe.runtime.transport.wire import Message
from hintpipe.schedule.hint import Hint

__all__ = ["StepEngine", "broadcast", "evaluating", "meet"]

T = TypeVar("T")

#: What a step's losses are checked with: the agreement's rule in training; an evaluation reports its loss,
#: whatever it is.
LossCheck = Callable[[Sequence[torch.Tensor], Sequence[int]], None]


class StepEngine:
    """The exchanges of one rank's pipeline (``parts``, built with ``config``), in order, until it is closed.
    An option a step reads is read here, from ``config``.

    Attributes:
        steps: training steps run so far (the number of the next).
        closed: whether the neighbours were told the end (or this rank's failure).
    """

    def __init__(self, parts: Parts, config: PipelineConfig) -> None:
        self.parts = parts
        self.config = config
        self.steps = 0
        self.closed = False
        self._round = 0
        self._stash: list[Message] = []  # messages of later exchanges that came early
        #: The producer notices asked for, by the neighbours and by this rank, kept across the run's steps
        #: (``ready`` only: see [Note: notices asked for] in hintpipe.runtime.transport.protocol).
        self._notices = AskedNotices() if parts.policy is Policy.READY else None

    # -- what the facade asks for -------------------------------------------------------

    def step(
        self,
        inputs: Batch | None,
        target: Batch | None,
        loss_divisor: float | None,
        broadcast_loss: bool,
        ends: tuple[Sequence[float], Sequence[float]] | None,
    ) -> torch.Tensor | None:
        """One training step (see :meth:`Pipeline.step <hintpipe.runtime.pipeline.Pipeline.step>`)."""
        return self._guarded(lambda: self._train(inputs, target, loss_divisor, broadcast_loss, ends))

    def evaluate(
        self, inputs: Batch | None, target: Batch | None, loss_divisor: float | None, broadcast_loss: bool
    ) -> torch.Tensor | None:
        """One evaluation (see :meth:`Pipeline.eval_step <hintpipe.runtime.pipeline.Pipeline.eval_step>`)."""
        return self._guarded(lambda: self._evaluate(inputs, target, loss_divisor, broadcast_loss))

    def abort(self, exc: BaseException) -> None:
        """Tell the neighbours at once that this rank failed (``exc``, named by its rank), and stop."""
        if not self.closed:
            self.closed = True
            rank = self.parts.rank
            text = str(exc) if re.match(rf"rank {rank}\b", str(exc)) else f"rank {rank}: {exc}"
            self.parts.carrier.close(timeout=5.0, error=text)
            if self.parts.coordination is not None and not self.parts.coordination.is_leader:
                self.parts.coordination.close(timeout=5.0)

    def close(self) -> None:
        """Tell the neighbours this rank is done and stop its mailboxes."""
        if not self.closed:
            self.closed = True
            if self.parts.coordination is not None:
                self.parts.coordination.close(self.parts.timeout)
            self.parts.carrier.close(timeout=self.parts.timeout)

    # -- a training step ----------------------------------------------------------------

    def _train(
        self,
        inputs: Batch | None,
        target: Batch | None,
        loss_divisor: float | None,
        broadcast_loss: bool,
        ends: tuple[Sequence[float], Sequence[float]] | None,
    ) -> torch.Tensor | None:
        parts = self.parts
        round_ = self._next_round()  # first: a rank refusing its inputs then reaches its neighbours' step
        state = prepare_step(self.steps, parts, inputs, target, loss_divisor)
        state.round = round_
        check_ends(ends, self.config.microbatch_order, parts.microbatches)
        order_step(state, parts, self.config.microbatch_order, ends)
        for hook in parts.hooks:
            hook.begin_step(state)
        board = self._training_board(state)
        self._loop(board, state, parts.agreement.check_losses, parts.hooks)
        state.loss = torch.stack(state.losses).sum() if state.losses else None
        for hook in parts.hooks:
            hook.end_step(state)
        self.steps += 1
        return broadcast(parts, state.loss, f"step {state.step}") if broadcast_loss else state.loss

    def _training_board(self, state: StepState) -> Scoreboard:
        """The step's scoreboard: ``ready`` runs the hint in order until it has a forecast from measured costs."""
        parts = self.parts
        forecaster = parts.agreement.forecaster
        ready = parts.policy is Policy.READY and forecaster.forecast is not None
        state.policy = Policy.FIXED if parts.policy is Policy.READY and not ready else parts.policy
        state.forecast_costs = forecaster.costs if ready else None
        graph, budget = parts.admission.for_step(state.elements, state.given_elements, step=state.step)
        fitted = parts.admission.fitted
        return Scoreboard(
            graph,
            state.policy,
            budget=budget,
            forecast=forecaster.forecast_for(fitted.hint if fitted is not None else None) if ready else None,
            notices=ready,
            notices_travel=True,
            sizes=relative_sizes(state.elements) if ready else None,
        )

    # -- an evaluation ------------------------------------------------------------------

    def _evaluate(
        self, inputs: Batch | None, target: Batch | None, loss_divisor: float | None, broadcast_loss: bool
    ) -> torch.Tensor | None:
        parts = self.parts
        with evaluating(parts.modules.values()):
            round_ = self._next_round()
            state = prepare_step(self.steps, parts, inputs, target, loss_divisor)
            state.round = round_
            state.order = list(range(parts.microbatches))  # the micro-batches in the order given
            state.evaluating = True
            policy = Policy.FIXED if parts.policy is Policy.FIXED else Policy.GREEDY
            board = Scoreboard(_forwards(parts.hint, parts.rank), policy)
            self._loop(board, state, lambda losses, slots: None, ())
            loss = torch.stack(state.losses).sum() if state.losses else None
        return broadcast(parts, loss, f"evaluation {self.steps}") if broadcast_loss else loss

    # -- what both share ----------------------------------------------------------------

    def _loop(self, board: Scoreboard, state: StepState, check: LossCheck, hooks: Sequence[StepHook]) -> None:
        """Run ``board``'s tasks of ``state`` on this rank: one :class:`StepLoop`."""
        parts = self.parts
        StepLoop(
            rank=parts.rank,
            board=board,
            executor=parts.executor,
            transport=parts.carrier,
            admission=parts.admission,
            timeout=parts.timeout,
            stash=self._stash,
            check_losses=check,
            coordination=parts.coordination,
            notices=self._notices,
            timer=parts.timer,
            hooks=hooks,
        ).run(state)

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


@contextlib.contextmanager
def evaluating(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Every module in eval mode inside, each submodule's own mode restored after."""
    modes = [(m, m.training) for module in modules for m in module.modules()]
    for module, _ in modes:
        module.training = False
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@functools.lru_cache(maxsize=8)
def _forwards(hint: Hint, rank: int) -> RankGraph:
    return RankGraph(hint.forwards(), rank)


def broadcast(parts: Parts, loss: torch.Tensor | None, label: str) -> torch.Tensor:
    """The last stage's loss, on every rank of the pipeline (``label``: the step, for the error that names a
    rank lost meanwhile)."""
    buffer = loss.detach().clone() if loss is not None else torch.zeros(())
    try:
        dist.broadcast(buffer, group=parts.coll, group_src=parts.hint.placement.stage_rank[-1])
    except RuntimeError as exc:
        raise liveness.lost_peer(dist.get_rank(), f"{label} (its loss broadcast)", exc) from None
    return buffer


def meet(parts: Parts, step: int) -> None:
    """Start the first step together (one clock for the timeline), but never wait on a missing rank longer
    than the watchdog timeout. A barrier that fails sooner lost a rank (one that failed on its own inputs
    and exited resets its connections at once): that rank is named, not a wait that did not happen."""
    began = time.monotonic()
    try:
        dist.monitored_barrier(group=parts.coll, timeout=datetime.timedelta(seconds=parts.timeout))
    except RuntimeError as exc:
        if time.monotonic() - began < parts.timeout:
            raise liveness.lost_peer(dist.get_rank(), f"the start of step {step}", exc) from None
        silent = liveness.silent_ranks()  # a rank stopped (SIGSTOP, a debugger) still holds its connections
        said = liveness.describe(silent) if silent else backend_reason(str(exc))
        raise WatchdogTimeout(
            f"rank {parts.rank}: waited {parts.timeout:g} s for the other ranks to start step {step}: {said}"
        ) from None
