"""Input sizes a capture fixed (see [Note: dimensions the capture fixes] in
:mod:`~hintpipe.planner.export_trace`): said in a warning when a model is planned, and checked by the plan's
first stage, so that a micro-batch of another size is refused by name rather than failing deep inside a stage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["FixedShapeWarning", "FixedShapes", "fixed_said"]

#: Fixed input dimensions, as (input, dimension, size): ``("input 0", 1, 16)``.
Fixed = tuple[tuple[str, int, int], ...]


class FixedShapeWarning(UserWarning):
    """torch.export fixed input dimensions of a model that were to vary (see [Note: dimensions the capture
    fixes]): its stages take inputs of those sizes alone."""


def fixed_said(fixed: Fixed) -> str:
    """Fixed dimensions in words, with why a capture fixes them: ``input 0's dimension 1 at 16 (its code depends
    on those sizes: ...)``."""
    sizes = ", ".join(f"{name}'s dimension {dim} at {size}" for name, dim, size in fixed)
    return f"{sizes} (its code depends on those sizes: a loop over positions, a size read as a number)"


class FixedShapes:
    """A forward pre-hook of a plan's first stage that refuses a positional input of another size in a dimension
    its capture fixed (a class, not a closure: a stage pickles with its hooks)."""

    def __init__(self, fixed: Fixed) -> None:
        self.fixed = fixed

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        for label, dim, size in self.fixed:
            kind, _, position = label.partition(" ")
            if kind != "input" or not position.isdigit() or int(position) >= len(args):
                continue
            value = args[int(position)]
            if isinstance(value, torch.Tensor) and value.dim() > dim and value.shape[dim] != size:
                raise ValueError(
                    f"{label}'s dimension {dim} is {value.shape[dim]}, and the model was captured for {size} alone "
                    "(its code depends on that size; planning said so in a FixedShapeWarning): give micro-batches of "
                    "that size, or plan on an example of the size it trains on"
                )
