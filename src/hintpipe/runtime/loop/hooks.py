"""What acts around a step: one protocol, one set of verbs, called in order by the pipeline.

A step is the :class:`~hintpipe.runtime.loop.step_loop.StepLoop` plus the work
around it: the executors learn the step, gradient reductions start as each
stage finishes its gradients and complete at the end (data parallelism, FSDP2,
tied weights), sends are flushed, admission checks what the step held, the
ranks agree on costs and non-finite losses, and the report is gathered. Each
of those is a :class:`StepHook`; :class:`~hintpipe.runtime.pipeline.Pipeline`
keeps them in one list (built by :mod:`hintpipe.runtime.assembly`) and a step
is ``begin_step`` on each, the loop (which calls ``stage_done``), then
``end_step`` on each, in the list's order.

[Note: the order of the end of a step]
Sends are flushed first (a neighbour may be waiting on them to finish its own
step), then gradients are reduced (data parallel, then tied: the average over
replicas of a sum over uses is the sum over uses of the averages), then
admission checks the step's peak, then the ranks agree (which may drop the
step's gradients, so it comes after every reduction), and the report comes
last, with every figure the others measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState


class StepHook(Protocol):
    """Something that acts around a step."""

    def begin_step(self, state: StepState) -> None:
        """The step ``state.step`` is about to run (its inputs are split, its order chosen)."""

    def stage_done(self, stage: int) -> None:
        """This rank's ``stage`` finished its last gradient task of the step (its last ``B``, or its
        last ``W`` when the hint splits the backward): its gradients are complete."""

    def end_step(self, state: StepState) -> None:
        """Every task of the step ran on this rank; ``state`` holds what it did. Hooks may add figures
        to ``state.measured`` for the step's report."""


class Hook:
    """A :class:`StepHook` that does nothing: subclasses override the verbs they need."""

    def begin_step(self, state: StepState) -> None:
        return None

    def stage_done(self, stage: int) -> None:
        return None

    def end_step(self, state: StepState) -> None:
        return None
