"""What a task computes: forward, backward to the input, weight gradient.

:class:`Executor` is the protocol the step loop drives. :class:`StageExecutor`
runs the real modules; :class:`~hintpipe.runtime.loop.emulated.EmulatedExecutor`
replaces compute by sleeping each task's cost (for more ranks than cores: the
messages are real, the arithmetic is not). :mod:`hintpipe.runtime.faults` wraps either to inject
variability and faults.

The weight-gradient split (B computes the input gradients, W the weight
gradients later) puts off the linear layers' weight gradients as closures over
what they need, so that B and W together cost one backward (see [Note: weight
gradients put off] in :mod:`hintpipe.runtime.loop.weight_deferral`).

Every task runs inside ``torch.profiler.record_function("hintpipe F stage 3 mb 5")``
(:func:`task_span`), as torch's own pipeline schedules wrap each action, so a
``torch.profiler`` trace of a step shows which task each kernel belongs to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn
from torch.autograd.profiler import record_function

from hintpipe.runtime.loop.task_seeds import TaskSeeds
from hintpipe.runtime.loop.weight_deferral import WeightDeferral, defer_linear_weights
from hintpipe.runtime.transport.wire import Value, tensors_of
from hintpipe.schedule.task import Kind
from hintpipe.tensor_bytes import SavedCounter, count_saved, parameter_storages

Tensors = list[torch.Tensor | None]
LossFn = Callable[[Any, Any], torch.Tensor]


class Executor(Protocol):
    """What the step loop asks of compute: run one task of this rank's stages.

    ``live_bytes`` is what the forwards not yet released by their last
    backward task hold (for byte admission and the reports).
    """

    @property
    def live_bytes(self) -> int:
        """Bytes the forwards not yet released hold."""

    def begin_step(self, step: int) -> None:
        """The loop starts step ``step`` (wrappers that inject per-step work read it)."""

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        """Run F; returns (outputs to send on, the scaled loss at the last stage or None). Inputs and outputs
        are tensors and numbers ([Note: numbers cross a cut on the host] in :mod:`hintpipe.planner.stagegen`)."""

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        """Run B; returns the gradients for the stage inputs (None where none)."""

    def weight(self, stage: int, mb: int) -> None:
        """Run W: accumulate the weight gradients B left out."""

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        """Run an evaluation's F: as :meth:`forward`, without gradients, keeping nothing for a backward."""


def task_span(kind: Kind, stage: int, mb: int) -> AbstractContextManager[Any]:
    """The ``torch.profiler`` range of one task: ``hintpipe F stage 3 mb 5`` (its kind, global stage and
    micro-batch), the name a profile of the runtime groups its kernels and copies under; nothing while no
    profiler runs (a range costs about 0.1 ms a task even then, 1% of a small model's step)."""
    if not torch._C._autograd._profiler_enabled():
        return contextlib.nullcontext()
    return record_function(f"hintpipe {kind.name} stage {stage} mb {mb}")


class ExecutorWrapper:
    """An executor around another: every call passes through to ``inner``; subclasses add to the ones
    they care about (injected faults, gradient reductions). ``begin_step`` always reaches ``inner``."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner

    @property
    def live_bytes(self) -> int:
        return self.inner.live_bytes

    def begin_step(self, step: int) -> None:
        self.inner.begin_step(step)

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        return self.inner.forward(stage, mb, inputs, target, loss_scale)

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        return self.inner.backward(stage, mb, grads)

    def weight(self, stage: int, mb: int) -> None:
        self.inner.weight(stage, mb)

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        return self.inner.evaluate(stage, mb, inputs, target, loss_scale)


def as_values(value: Any) -> list[Value]:
    """A stage's output as the list of values it sends on: a tensor, a number (a sequence length: [Note:
    numbers cross a cut on the host] in :mod:`hintpipe.planner.stagegen`), or a tuple/list of them."""
    if _sendable(value):
        return [value]
    if isinstance(value, (tuple, list)) and all(_sendable(v) for v in value):
        return list(value)
    got = type(value).__name__
    if isinstance(value, (tuple, list)):
        bad = next(i for i, v in enumerate(value) if not _sendable(v))
        got += f" whose element {bad} is a {type(value[bad]).__name__}"
    raise TypeError(
        f"a stage must return a tensor, a number or a tuple of them, got {got}; "
        "wrap other outputs (dicts, dataclasses) in a tuple of tensors"
    )


def _sendable(value: Any) -> bool:
    """Whether a message carries ``value`` as it is: a tensor, or a Python number (in its header)."""
    return isinstance(value, (torch.Tensor, int, float))


def as_tensors(value: Any) -> list[torch.Tensor]:
    """A stage's output as a list of tensors (a tensor, or a tuple/list of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    got = type(value).__name__
    if isinstance(value, (tuple, list)):
        bad = next(i for i, v in enumerate(value) if not isinstance(v, torch.Tensor))
        got += f" whose element {bad} is a {type(value[bad]).__name__}"
    raise TypeError(
        f"a stage must return a tensor or a tuple of tensors, got {got}; "
        "wrap other outputs (dicts, dataclasses) in a tuple of tensors"
    )


