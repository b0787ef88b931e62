"""``hint="auto"``: the hint whose simulated step is shortest on the stages' measured costs.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Simulator

#: What ``auto`` chooses among, the first winning ties: 1F1B, and the zero-bubble hint of as many stages (one per
#: rank), whose split backward must pay for itself (see [Note: what a split backward costs] in
#: :mod:`hintpipe.apps.split_costs`).
CANDIDATES = ("1f1b", "zb-h1")


def predicted_steps(
    ranks: int,
    microbatches: int,
    forward: Sequence[float],
    backward: Sequence[float],
    backward_input: Sequence[float],
    weight: Sequence[float],
    candidates: Sequence[str] = CANDIDATES,
    *,
    split_forward: Sequence[float] | None = None,
) -> dict[str, float]:
    """Each candidate hint's simulated step on these per-stage costs (fixed order, the hint's own: a choice of
    hint on identical work), an unsplit hint with the whole backward, a split one with its two parts and its
    own forward (``split_forward``, where measured: a split hint's forward records what W needs)."""
    out = {}
    for name in candidates:
        hint = generate_hint(name, ranks, microbatches)
        if hint.split_backward:
            forwards = forward if split_forward is None else split_forward
            costs = CostModel(tuple(forwards), tuple(backward_input), tuple(weight))
        else:
            costs = CostModel(tuple(forward), tuple(backward), (0.0,) * len(forward))
        out[name] = Simulator(hint, costs).run(Policy.FIXED).makespan
    return out


def choose_hint(predicted: dict[str, float]) -> str:
    """The candidate with the shortest predicted step, the first of equals (1F1B before a split that only ties)."""
    return min(predicted, key=lambda name: (predicted[name], list(predicted).index(name)))
