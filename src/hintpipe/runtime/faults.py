"""Injected variability and faults, as wrappers around the executor, the transport and the checkpoint writer.

:mod:`hintpipe.runtime.assembly` applies an
:class:`~hintpipe.runtime.injection.Injection` as it builds a pipeline (given
as ``Seams(injection=...)``): cost factors wrap the executor
(:func:`injected_executor`; emulated compute sleeps them itself), faults wrap
it again, message delays wrap the transport (:func:`injected_transport`). The
step loop knows none of it, and a built pipeline is never rewired.
:func:`failing_writer` makes the checkpoint writer that fails a save where the
injection says, inside torch.distributed.checkpoint's own writing, as a full
disk would.

[Note: how the runtime realises a cost factor]
A task of cost ``t`` costs ``X t`` under a factor ``X``. With emulated compute
that is exact (the task sleeps ``X t``). Real compute cannot be made faster:
a task that computed for ``t`` sleeps ``(X - 1) t`` more when ``X > 1`` and
runs as it is when ``X <= 1``, so its mean factor is ``E[max(X, 1)]`` (1.20
for sigma 0.5), not 1. Use ``--emulate`` for the simulator's distribution.

``t`` is the CPU time the computing thread spent in the task, not its wall
time: a tensor-parallel task's wall time includes its wait in the group's
collectives for the other members, which includes *their* padding; padding by
it fed each member's delay into the next task's factor, and one step of
``tp:2:0.3`` on 4 real ranks took 59 s where its neighbours took 0.6-2.7 s.
(Ranks compute with one intra-op thread; on a GPU the thread's time is the
host's, as the wall time around an asynchronous launch was.)
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import heapq
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hintpipe.dispatch.variability import CommDelay
from hintpipe.runtime.checkpoint.manifest import step_of
from hintpipe.runtime.injection import CostFactors, Injection
from hintpipe.runtime.loop.emulated import EmulatedExecutor
from hintpipe.runtime.loop.executor import Executor, ExecutorWrapper, Tensors
from hintpipe.runtime.rank_process import attempt
from hintpipe.runtime.transport.protocol import Transport
from hintpipe.runtime.transport.wire import Message, MessageKind, Value
from hintpipe.schedule.task import Kind

if TYPE_CHECKING:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

log = logging.getLogger(__name__)


class StepAware(ExecutorWrapper):
    """Executor wrappers learn where the step loop is through :meth:`begin_step` (and pass it on)."""

    step = 0

    def begin_step(self, step: int) -> None:
        self.step = step
        super().begin_step(step)


class VariedExecutor(StepAware):
    """Real compute made slower by the injected factors (see [Note: how the runtime realises a cost factor])."""

    def __init__(self, inner: Executor, factors: CostFactors) -> None:
        super().__init__(inner)
        self.factors = factors

    def _pad(self, began: float, stage: int, kind: Kind, mb: int) -> None:
        factor = self.factors(self.step, stage, kind, mb)
        if factor > 1.0:
            time.sleep((factor - 1.0) * (time.thread_time() - began))

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        began = time.thread_time()
        result = self.inner.forward(stage, mb, inputs, target, loss_scale)
        self._pad(began, stage, Kind.F, mb)
        return result

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        began = time.thread_time()
        result = self.inner.backward(stage, mb, grads)
        self._pad(began, stage, Kind.B, mb)
        return result

    def weight(self, stage: int, mb: int) -> None:
        began = time.thread_time()
        self.inner.weight(stage, mb)
        self._pad(began, stage, Kind.W, mb)


class FaultyExecutor(StepAware):
    """Crashes, hangs or poisons the loss where the injection says, for tests of failure handling.

    A crash or hang happens when the rank starts its second task of the step
    (its first has run, so its neighbours are mid-step too).
    """

    def __init__(self, inner: Executor, injection: Injection, rank: int) -> None:
        super().__init__(inner)
        self.injection = injection
        self.rank = rank
        self._tasks = 0
        self._first_attempt = attempt() == 0  # a restarted job runs past its injected crash

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self._tasks = 0

    def _maybe_fail(self) -> None:
        self._tasks += 1
        if self._tasks != 2 or not self._first_attempt:
            return
        if (self.rank, self.step) in self.injection.crash:
            log.error("rank %d: injected crash in step %d", self.rank, self.step)
            os._exit(3)
        if (self.rank, self.step) in self.injection.hang:
            log.error("rank %d: injected hang in step %d", self.rank, self.step)
            while True:
                time.sleep(3600)

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        self._maybe_fail()
        if self.step in self.injection.nan_steps and mb == 0:
            loss_scale = float("nan")
        return self.inner.forward(stage, mb, inputs, target, loss_scale)

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        self._maybe_fail()
        return self.inner.backward(stage, mb, grads)

    def weight(self, stage: int, mb: int) -> None:
        self._maybe_fail()
        self.inner.weight(stage, mb)


class DelayedTransport:
    """A transport whose messages arrive ``latency + Exp(jitter)`` seconds late,
    still first in first out per neighbour (a later message is never delivered
    before an earlier one from the same peer)."""

    def __init__(self, inner: Transport, delay: CommDelay, seed: int = 0) -> None:
        self.inner = inner
        self.delay = delay
        self._rng = np.random.default_rng([seed, 4])
        self._held: list[tuple[float, int, Message]] = []  # (due, order, message)
        self._last_due: dict[int, float] = {}
        self._order = 0

    def _hold(self, msg: Message) -> None:
        extra = float(self._rng.exponential(self.delay.jitter)) if self.delay.jitter else 0.0
        due = max(msg.arrived + self.delay.latency + extra, self._last_due.get(msg.peer, 0.0))
        self._last_due[msg.peer] = due
        self._order += 1
        heapq.heappush(self._held, (due, self._order, msg))

    def get(self, timeout: float | None) -> Message | None:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            while (arrived := self.inner.get(0)) is not None:
                self._hold(arrived)
            now = time.perf_counter()
            if self._held and self._held[0][0] <= now:
                due, _, msg = heapq.heappop(self._held)
                msg.arrived = due  # when it would have come over a slower link
                return msg
            wait = self._held[0][0] - now if self._held else None
            if deadline is not None:
                left = deadline - now
                if left <= 0:
                    return None
                wait = left if wait is None else min(wait, left)
            arrived = self.inner.get(wait)
            if arrived is not None:
                self._hold(arrived)

    def send(self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[Value]) -> None:
        self.inner.send(peer, kind, step, stage, mb, tensors)

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.inner.notify(peer, step, stage, mb, of)

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.inner.ask(peer, step, stage, mb, of)

    def flush(self, timeout: float) -> None:
        self.inner.flush(timeout)

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        self.inner.close(timeout, error)


def cost_factors(injection: Injection, stages: int, microbatches: int, member: int) -> CostFactors | None:
    """The injection's cost factors on a pipeline of this size, as tensor-parallel ``member`` draws them (its own
    draw of the member factor); None where no task's cost varies."""
    if not injection.varies:
        return None
    return dataclasses.replace(injection.factors(stages, microbatches), member=member)


