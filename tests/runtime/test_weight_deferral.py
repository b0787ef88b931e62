"""A split backward's weight gradients put off without a second pass (see [Note: weight gradients put off] in
hintpipe.runtime.loop.weight_deferral): B and W together give exactly the unsplit backward's gradients, B leaves
the linear layers' weights to W, and every kind of stage the runtime runs keeps its maths.

Tolerances: float32 gradients are compared exactly where the same operations run in the same order, else with
``assert_close(rtol=1e-5, atol=1e-6)`` (a weight gradient summed over rows by another matrix product); bf16
autocast at ``rtol=atol=1e-2`` (bf16 has 8 bits of mantissa).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch import nn
from torch.utils.checkpoint import checkpoint

from hintpipe.runtime.loop.executor import StageExecutor
from hintpipe.runtime.loop.weight_deferral import WeightDeferral, defer_linear_weights, restore_linear_weights


class _Tied(nn.Module):
    """An embedding whose weight the head shares, a block with a norm, a linear layer without bias, 3-D inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8, bias=False)
        self.head = nn.Linear(8, 11)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + hidden
        x = x + self.down(torch.relu(self.up(self.norm(x))))
        out: torch.Tensor = self.head(x)
        return out


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randint(0, 11, (2, 5)), torch.randn(2, 5, 8)


def _grads(model: nn.Module, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert hidden.grad is not None
    return out | {"<input>": hidden.grad.clone()}


def _unsplit(model: nn.Module) -> dict[str, torch.Tensor]:
    ids, hidden = _inputs()
    hidden.requires_grad_()
    model(ids, hidden).square().sum().backward()
    return _grads(model, hidden)


def _split(model: nn.Module) -> tuple[dict[str, torch.Tensor], set[str], int]:
    """B then W through a deferral: the gradients, the parameters B left without one, and the closures W ran."""
    deferred = defer_linear_weights(model)
    deferral, put_off = WeightDeferral(), list[Callable[[], None]]()
    ids, hidden = _inputs()
    hidden.requires_grad_()
    with deferral.active():
        loss = model(ids, hidden).square().sum()
    with deferral.collecting(put_off):
        loss.backward()
    left = {name for name, p in model.named_parameters() if p.grad is None}
    assert len(put_off) == deferred
    for weights in put_off:
        weights()
    return _grads(model, hidden), left, deferred


def _same_gradients(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rtol: float = 1e-5, atol: float = 1e-6
) -> None:
    """Every expected gradient in ``got``, within float32's tolerances by default (the module docstring's)."""
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=rtol, atol=atol, msg=name)


def test_b_and_w_give_the_unsplit_gradients_and_b_leaves_the_linear_weights_to_w() -> None:
    torch.manual_seed(0)
    model = _Tied()
    expected = _unsplit(copy.deepcopy(model))
    got, left, deferred = _split(model)
    assert deferred == 3
    # The tied weight has the embedding's gradient from B (and the head's from W): only its bias waits.
    assert left == {"up.weight", "up.bias", "down.weight", "head.bias"}
    assert got.keys() == expected.keys()
    _same_gradients(got, expected)


def test_a_graph_module_s_linear_calls_defer_as_layers_do() -> None:
    torch.manual_seed(0)
    model = _Tied()
    expected = _unsplit(copy.deepcopy(model))
    traced = fx.symbolic_trace(model)
    calls = [
        n for n in traced.graph.nodes if n.op == "call_module" and isinstance(traced.get_submodule(n.target), nn.Linear)
    ]
    assert len(calls) == 3  # symbolic tracing keeps nn.Linear as modules: their forward is patched
    got, _, deferred = _split(traced)
    assert deferred == 3
    _same_gradients(got, expected)


