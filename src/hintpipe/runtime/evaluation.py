"""Evaluation steps: the hint's forwards, run as they become ready, without gradients.

An evaluation runs on the same ranks, transport and readiness as a training
step: each rank's forwards in the hint's order (:meth:`Hint.forwards
<hintpipe.schedule.hint.Hint.forwards>`), any of them as soon as its input is
there unless the pipeline runs ``fixed``. Nothing is held for a backward, so
no memory admission applies; the modules are in eval mode for it (dropout
off), and every module's mode is restored after.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.runtime.loop.microbatch import Batch, prepare_step
from hintpipe.runtime.loop.step_loop import StepLoop
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.transport.wire import Message
from hintpipe.schedule.hint import Hint

if TYPE_CHECKING:
    from hintpipe.runtime.parts import Parts


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


def evaluation_state(
    parts: Parts, step: int, inputs: Batch | None, target: Batch | None, loss_divisor: float | None
) -> StepState:
    """The evaluation's micro-batches (in the order given) as a step's."""
    state = prepare_step(step, parts, inputs, target, loss_divisor)
    state.order = list(range(parts.microbatches))
    state.evaluating = True
    return state


@functools.lru_cache(maxsize=8)
def _forwards(hint: Hint, rank: int) -> RankGraph:
    return RankGraph(hint.forwards(), rank)


def run_evaluation(parts: Parts, state: StepState, stash: list[Message]) -> torch.Tensor | None:
    """Run the evaluation; returns its loss on the last stage's rank (the sum of the scaled micro-batch
    losses), else None."""
    policy = Policy.FIXED if parts.policy is Policy.FIXED else Policy.GREEDY
    StepLoop(
        rank=parts.rank,
        board=Scoreboard(_forwards(parts.hint, parts.rank), policy),
        executor=parts.executor,
        transport=parts.post_office,
        admission=parts.admission,
        timeout=parts.timeout,
        stash=stash,
        check_losses=lambda losses, slots: None,  # an evaluation reports its loss, whatever it is
        coordination=parts.coordination,
        timer=parts.timer,
    ).run(state)
    return torch.stack(state.losses).sum() if state.losses else None
