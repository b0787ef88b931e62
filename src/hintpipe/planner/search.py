"""The search: stage cuts that minimise the slowest stage's time under each stage's memory budget.

Imports no torch: it reads :class:`~hintpipe.planner.tables.NodeTables` through
:func:`~hintpipe.planner.memory.stage_cost`.

[Note: how the search finds the best cuts]
Binary search on the bottleneck time ``T``, from above the whole graph's time
down to a relative width of 1e-7 (at most 100 steps; about 30 from a ``T``
every stage meets). Each step asks: is there a partition into ``P`` stages
whose every stage fits its budget and takes at most ``T``? A *range* is the
nodes between two cut positions; a *range evaluation* is one call of the
cost model for one range as one stage. ``N`` is the number of allowed cuts.

*Monotone ranges.* A range's memory and time are sums of non-negative
per-node and per-segment terms (segments: the nodes between neighbouring
allowed cuts) plus one that is not: the *boundary*, the bytes received at the
range's start ``a`` plus the bytes produced in the range, not saved, that
cross its end ``b`` (:meth:`~hintpipe.planner.tables.NodeTables.sent`). With
the boundary held fixed, a sub-range of a range that fits fits too and takes
no longer: it sheds at least the bytes its dropped segments could free, so
it needs no more savings, and its cheapest savings cost no more
(:func:`~hintpipe.planner.memory.range_cost`). A later start only drops
producers, so what a range sends never grows when its start moves later.
For one stage, this gives:

* (ends) from a start ``a``, the ends that fit with the same bytes sent are
  a prefix of those ends, so the longest is found by bisection. If every end
  sends the same bytes, that is all; otherwise the ends that fit when sending
  the most any of them sends are a sure prefix, those past the last that fits
  when sending the least are surely out, and in the band between, each group
  of ends sending the same bytes is bisected on its own;
* (starts) a start ``a' > a`` that receives no more bytes than ``a``
  reaches every end past ``a'`` that ``a`` reaches: it *dominates* ``a`` there.

Boundaries are *uniform*
(:attr:`~hintpipe.planner.tables.NodeTables.uniform_boundaries`) when every
allowed cut receives the same bytes and sends the same bytes and no sent
value crosses two cuts: then both properties hold with no band at all.

*Each step* tries, in order:

1. The longest-first path: each stage takes the longest range that fits from
   where the previous one ended, leaving a cut for each later stage; no
   backtracking. ``O(P log N)`` evaluations with uniform boundaries, plus the
   bands otherwise (windows of fewer than 4 ends are tried end by end). A
   path found answers yes. Not finding one proves nothing: stages differ
   (budgets, micro-batches in flight), and a stage ending early may let a
   later, roomier stage take a node that this one cannot hold.
2. With uniform boundaries, a certificate for no: the same path with empty
   stages allowed and no room kept for later stages, ``O(P log N)``
   evaluations. By induction its ``k``-th start is at or after the ``k``-th
   start of any partition that meets ``T`` (an exchange argument, in the
   spirit of DawnPiper's partitioning theorem, which needs both properties
   above; hence only with uniform boundaries), so when it cannot reach the
   end no partition can. Otherwise on to step 3.
3. The exact answer: every start each stage can be reached at, stage by
   stage, and one path back from the end. A start only serves the ends up to
   the next reachable start that receives no more bytes (past that, the
   later start dominates), so the reachable sets are exact. With uniform
   boundaries each start then serves a single segment but the last of a
   run: one evaluation per reachable start, and evaluations are memoised for
   the whole search (they do not depend on ``T``; only the comparison with
   ``T`` does), so ``O(P N)`` evaluations over the whole search plus a
   bisection per run of starts per step. With uneven boundaries a start's
   ends cost a bisection plus its band: ``O(P N^2)`` at worst in one step.
   Step 3 therefore stops after ``max_evaluations`` evaluations not already
   memoised (100,000 by default; the most the tests see in one step is about
   8,400, on a 2,000-node chain in 8 stages with boundaries of 30 sizes).

Steps 1 and 2 only answer when they are right, and step 3 is exact, so a
step is exact unless step 3 stops at its limit. A step that stops counts as
"no": the bottleneck found may then be above the best one. If the first step
(at a ``T`` every stage meets) stops, the search raises
:class:`SearchLimitError`, not the "no partition fits" of :class:`PlanError`.
The tests check the search against exhaustive search on small graphs and
against independent dynamic programs on 2,000-node chains.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hintpipe.planner.memory import MemoryModel, range_cost, stage_cost
from hintpipe.planner.tables import NodeTables
from hintpipe.units import format_size

IntArray = npt.NDArray[np.int64]

#: Range evaluations step 3 of one feasibility check may spend (see the note).
MAX_EVALUATIONS = 100_000
#: Windows of fewer ends than this are tried end by end rather than bounded first.
_FEW_ENDS = 4


class PlanError(ValueError):
    """No partition satisfies the budgets."""


class SearchLimitError(PlanError):
    """The search stopped at its evaluation limit before it found a partition or showed there is none."""


class _OutOfEvaluations(Exception):
    pass


def search(
    tables: NodeTables, model: MemoryModel, stages: int, *, max_evaluations: int = MAX_EVALUATIONS
) -> tuple[int, ...]:
    """The cuts minimising the bottleneck under the budgets (see the module note).

    Args:
        max_evaluations: range evaluations one feasibility check may spend on
            its exact part (step 3 of the note).

    Raises:
        PlanError: naming the stage that cannot fit and by how many bytes.
        SearchLimitError: the first check stopped at ``max_evaluations``.
    """
    if stages > len(tables.allowed) + 1:
        raise PlanError(f"the graph allows {len(tables.allowed) + 1} stages at most, {stages} were asked for")
    ranges = _Ranges(tables, model, stages, max_evaluations)
    hi = float((tables.compute.sum() + tables.forward.sum()) * model.scale) + 1.0
    try:
        best = ranges.check(hi)
    except _OutOfEvaluations:
        raise SearchLimitError(
            f"the search hit its limit of {max_evaluations:,} range evaluations per feasibility check "
            f"(max_evaluations) before it found a partition into {stages} stages or showed that none fits the "
            f"budgets {[format_size(b) for b in model.budgets]}; raise max_evaluations, or mark split points "
            "to allow fewer cuts"
        ) from None
    if best is None:
        raise PlanError(_why_infeasible(tables, model, stages))
    lo = 0.0
    for _ in range(100):
        if hi - lo <= 1e-7 * max(hi, 1e-30):
            break
        mid = (lo + hi) / 2
        try:
            cuts = ranges.check(mid)
        except _OutOfEvaluations:
            cuts = None  # undecided: keep the partition found so far
        if cuts is None:
            lo = mid
        else:
            hi, best = mid, cuts
    return best


def _last_true(holds: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest ``i`` in ``lo..hi`` where ``holds`` (true on a prefix of ``lo..hi``); ``lo - 1`` if none."""
    if lo > hi or not holds(lo):
        return lo - 1
    if holds(hi):
        return hi
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Ranges:
    """The feasibility check of one search: which ends a stage can take from a start under a time limit.

    Range costs are memoised for the whole search: they do not depend on the limit.
    """

    def __init__(self, tables: NodeTables, model: MemoryModel, stages: int, max_evaluations: int) -> None:
        self.tables, self.model, self.stages = tables, model, stages
        self.allowed = tables.allowed
        self.n = tables.size
        self.uniform = tables.uniform_boundaries
        self.max_evaluations = max_evaluations
        self.counting = False
        self.evaluations = 0
        self._costs: dict[tuple[int, int, int, float | None], tuple[bool, float]] = {}

    def fits(self, stage: int, a: int, b: int, limit: float, boundary: float | None = None) -> bool:
        """Whether nodes ``a:b`` fit as stage ``stage`` within ``limit`` (with ``boundary`` bytes, if given)."""
        key = (stage, a, b, boundary)
        found = self._costs.get(key)
        if found is None:
            if self.counting:
                self.evaluations += 1
                if self.evaluations > self.max_evaluations:
                    raise _OutOfEvaluations
            if boundary is None:
                cost = stage_cost(self.tables, self.model, stage, a, b)
            else:
                cost = range_cost(self.tables, self.model, stage, a, b, boundary)
            found = self._costs[key] = (cost.feasible, cost.time)
        return found[0] and found[1] <= limit

    def fits_to_end(self, stage: int, a: int, limit: float) -> bool:
        prefix = self.tables.compute_prefix
        return (prefix[self.n] - prefix[a]) * self.model.scale <= limit and self.fits(stage, a, self.n, limit)

    def window(self, stage: int, a: int, limit: float, *, room: bool = True) -> tuple[int, int]:
        """Indices ``lo..hi`` into the allowed cuts of the ends worth trying for stage ``stage`` from ``a``.

        After ``a``, within ``limit`` by plain compute time (it only grows with
        the end), and with ``room``, leaving a cut for each later stage.
        """
        allowed, prefix, scale = self.allowed, self.tables.compute_prefix, self.model.scale
        lo = bisect.bisect_right(allowed, a)
        hi = len(allowed) - (self.stages - 1 - stage) if room else len(allowed) - 1
        top = bisect.bisect_right(prefix, prefix[a] + limit / scale if scale else math.inf) - 1
        return lo, min(hi, bisect.bisect_right(allowed, top) - 1)

    def feasible_ends(self, stage: int, a: int, limit: float, lo: int, hi: int) -> list[tuple[int, int]]:
        """The ends in ``allowed[lo..hi]`` that fit from ``a``, as index intervals ``[i, j)`` (see the note)."""
        allowed = self.allowed
        if self.uniform:
            last = _last_true(lambda i: self.fits(stage, a, allowed[i], limit), lo, hi)
            return [(lo, last + 1)] if last >= lo else []
        if hi - lo < _FEW_ENDS:  # cheaper to try them all (their costs are memoised)
            return [(i, i + 1) for i in range(lo, hi + 1) if self.fits(stage, a, allowed[i], limit)]
        sent = self.tables.sent(a, allowed[lo : hi + 1])
        received = float(self.tables.received[a])
        least, most = received + float(sent.min()), received + float(sent.max())
        # Sending the most: a sure prefix. Sending the least: past it, none fits (and up to sure, all do).
        sure = _last_true(lambda i: self.fits(stage, a, allowed[i], limit, most), lo, hi)
        top = _last_true(lambda i: self.fits(stage, a, allowed[i], limit, least), sure + 1, hi)
        out = [(lo, sure + 1)] if sure >= lo else []
        band = sent[sure + 1 - lo : top + 1 - lo]
        for value in np.unique(band) if len(band) else ():
            group: list[int] = (sure + 1 + np.flatnonzero(band == value)).tolist()
            out += [(i, i + 1) for i in group[: self._fitting(stage, a, limit, group)]]
        return out

    def _fitting(self, stage: int, a: int, limit: float, ends: list[int]) -> int:
        """How many of ``allowed[ends]`` fit from ``a``, when they send the same bytes (so those that fit lead)."""
        return 1 + _last_true(lambda j: self.fits(stage, a, self.allowed[ends[j]], limit), 0, len(ends) - 1)

    def longest(self, stage: int, a: int, limit: float, *, room: bool = True) -> int | None:
        """The longest end (a position) that fits for stage ``stage`` from ``a``; None if none does."""
        lo, hi = self.window(stage, a, limit, room=room)
        ends = self.feasible_ends(stage, a, limit, lo, hi)
        return self.allowed[max(j for _, j in ends) - 1] if ends else None

    def check(self, limit: float) -> tuple[int, ...] | None:
        """Cuts whose every stage fits and takes at most ``limit``; None if there are none.

        Raises:
            _OutOfEvaluations: step 3 of the note spent ``max_evaluations``.
        """
        cuts = self.longest_first(limit)
        if cuts is not None:
            return cuts
        if self.uniform and not self.covers_with_empty_stages(limit):
            return None
        self.counting, self.evaluations = True, 0
        try:
            return self.reach(limit)
        finally:
            self.counting = False

    def longest_first(self, limit: float) -> tuple[int, ...] | None:
        """Step 1 of the note: each stage as long as it fits, leaving room for the others; no backtracking."""
        a, cuts = 0, [0]
        for s in range(self.stages - 1):
            end = self.longest(s, a, limit)
            if end is None:
                return None
            cuts.append(end)
            a = end
        return (*cuts, self.n) if self.fits_to_end(self.stages - 1, a, limit) else None

    def covers_with_empty_stages(self, limit: float) -> bool:
        """Step 2 of the note (uniform boundaries): False proves that no partition meets ``limit``."""
        a = 0
        for s in range(self.stages):
            if self.fits_to_end(s, a, limit):
                return True
            end = self.longest(s, a, limit, room=False) if s < self.stages - 1 else None
            a = a if end is None else end
        return False

    def reach(self, limit: float) -> tuple[int, ...] | None:
        """Step 3 of the note: the starts each stage can be reached at; the cuts of one path to the end."""
        allowed = np.asarray(self.allowed, dtype=np.int64)
        starts: list[IntArray] = [np.zeros(1, dtype=np.int64)]
        parents: list[IntArray] = []  # per stage, for each allowed cut it can end at, a start that gets there
        for s in range(self.stages - 1):
            parent = np.full(len(allowed), -1, dtype=np.int64)
            for a, stop in self._served(starts[-1]):
                lo, hi = self.window(s, a, limit)
                hi = min(hi, bisect.bisect_right(self.allowed, stop) - 1)
                for i, j in self.feasible_ends(s, a, limit, lo, hi):
                    unset = parent[i:j]
                    unset[unset < 0] = a
            if not (parent >= 0).any():
                return None
            starts.append(allowed[parent >= 0])
            parents.append(parent)
        # The last stage ends at the end: only starts no later start dominates can serve it.
        served = [a for a, stop in self._served(starts[-1]) if stop == self.n]
        end = next((a for a in served if self.fits_to_end(self.stages - 1, a, limit)), None)
        if end is None:
            return None
        cuts = [self.n, end]
        for parent in reversed(parents):
            cuts.append(int(parent[bisect.bisect_left(self.allowed, cuts[-1])]))
        return tuple(reversed(cuts))

    def _served(self, starts: IntArray) -> list[tuple[int, int]]:
        """Each start with the last end it must serve: the next start receiving no more bytes, else the end."""
        received = self.tables.received
        out: list[tuple[int, int]] = []
        later: list[int] = []  # later starts, nearest last; each receives no more bytes than those after it
        for a in reversed(starts.tolist()):
            while later and received[later[-1]] > received[a]:
                later.pop()
            out.append((a, later[-1] if later else self.n))
            later.append(a)
        return out[::-1]


def _why_infeasible(tables: NodeTables, model: MemoryModel, stages: int) -> str:
    # Walk the memory-only greedy to the first stage that cannot hold even its smallest range.
    a = 0
    n = tables.size
    for s in range(stages):
        end = n if s == stages - 1 else next((c for c in tables.allowed if c > a), n)
        cost = stage_cost(tables, model, s, a, end)
        if not cost.feasible:
            return (
                f"stage {s} cannot fit in its budget of {format_size(model.budgets[s])}: where the cuts before it "
                f"leave it, even with every saving it needs {format_size(model.budgets[s] + cost.shortfall)}, "
                f"{cost.shortfall:,.0f} bytes over; raise its budget, use more stages or a smaller micro-batch"
            )
        best = end
        for c in tables.allowed:
            if c <= a:
                continue
            if stage_cost(tables, model, s, a, c).feasible:
                best = c
            else:
                break
        a = best
    return f"no partition into {stages} stages fits the budgets {[format_size(b) for b in model.budgets]}"
