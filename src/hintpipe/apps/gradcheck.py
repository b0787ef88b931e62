"""Gradients of a pipeline step against the unsplit model (``hintpipe train --check-grads``), for every layout.

Every rank contributes its stages' gradients by ``(stage, parameter name)``:
a data-parallel replica's are already averaged over the replicas (the
runtime's reduction), and a parameter split by FSDP2 or tensor parallelism
(a DTensor) is put together with ``full_tensor()``, a collective its mesh's
members reach in the same order because they hold the same stages. Rank 0
runs the same step on the unsplit model, on one process: every replica's
micro-batches, each loss divided by micro-batches x replicas, which is the
gradient of the mean loss over the global batch that the replicas average
to. Each rank's copy of each gradient is compared, so a replica that
diverged from the others shows as well as a wrong sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hintpipe.apps.models import Chain, loss_fn_for
from hintpipe.device import to_device
from hintpipe.modes import Precision
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.tensor_bytes import is_dtensor

#: The relative difference ``--check-grads`` accepts (float32; sums over micro-batches, replicas and
#: tensor-parallel shards run in another order than the unsplit model's).
RELATIVE_TOLERANCE = 1e-4
#: The same under ``precision="bf16"``, where the unsplit model runs under the same autocast: a bfloat16 value
#: carries 8 bits (a relative step of 2**-8, 0.4%), and the pipeline rounds a stage's output to bfloat16 where it
#: crosses to the next stage, which the unsplit model computes on without rounding.
BF16_RELATIVE_TOLERANCE = 2e-2


def relative_tolerance(precision: Precision | str) -> float:
    """The relative difference ``--check-grads`` accepts at ``precision``."""
    return BF16_RELATIVE_TOLERANCE if Precision(precision) is Precision.BF16 else RELATIVE_TOLERANCE


def compare_gradients(
    pipe: Pipeline,
    modules: Sequence[torch.nn.Module],
    reference: Sequence[torch.nn.Module] | None,
    batches: Sequence[tuple[list[Any], list[torch.Tensor]]],
    model_name: str,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    loss_divisors: Sequence[float] | None = None,
) -> tuple[float, float] | None:
    """Compare every rank's gradients with the unsplit model's (call on every rank, after the step).

    The unsplit copy (``reference``, taken before the pipeline placed its stages) runs whole on rank 0's
    device, fed the step's inputs there; the gradients travel and are compared on the host (a GPU tensor
    sent as an object would land on the receiver's GPU of the sender's index).

    Args:
        pipe: the pipeline that ran the step.
        modules: every stage's module as this rank built it (its own stages trained).
        reference: on rank 0, the unsplit model's stages with the step's starting weights; None elsewhere.
        batches: on rank 0, each replica's ``(inputs, targets)`` of the step, in replica order.
        model_name: the built-in model (its loss function, unless ``loss_fn`` is given).
        loss_fn: the loss the pipeline's step used (default: the model's).
        loss_divisors: per replica, what the step divided each micro-batch's loss by (default: the number of
            micro-batches: the mean loss).

    Returns:
        On rank 0, the largest absolute and relative differences; None elsewhere.
    """
    gathered = _gathered(pipe, lambda stage, name: (stage, name), modules)
    if reference is None:
        return None
    model = Chain(*reference).to(pipe.device)
    _reference_backward(model, pipe.device, batches, loss_fn if loss_fn is not None else loss_fn_for(model_name),
                        {}, loss_divisors, pipe.config.precision)  # fmt: skip
    pairs = []
    for part in gathered:
        for (stage, name), grad in _fused(part).items():
            found = dict(reference[stage].named_parameters())[name].grad
            assert found is not None
            pairs.append((grad, found.cpu()))
    return _worst(pairs)


def _fused(grads: dict[tuple[int, str], torch.Tensor]) -> dict[tuple[int, str], torch.Tensor]:
    """``grads`` by the unsplit model's names: a tensor-parallel block's ``q``, ``k`` and ``v``
    (:meth:`~hintpipe.apps.models.Block.unfuse_qkv`) joined again into the rows of its ``qkv``."""
    out: dict[tuple[int, str], torch.Tensor] = {}
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for (stage, name), grad in grads.items():
        owner, _, leaf = name.rpartition(".")
        block, _, part = owner.rpartition(".")
        if part in ("q", "k", "v"):
            parts.setdefault((stage, f"{block}.qkv.{leaf}"), {})[part] = grad
        else:
            out[(stage, name)] = grad
    for key, split in parts.items():
        out[key] = torch.cat([split[p] for p in "qkv"])
    return out


def compare_plan_gradients(
    pipe: Pipeline,
    reference: torch.nn.Module | None,
    batches: Sequence[tuple[list[Any], list[torch.Tensor]]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    kwargs: dict[str, Any],
    loss_divisors: Sequence[float] | None = None,
) -> tuple[float, float] | None:
    """Compare a planned pipeline's gradients with the whole model's, by the model's own parameter names (call
    on every rank, after the step).

    The reference is the model as the user has it (a Hugging Face model, a factory's module), not the graph
    the planner captured from it, holding the step's starting weights: so a capture that changed what the
    model computes shows here. Every parameter of the reference that has a gradient must come back from some
    rank: one missing counts as an infinite difference.

    Args:
        pipe: the pipeline that ran the step (stages from a plan: their names are the model's).
        reference: on rank 0, the whole model with the step's starting weights; None elsewhere.
        batches: on rank 0, each replica's ``(inputs, targets)`` of the step, in replica order.
        loss_fn: the loss the pipeline's step used.
        kwargs: the keyword inputs of every call of the model (``use_cache=False``).
        loss_divisors: as :func:`compare_gradients`'.

    Returns:
        On rank 0, the largest absolute and relative differences; None elsewhere.
    """
    gathered = _gathered(pipe, pipe.names.model_key, pipe.modules)
    if reference is None:
        return None
    model = reference.to(pipe.device)
    _reference_backward(model, pipe.device, batches, loss_fn, kwargs, loss_divisors, pipe.config.precision)
    expected: dict[str, torch.Tensor] = {}
    tensors: dict[int, set[str]] = {}  # a tied tensor's names: any one of them found is enough
    for name, param in model.named_parameters(remove_duplicate=False):
        if param.grad is not None:
            expected[name] = param.grad.cpu()
            tensors.setdefault(id(param), set()).add(name)
    pairs = []
    for part in gathered:
        for name, grad in part.items():
            if name not in expected:
                return math.inf, math.inf  # a gradient the whole model has none of
            pairs.append((grad, expected[name]))
    found = {name for part in gathered for name in part}
    if any(not names & found for names in tensors.values()):
        return math.inf, math.inf  # a gradient of the whole model that no rank holds
    return _worst(pairs)


def _gathered(
    pipe: Pipeline, key: Callable[[int, str], Any], modules: Mapping[int, torch.nn.Module] | Sequence[torch.nn.Module]
) -> list[Any]:
    """Every rank's gradients of its stages' parameters (``modules[stage]``), each under ``key(stage, name)``
    (None: left out), put together where sharded, on the host; on every rank, in rank order."""
    local: dict[Any, torch.Tensor] = {}
    for stage in pipe.stages:
        for name, param in modules[stage].named_parameters():
            said = key(stage, name)
            if param.grad is None or said is None:
                continue
            grad = param.grad.full_tensor() if is_dtensor(param.grad) else param.grad  # type: ignore[attr-defined]
            local[said] = grad.detach().cpu().clone()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


def _reference_backward(
    model: torch.nn.Module,
    device: torch.device,
    batches: Sequence[tuple[list[Any], list[torch.Tensor]]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    kwargs: dict[str, Any],
    loss_divisors: Sequence[float] | None,
    precision: Precision,
) -> None:
    """The step's backward on the unsplit ``model``: every replica's micro-batches, each loss divided as the
    step divided it and by the replicas (their gradients are averaged); under ``precision="bf16"`` the forward and
    the loss under the autocast the pipeline's stages run under (the backward outside it, as theirs)."""
    for replica, (inputs, targets) in enumerate(batches):
        divisor = loss_divisors[replica] if loss_divisors is not None else len(inputs)
        scale = divisor * len(batches)
        for x, y in zip(to_device(inputs, device), to_device(targets, device), strict=True):
            with torch.autocast(device.type, torch.bfloat16, enabled=precision is Precision.BF16):
                output = model(*x, **kwargs) if isinstance(x, tuple) else model(x, **kwargs)
                loss = loss_fn(getattr(output, "logits", output), y) / scale
            torch.autograd.backward(loss)


def _worst(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """The largest absolute and relative differences of each ``(got, expected)`` pair."""
    worst_abs = worst_rel = 0.0
    for got, expected in pairs:
        diff = (got - expected).abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / max(expected.abs().max().item(), 1e-12))
    return worst_abs, worst_rel
