"""Grad-mode regions ([Note: grad-mode regions] in hintpipe.planner.regions): ``with torch.no_grad():`` inside a
model's ``forward`` (with a ``torch.enable_grad()`` block inside it, and ``@torch.no_grad()`` on a sub-module's
``forward``) is kept by both captures, so planned stages compute exactly the gradients the unsplit model does,
wherever the cut falls: none for what the model computed without them.

Before, both captures lost the region, and the stages trained the weights the model froze. Gradients are
compared exactly: the stages run the unsplit model's operations in its order.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
import torch
from torch import nn

from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.regions import regions_of


class Tower(nn.Module):
    """A sub-module whose ``forward`` never computes gradients (a frozen encoder's, a rotary table's)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.tanh(self.proj(x))
        return out


class Frozen(nn.Module):
    """A frozen projection under ``no_grad``, a trained one inside it under ``enable_grad``, a decorated tower."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(6, 6)
        self.tower = Tower()
        self.mid = nn.Linear(6, 6)
        self.inp = nn.Linear(6, 6)
        self.out = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            f = torch.relu(self.frozen(x))
            with torch.enable_grad():
                g = self.mid(f)
            f = f * 2
        h = self.inp(x) + f + g + self.tower(x)
        out: torch.Tensor = self.out(h)
        return out


class FrozenScaled(Frozen):
    """The same with a keyword input, which torch.fx does not trace: captured by torch.export."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return super().forward(x) * scale


#: What the unsplit model trains: the no_grad block's and the tower's projections are frozen by the code.
TRAINED = {"mid.weight", "mid.bias", "inp.weight", "inp.bias", "out.weight", "out.bias"}


def _x() -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module", params=["torch.fx", "torch.export"])
def planned(request: pytest.FixtureRequest) -> tuple[nn.Module, Plan]:
    """The model planned into 2 stages, the plan travelled as every rank gets it (pickled)."""
    torch.manual_seed(0)
    exported = request.param == "torch.export"
    model = FrozenScaled() if exported else Frozen()
    made = plan(model, _x(), ranks=2, microbatches=2, repeats=1, kwargs={"scale": 1.0} if exported else None)
    return model, pickle.loads(pickle.dumps(made))


def _gradients(module: nn.Module, run: Any) -> dict[str, torch.Tensor]:
    module.zero_grad(set_to_none=True)
    run().sum().backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return grads


def _staged(made: Plan, cut: int, recompute: bool = False) -> tuple[nn.Module, Any]:
    """The plan cut at ``cut`` (its second stage's nodes recomputed where ``recompute``), its two stages as one
    module, and a run of them one after the other on the example."""
    count = len(made.graph.nodes)
    partition = dataclasses.replace(made.partition, cuts=(0, cut, count))
    made = dataclasses.replace(made, partition=partition)
    if recompute:
        nodes = tuple(n.name for n in made.graph.nodes[cut:])
        second = dataclasses.replace(made.partition.stages[1], recompute=nodes)
        partition = dataclasses.replace(made.partition, stages=(made.partition.stages[0], second))
        made = dataclasses.replace(made, partition=partition)
    first, second_stage = made.build_stage(0), made.build_stage(1)

    def run() -> torch.Tensor:
        sent = first(_x())
        out: torch.Tensor = second_stage(*(sent if isinstance(sent, tuple) else (sent,)))
        return out

    both = nn.ModuleDict({"0": first, "1": second_stage})
    return both, run


def test_the_regions_are_in_the_captured_graph(planned: tuple[nn.Module, Plan]) -> None:
    _, made = planned
    inside = {p.module for p, n in zip(made.profiles, made.graph.nodes, strict=True) if regions_of(n)}
    outside = {p.module for p, n in zip(made.profiles, made.graph.nodes, strict=True) if not regions_of(n)}
    # the enable_grad block inside the no_grad one ends the region, as torch.export has it
    assert {"frozen", "tower.proj"} <= inside and {"mid", "inp", "out"} <= outside


def test_wherever_the_cut_falls_the_stages_train_what_the_model_trains(planned: tuple[nn.Module, Plan]) -> None:
    model, made = planned
    kwargs = {"scale": 1.0} if isinstance(model, FrozenScaled) else {}
    expected = _gradients(model, lambda: model(_x(), **kwargs))
    assert set(expected) == TRAINED
    for cut in range(1, len(made.graph.nodes)):
        both, run = _staged(made, cut)
        got = {name.split(".", 1)[1]: grad for name, grad in _gradients(both, run).items()}
        assert set(got) == TRAINED, cut
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, rtol=0, atol=0, msg=f"cut {cut}: {name}")


def test_a_recomputed_stage_recomputes_inside_its_regions(planned: tuple[nn.Module, Plan]) -> None:
    model, made = planned
    kwargs = {"scale": 1.0} if isinstance(model, FrozenScaled) else {}
    expected = _gradients(model, lambda: model(_x(), **kwargs))
    both, run = _staged(made, 1, recompute=True)  # all but the first node recomputed in backward
    got = {name.split(".", 1)[1]: grad for name, grad in _gradients(both, run).items()}
    assert set(got) == TRAINED
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=0, msg=name)


def test_a_plan_made_under_no_grad_keeps_the_same_regions(planned: tuple[nn.Module, Plan]) -> None:
    """Capture runs with gradients on, as a pipeline trains: planned under the caller's ``torch.no_grad()``, the
    model's blocks were no change of mode and were lost, and its ``enable_grad`` block became the region."""
    model, made = planned
    kwargs = {"scale": 1.0} if isinstance(model, FrozenScaled) else None
    with torch.no_grad():
        again = plan(model, _x(), ranks=2, microbatches=2, repeats=1, kwargs=kwargs)

    def inside(p: Plan) -> set[str]:
        return {prof.module for prof, n in zip(p.profiles, p.graph.nodes, strict=True) if regions_of(n)}

    assert inside(again) == inside(made) and "mid" not in inside(again)
