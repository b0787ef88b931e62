"""The planner: exact cuts against exhaustive search, errors, generated stages, accuracy."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from typing import Any

import numpy as np
import pytest
import torch
from test_buffer_updates import UPDATED, Tracked
from test_grad_regions import TRAINED as FROZEN_TRAINED
from test_grad_regions import Frozen
from torch import nn

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch
from hintpipe.device import DeviceClock, HostClock, ThreadClock, clock_for
from hintpipe.planner.capture import capture
from hintpipe.planner.capture_error import CaptureError, split_point
from hintpipe.planner.memory import MemoryModel, stage_cost
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.plan import Plan, node_tables, plan
from hintpipe.planner.profile import profile, signature
from hintpipe.planner.search import PlanError, search
from hintpipe.planner.stagegen import offload_hooks, resident
from hintpipe.planner.tables import NodeTables
from hintpipe.runtime.errors import OptionMismatch
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.tensor_bytes import count_saved, parameter_storages

# -- the search against exhaustive enumeration ------------------------------------------


def _exhaustive(tables: NodeTables, memory: MemoryModel, stages: int) -> tuple[float, list[tuple[int, ...]]]:
    """Every placement of the cuts: the best bottleneck and the cuts that reach it."""
    best, argbest = math.inf, []
    for inner in itertools.combinations(tables.allowed, stages - 1):
        cuts = (0, *inner, tables.size)
        costs = [stage_cost(tables, memory, s, cuts[s], cuts[s + 1]) for s in range(stages)]
        if not all(c.feasible for c in costs):
            continue
        bottleneck = max(c.time for c in costs)
        if bottleneck < best - 1e-12:
            best, argbest = bottleneck, [cuts]
        elif abs(bottleneck - best) <= 1e-12:
            argbest.append(cuts)
    return best, argbest


def _chain(rng: np.random.Generator, n: int) -> list[NodeProfile]:
    return [
        NodeProfile(
            name=f"n{i}",
            forward_s=float(rng.integers(1, 6)) * 1e-3,
            backward_s=float(rng.integers(1, 11)) * 1e-3,
            saved_bytes=0,
            param_bytes=int(rng.integers(0, 4)) * 1000,
            output_bytes=int(rng.choice([200, 500, 3000])),  # boundaries of different sizes: not monotone
            tensor_output=True,
            internal_bytes=int(rng.integers(0, 5)) * 1000,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", range(40))
def test_search_equals_exhaustive_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, stages = int(rng.integers(4, 10)), int(rng.integers(2, 4))
    tables = NodeTables.chain(_chain(rng, n))
    inflight = tuple(range(stages, 0, -1))
    for budget in (1e9, 30_000.0, 18_000.0, 12_000.0, 8_000.0):
        memory = MemoryModel(inflight=inflight, budgets=(budget,) * stages, optimizer_factor=2.0)
        best, argbest = _exhaustive(tables, memory, stages)
        if math.isinf(best):
            with pytest.raises(PlanError, match=r"stage \d cannot fit in its budget|no partition into"):
                search(tables, memory, stages)
            continue
        cuts = search(tables, memory, stages)
        got = max(stage_cost(tables, memory, s, cuts[s], cuts[s + 1]).time for s in range(stages))
        assert got == pytest.approx(best, rel=1e-9), (budget, cuts, argbest)
        assert cuts in argbest


class VirtualClock:
    """A clock that moves only when a :class:`SleepLayer` says it took time: profiles of known costs, exact."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> float:
        return self.seconds


CLOCK = VirtualClock()


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float, keep: int) -> torch.Tensor:
        CLOCK.seconds += forward_s
        ctx.backward_s = backward_s
        ctx.save_for_backward(torch.zeros(keep))
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        CLOCK.seconds += ctx.backward_s
        return grad, None, None, None


class SleepLayer(nn.Module):
    """Known costs: takes ``forward_ms`` / ``backward_ms`` on :data:`CLOCK`, keeps ``keep`` floats for backward."""

    def __init__(self, forward_ms: float, backward_ms: float, keep: int) -> None:
        super().__init__()
        self.costs = (forward_ms / 1e3, backward_ms / 1e3, keep)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Sleep.apply(x * self.scale, *self.costs)  # type: ignore[no-untyped-call]  # torch: Function.apply is untyped
        return out


