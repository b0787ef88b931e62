"""What a step did: per rank, then gathered to rank 0.

[Note: reporting is O(own tasks) per rank]
Each rank summarises its own step (loop time, busy time, peaks, each task's
duration) and sends that summary to rank 0 only, with one ``gather``; the
full timelines (every task's start and end) travel only when the pipeline
was asked to keep them (``timelines=True``: a trace, a picture, a
prediction). Rank 0's :attr:`Pipeline.reports` therefore cover every rank
(``ranks`` lists them); another rank's cover itself. Nothing here runs a
simulation: the ``ready`` forecast is refreshed elsewhere, and only when the
measured costs move.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.distributed as dist

from hintpipe.dispatch.bounds import lower_bound
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.sample import Sample
from hintpipe.observe.step_record import StepRecord
from hintpipe.observe.trace import Record
from hintpipe.renamed import retired_attribute
from hintpipe.runtime import liveness
from hintpipe.runtime.loop.hooks import Hook
from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepReport(StepRecord):
    """What one step did: a :class:`~hintpipe.observe.step_record.StepRecord` (see [Note: one record of a
    step]), the record the simulator predicts a step in. Per-rank tuples are indexed like ``ranks`` (every
    rank on rank 0, this rank alone elsewhere).

    Attributes:
        makespan: from the first covered rank's loop start to the last task's end (one wall clock; ``step_time``
            before 0.7).
        lower_bound: max(busiest rank, one micro-batch's critical path) from the
            measured task times (rank 0 only; NaN elsewhere).
        peak_live: per covered rank, the most micro-batches' activations it held at once (slots).
        budget: per covered rank, the most its scoreboard let it hold, in admission's units (micro-batch
            slots; input elements under ``admission="size"``; bytes under an ``activation_budget``;
            ``admission_budget`` before 0.7).
        records: ``(rank, task, start, end)``: this rank's tasks, or on rank 0
            with timelines kept, every rank's, in start order.
        forecast_costs: the per-stage ``[F, B, W]`` costs ``ready`` forecast this step
            with (None when it had no forecast): :func:`hintpipe.apps.training.predict_step_time`
            uses them, so a prediction uses the forecast the runtime used (``plan_costs`` before 0.7).
    """

    step: int
    rank: int
    records: tuple[Record, ...]
    peak_live_bytes: tuple[int, ...]
    loss: float | None
    ranks: tuple[int, ...] = ()
    forecast_costs: tuple[tuple[float, ...], ...] | None = None
    #: Per covered rank, with data parallelism: how long its earliest-starting gradient reduction had to
    #: overlap the rest of the step (its start to the step's end), and how long the rank waited on its
    #: reductions (at the step's end, or inline where the reduction blocks); NaN without replicas.
    dp_overlap: tuple[float, ...] = ()
    dp_exposed: tuple[float, ...] = ()
    #: Per covered rank on a GPU: the allocator's peak over the step (``torch.cuda.max_memory_allocated``:
    #: parameters, gradients, optimizer state and activations), and what its forwards left allocated over
    #: the bytes the runtime counted for them (1.0: the count is exact); -1 and NaN on a CPU.
    device_peak_bytes: tuple[int, ...] = ()
    allocated_over_counted: tuple[float, ...] = ()
    #: Per covered rank: CPU seconds the runtime itself took over the step, on every thread of the process
    #: but the computing thread's time inside tasks (messages, notices, scheduling; see [Note: the runtime's
    #: own CPU time] in :mod:`hintpipe.runtime.loop.step_loop`).
    runtime_cpu: tuple[float, ...] = ()
    #: Per covered rank: the most its scoreboard counted as held at once, in admission's units (see
    #: ``budget``); and each slot's input elements where the step knew them (admission by size, an order by
    #: size), else empty.
    admitted_peak: tuple[float, ...] = ()
    sizes: tuple[int, ...] = ()

    def timeline(self) -> tuple[Record, ...]:
        """The step's ``records``: every covered rank's tasks on rank 0 with timelines kept, else this rank's."""
        return self.records

    @property
    def step_time(self) -> float:
        """:attr:`makespan`'s name before 0.7."""
        retired_attribute("StepReport.step_time", "StepReport.makespan")
        return self.makespan

    @property
    def admission_budget(self) -> tuple[float, ...]:
        """:attr:`budget`'s name before 0.7."""
        retired_attribute("StepReport.admission_budget", "StepReport.budget")
        return self.budget

    @property
    def plan_costs(self) -> tuple[tuple[float, ...], ...] | None:
        """:attr:`forecast_costs`' name before 0.7."""
        retired_attribute("StepReport.plan_costs", "StepReport.forecast_costs")
        return self.forecast_costs


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """One rank's step, as sent to rank 0."""

    rank: int
    started: float  # wall clock of the loop's start
    loop_time: float
    busy: float
    peak_slots: float
    peak_bytes: int
    durations: tuple[tuple[int, int, int, float], ...]  # (stage, mb, kind, seconds)
    records: tuple[Record, ...]
    dp_overlap: float = math.nan
    dp_exposed: float = math.nan
    device_peak: int = -1
    allocated_over_counted: float = math.nan
    runtime_cpu: float = math.nan
    admitted_peak: float = math.nan
    admission_budget: float = math.nan
    sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, state: StepState, split: bool, rank: int) -> RankSummary:
        """The summary of one rank's step: its records and peaks, and what the step's hooks measured."""
        records = state.records
        measured = state.measured
        return cls(
            rank=rank,
            started=state.started,
            loop_time=state.loop_time,
            busy=sum(end - start for _, _, start, end in records),
            peak_slots=float(measured_peak(records, split)),
            peak_bytes=state.peak_bytes,
            durations=tuple((t.stage, t.mb, int(t.kind), end - start) for _, t, start, end in records),
            records=tuple(records),
            dp_overlap=measured.get("dp_overlap", math.nan),
            dp_exposed=measured.get("dp_exposed", math.nan),
            device_peak=int(measured.get("device_peak", -1)),
            allocated_over_counted=measured.get("allocated_over_counted", math.nan),
            runtime_cpu=measured.get("runtime_cpu", math.nan),
            admitted_peak=measured.get("admitted_peak", math.nan),
            admission_budget=measured.get("admission_budget", math.nan),
            sizes=tuple(state.elements) if state.elements is not None else (),
        )


