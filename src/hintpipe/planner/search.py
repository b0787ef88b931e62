"""The memory-aware planner: cut a captured graph into pipeline stages.

Goal: minimise the slowest stage's time (forward + backward per micro-batch)
under a memory budget per stage, choosing per node whether to keep its saved
activations, recompute them in backward, or offload them to host memory.

Memory of stage ``s`` (bytes, per device)::

    params x (2 + optimizer_factor)                 weights, gradients, optimizer state
    + inflight(s) x (kept activations + input)      what the in-flight micro-batches hold
    + output                                        the send buffer

``inflight(s)`` is what the hint's fixed-order run holds on that stage at most
(1F1B: ``min(p - s, m)``), read off the scoreboard's own accounting.

Savings per node: recompute frees its saved bytes for its forward time again
in backward; offload frees them for ``2 x bytes / host_bandwidth`` minus the
node's own compute it overlaps with. A stage over budget takes the cheapest
savings per byte until it fits.

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
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hintpipe.planner.capture import CapturedGraph, split_point
from hintpipe.planner.profile import NodeProfile
from hintpipe.units import format_size

Array = npt.NDArray[np.float64]


class PlanError(ValueError):
    """No partition satisfies the budgets."""


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage of a plan (JSON-serialisable)."""

    first_node: str
    last_node: str
    nodes: int
    time_ms: float
    memory_bytes: float
    budget_bytes: float
    inflight: int
    activation_bytes: float
    recompute: tuple[str, ...]
    offload: tuple[str, ...]

    @property
    def spare_bytes(self) -> float:
        return self.budget_bytes - self.memory_bytes


@dataclasses.dataclass(frozen=True)
class Partition:
    """Stage boundaries as node indices: stage ``s`` covers ``cuts[s]:cuts[s+1]``."""

    cuts: tuple[int, ...]
    bottleneck_ms: float
    stages: tuple[StagePlan, ...]
    max_microbatch_size: int


