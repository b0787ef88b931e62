"""A run of the user's model that leaves it as it found it: its tensors and its modules' attributes.

[Note: a probe leaves the model as it was]
The planner runs the user's own model outside training: in eval mode, to compare it with its capture ([Note: a
branch on self.training] in :mod:`hintpipe.planner.mode_check`). Such a run can change more than buffers. RWKV's
forward rescales weights in place when its mode changes (``weight.div_(2 ** (block // rescale_every))`` and
``self.layers_are_rescaled = not self.training``): after the probe, the model's weights of later blocks were
halved, and a capture made after it traced the way back, ``weight.mul_(...)``, into the graph, so every stage
forward multiplied those weights again, and autograd refused the pipeline's second forward before the first's
backward (``modified by an inplace operation``). So around a probe, :func:`state_kept` puts back every parameter
the run wrote (copied before its first write, as a dispatch mode sees the write: nothing is copied for a run that
writes none), every buffer (all copied: a batch norm's statistics are written by an operator whose schema does not
say so) and every module's plain attributes (a flag the forward set, a cache it filled).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hintpipe.planner.buffer_updates import buffers_kept, schema_written

__all__ = ["state_kept"]

#: A module's own tables, kept by identity (their tensors are kept as tensors; hooks stay as registered).
_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


class _WritesKept(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Copies each watched tensor (by its storage) before the first operator that writes into it."""

    def __init__(self, watched: dict[int, list[torch.Tensor]]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.watched = watched
        self.kept: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for value in schema_written(func, args, kwargs):
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    self._keep(tensor)
        return func(*args, **kwargs)

    def _keep(self, tensor: torch.Tensor) -> None:
        key = _storage(tensor)
        if key in self.watched and key not in self.kept:
            self.kept[key] = [(owner, owner.detach().clone()) for owner in self.watched[key]]


def _storage(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().data_ptr())


@contextlib.contextmanager
def state_kept(model: nn.Module) -> Iterator[None]:
    """Within: ``model`` runs as it will; afterwards its parameters, buffers and modules' attributes are as they
    were (see [Note: a probe leaves the model as it was])."""
    watched: dict[int, list[torch.Tensor]] = {}
    for tensor in model.parameters():
        if tensor.device.type != "meta":
            watched.setdefault(_storage(tensor), []).append(tensor)
    attributes = [(m, {k: v for k, v in vars(m).items() if k not in _TABLES}) for m in model.modules()]
    mode = _WritesKept(watched)
    try:
        with buffers_kept(model), mode:
            yield
    finally:
        with torch.no_grad():
            for pairs in mode.kept.values():
                for owner, value in pairs:
                    owner.copy_(value)
        for module, before in attributes:
            now = vars(module)
            for key in [k for k in now if k not in before and k not in _TABLES]:
                del now[key]
            for key, value in before.items():
                if now.get(key, _MISSING) is not value:
                    now[key] = value


_MISSING = object()
