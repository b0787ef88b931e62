"""Bytes of tensors as autograd holds them: each storage once, parameters aside.

Used by the planner's profiler (what a node saves for backward) and by the
runtime's executor (what a forward keeps alive for byte admission), so that
the two count the same bytes the same way.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor, without importing ``torch.distributed.tensor``: that package takes about
    0.5 s to import, which every rank would pay at start-up, and no tensor can be a DTensor before it is loaded."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds the bytes: a DTensor's local shard, else the tensor itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor  # type: ignore[attr-defined]


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [local(value)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def storage_nbytes(value: Any) -> int:
    """Bytes of the storages behind ``value``'s tensors, each storage once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors_in(value)}
    return sum(storages.values())


@dataclasses.dataclass
class SavedCounter:
    """Bytes held for backward, each storage counted once."""

    exclude: set[int]
    total: int = 0
    sizes: dict[int, int] = dataclasses.field(default_factory=dict)

    def add(self, t: torch.Tensor) -> None:
        storage = local(t).untyped_storage()
        key = storage.data_ptr()
        if key not in self.exclude and key not in self.sizes:
            self.sizes[key] = storage.nbytes()
            self.total += storage.nbytes()


@contextmanager
def count_saved(exclude: set[int]) -> Iterator[SavedCounter]:
    """Count the bytes autograd saves inside the block, each storage once,
    skipping storages in ``exclude`` (parameters)."""
    counter = SavedCounter(exclude)

    def pack(t: torch.Tensor) -> torch.Tensor:
        counter.add(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter


def parameter_storages(module: torch.nn.Module) -> set[int]:
    return {local(p).untyped_storage().data_ptr() for p in module.parameters()}
