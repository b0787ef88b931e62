"""``ready`` without variability runs every hint exactly as ``fixed`` does, in the runtime (emulated compute).

With every task costing what was planned, ``ready`` has nothing to gain by
leaving its hint: each rank's order of tasks under ``ready`` must be the
hint's list, which is what ``fixed`` runs. The one exception is a gap the hint
itself leaves (zb-h1: a rank waits for a gradient with a forward ready and
the gradient due after it), which ``ready`` fills, as the simulator does, at
the same makespan; the test names it exactly.

[Note: a unit long enough for a loaded machine]
The runtime reads lateness on the wall clock: an input counts as late, and
``ready`` may run other work first, once it is past its expected time by a
quarter of the waiting task's cost (``LATENESS_TOLERANCE``). Emulated tasks
sleep, and on a loaded 2-core machine sleeps, wake-ups and messages overshoot
by several milliseconds: at 20-40 ms a task, a quarter (5-10 ms) was
exceeded in some runs beside another process, and ``ready`` then left the
order for a lateness that was real (benchmarks/readiness-at-scale, "Kept
order"). At 100 ms a task the margin was 25 ms, still a stall a loaded
machine can make; at 400 ms it is 100 ms, so only a stall of that size moves
a task (no exact order is asserted on a smaller margin); 4 micro-batches keep
each hint's steps at 6-12 s. A stall longer than that still happens now and
then on a loaded 2-core machine beside other tests (zb-h1 once in three whole
runs of the suite): it is a lateness that is real, so the test asks that one
of the two planned steps (1 and 2) runs the hint exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from groups import Case, run_cases, succeeded
from hintpipe.apps.models import lm_loss
from hintpipe.runtime.loop.executor import EmulatedCosts
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintName

RANKS = 4
MICROBATCHES = 4
UNIT = 0.4  # seconds: see [Note: a unit long enough for a loaded machine]


def _ready_orders(rank: int, world: int) -> dict[str, list[tuple[str, list[str]]]]:
    """Per hint and step 1 and 2: the policy the step ran and this rank's order of tasks in it (step 0 runs the
    hint in order while ``ready``'s plan is measured; from step 1 the plan is in use)."""
    out = {}
    for name in HintName:
        hint = generate_hint(name, world, MICROBATCHES)
        backward, weight = (UNIT, UNIT) if hint.split_backward else (2 * UNIT, 0.0)
        stages = hint.num_stages
        costs = EmulatedCosts((UNIT,) * stages, (backward,) * stages, (weight,) * stages, reference_size=1)
        modules = {s: nn.Identity() for s in hint.placement.stages_of(rank)}
        pipe = Pipeline(modules, loss_fn=lm_loss, microbatches=MICROBATCHES, hint=hint, policy="ready", emulate=costs)
        with pipe:
            for _ in range(3):
                pipe.step()
        out[name.value] = [
            (report.policy.value, [str(task) for r, task, _, _ in report.records if r == rank])
            for report in pipe.reports[-2:]
        ]
    return out


@pytest.fixture(scope="module")
def orders() -> dict[str, list[Any]]:
    return run_cases(RANKS, {"ready": Case(_ready_orders)}, timeout_s=300)


def _moved(order: list[str], task: str, before: str) -> list[str]:
    """``order`` with ``task`` moved to just before ``before``."""
    out = [t for t in order if t != task]
    out.insert(out.index(before), task)
    return out


@pytest.mark.parametrize("name", [h.value for h in HintName])
def test_ready_runs_the_hint_exactly_without_variability(orders: dict[str, list[Any]], name: str) -> None:
    hint = generate_hint(name, RANKS, MICROBATCHES)
    for rank, per_hint in enumerate(succeeded(orders["ready"])):
        assert [policy for policy, _ in per_hint[name]] == ["ready", "ready"]
        expected = [str(task) for task in hint.lists[rank]]
        allowed = [expected]
        if name == "zb-h1" and rank == 1:
            # The hint's own gap: rank 1 waits for 1B0's gradient with 1F3 ready and the gradient due after it.
            allowed = [_moved(expected, "1F3", "1B0")]
        if name == "zb-h1" and rank == 2:
            # An exact tie at equal costs: 2F2's input comes as 2F1 ends and 2B0's gradient one task later, so
            # 2F2 fills that gap ending as the gradient arrives, at the same makespan; the plan is made from
            # measured costs, whose noise tips the tie either way (both planned steps ran it filled once in a
            # loaded run of the suite).
            allowed.append(_moved(expected, "2F2", "2B0"))
        # One of the two planned steps runs it exactly: a stall of the machine past the margin is a lateness
        # that is real, after which ready rightly leaves the order (see [Note: a unit long enough ...]).
        ran = [order for _, order in per_hint[name]]
        assert any(order in allowed for order in ran), f"rank {rank}: {per_hint[name]}"
