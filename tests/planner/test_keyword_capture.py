"""A model whose ``forward`` takes its keywords through ``**kwargs`` (Hugging Face's newer models:
``def forward(self, input_ids=None, **kwargs)``, GraniteMoE's) or its inputs through ``*inputs`` is captured by
torch.export with every dimension free, as one that names them is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hintpipe.planner.capture import capture


class _Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, input_ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
        hidden = self.embed(input_ids)
        if kwargs.get("use_cache"):
            hidden = hidden * 2
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            hidden = hidden * mask.unsqueeze(-1)
        out: torch.Tensor = self.head(hidden)
        return out


class _Inputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, *inputs: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        out: torch.Tensor = self.inner(inputs[0] + inputs[1]) * scale
        return out


@pytest.mark.parametrize("use_cache", [False, True])
def test_a_keyword_taken_through_kwargs_is_captured(use_cache: bool) -> None:
    """Before: ``UserError: When dynamic_shapes is specified as a dict, its top-level keys must be the arg names
    ['input_ids', 'kwargs'] of inputs, but here they are ['input_ids', 'use_cache']``."""
    model = _Keywords()
    ids = torch.arange(12).reshape(2, 6) % 16
    captured = capture(model, example=(ids,), kwargs={"use_cache": use_cache})
    longer = torch.arange(18).reshape(2, 9) % 16  # another length: the dimensions stayed free
    torch.testing.assert_close(captured.module(longer), model(longer, use_cache=use_cache))
    assert captured.fixed == ()


def test_inputs_taken_through_args_are_captured() -> None:
    model = _Inputs()
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    captured = capture(model, example=(a, b), kwargs={"scale": 2.0})
    c, d = torch.randn(5, 4), torch.randn(5, 4)
    torch.testing.assert_close(captured.module(c, d), model(c, d, scale=2.0))


def test_a_tensor_taken_through_kwargs_alone_is_captured_with_its_dimensions_free() -> None:
    model = _Keywords()
    ids = torch.arange(12).reshape(2, 6) % 16
    captured = capture(model, example=(ids,), kwargs={"attention_mask": torch.ones(2, 6)})
    longer, mask = torch.arange(18).reshape(2, 9) % 16, torch.ones(2, 9)
    mask[0, -2:] = 0.0
    torch.testing.assert_close(captured.module(longer, mask), model(longer, attention_mask=mask))
    assert captured.fixed == ()
