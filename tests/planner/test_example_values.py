"""What a captured graph's nodes compute on the example (:mod:`hintpipe.planner.example_values`): which are numbers
a cut may carry, and which are floating-point values no gradient flows into, from one run of the graph."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.example_values import value_kinds


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.size(0)  # a number
        mask = torch.ones_like(x)  # a float no gradient flows into
        out: torch.Tensor = self.frozen(x) * mask * rows
        return out


def test_numbers_and_values_without_a_gradient_are_found_by_running_the_graph() -> None:
    graph = fx.symbolic_trace(Counting())
    nodes = list(graph.graph.nodes)
    numbers, gradient_free = value_kinds(graph, nodes, [torch.randn(3, 4)])
    assert [nodes[i].name for i in sorted(numbers)] == ["size"]
    # The frozen layer's output carries a gradient while planning (it may be trained later): only the mask.
    assert [nodes[i].name for i in sorted(gradient_free)] == ["ones_like"]
    assert not any(p.requires_grad for p in graph.parameters())  # frozen again after the run
