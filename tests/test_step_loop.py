"""The step loop around compute: a received input's transfer is waited on right before the task that uses
it (see [Note: the compute stream waits last] in hintpipe.runtime.loop.step_loop), and the last stage's
losses are looked at once per step (see [Note: one look at the losses per step] in
hintpipe.runtime.loop.agreement). Compute, transfers and the transport are stand-ins that log what they
are asked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from hintpipe.runtime.loop.step_loop import StepLoop, StepState
from hintpipe.runtime.transport.wire import Message, MessageKind
from hintpipe.schedule.generators import generate_hint
from hintpipe.scoreboard import Policy, RankGraph, Scoreboard


class _Executor:
    """The last stage's compute: logs each task; the loss of micro-batch ``mb`` is ``mb``."""

    live_bytes = 0

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def begin_step(self, step: int) -> None:
        pass

    def forward(
        self, stage: int, mb: int, inputs: Sequence[torch.Tensor], target: Any, loss_scale: float
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        self.log.append(f"F{mb}")
        return [], torch.tensor(float(mb))

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[torch.Tensor], target: Any, loss_scale: float
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
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
