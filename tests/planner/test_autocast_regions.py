"""A ``with torch.autocast(...)`` region inside ``forward`` survives capture and planning ([Note: autocast
regions] in hintpipe.planner.regions): stages run under ``torch.autocast("cpu", torch.bfloat16)`` compute each
of the region's operations in the dtype the unsplit model computes it in, wherever the cuts fall.

The module computes an attention-like block in float32 inside ``autocast(enabled=False)``, with a bfloat16
region nested in it, between two projections that an outer autocast runs in bfloat16. Captured both ways
(torch.fx, and torch.export when a keyword input is given), the cut falls inside the float32 region, so the
second stage starts inside it and must enter it itself. The operations' order is the unsplit model's, so the
logits and the gradients are compared bit for bit, and the dtype of every matrix product and softmax too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hintpipe.planner.capture import capture
from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.plan_file import load_plan, save_plan
from hintpipe.planner.portable import FollowingOp
from hintpipe.planner.regions import regions_of
from stage_code import named_devices

#: The operations whose dtype the test follows: what an autocast casts, and a softmax.
WATCHED = ("aten.mm", "aten.addmm", "aten.bmm", "aten._softmax")


class Upcast(nn.Module):
    """Projections around a float32 region (``autocast(enabled=False)``) that holds a bfloat16 one."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        with torch.autocast("cpu", enabled=False):
            f = h.float()
            weights = (f @ f.transpose(0, 1)).softmax(-1)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                sharp = weights @ weights
            mixed = self.mid(sharp.float() @ f)
        out: torch.Tensor = self.out(mixed)
        return out


