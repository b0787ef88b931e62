"""A branch on ``self.training`` ([Note: a branch on self.training] in hintpipe.planner.mode_check): a model whose
``forward`` decides in Python what eval mode does (a drop path) is planned with a warning that names the
difference and the fix; one whose only mode-dependent code is dropout (which a stage follows) is planned without.
The check leaves the model's modes, buffers and the random state as they were.

Before, such a model's stages ran the training branch in ``Pipeline.eval_step``, silently.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from conftest import raised_here
from hintpipe.planner.mode_check import EvalModeWarning, warn_if_eval_differs
from hintpipe.planner.plan import plan


class DropPath(nn.Module):
    """Stochastic depth as vision models write it: a Python branch on the mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = (torch.rand(x.shape[0], 1) > 0.5).to(x.dtype)
        return x * keep * 2


class Deep(nn.Module):
    def __init__(self, drop_path: bool) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)
        self.norm = nn.BatchNorm1d(6)
        self.path = DropPath() if drop_path else nn.Identity()
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(self.drop(x + self.path(torch.tanh(self.norm(self.a(x))))))
        return out


def _x() -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(2))


def test_a_branch_on_the_mode_is_said_in_a_warning_with_the_fix() -> None:
    with pytest.warns(EvalModeWarning) as caught:
        plan(Deep(drop_path=True), _x(), ranks=2, microbatches=2, repeats=1)
    message = str(raised_here(caught)[0].message)
    assert message.startswith("Deep computes other values in eval mode than its capture does (largest relative ")
    assert "Pipeline.eval_step runs the training branch" in message and "hintpipe.load_merged" in message


def test_dropout_alone_is_followed_and_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", EvalModeWarning)
        plan(Deep(drop_path=False), _x(), ranks=2, microbatches=2, repeats=1)


def test_the_check_leaves_the_model_as_it_was() -> None:
    model = Deep(drop_path=True)
    model.path.eval()  # a mix of modes, kept as the user set them
    with pytest.warns(EvalModeWarning):
        made = plan(model, _x(), ranks=2, microbatches=2, repeats=1)
    modes = {name: m.training for name, m in model.named_modules()}
    assert not modes["path"] and modes[""]
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    state = torch.random.get_rng_state()
    with pytest.warns(EvalModeWarning):
        difference = warn_if_eval_differs(model, made.graph.module, (_x(),), {})
    assert difference is not None and difference > 0.01
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert all(torch.equal(b, buffers[name]) for name, b in model.named_buffers())
    assert torch.equal(torch.random.get_rng_state(), state)
