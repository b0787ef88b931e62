"""Admission: how much a rank may hold, in micro-batch slots or by size.

[Note: byte admission]
With an ``activation_budget`` each micro-batch is admitted by its own size, so
that micro-batches of different shapes (variable sequence lengths) cannot
push a rank over its budget by running ahead. At the start of a step the
rank of stage 0 sends each micro-batch's size in input elements (tokens,
rows) to every rank, and every rank sends the most activation bytes per input
element each of its stages has kept so far (measured, as
:attr:`StepReport.peak_live_bytes` is); so every rank knows, for every stage,
the bytes ``F(s, mb)`` will keep: that size times that stage's bytes per
element. The first step runs the hint in order and measures; if it alone
holds more than the budget, :class:`BudgetError`. Every later step runs the
hint *fitted* to the budgets (:func:`hintpipe.dispatch.by_size.fit_step`, the
function the simulator's admission by size calls): where the hint's own order
would hold more than a rank's budget (long micro-batches together), the fitted
order lets a rank's ``F`` wait for room and runs what frees memory first, so
no order ever exceeds the budget; every rank computes the same fitted hint
from the same numbers. A step whose micro-batches cannot fit at all (one too
large for the budget) is refused with :class:`BudgetError`. A step whose
measured peak still exceeds the budget (activations that grow faster than the
input, as attention scores do) logs a warning and raises the estimates by the
excess.

[Note: admission by size without a byte budget]
``admission="size"`` weighs each forward by its micro-batch's input elements
alone, and gives every rank what the hint holds by size in the step's *given*
order (plus ``slack_microbatches`` of its largest micro-batches, or with
``device_budget_fraction`` the busiest rank's, times ``1 + device_budget_fraction``): a sorted
order (``microbatch_order``) of the same micro-batches then runs fitted to
what the order they came in needs, the configuration the simulator's
``--admission size`` studies (benchmarks/readiness-at-scale).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from hintpipe.dispatch.budgets import device_budgets, slack_room
from hintpipe.dispatch.by_size import FittedStep, fit_step, size_room, size_weights
from hintpipe.dispatch.fit import AdmissionUnit, BudgetError
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.runtime.errors import WatchdogTimeout
from hintpipe.runtime.loop.hooks import Hook
from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState
from hintpipe.units import format_size

log = logging.getLogger(__name__)

#: The distinct step shapes whose fits are kept (:meth:`Admission._fit`).
FITS_KEPT = 64


class Admission(Hook):
    """One rank's admission rule: the hint's own peak plus slack in slots, or by size (a byte budget, or the
    given order's room by size). As a step hook it checks, after each step under a byte budget, what the step
    held (:meth:`end_step`).

    Args:
        hint: the schedule.
        rank: this rank.
        slack_microbatches: room for this many more micro-batches than the hint's own peak.
        activation_budget: activation bytes a rank may hold (byte admission): one for every rank, or one
            per pipeline rank; or None.
        strict: whether a first step over ``activation_budget`` is an error (a
            budget the user gave) or not (a plan's room to run ahead).
        device_budget_fraction: instead of ``slack_microbatches``, slots per device: every rank may
            hold what the hint's busiest rank holds, times ``1 + device_budget_fraction``
            (see :func:`hintpipe.dispatch.budgets.device_budgets`).
        unit: ``slots``, or ``size`` (see [Note: admission by size without a byte budget]); a byte budget
            always counts by size.

    The caller checks that at most one of ``slack_microbatches``, ``activation_budget`` and ``device_budget_fraction``
    is given (:func:`hintpipe.options.check_options`).
    """

    def __init__(
        self,
        hint: Hint,
        rank: int,
        slack_microbatches: float = 0.0,
        activation_budget: float | Sequence[float] | None = None,
        *,
        strict: bool = True,
        device_budget_fraction: float | None = None,
        unit: AdmissionUnit = AdmissionUnit.SLOTS,
    ) -> None:
        self.hint = hint
        self.rank = rank
        self.stages = hint.placement.stages_of(rank)
        self.graph = RankGraph(hint, rank)
        #: The rank's room in slots (no byte admission): its own peak plus the slack, or the device's.
        self.slots = slack_room(self.graph, slack_microbatches)
        if device_budget_fraction is not None:
            split = hint.split_backward
            peaks = [max(rules.in_flight(tasks, split), default=0) for tasks in hint.lists]  # each rank's own peak
            self.slots = device_budgets(peaks, device_budget_fraction)[rank]
        self.slack_microbatches = slack_microbatches
        self.device_budget_fraction = device_budget_fraction
        self.unit = unit
        #: Every pipeline rank's byte budget (every rank fits the same hint to all of them), or None.
        self.budgets: tuple[float, ...] | None = None
        if isinstance(activation_budget, (int, float)):
            self.budgets = (float(activation_budget),) * hint.ranks
        elif activation_budget is not None:
            self.budgets = tuple(float(b) for b in activation_budget)
        self.activation_budget = None if self.budgets is None else self.budgets[rank]
        self.strict = strict
        #: The current step's dependency graph and budget (from :meth:`for_step`), and the hint fitted to the
        #: step's budgets (None: the hint itself ran).
        self.step_graph = self.graph
        self.step_budget = self.slots
        self.fitted: FittedStep | None = None
        #: Per stage of this rank, the most activation bytes per input element seen.
        self.bytes_per_element: dict[int, float] = {}
        #: Per stage of the pipeline, the bytes per input element every rank agreed on at the step's start
        #: (None until every stage has measured one).
        self.factors: np.ndarray[tuple[int], np.dtype[np.float64]] | None = None
        #: The fits made so far, by the step's sizes (see :meth:`_fit`), oldest first.
        self._fits: dict[tuple[tuple[int, ...], tuple[int, ...] | None, bytes], FittedStep | None] = {}

    @property
    def by_bytes(self) -> bool:
        return self.activation_budget is not None

    @property
    def by_size(self) -> bool:
        """Whether the step needs every micro-batch's size: a byte budget, or ``admission="size"``."""
        return self.by_bytes or self.unit is AdmissionUnit.SIZE

    def measured_factors(self) -> list[float]:
        """Per stage of the pipeline, this rank's bytes per input element (-inf for stages it does not host
        or has not measured): what it contributes to the agreement at the next step's start."""
        return [self.bytes_per_element.get(s, -np.inf) for s in range(self.hint.stages)]

    def agree(self, factors: Sequence[float]) -> None:
        """Every stage's bytes per input element, as every rank agreed on them (the largest measured)."""
        values = np.asarray(factors, dtype=float)
        self.factors = values if np.isfinite(values).all() else None

    def for_step(
        self, elements: Sequence[int] | None, given: Sequence[int] | None = None, *, step: int = 0
    ) -> tuple[RankGraph, float]:
        """The step's dependency graph and budget (kept for :meth:`end_step`): slots, or by size with the hint
        fitted to the budgets (``elements``: each slot's input elements; ``given``: the same in the order
        the micro-batches came, for the room by size).

        Raises:
            BudgetError: a byte budget the step's micro-batches cannot fit in, whatever the order.
        """
        graph, budget = self.graph, self.slots
        self.fitted = None
        if self.by_size and elements is not None:
            if self.by_bytes and self.factors is None:
                budget = self.graph.peak  # the first step: the hint in order, measuring
            else:
                self.fitted = self._fit(elements, elements if given is None else given, step)
                if self.fitted is not None:
                    graph, budget = self.fitted.graphs[self.rank], self.fitted.budgets[self.rank]
                else:  # a plan's room that the step cannot fit: the hint's order, said
                    graph = RankGraph(self.hint, self.rank, size_weights(self.hint, elements, self.factors)[self.rank])
                    budget = graph.peak
        self.step_graph, self.step_budget = graph, budget
        return graph, budget

    def _fit(self, elements: Sequence[int], given: Sequence[int], step: int) -> FittedStep | None:
        """The hint fitted to the step's budgets, made once per distinct step shape: a step with the sizes of
        one of the last :data:`FITS_KEPT` distinct shapes reuses its fit (a fit runs the whole hint; variable
        lengths come back to a few shapes, packed rows to one)."""
        factors = self.factors if self.by_bytes else None
        key = (tuple(elements), None if self.by_bytes else tuple(given), b"" if factors is None else factors.tobytes())
        if key in self._fits:
            return self._fits[key]
        weights = size_weights(self.hint, elements, factors)
        if self.budgets is not None:
            room = list(self.budgets)
        else:
            room = size_room(
                self.hint,
                size_weights(self.hint, given),
                slack_microbatches=self.slack_microbatches,
                device_budget_fraction=self.device_budget_fraction,
            )
        fitted: FittedStep | None
        try:
            fitted = fit_step(self.hint, weights, room)
        except BudgetError as exc:
            if self.strict:
                raise BudgetError(
                    f"rank {self.rank}: step {step}'s micro-batches cannot run within the memory budget: {exc}; "
                    "or use smaller micro-batches"
                ) from None
            log.warning(
                "rank %d: step %d's micro-batches do not fit the plan's room (%s); the hint runs in its own order",
                self.rank,
                step,
                exc,
            )
            fitted = None
        if len(self._fits) >= FITS_KEPT:
            del self._fits[next(iter(self._fits))]
        self._fits[key] = fitted
        return fitted

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


def exchange_sizes(
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
    factors: Sequence[float] | None = None,
) -> tuple[list[int], tuple[list[float], list[float]] | None, list[float] | None]:
    """What every rank of the pipeline learns at a step's start, in one collective: each micro-batch's size
    in input elements, from the rank of stage 0 (``source``); with ``with_ends`` (the same on every rank)
    also each micro-batch's known work at the first and the last stage (``ends``, given on ``source``; its
    size at both where not given); and with ``factors`` (every rank's :meth:`Admission.measured_factors`)
    the largest each stage's ranks measured.

    ``first_inputs`` maps micro-batch to stage 0's inputs (empty on other ranks). Every value is sent as the
    largest over the ranks (a rank that does not know one sends ``-inf``).
    """
    rows = 3 if with_ends else 1
    values = torch.full(
        (rows * microbatches + (len(factors) if factors is not None else 0),), -np.inf, dtype=torch.float64
    )
    table = values[: rows * microbatches].view(rows, microbatches)
    for mb, inputs in first_inputs.items():
        table[:, mb] = float(sum(t.numel() for t in inputs))
    if with_ends and ends is not None and rank == source:
        table[1] = torch.tensor([float(v) for v in ends[0]], dtype=torch.float64)
        table[2] = torch.tensor([float(v) for v in ends[1]], dtype=torch.float64)
    if factors is not None:
        values[rows * microbatches :] = torch.tensor([float(v) for v in factors], dtype=torch.float64)
    try:
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    except RuntimeError as exc:
        raise WatchdogTimeout(
            f"rank {rank}: waited {timeout:g} s for the micro-batch sizes from rank {source} in step {step}: {exc}"
        ) from None
    sizes = [int(v) for v in table[0].tolist()]
    both = (table[1].tolist(), table[2].tolist()) if with_ends else None
    return sizes, both, (values[rows * microbatches :].tolist() if factors is not None else None)
