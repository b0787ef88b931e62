"""Emulated compute: each task sleeps its cost instead of computing (for more ranks than cores: the messages are
real, the arithmetic is not), with the costs per stage (:class:`EmulatedCosts`), measured on this machine by
:func:`hintpipe.apps.emulation.profile_costs` or given."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hintpipe.runtime.loop.executor import Tensors, task_span
from hintpipe.runtime.transport.wire import Value, tensors_of
from hintpipe.schedule.task import Kind


@dataclasses.dataclass(frozen=True)
class EmulatedCosts:
    """Per-stage task costs in seconds for a micro-batch of ``reference_size``
    input elements (the first input tensor's ``numel``); a micro-batch costs in
    proportion to its size.

    A model with several inputs whose costs vary apart (a vision-language
    model: the encoder's with the image count, the decoder's with the text
    length) says, per stage, which of the first stage's input tensors sizes
    it (``sized_by``), and each input's reference ``numel`` (``references``).
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    reference_size: int
    sized_by: tuple[int, ...] = ()  # per stage (empty: the first input for every stage)
    references: tuple[int, ...] = ()  # per input of the first stage (empty: reference_size for the first)

    def __post_init__(self) -> None:
        if not len(self.forward) == len(self.backward) == len(self.weight):
            raise ValueError("forward, backward and weight need one cost per stage each")
        if self.reference_size < 1:
            raise ValueError(f"reference_size must be at least 1, got {self.reference_size}")
        if self.sized_by and len(self.sized_by) != len(self.forward):
            raise ValueError(f"sized_by names an input for {len(self.sized_by)} stages, not {len(self.forward)}")
        if any(not 0 <= i < max(1, len(self.references)) for i in self.sized_by):
            raise ValueError(f"sized_by {self.sized_by} names inputs beyond the {len(self.references)} references")

    def scaled(self, factor: float) -> EmulatedCosts:
        """These costs, every task's times ``factor`` (an emulated unit longer than the profiled one)."""
        return dataclasses.replace(
            self,
            forward=tuple(c * factor for c in self.forward),
            backward=tuple(c * factor for c in self.backward),
            weight=tuple(c * factor for c in self.weight),
        )

    def cost(self, stage: int, kind: Kind, size: float | Sequence[float]) -> float:
        """The cost of a task on a micro-batch of ``size`` elements (one per input of the first stage)."""
        base = (self.forward, self.backward, self.weight)[kind][stage]
        if isinstance(size, (int, float)):
            return base * size / self.reference_size
        which = self.sized_by[stage] if self.sized_by else 0
        reference = self.references[which] if self.references else self.reference_size
        return base * size[which] / reference


class EmulatedExecutor:
    """Sleeps each task's cost instead of computing.

    The first stage's inputs are the real batch; their sizes (elements of
    each input tensor) travel down the pipeline as a small activation, so
    every stage sleeps in proportion to the micro-batch it serves (see
    :class:`EmulatedCosts` for models with several inputs), with no tensors
    of the model's sizes.

    Args:
        costs: the per-stage costs.
        last_stage: the pipeline's last stage (its F produces the loss, zero).
        factor: ``factor(step, stage, kind, mb)`` multiplies each cost (injected variability).
        couple: with tensor-parallel stages, what ends every task (given by the assembly): a real task runs
            collectives with its group's other members, so it ends no sooner than the slowest of them; an
            emulated one stands in for them with one small all-reduce over the group.
    """

    def __init__(
        self,
        costs: EmulatedCosts,
        last_stage: int,
        factor: Callable[[int, int, Kind, int], float] | None = None,
        *,
        couple: Callable[[], None] | None = None,
    ) -> None:
        if len(costs.forward) != last_stage + 1:
            raise ValueError(f"emulated costs are for {len(costs.forward)} stages, the pipeline has {last_stage + 1}")
        self.costs = costs
        self.last_stage = last_stage
        self.factor = factor
        self.couple = couple
        #: Seconds spent in ``couple``: waiting for the group's slowest member (its own work, or a late decision).
        self.coupled_seconds = 0.0
        self.live_bytes = 0
        self.step = 0
        self._sizes: dict[tuple[int, int], list[float]] = {}

    def begin_step(self, step: int) -> None:
        self.step = step

    def duration(self, stage: int, kind: Kind, mb: int, size: float | Sequence[float]) -> float:
        """Seconds the task sleeps: its cost for a micro-batch of ``size`` elements (one per input of
        the first stage), times its factor."""
        scale = self.factor(self.step, stage, kind, mb) if self.factor is not None else 1.0
        return self.costs.cost(stage, kind, size) * scale

    def _sleep(self, stage: int, kind: Kind, mb: int, size: Sequence[float]) -> None:
        with task_span(kind, stage, mb):
            time.sleep(self.duration(stage, kind, mb, size))
            if self.couple is not None:
                began = time.perf_counter()
                self.couple()
                self.coupled_seconds += time.perf_counter() - began

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        tensors = tensors_of(inputs)  # the batch, or the sizes it sent on
        if stage == 0:
            size = [float(t.numel()) for t in tensors]
        else:
            size = [float(v) for v in tensors[0].detach().reshape(-1).tolist()]
        self._sizes[(stage, mb)] = size
        self._sleep(stage, Kind.F, mb, size)
        if stage == self.last_stage:
            return [], torch.zeros(())
        return [torch.tensor(size)], None

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        self._sleep(stage, Kind.B, mb, self._sizes[(stage, mb)])
        return [torch.zeros(1)]

    def weight(self, stage: int, mb: int) -> None:
        self._sleep(stage, Kind.W, mb, self._sizes[(stage, mb)])

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        outputs, loss = self.forward(stage, mb, inputs, target, loss_scale)
        del self._sizes[(stage, mb)]
        return outputs, loss
