"""Arguments left to their defaults ([Note: arguments left to their defaults] in hintpipe.planner.fx_trace): a
model's optional argument (``forward(self, x, mask=None, scale=2.0)``) is captured as the model runs when called
with the example alone, and the stages take the example's inputs.

Before, torch.fx made every parameter an input that is never None: the capture took the branch the model takes
with a mask, and ``hintpipe.plan(model, x)`` refused the model with ``the model takes 3 inputs, got 1``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hintpipe.planner.capture import capture
from hintpipe.planner.plan import plan


class Optional(nn.Module):
    """A mask that is applied only when given, a scale with a default, a keyword-only shift: torch.fx traces it
    (no control flow on a traced value), so no fallback to torch.export hides what the trace does."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 2.0, *, shift: float = 0.5
    ) -> torch.Tensor:
        h = self.a(x)
        if mask is not None:
            h = h * mask
        out: torch.Tensor = self.b(h) * scale + shift
        return out


def _x() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(3))


def _mask() -> torch.Tensor:
    return (torch.arange(12).reshape(3, 4) % 3 > 0).float()


@pytest.mark.parametrize(
    ("example", "inputs"), [((_x(),), ["x"]), ((_x(), _mask()), ["x", "mask"])], ids=["x", "x and mask"]
)
def test_the_capture_takes_the_examples_inputs_and_computes_what_the_model_does_with_them(
    example: tuple[torch.Tensor, ...], inputs: list[str]
) -> None:
    model = Optional()
    captured = capture(model, example=example)
    assert [n.name for n in captured.inputs] == inputs
    torch.testing.assert_close(captured.module(*example), model(*example), rtol=0, atol=0)


def test_a_model_with_optional_arguments_plans_and_its_stages_compute_the_model() -> None:
    model = Optional()
    made = plan(model, _x(), ranks=2, microbatches=2, repeats=1)
    first, second = made.build_stage(0), made.build_stage(1)
    sent = first(_x())
    out = second(*(sent if isinstance(sent, tuple) else (sent,)))
    torch.testing.assert_close(out, model(_x()), rtol=0, atol=0)


def test_a_required_argument_the_example_leaves_out_is_still_an_input() -> None:
    """Only parameters with a default are bound to it: one without stays an input, and planning says so."""

    class Two(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return x * y * scale

    assert [n.name for n in capture(Two(), example=(_x(),)).inputs] == ["x", "y"]
