"""The memory-blind partitions a plan is compared with (:mod:`hintpipe.planner.baselines`): contiguous cuts that
minimise the largest stage's sum, and equal numbers of layers per stage, both at allowed cuts only."""

from __future__ import annotations

import itertools

import numpy as np

from hintpipe.planner.baselines import balanced_cuts, uniform_cuts
from hintpipe.planner.tables import NodeTables

WEIGHTS = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def _sums(cuts: tuple[int, ...]) -> list[float]:
    return [float(WEIGHTS[a:b].sum()) for a, b in itertools.pairwise(cuts)]


def test_balanced_cuts_minimise_the_largest_stage() -> None:
    # 1 2 3 | 4 5 | 6: 6, 9, 6; every other split into three has a stage of 10 or more.
    assert balanced_cuts(WEIGHTS, [1, 2, 3, 4, 5], 3) == (0, 3, 5, 6)
    assert balanced_cuts(WEIGHTS, [1, 2, 3, 4, 5], 2) == (0, 4, 6)  # 10, 11
    assert _sums(balanced_cuts(WEIGHTS, [1, 2, 3, 4, 5], 6)) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_balanced_cuts_fall_only_where_a_cut_is_allowed() -> None:
    assert balanced_cuts(WEIGHTS, [2, 4], 3) == (0, 2, 4, 6)  # 3, 7, 11: the only cuts there are
    assert balanced_cuts(WEIGHTS, [1, 5], 2) == (0, 5, 6)  # 15, 6 beats 1, 20


def _tables(params: list[float], allowed: tuple[int, ...]) -> NodeTables:
    zeros = np.zeros(len(params))
    names = tuple(f"n{i}" for i in range(len(params)))
    return NodeTables(names, zeros, zeros, zeros, np.array(params), (), allowed)


def test_uniform_cuts_give_each_stage_as_many_layers_snapped_to_an_allowed_cut() -> None:
    # Layers (nodes with parameters) at 1, 3, 5, 7: two stages split them at the third, node 5.
    tables = _tables([0, 1, 0, 1, 0, 1, 0, 1], tuple(range(1, 8)))
    assert uniform_cuts(tables, 2) == (0, 5, 8)
    assert uniform_cuts(_tables([0, 1, 0, 1, 0, 1, 0, 1], (2, 4, 6)), 2) == (0, 4, 8)  # 5 is not allowed: 4 is nearest
    assert uniform_cuts(_tables([0, 1, 0, 1, 0, 1, 0, 1], (2, 6)), 2) == (0, 6, 8)  # equally near: the later one


def test_a_model_with_fewer_layers_than_stages_is_cut_by_its_nodes() -> None:
    assert uniform_cuts(_tables([0, 0, 5, 0, 0, 0], tuple(range(1, 6))), 3) == (0, 2, 4, 6)
