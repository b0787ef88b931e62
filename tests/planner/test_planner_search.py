"""The search without torch: exact on 2,000-node chains against independent dynamic programs, its
evaluation limit, and the properties of the tables and the cost model that its note relies on.

The references here share nothing with the search but :func:`stage_cost`, and for the uneven
chains even less: their memory (and their time where nothing can be saved) is recomputed from the
chain's own numbers, and checked against :func:`stage_cost` on a sample of ranges. Bytes are whole
numbers, so memory sums are exact in floating point and a budget can sit exactly on a stage's memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import hintpipe
from conftest import allow
from hintpipe.planner.memory import MemoryModel, range_cost, stage_cost
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.search import PlanError, SearchLimitError, search
from hintpipe.planner.tables import NodeTables, ValueUse

Array = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
FACTOR = 2.0  # optimizer state per parameter byte: parameters count 2 + FACTOR times
NO_PARTITION = r"stage \d cannot fit in its budget|no partition into"


def _one_f_one_b(stages: int, budget: float) -> MemoryModel:
    """1F1B's micro-batches in flight, one budget for every stage, recompute and offload both possible."""
    return MemoryModel(inflight=tuple(range(stages, 0, -1)), budgets=(budget,) * stages, optimizer_factor=FACTOR)


def _bottleneck(tables: NodeTables, model: MemoryModel, cuts: tuple[int, ...]) -> float:
    """The slowest stage of ``cuts``, after checking that every stage fits."""
    costs = [stage_cost(tables, model, s, cuts[s], cuts[s + 1]) for s in range(len(cuts) - 1)]
    assert all(c.feasible for c in costs), cuts
    return max(c.time for c in costs)


def _min_max(costs: Iterable[Array]) -> float:
    """``min`` over partitions of ``max`` over stages of ``costs[s][a, b]`` (stage ``s`` on nodes ``a:b``).

    ``costs[s]`` is ``inf`` where stage ``s`` cannot take ``a:b``, including ``a >= b``, ``b`` short
    of the end for the last stage and at the end for the others: a dynamic program over the cut
    positions, O(P N^2).
    """
    best = np.zeros(0)
    for cost in costs:
        if not len(best):
            best = np.where(np.arange(cost.shape[0]) == 0, 0.0, np.inf)
        best = np.maximum(best[:, None], cost).min(axis=0)
    return float(best[-1])


# -- the import rule ------------------------------------------------------------------------------------