@dataclasses.dataclass(frozen=True)
class CostTables:
    """Per-node costs as arrays, plus what crosses each possible cut.

    ``saved[i]`` is what node ``i`` adds to a micro-batch's activations: its
    own temporaries, plus its output if anything saves that output (the
    producer or a consumer), so a tensor saved twice counts once.
    ``crossing[c]`` lists the values alive across cut ``c`` (between node
    ``c - 1`` and ``c``) as ``(producer index or -1, bytes, saved)``.
    """

    names: tuple[str, ...]
    compute: Array  # forward + backward seconds
    forward: Array
    saved: Array
    params: Array
    crossing: tuple[tuple[tuple[int, float, bool], ...], ...]  # per cut c = 0..N
    allowed: tuple[int, ...]  # cut positions 1..N-1 where a cut may fall
    # Savings are chosen per *segment*, the nodes between two neighbouring
    # allowed cuts: recomputing one (one checkpointed run) frees its nodes'
    # temporaries and every value produced in it whose savers are all in it;
    # its inputs stay saved (checkpoint keeps them), and so does a value that
    # a node outside saves. Conservative: merged runs free at least as much.
    segment_bounds: tuple[int, ...] = ()
    segment_free: Array = dataclasses.field(default_factory=lambda: np.zeros(0))
    segment_forward: Array = dataclasses.field(default_factory=lambda: np.zeros(0))
    segment_compute: Array = dataclasses.field(default_factory=lambda: np.zeros(0))

    @property
    def size(self) -> int:
        return len(self.names)

    @functools.cached_property
    def compute_prefix(self) -> list[float]:
        """``compute_prefix[i]``: the compute time of nodes ``0..i-1``."""
        return [0.0, *np.cumsum(self.compute).tolist()]

    def crossing_bytes(self, cut: int) -> float:
        return sum(size for _, size, _ in self.crossing[cut])

    @classmethod
    def from_profiles(cls, profiles: Sequence[NodeProfile], graph: CapturedGraph | None = None) -> CostTables:
        """Tables for ``profiles`` of ``graph``'s nodes (``graph=None``: a chain, node i feeding i + 1)."""
        n = len(profiles)
        compute = np.array([p.forward_s + p.backward_s for p in profiles])
        forward = np.array([p.forward_s for p in profiles])
        params = np.array([float(p.param_bytes) for p in profiles])
        # values: (producer index, last user index (n: the model output), bytes, is tensor)
        values: list[tuple[int, int, float, bool]] = []
        # savers_of[i]: the nodes that keep node i's output storage for their backward (a view's
        # saver keeps the storage of the node it is a view of: see NodeProfile.alias_of).
        names = {p.name: i for i, p in enumerate(profiles)}

        def owner(i: int) -> int:
            while profiles[i].alias_of in names and names[profiles[i].alias_of] < i:
                i = names[profiles[i].alias_of]
            return i

        savers_of: dict[int, set[int]] = {}
        for i, p in enumerate(profiles):
            if p.saves_output:
                savers_of.setdefault(owner(i), set()).add(i)
        for consumer, p in enumerate(profiles):
            for name in p.saved_inputs:
                if name in names:
                    savers_of.setdefault(owner(names[name]), set()).add(consumer)
        blocked = np.zeros(n + 1, dtype=bool)
        if graph is None:
            for i, p in enumerate(profiles):
                values.append((i, min(i + 1, n), float(p.output_bytes), True))
            allowed = tuple(range(1, n))
        else:
            index = graph.index
            for i, node in enumerate(graph.nodes):
                last = max((index.get(u, n) for u in node.users), default=i)
                values.append((i, last, float(profiles[i].output_bytes), profiles[i].tensor_output))
            for node in graph.inputs:
                last = max((index.get(u, n) for u in node.users), default=0)
                values.append((-1, last, float(_placeholder_bytes(node)), True))
            allowed_list = []
            for producer, last, _, is_tensor in values:
                if not is_tensor:
                    blocked[producer + 1 : last + 1] = True
            allowed_list = [c for c in range(1, n) if not blocked[c]]
            if graph.marked:
                allowed_list = [
                    c
                    for c in allowed_list
                    if graph.nodes[c - 1].op == "call_function" and graph.nodes[c - 1].target is split_point
                ]
            allowed = tuple(allowed_list)
        internal = np.array([float(p.internal_bytes) for p in profiles])
        saved = internal.copy()
        bounds = sorted({0, *allowed, n})
        segment_of = np.searchsorted(bounds, np.arange(n), side="right") - 1
        segment_free = np.add.reduceat(internal, bounds[:-1]) if n else np.zeros(0)
        crossing: list[list[tuple[int, float, bool]]] = [[] for _ in range(n + 1)]
        for producer, last, size, _ in values:
            savers = savers_of.get(producer, set())
            # A view whose storage is saved is held with it (crossing a cut, it is not extra memory).
            is_saved = bool(savers_of.get(owner(producer))) if producer >= 0 else bool(savers)
            if savers:
                kept = max(size, float(profiles[producer].storage_bytes)) if producer >= 0 else size
                saved[producer] += kept
                if len({int(segment_of[i]) for i in savers} | {int(segment_of[producer])}) == 1:
                    segment_free[segment_of[producer]] += kept
            for c in range(producer + 1, last + 1):
                crossing[c].append((producer, size, is_saved))
        return cls(
            tuple(p.name for p in profiles),
            compute,
            forward,
            saved,
            params,
            tuple(tuple(c) for c in crossing),
            allowed,
            tuple(bounds),
            segment_free,
            np.add.reduceat(forward, bounds[:-1]) if n else np.zeros(0),
            np.add.reduceat(compute, bounds[:-1]) if n else np.zeros(0),
        )

    def per_microbatch(self, a: int, b: int) -> tuple[float, float]:
        """(kept activations of nodes a:b, boundary bytes held with them) for one micro-batch.

        The boundary is the received inputs plus the outputs, minus what is
        already counted: outputs the range itself saved, and values passing
        straight through (received and sent on).
        """
        act = float(self.saved[a:b].sum())
        boundary = self.crossing_bytes(a) + self.crossing_bytes(b)
        for producer, size, is_saved in self.crossing[b]:
            if producer < a or (is_saved and producer < b):
                boundary -= size
        return act, boundary


