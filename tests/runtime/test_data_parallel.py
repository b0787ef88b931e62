"""Data parallelism across pipelines (:mod:`hintpipe.runtime.parallel.data_parallel`): a stage's average starts as
its gradients are complete, and a step whose stage never finished its gradients is refused at the step's end,
naming the stages."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from torch import nn

from hintpipe.runtime.parallel.data_parallel import GradientAverage


def _frozen() -> nn.Module:
    """A stage with nothing to average (no collective is needed for it)."""
    return nn.Linear(2, 2).requires_grad_(False)


def test_a_stage_that_never_finished_its_gradients_is_named_at_the_steps_end() -> None:
    average = GradientAverage({0: _frozen(), 2: _frozen()}, cast(Any, None), replicas=2, rank=3, timeout=20.0)
    state = cast(Any, SimpleNamespace(step=5, measured={}))
    average.begin_step(state)
    average.stage_done(0)
    with pytest.raises(RuntimeError) as refused:
        average.end_step(state)
    assert str(refused.value) == "rank 3: stages [2] did not finish their gradients in step 5"
    average.stage_done(2)
    average.end_step(state)
    assert sorted(state.measured) == ["dp_exposed", "dp_overlap"] and state.measured["dp_overlap"] >= 0.0


def test_each_step_starts_with_no_stage_done() -> None:
    average = GradientAverage({0: _frozen()}, cast(Any, None), replicas=2, rank=0, timeout=20.0)
    state = cast(Any, SimpleNamespace(step=0, measured={}))
    average.stage_done(0)
    average.begin_step(state)  # the next step: stage 0's earlier end does not count
    with pytest.raises(RuntimeError, match=r"^rank 0: stages \[0\] did not finish their gradients in step 0$"):
        average.end_step(state)
