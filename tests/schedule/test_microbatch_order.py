"""Micro-batch order: a deterministic permutation by known size, applied to the sampled work."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order
from hintpipe.sim.compare import run_study
from hintpipe.sim.simulator import Sample


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
        hint, [Policy.FIXED], variability=[parse_variability("mb:0.5")], trials=8, microbatch_order="longest-first"
    )
    assert given_order[Policy.FIXED].makespan / longest[Policy.FIXED].makespan > 1.1


def test_front_then_back_orders_by_the_heavier_end() -> None:
    """A micro-batch is heavier at the front when its first-stage work ranks at least as high among the step's
    as its last-stage work does (ranks: the two ends may be counted in different units); those first, the
    lightest front first, then the others, the heaviest back first; equal values keep their given order."""
    front = [2.0, 0.5, 3.0, 1.0, 0.2, 1.0]  # ranks 4 1 5 2 0 3
    back = [1.0, 2.0, 0.5, 1.0, 4.0, 1.5]  # ranks 1 4 0 2 5 3
    # heavier at the front: 0, 2, 3, 5 -> by front rising: 3, 5, 0, 2; at the back: 1, 4 -> by back falling: 4, 1
    assert microbatch_order([1.0] * 6, "front-then-back", ends=(front, back)) == [3, 5, 0, 2, 4, 1]
    # the units of either end do not matter
    scaled = [1000.0 * v for v in back]
    assert microbatch_order([1.0] * 6, "front-then-back", ends=(front, scaled)) == [3, 5, 0, 2, 4, 1]
    # without ends each micro-batch's size stands for both: shortest-first
    sizes = [3.0, 1.0, 4.0, 1.0, 5.0]
    assert microbatch_order(sizes, "front-then-back") == microbatch_order(sizes, "shortest-first")


def test_front_then_back_refuses_ends_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"^ends must give the first and the last stage's work of each of the 3 "):
        microbatch_order([1.0, 2.0, 3.0], "front-then-back", ends=([1.0, 2.0], [1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"^micro-batch sizes must be finite numbers, got nan$"):
        microbatch_order([1.0, 2.0], "front-then-back", ends=([1.0, float("nan")], [1.0, 2.0]))


def test_samples_order_front_then_back_by_their_encoder_and_decoder_factors() -> None:
    """A multimodal sample knows each micro-batch's encoder factor (the first stage's) and decoder factor
    (the last stage's); front-then-back orders by them, and reordering keeps each micro-batch's own."""
    hint = generate_hint("1f1b", 8, 32)
    model = CostModel.uniform(8)
    sample = Sample.draw(hint, model, [parse_variability("mm:1.0:0.5")], np.random.default_rng(3))
    assert sample.known is not None
    encoder, decoder = sample.known[0], sample.known[-1]
    np.testing.assert_array_equal(encoder, sample.costs[0, :, 0] / model.forward[0])
    np.testing.assert_array_equal(decoder, sample.costs[-1, :, 0] / model.forward[-1])
    ordered = sample.ordered("front-then-back")
    assert ordered.known is not None
    front, back = ordered.known[0], ordered.known[-1]
    heavier = np.argsort(np.argsort(front)) >= np.argsort(np.argsort(back))  # by rank (no ties: drawn floats)
    count = int(heavier.sum())
    assert 0 < count < 32 and heavier[:count].all() and not heavier[count:].any()
    assert np.all(np.diff(front[:count]) >= 0) and np.all(np.diff(back[count:]) <= 0)
    # the costs moved with their micro-batches
    np.testing.assert_array_equal(ordered.costs[0, :, 0], front * model.forward[0])