def _placeholder_bytes(node: Any) -> int:
    value = node.meta.get("example_bytes", 0) if hasattr(node, "meta") else 0
    return int(value)


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """How stage memory is counted.

    Attributes:
        inflight: per stage, the micro-batches the hint holds at most.
        budgets: per stage, bytes.
        optimizer_factor: optimizer state per parameter byte (Adam: 2).
        host_bandwidth: bytes/s to host memory, for offload; 0 disables offload.
        scale: micro-batch size / profiled micro-batch size (costs scale linearly).
    """

    inflight: tuple[int, ...]
    budgets: tuple[float, ...]
    optimizer_factor: float = 2.0
    host_bandwidth: float = 10e9
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class StageCost:
    feasible: bool
    time: float
    memory: float
    activation: float
    recompute: tuple[int, ...] = ()
    offload: tuple[int, ...] = ()
    shortfall: float = 0.0


def stage_cost(
    tables: CostTables, model: MemoryModel, stage: int, a: int, b: int, *, savings: bool = True
) -> StageCost:
    """Time and memory of nodes ``a:b`` as stage ``stage``, with the cheapest savings that fit it."""
    scale = model.scale
    k = model.inflight[stage]
    act, boundary = tables.per_microbatch(a, b)
    act *= scale
    boundary *= scale
    base_time = float(tables.compute[a:b].sum()) * scale
    fixed = float(tables.params[a:b].sum()) * (2.0 + model.optimizer_factor)
    memory = fixed + k * (act + boundary)
    budget = model.budgets[stage]
    if memory <= budget:
        return StageCost(True, base_time, memory, act + boundary)
    if not savings:
        return StageCost(False, base_time, memory, act + boundary, shortfall=memory - budget)
    need = memory - budget
    bounds = tables.segment_bounds
    first, last = bisect.bisect_left(bounds, a), bisect.bisect_left(bounds, b)
    saved = tables.segment_free[first:last] * scale * k
    recompute_cost = tables.segment_forward[first:last] * scale
    if model.host_bandwidth > 0:
        transfer = 2.0 * tables.segment_free[first:last] * scale / model.host_bandwidth
        offload_cost = np.maximum(0.0, transfer - tables.segment_compute[first:last] * scale)
    else:  # no host to offload to
        offload_cost = np.full(last - first, np.inf)
    cost = np.minimum(recompute_cost, offload_cost)
    useful = saved > 0
    if saved[useful].sum() < need:
        return StageCost(False, base_time, memory - saved.sum(), act + boundary, shortfall=need - float(saved.sum()))
    order = np.flatnonzero(useful)[np.argsort(cost[useful] / saved[useful], kind="stable")]
    freed = extra = 0.0
    recompute: list[int] = []
    offload: list[int] = []
    for i in order:
        freed += saved[i]
        extra += cost[i]
        nodes = range(bounds[first + int(i)], bounds[first + int(i) + 1])
        (recompute if recompute_cost[i] <= offload_cost[i] else offload).extend(nodes)
        if freed >= need:
            break
    recompute.sort()
    offload.sort()
    kept = act + boundary - freed / k
    return StageCost(True, base_time + extra, memory - freed, kept, tuple(recompute), tuple(offload))


def _greedy(tables: CostTables, model: MemoryModel, stages: int, limit: float) -> tuple[int, ...] | None:
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


def search(tables: CostTables, model: MemoryModel, stages: int) -> tuple[int, ...]:
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


