"""In-place calls torch.fx records ([Note: in-place calls torch.fx records] in hintpipe.planner.inplace): a model
with ``nn.ReLU(inplace=True)``, ``F.relu(..., inplace=True)``, ``torch.relu_``, ``h.mul_(2)`` and a value
written twice plans, and wherever the cut falls its stages compute the unsplit model's output and gradients.

Before, profiling ran each node on leaves that require grad and autograd refused the first in-place call: ``a
leaf Variable that requires grad is being used in an in-place operation``, for any model with one
``nn.ReLU(inplace=True)``.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hintpipe.planner.capture import allowed_cuts, capture, value_uses
from hintpipe.planner.inplace import out_of_place_by_example
from hintpipe.planner.plan import Plan, plan


class InPlace(nn.Module):
    """Every form of in-place call torch.fx records, on values nothing else shares, and one it must keep."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(6, 6) for _ in range(4))
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.mul_(2)  # a method; the code goes on reading h
        h = self.act(h)  # a module's flag
        g = F.relu(self.b(h), inplace=True)  # a function's keyword
        g = F.dropout(g, 0.0, True, True)  # its flag given by position
        g = torch.relu_(self.c(g) + h)  # torch's own in-place function
        k = self.d(g)
        k.mul_(0.5).add_(1)  # written twice
        out: torch.Tensor = self.out(torch.tanh(k) + g)
        return out


def _x() -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(4))


def test_every_in_place_call_on_an_unshared_value_is_replaced() -> None:
    model = InPlace()
    captured = capture(model, example=(_x(),))
    nodes = captured.module.graph.nodes
    assert [str(n.target) for n in nodes if n.op == "call_method"] == ["mul", "mul", "add"]
    assert not [n for n in nodes if n.kwargs.get("inplace") or getattr(n.target, "__name__", "").endswith("_")]
    assert not captured.module.get_submodule("act").inplace and model.act.inplace  # the user's model untouched
    torch.testing.assert_close(captured.module(_x()), model(_x()), rtol=0, atol=0)


def test_a_value_another_shares_keeps_its_in_place_call() -> None:
    """``v`` is a view of ``h`` read after ``h`` is written: the write must stay, or ``v`` would read the old
    values."""

    class Viewed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            v = h.view(-1)
            h.mul_(2)
            out: torch.Tensor = v.sum() + h.sum()
            return out

    traced = torch.fx.symbolic_trace(Viewed())
    assert out_of_place_by_example(traced, (_x(),)) == 0
    assert "mul_" in traced.code


def _staged(made: Plan, cut: int) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    """The plan cut at ``cut``, its two stages as one module, and a forward and backward through them as the
    runtime runs them (the second stage's inputs received as leaves, their gradients sent back)."""
    made = dataclasses.replace(
        made, partition=dataclasses.replace(made.partition, cuts=(0, cut, len(made.graph.nodes)))
    )
    made = pickle.loads(pickle.dumps(made))
    first, second = made.build_stage(0), made.build_stage(1)

    def run() -> torch.Tensor:
        sent = first(_x())
        sent = sent if isinstance(sent, tuple) else (sent,)
        received = [t.detach().requires_grad_(t.is_floating_point()) for t in sent]  # as a stage receives them
        out: torch.Tensor = second(*received)
        torch.autograd.backward([out], [torch.ones_like(out)])
        back = [(t, r.grad) for t, r in zip(sent, received, strict=True) if r.grad is not None]
        torch.autograd.backward([t for t, _ in back], [g for _, g in back])
        return out.detach()

    return nn.ModuleDict({"0": first, "1": second}), run


def test_wherever_the_cut_falls_the_stages_compute_the_model() -> None:
    torch.manual_seed(0)
    model = InPlace()
    made = plan(model, _x(), ranks=2, microbatches=2, repeats=1)
    expected_out = model(_x())
    expected_out.sum().backward()
    expected = {name: p.grad for name, p in model.named_parameters()}
    cuts = allowed_cuts(made.graph, value_uses(made.graph, made.profiles))
    assert len(cuts) == len(made.graph.nodes) - 1  # every cut is allowed
    for cut in cuts:
        both, run = _staged(made, cut)
        out = run()
        torch.testing.assert_close(out, expected_out, rtol=0, atol=0, msg=f"cut {cut}")
        got = {name.split(".", 1)[1]: p.grad for name, p in both.named_parameters() if p.grad is not None}
        assert set(got) == set(expected), cut
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, rtol=0, atol=0, msg=f"cut {cut}: {name}")
