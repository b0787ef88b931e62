"""The dispatch state machine, driven by hand."""

from __future__ import annotations

import math
import random

import pytest

from hintpipe.dispatch.budgets import device_budgets
from hintpipe.dispatch.fit import BudgetError
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintName
from hintpipe.schedule.task import B, F


def test_fixed_follows_the_hint_and_waits() -> None:
    hint = generate_hint("1f1b", 2, 3)
    rank1 = Scoreboard(RankGraph(hint, 1), Policy.FIXED)
    assert rank1.take(0.0) == -1  # 1F0 needs rank 0's activation
    rank1.deliver(F(1, 0))
    assert rank1.tasks[rank1.take(0.0)] == F(1, 0)
    assert rank1.finish(0, 1.0) is None  # the last stage's F notifies no one
    pos = rank1.take(1.0)
    assert rank1.tasks[pos] == B(1, 0)
    assert rank1.finish(pos, 3.0) == (0, B(0, 0))  # the gradient goes to rank 0
    # 1F1 is next; its input has not arrived, and fixed order does nothing else.
    assert rank1.take(3.0) == -1
    assert rank1.pending_report() == (
        "rank 1: 4 tasks pending; next in hint 1F1 (position 2) waits for activation of stage 0 from rank 0"
    )


def test_greedy_runs_ahead_within_the_budget() -> None:
    hint = generate_hint("1f1b", 2, 4)
    # Rank 0: F0 F1 B0 F2 B1 F3 B2 B3, peak 2 micro-batches.
    rank0 = Scoreboard(RankGraph(hint, 0), Policy.GREEDY, budget=3)
    order = []
    for now in range(3):
        pos = rank0.take(float(now))
        order.append(str(rank0.tasks[pos]))
        rank0.finish(pos, now + 1.0)
    # 0B0 has not arrived: greedy runs 0F2 ahead of it (room for one more), then stops.
    assert order == ["0F0", "0F1", "0F2"]
    assert rank0.live == 3
    assert rank0.take(3.0) == -1
    rank0.deliver(B(0, 0))
    assert str(rank0.tasks[rank0.take(3.0)]) == "0B0"


def test_admission_never_blocks_the_hint() -> None:
    # With budget = the hint's peak there is no room to run an F ahead.
    hint = generate_hint("1f1b", 2, 4)
    rank0 = Scoreboard(RankGraph(hint, 0), Policy.GREEDY)
    for now in range(2):
        pos = rank0.take(float(now))
        rank0.finish(pos, now + 1.0)
    assert rank0.budget == 2
    assert rank0.take(2.0) == -1  # 0F2 is ready but would exceed what the hint needs


def test_budget_below_the_hint_peak_is_refused() -> None:
    hint = generate_hint("gpipe", 2, 4)
    with pytest.raises(
        BudgetError,
        match=r"memory budget 3 on rank 0 is below the hint's own peak 4; raise the budget or choose a hint",
    ):
        Scoreboard(RankGraph(hint, 0), Policy.READY, budget=3)


def _rank0_waiting_for_b0(policy: Policy, forecast: RankForecast | None) -> Scoreboard:
    hint = generate_hint("1f1b", 2, 4)
    rank0 = Scoreboard(RankGraph(hint, 0), policy, budget=3, forecast=forecast)
    for now in range(2):
        pos = rank0.take(float(now))
        rank0.finish(pos, now + 1.0)
    return rank0


def test_patience_waits_for_a_task_that_is_due_soon() -> None:
    # Plan: 0B0 (position 2) expected at t = 4, 0F2 costs 3. At t = 2 running 0F2
    # would end at 5, after 0B0 is due (4 + tolerance 0.25 * 2 = 4.5): wait.
    forecast = RankForecast(
        allowance=(0.25, 0.25, 2.5, 0.25, 0.5, 0.25, 0.5, 0.5),
        due=(0.25, 1.25, 4.5, 6.25, 7.5, 9.25, 10.5, 12.5),
        expected=(1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0),
    )
    rank0 = _rank0_waiting_for_b0(Policy.READY, forecast)
    assert rank0.take(2.0) == -1
    assert rank0.wake_at == 4.5
    # Still not there when it is due: run the best ready task.
    assert str(rank0.tasks[rank0.take(4.5)]) == "0F2"


def test_patience_backfills_a_task_that_fits_before_the_due_time() -> None:
    forecast = RankForecast(
        allowance=(0.25, 0.25, 9.0, 0.25, 0.5, 0.25, 0.5, 0.5),
        due=(0.25, 1.25, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0),
        expected=(1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0),
    )
    rank0 = _rank0_waiting_for_b0(Policy.READY, forecast)
    assert str(rank0.tasks[rank0.take(2.0)]) == "0F2"  # ends at 5, well before 11
    assert math.isinf(rank0.wake_at)


