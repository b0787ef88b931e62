"""[Note: a node that writes its input, alone]: a graph whose nodes write intermediate values in place (a matrix
filled row by row, as Qwen3-Next's gated delta rule fills one) is profiled node by node and planned, with the
gradients of the model it was cut from."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from hintpipe.planner.capture import capture
from hintpipe.planner.plan import plan
from hintpipe.planner.profile import profile


class RowByRow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        for i in range(1, 4):  # each row from the one before it, written in place
            h[:, i] = h[:, i] + h[:, i - 1] * 0.5
        out: torch.Tensor = self.second(torch.tanh(h))
        return out


class RowByRowKeywords(RowByRow):
    """The same, taking a keyword: captured by torch.export (torch.fx takes no keywords)."""

    def forward(self, x: torch.Tensor, unused: object = None) -> torch.Tensor:
        return super().forward(x)


def test_a_node_that_writes_an_intermediate_in_place_is_profiled() -> None:
    """Before: ``RuntimeError: a leaf Variable that requires grad is being used in an in-place operation``."""
    x = torch.randn(3, 4)
    for model, kwargs in ((RowByRow(), None), (RowByRowKeywords(), {"unused": None})):  # torch.fx's, torch.export's
        captured = capture(model, example=(x,), kwargs=kwargs)
        profiles = profile(captured, [x], repeats=1)
        assert len(profiles) == len(captured.nodes) and all(p.forward_s >= 0 for p in profiles)


def test_such_a_model_plans_and_its_stages_give_the_models_gradients() -> None:
    model = RowByRow()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = plan(model, torch.randn(3, 4), ranks=1, microbatches=1, repeats=1)
    stage = planned.build_stage(0)
    x = torch.randn(3, 4)
    stage(x).sum().backward()
    reference = RowByRow()
    reference(x).sum().backward()
    got = {name.replace(".", "_"): p for name, p in stage.named_parameters()}
    for name, parameter in reference.named_parameters():
        match = next(p for n, p in got.items() if n.endswith(name.replace(".", "_")))
        torch.testing.assert_close(match.grad, parameter.grad, rtol=1e-6, atol=1e-7)
