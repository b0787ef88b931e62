"""The whole model's weights out of a pipeline (:mod:`hintpipe.runtime.weights`): one rank per stage speaks, every
rank gets the union by the model's names in its order, and a tensor no rank holds is refused, named."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hintpipe.runtime.model_names import ModelNames
from hintpipe.runtime.weights import full, gather_state_dict

MODEL = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
NAMES = ModelNames.of_sequential(MODEL, [0, 1, 2])


def _parts(replica: int) -> Any:
    """Rank 0 of two pipeline ranks, holding stage 0, in data-parallel replica ``replica``."""
    layout = SimpleNamespace(replica_of=lambda rank: replica, tensor_group_of=lambda rank: [rank])
    return cast(Any, SimpleNamespace(modules={0: nn.Sequential(MODEL[0])}, global_rank=0, layout=layout))


def _world(monkeypatch: pytest.MonkeyPatch, other: dict[str, torch.Tensor]) -> list[Any]:
    """Two ranks, the other saying ``other``; returns what this rank said."""
    said: list[Any] = []

    def all_gather_object(shares: list[Any], mine: Any) -> None:
        said.append(mine)
        shares[:] = [mine, other]

    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    return said


def test_every_rank_gets_the_whole_model_by_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    second = {name: full(t) for name, t in MODEL[1].state_dict(prefix="1.").items()}
    said = _world(monkeypatch, second)
    state = gather_state_dict(_parts(replica=0), NAMES)
    assert list(state) == list(MODEL.state_dict())  # the model's order
    assert all(torch.equal(state[k], v) for k, v in MODEL.state_dict().items())
    assert state["0.weight"] is not MODEL[0].weight and not state["0.weight"].requires_grad  # detached copies
    assert sorted(said[0]) == ["0.bias", "0.weight"]


def test_a_replica_other_than_the_first_says_nothing_and_a_missing_tensor_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = _world(monkeypatch, {})
    with pytest.raises(ValueError) as refused:
        gather_state_dict(_parts(replica=1), NAMES)
    assert said == [{}]
    assert str(refused.value) == "4 of the model's tensors are on no rank (0.weight, 0.bias, 1.weight, ...)"
