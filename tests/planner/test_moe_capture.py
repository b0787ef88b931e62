"""Mixture-of-experts models plan into stages that compute what the model computes, wherever the cut falls.

Hugging Face MoE layers route each token to its top-k experts, and two things in that routing broke a plan.
Mixtral's router normalises its top-k weights in place (``weights /= weights.sum(-1, keepdim=True)``), which
torch.export keeps as ``aten.div_``; the profile runs each node on leaves that require grad, so planning
failed with "a leaf Variable that requires grad is being used in an in-place operation" (and a stage cut
between ``topk`` and ``div_`` failed the same way in a pipeline). The experts count their tokens with
``histc`` (floating point, no gradient) and then ``cumsum(..., dtype=int32)``, which refuses an input that
requires grad: Qwen2-MoE and Qwen3-MoE failed with "Autograd not support dtype: Int" in the profile, and
so did a stage cut between the two. Tiny models from configs (no download), in float32 on the CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx
import transformers
from torch import nn

from conftest import allow
from hintpipe.planner.inplace import out_of_place
from hintpipe.planner.op_libraries import op_libraries
from hintpipe.planner.plan import Plan, node_tables, plan
from hintpipe.runtime.loop.executor import as_input
from hintpipe.runtime.transport.wire import Value

VOCAB = 64
KWARGS = {"use_cache": False}
COMMON: dict[str, Any] = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB,
    max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0, num_experts_per_tok=2,
)  # fmt: skip


def _mixtral() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(intermediate_size=64, num_local_experts=4, **COMMON)
    model: nn.Module = transformers.MixtralForCausalLM(config)
    return model


def _qwen2_moe() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(
        intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=4,
        norm_topk_prob=True, **COMMON,
    )  # fmt: skip
    model: nn.Module = transformers.Qwen2MoeForCausalLM(config)
    return model


def _qwen3_moe() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        intermediate_size=64, moe_intermediate_size=16, num_experts=4, norm_topk_prob=True, **COMMON
    )
    model: nn.Module = transformers.Qwen3MoeForCausalLM(config)
    return model


MODELS: dict[str, Callable[[], nn.Module]] = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe}


_PLANS: dict[str, tuple[nn.Module, Plan]] = {}


def _planned(name: str) -> tuple[nn.Module, Plan]:
    """The model and its plan into 2 stages, profiled for real (the profile is where planning failed); made
    once per model for the whole file."""
    if name not in _PLANS:
        model = MODELS[name]()
        ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
        _PLANS[name] = model, plan(model, ids, ranks=2, microbatches=2, repeats=1, kwargs=KWARGS)
    return _PLANS[name]


@pytest.fixture(params=sorted(MODELS))
def planned(request: pytest.FixtureRequest) -> tuple[nn.Module, Plan]:
    return _planned(request.param)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of another length than the plan's example, and the labels of a language-model loss."""
    generator = torch.Generator().manual_seed(2)
    return torch.randint(0, VOCAB, (2, 12), generator=generator), torch.randint(0, VOCAB, (2, 12), generator=generator)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _pipelined(stages: list[nn.Module], ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The logits of ``stages`` run one after another as a pipeline runs them: each stage receives its inputs
    as leaves (:func:`as_input`), and backward goes from the loss through the last stage, then into each earlier
    stage with the gradients its successor's leaves received (a number sent on, the sequence length, has none)."""
    sent: list[tuple[tuple[Value, ...], tuple[Value, ...]]] = []
    values: tuple[Value, ...] = (ids,)
    for k, stage in enumerate(stages):
        if k:
            leaves = tuple(as_input(v) for v in values)
            sent.append((values, leaves))
            values = leaves
        out = stage(*values)
        values = out if isinstance(out, tuple) else (out,)
    (logits,) = values
    assert isinstance(logits, torch.Tensor)
    if torch.is_grad_enabled():
        torch.autograd.backward(_loss(logits, labels))
        for outputs, leaves in reversed(sent):
            # What the runtime sends back: the gradient of each value that needs one (not rotary cos/sin).
            pairs = [
                (o, leaf.grad)
                for o, leaf in zip(outputs, leaves, strict=True)
                if isinstance(o, torch.Tensor)
                and isinstance(leaf, torch.Tensor)
                and o.requires_grad
                and leaf.grad is not None
            ]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return logits


def _expected(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """The whole model's eval-mode logits, and its train-mode gradients by parameter name."""
    reference = copy.deepcopy(model).eval()
    with torch.no_grad():
        logits = reference(ids, **KWARGS).logits
    reference.train()
    torch.autograd.backward(_loss(reference(ids, **KWARGS).logits, labels))
    return logits, {name: p.grad for name, p in reference.named_parameters()}


def _prefixed(text: str) -> Callable[[str], str]:
    """An ``assert_close`` message: torch's own, after ``text``."""
    return lambda message: f"{text}: {message}"


def _check(planned: Plan, stages: list[nn.Module], model: nn.Module, where: str) -> None:
    ids, labels = _batch()
    logits, grads = _expected(model, ids, labels)
    for stage in stages:
        stage.eval()
    with torch.no_grad():
        got = _pipelined(stages, ids, labels)
    # The routing picks the same experts; within one float32 rounding (the captured experts multiply each
    # expert's tokens on its own, the model may group them), 0 apart in this torch.
    torch.testing.assert_close(got, logits, rtol=0, atol=1e-6, msg=_prefixed(f"{where}, logits"))
    planned.graph.module.zero_grad(set_to_none=True)  # the stages hold the plan's own parameters
    for stage in stages:
        stage.train()  # no dropout in these configs: train mode computes what eval mode does, with gradients
    _pipelined(stages, ids, labels)
    held = {name: p.grad for stage in stages for name, p in stage.named_parameters()}
    assert sorted(held) == sorted(grads), where  # every parameter, under the model's own name
    for name, grad in grads.items():
        assert grad is not None and held[name] is not None, (where, name)
        torch.testing.assert_close(held[name], grad, rtol=1e-5, atol=1e-8, msg=_prefixed(f"{where}, {name}"))


def test_two_planned_stages_give_the_model_s_logits_and_gradients(planned: tuple[nn.Module, Plan]) -> None:
    model, made = planned
    assert made.stages == 2
    _check(made, [made.build_stage(i) for i in range(2)], model, f"cuts {made.partition.cuts}")


def _cut_at(made: Plan, cut: int) -> Plan:
    """``made`` with its one inner cut at ``cut`` (nothing recomputed or offloaded, as planned here)."""
    assert all(not s.recompute and not s.offload for s in made.partition.stages)
    cuts = (0, cut, len(made.graph.nodes))
    return dataclasses.replace(made, partition=dataclasses.replace(made.partition, cuts=cuts))


def test_every_cut_through_the_routing_of_an_expert_layer(planned: tuple[nn.Module, Plan]) -> None:
    """Every cut the planner may choose from the first MoE layer's router to its experts' token counts: those
    that the top-k weights cross before their normalisation (in place in the model's code), and the one that
    the token counts cross before ``cumsum`` to int32, among them."""
    model, made = planned
    graph, profiles = made.graph, made.profiles
    layer = [i for i, p in enumerate(profiles) if p.module.startswith("model.layers.0.mlp")]
    names = [n.name for n in graph.nodes]
    first = {prefix: next(i for i in layer if names[i].startswith(prefix)) for prefix in ("topk", "div", "histc")}
    cumsum = next(i for i in layer if names[i].startswith("cumsum"))
    cuts = [c for c in node_tables(profiles, graph).allowed if first["topk"] < c <= cumsum]
    assert {first["div"] - 1, first["div"], first["histc"] + 1} <= set(cuts), cuts
    assert names[first["div"]] == "div_tensor"  # out of place: ``div__tensor`` in the exported graph
    assert first["histc"] in graph.gradient_free  # no gradient flows into the token counts: a stage detaches them
    for cut in cuts:
        moved = _cut_at(made, cut)
        _check(made, [moved.build_stage(i) for i in range(2)], model, f"cut before {names[cut]}")


def test_the_experts_operator_names_the_module_that_defines_it(planned: tuple[nn.Module, Plan]) -> None:
    _, made = planned
    assert op_libraries(made.graph.module).modules == ("transformers.integrations.moe",)


def test_a_pickled_plan_runs_where_transformers_moe_code_was_never_imported(tmp_path: Path) -> None:
    """The experts capture as transformers' custom operator ``grouped_mm_fallback``; a rank that only receives
    the plan (a fresh interpreter here) imports the module that defines it as the plan unpickles, and its stages
    give the model's logits."""
    model, made = _planned("mixtral")
    ids, _ = _batch()
    with torch.no_grad():
        expected = copy.deepcopy(model).eval()(ids, **KWARGS).logits
    (tmp_path / "plan.pkl").write_bytes(pickle.dumps(made))
    torch.save({"ids": ids, "logits": expected}, tmp_path / "io.pt")
    script = f"""
import pickle, sys, torch
assert "transformers.integrations.moe" not in sys.modules
made = pickle.loads(open({str(tmp_path / "plan.pkl")!r}, "rb").read())
io = torch.load({str(tmp_path / "io.pt")!r})
stages = [made.build_stage(i).eval() for i in range(made.stages)]
with torch.no_grad():
    values = (io["ids"],)
    for stage in stages:
        out = stage(*values)
        values = out if isinstance(out, tuple) else (out,)
torch.testing.assert_close(values[0], io["logits"], rtol=0, atol=1e-6)
print("same logits")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=allow(120))
    assert done.returncode == 0 and done.stdout.strip() == "same logits", done.stderr[-2000:]


aten = torch.ops.aten


def _graph(build: Callable[[fx.Graph, fx.Node, fx.Node], Any]) -> fx.GraphModule:
    """A graph of aten calls on an input ``x`` and a buffer ``state`` (what torch.export records)."""
    root = nn.Module()
    root.register_buffer("state", torch.zeros(4))
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x, graph.get_attr("state")))
    return fx.GraphModule(root, graph)


def _flat(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _targets(module: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in module.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def _fresh_then_read_before(g: fx.Graph, x: fx.Node, state: fx.Node) -> Any:
    e = g.call_function(aten.exp.default, (x,))
    total = g.call_function(aten.sum.dim_IntList, (e, [-1], True))
    return g.call_function(aten.div_.Tensor, (e, total))


def _chain_on_a_tuple_item(g: fx.Graph, x: fx.Node, state: fx.Node) -> Any:
    top = g.call_function(aten.topk.default, (x, 2))
    values = g.call_function(operator.getitem, (top, 0))
    added = g.call_function(aten.add_.Tensor, (values, 1.0))
    return g.call_function(aten.mul_.Tensor, (added, 3.0))


def _view_read_after(g: fx.Graph, x: fx.Node, state: fx.Node) -> Any:
    e = g.call_function(aten.exp.default, (x,))
    flat = g.call_function(aten.view.default, (e, [-1]))
    added = g.call_function(aten.add_.Tensor, (e, 1.0))
    return (added, flat)  # the view sees the write: it must stay one


def _write_into_a_view(g: fx.Graph, x: fx.Node, state: fx.Node) -> Any:
    e = g.call_function(aten.exp.default, (x,))
    flat = g.call_function(aten.view.default, (e, [-1]))
    g.call_function(aten.add_.Tensor, (flat, 1.0))
    return e  # written through the view


def _input_and_buffer(g: fx.Graph, x: fx.Node, state: fx.Node) -> Any:
    doubled = g.call_function(aten.mul_.Tensor, (x, 2.0))  # the caller's tensor
    g.call_function(aten.add_.Tensor, (state, 1.0))  # a running statistic
    return doubled


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (_fresh_then_read_before, ["aten.exp.default", "aten.sum.dim_IntList", "aten.div.Tensor"]),
        (_chain_on_a_tuple_item, ["aten.topk.default", "aten.add.Tensor", "aten.mul.Tensor"]),
        (_view_read_after, ["aten.exp.default", "aten.view.default", "aten.add_.Tensor"]),
        (_write_into_a_view, ["aten.exp.default", "aten.view.default", "aten.add_.Tensor"]),
        (_input_and_buffer, ["aten.mul_.Tensor", "aten.add_.Tensor"]),
    ],
)
def test_in_place_calls_become_out_of_place_only_where_no_one_sees_the_write(
    build: Callable[[fx.Graph, fx.Node, fx.Node], Any], expected: list[str]
) -> None:
    before, after = _graph(build), _graph(build)
    replaced = out_of_place(after)
    assert _targets(after) == expected
    assert replaced == sum(a != b for a, b in zip(_targets(before), expected, strict=True))
    x = torch.randn(3, 4)
    want, got = before(x.clone()), after(x.clone())
    for w, g in zip(_flat(want), _flat(got), strict=True):
        assert torch.equal(w, g)
    assert torch.equal(before.get_buffer("state"), after.get_buffer("state"))
