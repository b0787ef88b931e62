"""``hint="auto"``'s choice: the hint whose simulated step is shorter on the stages' measured costs (see [Note:
what a split backward costs] in ``hintpipe.apps.split_costs``)."""

from __future__ import annotations

from hintpipe.sim.hint_choice import choose_hint, predicted_steps

ONES = (1.0, 1.0)


def test_a_free_split_fills_the_bubble_and_is_chosen() -> None:
    # 2 ranks, 8 micro-batches, F = 1, B = 2 whole or 1 + 1 split: 1F1B (m + p - 1)(F + B) = 27; ZB-H1
    # m(F + B + W) + (p - 1)(F + B - W) = 25.
    predicted = predicted_steps(2, 8, ONES, (2.0, 2.0), ONES, ONES)
    assert predicted == {"1f1b": 27.0, "zb-h1": 25.0}
    assert choose_hint(predicted) == "zb-h1"


def test_a_split_that_costs_more_than_its_bubble_is_not_chosen() -> None:
    # The split's two parts 1.5 each (3 for a whole backward of 2: the second traversal's price).
    predicted = predicted_steps(2, 8, ONES, (2.0, 2.0), (1.5, 1.5), (1.5, 1.5))
    assert predicted["1f1b"] == 27.0 and predicted["zb-h1"] > 27.0
    assert choose_hint(predicted) == "1f1b"


def test_the_split_hint_s_own_forward_is_what_its_step_is_simulated_on() -> None:
    # A split hint's forward records what W needs (see [Note: a deferred layer's forward]); ZB-H1 at
    # F = 1.25, B = W = 1: m(F + B + W) + (p - 1)(F + B - W) = 8 x 3.25 + 1.25 = 27.25, past 1F1B's 27 on the
    # unsplit forward; at F = 1.125, 26.125.
    slower = predicted_steps(2, 8, ONES, (2.0, 2.0), ONES, ONES, split_forward=(1.25, 1.25))
    assert slower == {"1f1b": 27.0, "zb-h1": 27.25} and choose_hint(slower) == "1f1b"
    cheaper = predicted_steps(2, 8, ONES, (2.0, 2.0), ONES, ONES, split_forward=(1.125, 1.125))
    assert cheaper == {"1f1b": 27.0, "zb-h1": 26.125} and choose_hint(cheaper) == "zb-h1"


def test_a_tie_goes_to_the_hint_without_a_split() -> None:
    assert choose_hint({"1f1b": 10.0, "zb-h1": 10.0}) == "1f1b"
