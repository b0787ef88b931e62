"""Cuts the caller names (:mod:`hintpipe.planner.forced_cuts`): a stage starts where the first operation using the
named submodule stands in the captured graph, and a name that cannot be a cut is refused saying why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hintpipe.planner.capture import CapturedGraph, capture
from hintpipe.planner.forced_cuts import forced_cuts
from hintpipe.planner.plan import node_tables
from hintpipe.planner.profile import profile
from hintpipe.planner.search import PlanError
from hintpipe.planner.tables import NodeTables


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.second = nn.Linear(8, 8)
        self.third = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.third(torch.relu(self.second(self.first(x))))
        return out


@pytest.fixture(scope="module")
def captured() -> tuple[CapturedGraph, NodeTables]:
    graph = capture(Model())
    return graph, node_tables(profile(graph, [torch.randn(3, 4)], repeats=1), graph)


def test_a_stage_starts_at_the_first_operation_of_each_named_submodule(
    captured: tuple[CapturedGraph, NodeTables],
) -> None:
    graph, tables = captured
    names = [node.name for node in graph.nodes]
    cuts = forced_cuts(graph, tables, ["second", "third"], 3)
    assert [names[c] for c in cuts[1:-1]] == ["second", "third"] and cuts[-1] == len(names)
    assert [names[c] for c in forced_cuts(graph, tables, ["first.1"], 2)[1:-1]] == ["first_1"]


@pytest.mark.parametrize(
    ("names", "stages", "message"),
    [
        (["second"], 3, "3 stages need 2 split points, got 1: ['second']"),
        # A name beside which its siblings are listed: those of its parent (before, the parent too), or the
        # model's own submodules for a name at the top (before, none).
        (["first.5"], 2, "split point 'first.5' names no submodule of the model (beside it: ['first.0', 'first.1'])"),
        (["secnd"], 2, "split point 'secnd' names no submodule of the model (beside it: ['first', 'second', 'third'])"),
        (["third", "second"], 3, "split point 'second' comes before 'third'; give them in model order"),
    ],
)
def test_a_name_that_cannot_be_a_cut_is_refused_saying_why(
    captured: tuple[CapturedGraph, NodeTables], names: list[str], stages: int, message: str
) -> None:
    graph, tables = captured
    with pytest.raises(PlanError) as refused:
        forced_cuts(graph, tables, names, stages)
    assert str(refused.value) == message
