"""One training step of a built pipeline, and what surrounds it: the step's scoreboard, the ranks' first
meeting, and the loss broadcast.

:class:`~hintpipe.runtime.pipeline.Pipeline` holds the options and the step count; this is what its
``step`` runs: the step hooks' ``begin_step``, one :class:`~hintpipe.runtime.loop.step_loop.StepLoop` over
the step's scoreboard, then ``end_step`` (see :mod:`hintpipe.runtime.loop.hooks`).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.runtime import liveness
from hintpipe.runtime.errors import WatchdogTimeout, backend_reason
from hintpipe.runtime.loop.microbatch import relative_sizes
from hintpipe.runtime.loop.step_loop import StepLoop
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.parts import Parts
from hintpipe.runtime.transport.wire import Message


def run_step(parts: Parts, state: StepState, stash: list[Message]) -> torch.Tensor | None:
    """Run the prepared step ``state`` on this rank (``stash``: messages that came early, kept between steps);
    returns its loss on the last stage's rank (the sum of the scaled micro-batch losses), else None."""
    for hook in parts.hooks:
        hook.begin_step(state)
    StepLoop(
        rank=parts.rank,
        board=scoreboard(parts, state),
        executor=parts.executor,
        transport=parts.post_office,
        admission=parts.admission,
        timeout=parts.timeout,
        stash=stash,
        check_losses=parts.agreement.check_losses,
        coordination=parts.coordination,
        notices=state.policy is Policy.READY,
        timer=parts.timer,
        hooks=parts.hooks,
    ).run(state)
    state.loss = torch.stack(state.losses).sum() if state.losses else None
    for hook in parts.hooks:
        hook.end_step(state)
    return state.loss


def scoreboard(parts: Parts, state: StepState) -> Scoreboard:
    """The step's scoreboard: ``ready`` runs the hint in order until it has a plan of measured costs."""
    planner = parts.agreement.planner
    ready = parts.policy is Policy.READY and planner.plan is not None
    state.policy = Policy.FIXED if parts.policy is Policy.READY and not ready else parts.policy
    state.plan_costs = planner.costs if ready else None
    graph, budget = parts.admission.for_step(state.elements, state.given_elements, step=state.step)
    fitted = parts.admission.fitted
    return Scoreboard(
        graph,
        state.policy,
        budget=budget,
        plan=planner.plan_for(fitted.hint if fitted is not None else None) if ready else None,
        notices=ready,
        notices_travel=True,
        sizes=relative_sizes(state.elements) if ready else None,
    )


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
