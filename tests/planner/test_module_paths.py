"""Each captured node's module path (:mod:`hintpipe.planner.module_paths`): the innermost module whose code made
it, what a plan names a stage by, carried across the re-trace that keeps no metadata."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.module_paths import MODULE_PATH, carry_module_paths, module_path


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(torch.relu(self.attn(x)))
        return out


def _graph() -> fx.GraphModule:
    return fx.symbolic_trace(nn.Sequential(Block(), nn.Tanh()))


def _nodes(graph: fx.GraphModule) -> dict[str, fx.Node]:
    return {node.name: node for node in graph.graph.nodes}


def test_a_modules_call_is_its_path_and_an_operation_the_module_whose_code_made_it() -> None:
    nodes = _nodes(_graph())
    assert [module_path(nodes[name]) for name in ("input_1", "_0_attn", "relu", "_0_mlp", "_1")] == [
        "",  # the model's input: no module's
        "0.attn",
        "0",  # Block's own forward calls relu
        "0.mlp",
        "1",
    ]


def test_the_innermost_module_of_a_nodes_stack_is_its_path_and_a_kept_path_wins() -> None:
    relu = _nodes(_graph())["relu"]
    relu.meta["nn_module_stack"] = {"a": ("model", nn.Module), "b": ("model.block.0", Block)}
    assert module_path(relu) == "model.block.0"
    relu.meta["nn_module_stack"] = {"a": ("_export_root", nn.Module)}  # export's placeholder: no module
    assert module_path(relu) == ""
    relu.meta[MODULE_PATH] = "kept.path"
    assert module_path(relu) == "kept.path"


def test_paths_are_carried_to_the_next_call_of_the_same_target_in_order() -> None:
    retraced = _graph()
    exported = [
        ("call_module", "0.attn", "model.h.0.attn"),
        ("call_function", str(torch.relu), "model.h.0"),
        ("call_function", "ran_at_trace_time", "model.h.0"),  # gone from the re-trace: skipped
        ("call_module", "0.mlp", "model.h.0.mlp"),
        ("call_module", "1", "model.act"),
    ]
    carry_module_paths(exported, retraced)
    nodes = _nodes(retraced)
    assert [nodes[name].meta.get(MODULE_PATH) for name in ("input_1", "_0_attn", "relu", "_0_mlp", "_1")] == [
        None,  # an input is named anew: not matched
        "model.h.0.attn",
        "model.h.0",
        "model.h.0.mlp",
        "model.act",
    ]
