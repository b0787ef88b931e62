"""The scoreboard: one rank's dispatch state machine.

The scoreboard knows, for one rank, which of its tasks are ready (their inputs
have arrived), which are admitted (memory allows them), and which one to run
next. It is driven by two events, "a message arrived" (:meth:`Scoreboard.deliver`)
and "a task finished" (:meth:`Scoreboard.finish`), and asked one question,
"what now?" (:meth:`Scoreboard.take`, which starts what it chooses). It knows nothing of clocks, tensors
or processes: the event simulator drives it with a virtual clock, the runtime
with messages and compute, so a simulation is a prediction of the runtime.

The hot path works on *positions* (a task's index in the rank's hint) rather
than on :class:`Task` objects, because the simulator runs it hundreds of
thousands of times per second.

This module is torch-free.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.budgets import rank_budget
from hintpipe.dispatch.per_position import float_view
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.projected_live import ProjectedLive
from hintpipe.dispatch.rank_forecast import PATIENCE_TOLERANCE, RankForecast
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.renamed import renamed
from hintpipe.schedule import rules
from hintpipe.schedule.task import Kind, Task

FloatArray = npt.NDArray[np.float64]

__all__ = ["LATENESS_TOLERANCE", "Scoreboard"]


#: The share of the hint's next task's expected cost by which its input must be past its ETA
#: before the ETA rule calls it late and lets an ``F`` overtake it (see :meth:`Scoreboard._eta_choice`).
LATENESS_TOLERANCE = PATIENCE_TOLERANCE


class Scoreboard:
    """Dispatch state of one rank.

    Args:
        graph: the rank's tasks and dependencies.
        policy: how to choose among ready tasks.
        budget: live activation limit. ``None``: the hint's own peak, so the
            rank never holds more than a fixed-order pipeline would.
        forecast: for ``ready``, when each task is expected (see :class:`RankForecast`).
            ``None``: no patience (behaves as ``greedy``).
        notices: whether the driver reports each remote producer's start and
            end (:meth:`producer_started`, :meth:`producer_finished`); then
            ``ready`` arbitrates by the ETA rule, else by patience.
        notices_travel: whether a notice takes time to arrive (the runtime; the simulator's are
            instant): then the ETA rule counts a quarter of the next task's cost either side of an
            ETA as a tie, and a producer not heard of as one that may have started until the next
            task is due (see [Note: ETAs in the runtime]); and each position whose ETA the rule
            weighed without having heard of its producer is appended to :attr:`unheard`, for the driver to
            ask that producer for notices (see [Note: notices asked for] in
            :mod:`hintpipe.runtime.transport.protocol`).
        sizes: each micro-batch's known size relative to the forecast's (sequence
            length over the typical one; ``None``: all 1), or per stage and
            micro-batch (``sizes[stage][mb]``: a vision-language model's encoder
            stages scale with its images, its decoder stages with its text). The
            ETA rule scales expected costs by it: a long micro-batch's weight pass
            is not a short filler.

    Raises:
        BudgetError: if ``budget`` is below the hint's own peak on this rank.

    [Note: admission never blocks the hint]
    A task may run ahead of its hint position only if, afterwards, running the
    rest of the hint in order still stays within the budget. The scoreboard
    keeps ``_projected[i]``: the live memory right after position ``i`` if the
    remaining hint ran in order from here. Running position ``j`` early with
    size change ``d`` adds ``d`` to ``_projected[next:j]``; an ``F`` is
    admitted only if that window stays within the budget. So every rank can
    always fall back to its hint order, a fixed-order run of a valid hint
    completes, and therefore no policy can deadlock, however many stages a
    rank hosts.
    """

    @renamed("Scoreboard", plan="forecast")
    def __init__(
        self,
        graph: RankGraph,
        policy: Policy = Policy.READY,
        *,
        budget: float | None = None,
        forecast: RankForecast | None = None,
        notices: bool = False,
        notices_travel: bool = False,
        sizes: Sequence[float] | Sequence[Sequence[float]] | FloatArray | None = None,
    ) -> None:
        self.graph = graph
        self.hint = graph.hint
        self.rank = rank = graph.rank
        self.policy = policy
        self.tasks = graph.tasks
        n = len(self.tasks)
        # Per-position state at 8 bytes a task or less (see hintpipe.dispatch.per_position): the
        # simulator holds every rank's scoreboard at once.
        self._need: list[int] = graph.need_array.tolist()
        self._first, self._second = graph.successor_lists
        self._delta = float_view(graph.delta_array)
        self._projected = ProjectedLive(graph.projected_array)
        self.hint_peak = graph.peak
        self.budget = rank_budget(graph, budget)
        if forecast is not None and len(forecast.due) != n:
            raise ValueError(f"the forecast has {len(forecast.due)} tasks, rank {rank} has {n}")
        self._forecast = forecast if policy is Policy.READY else None
        self.notices = notices
        self._eta_rule = notices and self._forecast is not None
        self._notices_travel = notices_travel
        #: Per position, how long after its remote producer starts its input is expected
        #: (zeros when the ETA rule is off: nothing reads ``eta`` then).
        self.lead: Sequence[float] = (0.0,) * n
        self._expected: Sequence[float] = ()
        if self._eta_rule:
            assert forecast is not None
            producer = np.asarray(forecast.producer_cost if forecast.producer_cost else np.zeros(n), dtype=float)
            if sizes is None:
                self._expected = forecast.expected
                self.lead = float_view(producer + forecast.latency)
            else:
                scale, producer_scale = self._scales(sizes)
                self._expected = float_view(np.asarray(forecast.expected, dtype=float) * scale)
                self.lead = float_view(producer * producer_scale + forecast.latency)
        #: Per position, when its remote input is expected (inf: its producer has not started).
        self.eta = float_view(np.full(n, math.inf))
        #: Where notices travel: positions whose ETA the rule weighed with no word of their producer, in the
        #: order weighed (repeats kept: the driver drains the list and asks each producer once).
        self.unheard: list[int] = []
        self._taken = [False] * n
        self._delivered: set[int] = set()  # positions whose remote input arrived (:meth:`certain`)
        self.finished = bytearray(n)
        self._end_time = [0.0] * n
        self._heap_f: list[int] = []
        self._heap_bw: list[int] = []
        self._is_f = (graph.tasks.kind == Kind.F).tobytes()
        self.next = 0
        self.live = 0.0
        self.peak = 0.0
        self.wake_at = math.inf
        self.remaining = n
        self._n = n
        # Tasks that are ready when they are the hint's next one run by the fast
        # path and need no queue; every other ready task waits in a heap.
        self._queue_ready = policy is not Policy.FIXED
        if self._queue_ready:  # ascending lists are heaps already
            ready = graph.need_array == 0
            ready[:1] = False
            forward = graph.tasks.kind == Kind.F
            self._heap_f = np.flatnonzero(ready & forward).tolist()
            self._heap_bw = np.flatnonzero(ready & ~forward).tolist()

    def _scales(self, sizes: Sequence[float] | Sequence[Sequence[float]] | FloatArray) -> tuple[FloatArray, FloatArray]:
        """Per position, the known size of its own task and of its remote producer (an ``F``'s on the
        stage before, a ``B``'s on the stage after; its own where sizes are per micro-batch)."""
        values = np.asarray(sizes, dtype=float)
        mbs, stages = self.hint.microbatches, self.hint.stages
        tasks = self.graph.tasks
        if values.ndim == 1:
            if len(values) != mbs:
                raise ValueError(f"{len(values)} sizes for {mbs} micro-batches")
            scale = values[self.graph.mbs]
            return scale, scale
        if values.shape != (stages, mbs):
            raise ValueError(f"sizes of shape {values.shape} for {stages} stages x {mbs} micro-batches")
        step = np.where(tasks.kind == Kind.F, -1, np.where(tasks.kind == Kind.B, 1, 0))
        producer_stage = np.clip(tasks.stage + step, 0, stages - 1)
        return values[tasks.stage, self.graph.mbs], values[producer_stage, self.graph.mbs]

    @property
    def index(self) -> dict[Task, int]:
        """Each task's position in the rank's hint."""
        return self.graph.index

    @property
    def remote(self) -> Sequence[tuple[int, Task] | None]:
        """``remote[pos]``: the ``(rank, task)`` on another rank that the task at ``pos`` feeds, or None."""
        return self.graph.remote

    # -- events -------------------------------------------------------------

    def deliver(self, task: Task) -> None:
        """A message for ``task`` arrived (activation for F, gradient for B)."""
        pos = self.index[task]
        self._delivered.add(pos)
        self.satisfy(pos)

    def satisfy(self, pos: int) -> None:
        """One dependency of the task at ``pos`` is met."""
        need = self._need
        left = need[pos] - 1
        need[pos] = left
        if left == 0 and self._queue_ready and pos != self.next:
            heapq.heappush(self._heap_f if self._is_f[pos] else self._heap_bw, pos)

    def producer_started(self, pos: int, at: float) -> None:
        """The remote task feeding position ``pos`` started at ``at`` (this rank's clock):
        its result is expected at ``at`` + its expected cost + the latency."""
        if self._eta_rule:
            self.eta[pos] = at + self.lead[pos]

    def producer_finished(self, pos: int, at: float) -> None:
        """The remote task feeding position ``pos`` ended at ``at``: its result is expected
        at ``at`` + the latency. The driver asks :meth:`take` again afterwards: a producer
        that ran long moves the ETA later, which may let other work fit before it."""
        if self._eta_rule:
            assert self._forecast is not None
            self.eta[pos] = at + self._forecast.latency

    def take(self, now: float) -> int:
        """The position of the task to run now, already started (:meth:`start`); -1 to wait.

        When it returns -1 because of patience or the ETA rule, :attr:`wake_at` is the time to
        ask again if no message arrives first; otherwise it is ``inf``.
        """
        k = self.next
        if k < self._n and self._need[k] == 0:
            # The hint's next task is ready: the common case, kept inline.
            taken = self._taken
            taken[k] = True
            n = self._n
            nxt = k + 1
            while nxt < n and taken[nxt]:
                nxt += 1
            self.next = nxt
            d = self._delta[k]
            if d > 0:
                live = self.live + d
                self.live = live
                if live > self.peak:
                    self.peak = live
            return k
        # The hint's next task waits for its input: may another ready task go first?
        self.wake_at = math.inf
        if k >= self._n or not self._queue_ready:  # done, or fixed order waits
            return -1
        best = self._best_ready()
        forecast = self._forecast
        if best >= 0 and forecast is not None:
            best = (
                self._eta_choice(now, k, best, forecast) if self._eta_rule else self._patience(now, k, best, forecast)
            )
        if best >= 0:
            self.start(best)
        return best

    def certain(self, limit: int) -> list[int]:
        """Up to ``limit`` positions that :meth:`take` will return next, in order, whatever arrives
        meanwhile (remote inputs counted by :meth:`deliver`).

        [Note: decisions that nothing can change]
        :meth:`take` always returns the hint's next task when it is ready, before any arbitration.
        The hint's next untaken task, once its remote input has arrived, is therefore the next
        choice: its local inputs come earlier in the hint (a valid hint runs in order), so they are
        finished by the time the task that is running now ends. The same holds for the untaken task
        after it, and so on, up to the first whose remote input is still awaited. A tensor-parallel
        leader announces these in one message, ahead of time (see
        :mod:`hintpipe.runtime.loop.coordination`).
        """
        taken, fed_remotely, delivered = self._taken, self.graph.fed_remotely, self._delivered
        out: list[int] = []
        pos, n = self.next, self._n
        while pos < n and len(out) < limit:
            if not taken[pos]:
                if fed_remotely[pos] and pos not in delivered:
                    break
                out.append(pos)
            pos += 1
        return out

    def is_ready(self, pos: int) -> bool:
        """Whether the task at ``pos`` has all its inputs and has not been started (a follower's check)."""
        return not self._taken[pos] and self._need[pos] == 0

    def start(self, pos: int) -> None:
        """The driver starts the task at ``pos`` (a follower of a tensor-parallel group starts what its leader
        chose; :meth:`take` starts what it chooses itself)."""
        taken = self._taken
        taken[pos] = True
        d = self._delta[pos]
        if pos == self.next:
            n = len(taken)
            nxt = pos + 1
            while nxt < n and taken[nxt]:
                nxt += 1
            self.next = nxt
        elif d:
            self._projected.ran_early(self.next, pos, d)
        if d > 0:
            live = self.live + d
            self.live = live
            if live > self.peak:
                self.peak = live

    def finish(self, pos: int, now: float) -> tuple[int, Task] | None:
        """The task at ``pos`` finished at ``now``.

        Satisfies its successors on this rank and returns the ``(rank, task)``
        on another rank that this result unblocks (the driver sends it there),
        or ``None``.
        """
        self.complete(pos, now)
        return self.graph.remote[pos]

    def complete(self, pos: int, now: float) -> None:
        """:meth:`finish` without its answer, for a driver that knows where each result goes by
        position (the simulator's links): it never builds the ``(rank, task)`` pairs."""
        self.finished[pos] = 1
        self._end_time[pos] = now
        self.remaining -= 1
        d = self._delta[pos]
        if d < 0:
            self.live += d
        need = self._need
        nxt = self._first[pos]
        if nxt >= 0:  # the (up to two) local successors, unrolled: the simulator's hot path
            left = need[nxt] - 1
            need[nxt] = left
            if left == 0 and self._queue_ready and nxt != self.next:
                heapq.heappush(self._heap_f if self._is_f[nxt] else self._heap_bw, nxt)
            nxt = self._second[pos]
            if nxt >= 0:
                left = need[nxt] - 1
                need[nxt] = left
                if left == 0 and self._queue_ready and nxt != self.next:
                    heapq.heappush(self._heap_f if self._is_f[nxt] else self._heap_bw, nxt)

    # -- decision -----------------------------------------------------------

    def _due(self, k: int, forecast: RankForecast) -> float:
        """When the hint's next task ``k`` is overdue: its allowance after its predecessor ended, never
        before its planned start plus the tolerance."""
        allowed = (self._end_time[k - 1] if k else 0.0) + forecast.allowance[k]
        due = forecast.due[k]
        return due if due > allowed else allowed  # max(allowed, due), without the call

    def _patience(self, now: float, k: int, best: int, forecast: RankForecast) -> int:
        """Without notices: ``best`` if ``k`` is overdue or ``best`` fits before ``k`` is due; else wait."""
        due = self._due(k, forecast)
        if now >= due or now + forecast.expected[best] <= due:
            return best
        self.wake_at = due
        return -1

    def _eta_choice(self, now: float, k: int, best: int, forecast: RankForecast) -> int:
        """Steps (4)-(6) of the ETA rule: ``best`` if it ends before ``k``'s input is
        expected; an ``F`` also once that input is late or ``k`` is overdue; else wait."""
        eta = self.eta[k]
        allowed = (self._end_time[k - 1] if k else 0.0) + forecast.allowance[k]
        due = forecast.due[k]
        due = due if due > allowed else allowed  # self._due(k, forecast), inline: the simulator's hot path
        expected = self._expected
        tie = LATENESS_TOLERANCE * expected[k]
        unheard = False
        if self._notices_travel:  # [Note: ETAs in the runtime]
            if eta == math.inf:
                self.unheard.append(k)
            unheard = eta == math.inf and now < due
            if unheard:
                eta = due
            if now + expected[best] + tie <= eta:
                return best
        elif now + expected[best] <= eta:
            return best
        if not self._is_f[best]:
            # A B or W never overtakes a late input: the ranks downstream wait on it. A producer not
            # heard of by its due time is taken as not started, and then anything fits.
            self.wake_at = due if unheard else math.inf
            return -1
        late = eta + tie  # on time by less is a tie in the forecast
        if now >= late or now >= due:
            return best
        self.wake_at = due if due < late else late  # min(late, due), without the call
        return -1

    # [Note: ETAs in the runtime]
    # In the simulator an ETA is exact where costs are known: notices are instant, and a producer not
    # heard of has not started. In the runtime neither holds. A notice travels, so a producer the forecast
    # starts at about the moment this rank decides (a tie in the forecast: zbv's V, the last stage's first
    # backward) may have started with its notice still on the way; and ETAs carry the noise of measured
    # costs, sleeps and message times, a millisecond or more. Read exactly, that noise reorders a step
    # that had nothing to gain: a task "fits" by a fraction of a millisecond, or an input is "late" by
    # one, and the order then differs from run to run. So where notices travel, a quarter of the next
    # task's cost either side of its ETA is a tie, and ties go to the hint (lateness has that margin
    # everywhere); and a producer not heard of is expected no later than the hint's next task is due by
    # the forecast (its planned gap and a quarter of its cost). Once that has passed with no notice the
    # producer is late, and the rule reads it as not started, as the simulator does; the wait this adds
    # is bounded by that allowance. Measured with benchmarks/readiness-at-scale/kept_order.py (the
    # README's "Kept order"); the rule itself is tested in tests/dispatch/test_scoreboard.py, and the runtime's
    # exact orders without variability in tests/runtime/test_kept_order.py, at tasks long enough that a loaded
    # machine's overshoot stays inside the margin.

    def _best_ready(self) -> int:
        taken = self._taken
        heap_bw = self._heap_bw
        heap_f = self._heap_f
        while heap_bw and taken[heap_bw[0]]:
            heapq.heappop(heap_bw)
        while heap_f and taken[heap_f[0]]:
            heapq.heappop(heap_f)
        if heap_f and (not heap_bw or heap_f[0] < heap_bw[0]) and self._admits(heap_f[0]):
            return heap_f[0]
        if heap_bw:
            return heap_bw[0]
        return -1

    def _admits(self, pos: int) -> bool:
        d = self._delta[pos]
        budget = self.budget - d
        if self.live > budget:
            return False
        k = self.next
        return pos == k or self._projected.peak(k, pos) <= budget

    # -- introspection --------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def waiting_for(self, pos: int) -> list[str]:
        """What the task at ``pos`` still waits for, in words."""
        task = self.tasks[pos]
        stage_rank = self.hint.placement.stage_rank
        deps = rules.dependencies(task, self.hint.stages)
        local_missing = [d for d in deps if d in self.index and not self.finished[self.index[d]]]
        # The remote input (at most one) is the dependency left once every local one is met.
        remote_missing = self._need[pos] - len(local_missing)
        unmet = local_missing + [d for d in deps if d not in self.index][:remote_missing]
        return [rules.waiting_words(task, d, stage_rank) for d in deps if d in unmet]

    def pending_report(self) -> str:
        """One line for a deadlock or watchdog dump."""
        k = self.next
        task = self.tasks[k] if k < len(self.tasks) else None
        running = sum(self._taken) - sum(self.finished)
        return rules.pending_report(
            self.rank, self.remaining, running, task, k, self.waiting_for(k) if task is not None else []
        )
