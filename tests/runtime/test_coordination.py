"""One decision per tensor-parallel group (:mod:`hintpipe.runtime.loop.coordination`): only where the members'
orders may diverge, a policy that chooses over a group of more than one, do decisions travel."""

from __future__ import annotations

import pytest

from hintpipe.dispatch.policy import Policy
from hintpipe.runtime.loop.coordination import needed


@pytest.mark.parametrize(
    ("policy", "tp", "coordinated"),
    [
        (Policy.FIXED, 1, False),
        (Policy.FIXED, 4, False),  # every member runs the hint's own order: no group, no decision
        (Policy.GREEDY, 1, False),  # a group of one agrees with itself
        (Policy.GREEDY, 2, True),
        (Policy.READY, 4, True),
    ],
)
def test_decisions_travel_only_where_the_members_choose(policy: Policy, tp: int, coordinated: bool) -> None:
    assert needed(policy, tp) is coordinated
