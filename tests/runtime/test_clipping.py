"""Gradient clipping across ranks (:mod:`hintpipe.runtime.clipping`): on the rank that holds the whole model it is
``torch.nn.utils.clip_grad_norm_`` itself; a copy another rank stands for is counted there, not here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hintpipe.runtime.clipping import clip_grad_norm


def _stages() -> dict[int, nn.Module]:
    torch.manual_seed(0)
    stages: dict[int, nn.Module] = {0: nn.Linear(3, 4), 1: nn.Linear(4, 2)}
    x = torch.randn(5, 3)
    stages[1](stages[0](x)).pow(2).sum().backward()
    return stages


def _parts(stages: dict[int, nn.Module], replica: int = 0, hooks: tuple[Any, ...] = ()) -> Any:
    layout = SimpleNamespace(replica_of=lambda rank: replica, tensor_group_of=lambda rank: [rank])
    return cast(Any, SimpleNamespace(modules=stages, global_rank=0, layout=layout, hooks=list(hooks)))


@pytest.fixture(autouse=True)
def _one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """A world of one rank: the sum over ranks is this rank's own."""
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: None)


@pytest.mark.parametrize(("max_norm", "norm_type"), [(0.5, 2.0), (100.0, 2.0), (0.1, 1.0), (0.05, float("inf"))])
def test_one_rank_clips_as_torch_clips_the_unsplit_model(max_norm: float, norm_type: float) -> None:
    mine, theirs = _stages(), _stages()
    norm = clip_grad_norm(_parts(mine), max_norm, norm_type)
    expected = nn.utils.clip_grad_norm_([p for m in theirs.values() for p in m.parameters()], max_norm, norm_type)
    torch.testing.assert_close(norm, expected)
    for a, b in zip(mine.values(), theirs.values(), strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)


def test_a_replicas_copy_is_counted_on_the_first_replica_only() -> None:
    stages = _stages()
    before = [p.grad.clone() for m in stages.values() for p in m.parameters() if p.grad is not None]
    assert float(clip_grad_norm(_parts(stages, replica=1), 0.5)) == 0.0  # replica 0 counts it (here: no one)
    after = [p.grad for m in stages.values() for p in m.parameters() if p.grad is not None]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(("max_norm", "norm_type"), [(-1.0, 2.0), (1.0, 0.0), (float("nan"), 2.0)])
def test_a_norm_that_is_none_is_refused(max_norm: float, norm_type: float) -> None:
    with pytest.raises(ValueError) as refused:
        clip_grad_norm(_parts(_stages()), max_norm, norm_type)
    assert str(refused.value) == (
        f"max_norm must be >= 0 and norm_type > 0, got max_norm={max_norm}, norm_type={norm_type}"
    )
