"""Dtypes torch.export fixed on a float32 example that an autocast would have made its own.

[Note: a dtype read off a tensor]
torch.export records ``x.to(y.dtype)`` with the dtype ``y`` had on the example: ``aten.to.dtype(x,
torch.float32)``. Under an autocast ``y`` may be bfloat16 (a projection's output), and the model's ``forward``
rounds ``x`` to bfloat16 there, where the graph casts to float32 and rounds nothing: Qwen3's query and key norms
(``hidden.to(input_dtype)``), Gemma-2's norms after attention and MLP (``.type_as(x)``), Qwen2-MoE's router
weights (``.to(router_logits.dtype)``) computed otherwise than their models did under ``--precision bf16``.

So a model torch.export captures is exported twice, the second time under ``torch.autocast(device,
torch.bfloat16)``. The two graphs have the same operations in the same order (export records them above the
autocast, which changes only the dtypes the model's code reads off tensors); where a dtype argument is bfloat16
in the second and another in the first, the model read it off a tensor the autocast made bfloat16. That argument
becomes a :class:`~hintpipe.planner.portable.FollowingOp`'s ``autocast_dtype_at``: at run time, under an
autocast on the stage's device, the autocast's dtype (bfloat16, or float16 under a float16 autocast), else the
dtype captured (float32 inside an ``enabled=False`` region too). Where the two graphs differ otherwise (code that
branches on a dtype), or the second export fails, the first graph is kept as it is.

A caller that will train in float32 alone says so (``plan(..., autocast=False)``; ``hintpipe train`` does
where ``--precision`` is fp32): the model is exported once, in half the time, and each stage refuses to run
under an autocast (:class:`Float32Only`), where its graph would round otherwise than the model.

Also dropped: torch.export's check, before each ``x.to(...)``, that ``x`` has the dtype it had on the example
(``_assert_tensor_metadata(x, dtype=torch.float32)``): under an autocast it has another, and the unsplit model
goes on where such a check stopped (Qwen3, Gemma-2 and Mixtral: "Tensor dtype mismatch! Expected: Float, Got:
BFloat16"). It computes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.portable import CONTAINER, FollowingOp, Method


class Float32Only:
    """A forward pre-hook of each stage of a plan captured for float32 alone (``plan(..., autocast=False)``): it
    refuses to run under an autocast, where the graph would keep the dtypes the example had and compute otherwise
    than the model (a class, not a closure: a stage pickles with its hooks)."""

    def __init__(self, stage: int) -> None:
        self.stage = stage

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if tensor is None:
            tensor = next(iter(module.parameters()), None)
        device = tensor.device.type if tensor is not None else "cpu"
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
            raise ValueError(
                f"stage {self.stage} of this plan was captured for float32 alone (autocast=False), and runs under "
                f"an autocast to {str(torch.get_autocast_dtype(device)).removeprefix('torch.')}: plan with "
                "autocast=True to train with precision bf16"
            )


def asserts_a_dtype(node: fx.Node) -> bool:
    """Whether ``node`` is torch.export's check that a tensor has the dtype it had on the example."""
    return node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default


def follow_autocast_dtypes(module: fx.GraphModule, export: Callable[[], fx.GraphModule]) -> int:
    """Make, in place, every dtype argument of ``module``'s graph that ``export()`` (the same capture) records
    as bfloat16 under a bfloat16 autocast, and ``module`` as another dtype, follow the autocast a stage runs
    under ([Note: a dtype read off a tensor]); the number of arguments."""
    device = next((t.device.type for t in [*module.parameters(), *module.buffers()]), "cpu")
    if not torch.amp.is_autocast_available(device):
        return 0
    try:
        with torch.autocast(device, torch.bfloat16):
            under = export()
    except Exception:  # the model refuses an autocast at capture: its graph stays as captured
        return 0
    mine = [n for n in module.graph.nodes]
    theirs = [n for n in under.graph.nodes]
    if [(n.op, str(n.target)) for n in mine] != [(n.op, str(n.target)) for n in theirs]:
        return 0
    found = 0
    counterpart = dict(zip(theirs, mine, strict=True))
    for node, other in zip(mine, theirs, strict=True):
        found += _rewired(node, other, counterpart)
        at = _autocast_dtype_at(node, other)
        if at is not None:
            _follow(module, node, at)
            found += 1
    if found:
        module.graph.lint()
        module.recompile()
    return found


def _rewired(node: fx.Node, other: fx.Node, counterpart: dict[fx.Node, fx.Node]) -> int:
    """Where ``node`` reads a conversion of a value to float32 and ``other`` (the same call under the autocast)
    the value itself, ``node`` made to read the value; the number of arguments. On the float32 example the
    conversion returned its input (the same tensor), so export recorded any later use of the input as a use of
    the conversion (Gemma-2's ``out.type_as(x)`` after ``x.float()``): the same value without an autocast, the
    conversion's float32 under one, where ``forward`` reads ``x``'s bfloat16."""
    swaps = {}
    for mine, theirs in zip(node.all_input_nodes, other.all_input_nodes, strict=False):
        value = counterpart.get(theirs)
        if value is not None and mine is not value and _converts(mine) and mine.args[0] is value:
            swaps[mine] = value
    for mine, value in swaps.items():
        node.replace_input_with(mine, value)
    return len(swaps)


def _converts(node: fx.Node) -> bool:
    """Whether ``node`` converts a value (its first argument) to another dtype."""
    return node.op == "call_function" and node.target in (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default)


def _autocast_dtype_at(node: fx.Node, other: fx.Node) -> int | str | None:
    """Where ``node`` passes a dtype that ``other`` (the same call, captured under a bfloat16 autocast) passes
    as bfloat16: a position or a keyword; None where there is none."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return None
    places: list[tuple[int | str, Any, Any]] = list(zip(range(len(node.args)), node.args, other.args, strict=False))
    places += [(k, v, other.kwargs.get(k)) for k, v in node.kwargs.items()]
    return next(
        (at for at, mine, theirs in places if isinstance(mine, torch.dtype) and mine != theirs == torch.bfloat16),
        None,
    )


def _follow(module: fx.GraphModule, node: fx.Node, at: int | str) -> None:
    """``node``'s dtype at ``at`` made to follow the autocast: set on its :class:`FollowingOp`, or its call made
    one."""
    if node.op == "call_module":
        following = module.get_submodule(str(node.target))
        assert isinstance(following, FollowingOp)
        if isinstance(at, int) and isinstance(following.device_at, int) and at >= following.device_at:
            at += 1  # positions of the call as the model made it: the device goes back in first
        following.autocast_dtype_at = at
        return
    where = next((t.device for t in [*module.parameters(), *module.buffers()]), torch.device("cpu"))
    if not hasattr(module, CONTAINER):
        module.add_module(CONTAINER, nn.Module())
    container = module.get_submodule(CONTAINER)
    target = node.target if node.op == "call_function" else Method(str(node.target))
    child = f"{node.name}_" if hasattr(container, node.name) else node.name  # ``to`` is nn.Module's own
    container.add_module(child, FollowingOp(target, None, None, None, autocast_dtype_at=at).to(where))
    node.op, node.target = "call_module", f"{CONTAINER}.{child}"
