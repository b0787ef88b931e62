"""Fitting a hint into a memory budget: the order admission by size falls back to.

[Note: admission by size]
Admission counts what a rank holds in flight. Counted in *slots* (one per
micro-batch), a step that runs its micro-batches sorted by size holds the
longest ones together, and the busiest rank then holds far more bytes than
fixed 1F1B in the given order (1.62x at 128 ranks). Counted by *size* (each
micro-batch weighted by its known size: sequence length, image count, known
when the batch is loaded) the budget can be the bytes fixed 1F1B needs on the
same batch, whatever the order.

A budget by size can be below what the hint's own order holds (the longest
micro-batches together). The scoreboard's rule that running ahead never
blocks the hint (its [Note: admission never blocks the hint]) needs an order
that fits, so :func:`fit_hint` makes one by running the hint once, untimed:
every rank runs its list in order, each task once its inputs are done, except
that an ``F`` that would take the rank over its budget waits, and meanwhile
the rank runs its earliest task that takes no room (``B``, ``W``, or a later
stage's ``F`` with room set aside, see below) whose inputs are done, until the
``F`` fits. Where every rank waits (one for room, the ranks
that would free it for the input of their next task, as 1F1B's ranks do at the
end of a sorted step, where each must take one more long micro-batch before it
lets the next gradient go), the first rank with such a task ready runs it
ahead of its list, and the run goes on. A rank that hosts several stages of a micro-batch
(interleaved, V-shaped) sets aside room for all of them when it takes the
micro-batch's first forward, so its later forwards never wait for room that
other micro-batches took meanwhile (they would wait on each other for ever).
The order in which each rank ran its tasks is the
fitted hint: a fixed-order run of it cannot deadlock (that run is its witness)
and holds at most the budget on every rank, so every policy that keeps the
scoreboard's rule does too. Ranks that all wait (a budget too small to hold
what the hint needs at once) raise :class:`BudgetError`. Where the hint fits
already, nothing moves.

This module is torch-free.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.choice import Choice
from hintpipe.dispatch.rank_graph import RankGraph, linked_positions
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind
from hintpipe.schedule.task_list import TaskList

IntArray = npt.NDArray[np.int64]


class BudgetError(ValueError):
    """A memory budget below what the hint itself needs."""


class AdmissionUnit(Choice):
    """What admission counts a micro-batch's activations as.

    - ``slots``: one slot per micro-batch (or the cost model's activation bytes),
      whatever its length.
    - ``size``: weighted by its known size, so that any order of the step's
      micro-batches can be held to the memory the given order needs.
    """

    SLOTS = "slots"
    SIZE = "size"

    @classmethod
    def noun(cls) -> str:
        return "admission"


def fit_hint(hint: Hint, graphs: Sequence[RankGraph], budgets: Sequence[float]) -> tuple[Hint, list[IntArray]]:
    """The hint with every rank's list fitted into its budget (see the module docstring).

    Args:
        hint: the hint.
        graphs: one per rank, built on ``hint`` with each forward weighted by its size.
        budgets: what each rank may hold, in the graphs' units.

    Returns:
        The fitted hint (``hint`` itself where every rank fits already) and, per rank,
        ``order``: position ``i`` of the fitted list is the hint's position ``order[i]``.

    Raises:
        BudgetError: if the ranks all wait, each with an ``F`` its budget cannot hold yet and
            nothing it could release first.
    """
    if all(g.peak <= b for g, b in zip(graphs, budgets, strict=True)):
        return hint, [np.arange(len(g.tasks)) for g in graphs]
    ranks = [_RankFit(g, b) for g, b in zip(graphs, budgets, strict=True)]
    links = [
        list(zip(g.remote_rank.tolist(), linked_positions(graphs, g.remote_rank, g.remote_key).tolist(), strict=True))
        for g in graphs
    ]
    todo = list(range(len(ranks)))[::-1]
    while True:
        while todo:
            r = todo.pop()
            for pos in ranks[r].advance():
                q, j = links[r][pos]
                if q >= 0 and ranks[q].satisfy(j):
                    todo.append(q)
        stuck = [fit for fit in ranks if fit.k < fit.n]
        if not stuck:
            break
        # Every rank waits: the first that has a task ready that takes no room runs it ahead (see the Note).
        ahead = next((fit for fit in stuck if fit.go_ahead()), None)
        if ahead is None:
            raise BudgetError(
                "the hint cannot run within its budgets: every rank waits; "
                + "; ".join(fit.waiting() for fit in stuck[:4])
                + ("; ..." if len(stuck) > 4 else "")
                + "; raise the budget"
            )
        r = ahead.graph.rank
        q, j = links[r][ahead.order[-1]]
        todo.append(r)
        if q >= 0 and ranks[q].satisfy(j):
            todo.append(q)
    orders = [np.asarray(fit.order, dtype=np.int64) for fit in ranks]
    lists = tuple(
        TaskList(tasks.stage[order], tasks.kind[order], tasks.mb[order])
        for tasks, order in zip(hint.lists, orders, strict=True)
    )
    return Hint(hint.name, hint.placement, hint.microbatches, lists), orders


class _RankFit:
    """One rank's part of the untimed run that fits a hint: its list, what each task still waits for,
    what the rank holds and has set aside, and the order it has run so far."""

    def __init__(self, graph: RankGraph, budget: float) -> None:
        self.graph = graph
        self.budget = budget
        # Room is summed per micro-batch here and the budget was measured as a running sum over another
        # order: equal amounts may differ in their last bits, which must not make a fitting order wait.
        self.limit = budget + abs(budget) * 1e-12
        self.n = n = len(graph.tasks)
        tasks = graph.tasks
        self.delta: list[float] = graph.delta_array.tolist()
        self.need: list[int] = graph.need_array.tolist()
        self.first, self.second = graph.successor_lists
        # A micro-batch enters the rank at its lowest stage there; its forward sets aside room for
        # every forward of the micro-batch on the rank (``whole``), which its later forwards use.
        forward = tasks.kind == Kind.F
        entering = forward & (tasks.stage == (tasks.stage.min() if n else 0))
        mbs = graph.hint.microbatches
        whole = np.bincount(tasks.mb[forward], weights=graph.delta_array[forward], minlength=mbs)
        self.entering: list[bool] = entering.tolist()
        self.whole: list[float] = np.where(entering, whole[tasks.mb], 0.0).tolist()
        self.done = [False] * n
        self.order: list[int] = []
        self.live = 0.0
        self.committed = 0.0  # held, plus set aside for forwards to come
        self.k = 0  # the first position not yet run
        # The tasks that take no room (B, W, and forwards with room set aside) whose inputs are all done, not
        # yet run: what a forward that waits for room lets go first.
        self.ready = [i for i in range(n) if not self.entering[i] and self.need[i] == 0]

    def satisfy(self, pos: int) -> bool:
        """An input of ``pos`` is done; whether the rank may now go on."""
        left = self.need[pos] - 1
        self.need[pos] = left
        if left == 0 and not self.entering[pos]:
            heapq.heappush(self.ready, pos)
        return left == 0

    def advance(self) -> list[int]:
        """Run as far as inputs and the budget allow; the positions run, in order."""
        ran = []
        while self.k < self.n:
            k = self.k
            if self.need[k] == 0 and self._fits(k):
                pos = k
            elif self.delta[k] > 0 and (self.need[k] == 0 or not self._room(k)):
                pos = self._first_ready()  # a forward waits for room: what takes none goes first
                if pos < 0:
                    break
            else:
                break
            self._run(pos)
            ran.append(pos)
        return ran

    def go_ahead(self) -> bool:
        """Run the earliest task that takes no room and whose inputs are done, ahead of the list; whether there
        was one."""
        pos = self._first_ready()
        if pos >= 0:
            self._run(pos)
        return pos >= 0

    def _room(self, pos: int) -> bool:
        """Whether the rank has room for the micro-batch that enters at ``pos`` (room for others is set aside)."""
        return not self.entering[pos] or self.committed + self.whole[pos] <= self.limit

    def _fits(self, pos: int) -> bool:
        """Whether memory lets the task at ``pos`` run now. What is set aside is summed per micro-batch and what
        is held per task, so the two sums may differ by a rounding error: what is held is checked too, summed as
        the fitted list's graph will sum it."""
        return self._room(pos) and (self.delta[pos] <= 0 or self.live + self.delta[pos] <= self.limit)

    def _first_ready(self) -> int:
        """The earliest ready task that takes no room and fits, or -1."""
        ready, done = self.ready, self.done
        while ready and done[ready[0]]:
            heapq.heappop(ready)
        if not ready or self._fits(ready[0]):
            return ready[0] if ready else -1
        kept = []  # forwards a rounding error keeps out: they stay queued
        while ready and (done[ready[0]] or not self._fits(ready[0])):
            item = heapq.heappop(ready)
            if not done[item]:
                kept.append(item)
        pos = ready[0] if ready else -1
        for item in kept:
            heapq.heappush(ready, item)
        return pos

    def _run(self, pos: int) -> None:
        self.done[pos] = True
        self.order.append(pos)
        d = self.delta[pos]
        self.live += d
        if self.entering[pos]:
            self.committed += self.whole[pos]
        elif d < 0:
            self.committed += d
        for nxt in (self.first[pos], self.second[pos]):
            if nxt >= 0:
                self.satisfy(nxt)
        while self.k < self.n and self.done[self.k]:
            self.k += 1

    def waiting(self) -> str:
        """What the rank waits for, in words."""
        task = self.graph.tasks[self.k]
        if self.delta[self.k] > 0 and not self._room(self.k):
            return (
                f"rank {self.graph.rank} cannot hold {task} ({self.whole[self.k]:g}) with the {self.committed:g} "
                f"it holds or has set aside within {self.budget:g}"
            )
        return f"rank {self.graph.rank} waits for the input of {task}"
