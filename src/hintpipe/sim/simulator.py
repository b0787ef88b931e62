"""Discrete-event simulator: the scoreboard driven by a virtual clock.

Every rank is a :class:`~hintpipe.dispatch.scoreboard.Scoreboard`, exactly as in the
runtime; the simulator only replaces compute by advancing a clock and messages
by delayed deliveries (:mod:`hintpipe.dispatch.engine`; a fixed order needs no
scoreboard at all: one sweep). Costs are sampled once per trial (see
:mod:`hintpipe.dispatch.variability`) so that policies are compared on identical work.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.bounds import lower_bound, memory_bound
from hintpipe.dispatch.budgets import device_budgets, rank_budget, slack_room
from hintpipe.dispatch.by_size import fit_step, size_room, size_weights
from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.engine import drive, fixed_order
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.layout import HintLayout
from hintpipe.dispatch.per_position import float_view
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.sample import Sample
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.observe.step_record import StepRecord
from hintpipe.observe.trace import Record
from hintpipe.renamed import renamed, retired_attribute
from hintpipe.schedule.hint import Hint

__all__ = ["DeadlockError", "Sample", "SimResult", "Simulator", "fixed_order", "lower_bound"]


class DeadlockError(RuntimeError):
    """Tasks remain but nothing is ready and nothing is running."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimResult(StepRecord):
    """What one simulated step did: a :class:`~hintpipe.observe.step_record.StepRecord` (see [Note: one record
    of a step]), the same record the runtime reports a step in.

    ``starts[r][i]`` / ``ends[r][i]`` are the times of rank ``r``'s task at
    hint position ``i`` (``hint.lists[r][i]``). Under admission by size ``hint``
    is the hint as fitted to the budget (see :mod:`hintpipe.dispatch.fit`),
    the order that ran. ``memory_bound`` is the lower bound at the run's
    budgets: the larger of ``lower_bound`` and what the budgets allow (see
    :func:`~hintpipe.dispatch.bounds.memory_bound`).
    """

    hint: Hint
    starts: tuple[tuple[float, ...], ...]
    ends: tuple[tuple[float, ...], ...]
    sim_seconds: float
    memory_bound: float = 0.0

    @property
    def tasks(self) -> int:
        return self.hint.num_tasks

    def timeline(self) -> tuple[Record, ...]:
        """``(rank, task, start, end)`` for every task, in start order."""
        rows = [
            (r, task, self.starts[r][i], self.ends[r][i])
            for r, tasks in enumerate(self.hint.lists)
            for i, task in enumerate(tasks)
        ]
        rows.sort(key=lambda row: (row[2], row[0]))
        return tuple(rows)

    def records(self) -> tuple[Record, ...]:
        """:meth:`timeline`'s name before 0.7 (the runtime's report has ``records``, its tasks as a field)."""
        retired_attribute("SimResult.records()", "SimResult.timeline()")
        return self.timeline()


