"""Micro-batches formed by predicted cost: the cost model's fit, the formation, its tensors.

Exact values where the arithmetic gives them (the fit on exact data, the
formation of a small batch worked out by hand); properties over drawn
batches: every sequence in exactly one micro-batch, none empty, the same
formation for the same seed, and (rows of one sequence) the smallest largest
cost any cut into consecutive runs of the sorted lengths achieves.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hintpipe.forming import profiled
from hintpipe.forming.collate import IGNORE_INDEX, collate, form_batch
from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.form import form_microbatches
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.schedule.microbatch_order import MicrobatchOrder

# -- the cost model ------------------------------------------------------------------------------------------


def test_fit_recovers_the_coefficients_of_exact_times() -> None:
    cost = SequenceCost.fit([16, 32, 64], [2e-4 * t + 3e-7 * t * t for t in (16, 32, 64)])
    assert cost.a == pytest.approx(2e-4, rel=1e-9)
    assert cost.b == pytest.approx(3e-7, rel=1e-9)
    assert cost(100) == pytest.approx(2e-2 + 3e-3, rel=1e-9)
    assert cost.rows(3, 10) == pytest.approx(3 * (2e-3 + 3e-5), rel=1e-9)


def test_fit_keeps_coefficients_at_zero_or_above() -> None:
    # Concave times: the free fit's quadratic term is negative, so the best line through the origin is kept.
    cost = SequenceCost.fit([1, 2, 4], [1.0, 1.9, 3.5])
    assert cost.b == 0.0
    assert cost.a == pytest.approx(18.8 / 21, rel=1e-12)


def test_bad_fits_and_costs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^fitting a t \+ b t\^2 needs times at two or more lengths, got \[32.0\]$"):
        SequenceCost.fit([32, 32], [1.0, 1.1])
    with pytest.raises(ValueError, match=r"^got 2 lengths and 1 times: give one time per length$"):
        SequenceCost.fit([16, 32], [1.0])
    with pytest.raises(ValueError, match=r"^times must be positive finite numbers, got nan$"):
        SequenceCost.fit([16, 32], [1.0, float("nan")])
    with pytest.raises(ValueError, match=r"^SequenceCost.b must be a finite number of at least 0, got -1.0$"):
        SequenceCost(1.0, -1.0)
    with pytest.raises(ValueError, match=r"^SequenceCost needs a or b above 0"):
        SequenceCost(0.0)


def test_the_cost_is_fitted_to_the_planners_profile_at_each_length(monkeypatch: pytest.MonkeyPatch) -> None:
    # The profile's node times summed (forward and backward) over the rows: a t + b t^2 per row, exactly.
    def fake_profile(graph: object, inputs: tuple[torch.Tensor, ...], **_: object) -> list[NodeProfile]:
        rows, t = inputs[0].shape
        per_row = 1e-4 * t + 2e-6 * t * t
        return [
            NodeProfile("a", rows * per_row / 4, rows * per_row / 4, 0, 0, 0, True),
            NodeProfile("b", 0.0, rows * per_row / 2, 0, 0, 0, True),
        ]

    monkeypatch.setattr(profiled, "profile", fake_profile)
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4))
    cost = profiled.profile_sequence_cost(model, lambda t: torch.zeros(3, t, dtype=torch.long), (8, 16, 32))
    assert cost.a == pytest.approx(1e-4, rel=1e-9)
    assert cost.b == pytest.approx(2e-6, rel=1e-9)
    with pytest.raises(ValueError, match=r"needs two or more sequence lengths, got \[8, 8\]$"):
        profiled.profile_sequence_cost(model, lambda t: torch.zeros(3, t, dtype=torch.long), (8, 8))


# -- the formation -------------------------------------------------------------------------------------------


def test_rows_of_one_sequence_cut_the_sorted_lengths_at_the_least_largest_cost() -> None:
    # Sorted: 8 5 4 3 2 1. Below a limit of 10 the greedy cut needs four runs ([8] [5] [4 3] [2 1]); at 10,
    # three: [8] (8), [5 4] padded to 5 (10), [3 2 1] padded to 3 (9). Longest first by cost.
    formed = form_microbatches([5, 1, 3, 4, 2, 8], 3)
    assert formed.microbatches == (((0,), (3,)), ((2,), (4,), (1,)), ((5,),))
    assert formed.costs == (10.0, 9.0, 8.0)
    assert [formed.shape(mb) for mb in range(3)] == [(2, 5), (3, 3), (1, 8)]
    assert formed.padding == pytest.approx(4 / 23)
    assert form_microbatches([5, 1, 3, 4, 2, 8], 3, microbatch_order="given").costs == (8.0, 10.0, 9.0)


def test_packed_rows_take_each_sequence_into_the_shortest_row_so_far() -> None:
    # 8 -> row 0, 5 -> row 1, 4 -> row 2, 3 -> row 2 (7), 2 -> row 1 (7), 1 -> row 1 (the first of two at 7).
    formed = form_microbatches([5, 1, 3, 4, 2, 8], 3, pack=True)
    assert formed.microbatches == (((5,),), ((0, 4, 1),), ((3, 2),))
    assert formed.costs == (8.0, 8.0, 7.0)
    assert formed.padding == 0.0


def test_the_quadratic_term_weighs_long_rows() -> None:
    # With attention dominating (b large), two rows of 4 cost less than one of 8: [4 4] joins, 8 stays alone.
    formed = form_microbatches([8, 4, 4], 2, SequenceCost(1e-6, 1.0))
    assert sorted(formed.microbatches) == [((0,),), ((1,), (2,))]


def test_bad_batches_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^3 sequences cannot fill 4 micro-batches: give at least 4 sequences"):
        form_microbatches([1, 2, 3], 4)
    with pytest.raises(ValueError, match=r"^sequence lengths must be positive integers, got 0$"):
        form_microbatches([3, 0], 1)
    with pytest.raises(ValueError, match=r"^sequence lengths must be positive integers, got 2\.5$"):
        form_microbatches([3, 2.5], 1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"^unknown micro-batch order 'random'"):
        form_microbatches([3, 2], 1, microbatch_order="random")


@functools.cache
def _best_largest_cost(lengths: tuple[int, ...], m: int) -> float:
    """The smallest largest padded cost over every cut of the lengths (longest first) into m consecutive runs."""
    ranked = sorted(lengths, reverse=True)
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(ranked)), m - 1):
        bounds = (0, *cuts, len(ranked))
        best = min(best, max((b - a) * ranked[a] for a, b in itertools.pairwise(bounds)))
    return best


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=40),
    st.integers(1, 12),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.sampled_from(list(MicrobatchOrder)),
)
def test_every_sequence_lands_in_exactly_one_micro_batch(
    lengths: list[int], m: int, pack: bool, seed: int, order: MicrobatchOrder
) -> None:
    m = min(m, len(lengths))
    formed = form_microbatches(lengths, m, pack=pack, microbatch_order=order, seed=seed)
    assert formed == form_microbatches(list(lengths), m, pack=pack, microbatch_order=order, seed=seed)  # deterministic
    assert len(formed.microbatches) == m
    assert all(formed.sequences(mb) for mb in range(m))  # none empty
    assert sorted(i for mb in range(m) for i in formed.sequences(mb)) == list(range(len(lengths)))
    for mb, rows in enumerate(formed.microbatches):
        count, length = formed.shape(mb)
        assert formed.costs[mb] == (length if pack else count * length)  # linear cost: padded tokens
        assert (len(rows) == 1) if pack else all(len(row) == 1 for row in rows)
    if order is MicrobatchOrder.LONGEST_FIRST:
        assert list(formed.costs) == sorted(formed.costs, reverse=True)
    if not pack and len(lengths) <= 10:
        assert max(formed.costs) == _best_largest_cost(tuple(lengths), m)


# -- the tensors ---------------------------------------------------------------------------------------------


def _sequences(*lengths: int) -> list[torch.Tensor]:
    """Sequence i counts up from 10 * i (its inputs and, shifted by one, its targets)."""
    return [torch.arange(10 * i, 10 * i + n + 1) for i, n in enumerate(lengths)]


def test_padded_rows_ignore_the_padding() -> None:
    batch = form_batch(_sequences(3, 1, 2), 2, pad=-1)  # [3] costs 3, [2 1] padded to 2 costs 4: it goes first
    assert batch.tokens == 6
    assert batch.formation.microbatches == (((2,), (1,)), ((0,),))
    assert torch.equal(batch.inputs[0], torch.tensor([[20, 21], [10, -1]]))  # type: ignore[arg-type]
    assert torch.equal(batch.targets[0], torch.tensor([[21, 22], [11, IGNORE_INDEX]]))
    assert torch.equal(batch.inputs[1], torch.tensor([[0, 1, 2]]))  # type: ignore[arg-type]
    assert torch.equal(batch.targets[1], torch.tensor([[1, 2, 3]]))
    assert batch.ends == ([4.0, 3.0], [4.0, 3.0])  # front-then-back's two ends: each micro-batch's cost at both


def test_packed_rows_carry_each_positions_document() -> None:
    batch = form_batch(_sequences(3, 1, 2), 2, pack=True)
    assert batch.formation.microbatches == (((0,),), ((2, 1),))
    ids, documents = batch.inputs[1]
    assert torch.equal(ids, torch.tensor([[20, 21, 10]]))
    assert torch.equal(documents, torch.tensor([[0, 0, 1]]))
    assert torch.equal(batch.targets[1], torch.tensor([[21, 22, 11]]))


def test_sequences_that_do_not_match_are_refused() -> None:
    formed = form_microbatches([3, 1], 1)
    with pytest.raises(ValueError, match=r"^sequence 1 has shape \(5,\); the formation expects 2 token ids"):
        collate(_sequences(3, 4), formed)
    with pytest.raises(ValueError, match=r"^got 1 sequences for a formation of 2$"):
        collate(_sequences(3), formed)
    with pytest.raises(ValueError, match=r"^sequence 0 has shape \(1,\): give 1-D sequences of 2 or more ids$"):
        form_batch([torch.zeros(1, dtype=torch.long)], 1)
