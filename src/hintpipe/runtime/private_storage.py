"""Every rank's parameters in storage of its own, not in the shared memory its launcher put them in.

See [Note: every rank owns its parameters].
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def own_storage(modules: Mapping[int, nn.Module]) -> int:
    """Give every parameter and buffer held in shared memory a private copy, in place; returns how many.

    [Note: every rank owns its parameters]
    ``torch.multiprocessing`` moves the tensors of a spawned process's arguments into shared memory (a user's
    ``mp.spawn(fn, args=(plan,))``), so every rank would step one and the same storage: a tied weight updated
    twice, data-parallel replicas training one copy. Each such tensor gets storage of its own here. A
    parameter keeps its identity (its ``.data`` is replaced), so an optimizer built from the user's modules,
    and a tensor two of this rank's stages share, stay what they were.
    """
    owned = 0
    seen: set[int] = set()
    clones: dict[int, torch.Tensor] = {}  # a buffer two modules share gets one copy
    for module in modules.values():
        for param in module.parameters():
            if id(param) not in seen and _shared(param):
                param.data = param.data.clone()
                owned += 1
            seen.add(id(param))
        for sub in module.modules():
            for name, buffer in sub._buffers.items():
                if buffer is None or not _shared(buffer):
                    continue
                if id(buffer) not in clones:
                    clones[id(buffer)] = buffer.clone()
                    owned += 1
                sub._buffers[name] = clones[id(buffer)]
    return owned


def _shared(tensor: torch.Tensor) -> bool:
    """Whether a host tensor's storage is in shared memory (every CUDA tensor counts as shared: not those)."""
    return tensor.device.type == "cpu" and bool(tensor.untyped_storage().is_shared())
