"""``moe:EXPERTS:TOPK[:SKEW[:SHARE]]``: mixture-of-experts routing as a cost draw (see [Note: expert load] in
:mod:`hintpipe.dispatch.variability`): exact draws for a seed, balanced loads that change nothing, the cap TOPK puts
on the busiest expert, the spec's words."""

from __future__ import annotations

import numpy as np
import pytest

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import ExpertLoad, SpecError, capped_shares, expert_factors, parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Sample, Simulator


def _moe(spec: str) -> ExpertLoad:
    model = parse_variability(spec)
    assert isinstance(model, ExpertLoad)
    return model


def test_the_spec_and_its_defaults() -> None:
    assert parse_variability("moe:8:2") == ExpertLoad(8, 2, 0.5, 1.0)
    assert parse_variability("moe:64:8:1.0") == ExpertLoad(64, 8, 1.0, 1.0)
    assert parse_variability("moe:64:8:0.3:0.6") == ExpertLoad(64, 8, 0.3, 0.6)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("moe:8", "bad variability 'moe:8': expected moe:EXPERTS:TOPK[:SKEW[:SHARE]]"),
        ("moe:0:1", "bad variability 'moe:0:1': EXPERTS '0' is not an integer >= 1"),
        ("moe:4:8", "bad variability 'moe:4:8': TOPK 8 is more than the 4 experts a token can go to"),
        ("moe:8:2:-1", "bad variability 'moe:8:2:-1': SKEW must be a finite number >= 0, got '-1'"),
        (
            "moe:8:2:0.5:1.5",
            "bad variability 'moe:8:2:0.5:1.5': SHARE is the experts' part of a stage's cost, between 0 and 1, "
            "got '1.5'",
        ),
    ],
)
def test_bad_moe_specs(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_variability(spec)
    assert str(raised.value) == message


def test_the_runtime_refuses_moe() -> None:
    with pytest.raises(SpecError) as raised:
        parse_variability("moe:8:2", seconds=True)
    assert str(raised.value) == (
        "bad variability 'moe:8:2': moe is the simulator's (hintpipe simulate): a run's router balances its real tokens"
    )


def test_the_draws_of_a_seed_are_exact() -> None:
    factors = expert_factors(_moe("moe:4:2:0.5"), 2, 3, np.random.default_rng(7))
    assert factors.tolist() == [
        [1.2640410869829863, 1.7805344038348854, 1.2813676999179897],
        [1.3868479465134262, 1.4349795380433819, 1.546005970689415],
    ]
    again = expert_factors(_moe("moe:4:2:0.5"), 2, 3, np.random.default_rng(7))
    assert again.tolist() == factors.tolist()


def test_shares_over_the_cap_go_to_the_others_by_weight() -> None:
    # One expert wants 8/12 of the tokens but takes at most 1/2; the rest share the other 1/2 by weight.
    assert capped_shares(np.array([8.0, 1.0, 1.0, 1.0, 1.0]), 0.5).tolist() == [0.5, 0.125, 0.125, 0.125, 0.125]
    # Capping the first pushes the second over the cap too (4/8 > 1/3): both capped, the rest share 1/3.
    shares = capped_shares(np.array([8.0, 4.0, 1.0, 1.0, 1.0]), 1 / 3)
    assert shares == pytest.approx([1 / 3, 1 / 3, 1 / 9, 1 / 9, 1 / 9], rel=1e-15)


def test_topk_caps_the_busiest_expert_and_share_scales_the_stage() -> None:
    wild = expert_factors(_moe("moe:8:2:5"), 16, 16, np.random.default_rng(0))
    assert wild.min() >= 1.0 and wild.max() == pytest.approx(4.0)  # EXPERTS / TOPK: one expert on every token
    full = expert_factors(_moe("moe:8:2:0.5"), 4, 8, np.random.default_rng(1))
    half = expert_factors(_moe("moe:8:2:0.5:0.5"), 4, 8, np.random.default_rng(1))
    assert half.tolist() == (0.5 + 0.5 * full).tolist()


@pytest.mark.parametrize("spec", ["moe:8:2:0", "moe:8:8:2"])
@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "bfw"])
def test_balanced_loads_leave_every_makespan_exactly_as_without_variability(spec: str, name: str) -> None:
    # SKEW 0: every expert gets 1/EXPERTS; TOPK = EXPERTS: every token goes to every expert. Either way each
    # factor is exactly 1 and every policy's makespan is the one without variability, to the last bit.
    hint = generate_hint(name, 4, 8)
    sim = Simulator(hint, CostModel.uniform(4))
    sample = Sample.draw(hint, sim.cost_model, [parse_variability(spec)], np.random.default_rng(3))
    assert np.array_equal(sample.costs, Sample.expected(hint, sim.cost_model).costs)
    for policy in Policy:
        assert sim.run(policy, sample).makespan == sim.run(policy).makespan, policy


def test_a_stages_tasks_share_their_micro_batchs_routing_and_sizes_stay_unknown() -> None:
    hint = generate_hint("zb-h1", 4, 8)
    sample = Sample.draw(hint, CostModel.uniform(4), [parse_variability("moe:8:2")], np.random.default_rng(0))
    costs = sample.costs  # [stage, mb, kind], F = B = W = 1 expected
    assert np.array_equal(costs[:, :, 0], costs[:, :, 1]) and np.array_equal(costs[:, :, 0], costs[:, :, 2])
    assert len(np.unique(costs[:, :, 0])) == 32  # a draw per stage and micro-batch
    assert sample.sizes is not None and sample.sizes.tolist() == [1.0] * 8


def test_a_seeded_moe_makespan_is_exact() -> None:
    hint = generate_hint("1f1b", 4, 8)
    sim = Simulator(hint, CostModel.uniform(4))
    sample = Sample.draw(hint, sim.cost_model, [parse_variability("moe:8:2")], np.random.default_rng(0))
    assert [sim.run(policy, sample).makespan for policy in Policy] == [70.2214764906973] * 3
    assert sim.run(Policy.FIXED).makespan == 33.0