def _why_infeasible(tables: CostTables, model: MemoryModel, stages: int) -> str:
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


def describe(
    tables: CostTables, model: MemoryModel, cuts: Sequence[int], *, savings: bool = True
) -> tuple[StagePlan, ...]:
    out = []
    for s in range(len(cuts) - 1):
        a, b = cuts[s], cuts[s + 1]
        cost = stage_cost(tables, model, s, a, b, savings=savings)
        out.append(
            StagePlan(
                first_node=tables.names[a],
                last_node=tables.names[b - 1],
                nodes=b - a,
                time_ms=cost.time * 1e3,
                memory_bytes=cost.memory,
                budget_bytes=model.budgets[s],
                inflight=model.inflight[s],
                activation_bytes=cost.activation,
                recompute=tuple(tables.names[i] for i in cost.recompute),
                offload=tuple(tables.names[i] for i in cost.offload),
            )
        )
    return tuple(out)


def max_microbatch_size(
    tables: CostTables,
    model: MemoryModel,
    stages: int,
    profiled_size: int,
    fits: Callable[[MemoryModel], bool],
    limit: int = 1 << 16,
) -> int:
    """The largest micro-batch size (a multiple of 1) for which ``fits`` holds; 0 if none."""

    def at(size: int) -> bool:
        return fits(dataclasses.replace(model, scale=size / profiled_size))

    if not at(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and at(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid):
            lo = mid
        else:
            hi = mid
    return lo


def balanced_cuts(weights: Array, allowed: Sequence[int], stages: int) -> tuple[int, ...]:
    """Contiguous cuts minimising the largest per-stage sum of ``weights`` (no memory)."""
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    n = len(weights)

    def greedy(limit: float) -> tuple[int, ...] | None:
        cuts, a = [0], 0
        for s in range(stages - 1):
            remaining = stages - 1 - s
            lo = bisect.bisect_right(allowed, a)
            hi = len(allowed) - remaining
            if lo > hi or lo >= len(allowed):
                return None
            best = None
            for c in allowed[lo : hi + 1]:
                if prefix[c] - prefix[a] <= limit:
                    best = c
                else:
                    break
            if best is None:
                return None
            cuts.append(best)
            a = best
        if prefix[n] - prefix[a] > limit:
            return None
        return (*cuts, n)

    lo_t, hi_t = 0.0, float(prefix[n])
    best = greedy(hi_t)
    assert best is not None
    for _ in range(100):
        if hi_t - lo_t <= 1e-12 * max(hi_t, 1e-30):
            break
        mid = (lo_t + hi_t) / 2
        cuts = greedy(mid)
        if cuts is None:
            lo_t = mid
        else:
            hi_t, best = mid, cuts
    return best


def uniform_cuts(tables: CostTables, stages: int) -> tuple[int, ...]:
    """Equal numbers of parameterised nodes (layers) per stage, snapped to allowed cuts."""
    layered = np.flatnonzero(tables.params > 0)
    if len(layered) < stages:
        layered = np.arange(tables.size)
    cuts = [0]
    for s in range(1, stages):
        target = int(layered[round(s * len(layered) / stages)])
        options = [c for c in tables.allowed if c > cuts[-1]]
        cuts.append(min(options, key=lambda c: (abs(c - target), c)))
    return (*cuts, tables.size)


def summary(partition: Partition) -> dict[str, Any]:
    return {
        "stages": [
            {
                "first_node": s.first_node,
                "last_node": s.last_node,
                "nodes": s.nodes,
                "time_ms": s.time_ms,
                "memory_bytes": s.memory_bytes,
                "budget_bytes": s.budget_bytes,
                "inflight": s.inflight,
                "recompute": len(s.recompute),
                "offload": len(s.offload),
            }
            for s in partition.stages
        ],
        "cuts": list(partition.cuts),
        "bottleneck_ms": partition.bottleneck_ms,
        "max_microbatch_size": partition.max_microbatch_size,
    }