def test_the_search_and_its_tables_import_no_torch() -> None:
    src = str(Path(hintpipe.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    modules = "search, tables, memory, baselines, partition, node_profile"
    code = (
        f"import sys; from hintpipe.planner import {modules}; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=allow(120))
    assert result.returncode == 0, result.stderr


# -- uniform chains -------------------------------------------------------------------------------------


def _uniform_chain(n: int, *, internal: int, consumer_saves: bool) -> NodeTables:
    """Every node the same: 1 + 2 ms, 1,000 parameter bytes, 500 output bytes, ``internal`` bytes of its own.

    ``consumer_saves``: each node keeps its input for backward, which no saving can free.
    """
    return NodeTables.chain(
        [
            NodeProfile(
                name=f"n{i}",
                forward_s=1e-3,
                backward_s=2e-3,
                saved_bytes=0,
                param_bytes=1000,
                output_bytes=500,
                tensor_output=True,
                internal_bytes=internal,
                saved_inputs=(f"n{i - 1}",) if consumer_saves and i else (),
            )
            for i in range(n)
        ]
    )


def test_a_uniform_chain_of_2000_nodes_splits_evenly_at_a_budget_of_500_nodes_per_stage() -> None:
    # The budget of each stage is exactly the memory of 500 nodes there, with nothing to free:
    # the even split is the only partition that fits.
    tables = _uniform_chain(2000, internal=0, consumer_saves=True)
    assert tables.uniform_boundaries
    unbounded = _one_f_one_b(4, math.inf)
    budgets = tuple(stage_cost(tables, unbounded, s, 500 * s, 500 * (s + 1)).memory for s in range(4))
    model = dataclasses.replace(unbounded, budgets=budgets)
    assert search(tables, model, 4) == (0, 500, 1000, 1500, 2000)
    assert not stage_cost(tables, model, 0, 0, 501).feasible
    assert not stage_cost(tables, model, 3, 1499, 2000).feasible


def _by_length(tables: NodeTables, model: MemoryModel, stages: int, value: str) -> list[Array]:
    """``out[s][l]``: ``value`` ("time" or "memory") of ``l`` nodes as stage ``s`` (``inf`` if they do not fit).

    In a uniform chain a range's cost depends only on its length and on whether it starts at the
    beginning (no input received) or ends at the end.
    """
    n = tables.size
    out = []
    for s in range(stages):
        row = np.full(n + 1, np.inf)
        for length in range(1, n):
            a = 0 if s == 0 else n - length if s == stages - 1 else 1
            cost = stage_cost(tables, model, s, a, a + length)
            if value == "memory":  # at a budget of 0: the memory with every saving
                row[length] = cost.memory
            elif cost.feasible:
                row[length] = cost.time
        out.append(row)
    return out


def _min_max_over_lengths(rows: list[Array]) -> float:
    """``min`` over lengths ``l_s >= 1`` summing to N of ``max_s rows[s][l_s]`` (a dynamic program over sums)."""
    n = len(rows[0]) - 1
    x, length = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for row in rows:
        before = np.where(x >= length, best[np.maximum(x - length, 0)], np.inf)
        best = np.maximum(before, row[None, :]).min(axis=1)
    return float(best[n])


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_uniform_2000_node_chains_get_the_best_partition_at_the_tightest_budget(stages: int) -> None:
    tables = _uniform_chain(2000, internal=3000, consumer_saves=False)  # recompute or offload can free it
    assert tables.uniform_boundaries
    memory = _by_length(tables, _one_f_one_b(stages, 0.0), stages, "memory")
    tightest = _min_max_over_lengths(memory)
    for budget in (tightest, tightest * 1.25):
        model = _one_f_one_b(stages, budget)
        best = _min_max_over_lengths(_by_length(tables, model, stages, "time"))
        got = _bottleneck(tables, model, search(tables, model, stages))
        assert best <= got <= best * (1 + 2e-7)
    with pytest.raises(PlanError, match=NO_PARTITION):
        search(tables, _one_f_one_b(stages, tightest - 1), stages)


# -- uneven chains ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Chain:
    """A seeded chain of uneven nodes, and its memory and time recomputed from its own numbers."""

    forward: Array
    backward: Array
    params: Array
    output: Array
    internal: Array
    saves_output: Mask
    saves_input: Mask  # node i keeps node i - 1's output for its backward

    @classmethod
    def random(cls, seed: int, n: int, *, freeable: bool) -> _Chain:
        """``freeable=False``: nodes keep only their inputs, which nothing can free (no savings)."""
        rng = np.random.default_rng(seed)
        return cls(
            forward=_floats(rng.integers(1, 6, n) * 1e-4),
            backward=_floats(rng.integers(1, 11, n) * 1e-4),
            params=_floats(rng.integers(0, 4, n) * 1000),
            output=_floats(rng.integers(1, 31, n) * 100),  # boundaries of many sizes
            internal=_floats(rng.integers(0, 5, n) * 1000 if freeable else np.zeros(n)),
            saves_output=rng.random(n) < 0.3 if freeable else np.zeros(n, dtype=bool),
            saves_input=rng.random(n) < 0.5,
        )

    def tables(self) -> NodeTables:
        return NodeTables.chain(
            [
                NodeProfile(
                    name=f"n{i}",
                    forward_s=float(self.forward[i]),
                    backward_s=float(self.backward[i]),
                    saved_bytes=0,
                    param_bytes=int(self.params[i]),
                    output_bytes=int(self.output[i]),
                    tensor_output=True,
                    internal_bytes=int(self.internal[i]),
                    saves_output=bool(self.saves_output[i]),
                    saved_inputs=(f"n{i - 1}",) if i and self.saves_input[i] else (),
                )
                for i in range(len(self.forward))
            ]
        )

    def memory(self, stage: int, stages: int) -> Array:
        """``memory[a, b]``: bytes of nodes ``a:b`` as stage ``stage`` of ``stages`` under 1F1B, every saving taken."""
        fixed, per_microbatch = self._memory_terms
        return _stage_mask(fixed + (stages - stage) * per_microbatch, stage, stages)

    @functools.cached_property
    def _memory_terms(self) -> tuple[Array, Array]:
        kept_by_consumer = np.append(self.saves_input[1:], False)
        saved = self.saves_output | kept_by_consumer
        kept = self.internal + self.output * saved
        free = self.internal + self.output * (self.saves_output & ~kept_by_consumer)
        received = np.concatenate([[0.0], self.output])  # a stage starting at a receives node a - 1's output
        sent = np.concatenate([[0.0], self.output * ~saved])  # and holds its own last output unless saved
        params, activations = _prefix(self.params), _prefix(kept - free)
        fixed = (2 + FACTOR) * (params[None, :] - params[:, None])
        per_microbatch = activations[None, :] - activations[:, None] + received[:, None] + sent[None, :]
        return fixed, per_microbatch

    def time(self) -> Array:
        compute = _prefix(self.forward + self.backward)
        return np.asarray(compute[None, :] - compute[:, None])


def _floats(values: npt.ArrayLike) -> Array:
    return np.asarray(values, dtype=np.float64)


def _prefix(values: Array) -> Array:
    return np.concatenate([[0.0], np.cumsum(values)])


def _stage_mask(cost: Array, stage: int, stages: int) -> Array:
    """``cost`` where stage ``stage`` may take ``a:b`` (``a < b``; only the last stage ends at the end)."""
    n = cost.shape[0] - 1
    a, b = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    valid = (a < b) & ((b == n) if stage == stages - 1 else (b < n))
    return np.where(valid, cost, np.inf)


def _agrees_with_stage_cost(chain: _Chain, tables: NodeTables, stages: int, savings: bool) -> None:
    """The recomputed memory and time are :func:`stage_cost`'s, on a sample of ranges of every stage."""
    rng = np.random.default_rng(0)
    time = chain.time()
    zero = _one_f_one_b(stages, 0.0)
    n = tables.size
    for s in range(stages):
        memory = chain.memory(s, stages)
        for _ in range(50):
            a = 0 if s == 0 else int(rng.integers(1, n - 1))
            b = n if s == stages - 1 else int(rng.integers(a + 1, n))
            cost = stage_cost(tables, zero, s, a, b)
            assert cost.memory == memory[a, b], (s, a, b)
            if not savings:
                assert cost.time == pytest.approx(time[a, b], rel=1e-12)


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_uneven_2000_node_chains_without_savings_get_the_best_partition(stages: int) -> None:
    chain = _Chain.random(stages, 2000, freeable=False)
    tables = chain.tables()
    assert not tables.uniform_boundaries
    _agrees_with_stage_cost(chain, tables, stages, savings=False)
    time = chain.time()
    tightest = _min_max(chain.memory(s, stages) for s in range(stages))
    for budget in (tightest, tightest * 1.02, tightest * 1.5, math.inf):
        model = _one_f_one_b(stages, budget)
        fits = (chain.memory(s, stages) <= budget for s in range(stages))
        best = _min_max(np.where(f, _stage_mask(time, s, stages), np.inf) for s, f in enumerate(fits))
        got = _bottleneck(tables, model, search(tables, model, stages))
        assert best * (1 - 1e-12) <= got <= best * (1 + 2e-7), budget
    with pytest.raises(PlanError, match=NO_PARTITION):
        search(tables, _one_f_one_b(stages, tightest - 1), stages)


def _best_near_the_edge(tables: NodeTables, model: MemoryModel, fits: list[Mask]) -> float:
    """The best bottleneck by a dynamic program with :func:`stage_cost` times, over the ranges that lie on
    some complete partition by ``fits`` alone (cheap where the budget leaves little room)."""
    n, stages = tables.size, len(fits)
    forward = [np.arange(n + 1) == 0]
    for s in range(stages - 1):
        forward.append((forward[-1][:, None] & fits[s]).any(axis=0))
    backward = [fits[stages - 1][:, n]]
    for s in range(stages - 2, -1, -1):
        backward.insert(0, np.asarray((fits[s] & backward[0][None, :]).any(axis=1)))
    best = {0: 0.0}
    for s in range(stages):
        ends = [n] if s == stages - 1 else np.flatnonzero(forward[s + 1] & backward[s + 1]).tolist()
        reached: dict[int, float] = {}
        for b in ends:
            for a, so_far in best.items():
                if a < b and fits[s][a, b]:
                    cost = stage_cost(tables, model, s, a, b)
                    assert cost.feasible, (s, a, b)
                    reached[b] = min(reached.get(b, math.inf), max(so_far, cost.time))
        best = reached
    return best[n]


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_uneven_2000_node_chains_with_savings_get_the_best_partition_near_the_tightest_budget(stages: int) -> None:
    chain = _Chain.random(100 + stages, 2000, freeable=True)
    tables = chain.tables()
    _agrees_with_stage_cost(chain, tables, stages, savings=True)
    tightest = _min_max(chain.memory(s, stages) for s in range(stages))
    for budget in (tightest, tightest * 1.003):
        model = _one_f_one_b(stages, budget)
        best = _best_near_the_edge(tables, model, [chain.memory(s, stages) <= budget for s in range(stages)])
        got = _bottleneck(tables, model, search(tables, model, stages))
        assert best * (1 - 1e-12) <= got <= best * (1 + 2e-7), budget
    with pytest.raises(PlanError, match=NO_PARTITION):
        search(tables, _one_f_one_b(stages, tightest - 1), stages)


# -- the evaluation limit -----------------------------------------------------------------------------------


def test_the_search_limit_raises_its_own_error() -> None:
    # Stage 1 holds one small node only; the longest-first path gives stage 0 nodes 0 and 1, leaving
    # stage 1 the large node 2. Only a short stage 0 works: the exact part of the check finds it.
    params = (1000, 1000, 10_000, 2000)
    tables = NodeTables.chain([NodeProfile(f"n{i}", 1e-3, 1e-3, 0, p, 0, True) for i, p in enumerate(params)])
    model = MemoryModel(inflight=(3, 2, 1), budgets=(math.inf, 4 * 1000, 4 * 12_000))
    assert search(tables, model, 3) == (0, 1, 2, 4)
    with pytest.raises(SearchLimitError, match=r"hit its limit of 0 range evaluations .*raise max_evaluations"):
        search(tables, model, 3, max_evaluations=0)


# -- small graphs against exhaustive search -------------------------------------------------------------------


def _exhaustive_bottleneck(tables: NodeTables, model: MemoryModel, stages: int) -> float:
    """The best bottleneck over every placement of the cuts (a dynamic program with :func:`stage_cost`)."""
    n = tables.size
    best = {0: 0.0}
    for s in range(stages):
        reached: dict[int, float] = {}
        for b in [n] if s == stages - 1 else tables.allowed:
            for a, so_far in best.items():
                cost = stage_cost(tables, model, s, a, b) if a < b else None
                if cost is not None and cost.feasible:
                    reached[b] = min(reached.get(b, math.inf), max(so_far, cost.time))
        best = reached
    return best.get(n, math.inf)


def _random_graph(rng: np.random.Generator, n: int) -> NodeTables:
    """Nodes whose outputs skip ahead (values crossing several cuts), some cuts not allowed."""
    profiles = [
        NodeProfile(
            name=f"n{i}",
            forward_s=float(rng.integers(1, 6)) * 1e-3,
            backward_s=float(rng.integers(1, 11)) * 1e-3,
            saved_bytes=0,
            param_bytes=int(rng.integers(0, 4)) * 1000,
            output_bytes=int(rng.choice([0, 200, 500, 3000, 7000])),
            tensor_output=True,
            internal_bytes=int(rng.integers(0, 5)) * 1000,
            saves_output=bool(rng.random() < 0.3),
            saved_inputs=(f"n{i - 1}",) if i and rng.random() < 0.3 else (),
        )
        for i in range(n)
    ]
    uses = [
        ValueUse(i, min(n, i + 1 + int(rng.integers(0, 4))), float(p.output_bytes), True)
        for i, p in enumerate(profiles)
    ]
    uses.append(ValueUse(-1, int(rng.integers(0, n)), float(rng.choice([8, 4000])), True))
    allowed = sorted({int(c) for c in rng.integers(1, n, size=int(rng.integers(n // 2, 2 * n)))})
    return NodeTables.build(profiles, uses, allowed)


@pytest.mark.parametrize("seed", range(30))
def test_search_equals_exhaustive_search_on_small_graphs_with_skips(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tables = _random_graph(rng, int(rng.integers(4, 16)))
    stages = int(rng.integers(1, min(5, len(tables.allowed) + 2)))
    inflight = tuple(int(k) for k in rng.integers(1, 5, size=stages))
    for scale in (1e9, 20_000.0, 12_000.0, 8_000.0, 5_000.0):
        budgets = tuple(float(scale * rng.uniform(0.6, 1.4)) for _ in range(stages))
        model = MemoryModel(inflight=inflight, budgets=budgets, host_bandwidth=float(rng.choice([0.0, 1e6, 10e9])))
        best = _exhaustive_bottleneck(tables, model, stages)
        if math.isinf(best):
            with pytest.raises(PlanError, match=NO_PARTITION):
                search(tables, model, stages)
            continue
        got = _bottleneck(tables, model, search(tables, model, stages))
        assert got == pytest.approx(best, rel=2e-7), (scale, budgets)


# -- what the search relies on ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_the_boundary_is_what_the_start_receives_plus_what_the_range_sends(seed: int) -> None:
    tables = _random_graph(np.random.default_rng(seed), 20)
    cuts = [0, *tables.allowed, tables.size]
    for a in cuts[:-1]:
        ends = [b for b in cuts if b > a]
        expected = [tables.boundary(a, b) - tables.received[a] for b in ends]
        assert tables.sent(a, ends).tolist() == expected


@pytest.mark.parametrize("seed", range(5))
def test_a_sub_range_with_the_same_boundary_fits_and_takes_no_longer(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tables = _random_graph(rng, 24)
    cuts = [0, *tables.allowed, tables.size]
    model = MemoryModel(inflight=(3,), budgets=(float(rng.integers(10, 40)) * 1000,), host_bandwidth=1e6)
    for _ in range(200):
        i, j, k, m = sorted(rng.choice(len(cuts), size=4, replace=False).tolist())
        boundary = float(rng.integers(0, 8000))
        outer = range_cost(tables, model, 0, cuts[i], cuts[m], boundary)
        inner = range_cost(tables, model, 0, cuts[j], cuts[k], boundary)
        if outer.feasible:
            assert inner.feasible
            assert inner.time <= outer.time + 1e-15


def test_uniform_boundaries_are_recognised() -> None:
    assert _uniform_chain(50, internal=1000, consumer_saves=False).uniform_boundaries
    assert not _Chain.random(0, 50, freeable=False).tables().uniform_boundaries
    # A value crossing two allowed cuts makes what a stage sends depend on where it starts.
    profiles = [NodeProfile(f"n{i}", 1e-3, 1e-3, 0, 0, 100, True) for i in range(4)]
    skip = [ValueUse(0, 1, 100.0, True), ValueUse(1, 3, 100.0, True), ValueUse(2, 3, 100.0, True)]
    assert not NodeTables.build(profiles, [*skip, ValueUse(3, 4, 100.0, True)], [1, 2, 3]).uniform_boundaries


def test_tables_reject_cuts_out_of_order() -> None:
    profiles = [NodeProfile(f"n{i}", 1e-3, 1e-3, 0, 0, 100, True) for i in range(4)]
    uses = [ValueUse(i, i + 1, 100.0, True) for i in range(4)]
    with pytest.raises(ValueError, match=r"allowed cuts must increase within 1\.\.3 for 4 nodes, got \(2, 1\)"):
        NodeTables.build(profiles, uses, [2, 1])