class UpcastScaled(Upcast):
    """The same with a keyword input, which torch.fx does not trace: captured by torch.export."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return super().forward(x) * scale


class _Dtypes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The dtype of every watched operation's result, in the order they ran."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if name in WATCHED:
            self.seen.append((name, out.dtype))
        return out


def _x() -> torch.Tensor:
    return torch.randn(6, 8, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module", params=["torch.fx", "torch.export"])
def planned(request: pytest.FixtureRequest) -> Iterator[tuple[nn.Module, Plan]]:
    """The module planned into 2 stages, the cut moved to the float32 region's ``mid`` projection; the
    captured graph travelled as every rank gets it (pickled)."""
    torch.manual_seed(0)
    exported = request.param == "torch.export"
    model = UpcastScaled() if exported else Upcast()
    kwargs = {"scale": 1.0} if exported else None
    made = plan(model, _x(), ranks=2, microbatches=2, repeats=1, kwargs=kwargs)
    made = pickle.loads(pickle.dumps(made))
    cut = next(i for i, p in enumerate(made.profiles) if p.module == "mid")
    partition = dataclasses.replace(made.partition, cuts=(0, cut, len(made.graph.nodes)))
    yield model, dataclasses.replace(made, partition=partition)


def _stages(made: Plan, x: torch.Tensor, recompute: tuple[str, ...] = ()) -> torch.Tensor:
    """The two stages run one after the other (the second stage's ``recompute`` nodes in a recompute group),
    the gradient flowing from the second into the first."""
    if recompute:
        second = dataclasses.replace(made.partition.stages[1], recompute=recompute)
        stages = (made.partition.stages[0], second)
        made = dataclasses.replace(made, partition=dataclasses.replace(made.partition, stages=stages))
    sent = made.build_stage(0)(x)
    out: torch.Tensor = made.build_stage(1)(*(sent if isinstance(sent, tuple) else (sent,)))
    return out


def _gradients(module: nn.Module, run: Any) -> dict[str, torch.Tensor]:
    """Each parameter's gradient of ``run()``'s sum under bf16 autocast, by name; ``module``'s left without."""
    module.zero_grad(set_to_none=True)
    with torch.autocast("cpu", torch.bfloat16):
        out = run()
    out.float().sum().backward()
    grads = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return grads


def test_the_cut_falls_inside_the_region_and_no_stage_names_a_device(planned: tuple[nn.Module, Plan]) -> None:
    _, made = planned
    cut = made.partition.cuts[1]
    assert regions_of(made.graph.nodes[cut - 1]) == regions_of(made.graph.nodes[cut]) == ("autocast.enter_0",)
    assert [named_devices(made.build_stage(i)) for i in range(2)] == [[], []]


def test_each_operation_has_the_unsplit_model_s_dtype_under_autocast(planned: tuple[nn.Module, Plan]) -> None:
    model, made = planned
    x = _x()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        with _Dtypes() as unsplit:
            expected = copy.deepcopy(model)(x)
        with _Dtypes() as staged:
            got = _stages(made, x)
    bf16, f32 = torch.bfloat16, torch.float32
    assert unsplit.seen == [
        ("aten.addmm", bf16),  # inp, under the outer autocast
        ("aten.mm", f32),  # f @ f.T, in the float32 region
        ("aten._softmax", f32),
        ("aten.mm", bf16),  # weights @ weights, in the nested bfloat16 region
        ("aten.mm", f32),  # sharp @ f
        ("aten.addmm", f32),  # mid: in the float32 region, in the second stage
        ("aten.addmm", bf16),  # out
    ]
    assert staged.seen == unsplit.seen
    assert got.dtype == expected.dtype == bf16
    assert torch.equal(got, expected)


def test_a_recompute_group_across_the_region_s_end_recomputes_inside_it(planned: tuple[nn.Module, Plan]) -> None:
    """The second stage's nodes in one recompute group, which starts inside the float32 region and ends after
    it: its forward and its recomputation in backward enter the region, so every gradient is the unsplit
    model's under the same autocast, bit for bit."""
    model, made = planned
    x = _x()
    expected = _gradients(model, lambda: model(x))
    names = tuple(n.name for n in made.graph.nodes[made.partition.cuts[1] :])
    assert regions_of(made.graph.nodes[made.partition.cuts[1]]) and not regions_of(made.graph.nodes[-1])
    grads = _gradients(made.graph.module, lambda: _stages(made, x, recompute=names))
    assert sorted(grads) == sorted(expected)
    assert all(torch.equal(grads[name], expected[name]) for name in expected)


def test_the_stages_run_on_meta(planned: tuple[nn.Module, Plan]) -> None:
    """A device without autocast (``meta``): a region runs its nodes as they are."""
    _, made = planned
    first, second = (copy.deepcopy(made.build_stage(i)).to("meta") for i in range(2))
    sent = first(_x().to("meta"))
    out = second(*(sent if isinstance(sent, tuple) else (sent,)))
    assert (out.device.type, out.shape) == ("meta", (6, 8))


def test_a_plan_file_keeps_the_region(planned: tuple[nn.Module, Plan], tmp_path: Path) -> None:
    """Loading a plan file captures the model again: the region is in the graph it checks, and in the stages."""
    model, made = planned
    loaded, _ = load_plan(save_plan(made, tmp_path / "upcast.plan"), model)
    assert loaded.graph.module.code == made.graph.module.code
    assert [regions_of(n) for n in loaded.graph.nodes] == [regions_of(n) for n in made.graph.nodes]
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(_stages(loaded, _x()), _stages(made, _x()))


class _Norm(nn.Module):
    """An RMS norm after a projection that casts back to its input's dtype, as Hugging Face's do; its keyword
    input makes torch.fx pass it to torch.export."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        hidden = self.proj(x)
        normed = hidden.float() * torch.rsqrt(hidden.float().pow(2).mean(-1, keepdim=True) + eps)
        out: torch.Tensor = self.weight * normed.to(hidden.dtype)
        return out


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_a_dtype_read_off_a_tensor_is_the_autocast_s(dtype: torch.dtype | None) -> None:
    """``normed.to(hidden.dtype)``, captured by torch.export on float32 as a cast to float32, casts to the
    autocast's dtype under one (bfloat16, and float16 too, which the capture never saw) and to float32 without
    ([Note: a dtype read off a tensor] in hintpipe.planner.autocast_dtypes): the model's own output, bit for bit."""
    torch.manual_seed(0)
    model = _Norm()
    graph = capture(model, example=(_x(),), kwargs={"eps": 1e-6})
    following = [m.autocast_dtype_at for m in graph.module.modules() if isinstance(m, FollowingOp)]
    assert following == [1]  # aten.to.dtype(normed, torch.float32): the dtype is its second argument
    region = torch.autocast("cpu", dtype) if dtype is not None else contextlib.nullcontext()
    with torch.no_grad(), region:
        expected, got = model(_x()), graph.module(_x())
    assert got.dtype == expected.dtype == torch.float32
    assert torch.equal(got, expected)
