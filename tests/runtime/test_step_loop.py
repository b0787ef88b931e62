"""The step loop around compute: a received input's transfer is waited on right before the task that uses
it (see [Note: the compute stream waits last] in hintpipe.runtime.loop.step_loop), and the last stage's
losses are looked at once per step (see [Note: one look at the losses per step] in
hintpipe.runtime.loop.agreement). Compute, transfers and the transport are stand-ins that log what they
are asked. The loop also measures the runtime's own CPU time (see [Note: the runtime's own CPU time])."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.runtime.loop.step_loop import StepLoop
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.transport.wire import Message, MessageKind, Value
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.task_list import TaskList


class _Executor:
    """The last stage's compute: logs each task; the loss of micro-batch ``mb`` is ``mb``."""

    live_bytes = 0

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def begin_step(self, step: int) -> None:
        pass

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        self.log.append(f"F{mb}")
        return [], torch.tensor(float(mb))

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        raise AssertionError("a training step does not evaluate")

    def backward(self, stage: int, mb: int, grads: Any) -> list[torch.Tensor | None]:
        self.log.append(f"B{mb}")
        return [torch.zeros(1)]

    def weight(self, stage: int, mb: int) -> None:
        raise AssertionError("1f1b has no W")


class _Transport:
    """Sends go nowhere; nothing more arrives (every input is there at the start)."""

    def send(self, *args: Any) -> None:
        pass

    def get(self, timeout: float | None) -> Message | None:
        return None


class _Arrival:
    """A received activation's transfer to the device: logs when the compute stream is told to wait for it."""

    def __init__(self, log: list[str], mb: int) -> None:
        self.log = log
        self.mb = mb

    def wait(self) -> None:
        raise AssertionError("the step loop never blocks the host on a transfer")

    def use(self, tensors: Sequence[torch.Tensor | None]) -> None:
        assert len(tensors) == 1 and tensors[0] is not None and tensors[0].requires_grad  # the F's own input
        self.log.append(f"wait for input {self.mb}")


def test_inputs_are_waited_for_right_before_their_task_and_losses_looked_at_once() -> None:
    log: list[str] = []
    hint = generate_hint("1f1b", 2, 4)
    # Every activation is in (with its transfer still on the device's copy stream) before the step starts.
    arrived = [
        Message(MessageKind.ACTIVATION, 0, 1, mb, [torch.ones(2)], peer=0, ready=_Arrival(log, mb)) for mb in range(4)
    ]

    def check_losses(losses: Sequence[torch.Tensor], slots: Sequence[int]) -> None:
        log.append(f"check losses {[float(x) for x in losses]} of slots {list(slots)}")

    loop = StepLoop(
        rank=1,
        board=Scoreboard(RankGraph(hint, 1), Policy.FIXED),
        executor=_Executor(log),
        transport=cast(Any, _Transport()),
        admission=cast(Any, None),
        timeout=5.0,
        stash=arrived,
        check_losses=check_losses,
    )
    state = StepState(step=0, activations={})
    loop.run(state)
    assert log == [
        "wait for input 0",
        "F0",
        "B0",
        "wait for input 1",
        "F1",
        "B1",
        "wait for input 2",
        "F2",
        "B2",
        "wait for input 3",
        "F3",
        "check losses [0.0, 1.0, 2.0, 3.0] of slots [0, 1, 2, 3]",
        "B3",
    ]
    assert state.arrivals == {}


