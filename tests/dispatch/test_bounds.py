"""Lower bounds on a step's makespan (:mod:`hintpipe.dispatch.bounds`): the busiest rank's work or the longest
micro-batch's path, and, at a memory budget, the size-time a rank must hold (Little's law) over its budget."""

from __future__ import annotations

import dataclasses

from hintpipe.dispatch.bounds import lower_bound, memory_bound
from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.layout import HintLayout
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.sample import Sample
from hintpipe.schedule.generators import generate_hint

# GPipe on 2 ranks, 4 micro-batches; F = 1 and B = 2 a stage (no split backward: W is 0).
HINT = generate_hint("gpipe", 2, 4)
EVEN = Sample.expected(HINT, CostModel.uniform(2, forward=1.0, backward=2.0, weight=0.0))


def test_with_even_micro_batches_the_busiest_rank_bounds_the_step() -> None:
    # Each rank: 4 x (1 + 2) = 12; one micro-batch's path, 2 forwards and 2 backwards with a hop each way: 6 + 1.
    assert lower_bound(HINT, dataclasses.replace(EVEN, latency=0.5)) == 12.0
    assert lower_bound(HINT, EVEN, busy=[20.0, 3.0]) == 20.0  # the measured busy times, where given


def test_one_long_micro_batch_bounds_the_step_by_its_path() -> None:
    skewed = CostModel.uniform(2, forward=1.0, backward=2.0, weight=0.0, microbatch_scale=[1, 1, 1, 10])
    sample = dataclasses.replace(Sample.expected(HINT, skewed), latency=0.5)
    # Rank work 13 + 26 = 39; the long one's path: forwards 10 + 10, a hop 0.5, backwards 20 + 20, a hop 0.5.
    assert lower_bound(HINT, sample) == 61.0


def test_a_budget_bounds_the_step_by_what_each_rank_must_hold_over_it() -> None:
    layout = HintLayout(HINT, [RankGraph(HINT, r) for r in range(2)])
    # A forward on stage 0 is held through F1, B1 and B0 (chain 1 + 1 + 2 + 2 = 6), on stage 1 through B1 (3):
    # rank 0 holds 4 x 6 slot-time, rank 1 4 x 3, so one slot each needs 24, four slots 6.
    assert memory_bound(layout, EVEN, [1.0, 1.0]) == 24.0
    assert memory_bound(layout, EVEN, [4.0, 4.0]) == 6.0
    assert memory_bound(layout, dataclasses.replace(EVEN, latency=0.5), [1.0, 1.0]) == 4 * (6 + 2 * 0.5)
    assert memory_bound(layout, EVEN, [0.0, 2.0]) == 6.0  # a rank without a budget bounds nothing
