"""The held-out split as an evaluation reads it (:mod:`hintpipe.data.held_out`): every source's held-out documents
in one fixed order, a permutation seeded by the run's seed, taken batch by batch without replacement."""

from __future__ import annotations

import pytest

from hintpipe.data.held_out import HeldOutOrder

PARTS = (tuple(f"a{i}" for i in range(7)), (), tuple(f"b{i}" for i in range(5)))


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
def test_the_order_is_a_permutation_of_every_sources_documents(seed: int) -> None:
    order = HeldOutOrder(PARTS, seed)
    assert len(order) == 12
    taken = [order[i] for i in range(12)]
    assert sorted(taken) == sorted([*PARTS[0], *PARTS[2]])
    assert order.batch(1, 4) == taken[4:8]  # batch k: the k-th run of ``size`` positions


def test_the_seed_sets_the_order_and_the_same_seed_gives_it_again() -> None:
    orders = [[HeldOutOrder(PARTS, seed)[i] for i in range(12)] for seed in (5, 5, 6)]
    assert orders[0] == orders[1] != orders[2]
    assert orders[0][:4] != [*PARTS[0][:4]]  # a prefix samples the corpus, not its first file


def test_a_position_past_the_end_is_refused_naming_it() -> None:
    order = HeldOutOrder(PARTS, 0)
    with pytest.raises(IndexError, match=r"^held-out document 12 of 12$"):
        order.batch(3, 4)
    with pytest.raises(IndexError, match=r"^held-out document -1 of 12$"):
        order[-1]
    assert len(HeldOutOrder(((),), 0)) == 0 and HeldOutOrder((("only",),), 3).batch(0, 1) == ["only"]
