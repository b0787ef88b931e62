"""What the ranks agree on after a step (:mod:`hintpipe.runtime.loop.agreement`): a step's losses looked at once,
a non-finite one named by its micro-batch and step, or its step's gradients dropped under ``skip``; and no
collective where nothing needs one."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch import nn

from hintpipe.dispatch.policy import Policy
from hintpipe.modes import OnNonFinite
from hintpipe.runtime.errors import NonFiniteLoss
from hintpipe.runtime.loop.agreement import Agreement
from hintpipe.runtime.loop.ready_forecast import ReadyForecaster
from hintpipe.schedule.generators import generate_hint

HINT = generate_hint("1f1b", 2, 4)


def _agreement(on_nonfinite: OnNonFinite, modules: dict[int, nn.Module] | None = None) -> Agreement:
    """Rank 1's agreement, in step 7 whose slots ran micro-batches 2, 0, 3, 1; no group: none may be used."""
    agreement = Agreement(
        HINT,
        1,
        Policy.FIXED,
        coll=cast(Any, None),
        timeout=20.0,
        modules=modules or {},
        forecaster=ReadyForecaster(HINT, rank=1),
        on_nonfinite=on_nonfinite,
    )
    agreement.begin_step(cast(Any, SimpleNamespace(order=[2, 0, 3, 1], step=7)))
    return agreement


def test_a_non_finite_loss_is_named_by_its_micro_batch_and_step() -> None:
    agreement = _agreement(OnNonFinite.RAISE)
    agreement.check_losses([torch.tensor(1.5), torch.tensor(0.5)], [0, 1])  # finite: nothing
    with pytest.raises(NonFiniteLoss) as raised:
        agreement.check_losses([torch.tensor(1.5), torch.tensor(math.inf), torch.tensor(math.nan)], [0, 2, 3])
    assert str(raised.value) == (
        "rank 1: the loss of micro-batch 3 in step 7 is inf; the step stops before the optimizer runs "
        "(on_nonfinite='skip' finishes it and zeroes the gradients)"
    )
    assert agreement.nonfinite_steps == [7]


def test_under_skip_the_step_is_recorded_and_its_gradients_dropped() -> None:
    layer = nn.Linear(2, 1)
    layer(torch.ones(1, 2)).sum().backward()
    agreement = _agreement(OnNonFinite.SKIP, {3: layer})
    agreement.check_losses([torch.tensor(math.nan)], [1])
    assert agreement.nonfinite_steps == [7]
    agreement._drop_gradients(7)
    assert agreement.nonfinite_steps == [7] and all(p.grad is None for p in layer.parameters())


def test_under_fixed_without_skip_a_step_ends_with_no_collective() -> None:
    agreement = _agreement(OnNonFinite.RAISE)
    agreement.end_step(cast(Any, SimpleNamespace(step=0)))  # it would fail on the missing group otherwise
    assert agreement.nonfinite_steps == []
