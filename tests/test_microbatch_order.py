"""Micro-batch order: a deterministic permutation by known size, applied to the sampled work."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order
from hintpipe.scoreboard import Policy
from hintpipe.sim.compare import run_study
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import Sample
from hintpipe.sim.variability import parse_variability


def test_each_order_on_known_sizes() -> None:
    sizes = [3.0, 1.0, 4.0, 1.0, 5.0]
    assert microbatch_order(sizes, "given") == [0, 1, 2, 3, 4]
    assert microbatch_order(sizes, "longest-first") == [4, 2, 0, 1, 3]
    assert microbatch_order(sizes, "shortest-first") == [1, 3, 0, 2, 4]  # equal sizes keep their given order
    assert microbatch_order(sizes, MicrobatchOrder.BALANCED) == [4, 3, 2, 1, 0]


@given(st.lists(st.floats(0.0, 1e6), max_size=64), st.sampled_from(list(MicrobatchOrder)))
def test_every_order_is_a_deterministic_permutation(sizes: list[float], order: MicrobatchOrder) -> None:
    perm = microbatch_order(sizes, order)
    assert sorted(perm) == list(range(len(sizes)))
    assert microbatch_order(list(sizes), order) == perm


def test_bad_orders_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown micro-batch order 'largest': choose one of given, longest-first"):
        microbatch_order([1.0], "largest")
    with pytest.raises(ValueError, match="micro-batch sizes must be finite numbers, got nan"):
        microbatch_order([1.0, float("nan")], "balanced")


def test_ordering_permutes_the_drawn_work_by_its_known_sizes() -> None:
    hint = generate_hint("1f1b", 4, 8)
    sample = Sample.draw(hint, CostModel.uniform(4), [parse_variability("mb:0.5")], np.random.default_rng(2))
    assert sample.sizes is not None
    np.testing.assert_allclose(sample.sizes, sample.costs[0, :, 0])  # F = 1: the size is the factor itself
    longest = sample.ordered("longest-first")
    assert longest.sizes is not None
    assert list(longest.sizes) == sorted(sample.sizes, reverse=True)
    np.testing.assert_array_equal(np.sort(longest.costs, axis=1), np.sort(sample.costs, axis=1))  # same work
    with pytest.raises(ValueError, match="not a permutation of the 8 micro-batches"):
        sample.reordered([0, 0, 1, 2, 3, 4, 5, 6])


def test_noise_that_is_not_known_in_advance_leaves_sizes_equal() -> None:
    hint = generate_hint("1f1b", 4, 8)
    sample = Sample.draw(hint, CostModel.uniform(4), [parse_variability("iid:0.5"), parse_variability("straggler:3")])
    assert sample.sizes is not None
    np.testing.assert_array_equal(sample.sizes, np.ones(8))


def test_longest_first_beats_the_given_order_under_microbatch_noise() -> None:
    hint = generate_hint("1f1b", 8, 32)
    given_order = run_study(hint, [Policy.FIXED], variability=[parse_variability("mb:0.5")], trials=8)
    longest = run_study(
        hint, [Policy.FIXED], variability=[parse_variability("mb:0.5")], trials=8, order="longest-first"
    )
    assert given_order[Policy.FIXED].makespan / longest[Policy.FIXED].makespan > 1.1