def measured_peak(records: Sequence[Record], split_backward: bool) -> int:
    """The most micro-batches a rank held at once: from an ``F``'s start to the end of
    the task that releases it (:func:`hintpipe.schedule.rules.releaser`)."""
    release = rules.releaser(split_backward)
    events = sorted(
        [(start, 1) for _, task, start, _ in records if task.kind is Kind.F]
        + [(end, -1) for _, task, _, end in records if task.kind is release]
    )
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def durations_array(hint: Hint, summaries: Sequence[RankSummary]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """``[stage, mb, kind]`` seconds from the summaries' task durations."""
    durations = np.zeros((hint.stages, hint.microbatches, 3))
    for summary in summaries:
        for stage, mb, kind, seconds in summary.durations:
            durations[stage, mb, kind] = seconds
    return durations


def gather_report(
    mine: RankSummary,
    *,
    hint: Hint,
    step: int,
    policy: Policy,
    loss: float | None,
    timelines: bool,
    forecast_costs: tuple[tuple[float, ...], ...] | None,
    group: dist.ProcessGroup | None,
) -> StepReport:
    """Send this rank's summary to rank 0 and build the step's report there (this rank's own
    elsewhere); with ``group`` None, nothing travels and every rank reports itself."""
    sent = mine if timelines else dataclasses.replace(mine, records=())
    rank = mine.rank  # the rank's position in its pipeline
    gathered: list[Any] | None = [None] * dist.get_world_size(group) if rank == 0 and group is not None else None
    if group is not None:
        try:
            dist.gather_object(sent, gathered, group=group, group_dst=0)
        except RuntimeError as exc:
            raise liveness.lost_peer(dist.get_rank(), f"step {step} (its report to rank 0)", exc) from None
    # This rank's own summary keeps its records, whether or not they travelled.
    summaries = [mine] if gathered is None else [mine if s.rank == rank else s for s in gathered]
    bound = math.nan
    if gathered is not None:
        bound = lower_bound(hint, Sample(durations_array(hint, summaries), np.zeros(1), 0.0))
    # Ranks start their loops at slightly different moments: one clock for all, from the earliest.
    origin = min(s.started for s in summaries)
    records = [
        (r, task, start + s.started - origin, end + s.started - origin)
        for s in summaries
        for r, task, start, end in s.records
    ]
    return StepReport(
        step=step,
        rank=rank,
        policy=policy,
        makespan=max(s.started - origin + s.loop_time for s in summaries),
        lower_bound=bound,
        records=tuple(sorted(records, key=lambda r: (r[2], r[0]))),
        peak_live=tuple(s.peak_slots for s in summaries),
        peak_live_bytes=tuple(s.peak_bytes for s in summaries),
        loss=loss,
        busy=tuple(s.busy for s in summaries),
        ranks=tuple(s.rank for s in summaries),
        forecast_costs=forecast_costs,
        dp_overlap=tuple(s.dp_overlap for s in summaries),
        dp_exposed=tuple(s.dp_exposed for s in summaries),
        device_peak_bytes=tuple(s.device_peak for s in summaries),
        allocated_over_counted=tuple(s.allocated_over_counted for s in summaries),
        runtime_cpu=tuple(s.runtime_cpu for s in summaries),
        admitted_peak=tuple(s.admitted_peak for s in summaries),
        budget=tuple(s.admission_budget for s in summaries),
        sizes=mine.sizes,
    )


class Reporting(Hook):
    """The step hook that builds each step's report and keeps the last ``history`` of them.

    Args:
        hint: the schedule.
        rank: this rank's position in its pipeline.
        group: the pipeline's collective group (the gather to its rank 0).
        timelines: whether every task's start and end travel (see [Note: reporting is O(own tasks) per rank]).
        every: gather every rank's summary to rank 0 every this many steps (0: never).
        history: how many reports to keep.
    """

    def __init__(
        self, hint: Hint, rank: int, group: dist.ProcessGroup, *, timelines: bool, every: int, history: int
    ) -> None:
        self.hint = hint
        self.rank = rank
        self.group = group
        self.timelines = timelines
        self.every = every
        self.history = history
        #: The last ``history`` steps' reports (bounded: a run of days must not grow).
        self.reports: list[StepReport] = []

    def end_step(self, state: StepState) -> None:
        summary = RankSummary.of(state, self.hint.split_backward, self.rank)
        gather = self.every > 0 and state.step % self.every == 0
        report = gather_report(
            summary,
            hint=self.hint,
            step=state.step,
            policy=state.policy,
            loss=None if state.loss is None else float(state.loss),
            timelines=self.timelines,
            forecast_costs=state.forecast_costs,
            group=self.group if gather else None,
        )
        self.reports.append(report)
        del self.reports[: max(0, len(self.reports) - self.history)]
