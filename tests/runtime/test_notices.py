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
from hintpipe.runtime.loop.asked_notices import AskedNotices
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
        notices=AskedNotices(),
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


def test_a_request_for_notices_is_kept_for_the_run_from_whatever_step_it_came() -> None:
    loop, _, stash = _loop(step_clock=0.0)
    assert loop.notices is not None
    state = StepState(step=3, activations={}, round=3)
    for step, stage, mb, of in ((2, 1, 0, MessageKind.ACTIVATION), (3, 0, 1, MessageKind.GRADIENT), (9, 1, 3, None)):
        loop._accept(Message(MessageKind.WANTED, step, stage, mb, [], 1, 0.0, of=of or MessageKind.ACTIVATION), state)
    assert loop.notices.theirs == {F(1, 0), B(0, 1), F(1, 3)}
    assert stash == []  # a request of an earlier or a later step is neither an error nor held back


class _Asked:
    def __init__(self) -> None:
        self.asked: list[tuple[int, int, int, int, MessageKind]] = []

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.asked.append((peer, step, stage, mb, of))


def test_a_rank_asks_each_producer_it_weighed_unheard_once_per_run() -> None:
    hint = generate_hint("1f1b", 2, 4)
    graph = RankGraph(hint, 1)
    tasks, source = list(graph.tasks), graph.source
    notices, transport = AskedNotices(), _Asked()
    at = {str(task): pos for pos, task in enumerate(tasks)}
    # 1F2 weighed twice in one step, 1B0 (fed by this rank's own 1F0: no producer elsewhere), then 1F2 and 1F3
    notices.ask([at["1F2"], at["1F2"], at["1B0"]], tasks, source, cast(Any, transport), 4)
    notices.ask([at["1F2"], at["1F3"]], tasks, source, cast(Any, transport), 5)
    assert transport.asked == [(0, 4, 1, 2, MessageKind.ACTIVATION), (0, 5, 1, 3, MessageKind.ACTIVATION)]
    assert notices.mine == {F(1, 2), F(1, 3)}


def test_the_eta_rule_names_the_positions_it_weighed_without_a_notice_where_notices_travel() -> None:
    hint = generate_hint("zb-h1", 2, 4)
    costs = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    forecast = forecasts_for(hint, costs)[1]
    for travel in (True, False):
        board = Scoreboard(RankGraph(hint, 1), Policy.READY, forecast=forecast, notices=True, notices_travel=travel)
        board.deliver(F(1, 0))
        assert board.take(1.0) == board.index[F(1, 0)]
        board.finish(board.index[F(1, 0)], 2.0)
        assert board.take(2.0) == board.index[B(1, 0)]
        board.finish(board.index[B(1, 0)], 3.0)
        board.take(3.0)  # 1F1 waits for rank 0's activation; 1W0 is ready and weighed against its ETA
        assert board.unheard == ([board.index[F(1, 1)]] if travel else [])
        board.producer_started(board.index[F(1, 1)], 3.0)
        board.unheard.clear()
        board.take(3.0)
        assert board.unheard == []  # heard of now