def test_known_costs_give_exact_profiles_and_exact_cuts() -> None:
    costs = [(6, 6, 1000), (2, 2, 1000), (2, 2, 1000), (2, 2, 1000), (4, 4, 1000), (3, 3, 1000)]
    model = nn.Sequential(*(SleepLayer(*c) for c in costs))
    graph = capture(model, modules=[str(i) for i in range(len(costs))])
    profiles = profile(graph, (torch.zeros(10),), repeats=2, clock=CLOCK)
    for p, (f, b, keep) in zip(profiles, costs, strict=True):
        # Each node's time is its own, read on the clock the profiler is given (the device's, by default).
        assert (p.forward_s, p.backward_s) == pytest.approx((f / 1e3, b / 1e3), abs=1e-12)
        # The kept buffer alone: the layer's input (which x * scale saves) and its parameter are not its own.
        assert p.internal_bytes == keep * 4
    # Known costs in place of the measured times: F + B = 12, 4, 4, 4, 8, 6 ms.
    exact = [
        NodeProfile(p.name, f / 1e3, b / 1e3, p.saved_bytes, p.param_bytes, p.output_bytes, True, p.internal_bytes)
        for p, (f, b, _) in zip(profiles, costs, strict=True)
    ]
    tables = node_tables(exact, graph)
    memory = MemoryModel(inflight=(2, 1), budgets=(math.inf, math.inf))
    assert search(tables, memory, 2) == (0, 3, 6)  # 12 + 4 + 4 = 20 | 4 + 8 + 6 = 18: the only best split
    assert _exhaustive(tables, memory, 2)[1] == [(0, 3, 6)]
    memory3 = MemoryModel(inflight=(3, 2, 1), budgets=(math.inf,) * 3)
    assert search(tables, memory3, 3) == (0, 1, 4, 6)  # 12 | 4 + 4 + 4 | 8 + 6
    assert _exhaustive(tables, memory3, 3)[1] == [(0, 1, 4, 6)]


def _gpt(layers: int = 4, hidden: int = 32) -> tuple[nn.Module, ModelConfig]:
    config = ModelConfig("gpt-mini", layers=layers, hidden=hidden, heads=2, vocab=64, max_seq_len=130)
    return nn.Sequential(*build_layers(config)), config


def test_an_impossible_budget_names_the_stage_and_the_shortfall() -> None:
    model, config = _gpt()
    inputs, _, _ = make_batch(config, 1, 2, SeqLenDist(16), 0)
    message = (
        r"stage 1 cannot fit in its budget of 1KiB: where the cuts before it leave it, even with every saving "
        r"it needs [\d.]+KiB, ([\d,]+) bytes over"
    )
    with pytest.raises(PlanError, match=message) as info:
        plan(model, inputs[0], ranks=2, microbatches=4, stage_memory="1GiB,1KiB", repeats=1)
    # The smallest last stage, the LM head's output layer alone, holds its weights, gradients
    # and two optimizer states: 4x its parameter bytes, less the 1KiB budget, at the least.
    head = sum(p.numel() * 4 for n, p in model.named_parameters() if n.startswith("5.out"))
    over = int(info.value.args[0].split(" bytes over")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert over >= 4 * head - 1024


def _steady(profiles: tuple[NodeProfile, ...]) -> tuple[NodeProfile, ...]:
    """Measured bytes with times made up from them: cuts that do not depend on the machine's timing."""
    steady = []
    for p in profiles:
        forward = 1e-5 + 1e-10 * (p.output_bytes + p.param_bytes)
        steady.append(dataclasses.replace(p, forward_s=forward, backward_s=2 * forward))
    return tuple(steady)


def _steady_plan(model: nn.Module, example: Any, **options: Any) -> Plan:
    measured = plan(model, example, ranks=options["ranks"], microbatches=options["microbatches"], repeats=1)
    return plan(model, example, profiles=_steady(measured.profiles), **options)


def test_a_tight_budget_recomputes_and_fits_where_the_baselines_do_not() -> None:
    model, config = _gpt(layers=4, hidden=64)
    inputs, _, _ = make_batch(config, 1, 4, SeqLenDist(64), 0)
    ample = _steady_plan(model, inputs[0], ranks=2, microbatches=8)
    budget = 0.8 * max(s.memory_bytes for s in ample.baselines["time"].stages)
    tight = plan(model, inputs[0], ranks=2, microbatches=8, stage_memory=budget, profiles=ample.profiles)
    assert all(s.memory_bytes <= budget for s in tight.partition.stages)
    assert sum(len(s.recompute) for s in tight.partition.stages) > 0
    assert tight.partition.max_microbatch_size > tight.baselines["time"].max_microbatch_size
    # With an ample budget the plan is the time-balanced one.
    assert ample.partition.bottleneck_ms == pytest.approx(ample.baselines["time"].bottleneck_ms, rel=1e-9)


# -- capture ----------------------------------------------------------------------------------


class Skip(nn.Module):
    """A residual that crosses stage cuts, and split points."""

    def __init__(self, marked: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(6, 6) for _ in range(4))
        self.marked = marked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        if self.marked:
            h = split_point(h)
        g = torch.tanh(self.b(h))
        g = torch.tanh(self.c(g))
        if self.marked:
            g = split_point(g)
        out: torch.Tensor = self.d(g) + h  # h skips over b and c
        return out


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.mid = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.embed(ids))
        out: torch.Tensor = torch.nn.functional.linear(h, self.embed.weight)
        return out


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow
            x = x * 2
        out: torch.Tensor = self.second(self.first(x))
        return out


