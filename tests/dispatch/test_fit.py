"""Admission by size: a hint fitted into a budget, exact orders and makespans, the bound at a budget."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.fit import AdmissionUnit, BudgetError, fit_hint
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.variability import CommDelay, parse_variability
from hintpipe.options import check_options
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintName
from hintpipe.sim.compare import run_study
from hintpipe.sim.simulator import Sample, Simulator


def _chunks(name: HintName) -> int:
    return 2 if name in (HintName.ZBV, HintName.INTERLEAVED_1F1B) else 1


def _sized(sizes: list[float]) -> tuple[Simulator, Sample]:
    """1F1B on 2 ranks with F = 1, B = 2 and micro-batches of these known sizes, in the given order."""
    hint = generate_hint("1f1b", 2, len(sizes))
    simulator = Simulator(hint, CostModel.uniform(2))
    return simulator, dataclasses.replace(Sample.expected(hint, simulator.cost_model), sizes=np.array(sizes))


def test_a_sorted_order_runs_within_what_the_given_order_holds() -> None:
    # Given sizes 1 2 1 2: rank 0 of 1F1B holds at most 3 (two micro-batches in flight). Shortest first
    # (1 1 2 2) would hold the two long ones together, 4: fitted, rank 0 lets B2 go before F3.
    simulator, given = _sized([1.0, 2.0, 1.0, 2.0])
    budgets = simulator.size_budgets(given, device_budget_fraction=0.0)
    assert budgets == [3.0, 3.0]
    sample = given.ordered("shortest-first")
    by_slots = simulator.run(Policy.FIXED, sample)
    by_size = simulator.run(Policy.FIXED, sample, activation_budget=budgets, admission="size")
    assert " ".join(map(str, by_slots.hint.lists[0])) == "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"
    assert " ".join(map(str, by_size.hint.lists[0])) == "0F0 0F1 0B0 0F2 0B1 0B2 0F3 0B3"
    assert by_size.hint.lists[1] == by_slots.hint.lists[1]  # rank 1 holds one at a time: it fits as it is
    assert (by_slots.makespan, by_size.makespan) == (15.0, 18.0)  # the memory costs 3 units here
    assert by_size.peak_live == (3.0, 2.0)
    assert simulator.run(Policy.READY, sample, activation_budget=budgets, admission="size").makespan == 18.0


def test_a_hint_that_fits_is_left_as_it_is() -> None:
    hint = generate_hint("bfw", 4, 8)
    graphs = [RankGraph(hint, r, [2.0] * len(tasks)) for r, tasks in enumerate(hint.lists)]
    fitted, orders = fit_hint(hint, graphs, [g.peak for g in graphs])
    assert fitted is hint
    assert all(np.array_equal(order, np.arange(len(tasks))) for order, tasks in zip(orders, hint.lists, strict=True))


def test_a_budget_below_one_microbatch_is_refused_naming_the_rank_and_the_task() -> None:
    simulator, given = _sized([1.0, 2.0, 1.0, 2.0])
    with pytest.raises(BudgetError) as info:
        simulator.run(Policy.FIXED, given, activation_budget=[1.5, 1.5], admission="size")
    assert str(info.value) == (
        "the hint cannot run within its budgets: every rank waits; rank 0 cannot hold 0F1 (2) with the 0 it holds "
        "or has set aside within 1.5; rank 1 cannot hold 1F1 (2) with the 0 it holds or has set aside within 1.5; "
        "raise the budget"
    )


@pytest.mark.parametrize("name", list(HintName))
@pytest.mark.parametrize("latency", [0.0, 0.3])
def test_ready_equals_fixed_without_variability_under_admission_by_size(name: HintName, latency: float) -> None:
    # Each rank's room: its own peak by size, measured on the given order (the default).
    hint = generate_hint(name, 4, 8, _chunks(name))
    models = [parse_variability("mb:0.0"), CommDelay(latency)]
    study = run_study(
        hint, [Policy.FIXED, Policy.READY], variability=models, microbatch_order="shortest-first", admission="size"
    )
    assert study[Policy.READY].makespan == study[Policy.FIXED].makespan


@pytest.mark.parametrize("name", list(HintName))
def test_a_hint_fitted_below_its_own_peak_holds_its_budget_and_ready_never_loses(name: HintName) -> None:
    # Budgets one micro-batch below each rank's own peak: the hint itself no longer fits. The 1F1B family's
    # fitted lists leave no gap ready could fill, so there ready equals fixed; the others leave gaps it fills.
    hint = generate_hint(name, 4, 8, _chunks(name))
    simulator = Simulator(hint, CostModel.uniform(hint.stages))
    budgets = [max(_chunks(name), math.ceil(g.peak) - 1) for g in simulator.graphs]
    for latency in (0.0, 0.3):
        sample = Sample.expected(hint, simulator.cost_model, CommDelay(latency))
        fixed = simulator.run(Policy.FIXED, sample, activation_budget=budgets, admission="size")
        ready = simulator.run(Policy.READY, sample, activation_budget=budgets, admission="size")
        assert fixed.hint is not hint
        assert all(peak <= budget for peak, budget in zip(fixed.peak_live, budgets, strict=True))
        assert all(peak <= budget for peak, budget in zip(ready.peak_live, budgets, strict=True))
        if name in (HintName.ONE_F_ONE_B, HintName.BF, HintName.BFW):
            assert ready.starts == fixed.starts
        else:
            assert ready.makespan < fixed.makespan


def test_the_bound_at_a_budget_is_what_holding_each_microbatch_for_its_chain_takes() -> None:
    # 1F1B, 2 ranks, 8 micro-batches, F = 1, B = 2, latency 0.5: rank 0 holds each micro-batch at least
    # F + F + B + B and two hops, 7; eight of them in room for 2: at least 28, above the work bound (24).
    hint = generate_hint("1f1b", 2, 8)
    simulator = Simulator(hint, CostModel.uniform(2))
    sample = Sample.expected(hint, simulator.cost_model, CommDelay(0.5))
    result = simulator.run(Policy.FIXED, sample)
    assert (result.lower_bound, result.memory_bound, result.makespan) == (24.0, 28.0, 31.0)
    roomy = simulator.run(Policy.READY, sample, slack_microbatches=2)  # room for 4 and 3: the work bound again
    assert (roomy.memory_bound, roomy.makespan) == (24.0, 28.0)


def test_the_admission_option_converts_once_and_refuses_an_unknown_unit() -> None:
    assert check_options({"admission": "size"})["admission"] is AdmissionUnit.SIZE
    with pytest.raises(ValueError, match=r"^admission 'bytes' is unknown: choose one of slots, size$"):
        check_options({"admission": "bytes"})
