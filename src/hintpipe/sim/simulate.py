"""``hintpipe.simulate``: one step of a schedule on the event simulator, as the runtime would report it.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.renamed import renamed
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder
from hintpipe.schedule.resolve import resolve_hint
from hintpipe.sim.compare import run_study
from hintpipe.sim.simulator import SimResult


@renamed("simulate", memory_slack="slack_microbatches", device_budget="device_budget_fraction")
def simulate(
    hint: str | Hint = "1f1b",
    *,
    ranks: int,
    microbatches: int,
    policy: Policy | str = Policy.READY,
    chunks: int | None = None,
    costs: CostModel | None = None,
    variability: Sequence[str] = (),
    seed: int = 0,
    slack_microbatches: float = 0.0,
    activation_budget: Sequence[float] | None = None,
    device_budget_fraction: float | None = None,
    microbatch_order: MicrobatchOrder | str = MicrobatchOrder.GIVEN,
    admission: AdmissionUnit | str = AdmissionUnit.SLOTS,
) -> SimResult:
    """Simulate one step of ``hint`` on ``ranks`` ranks and ``microbatches`` micro-batches under ``policy``, as
    ``hintpipe simulate`` does (its options by the same names): the step's
    :class:`~hintpipe.observe.step_record.StepRecord`, the record a :class:`~hintpipe.runtime.pipeline.Pipeline`
    reports its steps in (see [Note: one record of a step]).

    Args:
        hint: a schedule's name, a CSV file, or a :class:`~hintpipe.schedule.hint.Hint`.
        costs: each stage's forward, backward and weight-gradient cost (default: all 1, W split off where the
            hint splits it).
        variability: ``--variability`` specs (``mb:0.5``, ``moe:8:2``, ...; see :mod:`hintpipe.dispatch.variability`),
            drawn from ``seed``.
        slack_microbatches, activation_budget, device_budget_fraction, microbatch_order, admission: the room and
            the order, as the pipeline takes them.

    Raises:
        ValueError: an unknown hint, policy or variability spec, or sizes the hint does not support.
        DeadlockError, BudgetError: as :meth:`~hintpipe.sim.simulator.Simulator.run`.
    """
    resolved = resolve_hint(hint, ranks, microbatches, chunks)
    models = [parse_variability(spec) for spec in variability]
    chosen = Policy.parse(policy)
    study = run_study(
        resolved,
        [chosen],
        cost_model=costs,
        variability=models,
        seed=seed,
        slack_microbatches=slack_microbatches,
        activation_budget=activation_budget,
        device_budget_fraction=device_budget_fraction,
        microbatch_order=microbatch_order,
        admission=admission,
    )
    return study[chosen].last
