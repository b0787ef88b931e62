"""Data parallelism across pipelines: each stage's gradients averaged over its replicas, once per step.

Ranks at the same pipeline position in different data-parallel replicas hold
the same stages and train on different data. After a step, each stage's
gradient must be the average over the replicas (the gradient of the mean loss
over the global batch). The reduction runs once per step, not once per
micro-batch, and starts *as soon as the stage's last gradient task of the
step is done* (the last ``B``, or the last ``W`` when the hint splits the
backward), so it overlaps the rest of the step's pipeline work: the first
stages finish their backwards last, the last stages first.

:class:`ReducingExecutor` wraps the executor to see those tasks finish;
:meth:`GradientAverage.wait` completes the reductions at the end of the step.
Each stage's gradients travel as one flat buffer (one all-reduce per stage,
gloo's ``SUM``, then divided by the replica count).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hintpipe.runtime.errors import WatchdogTimeout
from hintpipe.runtime.executor import Executor, ExecutorWrapper, Tensors
from hintpipe.schedule.task import Kind
from hintpipe.tensor_bytes import local


class GradientAverage:
    """The averaging of this rank's stages over their replicas (see the module's docstring)."""

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        group: dist.ProcessGroup,
        replicas: int,
        microbatches: int,
        split_backward: bool,
        rank: int,
    ) -> None:
        self.modules = modules
        self.group = group
        self.replicas = replicas
        self.microbatches = microbatches
        self.last_kind = Kind.W if split_backward else Kind.B
        self.rank = rank
        self._done: dict[int, int] = {}
        self._pending: list[tuple[int, dist.Work | None, torch.Tensor, list[torch.Tensor]]] = []
        #: Per stage, when its reduction started in the last step (perf_counter seconds).
        self.started: dict[int, float] = {}
        #: In the last step: per stage, the time its reduction had to overlap the rest of the step (from its
        #: start to the step's end), and the time the step's end still waited for all of them (not hidden).
        self.overlap: dict[int, float] = {}
        self.exposed = 0.0

    def begin_step(self) -> None:
        """Called by the pipeline at the start of each step (not through the executor chain)."""
        self._done = dict.fromkeys(self.modules, 0)
        self._pending.clear()
        self.started.clear()

    def task_done(self, stage: int, kind: Kind) -> None:
        """A gradient task finished; the stage's last of the step starts its reduction."""
        if kind is not self.last_kind:
            return
        self._done[stage] += 1
        if self._done[stage] == self.microbatches:
            self._start(stage)

    def _start(self, stage: int) -> None:
        params = [p for p in self.modules[stage].parameters() if p.requires_grad]
        for param in params:
            if param.grad is None:  # unused this step: it still takes part, as zero
                param.grad = torch.zeros_like(param)
        # A tensor-parallel parameter's gradient is a DTensor: its local shard is what this rank averages.
        grads = [local(p.grad) for p in params if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)  # type: ignore[no-untyped-call]
        self.started[stage] = time.perf_counter()
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._pending.append((stage, work, flat, grads))

    def wait(self, step: int, timeout: float) -> None:
        """Finish every reduction of the step and write the averages back into ``.grad``."""
        limit = datetime.timedelta(seconds=timeout)
        end = time.perf_counter()
        self.overlap = {stage: end - began for stage, began in self.started.items()}
        for stage, work, flat, grads in self._pending:
            try:
                if work is not None:
                    work.wait(limit)
            except RuntimeError as exc:
                raise WatchdogTimeout(
                    f"rank {self.rank}: the gradient average of stage {stage} over its data-parallel replicas "
                    f"failed in step {step}: {exc}"
                ) from None
            flat /= self.replicas
            averages = _unflatten_dense_tensors(flat, grads)  # type: ignore[no-untyped-call]
            for grad, average in zip(grads, averages, strict=True):
                grad.copy_(average)
        self.exposed = time.perf_counter() - end
        missing = [s for s, n in self._done.items() if n != self.microbatches]
        if missing:
            raise RuntimeError(f"rank {self.rank}: stages {missing} did not finish their gradients in step {step}")
        self._pending.clear()


class ReducingExecutor(ExecutorWrapper):
    """An executor that tells a :class:`GradientAverage` when each gradient task is done."""

    def __init__(self, inner: Executor, average: GradientAverage) -> None:
        super().__init__(inner)
        self.average = average

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        result = self.inner.backward(stage, mb, grads)
        self.average.task_done(stage, Kind.B)
        return result

    def weight(self, stage: int, mb: int) -> None:
        self.inner.weight(stage, mb)
        self.average.task_done(stage, Kind.W)
