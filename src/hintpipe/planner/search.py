"""The search: stage cuts that minimise the slowest stage's time under each stage's memory budget.

Imports no torch: it reads :class:`~hintpipe.planner.tables.NodeTables` through
:func:`~hintpipe.planner.memory.stage_cost`.

[Note: why greedy stages are optimal]
Search: binary search on the bottleneck time ``T``; for a given ``T``, build
stages left to right, each as long as it can be while it fits its budget and
takes at most ``T``. *Claim*: if any partition meets ``T``, this one does.
*Argument* (an exchange, in the spirit of DawnPiper's partitioning theorem):
suppose feasibility of a range for stage ``k`` is monotone, i.e. every
sub-range of a feasible range is feasible for the same stage (time, parameter
and activation terms are sums of non-negative per-node terms, and the cheapest
savings of a sub-range never cost more). Let ``o_1 < ... < o_{P-1}`` be the
cuts of a feasible partition and ``g_k`` the greedy ones. By induction
``g_k >= o_k``: stage ``k`` starts at ``g_{k-1} >= o_{k-1}``, so
``[g_{k-1}, o_k)`` is a sub-range of the feasible ``[o_{k-1}, o_k)`` and the
greedy stage extends at least to ``o_k``. The last greedy stage is then a
sub-range of the last feasible one. So the greedy construction decides
feasibility exactly, and the binary search finds the optimal ``T``; each check
costs ``O(P log N)`` range evaluations instead of enumerating ``C(N-1, P-1)``
partitions. The one term that is not monotone is the boundary (the bytes
crossing a cut depend on where it falls, from token ids to several times the
hidden width inside a block). So each stage tries its ends longest first and,
when the next stage then has no feasible start, backtracks to a shorter end,
remembering failed ``(stage, start)`` pairs: exact for the cost model whatever
the boundaries, and as fast as the plain greedy when boundaries are uniform.
Backtracking is bounded (a fixed number of range evaluations per check), so a
very large graph with very uneven boundaries may get a slightly worse
bottleneck rather than a slow search. The tests check it against exhaustive
search.
"""

from __future__ import annotations

import bisect
import math

from hintpipe.planner.memory import MemoryModel, stage_cost
from hintpipe.planner.tables import NodeTables
from hintpipe.units import format_size


class PlanError(ValueError):
    """No partition satisfies the budgets."""


def _greedy(tables: NodeTables, model: MemoryModel, stages: int, limit: float) -> tuple[int, ...] | None:
    """Stages as long as they fit and take at most ``limit`` (see the module note).

    Each stage tries its ends from the longest whose plain compute time fits
    ``limit`` downwards; a stage that leaves the next one no feasible start
    backtracks to its next-longest end. Failed ``(stage, start)`` pairs are
    remembered, so the search visits each at most once. When boundaries are
    all the same size, the first choice never fails and this is the greedy of
    the note; otherwise the backtracking makes it exact for the cost model.
    """
    n = tables.size
    allowed = tables.allowed
    prefix = tables.compute_prefix
    scale = model.scale
    failed: set[tuple[int, int]] = set()
    # Backtracking is exact but can visit every (stage, start, end) when ``limit``
    # is infeasible; past this many range evaluations the candidate counts as
    # infeasible (the longest-first path itself is always tried in full).
    budget = [_BACKTRACK_EVALUATIONS]

    def fits(stage: int, a: int, b: int) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            raise _OutOfBudget
        cost = stage_cost(tables, model, stage, a, b)
        return cost.feasible and cost.time <= limit

    def solve(stage: int, a: int) -> list[int] | None:
        if (stage, a) in failed:
            return None
        if stage == stages - 1:
            if (prefix[n] - prefix[a]) * scale <= limit and fits(stage, a, n):
                return [n]
            failed.add((stage, a))
            return None
        remaining = stages - 1 - stage  # cuts still needed after this stage's end
        lo = bisect.bisect_right(allowed, a)
        hi = len(allowed) - remaining  # index of the last end that leaves room for them
        # The plain compute time only grows with the end: no end past this one can fit.
        top = bisect.bisect_right(prefix, prefix[a] + limit / scale if scale else math.inf) - 1
        hi = min(hi, bisect.bisect_right(allowed, top) - 1)
        for index in range(hi, lo - 1, -1):
            end = allowed[index]
            if fits(stage, a, end):
                rest = solve(stage + 1, end)
                if rest is not None:
                    return [end, *rest]
        failed.add((stage, a))
        return None

    try:
        found = solve(0, 0)
    except _OutOfBudget:
        return None
    return None if found is None else (0, *found)


class _OutOfBudget(Exception):
    pass


#: Range evaluations one feasibility check may spend on backtracking.
_BACKTRACK_EVALUATIONS = 2_000


def search(tables: NodeTables, model: MemoryModel, stages: int) -> tuple[int, ...]:
    """The cuts minimising the bottleneck under the budgets.

    Raises:
        PlanError: naming the stage that cannot fit and by how many bytes.
    """
    if stages > len(tables.allowed) + 1:
        raise PlanError(f"the graph allows {len(tables.allowed) + 1} stages at most, {stages} were asked for")
    hi = float((tables.compute.sum() + tables.forward.sum()) * model.scale) + 1.0
    best = _greedy(tables, model, stages, hi)
    if best is None:
        raise PlanError(_why_infeasible(tables, model, stages))
    lo = 0.0
    for _ in range(100):
        if hi - lo <= 1e-7 * max(hi, 1e-30):
            break
        mid = (lo + hi) / 2
        cuts = _greedy(tables, model, stages, mid)
        if cuts is None:
            lo = mid
        else:
            hi, best = mid, cuts
    return best


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
