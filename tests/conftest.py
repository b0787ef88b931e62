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
    **costs: float,
) -> SimResult:
    """One run of ``hint`` on expected (noise-free) costs."""
    if isinstance(hint, str):
        hint = generate_hint(hint, ranks, microbatches, chunks)
    return Simulator(hint, CostModel.uniform(hint.num_stages, **costs)).run(policy)
