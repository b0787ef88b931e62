"""A step's micro-batches: the batch split, placed on the device and put in the step's order."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias

import numpy as np
import torch
import torch.distributed as dist

from hintpipe.device import to_device
from hintpipe.runtime.loop.admission import Admission, exchange_sizes
from hintpipe.runtime.loop.emulated import EmulatedExecutor
from hintpipe.runtime.loop.executor import Executor
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.transport.wire import tensors_of
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import MicrobatchOrder, microbatch_order


class StepParts(Protocol):
    """What a step's micro-batches need of the rank's pipeline (the assembled parts have it, read-only)."""

    @property
    def rank(self) -> int: ...
    @property
    def hint(self) -> Hint: ...
    @property
    def microbatches(self) -> int: ...
    @property
    def timeout(self) -> float: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def coll(self) -> dist.ProcessGroup: ...
    @property
    def compute(self) -> Executor: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def modules(self) -> dict[int, torch.nn.Module]: ...
    @property
    def stages(self) -> tuple[int, ...]: ...


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


def _samples(value: Batch | Microbatch) -> tuple[int, tuple[int, ...]] | None:
    """The samples (first dimension) of a batch or micro-batch and the shape that says so (its first tensor's);
    None where there is no tensor to tell."""
    first = value[0] if isinstance(value, tuple) and value else value
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return first.shape[0], tuple(first.shape)
    return None


def check_samples(inputs: Batch, target: Batch, count: int) -> None:
    """Inputs and targets split alike: the same number of samples, micro-batch by micro-batch.

    Split apart, a target of fewer samples than its inputs would be broadcast by many a loss function (the
    unsplit model, given the whole batch, refuses the same call).

    Raises:
        ValueError: one line naming both shapes.
    """
    if not isinstance(inputs, list) and not isinstance(target, list):
        a, b = _samples(inputs), _samples(target)
        if a is not None and b is not None and a[0] != b[0]:
            raise ValueError(
                f"inputs of {a[0]} samples (shape {a[1]}) and a target of {b[0]} (shape {b[1]}): give one target "
                "per input sample"
            )
        return
    xs, ys = split_microbatches(inputs, count, "inputs"), split_microbatches(target, count, "target")
    for mb, (x, y) in enumerate(zip(xs, ys, strict=True)):
        a, b = _samples(x), _samples(y)
        if a is not None and b is not None and a[0] != b[0]:
            raise ValueError(
                f"micro-batch {mb}: inputs of {a[0]} samples (shape {a[1]}) and a target of {b[0]} (shape {b[1]}): "
                "give one target per input sample"
            )


def as_inputs(microbatch: Microbatch) -> list[torch.Tensor]:
    """A micro-batch as the list of a first stage's inputs."""
    return list(microbatch) if isinstance(microbatch, tuple) else [microbatch]


#: Per ``forward`` function, its positional parameters (None: nothing to check): read once, since
#: ``inspect.signature`` costs tens of microseconds and the check runs on every micro-batch of every step.
_POSITIONAL: dict[tuple[object, bool], list[inspect.Parameter] | None] = {}


def _positional(forward: Callable[..., object]) -> list[inspect.Parameter] | None:
    """``forward``'s positional parameters; None where it has no signature or takes ``*args`` or ``**kwargs``."""
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a signature: nothing to check
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None
    return [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_arity(stage: torch.nn.Module, given: int, mb: int) -> None:
    """Refuse, before anything runs, a first-stage micro-batch of more or fewer tensors than the stage's
    ``forward`` takes (a packed micro-batch is ``(ids, documents)``: a model that takes ids alone failed in its
    first forward, after whatever came before the step).

    Raises:
        ValueError: naming the stage's inputs, the micro-batch and the fix.
    """
    forward = stage.forward
    function = getattr(forward, "__func__", forward)
    key = (function, function is not forward)  # one per function (a bound method's signature drops ``self``)
    if key not in _POSITIONAL:
        if len(_POSITIONAL) >= 256:  # bounded: a caller may make forwards without end
            _POSITIONAL.clear()
        _POSITIONAL[key] = _positional(forward)
    positional = _POSITIONAL[key]
    if positional is None:
        return
    required = sum(p.default is p.empty for p in positional)
    if required <= given <= len(positional):
        return
    names = ", ".join(p.name for p in positional)
    takes = f"{required}" if required == len(positional) else f"{required} to {len(positional)}"
    fix = (
        ": packed rows come as (ids, documents); form them without pack=True for a model that takes the ids "
        "alone, or give the model a forward that takes the documents"
        if given == 2 and len(positional) == 1
        else ": give each micro-batch as a tuple of the stage's inputs, in order"
    )
    raise ValueError(f"stage 0 takes {takes} input(s) ({names}); micro-batch {mb} has {given} tensor(s){fix}")


def prepare_step(
    step: int,
    parts: StepParts,
    inputs: Batch | None,
    target: Batch | None,
    loss_divisor: float | None,
) -> StepState:
    """The step's first-stage inputs and last-stage targets, split into micro-batches, on the rank's device."""
    m = parts.microbatches
    state = StepState(step, {}, loss_scale=1.0 / (loss_divisor if loss_divisor is not None else m))
    emulated = isinstance(parts.compute, EmulatedExecutor)
    if inputs is not None and target is not None:
        check_samples(inputs, target, m)
    if 0 in parts.stages:
        if inputs is None and isinstance(parts.compute, EmulatedExecutor):
            inputs = [torch.empty(parts.compute.costs.reference_size, dtype=torch.uint8)] * m
        if inputs is None:
            raise ValueError(f"rank {parts.rank} hosts stage 0 and needs the inputs")
        for mb, batch in enumerate(split_microbatches(inputs, m, "inputs")):
            given = as_inputs(batch)
            if not emulated:
                check_arity(parts.modules[0], len(given), mb)
            state.activations[(0, mb)] = to_device(given, parts.device)
    if parts.hint.stages - 1 in parts.stages and not emulated:
        if target is None:
            raise ValueError(f"rank {parts.rank} hosts the last stage and needs the target")
        state.targets = to_device(split_microbatches(target, m, "target"), parts.device)
    return state


def check_ends(ends: tuple[Sequence[float], Sequence[float]] | None, order: MicrobatchOrder, microbatches: int) -> None:
    """Refuse, in words, ``ends`` that ``order`` would not use or that do not fit the step.

    Raises:
        ValueError: ``ends`` under another order, or not two sequences of one finite number per micro-batch.
    """
    if ends is None:
        return
    if order is not MicrobatchOrder.FRONT_THEN_BACK:
        raise ValueError(
            f"ends are read only under microbatch_order='front-then-back'; this pipeline's is {order.value!r}"
        )
    if len(ends) != 2:
        raise ValueError(f"ends must be two sequences (the first stage's work, the last stage's), got {len(ends)}")
    for name, values in zip(("first", "last"), ends, strict=True):
        numbers = [float(v) for v in values]
        if len(numbers) != microbatches or not all(np.isfinite(numbers)):
            raise ValueError(
                f"ends: the {name} stage's work must be {microbatches} finite numbers, one per micro-batch, got "
                f"{list(values)!r}"
            )


def order_step(
    state: StepState,
    parts: StepParts,
    order: MicrobatchOrder,
    ends: tuple[Sequence[float], Sequence[float]] | None = None,
) -> None:
    """The step's micro-batch sizes where needed (admission by size, an order by size), and its order
    (``state.order``: slot -> given micro-batch).

    [Note: micro-batch order]
    The rank of stage 0 knows every micro-batch's size (input elements)
    and sends the sizes to the pipeline's ranks; each rank derives the same
    permutation from them (:func:`microbatch_order`, deterministic) and the
    step runs slot ``i`` on given micro-batch ``order[i]``: stage 0 takes
    its inputs, the last stage its targets, in that order. Every other rank
    only sees slots. The step's gradient is a sum over micro-batches, so
    the order changes no maths; errors name given micro-batches. Under
    ``front-then-back`` it also sends each micro-batch's known work at the
    first and at the last stage (``Pipeline.step(ends=...)``, given on that
    rank; its input elements at both ends where not given).
    """
    given = list(range(parts.microbatches))
    state.order = given
    admission = parts.admission
    if not (admission.by_size or order is not MicrobatchOrder.GIVEN):
        return
    first = {mb: state.activations[(0, mb)] for mb in given} if 0 in parts.stages else {}
    sizes, both_ends, factors = exchange_sizes(
        {mb: tensors_of(inputs) for mb, inputs in first.items()},
        parts.microbatches,
        parts.hint.placement.stage_rank[0],
        parts.coll,
        rank=parts.rank,
        step=state.step,
        timeout=parts.timeout,
        ends=ends,
        with_ends=order is MicrobatchOrder.FRONT_THEN_BACK,
        factors=admission.measured_factors() if admission.by_bytes else None,
    )
    if factors is not None:
        admission.agree(factors)
    state.order = microbatch_order(sizes, order, ends=both_ends)  # the identity for given
    if 0 in parts.stages:
        state.activations.update({(0, slot): first[mb] for slot, mb in enumerate(state.order)})
    if state.targets:
        state.targets = [state.targets[mb] for mb in state.order]
    if admission.by_size:
        state.elements = [sizes[mb] for mb in state.order]
        state.given_elements = sizes


def relative_sizes(elements: Sequence[int] | None) -> list[float] | None:
    """Each micro-batch's input elements over the median's (the plan's costs are medians), for the
    ETA rule; ``None`` where the step's sizes are not known (nothing needed them)."""
    if elements is None:
        return None
    typical = float(np.median(elements)) or 1.0
    return [e / typical for e in elements]