class Gated(nn.Module):
    """Two saved views of one storage, and a saved view of a saved output."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 48), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = self.up(x).chunk(3, dim=-1)  # mul saves two thirds: the whole 48-wide output stays
        gated = torch.tanh(a * b + c)  # tanh saves its output ...
        out: torch.Tensor = self.down(gated.reshape(-1, 16))  # ... and down saves a view of it again
        return out


def test_saved_bytes_are_counted_by_storage() -> None:
    model, x = Gated(), torch.randn(5, 8)
    graph = capture(model)
    tables = node_tables(profile(graph, [x], repeats=1), graph)
    # autograd keeps up's output (5 x 48 floats, once for both saved thirds) and tanh's output
    # (5 x 16, once for tanh and down); up also saves x, the stage's input, not counted here.
    # Counting views by their own size would give 5 x 16 for the first and count the second twice.
    assert tables.saved.sum() == 4 * (5 * 48 + 5 * 16)
    with count_saved(parameter_storages(model)) as counted:
        model(x)
    assert counted.total - x.numel() * 4 == tables.saved.sum()


def test_no_cut_falls_between_a_split_and_its_items() -> None:
    # Stages exchange flat tuples of tensors: the chunk's tuple may not cross a cut, its items may.
    graph = capture(Gated())
    tables = node_tables(profile(graph, [torch.randn(5, 8)], repeats=1), graph)
    names = [n.name for n in graph.nodes]
    chunk = names.index("chunk")
    items = [
        i for i, n in enumerate(graph.nodes) if n.op == "call_function" and n.args and n.args[0] is graph.nodes[chunk]
    ]
    assert len(items) == 3
    assert not set(range(chunk + 1, max(items) + 1)) & set(tables.allowed)
    assert max(items) + 1 in tables.allowed or max(items) + 1 == len(names)


def test_split_points_restrict_the_cuts() -> None:
    result = plan(Skip(marked=True), torch.randn(3, 6), ranks=3, microbatches=4, repeats=1)
    nodes = [n.name for n in result.graph.nodes]
    for cut in result.partition.cuts[1:-1]:
        assert nodes[cut - 1].startswith("split_point"), nodes[cut - 1]


def test_tied_weights_are_reported() -> None:
    result = plan(Tied(), torch.randint(0, 16, (2, 5)), ranks=2, microbatches=4, repeats=1)
    assert result.tied == (("embed.weight",),)


class SharedLinear(nn.Module):
    """Two distinct modules holding one ``nn.Linear``: a tie by identity, under two names."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(8, 8)
        self.first = nn.Sequential(shared, nn.Tanh())
        self.middle = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
        self.last = nn.Sequential(shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.last(self.middle(self.first(x)))
        return out


def test_a_module_shared_by_two_stages_is_tied_by_identity_under_every_name() -> None:
    result = plan(SharedLinear(), torch.randn(4, 8), ranks=2, microbatches=4, repeats=1)
    assert result.tied == (("first.0.bias", "last.0.bias"), ("first.0.weight", "last.0.weight"))


def test_stages_built_from_a_plan_hold_no_gradients_and_the_model_is_untouched() -> None:
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 6))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    planned = plan(model, torch.randn(8, 6), ranks=2, microbatches=4, repeats=1)
    for index in range(planned.stages):
        assert all(p.grad is None for p in planned.build_stage(index).parameters())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_untraceable_models_get_a_clear_error_and_a_fallback() -> None:
    with pytest.raises(CaptureError, match=r"torch.fx cannot trace Untraceable: .*pass modules=\[\.\.\.\]"):
        capture(Untraceable())
    graph = capture(Untraceable(), modules=["first", "second"])
    assert [n.target for n in graph.nodes] == ["first", "second"]
    with pytest.raises(CaptureError, match=r"no submodules named \['third'\]"):
        capture(Untraceable(), modules=["first", "third"])


