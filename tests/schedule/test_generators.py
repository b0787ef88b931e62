"""Hint generators against the analytic makespans of their papers."""

from __future__ import annotations

import pytest

from conftest import simulate
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintError, HintName
from hintpipe.schedule.task import Kind, Task
from hintpipe.schedule.validation import validate_hint

SIZES = [(1, 1), (2, 1), (2, 5), (3, 3), (4, 4), (4, 8), (4, 13), (5, 16), (8, 24)]


@pytest.mark.parametrize(("p", "m"), SIZES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "bf"])
def test_gpipe_and_1f1b_makespan_and_bubble(name: str, p: int, m: int) -> None:
    # F = 1, full backward B = 2: (m + p - 1)(F + B), bubble (p - 1)/(m + p - 1).
    result = simulate(name, p, m)
    assert result.makespan == (m + p - 1) * 3
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 2), (3, 9), (4, 4), (4, 16), (5, 10)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_shrinks_by_the_chunk_count(p: int, m: int, v: int) -> None:
    # Each chunk costs F = 1, B = 2; a rank works v*m*3 and waits (p - 1)*3:
    # the bubble of 1F1B, (p - 1)(F + B) for the whole rank's layers, divided by v.
    result = simulate("interleaved-1f1b", p, m, v)
    assert result.makespan == (v * m + p - 1) * 3
    assert result.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 9), (4, 4), (4, 8), (4, 13), (6, 12)])
@pytest.mark.parametrize(("f", "b", "w"), [(1, 1, 1), (2, 3, 1), (3, 2, 2), (1.5, 2.5, 0.5)])
def test_zb_h1_makespan_matches_the_zero_bubble_paper(p: int, m: int, f: float, b: float, w: float) -> None:
    # Qi et al. 2024: with W <= F, ZB-H1 takes m(F + B + W) + (p - 1)(F + B - W).
    result = simulate("zb-h1", p, m, forward=f, backward=b, weight=w)
    assert result.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w), abs=1e-9)


@pytest.mark.parametrize(
    ("p", "m"), [(1, 1), (1, 5), (2, 3), (2, 8), (3, 5), (4, 7), (4, 16), (5, 9), (8, 15), (8, 32)]
)
@pytest.mark.parametrize("cost", [1.0, 2.5])
def test_zbv_is_bubble_free_in_steady_state(p: int, m: int, cost: float) -> None:
    # ZB-V with F = B = W = c per chunk and m >= 2p - 1: every rank works 6mc.
    # The last rank cannot start before the first forward has crossed p - 1
    # chunks, (p - 1)c; from then on no rank ever waits, so the makespan is
    # exactly 6mc + (p - 1)c: the start-up ramp is the whole bubble.
    result = simulate("zbv", p, m, 2, forward=cost, backward=cost, weight=cost)
    assert result.makespan == pytest.approx((6 * m + p - 1) * cost)
    assert max(result.busy) == pytest.approx(6 * m * cost)


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 1), (4, 2), (4, 8), (6, 3), (8, 16)])
def test_1f1b_stage_s_holds_min_p_minus_s_m(p: int, m: int) -> None:
    result = simulate("1f1b", p, m)
    assert result.peak_live == tuple(float(min(p - s, m)) for s in range(p))


def test_gpipe_holds_every_microbatch() -> None:
    assert simulate("gpipe", 4, 6).peak_live == (6.0,) * 4


@pytest.mark.parametrize("name", [h.value for h in HintName])
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 4), (3, 6), (4, 8), (4, 12)])
def test_every_generated_hint_is_valid(name: str, p: int, m: int) -> None:
    chunks = 2 if name in ("zbv", "interleaved-1f1b") else 1
    hint = generate_hint(name, p, m, chunks)
    validate_hint(hint)
    split = name in ("zb-h1", "zbv", "bfw")
    assert hint.split_backward is split
    assert hint.num_tasks == hint.stages * m * (3 if split else 2)


def test_1f1b_order_is_the_textbook_one() -> None:
    hint = generate_hint("1f1b", 4, 6)
    assert [" ".join(f"{t.kind.name}{t.mb}" for t in tasks) for tasks in hint.lists] == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
    ]


def test_bf_ranking_reproduces_1f1b() -> None:
    # B before F with 1F1B's admission is 1F1B itself.
    assert generate_hint("bf", 5, 11).lists == generate_hint("1f1b", 5, 11).lists


def test_bfw_runs_w_last_among_ready_work() -> None:
    hint = generate_hint("bfw", 4, 8)
    last = hint.lists[3]
    # The last stage holds one micro-batch under 1F1B's admission, and W is
    # what releases it: F, its B at once (B ranks first), then W, then the next F.
    assert [str(t) for t in last[:6]] == ["3F0", "3B0", "3W0", "3F1", "3B1", "3W1"]
    # Rank 0 has room for four: it runs ahead on forwards and defers W behind B and F.
    assert [str(t) for t in hint.lists[0][:5]] == ["0F0", "0F1", "0F2", "0F3", "0B0"]


def test_zbv_places_two_chunks_in_v_shape() -> None:
    hint = generate_hint("zbv", 4, 8, 2)
    assert hint.placement.stage_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert {t.stage for t in hint.lists[0]} == {0, 7}


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "message"),
    [
        ("1f1b", 4, 8, 2, "1f1b runs one chunk per rank, got --chunks 2; use interleaved-1f1b"),
        ("zb-h1", 4, 8, 3, "zb-h1 runs one chunk per rank, got --chunks 3; use zbv"),
        ("zbv", 4, 8, 1, "zbv runs exactly two chunks per rank in V shape, got --chunks 1"),
        ("interleaved-1f1b", 4, 6, 2, r"multiple of the rank count \(4\); use 8 micro-batches"),
        ("1f1b", 0, 8, 1, "ranks, micro-batches and chunks must be at least 1, got 0, 8, 1"),
    ],
)
def test_unsupported_sizes_are_refused(name: str, p: int, m: int, v: int, message: str) -> None:
    with pytest.raises(HintError, match=message):
        generate_hint(name, p, m, v)


def test_unknown_hint_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown hint '2f2b': choose one of gpipe, 1f1b, .*bfw, or load a CSV file"):
        generate_hint("2f2b", 4, 8)


def test_w_tasks_follow_their_b() -> None:
    for name, v in (("zb-h1", 1), ("zbv", 2), ("bfw", 1)):
        hint = generate_hint(name, 4, 8, v)
        for tasks in hint.lists:
            position = {t: i for i, t in enumerate(tasks)}
            for t in tasks:
                if t.kind is Kind.W:
                    assert position[Task(t.stage, Kind.B, t.mb)] < position[t]
