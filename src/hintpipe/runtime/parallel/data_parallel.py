"""Data parallelism across pipelines: each stage's gradients averaged over its replicas, once per step.

Ranks at the same pipeline position in different data-parallel replicas hold
the same stages and train on different data. After a step, each stage's
gradient must be the average over the replicas (the gradient of the mean loss
over the global batch). The reduction runs once per step, not once per
micro-batch, and starts *as soon as the stage's last gradient task of the
step is done* (the last ``B``, or the last ``W`` when the hint splits the
backward), so it overlaps the rest of the step's pipeline work: the first
stages finish their backwards last, the last stages first.

:class:`GradientAverage` is a step hook (:mod:`hintpipe.runtime.loop.hooks`):
the step loop tells it when a stage's gradients are complete, and it
completes the reductions at the end of the step.
Each stage's gradients travel as one flat buffer (one all-reduce per stage,
gloo's ``SUM``, then divided by the replica count).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hintpipe.runtime.errors import WatchdogTimeout
from hintpipe.runtime.loop.hooks import Hook

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState
from hintpipe.tensor_bytes import local


class GradientAverage(Hook):
    """The averaging of this rank's stages over their replicas (see the module's docstring): a step hook."""

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        group: dist.ProcessGroup,
        replicas: int,
        rank: int,
        timeout: float,
    ) -> None:
        self.modules = modules
        self.group = group
        self.replicas = replicas
        self.rank = rank
        self.timeout = timeout
        self._pending: list[tuple[int, dist.Work | None, torch.Tensor, list[torch.Tensor]]] = []
        #: Per stage, when its reduction started in the step (perf_counter seconds).
        self.started: dict[int, float] = {}

    def begin_step(self, state: StepState) -> None:
        self._pending.clear()
        self.started.clear()

    def stage_done(self, stage: int) -> None:
        """The stage's gradients are complete: start their average over the replicas."""
        params = [p for p in self.modules[stage].parameters() if p.requires_grad]
        for param in params:
            if param.grad is None:  # unused this step: it still takes part, as zero
                param.grad = torch.zeros_like(param)
        # A tensor-parallel parameter's gradient is a DTensor: its local shard is what this rank averages.
        grads = [local(p.grad) for p in params if p.grad is not None]
        self.started[stage] = time.perf_counter()
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)  # type: ignore[no-untyped-call]
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._pending.append((stage, work, flat, grads))

    def end_step(self, state: StepState) -> None:
        """Finish every reduction of the step and write the averages back into ``.grad``; the step's
        report gets how long the earliest reduction had to overlap the step and how long the end waited."""
        limit = datetime.timedelta(seconds=self.timeout)
        end = time.perf_counter()
        missing = sorted(set(self.modules) - set(self.started))
        if missing:
            raise RuntimeError(
                f"rank {self.rank}: stages {missing} did not finish their gradients in step {state.step}"
            )
        for stage, work, flat, grads in self._pending:
            try:
                if work is not None:
                    work.wait(limit)
            except RuntimeError as exc:
                raise WatchdogTimeout(
                    f"rank {self.rank}: the gradient average of stage {stage} over its data-parallel replicas "
                    f"failed in step {state.step}: {exc}"
                ) from None
            flat /= self.replicas
            averages = _unflatten_dense_tensors(flat, grads)  # type: ignore[no-untyped-call]
            for grad, average in zip(grads, averages, strict=True):
                grad.copy_(average)
        self._pending.clear()
        state.measured["dp_overlap"] = min(end - began for began in self.started.values())
        state.measured["dp_exposed"] = time.perf_counter() - end