def scaled_loss(loss: Any, scale: float) -> torch.Tensor:
    """The loss ``loss_fn`` returned, times ``scale``; refused in words unless it is a scalar tensor (a Python
    number has no gradient to run backward from, a tensor of several values no one loss)."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss_fn must return a scalar tensor, got a {type(loss).__name__}")
    if loss.dim() != 0:
        raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
    return loss * scale


def as_input(value: Value) -> Value:
    """A received activation as a leaf input: floating tensors require grad; a number is taken as it came,
    never through a device tensor (no ``.item()``: [Note: numbers in the header] in
    :mod:`hintpipe.runtime.transport.wire`)."""
    if not isinstance(value, torch.Tensor):
        return value
    leaf = value.detach()
    if leaf.is_floating_point():
        leaf.requires_grad_(True)
    return leaf


def _with_gradients(outputs: Sequence[Value], grads: Tensors | None) -> tuple[list[torch.Tensor], Tensors | None]:
    """The tensors among a forward's ``outputs`` and their gradients: a number sent on has none."""
    kept = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)]
    tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
    return tensors, (None if grads is None else [grads[i] for i in kept])


def _requires_grad(value: Value) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _full_backward(outputs: list[torch.Tensor], grads: Tensors | None) -> None:
    """Backward from ``outputs`` (given their gradients; none for a loss) into
    the inputs' and parameters' ``.grad``."""
    pairs = [
        (o, None if grads is None else grads[i])
        for i, o in enumerate(outputs)
        if o.requires_grad and (grads is None or grads[i] is not None)
    ]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], None if grads is None else [g for _, g in pairs])


