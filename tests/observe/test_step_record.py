"""One record of a step, predicted or measured (:mod:`hintpipe.observe.step_record`): the figures both derive from
it, computed once here."""

from __future__ import annotations

import pytest

from hintpipe.dispatch.policy import Policy
from hintpipe.observe.step_record import StepRecord


def test_efficiency_and_bubble_are_shares_of_the_makespan() -> None:
    record = StepRecord(policy=Policy.READY, makespan=8.0, lower_bound=6.0, busy=(6.0, 4.0, 2.0), peak_live=(3, 2, 1))
    assert record.efficiency == 0.75
    assert record.bubble == (0.25, 0.5, 0.75)
    assert record.bubble_fraction == 0.5
    assert record.budget == ()  # no admission: no budget


def test_an_empty_step_is_perfectly_efficient_and_idle_nowhere() -> None:
    record = StepRecord(policy=Policy.FIXED, makespan=0.0, lower_bound=0.0, busy=(0.0, 0.0), peak_live=(0, 0))
    assert (record.efficiency, record.bubble, record.bubble_fraction) == (1.0, (0.0, 0.0), 0.0)
    assert StepRecord(policy=Policy.FIXED, makespan=1.0, lower_bound=1.0, busy=(), peak_live=()).bubble_fraction == 0.0


def test_a_record_is_made_by_keyword_only() -> None:
    # A positional record would be read wrong the day a field is added: the simulator's and the runtime's differ.
    with pytest.raises(TypeError, match=r"^StepRecord.__init__\(\) takes 1 positional argument but 6 were given$"):
        StepRecord(Policy.FIXED, 1.0, 1.0, (1.0,), (1,))  # type: ignore[call-arg]