def test_the_users_model_is_not_touched() -> None:
    model = Skip()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = plan(model, torch.randn(3, 6), ranks=2, microbatches=4, repeats=1)
    stage = result.build_stage(0)
    with torch.no_grad():
        for p in stage.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- generated stages through the runtime -------------------------------------------------------------


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _planned_worker(rank: int, world: int, cases: list[tuple[Plan, list[Any], list[Any], str]]) -> list[Any]:
    out = []
    for planned, xs, ys, loss in cases:
        pipe = Pipeline.from_plan(planned, loss_fn=lm_loss if loss == "lm" else _mse, policy="greedy", timeout=60)
        for module in pipe.modules.values():  # plans of one model share its parameters
            module.zero_grad(set_to_none=True)
        pipe.step(xs, ys)
        grads: dict[str, torch.Tensor | None] = {}
        buffers: dict[str, torch.Tensor] = {}
        for s in pipe.stages:
            for name, p in pipe.modules[s].named_parameters():
                grads[name] = p.grad.clone() if p.grad is not None else None
            buffers.update((name, b.clone()) for name, b in pipe.modules[s].named_buffers())
        reports = pipe.reports
        pipe.close()
        out.append((grads, reports[-1], pipe.parts.admission.strict, buffers))
    return out


def _reference_grads(model: nn.Module, xs: list[Any], ys: list[Any], loss: str) -> dict[str, torch.Tensor]:
    fn = lm_loss if loss == "lm" else _mse
    for x, y in zip(xs, ys, strict=True):
        torch.autograd.backward(fn(model(x), y) / len(xs))
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_planned_stages_train_like_the_unsplit_model() -> None:
    cases, references = [], []
    gpt, config = _gpt(layers=2, hidden=16)
    xs, ys, _ = make_batch(config, 4, 4, SeqLenDist(64, 0.5), 0)
    gpt_plan = _steady_plan(gpt, xs[0], ranks=2, microbatches=4)
    tight = 0.9 * max(s.memory_bytes for s in gpt_plan.partition.stages)
    gpt_tight = plan(gpt, xs[0], ranks=2, microbatches=4, stage_memory=tight, profiles=gpt_plan.profiles)
    assert sum(len(s.recompute) for s in gpt_tight.partition.stages) > 0
    for planned in (gpt_plan, gpt_tight):
        cases.append((planned, xs, ys, "lm"))
        references.append(_reference_grads(gpt, xs, ys, "lm"))
        gpt.zero_grad()
    mlp_config = ModelConfig("mlp", layers=4, hidden=8)
    mlp = nn.Sequential(*build_layers(mlp_config))
    mx, my, _ = make_batch(mlp_config, 4, 3, SeqLenDist(1), 0)
    mlp_plan = plan(mlp, mx[0], ranks=2, microbatches=4, repeats=1)
    for planned in (mlp_plan, _forced(mlp_plan, "recompute")):
        cases.append((planned, mx, my, "mse"))
        references.append(_reference_grads(mlp, mx, my, "mse"))
        mlp.zero_grad()
    skip = Skip()
    sx = [torch.randn(n, 6) for n in (32, 48, 16, 32)]
    sy = [torch.randn(n, 6) for n in (32, 48, 16, 32)]
    skip_plan = plan(skip, sx[0], ranks=2, microbatches=4, repeats=1)
    # Every node offloaded, or every node recomputed: the generated stages'
    # saved_tensors_hooks and checkpoint paths, whatever the budget would choose.
    offloaded = _forced(skip_plan, "offload")
    recomputed = _forced(skip_plan, "recompute")
    for planned in (skip_plan, offloaded, recomputed):
        cases.append((planned, sx, sy, "mse"))
        references.append(_reference_grads(skip, sx, sy, "mse"))
        skip.zero_grad()
    # A model that freezes projections in its code (torch.no_grad, a decorated tower), cut where the frozen
    # values cross to the next rank as values without a gradient ([Note: grad-mode regions]).
    frozen = Frozen()
    fx_ = [torch.randn(n, 6) for n in (5, 7, 3, 5)]
    fy = [torch.randn(n, 6) for n in (5, 7, 3, 5)]
    frozen_plan = plan(frozen, fx_[0], ranks=2, microbatches=4, repeats=1)
    cut = next(i for i, p in enumerate(frozen_plan.profiles) if p.module == "inp")
    nodes = len(frozen_plan.graph.nodes)
    cut_plan = dataclasses.replace(
        frozen_plan, partition=dataclasses.replace(frozen_plan.partition, cuts=(0, cut, nodes))
    )
    cases.append((cut_plan, fx_, fy, "mse"))
    references.append(_reference_grads(frozen, fx_, fy, "mse"))
    assert set(references[-1]) == FROZEN_TRAINED
    # A model that updates buffers in its forward (a batch norm, an average, a counter), as planned and with every
    # node recomputed: each rank's buffers as the unsplit model's after the same micro-batches in order ([Note:
    # buffers a forward updates]).
    torch.manual_seed(0)
    tracked, updated = Tracked(), {}
    tx = [torch.randn(n, 6) for n in (5, 7, 3, 5)]
    ty = [torch.randn(n, 6) for n in (5, 7, 3, 5)]
    tracked_plan = plan(tracked, tx[0], ranks=2, microbatches=4, repeats=1)
    for planned in (tracked_plan, _forced(tracked_plan, "recompute")):
        cases.append((planned, tx, ty, "mse"))
        before = copy.deepcopy(tracked)
        references.append(_reference_grads(before, tx, ty, "mse"))
        updated[len(cases) - 1] = {name: b for name, b in before.named_buffers() if name in UPDATED}
    results = run_ranks(_planned_worker, 2, cases, timeout=120)
    for i, buffers in updated.items():
        held = {name: b for rank_result in results for name, b in rank_result[i][3].items() if name in UPDATED}
        assert set(held) == UPDATED, i
        for name, value in buffers.items():
            torch.testing.assert_close(held[name], value, rtol=0, atol=0, msg=f"case {i}: {name}")
    for i, expected in enumerate(references):
        seen = set()
        for rank_result in results:
            grads, _, strict, _ = rank_result[i]
            assert not strict  # no room option given: the plan's room to run ahead, not a limit the user gave
            for name, grad in grads.items():  # stage modules keep the model's parameter names
                if name not in expected:  # what the model's code computes without a gradient
                    assert grad is None, name
                    continue
                assert grad is not None, name
                torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-6)
                seen.add(name)
        assert seen == set(expected)