def _burn(seconds: float) -> None:
    """Keep the calling thread on the CPU for ``seconds`` of its own CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class _BusyExecutor(_Executor):
    """Each forward computes 20 ms of CPU; a second thread (standing for the mailbox's) takes 50 ms of CPU
    between the first forward and the last backward."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.helper = threading.Thread(target=_burn, args=(0.05,))

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        if mb == 0:
            self.helper.start()
        _burn(0.02)
        return super().forward(stage, mb, inputs, target, loss_scale)

    def backward(self, stage: int, mb: int, grads: Any) -> list[torch.Tensor | None]:
        if mb == 3:
            self.helper.join()
        return super().backward(stage, mb, grads)


def test_the_runtimes_own_cpu_time_leaves_out_the_tasks_and_counts_every_other_thread() -> None:
    hint = generate_hint("1f1b", 2, 4)
    arrived = [Message(MessageKind.ACTIVATION, 0, 1, mb, [torch.ones(2)], peer=0) for mb in range(4)]
    loop = StepLoop(
        rank=1,
        board=Scoreboard(RankGraph(hint, 1), Policy.FIXED),
        executor=_BusyExecutor([]),
        transport=cast(Any, _Transport()),
        admission=cast(Any, None),
        timeout=5.0,
        stash=arrived,
        check_losses=lambda losses, slots: None,
    )
    state = StepState(step=0, activations={})
    loop.run(state)
    # The helper's 50 ms are in; the tasks' 80 ms are not (the loop's own bookkeeping adds a little).
    assert 0.05 <= state.measured["runtime_cpu"] < 0.05 + 0.03, state.measured


def test_a_start_that_fails_before_the_timeout_names_the_lost_rank_not_a_wait(monkeypatch: Any) -> None:
    # The first step's barrier fails at once when a rank exits (its connection resets): that is a lost rank,
    # named from the heartbeats; only a barrier that ran for the whole timeout is the watchdog's.
    import torch.distributed as dist

    from hintpipe.runtime import engine, liveness
    from hintpipe.runtime.errors import PeerFailure, WatchdogTimeout

    parts = cast(Any, SimpleNamespace(coll=None, timeout=30.0, rank=0))
    clock = [0.0]

    def barrier(**_: Any) -> None:
        clock[0] += spent
        raise RuntimeError("Rank 1 failed to pass monitoredBarrier in 30000 ms\n Original exception: closed")

    monkeypatch.setattr(dist, "monitored_barrier", barrier)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr("hintpipe.runtime.engine.time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(liveness, "wait_for_silence", lambda: {1: 3.2})
    spent = 2.0
    with pytest.raises(PeerFailure) as lost:
        engine.meet(parts, 0)
    assert (
        str(lost.value)
        == "rank 0: rank 1 failed in the start of step 0 (rank 1 stopped answering (no sign of life for 3 s))"
    )
    spent = 30.0  # a barrier that ran for the whole timeout: a wait, naming the rank whose heartbeat stopped
    monkeypatch.setattr(liveness, "silent_ranks", lambda: {1: 31.0})
    with pytest.raises(WatchdogTimeout) as waited:
        engine.meet(parts, 0)
    assert str(waited.value) == (
        "rank 0: waited 30 s for the other ranks to start step 0: rank 1 stopped answering (no sign of life for 31 s)"
    )
    monkeypatch.setattr(liveness, "silent_ranks", dict)  # every heartbeat fresh: the barrier's own first line
    with pytest.raises(WatchdogTimeout) as waited:
        engine.meet(parts, 0)
    assert str(waited.value) == (
        "rank 0: waited 30 s for the other ranks to start step 0: Rank 1 failed to pass monitoredBarrier in 30000 ms"
    )


def test_a_first_stage_given_more_tensors_than_it_takes_is_refused_before_it_runs() -> None:
    from torch import nn

    from hintpipe.runtime.loop.microbatch import check_arity

    class TakesIds(nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return ids

    class TakesMask(nn.Module):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            return ids

    with pytest.raises(ValueError) as packed:
        check_arity(TakesIds(), 2, 0)
    assert str(packed.value) == (
        "stage 0 takes 1 input(s) (ids); micro-batch 0 has 2 tensor(s): packed rows come as (ids, documents); form "
        "them without pack=True for a model that takes the ids alone, or give the model a forward that takes the "
        "documents"
    )
    with pytest.raises(ValueError) as few:
        check_arity(TakesIds(), 0, 3)
    assert str(few.value) == (
        "stage 0 takes 1 input(s) (ids); micro-batch 3 has 0 tensor(s): give each micro-batch as a tuple of the "
        "stage's inputs, in order"
    )
    check_arity(TakesMask(), 1, 0)  # the optional one may be left out
    check_arity(TakesMask(), 2, 0)
    # Signatures are read once per forward function: a forward set on one module is that module's alone, and a
    # plain function set as ``forward`` keeps its first parameter (no ``self`` to drop).
    two = TakesIds()
    two.forward = lambda ids, documents: ids  # type: ignore[method-assign,assignment,misc]
    check_arity(two, 2, 0)
    with pytest.raises(ValueError, match=r"^stage 0 takes 1 input\(s\) \(ids\); micro-batch 1 has 2"):
        check_arity(TakesIds(), 2, 1)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        return ids

    plain, bound = TakesIds(), TakesIds()
    plain.forward = forward  # type: ignore[method-assign]
    check_arity(plain, 1, 0)
    bound.forward = forward.__get__(bound)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match=r"^stage 0 takes 0 input\(s\) \(\)"):
        check_arity(bound, 1, 0)
    check_arity(nn.Sequential(nn.Identity()), 1, 0)


def test_the_loop_makes_each_task_once_per_step_not_once_per_look(monkeypatch: pytest.MonkeyPatch) -> None:
    # A scoreboard keeps its tasks as arrays; the loop makes their Task objects once, when it is built, and
    # then only looks them up (a Task made per look cost the computing thread microseconds a task).
    hint = generate_hint("1f1b", 2, 4)
    board = Scoreboard(RankGraph(hint, 1), Policy.FIXED)
    arrived = [Message(MessageKind.ACTIVATION, 0, 1, mb, [torch.ones(2)], peer=0) for mb in range(4)]
    made: list[int] = []
    look = TaskList.__getitem__

    def counted(self: TaskList, index: Any) -> Any:
        made.append(index)
        return look(self, index)

    monkeypatch.setattr(TaskList, "__getitem__", counted)
    loop = StepLoop(
        rank=1,
        board=board,
        executor=_Executor([]),
        transport=cast(Any, _Transport()),
        admission=cast(Any, None),
        timeout=5.0,
        stash=arrived,
        check_losses=lambda losses, slots: None,
    )
    loop.run(StepState(step=0, activations={}))
    assert board.done and made == []
