"""Gradients of a pipeline step against the unsplit model (``hintpipe train --check-grads``)."""

from __future__ import annotations

from collections.abc import Callable
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
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    loss_divisor: float | None = None,
) -> tuple[float, float] | None:
    """Rank 0 runs the same step on an unsplit copy and compares every gradient (``loss_fn`` and
    ``loss_divisor`` as the pipeline's step had them; default: the model's mean loss over micro-batches)."""
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
    loss = loss_fn if loss_fn is not None else loss_fn_for(model_name)
    divisor = loss_divisor if loss_divisor is not None else len(inputs)
    for x, y in zip(inputs, targets, strict=True):
        output = model(*x) if isinstance(x, tuple) else model(x)
        torch.autograd.backward(loss(output, y) / divisor)
    worst_abs = worst_rel = 0.0
    for part in gathered:
        for (stage, name), grad in part.items():
            expected = dict(reference[stage].named_parameters())[name].grad
            assert expected is not None
            diff = (grad - expected).abs().max().item()
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / max(expected.abs().max().item(), 1e-12))
    return worst_abs, worst_rel