def test_greedy_ignores_the_forecast() -> None:
    rank0 = _rank0_waiting_for_b0(Policy.GREEDY, None)
    assert str(rank0.tasks[rank0.take(2.0)]) == "0F2"


# -- the ETA rule (producer notices) -------------------------------------------------------------------------


def _eta_forecast(expected: tuple[float, ...], lead: float, latency: float = 0.0, due: float = 100.0) -> RankForecast:
    n = len(expected)  # lead: the producer's cost and the latency together
    return RankForecast((0.5,) * n, (due,) * n, expected, (lead - latency,) * n, latency)


def _zb_rank1_waiting_for_f1(forecast: RankForecast, notices_travel: bool = False) -> Scoreboard:
    # zb-h1, rank 1: 1F0 1B0 1F1 1B1 1W0 ...; after 1F0 and 1B0 the next task 1F1 waits
    # for rank 0's activation and 1W0 is ready.
    graph = RankGraph(generate_hint("zb-h1", 2, 4), 1)
    rank1 = Scoreboard(graph, Policy.READY, forecast=forecast, notices=True, notices_travel=notices_travel)
    rank1.deliver(F(1, 0))
    for now in range(2):
        pos = rank1.take(float(now))
        rank1.finish(pos, now + 1.0)
    return rank1


def test_eta_rule_runs_other_work_while_the_producer_has_not_started() -> None:
    rank1 = _zb_rank1_waiting_for_f1(_eta_forecast((1.0,) * 12, lead=1.0))
    assert str(rank1.tasks[rank1.take(2.0)]) == "1W0"  # ETA infinite: anything fits


def test_eta_rule_backfills_a_weight_pass_that_ends_before_the_input() -> None:
    rank1 = _zb_rank1_waiting_for_f1(_eta_forecast((1.0,) * 12, lead=1.0))
    rank1.producer_started(2, 2.0)  # 0F1 started at 2: its activation is expected at 3
    assert rank1.eta[2] == 3.0
    assert str(rank1.tasks[rank1.take(2.0)]) == "1W0"  # ends at 3 <= 3


def test_eta_rule_never_lets_a_weight_pass_overtake_a_late_input() -> None:
    rank1 = _zb_rank1_waiting_for_f1(_eta_forecast((1.0,) * 12, lead=1.0, latency=1.0))
    rank1.producer_started(2, 0.5)  # expected at 0.5 + 1 (cost and latency together)
    assert rank1.take(2.0) == -1  # late already, and 1W0 is no F: wait for the input
    assert math.isinf(rank1.wake_at)  # no point waking: only news of the producer can change it
    rank1.producer_finished(2, 3.0)  # it ran long: the activation lands at 3 + latency 1
    assert rank1.eta[2] == 4.0
    assert str(rank1.tasks[rank1.take(3.0)]) == "1W0"  # 3 + 1 <= 4


def _1f1b_rank0_waiting_for_b0(forecast: RankForecast, notices_travel: bool = False) -> Scoreboard:
    # 1f1b, rank 0: 0F0 0F1 0B0 0F2 ...; room for one more micro-batch, so 0F2 is admitted while
    # 0B0 waits for rank 1's gradient.
    graph = RankGraph(generate_hint("1f1b", 2, 4), 0)
    rank0 = Scoreboard(graph, Policy.READY, budget=3, forecast=forecast, notices=True, notices_travel=notices_travel)
    for now in range(2):
        pos = rank0.take(float(now))
        rank0.finish(pos, now + 1.0)
    return rank0


def test_eta_rule_starts_a_forward_once_the_input_is_late() -> None:
    expected = (1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0)  # 0F2 (position 3) costs 3
    rank0 = _1f1b_rank0_waiting_for_b0(_eta_forecast(expected, lead=2.0))
    rank0.producer_started(2, 1.0)  # 1B0 started at 1: its gradient is expected at 3
    assert rank0.take(2.0) == -1  # 0F2 would end at 5, after 3
    # Late means past the ETA by a quarter of 0B0's expected cost (2): at 3.5, not at 3.
    assert rank0.wake_at == 3.5
    assert rank0.take(3.0) == -1 and rank0.wake_at == 3.5  # on time is not late (a tie in the forecast)
    assert str(rank0.tasks[rank0.take(3.5)]) == "0F2"  # the gradient is late: the forward goes


