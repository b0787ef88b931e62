"""The ready policy's plan: rebuilt from measured costs only when they move, looked at ever more rarely."""

from __future__ import annotations

import numpy as np

from hintpipe.dispatch.expected import plans_for
from hintpipe.runtime.loop.ready_plan import LONGEST_INTERVAL, ReadyPlanner
from hintpipe.schedule.generators import generate_hint


def test_the_plan_is_rebuilt_only_when_costs_move_and_costs_are_looked_at_ever_more_rarely() -> None:
    hint = generate_hint("1f1b", 4, 8)
    planner = ReadyPlanner(hint, rank=1)
    costs = np.array([[1.0, 2.0, 0.0]] * 4)
    looked = []
    for step in range(60):
        if planner.due(step):
            looked.append(step)
            # 5% noise: below the 10% threshold, no rebuild; a jump at step 40 rebuilds.
            scale = 1.5 if step >= 40 else 1.0 + 0.05 * (step % 2)
            planner.update(step, costs * scale)
    assert planner.rebuilds == 2
    assert looked == [0, 1, 3, 7, 15, 31, 47]  # the jump at step 40 is taken up at 47
    assert LONGEST_INTERVAL == 16
    assert planner.plan == plans_for(hint, (costs * 1.5).tolist())[1]
