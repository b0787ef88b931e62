"""Splitting a step's batch into micro-batches."""

from __future__ import annotations

from typing import TypeAlias

import torch

#: One micro-batch: a tensor, or a tuple of tensors (several stage inputs).
Microbatch: TypeAlias = torch.Tensor | tuple[torch.Tensor, ...]
#: A step's batch: one tensor or tuple of tensors, split equally along dimension 0,
#: or a list of micro-batches of any shapes (variable sequence length).
Batch: TypeAlias = Microbatch | list[torch.Tensor] | list[tuple[torch.Tensor, ...]] | list[Microbatch]


def split_microbatches(value: Batch, count: int, what: str) -> list[Microbatch]:
    """``value`` as ``count`` micro-batches: a list of them as given, or a tensor
    (or tuple of tensors) split equally along dimension 0.

    Raises:
        ValueError: a list of the wrong length, or a batch that does not split equally.
    """
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"{what}: got a list of {len(value)} micro-batches, the pipeline runs {count}")
        return list(value)
    tensors = value if isinstance(value, tuple) else (value,)
    size = tensors[0].shape[0]
    if size % count:
        raise ValueError(
            f"{what}: batch of {size} does not split into {count} equal micro-batches; "
            f"use a batch size divisible by {count}, or pass a list of {count} micro-batches"
        )
    parts = [t.chunk(count, dim=0) for t in tensors]
    if isinstance(value, tuple):
        return [tuple(p[i] for p in parts) for i in range(count)]
    return list(parts[0])


def as_inputs(microbatch: Microbatch) -> list[torch.Tensor]:
    """A micro-batch as the list of a first stage's inputs."""
    return list(microbatch) if isinstance(microbatch, tuple) else [microbatch]
