"""Shared helpers for the test suite."""

from __future__ import annotations

from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint
from hintpipe.scoreboard import Policy
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import SimResult, Simulator


def simulate(
    hint: Hint | str,
    ranks: int = 4,
    microbatches: int = 8,
    chunks: int = 1,
    policy: Policy = Policy.FIXED,
    *,
    forward: float = 1.0,
    backward: float = 1.0,
    weight: float = 1.0,
) -> SimResult:
    """One run of ``hint`` on expected (noise-free) costs."""
    if isinstance(hint, str):
        hint = generate_hint(hint, ranks, microbatches, chunks)
    costs = CostModel.uniform(hint.num_stages, forward=forward, backward=backward, weight=weight)
    return Simulator(hint, costs).run(policy)


#: Seconds a test allows for ranks to start (spawn, import torch, join the group) on a loaded 2-core machine.
STARTUP_ALLOWANCE = 60.0


def hang_bound(watchdog: float, grace: float = 5.0) -> float:
    """The wall-clock limit for a run that must end by its watchdog: three times the
    watchdog plus the launcher's grace, plus start-up. These tests check that nothing
    hangs, not how fast the failure is seen, so the margin is wide on purpose."""
    return 3.0 * (watchdog + grace) + STARTUP_ALLOWANCE
