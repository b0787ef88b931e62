"""Tied parameters (:mod:`hintpipe.runtime.parallel.tied`): a rank's copy found by any of the tensor's names, a
stage that should hold it and does not named, and uses all on one rank left as the one tensor they are."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch import nn

from hintpipe.runtime.parallel.tied import TiedGradients, TiedParameter, _find

EMBEDDING = TiedParameter(("embed.weight", "head.weight"), (0, 3))


class Head(nn.Module):
    def __init__(self, shared: nn.Parameter) -> None:
        super().__init__()
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = shared


def test_a_ranks_copy_is_found_by_any_of_its_names() -> None:
    shared = nn.Parameter(torch.zeros(10, 4))
    stage = Head(shared)
    assert _find(EMBEDDING, {3: stage}, 1) is shared  # as the last stage names it
    first = nn.Module()
    first.embed = nn.Embedding(10, 4)
    assert _find(EMBEDDING, {0: first, 3: stage}, 0) is first.embed.weight  # the first of this rank's stages


def test_a_stage_that_should_hold_it_and_does_not_is_named() -> None:
    with pytest.raises(ValueError) as refused:
        _find(EMBEDDING, {2: nn.Linear(4, 4), 3: nn.Linear(4, 4)}, 1)
    assert str(refused.value) == (
        "rank 1: tied parameter embed.weight = head.weight should be in stages [0, 3], but no stage of this rank "
        "([2, 3]) has a parameter of those names"
    )


def test_uses_all_on_one_rank_need_no_group_and_no_sum() -> None:
    shared = nn.Parameter(torch.ones(10, 4))
    shared.grad = torch.full((10, 4), 2.0)
    first = nn.Module()
    first.embed = nn.Embedding(10, 4)
    first.embed.weight = shared
    # Stages 0 and 3 both on rank 0 (a V-shape of 2 ranks): no process group is made, none is needed.
    hook = TiedGradients([EMBEDDING], {0: first, 3: Head(shared)}, stage_rank=[0, 1, 1, 0], rank=0, pipelines=[[0, 1]])
    assert hook.counted_elsewhere() == set()
    hook.end_step(cast(Any, SimpleNamespace(step=0)))
    assert torch.equal(shared.grad, torch.full((10, 4), 2.0))  # its one gradient already sums both uses
