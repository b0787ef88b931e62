"""One rank's share of a checkpoint (:mod:`hintpipe.runtime.checkpoint.rank_state`): its tensors by the model's
names, its step, its RNG state and the caller's state, put back as saved; and what may not be saved, named."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hintpipe.runtime.checkpoint.rank_state import RankState, Stateful, rng_key
from hintpipe.runtime.model_names import ModelNames


class Position:
    """The caller's own state: where its data is."""

    def __init__(self, at: int) -> None:
        self.at = at

    def state_dict(self) -> dict[str, Any]:
        return {"at": self.at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.at = state_dict["at"]


def _stages() -> dict[int, nn.Linear]:
    torch.manual_seed(0)
    return {1: nn.Linear(2, 2), 3: nn.Linear(2, 1)}


def test_a_ranks_entries_are_put_back_as_they_were_saved() -> None:
    stages, position = _stages(), Position(7)
    assert isinstance(position, Stateful)
    state = RankState(stages, ModelNames(), None, {"data": position})
    entries = state.entries(step=12, rank=2)
    assert sorted(entries) == ["model", "optim", "rng-rank2", "step", "user-data"]
    assert sorted(entries["model"]) == ["1.bias", "1.weight", "3.bias", "3.weight"] and entries["optim"] == {}
    saved: dict[str, Any] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in entries.items()}
    saved["model"] = {k: v.detach().clone() for k, v in entries["model"].items()}
    expected_draw = torch.rand(3)  # what the RNG draws next after the save
    with torch.no_grad():
        stages[1].weight.fill_(0.0)
    position.at = 99
    fresh = RankState(stages, ModelNames(), None, {"data": position})
    assert fresh.restore(saved, rank=2) == 12
    assert torch.equal(stages[1].weight, saved["model"]["1.weight"]) and position.at == 7
    assert torch.equal(torch.rand(3), expected_draw)  # the rank's RNG state as saved
    assert rng_key(5) == "rng-rank5"


def test_an_optimizer_over_parameters_no_stage_holds_is_refused() -> None:
    stages = _stages()
    stray = nn.Linear(3, 4)
    optimizer = torch.optim.SGD([*stages[1].parameters(), *stray.parameters()], lr=0.1)
    with pytest.raises(ValueError) as refused:
        RankState(stages, ModelNames(), optimizer)
    assert str(refused.value) == (
        "the optimizer holds 2 parameters that no stage of this rank holds (4x3, 4): give it the parameters of "
        "pipe.modules"
    )


def test_the_first_value_that_is_not_finite_is_named() -> None:
    stages = _stages()
    optimizer = torch.optim.Adam([p for m in stages.values() for p in m.parameters()], lr=0.1)
    state = RankState(stages, ModelNames(), optimizer)
    assert state.first_nonfinite() is None
    stages[3](torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.state[stages[3].bias]["exp_avg_sq"].fill_(float("inf"))
    assert state.first_nonfinite() == "optimizer state 'exp_avg_sq' of 3.bias"
    with torch.no_grad():
        stages[3].weight[0, 1] = float("nan")
    assert state.first_nonfinite() == "parameter 3.weight"  # parameters first