def test_eta_rule_starts_a_forward_once_the_next_task_is_overdue() -> None:
    expected = (1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0)
    rank0 = _1f1b_rank0_waiting_for_b0(_eta_forecast(expected, lead=2.0, due=2.5))
    rank0.producer_started(2, 1.9)  # expected at 3.9, but 0B0 is due at 2.5 by the forecast
    assert rank0.take(2.0) == -1
    assert rank0.wake_at == 2.5
    assert str(rank0.tasks[rank0.take(2.5)]) == "0F2"


# -- the same rule where notices travel (the runtime: see [Note: ETAs in the runtime]) ----------------------------


@pytest.mark.parametrize("travel", [False, True])
def test_where_notices_travel_a_task_that_fits_only_just_is_a_tie_and_the_hint_keeps_it(travel: bool) -> None:
    expected = (1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0)  # 0F2 (position 3) costs 3, 0B0 2: a tie is 0.5
    rank0 = _1f1b_rank0_waiting_for_b0(_eta_forecast(expected, lead=2.0), notices_travel=travel)
    rank0.producer_started(2, 3.0)  # 1B0 started at 3: its gradient is expected at 5
    if not travel:  # the simulator: 0F2 ends at 5, exactly when the gradient comes, so it fits
        assert str(rank0.tasks[rank0.take(2.0)]) == "0F2"
        return
    assert rank0.take(2.0) == -1  # ends within a tie of the ETA: the hint's order stands
    assert rank0.wake_at == 5.5  # and the gradient is late only past 5 + 0.5
    assert str(rank0.tasks[rank0.take(5.5)]) == "0F2"


def test_where_notices_travel_a_producer_not_heard_of_is_expected_by_the_next_tasks_due_time() -> None:
    expected = (1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0)
    rank0 = _1f1b_rank0_waiting_for_b0(_eta_forecast(expected, lead=2.0, due=2.5), notices_travel=True)
    # No notice of 1B0: it may have started with its notice on the way, so 0B0's gradient may come by
    # 0B0's due time, 2.5; 0F2 (cost 3) does not fit before it.
    assert rank0.take(2.0) == -1 and rank0.wake_at == 2.5
    # Due, and still not heard of: 1B0 is late, read as not started, and the forward goes.
    assert str(rank0.tasks[rank0.take(2.5)]) == "0F2"


def test_where_notices_travel_a_weight_pass_waits_for_an_unheard_producer_only_until_the_due_time() -> None:
    rank1 = _zb_rank1_waiting_for_f1(_eta_forecast((1.0,) * 12, lead=1.0, due=2.5), notices_travel=True)
    assert rank1.take(2.0) == -1 and rank1.wake_at == 2.5  # 1W0 would end at 3, after 1F1's due time
    assert str(rank1.tasks[rank1.take(2.5)]) == "1W0"  # never heard of by then: not started, anything fits


def test_without_notices_ready_keeps_patience() -> None:
    # The same state as above, without notices: the forecast's due time alone decides (patience).
    expected = (1.0, 1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0)
    rank0 = Scoreboard(
        RankGraph(generate_hint("1f1b", 2, 4), 0),
        Policy.READY,
        budget=3,
        forecast=_eta_forecast(expected, 2.0, due=2.5),
    )
    for now in range(2):
        rank0.finish(rank0.take(float(now)), now + 1.0)
    rank0.producer_started(2, 1.9)  # ignored: this driver promised no notices
    assert math.isinf(rank0.eta[2])
    assert rank0.take(2.0) == -1 and rank0.wake_at == 2.5


def test_device_budgets_lend_the_busiest_ranks_room_to_every_rank() -> None:
    hint = generate_hint("1f1b", 4, 8)
    peaks = [RankGraph(hint, r).peak for r in range(4)]
    assert peaks == [4, 3, 2, 1]
    assert device_budgets(peaks) == [4, 4, 4, 4]
    assert device_budgets(peaks, 0.25) == [5, 5, 5, 5]
    with pytest.raises(
        ValueError, match=r"^device_budget_fraction must be a finite fraction >= 0 \(0.25 for 25% more\), got -0.1$"
    ):
        device_budgets(peaks, -0.1)


def test_eta_rule_scales_expected_costs_by_known_sizes() -> None:
    # As in the backfill test, but micro-batch 0 is known to be three times as long: its
    # weight pass (1W0, cost 3) no longer ends before 1F1's input (expected at 3).
    forecast = _eta_forecast((1.0,) * 12, lead=1.0)
    rank1 = Scoreboard(
        RankGraph(generate_hint("zb-h1", 2, 4), 1),
        Policy.READY,
        forecast=forecast,
        notices=True,
        sizes=[3.0, 1.0, 1.0, 1.0],
    )
    rank1.deliver(F(1, 0))
    for now in (0.0, 3.0):
        rank1.finish(rank1.take(now), now + 3.0)
    rank1.producer_started(2, 6.0)  # 0F1 (micro-batch 1, size 1): expected at 7
    assert rank1.take(6.0) == -1  # 6 + 3 > 7: wait (with size 1, 1W0 would fit: 6 + 1 <= 7)
    with pytest.raises(ValueError, match="3 sizes for 4 micro-batches"):
        Scoreboard(
            RankGraph(generate_hint("zb-h1", 2, 4), 1), Policy.READY, forecast=forecast, notices=True, sizes=[1.0] * 3
        )


