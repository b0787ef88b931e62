"""Property tests: random hints, sizes, costs and policies never break the rules."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import CommDelay, IidNoise, MicrobatchNoise, Multimodal, Straggler
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, HintName
from hintpipe.schedule.task import Kind, Task
from hintpipe.sim.simulator import Sample, SimResult, Simulator


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Hint, CostModel, Sample, Policy, float]:
    name = draw(st.sampled_from(list(HintName)))
    ranks = draw(st.integers(1, 6))
    if name is HintName.ZBV:
        chunks = 2
    elif name in (HintName.ONE_F_ONE_B, HintName.ZB_H1):
        chunks = 1
    else:
        chunks = draw(st.integers(1, 3))
    microbatches = draw(st.integers(1, 12))
    if name in (HintName.INTERLEAVED_1F1B, HintName.BF, HintName.BFW) and chunks > 1:
        microbatches = ranks * draw(st.integers(1, 3))  # interleaving needs whole rounds
    hint = generate_hint(name, ranks, microbatches, chunks)
    stages = hint.stages
    positive = st.floats(0.1, 5.0)
    costs = CostModel.uniform(
        stages,
        forward=draw(st.lists(positive, min_size=stages, max_size=stages)),
        backward=draw(st.lists(positive, min_size=stages, max_size=stages)),
        weight=draw(st.lists(positive, min_size=stages, max_size=stages)),
        activation=draw(st.none() | st.lists(st.floats(1.0, 1e6), min_size=stages, max_size=stages)),
    )
    models = draw(
        st.lists(
            st.one_of(
                st.builds(IidNoise, st.floats(0.0, 1.0)),
                st.builds(MicrobatchNoise, st.floats(0.0, 1.0)),
                st.builds(Straggler, st.floats(1.0, 4.0)),
                st.builds(CommDelay, st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
                st.builds(Multimodal, st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
            ),
            max_size=3,
        )
    )
    sample = Sample.draw(hint, costs, models, np.random.default_rng(draw(st.integers(0, 2**16))))
    return hint, costs, sample, draw(st.sampled_from(list(Policy))), draw(st.sampled_from([0.0, 1.0, 2.0, 5.0]))


def _check(hint: Hint, sample: Sample, result: SimResult) -> None:
    stage_rank = hint.placement.stage_rank
    when: dict[Task, tuple[float, float]] = {}
    for r, tasks in enumerate(hint.lists):
        spans = sorted(zip(result.starts[r], result.ends[r], strict=True))
        for (_s0, e0), (s1, _) in itertools.pairwise(spans):
            assert e0 <= s1 + 1e-9, "a rank ran two tasks at once"
        for i, t in enumerate(tasks):
            start, end = result.starts[r][i], result.ends[r][i]
            assert not math.isnan(start) and not math.isnan(end), f"{t} never ran"
            assert end - start == pytest.approx(sample.costs[t.stage, t.mb, t.kind], rel=1e-9, abs=1e-9)
            when[t] = (start, end)

    def after(task: Task, dep: Task) -> None:
        delay = sample.delays[dep.stage, dep.mb, dep.kind] if stage_rank[dep.stage] != stage_rank[task.stage] else 0
        assert when[task][0] >= when[dep][1] + delay - 1e-9, f"{task} started before {dep} arrived"

    last = hint.stages - 1
    for t in when:
        if t.kind is Kind.F and t.stage > 0:
            after(t, Task(t.stage - 1, Kind.F, t.mb))
        elif t.kind is Kind.B:
            after(t, Task(t.stage, Kind.F, t.mb))
            if t.stage < last:
                after(t, Task(t.stage + 1, Kind.B, t.mb))
        elif t.kind is Kind.W:
            after(t, Task(t.stage, Kind.B, t.mb))
    for peak, budget in zip(result.peak_live, result.budget, strict=True):
        assert peak <= budget + 1e-6


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_policy_deadlocks_runs_a_task_twice_breaks_a_dependency_or_the_budget(
    scenario: tuple[Hint, CostModel, Sample, Policy, float],
) -> None:
    hint, costs, sample, policy, slack = scenario
    result = Simulator(hint, costs).run(policy, sample, slack_microbatches=slack)
    _check(hint, sample, result)
    assert result.makespan >= result.lower_bound - 1e-9


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([0.0, 0.25, 1.0]))
def test_no_rank_exceeds_a_per_device_budget(
    scenario: tuple[Hint, CostModel, Sample, Policy, float], headroom: float
) -> None:
    hint, costs, sample, policy, _ = scenario
    simulator = Simulator(hint, costs)
    budgets = simulator.device_budgets(headroom)
    busiest = max(g.peak for g in simulator.graphs)
    assert budgets == [busiest * (1 + headroom)] * hint.ranks
    result = simulator.run(policy, sample, activation_budget=budgets)
    _check(hint, sample, result)
    assert max(result.peak_live) <= busiest * (1 + headroom) + 1e-6


def held_by_size(result: SimResult, sample: Sample, costs: CostModel) -> list[float]:
    """Each rank's most held at once, read off the timeline: a forward holds its micro-batch's known size (times
    the cost model's activation bytes) from its start until its releaser ends (releases first at a tie)."""
    hint = result.hint
    sizes = sample.sizes if sample.sizes is not None else np.ones(hint.microbatches)
    activation = costs.activation_sizes(hint.microbatches)
    release = Kind.W if hint.split_backward else Kind.B
    held = []
    for r, tasks in enumerate(hint.lists):
        events = []
        for i, t in enumerate(tasks):
            weight = float(sizes[t.mb]) * (1.0 if activation is None else float(activation[t.stage, t.mb]))
            if t.kind is Kind.F:
                events.append((result.starts[r][i], 1, weight))
            elif t.kind is release:
                events.append((result.ends[r][i], 0, -weight))
        live, most = 0.0, 0.0
        for _, _, change in sorted(events):
            live += change
            most = max(most, live)
        held.append(most)
    return held


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenarios(),
    st.sampled_from(["given", "shortest-first", "longest-first", "balanced", "front-then-back"]),
    st.sampled_from([None, 0.0, 0.25]),
)
def test_admission_by_size_never_exceeds_its_budget(
    scenario: tuple[Hint, CostModel, Sample, Policy, float], order: str, device_budget_fraction: float | None
) -> None:
    # The budget is measured on the micro-batches in the order they came; any order of them runs within it,
    # on every rank, under every policy (fixed too: it runs the hint fitted to the budget).
    hint, costs, drawn, policy, slack = scenario
    simulator = Simulator(hint, costs)
    budgets = simulator.size_budgets(drawn, slack_microbatches=slack, device_budget_fraction=device_budget_fraction)
    sample = drawn.ordered(order)
    result = simulator.run(policy, sample, activation_budget=budgets, admission="size")
    _check(result.hint, sample, result)
    for held, peak, budget in zip(held_by_size(result, sample, costs), result.peak_live, budgets, strict=True):
        assert held == pytest.approx(peak, rel=1e-9, abs=1e-9)
        assert held <= budget * (1 + 1e-12)
    assert result.makespan >= result.memory_bound - 1e-9
