"""Gradient clipping across every rank of every axis: ``torch.nn.utils.clip_grad_norm_`` of the unsplit model.

The unsplit model's gradient norm counts each parameter once. Split across
ranks, each parameter's gradient lives on the ranks of its stage, perhaps as
shards (tensor parallelism, FSDP2: a DTensor), perhaps as identical copies
(data-parallel replicas after their averaging, a replicated DTensor
dimension, the ranks sharing a tied embedding after their sum). So every rank
sums ``|g|^p`` over the gradients it *stands for* (its own shards; a copy only
at coordinate 0 of the dimension it is copied along; a tied copy only on the
lowest rank holding it), one all-reduce over the world adds the sums (or takes
the largest, for the infinity norm), and every rank scales its gradients by
the same coefficient torch computes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hintpipe.runtime.parallel.tied import TiedGradients
from hintpipe.tensor_bytes import is_dtensor, local

if TYPE_CHECKING:
    from hintpipe.runtime.parts import Parts


def _stands_for(grad: torch.Tensor, replica: int, tensor_position: int) -> bool:
    """Whether this rank's share of ``grad`` is counted here (copies are counted at coordinate 0 only)."""
    if is_dtensor(grad):
        from torch.distributed.tensor import Replicate

        mesh = grad.device_mesh  # type: ignore[attr-defined]
        return all(
            mesh.get_local_rank(dim) == 0
            for dim, placement in enumerate(grad.placements)  # type: ignore[attr-defined]
            if isinstance(placement, Replicate)
        )
    return replica == 0 and tensor_position == 0


def clip_grad_norm(parts: Parts, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale every rank's gradients so that the whole model's gradient norm is at most ``max_norm``; returns the
    norm before clipping (a CPU scalar, the same on every rank). Call on every rank, after the step.

    Raises:
        ValueError: ``max_norm`` negative or ``norm_type`` not positive.
    """
    if not max_norm >= 0 or not norm_type > 0:
        raise ValueError(f"max_norm must be >= 0 and norm_type > 0, got max_norm={max_norm}, norm_type={norm_type}")
    rank, layout = parts.global_rank, parts.layout
    replica, tensor_position = layout.replica_of(rank), layout.tensor_group_of(rank).index(rank)
    elsewhere: set[int] = set()
    for hook in parts.hooks:
        if isinstance(hook, TiedGradients):
            elsewhere |= hook.counted_elsewhere()
    params = list({id(p): p for m in parts.modules.values() for p in m.parameters()}.values())
    grads = [p.grad for p in params if p.grad is not None]
    counted = [
        p.grad
        for p in params
        if p.grad is not None and id(p) not in elsewhere and _stands_for(p.grad, replica, tensor_position)
    ]
    infinite = math.isinf(norm_type)
    total = torch.zeros((), dtype=torch.float64)
    for grad in counted:
        share = local(grad).detach().to(torch.float64)
        if share.numel() == 0:
            continue
        if infinite:
            total = torch.maximum(total, share.abs().max().cpu())
        else:
            total += share.abs().pow(norm_type).sum().cpu()
    dist.all_reduce(total, op=dist.ReduceOp.MAX if infinite else dist.ReduceOp.SUM)
    norm = total if infinite else total.pow(1.0 / norm_type)
    coefficient = max_norm / (float(norm) + 1e-6)
    if coefficient < 1.0:
        for grad in grads:
            grad.mul_(coefficient)
    return norm.to(torch.float32)