def _forced(planned: Plan, action: str) -> Plan:
    stages = []
    for stage, (a, b) in zip(planned.partition.stages, itertools.pairwise(planned.partition.cuts), strict=True):
        names = tuple(n.name for n in planned.graph.nodes[a:b])
        forced = dataclasses.replace(stage, recompute=names) if action == "recompute" else stage
        stages.append(dataclasses.replace(forced, offload=names) if action == "offload" else forced)
    return dataclasses.replace(planned, partition=dataclasses.replace(planned.partition, stages=tuple(stages)))


def _accuracy_worker(rank: int, world: int, planned: Plan, xs: list[Any], ys: list[Any]) -> Any:
    pipe = Pipeline.from_plan(planned, loss_fn=lm_loss, policy="fixed", slack_microbatches=0, timeout=60)
    for _ in range(3):
        pipe.step(xs, ys)
    pipe.close()
    return pipe.reports


def test_predicted_memory_matches_a_real_run() -> None:
    # (Predicted against measured stage *time* is a timing question: see the planner benchmark.)
    model, config = _gpt(layers=4, hidden=128)
    xs, ys, _ = make_batch(config, 4, 4, SeqLenDist(128), 0)
    planned = plan(model, xs[0], ranks=2, microbatches=4, repeats=5)
    reports = run_ranks(_accuracy_worker, 2, planned, xs, ys, timeout=120)[0]
    last = reports[-1]
    for s, stage in enumerate(planned.partition.stages):
        # Peak live activations: in-flight micro-batches x planned bytes per micro-batch, counted
        # by storage as autograd keeps them (q, k and v: three views of one projection output).
        # The last stage's loss keeps a little the model graph does not have: 2%.
        predicted = stage.inflight * stage.activation_bytes
        assert last.peak_live_bytes[s] == pytest.approx(predicted, rel=0.02)


