"""Gradients of a pipeline step against the unsplit model (``hintpipe train --check-grads``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hintpipe.apps.models import Chain, loss_fn_for
from hintpipe.device import to_device
from hintpipe.runtime.pipeline import Pipeline


def compare_gradients(
    pipe: Pipeline,
    modules: list[torch.nn.Module],
    reference: list[torch.nn.Module] | None,
    inputs: list[Any],
    targets: list[torch.Tensor],
    model_name: str,
) -> tuple[float, float] | None:
    """Rank 0 runs the same step on an unsplit copy and compares every gradient.

    The copy (``reference``, taken before the pipeline placed its stages) runs whole on rank 0's device,
    fed the step's inputs there; the gradients travel and are compared on the host (a GPU tensor sent
    as an object would land on the receiver's GPU of the sender's index).
    """
    local = {
        (s, n): p.grad.detach().cpu()
        for s in pipe.stages
        for n, p in modules[s].named_parameters()
        if p.grad is not None
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    if reference is None:
        return None
    model = Chain(*reference).to(pipe.device)
    loss_fn = loss_fn_for(model_name)
    for x, y in zip(to_device(inputs, pipe.device), to_device(targets, pipe.device), strict=True):
        output = model(*x) if isinstance(x, tuple) else model(x)
        torch.autograd.backward(loss_fn(output, y) / len(inputs))
    worst_abs = worst_rel = 0.0
    for part in gathered:
        for (stage, name), grad in part.items():
            found = dict(reference[stage].named_parameters())[name].grad
            assert found is not None
            expected = found.cpu()
            diff = (grad - expected).abs().max().item()
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / max(expected.abs().max().item(), 1e-12))
    return worst_abs, worst_rel
