"""What a built stage's code names: any device at all is one too many ([Note: every form of a device] in
hintpipe.planner.portable). A stage follows ``.to(device)``; a device written into its code stays behind."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

#: What names a device in generated code: a ``torch.device``'s repr, the CPU as a string, CUDA in any form.
LITERALS = ("device(type=", "'cpu'", '"cpu"', "cuda")


def named_devices(module: nn.Module) -> list[str]:
    """Every place where the code of ``module`` or of a graph under it (a recompute or offload group) names a
    device: a literal in its code, or a ``torch.device`` among a node's arguments; empty when there is none."""
    found: list[str] = []
    for name, sub in module.named_modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        where = name or "the stage"
        found += [f"{where}: {literal!r} in its code" for literal in LITERALS if literal in sub.code]
        for node in sub.graph.nodes:
            found += [f"{where}: {node.name} passes {value!r}" for value in _constants(node) if _is_device(value)]
    return found


def _constants(node: fx.Node) -> list[Any]:
    """Every value among ``node``'s arguments, nested ones included."""
    values: list[Any] = []

    def keep(value: Any) -> Any:
        values.append(value)
        return value

    fx.node.map_aggregate((node.args, node.kwargs), keep)
    return values


def _is_device(value: Any) -> bool:
    return isinstance(value, torch.device)