def _lm(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def _tied_worker(rank: int, world: int, planned: Plan, policy: str, steps: list[tuple[Any, Any]]) -> list[Any]:
    pipe = Pipeline.from_plan(planned, loss_fn=_lm, policy=policy, slack_microbatches=1 if policy == "ready" else 0)
    params = list({id(p): p for m in pipe.modules.values() for p in m.parameters()}.values())
    optimizer = torch.optim.AdamW(params, lr=0.05)
    states = []
    for xs, ys in steps:
        pipe.step(xs, ys)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        states.append({n: p.detach().clone() for m in pipe.modules.values() for n, p in m.named_parameters()})
    pipe.close()
    return states


@pytest.mark.parametrize("policy", ["fixed", "ready"])
def test_a_weight_tied_across_ranks_trains_like_the_unsplit_model(policy: str) -> None:
    torch.manual_seed(0)
    model = Tied()
    planned = plan(model, torch.randint(0, 16, (2, 5)), ranks=2, microbatches=4, repeats=1)
    assert planned.tied == (("embed.weight",),) and planned.tied_stages == ((0, 1),)
    g = torch.Generator().manual_seed(1)
    steps = []
    for _ in range(3):  # variable lengths per micro-batch
        ids = [torch.randint(0, 16, (2, n + 1), generator=g) for n in (3, 7, 5, 2)]
        steps.append(([x[:, :-1] for x in ids], [x[:, 1:] for x in ids]))
    results = run_ranks(_tied_worker, 2, planned, policy, steps, timeout=120)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.05)
    for step, (xs, ys) in enumerate(steps):
        for x, y in zip(xs, ys, strict=True):
            torch.autograd.backward(_lm(reference(x), y) / len(xs))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        expected = dict(reference.named_parameters())
        copies = [state[step]["embed.weight"] for state in results]
        torch.testing.assert_close(copies[0], copies[1], rtol=0, atol=0)  # the two copies stay one tensor
        for state in results:
            for name, value in state[step].items():
                torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6)


def _two_plans_worker(rank: int, world: int, plans: list[Plan], share: bool) -> str:
    mine = plans[rank].share() if share else plans[rank]
    try:
        pipe = Pipeline.from_plan(mine, loss_fn=_mse, microbatches=2)
    except OptionMismatch as exc:
        return str(exc)
    pipe.close()
    return f"cuts {mine.partition.cuts}"


def test_ranks_holding_different_plans_are_refused_and_a_shared_plan_is_one() -> None:
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 6))
    planned = plan(model, torch.randn(8, 6), ranks=2, microbatches=2, repeats=1)
    cuts = planned.partition.cuts
    other_cut = next(c for c in planned.graph.index.values() if 0 < c < cuts[-1] and c != cuts[1])
    other = dataclasses.replace(
        planned, partition=dataclasses.replace(planned.partition, cuts=(0, other_cut, cuts[-1]))
    )
    assert other.fingerprint != planned.fingerprint
    refused = run_ranks(_two_plans_worker, 2, [planned, other], False, timeout=60)
    assert refused[0].startswith("rank 0: ranks [1] hold another plan than this rank's (fingerprint ")
    assert refused[0].endswith("make the plan once and share it: plan.share(), or one plan file loaded on every rank")
    assert refused[1].startswith("rank 1: ranks [0] hold another plan")
    shared = run_ranks(_two_plans_worker, 2, [planned, other], True, timeout=60)
    assert shared == [f"cuts {cuts}"] * 2  # rank 0's plan on both