def test_an_exported_stage_s_aten_linear_calls_defer() -> None:
    torch.manual_seed(0)
    model = _Tied()
    expected = _unsplit(copy.deepcopy(model))
    ids, hidden = _inputs()
    exported = torch.export.export(copy.deepcopy(model), (ids, hidden)).module()
    linears = [n for n in exported.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert len(linears) == 3
    got, left, deferred = _split(exported)
    assert deferred == 3 and left == {"up.weight", "up.bias", "down.weight", "head.bias"}
    _same_gradients(got, expected)


class _Gpt2Like(nn.Module):
    """Hugging Face's ``Conv1D`` (GPT-2's linear layers: ``addmm`` of a weight stored in x out) beside a norm."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.embed = nn.Embedding(11, 8)
        self.norm = nn.LayerNorm(8)
        self.up, self.down = Conv1D(16, 8), Conv1D(8, 16)  # type: ignore[no-untyped-call]

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + hidden
        out: torch.Tensor = x + self.down(torch.tanh(self.up(self.norm(x))))
        return out


@pytest.mark.parametrize("exported", [False, True])
def test_hugging_face_s_conv1d_defers_as_a_layer_and_as_an_exported_addmm(exported: bool) -> None:
    torch.manual_seed(0)
    model: nn.Module = _Gpt2Like()
    expected = _unsplit(copy.deepcopy(model))
    if exported:
        graph_module = torch.export.export(copy.deepcopy(model), _inputs()).module()
        assert isinstance(graph_module, fx.GraphModule)
        assert sum(n.target is torch.ops.aten.addmm.default for n in graph_module.graph.nodes) == 2
        model = graph_module
    got, left, deferred = _split(model)
    assert deferred == 2 and left == {"up.weight", "up.bias", "down.weight", "down.bias"}
    _same_gradients(got, expected)


def test_a_recomputed_forward_builds_the_graph_its_first_forward_built() -> None:
    class Checkpointed(_Tied):
        def forward(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids) + hidden
            inner = checkpoint(lambda y: self.down(torch.relu(self.up(self.norm(y)))), x, use_reentrant=False)
            out: torch.Tensor = self.head(x + inner)
            return out

    torch.manual_seed(0)
    model = Checkpointed()
    expected = _unsplit(copy.deepcopy(model))
    got, left, _ = _split(model)
    assert left == {"up.weight", "up.bias", "down.weight", "head.bias"}
    _same_gradients(got, expected)


def test_under_autocast_the_weight_gradients_are_autocast_s_in_the_weight_s_dtype() -> None:
    torch.manual_seed(0)
    model = _Tied()
    reference = copy.deepcopy(model)
    ids, hidden = _inputs()
    hidden.requires_grad_()
    with torch.autocast("cpu", torch.bfloat16):
        loss = reference(ids, hidden).float().square().sum()
    loss.backward()
    expected = _grads(reference, hidden)
    defer_linear_weights(model)
    deferral, put_off = WeightDeferral(), list[Callable[[], None]]()
    ids, hidden = _inputs()
    hidden.requires_grad_()
    with deferral.active(), torch.autocast("cpu", torch.bfloat16):
        loss = model(ids, hidden).float().square().sum()
    with deferral.collecting(put_off):
        loss.backward()
    for weights in put_off:
        weights()
    got = _grads(model, hidden)
    for name, grad in expected.items():
        assert got[name].dtype == grad.dtype == torch.float32, name
        torch.testing.assert_close(got[name], grad, rtol=1e-2, atol=1e-2, msg=name)


def test_without_a_deferral_or_with_a_forward_of_its_own_a_layer_computes_as_before() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Linear(3, 4), Scaled(4, 2))
    assert defer_linear_weights(model) == 1  # the subclass keeps its own forward
    assert "forward" not in vars(model[1]) and "forward" in vars(model[0])
    assert defer_linear_weights(model) == 0  # once is enough
    x = torch.randn(5, 3)
    model(x).sum().backward()  # no deferral active: every gradient at once
    assert all(p.grad is not None for p in model.parameters())


def _stage_grads(split: bool) -> tuple[list[Any], dict[str, torch.Tensor], list[str]]:
    """One stage (not the last) run by the executor: F, then B with an output gradient, then W when split."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 4))
    executor = StageExecutor({1: module}, last_stage=2, loss_fn=lambda o, t: o.sum(), split_backward=split)
    x = torch.randn(3, 4, requires_grad=True)
    (out,), _ = executor.forward(1, 0, [x], None, 1.0)
    assert isinstance(out, torch.Tensor)
    (dx,) = executor.backward(1, 0, [torch.ones_like(out)])
    after_b = sorted(name for name, p in module.named_parameters() if p.grad is None)
    if split:
        executor.weight(1, 0)
    return [dx], {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}, after_b


def test_the_executor_s_split_backward_is_its_whole_backward_in_two_tasks() -> None:
    (whole_dx,), whole, none_left = _stage_grads(split=False)
    (split_dx,), split, left = _stage_grads(split=True)
    assert none_left == [] and left == ["0.bias", "0.weight", "3.bias", "3.weight"]
    torch.testing.assert_close(split_dx, whole_dx, rtol=0, atol=0)
    assert split.keys() == whole.keys()
    _same_gradients(split, whole)


@pytest.mark.parametrize("requires", [False, True])
def test_a_weight_without_a_gradient_is_left_alone(requires: bool) -> None:
    layer = nn.Linear(3, 2)
    layer.weight.requires_grad_(requires)
    defer_linear_weights(layer)
    deferral, put_off = WeightDeferral(), list[Callable[[], None]]()
    x = torch.randn(4, 3, requires_grad=True)
    with deferral.active():
        y = layer(x).sum()
    with deferral.collecting(put_off):
        y.backward()
    for weights in put_off:
        weights()
    assert len(put_off) == (1 if requires else 0)
    assert (layer.weight.grad is not None) == requires
    assert layer.bias.grad is not None and x.grad is not None


def test_the_first_stage_defers_nothing_and_its_w_is_its_whole_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage whose inputs need no gradient (the first: token ids, the data) runs its whole backward in W: its
    forward does not defer (each deferred layer's forward costs a Python ``Function``), and its gradients are the
    whole backward's."""
    import hintpipe.runtime.loop.weight_deferral as weight_deferral

    applied: list[str] = []
    real = weight_deferral._applied

    def counted(function: type[torch.autograd.Function], *args: Any) -> Any:
        applied.append(function.__name__)
        return real(function, *args)

    monkeypatch.setattr(weight_deferral, "_applied", counted)

    def first_stage(split: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        module = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        executor = StageExecutor({0: module}, last_stage=2, loss_fn=lambda o, t: o.sum(), split_backward=split)
        (out,), _ = executor.forward(0, 0, [torch.tensor([[1, 2, 6]])], None, 1.0)
        assert isinstance(out, torch.Tensor)
        assert executor.backward(0, 0, [torch.ones_like(out)]) == [None]
        if split:
            assert all(p.grad is None for p in module.parameters())  # all of it is W's
            executor.weight(0, 0)
        return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}

    whole, split = first_stage(False), first_stage(True)
    assert applied == []
    assert split.keys() == whole.keys() and len(whole) == 5
    _same_gradients(split, whole, rtol=0, atol=0)
    _stage_grads(split=True)  # a stage after the first: its two linear layers defer
    assert applied == ["_DeferredLinear", "_DeferredLinear"]


class _Functional(nn.Module):
    """Linear calls a trace records as calls (``F.linear``), not as layers."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, self.w1)), self.w2)


def test_restoring_gives_each_layer_and_graph_its_own_calls_back() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    traced = fx.symbolic_trace(_Functional())
    x = torch.randn(3, 4)
    before = module(x), traced(x)
    code = traced.code
    assert defer_linear_weights(module) == 2 and defer_linear_weights(traced) == 2
    assert traced.code != code and "deferrable_linear" in traced.code
    assert restore_linear_weights(module) == 2 and restore_linear_weights(traced) == 2
    assert all("forward" not in vars(m) for m in module.modules())
    assert traced.code == code
    torch.testing.assert_close(module(x), before[0], rtol=0, atol=0)
    torch.testing.assert_close(traced(x), before[1], rtol=0, atol=0)
    assert restore_linear_weights(module) == restore_linear_weights(traced) == 0  # nothing left to restore
