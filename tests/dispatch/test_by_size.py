"""Admission by size, as the simulator and the runtime share it (:mod:`hintpipe.dispatch.by_size`): what each task
weighs, and the hint fitted to the budgets in those weights."""

from __future__ import annotations

import numpy as np
import pytest

from hintpipe.dispatch.by_size import fit_step, size_weights
from hintpipe.dispatch.fit import BudgetError
from hintpipe.schedule.generators import generate_hint

# GPipe on 2 ranks: each runs F0 F1 F2 F3, then B0 B1 B2 B3.
HINT = generate_hint("gpipe", 2, 4)
SIZES = [4.0, 1.0, 1.0, 4.0]


def test_a_forward_weighs_its_micro_batchs_size_times_its_stages_factor_and_the_rest_nothing() -> None:
    assert size_weights(HINT, SIZES)[0].tolist() == [4.0, 1.0, 1.0, 4.0, 0.0, 0.0, 0.0, 0.0]
    assert size_weights(HINT, None, np.array([2.0, 3.0]))[1].tolist() == [3.0] * 4 + [0.0] * 4
    per_mb = np.array([[1.0, 1.0, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0]])  # [stage, mb]
    assert size_weights(HINT, SIZES, per_mb)[0].tolist() == [4.0, 1.0, 1.0, 8.0, 0.0, 0.0, 0.0, 0.0]


def test_a_hint_that_fits_is_kept_and_one_that_does_not_is_reordered_into_the_budget() -> None:
    weights = size_weights(HINT, SIZES)
    roomy = fit_step(HINT, weights, [10, 10])
    assert roomy.hint is HINT and not roomy.moved and roomy.budgets == (10.0, 10.0)
    assert [graph.peak for graph in roomy.graphs] == [10.0, 10.0]  # all four forwards held at once
    tight = fit_step(HINT, weights, [5, 5])
    assert tight.moved and [graph.peak for graph in tight.graphs] == [5.0, 5.0]
    # Backwards move up to free room: F0 F1 B0 F2 B1 F3 B2 B3, its positions those of the given hint.
    assert tight.orders[0].tolist() == [0, 1, 4, 2, 5, 3, 6, 7]
    assert tight.hint.lists[0].mb.tolist() == [0, 1, 0, 2, 1, 3, 2, 3]


def test_a_budget_below_one_forward_is_refused_naming_the_rank_and_the_task() -> None:
    with pytest.raises(BudgetError) as refused:
        fit_step(HINT, size_weights(HINT, SIZES), [3, 5])
    assert str(refused.value) == (
        "the hint cannot run within its budgets: every rank waits; rank 0 cannot hold 0F0 (4) with the 0 it holds "
        "or has set aside within 3; rank 1 waits for the input of 1F0; raise the budget"
    )