def test_eta_rule_scales_by_each_stages_known_size() -> None:
    # The same with sizes per stage and micro-batch: rank 1 hosts stage 1, where micro-batch 0 is three
    # times as long (its weight pass no longer fits); on stage 0 (the producer of 1F1) all are 1, so 1F1's
    # input is still expected at 7. Where only stage 0 knows micro-batch 0 as long, 1W0 fits again.
    forecast = _eta_forecast((1.0,) * 12, lead=1.0)
    graph = RankGraph(generate_hint("zb-h1", 2, 4), 1)

    def board(sizes: list[list[float]]) -> Scoreboard:
        rank1 = Scoreboard(graph, Policy.READY, forecast=forecast, notices=True, sizes=sizes)
        rank1.deliver(F(1, 0))
        for now in (0.0, 3.0):
            rank1.finish(rank1.take(now), now + 3.0)
        rank1.producer_started(2, 6.0)
        return rank1

    assert board([[1.0] * 4, [3.0, 1.0, 1.0, 1.0]]).take(6.0) == -1
    rank1 = board([[3.0, 1.0, 1.0, 1.0], [1.0] * 4])
    assert str(rank1.tasks[rank1.take(6.0)]) == "1W0"
    with pytest.raises(ValueError, match=r"^sizes of shape \(3, 4\) for 2 stages x 4 micro-batches$"):
        Scoreboard(graph, Policy.READY, forecast=forecast, notices=True, sizes=[[1.0] * 4] * 3)


def test_runtime_device_budget_gives_every_rank_the_busiest_ranks_slots() -> None:
    from hintpipe.options import check_options
    from hintpipe.runtime.loop.admission import Admission

    hint = generate_hint("1f1b", 4, 8)  # own peaks 4, 3, 2, 1
    assert [Admission(hint, r, 0.0, None).slots for r in range(4)] == [4, 3, 2, 1]
    assert [Admission(hint, r, 0.0, None, device_budget_fraction=0.0).slots for r in range(4)] == [4, 4, 4, 4]
    assert [Admission(hint, r, 0.0, None, device_budget_fraction=0.5).slots for r in range(4)] == [6, 6, 6, 6]
    assert Admission(hint, 3, 1.0, None).slots == 2  # slack: one more than its own peak
    with pytest.raises(
        ValueError,
        match=r"^give one of slack_microbatches, activation_budget, device_budget_fraction, "
        r"got slack_microbatches and device_budget_fraction$",
    ):
        check_options({"slack_microbatches": 1.0, "device_budget_fraction": 0.0})
    check_options({"slack_microbatches": 0.0, "device_budget_fraction": 0.0})  # no slack is no room given


@pytest.mark.parametrize("name", [h.value for h in HintName])
@pytest.mark.parametrize("policy", [Policy.READY, Policy.GREEDY])
def test_certain_decisions_are_the_next_ones_taken_whatever_arrives(name: str, policy: Policy) -> None:
    # Inputs arrive in random orders (any order: a superset of what neighbours can send); after every take,
    # the positions `certain` names must be exactly the next ones taken, and never one whose input is awaited.
    hint = generate_hint(name, 4, 8)
    for rank in range(4):
        for seed in range(5):
            rng = random.Random(seed)
            board = Scoreboard(RankGraph(hint, rank), policy, budget=RankGraph(hint, rank).peak + 2)
            awaited = [board.tasks[p] for p in range(len(board.tasks)) if board.graph.fed_remotely[p]]
            rng.shuffle(awaited)
            promised: list[int] = []
            now = 0.0
            while not board.done:
                if awaited and rng.random() < 0.5:
                    board.deliver(awaited.pop())
                    continue
                pos = board.take(now)
                if pos < 0:
                    assert awaited, f"{name} rank {rank}: stuck with every input delivered"
                    assert not promised, f"{name} rank {rank}: waits where {promised[0]} was certain"
                    board.deliver(awaited.pop())
                    continue
                if promised:
                    assert pos == promised.pop(0), f"{name} rank {rank} seed {seed}"
                ahead = board.certain(16)
                assert ahead[: len(promised)] == promised
                promised = ahead
                now += 1.0
                board.finish(pos, now)
            assert not promised
