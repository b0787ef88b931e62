"""Producer notices in the step loop: a notice sets the ETA of the task it announces,
one of a later step waits for that step, one of a finished step is dropped
(see [Note: producer notices] in hintpipe.runtime.transport.protocol)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from hintpipe.dispatch.expected import forecasts_for
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.runtime.loop.step_loop import StepLoop
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.transport.wire import Message, MessageKind
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.task import B, F


def _loop(step_clock: float) -> tuple[StepLoop, Scoreboard, list[Message]]:
    hint = generate_hint("1f1b", 2, 4)
    costs = [[1.0, 2.0, 0.0], [1.0, 2.0, 0.0]]  # per stage: F, B, W
    board = Scoreboard(RankGraph(hint, 0), Policy.READY, forecast=forecasts_for(hint, costs)[0], notices=True)
    stash: list[Message] = []
    none = cast(Any, None)
    loop = StepLoop(
        rank=0,
        board=board,
        executor=none,
        transport=none,
        admission=none,
        timeout=1.0,
        stash=stash,
        check_losses=lambda losses, slots: None,
        notices=True,
    )
    loop._t0 = step_clock
    return loop, board, stash


def _notice(step: int, stage: int, mb: int, arrived: float) -> Message:
    return Message(MessageKind.STARTED, step, stage, mb, [], peer=1, arrived=arrived, of=MessageKind.GRADIENT)


def test_a_notice_sets_the_eta_of_the_task_it_announces() -> None:
    loop, board, stash = _loop(step_clock=100.0)
    state = StepState(step=3, activations={}, round=3)
    loop._accept(_notice(3, 0, 2, arrived=100.5), state)
    pos = board.index[B(0, 2)]
    # the producer B(1, 2) started 0.5 s into the step and is expected to take 2.0 (no latency planned)
    assert board.eta[pos] == pytest.approx(2.5)
    assert board.eta[board.index[F(0, 2)]] == float("inf")  # nothing else moved
    assert stash == []


def test_a_notice_of_a_later_step_waits_and_one_of_a_finished_step_is_dropped() -> None:
    loop, board, stash = _loop(step_clock=0.0)
    state = StepState(step=3, activations={}, round=3)
    later, stale = _notice(4, 0, 1, arrived=1.0), _notice(2, 0, 1, arrived=1.0)
    loop._accept(later, state)
    loop._accept(stale, state)  # no "message for old step" error: notices of a finished step are harmless
    assert stash == [later]
    assert all(eta == float("inf") for eta in board.eta)
