"""[Note: a run made apart]: ranks that made their configs apart (under torchrun) compare the run's options by key
before the first step, and a difference is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.run_agreement import OWN, agree_on_run, compared_keys
from hintpipe.apps.train_config import TrainConfig
from hintpipe.runtime.errors import OptionMismatch

RUN = TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4, steps=4, seed=1)


def _two_ranks(monkeypatch: pytest.MonkeyPatch, other: TrainConfig) -> None:
    """This process as rank 0 of two, the other rank made ``other``."""

    def all_gather_object(gathered: list[Any], mine: Any, group: Any = None) -> None:
        gathered[:] = [mine, compared_keys(other)]

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)


def test_ranks_given_the_same_run_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    _two_ranks(monkeypatch, RUN.replaced(log_every=5, progress=True))  # rank 0's own options may differ
    agree_on_run(RUN)
    assert {"log_every", "tensorboard", "progress", "return_state"} == OWN
    assert "seed" in compared_keys(RUN) and "policy" not in compared_keys(RUN)  # the runtime compares its own


def test_ranks_given_other_seeds_or_steps_are_refused_naming_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's ``seed=rank`` drew other batches on each rank: the first stage trained on one batch's inputs,
    the last on another's targets, and nothing said so."""
    _two_ranks(monkeypatch, RUN.replaced(seed=2, steps=5))
    with pytest.raises(OptionMismatch) as refused:
        agree_on_run(RUN)
    assert str(refused.value) == (
        "rank 0: ranks disagree on the run's options (steps: 4 here, 5 on rank 1, seed: 1 here, 2 on rank 1); start "
        "every rank with the same options"
    )