def injected_executor(compute: Executor, injection: Injection, factors: CostFactors | None, rank: int) -> Executor:
    """What the step loop calls: ``compute`` slowed by ``factors`` (real compute; emulated compute sleeps them
    itself, given them when built), then failing where the injection says (faults name ``rank``, a rank of the
    world)."""
    executor = compute
    if factors is not None and not isinstance(compute, EmulatedExecutor):
        executor = VariedExecutor(executor, factors)
    if injection.faulty:
        executor = FaultyExecutor(executor, injection, rank)
    return executor


def injected_transport(transport: Transport, injection: Injection) -> Transport:
    """``transport``, its messages delayed where the injection says (``comm:``)."""
    comm = injection.comm
    return transport if comm is None else DelayedTransport(transport, comm, injection.seed)


@functools.cache
def _writers() -> tuple[type[FileSystemWriter], type[FileSystemWriter], type[FileSystemWriter]]:
    """torch.distributed.checkpoint's file-system writer, and two that fail: one as a full disk would
    (``ENOSPC``, inside the writer), one by stopping its process (SIGSTOP) as it starts writing, as a frozen
    machine would. Made on first use: that package takes about 0.6 s to import (see
    :mod:`hintpipe.runtime.checkpoint.saving`)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class FullDisk(FileSystemWriter):
        def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(self.path))

    class Frozen(FileSystemWriter):
        def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
            os.kill(os.getpid(), signal.SIGSTOP)
            return super().write_data(plan, planner)

    return FileSystemWriter, FullDisk, Frozen


def failing_writer(injection: Injection, rank: int) -> Callable[[str], FileSystemWriter]:
    """The checkpoint writer of ``rank`` (a global rank): the file system's, except for the saves the
    injection fails (``savefail:RANK:STEP``: the save after step STEP) or stops (``savestop``), in a job's
    first attempt only."""
    failing = {step + 1 for failed_rank, step in injection.save_failures if failed_rank == rank}
    stopping = {step + 1 for stopped_rank, step in injection.save_stops if stopped_rank == rank}
    first_attempt = attempt() == 0

    def writer(path: str) -> FileSystemWriter:
        plain, full_disk, frozen = _writers()
        done = step_of(Path(path).with_suffix(""))
        if first_attempt and done in failing:
            return full_disk(path)
        return frozen(path) if first_attempt and done in stopping else plain(path)

    return writer