class Simulator:
    """Runs a hint under a policy on sampled work.

    Args:
        hint: the schedule to rank work by.
        cost_model: expected costs and activation sizes.
    """

    def __init__(self, hint: Hint, cost_model: CostModel) -> None:
        cost_model.check_fits(hint.stages, hint.microbatches)
        self.hint = hint
        self.cost_model = cost_model
        sizes = cost_model.activation_sizes(hint.microbatches)
        graphs = [
            RankGraph(hint, r, None if sizes is None else sizes[tasks.stage, tasks.mb])
            for r, tasks in enumerate(hint.lists)
        ]
        #: The hint's graphs and links; runs under admission by size may run a fitted hint's.
        self.layout = HintLayout(hint, graphs)
        self._expected = cost_model.expected(hint.microbatches, hint.split_backward)
        self._fitted: tuple[tuple[bytes, tuple[float, ...] | None, float], HintLayout, list[float]] | None = None

    @property
    def graphs(self) -> list[RankGraph]:
        """Each rank's dependency graph, memory counted in slots or the cost model's bytes."""
        return self.layout.graphs

    @property
    def links(self) -> list[list[tuple[int, int] | None]]:
        """``links[r][pos]``: (rank, position there) that rank ``r``'s task at ``pos`` feeds, or None."""
        return self.layout.links

    @property
    def sources(self) -> list[list[tuple[int, int] | None]]:
        """``sources[r][pos]``: (rank, position there) of the remote task that feeds ``pos``, or None."""
        return self.layout.sources

    @renamed("Simulator.budgets", slack="slack_microbatches", memory_slack="slack_microbatches")
    def budgets(self, slack_microbatches: float = 0.0) -> list[float]:
        """Per rank: the hint's own peak plus room for ``slack_microbatches`` more micro-batches."""
        return [slack_room(g, slack_microbatches) for g in self.graphs]

    @renamed("Simulator.device_budgets", device_budget="device_budget_fraction")
    def device_budgets(self, device_budget_fraction: float = 0.0) -> list[float]:
        """Every rank: the hint's largest per-rank peak, times ``1 + device_budget_fraction``
        (see :func:`hintpipe.dispatch.budgets.device_budgets`)."""
        return device_budgets([g.peak for g in self.graphs], device_budget_fraction)

    def forecasts(self, latency: float = 0.0) -> list[RankForecast]:
        """Per rank, what ``ready`` expects: a fixed-order run on expected costs."""
        return self.layout.forecasts(self._expected, latency)

    def plans(self, latency: float = 0.0) -> list[RankForecast]:
        """Deprecated: :meth:`forecasts` (its name before 0.7)."""
        retired_attribute("Simulator.plans()", "Simulator.forecasts()")
        return self.forecasts(latency)

    # -- admission by size ------------------------------------------------------------------

    def size_weights(self, sample: Sample) -> list[npt.NDArray[np.float64]]:
        """Per rank and position, what admission by size counts a task as: an ``F`` its
        micro-batch's known size (``sample.sizes``, in the sample's order) times the cost
        model's activation bytes when it has them; every other task 0."""
        mbs = self.hint.microbatches
        return size_weights(self.hint, sample.sizes, self.cost_model.activation_sizes(mbs))

    @renamed(
        "Simulator.size_budgets",
        slack="slack_microbatches",
        memory_slack="slack_microbatches",
        device_budget="device_budget_fraction",
    )
    def size_budgets(
        self, given: Sample, *, slack_microbatches: float = 0.0, device_budget_fraction: float | None = None
    ) -> list[float]:
        """The room under admission by size, measured on ``given``, the step's micro-batches
        in the order they came: each rank's own fixed-order peak by size plus ``slack_microbatches`` of its
        largest micro-batches, or with ``device_budget_fraction`` every rank the busiest rank's peak
        times ``1 + device_budget_fraction``. Run a sorted order of the same micro-batches within it,
        and it holds no more than the given order would."""
        return size_room(
            self.hint,
            self.size_weights(given),
            slack_microbatches=slack_microbatches,
            device_budget_fraction=device_budget_fraction,
        )

    def _fit(self, sample: Sample, budgets: Sequence[float] | None, slack: float) -> tuple[HintLayout, list[float]]:
        """The layout a run under admission by size runs, and its budgets: the hint fitted to them,
        each forward weighted by its size (the last one is kept: a study runs every policy on it)."""
        weights = self.size_weights(sample)
        given = None if budgets is None else tuple(float(b) for b in budgets)
        key = (b"".join(w.tobytes() for w in weights), given, slack)
        if self._fitted is not None and self._fitted[0] == key:
            return self._fitted[1], self._fitted[2]
        room = list(given) if given is not None else size_room(self.hint, weights, slack_microbatches=slack)
        fitted = fit_step(self.hint, weights, room)
        like = self.layout if fitted.hint is self.hint else None
        layout = HintLayout(fitted.hint, list(fitted.graphs), like=like)
        self._fitted = (key, layout, room)
        return layout, room

    # -- a step ------------------------------------------------------------------------------

    @renamed(
        "Simulator.run", slack="slack_microbatches", memory_slack="slack_microbatches", budgets="activation_budget"
    )
    def run(
        self,
        policy: Policy | str,
        sample: Sample | None = None,
        *,
        activation_budget: Sequence[float] | None = None,
        slack_microbatches: float = 0.0,
        notices: bool = True,
        admission: AdmissionUnit | str = AdmissionUnit.SLOTS,
    ) -> SimResult:
        """Simulate one step.

        Args:
            policy: the dispatch policy (or its name).
            sample: the work to run (default: expected costs).
            activation_budget: per-rank activation budget; default: hint peak + ``slack_microbatches``.
            slack_microbatches: extra micro-batches of room when ``activation_budget`` is not given.
            notices: whether ranks learn when their remote producers start and end
                (``ready`` then arbitrates by the ETA rule; without, by patience, as
                a runtime that sends no such notices does).
            admission: ``slots``, or ``size``: each forward weighs its micro-batch's known
                size (:meth:`size_weights`), ``activation_budget`` is in those units (see
                :meth:`size_budgets`), and the hint runs fitted to them
                (:mod:`hintpipe.dispatch.fit`): every policy, ``fixed`` too, holds at most
                its budget on every rank.

        Raises:
            DeadlockError: with a per-rank dump, if the step cannot complete.
            BudgetError: if a budget is below the hint's own peak (slots), or cannot hold
                one of its micro-batches (size).
        """
        began = time.perf_counter()
        budgets, slack = activation_budget, slack_microbatches
        policy = Policy.parse(policy)  # a plain "ready" is not Policy.READY to the checks below
        if sample is None:
            sample = Sample.expected(self.hint, self.cost_model)
        if AdmissionUnit.parse(admission) is AdmissionUnit.SIZE:
            layout, budgets = self._fit(sample, budgets, slack)
        else:
            layout = self.layout
            if budgets is None and slack:
                budgets = self.budgets(slack)
        graphs = layout.graphs
        room = [rank_budget(g, None if budgets is None else budgets[r]) for r, g in enumerate(graphs)]
        hint = layout.hint
        ranks = range(hint.ranks)
        forecasts = layout.forecasts(self._expected, sample.latency) if policy is Policy.READY else None
        sizes = None if policy is not Policy.READY else self._forecast_sizes(sample)
        # Under greedy and ready a tensor-parallel group's leader announces each task (see
        # hintpipe.runtime.loop.coordination); fixed order needs no announcement.
        extra = sample.decision if policy is not Policy.FIXED else 0.0
        cost = [float_view(layout.gather(sample.costs, r) + extra) for r in ranks]
        delay = [float_view(layout.gather(sample.delays, r)) for r in ranks]
        timeline = None
        if policy is Policy.FIXED:  # fixed order needs no scoreboard decisions: one sweep
            timeline = fixed_order(cost, delay, layout.source_rank, layout.source_pos)
        if timeline is not None:
            starts, ends = timeline
            peaks = tuple(g.peak for g in graphs)
        else:  # the event loop (also for a fixed order that deadlocks: its dump)
            starts, ends, peaks = self._event_loop(layout, policy, room, forecasts, sizes, notices, cost, delay)
        makespan = max((max(e) for e in ends if e), default=0.0)
        busy = tuple(sum(c) for c in cost)
        result_starts = tuple(tuple(s) for s in starts)
        result_ends = tuple(tuple(e) for e in ends)
        seconds = time.perf_counter() - began
        bound = lower_bound(hint, sample, busy)
        return SimResult(
            hint=hint,
            policy=policy,
            makespan=makespan,
            lower_bound=bound,
            busy=busy,
            peak_live=peaks,
            budget=tuple(room),
            starts=result_starts,
            ends=result_ends,
            sim_seconds=seconds,
            memory_bound=max(bound, memory_bound(layout, sample, room)),
        )

    @staticmethod
    def _forecast_sizes(sample: Sample) -> npt.NDArray[np.float64] | None:
        """What ``ready``'s forecast scales its expected costs by: each micro-batch's known size, or, where the
        known factors differ between stages (``mm``: encoder and decoder), the factor of each stage."""
        known = sample.known
        if known is not None and len(known) > 1 and not np.all(known == known[:1]):
            return known
        return sample.sizes

    def _event_loop(
        self,
        layout: HintLayout,
        policy: Policy,
        room: list[float],
        forecasts: list[RankForecast] | None,
        sizes: npt.NDArray[np.float64] | None,
        notices: bool,
        cost: Sequence[Sequence[float]],
        delay: Sequence[Sequence[float]],
    ) -> tuple[list[list[float]], list[list[float]], tuple[float, ...]]:
        """Every rank's task starts and ends, and its peak, from one scoreboard per rank driven by the events.

        Raises:
            DeadlockError: with every rank's pending tasks, if the step cannot complete.
        """
        boards = [
            Scoreboard(
                graph,
                policy,
                budget=room[r],
                forecast=None if forecasts is None else forecasts[r],
                notices=notices,
                sizes=sizes,
            )
            for r, graph in enumerate(layout.graphs)
        ]
        notify = notices and policy is Policy.READY
        delayed = any(np.asarray(d).max(initial=0.0) > 0.0 for d in delay)
        starts, ends, now = drive(boards, cost, delay if delayed else None, layout.link_rank, layout.link_pos, notify)
        if any(not sb.done for sb in boards):
            dump = "\n".join(sb.pending_report() for sb in boards)
            fitted = " (as fitted to its budget by size)" if layout.hint is not self.hint else ""
            raise DeadlockError(
                f"deadlock at t={now:g} in hint {layout.hint.name!r}{fitted} under policy {policy.value}: "
                f"nothing is ready and nothing is running\n{dump}"
            )
        return starts, ends, tuple(sb.peak for sb in boards)
