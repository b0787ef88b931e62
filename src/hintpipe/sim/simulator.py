"""Discrete-event simulator: the scoreboard driven by a virtual clock.

Every rank is a :class:`~hintpipe.scoreboard.Scoreboard`, exactly as in the
runtime; the simulator only replaces compute by advancing a clock and messages
by delayed deliveries. Costs are sampled once per trial (see
:mod:`hintpipe.sim.variability`) so that policies are compared on identical work.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order
from hintpipe.schedule.task import Kind, Task
from hintpipe.scoreboard import Policy, RankGraph, RankPlan, Scoreboard, device_budgets
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.variability import (
    CommDelay,
    Variability,
    comm_delay,
    decision_latency,
    sample_message_delays,
    sample_work,
)


class DeadlockError(RuntimeError):
    """Tasks remain but nothing is ready and nothing is running."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One trial's drawn work: ``costs[stage, mb, kind]``, the delay of the
    message a task sends when it finishes, ``delays[stage, mb, kind]``, and each
    micro-batch's size as known before the step (``sizes[mb]``, relative work;
    ``None``: all equal)."""

    costs: npt.NDArray[np.float64]
    delays: npt.NDArray[np.float64]
    latency: float
    decision: float = 0.0  # added to every task under greedy and ready (tensor-parallel coordination)
    sizes: npt.NDArray[np.float64] | None = None

    @classmethod
    def draw(
        cls,
        hint: Hint,
        cost_model: CostModel,
        models: Sequence[Variability] = (),
        rng: np.random.Generator | None = None,
    ) -> Sample:
        """Sample costs and message delays for ``hint`` under ``models``."""
        cost_model.check_fits(hint.num_stages, hint.num_microbatches)
        rng = rng if rng is not None else np.random.default_rng(0)
        expected = cost_model.expected(hint.num_microbatches, hint.split_backward)
        costs, sizes = sample_work(expected, list(models), rng)
        comm = comm_delay(list(models))
        delays = sample_message_delays(comm, costs.size, rng).reshape(costs.shape)
        return cls(costs, delays, comm.latency, decision_latency(list(models)), sizes)

    def reordered(self, perm: Sequence[int]) -> Sample:
        """The same work with slot ``i`` running drawn micro-batch ``perm[i]``."""
        index = np.asarray(perm, dtype=np.int64)
        if sorted(index.tolist()) != list(range(self.costs.shape[1])):
            raise ValueError(f"not a permutation of the {self.costs.shape[1]} micro-batches: {list(perm)}")
        sizes = None if self.sizes is None else self.sizes[index]
        return dataclasses.replace(self, costs=self.costs[:, index], delays=self.delays[:, index], sizes=sizes)

    def ordered(self, order: MicrobatchOrder | str) -> Sample:
        """The same work, micro-batches run in ``order`` of their known sizes
        (see :func:`~hintpipe.schedule.microbatch_order.microbatch_order`)."""
        sizes = self.sizes if self.sizes is not None else np.ones(self.costs.shape[1])
        return self.reordered(microbatch_order(sizes.tolist(), order))

    @classmethod
    def expected(cls, hint: Hint, cost_model: CostModel, comm: CommDelay | None = None) -> Sample:
        """The expected work: no noise, messages take exactly the latency."""
        cost_model.check_fits(hint.num_stages, hint.num_microbatches)
        costs = cost_model.expected(hint.num_microbatches, hint.split_backward)
        latency = comm.latency if comm is not None else 0.0
        return cls(costs, np.full(costs.shape, latency), latency)


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What one simulated step did.

    ``starts[r][i]`` / ``ends[r][i]`` are the times of rank ``r``'s task at
    hint position ``i`` (``hint.ranks[r][i]``).
    """

    hint: Hint
    policy: Policy
    makespan: float
    lower_bound: float
    busy: tuple[float, ...]
    peak_live: tuple[float, ...]
    budget: tuple[float, ...]
    starts: tuple[tuple[float, ...], ...]
    ends: tuple[tuple[float, ...], ...]
    sim_seconds: float

    @property
    def efficiency(self) -> float:
        return self.lower_bound / self.makespan if self.makespan > 0 else 1.0

    @property
    def bubble(self) -> tuple[float, ...]:
        """Per rank, the idle share of the makespan."""
        if self.makespan <= 0:
            return tuple(0.0 for _ in self.busy)
        return tuple(1.0 - b / self.makespan for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        bubble = self.bubble
        return sum(bubble) / len(bubble)

    @property
    def tasks(self) -> int:
        return self.hint.num_tasks

    def records(self) -> list[tuple[int, Task, float, float]]:
        """``(rank, task, start, end)`` for every task, in start order."""
        rows = [
            (r, task, self.starts[r][i], self.ends[r][i])
            for r, tasks in enumerate(self.hint.ranks)
            for i, task in enumerate(tasks)
        ]
        rows.sort(key=lambda row: (row[2], row[0]))
        return rows


def lower_bound(hint: Hint, sample: Sample, busy: Sequence[float] | None = None) -> float:
    """max(busiest rank's work, longest single micro-batch critical path).

    A micro-batch's path runs its forwards through every stage, its backwards
    back to some stage ``s`` and that stage's ``W``; each hop between ranks
    costs at least the latency.
    """
    costs = sample.costs
    busiest = max(busy if busy is not None else _busy(hint, costs))
    stage_rank = hint.placement.stage_rank
    cross = np.array([stage_rank[s] != stage_rank[s + 1] for s in range(hint.num_stages - 1)] + [False], dtype=float)
    hops_after = np.cumsum(cross[::-1])[::-1]  # cross-rank hops from stage s up to the last stage
    forward = costs[:, :, Kind.F].sum(axis=0) + cross.sum() * sample.latency
    backward_suffix = np.cumsum(costs[::-1, :, Kind.B], axis=0)[::-1]
    tail = backward_suffix + costs[:, :, Kind.W] + (hops_after * sample.latency)[:, None]
    path = float((forward + tail.max(axis=0)).max())
    return max(busiest, path)


def _busy(hint: Hint, costs: npt.NDArray[np.float64]) -> list[float]:
    rows = [np.array([(t.stage, t.mb, t.kind) for t in tasks], dtype=np.int64).reshape(-1, 3) for tasks in hint.ranks]
    return [float(costs[r[:, 0], r[:, 1], r[:, 2]].sum()) for r in rows]


class Simulator:
    """Runs a hint under a policy on sampled work.

    Args:
        hint: the schedule to rank work by.
        cost_model: expected costs and activation sizes.
    """

    def __init__(self, hint: Hint, cost_model: CostModel) -> None:
        cost_model.check_fits(hint.num_stages, hint.num_microbatches)
        self.hint = hint
        self.cost_model = cost_model
        self._stage = [np.array([t.stage for t in tasks], dtype=np.int64) for tasks in hint.ranks]
        self._mb = [np.array([t.mb for t in tasks], dtype=np.int64) for tasks in hint.ranks]
        self._kind = [np.array([int(t.kind) for t in tasks], dtype=np.int64) for tasks in hint.ranks]
        sizes = cost_model.activation_sizes(hint.num_microbatches)
        self.graphs = [
            RankGraph(hint, r, None if sizes is None else sizes[self._stage[r], self._mb[r]].tolist())
            for r in range(hint.num_ranks)
        ]
        index = [g.index for g in self.graphs]
        #: ``links[r][pos]``: (rank, position there) that rank ``r``'s task at ``pos`` feeds, or None.
        self.links: list[list[tuple[int, int] | None]] = [
            [None if link is None else (link[0], index[link[0]][link[1]]) for link in g.remote] for g in self.graphs
        ]
        #: ``sources[r][pos]``: (rank, position there) of the remote task that feeds ``pos``, or None.
        self.sources: list[list[tuple[int, int] | None]] = [
            [None if src is None else (src[0], index[src[0]][src[1]]) for src in g.source] for g in self.graphs
        ]
        self._plans: dict[float, list[RankPlan]] = {}

    def budgets(self, slack: float = 0.0) -> list[float]:
        """Per rank: the hint's own peak plus room for ``slack`` more micro-batches."""
        return [g.peak + slack * g.unit for g in self.graphs]

    def device_budgets(self, device_budget: float = 0.0) -> list[float]:
        """Every rank: the hint's largest per-rank peak, times ``1 + device_budget``
        (see :func:`hintpipe.scoreboard.device_budgets`)."""
        return device_budgets([g.peak for g in self.graphs], device_budget)

    def plans(self, latency: float = 0.0) -> list[RankPlan]:
        """Per rank, what ``ready`` expects: a fixed-order run on expected costs."""
        if latency not in self._plans:
            expected = Sample.expected(self.hint, self.cost_model).costs
            ranks = range(self.hint.num_ranks)
            cost = [expected[self._stage[r], self._mb[r], self._kind[r]].tolist() for r in ranks]
            delay = [[latency] * len(c) for c in cost]
            timeline = fixed_order(cost, delay, self.sources)
            assert timeline is not None, "a valid hint runs in its own order"
            starts, ends = timeline
            self._plans[latency] = [
                RankPlan.from_timeline(
                    starts[r],
                    ends[r],
                    cost[r],
                    [0.0 if src is None else cost[src[0]][src[1]] for src in self.sources[r]],
                    latency,
                )
                for r in ranks
            ]
        return self._plans[latency]

    def _scoreboards(
        self,
        policy: Policy,
        budgets: Sequence[float] | None = None,
        plans: Sequence[RankPlan] | None = None,
        notices: bool = True,
        sizes: Sequence[float] | None = None,
    ) -> list[Scoreboard]:
        return [
            Scoreboard(
                graph,
                policy,
                budget=None if budgets is None else budgets[r],
                plan=None if plans is None else plans[r],
                notices=notices,
                sizes=sizes,
            )
            for r, graph in enumerate(self.graphs)
        ]

    def run(
        self,
        policy: Policy,
        sample: Sample | None = None,
        *,
        budgets: Sequence[float] | None = None,
        slack: float = 0.0,
        notices: bool = True,
    ) -> SimResult:
        """Simulate one step.

        Args:
            policy: the dispatch policy.
            sample: the work to run (default: expected costs).
            budgets: per-rank activation budget; default: hint peak + ``slack``.
            slack: extra micro-batches of room when ``budgets`` is not given.
            notices: whether ranks learn when their remote producers start and end
                (``ready`` then arbitrates by the ETA rule; without, by patience, as
                a runtime that sends no such notices does).

        Raises:
            DeadlockError: with a per-rank dump, if the step cannot complete.
            BudgetError: if a budget is below the hint's own peak.
        """
        began = time.perf_counter()
        hint = self.hint
        if sample is None:
            sample = Sample.expected(hint, self.cost_model)
        if budgets is None and slack:
            budgets = self.budgets(slack)
        plans = self.plans(sample.latency) if policy is Policy.READY else None
        sizes = None if sample.sizes is None or policy is not Policy.READY else sample.sizes.tolist()
        boards = self._scoreboards(policy, budgets, plans, notices, sizes)
        ranks = range(hint.num_ranks)
        # Under greedy and ready a tensor-parallel group's leader announces each task (see
        # hintpipe.runtime.parallel.coordination); fixed order needs no announcement.
        extra = sample.decision if policy is not Policy.FIXED else 0.0
        cost = [(sample.costs[self._stage[r], self._mb[r], self._kind[r]] + extra).tolist() for r in ranks]
        delay = [sample.delays[self._stage[r], self._mb[r], self._kind[r]].tolist() for r in ranks]
        timeline = fixed_order(cost, delay, self.sources) if policy is Policy.FIXED else None
        if timeline is not None:  # fixed order needs no scoreboard decisions: one sweep
            starts, ends = timeline
            now = max((max(e) for e in ends if e), default=0.0)
            peaks = tuple(g.peak for g in self.graphs)
        else:  # the event loop (also for a fixed order that deadlocks: its dump)
            starts, ends, now = _drive(boards, cost, delay, self.links, notices and policy is Policy.READY)
            peaks = tuple(sb.peak for sb in boards)
        if timeline is None and any(not sb.done for sb in boards):
            dump = "\n".join(sb.pending_report() for sb in boards)
            raise DeadlockError(
                f"deadlock at t={now:g} in hint {hint.name!r} under policy {policy.value}: "
                f"nothing is ready and nothing is running\n{dump}"
            )
        busy = tuple(sum(c) for c in cost)
        return SimResult(
            hint=hint,
            policy=policy,
            makespan=max((max(e) for e in ends if e), default=0.0),
            lower_bound=lower_bound(hint, sample, busy),
            busy=busy,
            peak_live=peaks,
            budget=tuple(sb.budget for sb in boards),
            starts=tuple(tuple(s) for s in starts),
            ends=tuple(tuple(e) for e in ends),
            sim_seconds=time.perf_counter() - began,
        )


def fixed_order(
    cost: Sequence[Sequence[float]],
    delay: Sequence[Sequence[float]],
    sources: Sequence[Sequence[tuple[int, int] | None]],
) -> tuple[list[list[float]], list[list[float]]] | None:
    """Every rank runs its hint in order: each task starts when the rank is free and its
    remote input has arrived. Returns each task's start and end, or None if the hint
    deadlocks (the event loop then explains why).

    The same times as the event loop under ``fixed``, without its events: a rank's local
    inputs always come earlier in its own order, so only the remote one can make it wait.
    Each rank is a generator that sweeps forward until its next remote input is not yet
    computed; the rank that computes it resumes it. Planning ``ready`` and every fixed run
    of a study use it.
    """
    num_ranks = len(cost)
    starts = [[math.nan] * len(c) for c in cost]
    ends = [[math.nan] * len(c) for c in cost]
    done = [0] * num_ranks  # positions finished on each rank
    waiter: list[dict[int, int]] = [{} for _ in range(num_ranks)]  # waiter[r][pos]: the rank waiting on it
    todo = list(range(num_ranks))

    def sweep(r: int) -> Iterator[None]:
        t = 0.0
        c, src, s_r, e_r, waits = cost[r], sources[r], starts[r], ends[r], waiter[r]
        for i in range(len(c)):
            link = src[i]
            if link is not None:
                q, j = link
                if j >= done[q]:
                    waiter[q][j] = r
                    yield
                e_q = ends[q][j] + delay[q][j]
                if e_q > t:
                    t = e_q
            s_r[i] = t
            t += c[i]
            e_r[i] = t
            done[r] = i + 1
            if waits:
                woken = waits.pop(i, None)
                if woken is not None:
                    todo.append(woken)

    sweeps = [sweep(r) for r in range(num_ranks)]
    while todo:
        next(sweeps[todo.pop()], None)
    if any(d != len(c) for d, c in zip(done, cost, strict=True)):
        return None
    return starts, ends


def _drive(
    boards: Sequence[Scoreboard],
    cost: Sequence[Sequence[float]],
    delay: Sequence[Sequence[float]],
    links: Sequence[Sequence[tuple[int, int] | None]],
    notices: bool,
) -> tuple[list[list[float]], list[list[float]], float]:
    """The event loop: every rank's scoreboard on one virtual clock until no event is left.

    ``cost[r][pos]`` is how long rank ``r``'s task at hint position ``pos`` runs, ``delay[r][pos]``
    how late the message it sends arrives, at ``links[r][pos]`` (rank, position there). With
    ``notices`` each consumer hears when its remote producer starts and ends. Returns each
    task's start and end (NaN if it never ran) and the clock at the end. This is the
    simulator's hot path: one function, locals only.
    """
    num_ranks = len(boards)
    etas = [sb.eta for sb in boards]
    leads = [sb.lead for sb in boards]
    takes = [sb.take for sb in boards]
    finishes = [sb.finish for sb in boards]
    satisfies = [sb.satisfy for sb in boards]
    starts = [[math.nan] * len(c) for c in cost]
    ends = [[math.nan] * len(c) for c in cost]
    running = [False] * num_ranks
    wake_pending = [math.inf] * num_ranks
    # (time, rank, pos): pos >= 0 a task finishes, -1 a patience wake-up,
    # -2 - p a message making position p ready.
    events: list[tuple[float, int, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    now = 0.0
    dirty = set(range(num_ranks))
    while True:
        for r in dirty:
            if running[r]:
                continue
            pos = takes[r](now)
            if pos >= 0:
                running[r] = True
                starts[r][pos] = now
                push(events, (now + cost[r][pos], r, pos))
                if notices:
                    link = links[r][pos]
                    if link is not None:  # Scoreboard.producer_started, inline
                        etas[link[0]][link[1]] = now + leads[link[0]][link[1]]
            elif boards[r].wake_at < wake_pending[r]:
                wake = wake_pending[r] = boards[r].wake_at
                push(events, (wake, r, -1))
        dirty.clear()
        if not events:
            return starts, ends, now
        now = events[0][0]
        while events and events[0][0] <= now:
            _, r, pos = pop(events)
            dirty.add(r)
            if pos >= 0:
                running[r] = False
                ends[r][pos] = now
                finishes[r](pos, now)
                link = links[r][pos]
                if link is not None:
                    wait = delay[r][pos]
                    if wait > 0.0:
                        push(events, (now + wait, link[0], -2 - link[1]))
                        if notices:
                            boards[link[0]].producer_finished(link[1], now)
                            dirty.add(link[0])
                    else:
                        satisfies[link[0]](link[1])
                        dirty.add(link[0])
            elif pos == -1:
                if wake_pending[r] <= now:
                    wake_pending[r] = math.inf
            else:
                satisfies[r](-2 - pos)
