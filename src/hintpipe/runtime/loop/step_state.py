"""What one step of one rank holds: the state the step loop fills and every step hook reads.

Kept apart from :mod:`~hintpipe.runtime.loop.step_loop` so that the hooks, admission and the reports can
name it without importing the loop that calls them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from hintpipe.device import Arrival
from hintpipe.dispatch.policy import Policy
from hintpipe.observe.trace import Record
from hintpipe.runtime.loop.executor import Tensors, as_input
from hintpipe.runtime.transport.wire import MessageKind, Value
from hintpipe.schedule.task import Kind, Task


@dataclasses.dataclass
class StepState:
    """What one step of one rank holds: inputs that arrived, targets, and what it produced."""

    step: int
    activations: dict[tuple[int, int], list[Value]]  # (stage, mb) -> inputs of F (tensors and numbers)
    gradients: dict[tuple[int, int], Tensors] = dataclasses.field(default_factory=dict)  # -> output grads for B
    #: The transfers of received inputs still to be waited on by the stream that computes, by the task they
    #: are an input of (see :meth:`StepLoop._run`).
    arrivals: dict[Task, Arrival] = dataclasses.field(default_factory=dict)
    targets: Sequence[Any] = ()
    loss_scale: float = 1.0
    elements: Sequence[int] | None = None  # per slot, its micro-batch's input elements (admission by size)
    given_elements: Sequence[int] | None = None  # the same in the order the micro-batches came
    losses: list[torch.Tensor] = dataclasses.field(default_factory=list)
    loss_slots: list[int] = dataclasses.field(default_factory=list)  # the slot of each of ``losses``
    records: list[Record] = dataclasses.field(default_factory=list)
    peak_bytes: int = 0
    started: float = 0.0  # wall clock (time.time) at the loop's start: the ranks' common clock
    decisions: collections.deque[int] = dataclasses.field(default_factory=collections.deque)  # the TP leader's
    order: list[int] = dataclasses.field(default_factory=list)  # slot -> the given micro-batch it runs
    loop_time: float = 0.0  # from the loop's start to its last task's end
    policy: Policy = Policy.FIXED  # the policy the step ran (``ready`` runs fixed until it has a plan)
    forecast_costs: tuple[tuple[float, ...], ...] | None = None  # the per-stage costs ``ready`` forecast with
    loss: torch.Tensor | None = None  # the sum of the scaled micro-batch losses (the last stage's rank)
    #: Figures the step's hooks measured for its report (see :class:`~hintpipe.runtime.loop.reports.RankSummary`).
    measured: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Which exchange of messages this is (training steps and evaluations share one count, so that a
    #: neighbour's early message is never taken for this one's); messages carry it as their step.
    round: int = -1  # -1: the step's number
    #: An evaluation: forwards only, no gradients (:meth:`Pipeline.eval_step
    #: <hintpipe.runtime.pipeline.Pipeline.eval_step>`).
    evaluating: bool = False

    def __post_init__(self) -> None:
        if self.round < 0:
            self.round = self.step

    @property
    def label(self) -> str:
        """How an error names it: ``step 3``, or ``the evaluation after step 3``."""
        return f"the evaluation after step {self.step}" if self.evaluating else f"step {self.step}"

    def receive(self, kind: MessageKind, stage: int, mb: int, tensors: Sequence[Value]) -> Task:
        """Keep what arrived for ``stage`` (from a neighbour, or this rank's previous stage); returns the
        task it is an input of. Activations become leaf inputs (numbers stay numbers); gradients are kept as
        they are (a number's slot holds None)."""
        if kind is MessageKind.ACTIVATION:
            self.activations[(stage, mb)] = [as_input(t) for t in tensors if t is not None]
            return Task(stage, Kind.F, mb)
        self.gradients[(stage, mb)] = [t if isinstance(t, torch.Tensor) else None for t in tensors]
        return Task(stage, Kind.B, mb)
