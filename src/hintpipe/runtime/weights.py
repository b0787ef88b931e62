"""The whole model's weights out of a pipeline, by the model's own names.

Each rank holds some stages, perhaps a shard of each (tensor parallelism,
FSDP2) and perhaps as one of several identical replicas. Every rank puts its
shards together (``DTensor.full_tensor``, a collective of the shard's group,
so every rank walks its tensors in the same order), one rank per stage
(replica 0, tensor-parallel position 0) contributes, and every rank receives
the union. A tensor that stages share comes back under each of the model's
names for it, as ``model.state_dict()`` lists it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hintpipe.runtime.model_names import ModelNames
from hintpipe.tensor_bytes import is_dtensor

if TYPE_CHECKING:
    from hintpipe.runtime.parts import Parts


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy of the whole tensor (a DTensor's shards put together: call on every rank of its mesh)."""
    value = tensor.detach()
    if is_dtensor(value):
        value = value.full_tensor()  # type: ignore[attr-defined]
    return value.to("cpu", copy=True)


def gather_state_dict(parts: Parts, names: ModelNames) -> dict[str, torch.Tensor]:
    """The model's state dict on every rank (call on every rank).

    Raises:
        ValueError: a key of the model that no rank holds.
    """
    held = names.named_tensors(parts.modules, canonical=False)
    mine = {name: full(held[name]) for name in sorted(held)}
    rank = parts.global_rank
    layout = parts.layout
    speaks = layout.replica_of(rank) == 0 and layout.tensor_group_of(rank).index(rank) == 0
    shares: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, mine if speaks else {})
    merged: dict[str, torch.Tensor] = {}
    for share in shares:
        merged.update(share)
    out = names.expand(merged)
    missing = [k for k in names.keys if k not in out]
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise ValueError(f"{len(missing)} of the model's tensors are on no rank ({shown})")
    return out