class StageExecutor:
    """Runs this rank's stage modules.

    Args:
        modules: global stage id -> module, for the stages this rank hosts.
        last_stage: the global id of the pipeline's last stage.
        loss_fn: ``loss_fn(output, target)`` at the last stage.
        split_backward: whether W tasks are separate from B.
        allocated: on a GPU, the allocator's bytes now (``torch.cuda.memory_allocated``, less what the
            receiving threads allocated: :class:`~hintpipe.device.ReceivedBytes`): each forward's counted
            bytes are then checked against what the allocator gained over it (:attr:`memory_check`), from
            each stage's second forward on (the first also allocates what stays for good: cuBLAS's
            workspace, lazily built state).
        autocast: run forwards and the loss under ``torch.autocast(device_type, dtype)`` (None: as they
            are). Backwards run outside it, as autocast's own recipe has them.
        seeds: seed each training forward's generators for its task (see [Note: a task's random numbers] in
            :mod:`~hintpipe.runtime.loop.task_seeds`); None: forwards draw from the generators as they stand.
    """

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        last_stage: int,
        loss_fn: LossFn,
        split_backward: bool,
        allocated: Callable[[], int] | None = None,
        autocast: tuple[str, torch.dtype] | None = None,
        seeds: TaskSeeds | None = None,
    ) -> None:
        self.modules = dict(modules)
        #: Each training forward's generators seeded for its task (see [Note: a task's random numbers]).
        self.seeds = seeds
        self.autocast = autocast
        self.last_stage = last_stage
        self.loss_fn = loss_fn
        self.split = split_backward
        self._inputs: dict[tuple[int, int], list[Value]] = {}
        self._outputs: dict[tuple[int, int], list[Value]] = {}
        #: With a split backward: the linear layers put off their weight gradients into ``_put_off`` per task.
        self._deferral = WeightDeferral() if split_backward else None
        if split_backward:
            for module in self.modules.values():
                defer_linear_weights(module)
        self._put_off: dict[tuple[int, int], list[Callable[[], None]]] = {}
        self._deferred: dict[tuple[int, int], tuple[list[torch.Tensor], Tensors | None]] = {}
        self.live_bytes = 0
        self._bytes: dict[tuple[int, int], int] = {}
        self._param_storages = {s: parameter_storages(m) for s, m in self.modules.items()}
        # Bytes a forward keeps, by stage and input shapes: counting them with saved-tensor
        # hooks costs a Python call per saved tensor (3-5% of a small transformer stage's
        # forward), so each shape is counted once. A stage whose saved bytes depend on its
        # input's values rather than its shapes would be counted at its first such input.
        self._kept: dict[tuple[int, tuple[Any, ...]], int] = {}
        self.allocated = allocated
        #: This step's forwards: (bytes counted, bytes the allocator gained over the forward), with ``allocated``.
        self.memory_check: list[tuple[int, int]] = []
        self._warm: set[int] = set()  # stages whose first forward ran

    def begin_step(self, step: int) -> None:
        """A new step's memory check (what a task computes does not depend on the step), and its seed."""
        self.memory_check = []
        if self.seeds is not None:
            self.seeds.begin_step()

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        """Run F; returns (outputs to send on, loss at the last stage or None)."""
        key = (stage, tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else v for v in inputs))
        known = self._kept.get(key)
        counting: contextlib.AbstractContextManager[SavedCounter | None] = contextlib.nullcontext()
        if known is None:
            exclude = self._param_storages[stage]
            if stage == 0:  # the caller's batch (often one tensor, split into views): not the pipeline's memory
                exclude = exclude | {t.untyped_storage().data_ptr() for t in tensors_of(inputs)}
            counting = count_saved(exclude)
        measured = self.allocated if stage in self._warm else None
        self._warm.add(stage)
        before = measured() if measured is not None else 0
        precision = contextlib.nullcontext() if self.autocast is None else torch.autocast(*self.autocast)
        # A stage with no input gradient to compute (the first) runs its whole backward in W (see _backward): its
        # layers have nothing to put off, and deferring would only slow its forward.
        deferring: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self._deferral is not None and any(_requires_grad(i) for i in inputs):
            deferring = self._deferral.active()
        seeded = contextlib.nullcontext() if self.seeds is None else self.seeds.seeded(stage, mb)
        with task_span(Kind.F, stage, mb), seeded, counting as counter, precision, deferring:
            out = self.modules[stage](*inputs)
            loss = None
            outputs: list[Value]
            if stage == self.last_stage:
                loss = scaled_loss(self.loss_fn(out, target), loss_scale)
                outputs = [loss]
            else:
                outputs = as_values(out)
        self._inputs[(stage, mb)] = list(inputs)
        self._outputs[(stage, mb)] = outputs
        if counter is None:
            assert known is not None
            size = known
        else:
            # Activations: what autograd saved, the received inputs and the outputs
            # kept as the roots of the backward; each storage once, parameters and
            # the first stage's inputs excluded.
            for t in tensors_of([*inputs, *outputs]):
                counter.add(t)
            size = counter.total
            if len(self._kept) < 4096:  # bounded: shapes may vary without end
                self._kept[key] = size
        self._bytes[(stage, mb)] = size
        self.live_bytes += size
        if measured is not None:
            # What the forward left allocated: its saved activations and outputs (the loss's few bytes aside).
            self.memory_check.append((size, measured() - before))
        return (outputs if loss is None else []), (None if loss is None else loss.detach())

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        """Run B; returns the gradients for the stage inputs (None where none)."""
        with task_span(Kind.B, stage, mb):
            return self._backward(stage, mb, grads)

    def _backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        outputs, grads = _with_gradients(self._outputs.pop((stage, mb)), grads)
        inputs = self._inputs.pop((stage, mb))
        if self.split and not any(_requires_grad(i) for i in inputs):
            # No input gradient to compute (the first stage): all of the
            # backward is weight gradient, and W runs it, as torch does.
            self._deferred[(stage, mb)] = (outputs, grads)
            result: Tensors = [None] * len(inputs)
        elif self._deferral is not None:
            put_off = self._put_off[(stage, mb)] = []
            with self._deferral.collecting(put_off):
                _full_backward(outputs, grads)
            result = [i.grad if isinstance(i, torch.Tensor) and i.requires_grad else None for i in inputs]
        else:
            _full_backward(outputs, grads)
            result = [i.grad if isinstance(i, torch.Tensor) and i.requires_grad else None for i in inputs]
            self._release(stage, mb)
        return result

    def weight(self, stage: int, mb: int) -> None:
        """Run W: accumulate the weight gradients B left out."""
        with task_span(Kind.W, stage, mb):
            deferred = self._deferred.pop((stage, mb), None)
            if deferred is not None:  # the whole backward, its linear layers' weight gradients at once
                _full_backward(*deferred)
            for weight_gradients in self._put_off.pop((stage, mb), []):
                weight_gradients()
        self._release(stage, mb)

    def _release(self, stage: int, mb: int) -> None:
        self.live_bytes -= self._bytes.pop((stage, mb), 0)

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        """Run an evaluation's F under ``torch.no_grad`` (and the training precision)."""
        precision = contextlib.nullcontext() if self.autocast is None else torch.autocast(*self.autocast)
        with task_span(Kind.F, stage, mb), torch.no_grad(), precision:
            out = self.modules[stage](*inputs)
            if stage != self.last_stage:
                return as_values(out), None
            loss = scaled_loss(self.loss_fn(out, target), loss_scale)
        return [], loss
