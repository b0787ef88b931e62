"""One step's drawn work (:mod:`hintpipe.dispatch.sample`): the same for every policy compared, the sizes known
before the step beside it, and reordered as a whole."""

from __future__ import annotations

import numpy as np
import pytest

from hintpipe.dispatch.cost_model import CostModel, CostModelError
from hintpipe.dispatch.sample import Sample
from hintpipe.dispatch.variability import CommDelay, MicrobatchNoise, Variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.task import Kind

HINT = generate_hint("1f1b", 2, 4)
NOISY: list[Variability] = [MicrobatchNoise(0.5), CommDelay(0.1, 0.2)]


def _draw(seed: int) -> Sample:
    return Sample.draw(HINT, CostModel.uniform(2), NOISY, np.random.default_rng(seed))


def test_a_seed_draws_the_same_work_and_the_known_sizes_are_the_micro_batches_factors() -> None:
    one, again, other = _draw(3), _draw(3), _draw(4)
    assert np.array_equal(one.costs, again.costs) and np.array_equal(one.delays, again.delays)
    assert not np.array_equal(one.costs, other.costs)
    assert one.sizes is not None and one.known is not None
    # A micro-batch's noise is known when it is loaded: on uniform costs of 1, its size on every stage and kind.
    assert np.array_equal(one.costs[:, :, Kind.F], np.stack([one.sizes, one.sizes]))
    assert np.array_equal(one.known, np.stack([one.sizes, one.sizes]))
    assert (one.latency, one.decision) == (0.1, 0.0) and one.delays.min() > 0.1  # latency plus jitter


def test_reordering_moves_every_array_of_a_micro_batch_together() -> None:
    sample = _draw(3)
    assert sample.sizes is not None
    moved = sample.reordered([3, 0, 1, 2])
    assert np.array_equal(moved.costs[:, 0], sample.costs[:, 3]) and np.array_equal(
        moved.delays[:, 1], sample.delays[:, 0]
    )
    assert moved.sizes is not None and moved.sizes.tolist() == sample.sizes[[3, 0, 1, 2]].tolist()
    longest = sample.ordered("longest-first")
    assert longest.sizes is not None and longest.sizes.tolist() == sorted(sample.sizes.tolist(), reverse=True)
    with pytest.raises(ValueError, match=r"^not a permutation of the 4 micro-batches: \[0, 0, 1, 2\]$"):
        sample.reordered([0, 0, 1, 2])


def test_the_expected_work_has_no_noise_and_every_message_takes_the_latency() -> None:
    sample = Sample.expected(HINT, CostModel.uniform(2, forward=1.0, backward=2.0, weight=0.5), CommDelay(0.25))
    assert sample.costs[1, 3].tolist() == [1.0, 2.5, 0.0]  # 1F1B does not split the backward: W is in B
    assert sample.delays.tolist() == np.full((2, 4, 3), 0.25).tolist() and sample.sizes is None
    with pytest.raises(CostModelError, match=r"^cost model has 3 stages, the pipeline has 2$"):
        Sample.expected(HINT, CostModel.uniform(3))
