"""Gradients of a pipeline step against the unsplit model (``hintpipe train --check-grads``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hintpipe.apps.models import Chain, loss_fn_for
from hintpipe.runtime.pipeline import Pipeline


def compare_gradients(
    pipe: Pipeline,
    modules: list[torch.nn.Module],
    reference: list[torch.nn.Module] | None,
    inputs: list[Any],
    targets: list[torch.Tensor],
    model_name: str,
) -> tuple[float, float] | None:
    """Rank 0 runs the same step on an unsplit copy and compares every gradient."""
    local = {
        (s, n): p.grad.detach().clone()
        for s in pipe.stages
        for n, p in modules[s].named_parameters()
        if p.grad is not None
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    if reference is None:
        return None
    model = Chain(*reference)
    loss_fn = loss_fn_for(model_name)
    for x, y in zip(inputs, targets, strict=True):
        output = model(*x) if isinstance(x, tuple) else model(x)
        torch.autograd.backward(loss_fn(output, y) / len(inputs))
    worst_abs = worst_rel = 0.0
    for part in gathered:
        for (stage, name), grad in part.items():
            expected = dict(reference[stage].named_parameters())[name].grad
            assert expected is not None
            diff = (grad - expected).abs().max().item()
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / max(expected.abs().max().item(), 1e-12))
    return worst_abs, worst_rel
