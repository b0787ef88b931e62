"""Admission: how much a rank may hold, in micro-batch slots or in bytes.

[Note: byte admission]
With an ``activation_budget`` each micro-batch is admitted by its own size, so
that micro-batches of different shapes (variable sequence lengths) cannot
push a rank over its budget by running ahead. At the start of a step the
rank of stage 0 broadcasts each micro-batch's size in input elements
(tokens, rows); every rank estimates the activation bytes of ``F(s, mb)`` as
that size times the most bytes per element stage ``s`` has kept so far
(measured, as :attr:`StepReport.peak_live_bytes` is), and the scoreboard
admits in those bytes. The first step runs the hint in order and measures;
if it alone holds more than the budget, :class:`BudgetError`. A later step
whose micro-batches are so large that the hint's own order needs more than
the budget runs that order (no running ahead); a step whose measured peak
still exceeds the budget (activations that grow faster than the input, as
attention scores do) logs a warning and raises the estimates by the excess.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hintpipe.runtime.errors import WatchdogTimeout
from hintpipe.runtime.loop.hooks import Hook
from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind
from hintpipe.scoreboard import BudgetError, RankGraph, device_budgets

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState
from hintpipe.units import format_size

log = logging.getLogger(__name__)


class Admission(Hook):
    """One rank's admission rule: the hint's own peak plus slack in slots, or a byte budget. As a step hook
    it checks, after each step under a byte budget, what the step held (:meth:`end_step`).

    Args:
        hint: the schedule.
        rank: this rank.
        memory_slack: room for this many more micro-batches than the hint's own peak.
        activation_budget: activation bytes this rank may hold (byte admission), or None.
        strict: whether a first step over ``activation_budget`` is an error (a
            budget the user gave) or not (a plan's room to run ahead).
        device_budget: instead of ``memory_slack``, slots per device: every rank may
            hold what the hint's busiest rank holds, times ``1 + device_budget``
            (see :func:`hintpipe.scoreboard.device_budgets`).

    The caller checks that at most one of ``memory_slack``, ``activation_budget`` and ``device_budget``
    is given (:func:`hintpipe.options.check_options`).
    """

    def __init__(
        self,
        hint: Hint,
        rank: int,
        memory_slack: float = 0.0,
        activation_budget: float | None = None,
        *,
        strict: bool = True,
        device_budget: float | None = None,
    ) -> None:
        self.hint = hint
        self.rank = rank
        self.stages = hint.placement.stages_of(rank)
        self.graph = RankGraph(hint, rank)
        #: The rank's room in slots (no byte admission): its own peak plus the slack, or the device's.
        self.slots = self.graph.peak + memory_slack * self.graph.unit
        if device_budget is not None:
            split = hint.split_backward
            peaks = [max(rules.in_flight(tasks, split), default=0) for tasks in hint.lists]  # each rank's own peak
            self.slots = device_budgets(peaks, device_budget)[rank]
        self.memory_slack = memory_slack
        self.activation_budget = activation_budget
        self.strict = strict
        #: The current step's dependency graph and budget (from :meth:`for_step`).
        self.step_graph = self.graph
        self.step_budget = self.slots
        #: Per stage of this rank, the most activation bytes per input element seen.
        self.bytes_per_element: dict[int, float] = {}

    @property
    def by_bytes(self) -> bool:
        return self.activation_budget is not None

    def for_step(self, elements: Sequence[int] | None) -> tuple[RankGraph, float]:
        """The step's dependency graph and budget: slots, or bytes per micro-batch (kept for :meth:`end_step`)."""
        graph, budget = self.graph, self.slots
        if self.activation_budget is not None and elements is not None:
            if any(s not in self.bytes_per_element for s in self.stages):
                budget = self.graph.peak  # the first step: the hint in order, measuring
            else:
                sizes = [
                    self.bytes_per_element[t.stage] * elements[t.mb] if t.kind is Kind.F else 0.0
                    for t in self.graph.tasks
                ]
                graph = RankGraph(self.hint, self.rank, sizes)
                budget = max(self.activation_budget, graph.peak)
        self.step_graph, self.step_budget = graph, budget
        return graph, budget

    def end_step(self, state: StepState) -> None:
        """Under byte admission: what the step held against its budget (see :meth:`check`)."""
        if self.by_bytes:
            self.check(state.step, state.peak_bytes, self.step_budget, first=self.step_graph is self.graph)

    def observe(self, stage: int, kept_bytes: int, elements: int) -> None:
        """A forward of ``elements`` input elements kept ``kept_bytes``."""
        per_element = kept_bytes / max(1, elements)
        self.bytes_per_element[stage] = max(self.bytes_per_element.get(stage, 0.0), per_element)

    def check(self, step: int, peak_bytes: int, budget: float, first: bool) -> None:
        """After a step under byte admission: the hint itself must fit; estimates that fell short grow."""
        if self.activation_budget is None or peak_bytes <= self.activation_budget:
            return
        if first:
            if self.strict:
                raise BudgetError(
                    f"rank {self.rank}: memory budget {format_size(self.activation_budget)} is below what the hint "
                    f"itself held, {format_size(peak_bytes)}; raise the budget, or use smaller or fewer micro-batches"
                )
        elif peak_bytes > budget:
            log.warning(
                "rank %d: step %d held %s of activations, over its budget of %s: activations grew faster than the "
                "micro-batches' input elements; the estimates are raised by that factor",
                self.rank,
                step,
                format_size(peak_bytes),
                format_size(budget),
            )
            factor = peak_bytes / budget
            self.bytes_per_element = {s: v * factor for s, v in self.bytes_per_element.items()}


def broadcast_sizes(
    first_inputs: Mapping[int, Sequence[torch.Tensor]],
    microbatches: int,
    source: int,
    group: dist.ProcessGroup,
    *,
    rank: int,
    step: int,
    timeout: float,
    ends: tuple[Sequence[float], Sequence[float]] | None = None,
    with_ends: bool = False,
) -> tuple[list[int], tuple[list[float], list[float]] | None]:
    """Each micro-batch's size in input elements, from the rank of stage 0 (``source``) to every rank; with
    ``with_ends`` (the same on every rank) also each micro-batch's known work at the first and the last stage
    (``ends``, given on ``source``; its size at both where not given).

    ``first_inputs`` maps micro-batch to stage 0's inputs (empty on other ranks).
    """
    rows = 3 if with_ends else 1
    values = torch.zeros(rows, microbatches, dtype=torch.float64)
    for mb, inputs in first_inputs.items():
        values[:, mb] = float(sum(t.numel() for t in inputs))
    if with_ends and ends is not None and rank == source:
        values[1] = torch.tensor([float(v) for v in ends[0]], dtype=torch.float64)
        values[2] = torch.tensor([float(v) for v in ends[1]], dtype=torch.float64)
    try:
        dist.broadcast(values, group=group, group_src=source)
    except RuntimeError as exc:
        raise WatchdogTimeout(
            f"rank {rank}: waited {timeout:g} s for the micro-batch sizes from rank {source} in step {step}: {exc}"
        ) from None
    sizes = [int(v) for v in values[0].tolist()]
    return sizes, ((values[1].tolist(), values[2].tolist()) if with_ends else None)