def test_a_device_clock_waits_for_the_device_before_each_reading() -> None:
    calls: list[str] = []
    clock = DeviceClock(lambda: calls.append("synchronize"))
    before = clock.now()
    after = clock.now()
    assert calls == ["synchronize", "synchronize"] and after >= before


def test_a_cpu_computing_in_one_thread_is_timed_by_that_threads_cpu_time() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        clock = clock_for(torch.device("cpu"))
        assert isinstance(clock, ThreadClock)
        began = clock.now()
        time.sleep(0.2)  # a thread paused (asleep, or by the scheduler) spends no CPU time
        assert clock.now() - began < 0.05
        torch.set_num_threads(2)
        assert isinstance(clock_for(torch.device("cpu")), HostClock)  # other threads' work: the wall clock
    finally:
        torch.set_num_threads(threads)


def test_the_profiler_waits_for_the_device_before_every_reading() -> None:
    # A clock that counts its waits for the device: every reading around a node's forward and backward waits.
    waits: list[str] = []
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    graph = capture(model)
    profiles = profile(graph, (torch.randn(2, 4),), repeats=2, clock=DeviceClock(lambda: waits.append("sync")))
    # Per node and run (a warm-up, 2 repeats): 2 readings each way; then the whole graph's runs that set the
    # scale ([Note: the profile's scale]): 2 readings each.
    assert len(waits) == len(profiles) * (2 + 1) * 4 + (2 + 1) * 2


def test_the_profile_cache_key_names_the_device() -> None:
    graph = capture(nn.Sequential(nn.Tanh(), nn.ReLU()))  # no parameters: the device is the input's
    here, there = (signature(graph, (torch.empty(2, 4, device=device),)) for device in ("cpu", "meta"))
    assert here != there
    assert here == signature(graph, (torch.zeros(2, 4),))  # the values do not matter: shapes and the device


def test_the_profile_cache_gives_back_what_it_kept_and_measures_again_over_a_torn_file(tmp_path: Any) -> None:
    # Read back, a profile equals the one kept (its tuple was a list before). A file that is not whole (a run
    # killed mid-write by an older build, or two runs writing one name at once) is measured again and replaced.
    graph = capture(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    example = (torch.randn(2, 4),)
    kept = profile(graph, example, repeats=1, cache_dir=tmp_path)
    (path,) = tmp_path.iterdir()
    assert profile(graph, example, repeats=1, cache_dir=tmp_path) == kept
    path.write_text(path.read_text()[:40])
    measured = profile(graph, example, repeats=1, cache_dir=tmp_path)
    assert [p.name for p in measured] == [p.name for p in kept]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert profile(graph, example, repeats=1, cache_dir=tmp_path) == measured


def test_offload_leaves_parameters_and_buffers_where_they_are() -> None:
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Tanh())
    x = torch.randn(5, 4, requires_grad=True)
    moved: list[torch.Tensor] = []

    def move_out(t: torch.Tensor) -> torch.Tensor:
        moved.append(t)
        return t.clone()  # a copy elsewhere: what backward gets back

    pack, unpack = offload_hooks(resident(layer), move_out, lambda copy: copy)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = layer(x)
    out.sum().backward()
    held = dict(layer.named_parameters()) | dict(layer.named_buffers())
    owned = {t.untyped_storage().data_ptr() for t in held.values()}
    assert moved and not any(t.untyped_storage().data_ptr() in owned for t in moved)  # no weight, no running mean
    assert any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in moved)  # the input went
    offloaded = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    x_grad = x.grad.clone() if x.grad is not None else None
    layer.zero_grad(set_to_none=True)
    x.grad = None
    layer(x).sum().backward()  # plain autograd: the same gradients
    assert all(torch.equal(offloaded[n], p.grad) for n, p in layer.named_parameters() if p.grad is not None)
    assert x_grad is not None and x.grad is not None and torch.equal(x_grad, x.grad)
