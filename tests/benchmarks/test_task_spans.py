"""benchmarks/vs-torch/task_spans.py: the hand-overs between two ranks and each rank's time in F, B and W, from
tasks' spans, as ``paired.py --gaps`` prints them: exact values on spans laid out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs-torch"))

import task_spans  # a benchmark script, importable from its folder

Span = tuple[str, int, str, int, float, float]


def _two_ranks(name: str, cycle: int, shift: float) -> tuple[list[Span], list[Span]]:
    """One 1F1B-like step of 2 micro-batches on two ranks, in ms from ``shift``: rank 0 forwards 0-2 and 2-4,
    backwards 10-13 and 16-19; rank 1 forwards 3-6 and 7-10, backwards 6-9 and 10-15 (its W 15-16 on mb 1)."""
    ms = 1e-3

    def span(kind: str, mb: int, start: float, end: float) -> Span:
        return (name, cycle, kind, mb, (shift + start) * ms, (shift + end) * ms)

    zero = [
        span("step", 0, 0, 20),
        span("F", 0, 0, 2),
        span("F", 1, 2, 4),
        span("B", 0, 10, 13),
        span("B", 1, 16, 19),
    ]
    one = [
        span("step", 0, 0, 20),
        span("F", 0, 3, 6),
        span("F", 1, 7, 10),
        span("B", 0, 6, 9),
        span("B", 1, 10, 15),
        span("W", 1, 15, 16),
    ]
    return zero, one


def test_hand_overs_are_the_gaps_between_a_producer_s_end_and_its_consumer_s_start() -> None:
    zero, one = _two_ranks("run", 0, 0.0)
    more_zero, more_one = _two_ranks("run", 1, 100.0)
    other_zero, other_one = _two_ranks("other", 0, 200.0)
    got = task_spans.hand_overs([zero + more_zero + other_zero, one + more_one + other_one], "run")
    # activations: 3 - 2 and 7 - 4; gradients: 10 - 9 and 16 - 15; medians over both cycles' micro-batches
    assert got == pytest.approx(
        {"activation": 2.0, "gradient": 1.0, "start to first F": 0.0, "last B to end": 1.0}, abs=1e-9
    )


def test_busy_is_each_kind_s_time_per_step_and_the_rest_of_the_step() -> None:
    zero, one = _two_ranks("run", 0, 0.0)
    later_zero, later_one = _two_ranks("run", 1, 100.0)
    assert task_spans.busy(zero + later_zero, "run") == pytest.approx(
        {"F": 4.0, "B": 6.0, "W": 0.0, "rest": 10.0}, abs=1e-9
    )
    assert task_spans.busy(one + later_one, "run") == pytest.approx(
        {"F": 6.0, "B": 8.0, "W": 1.0, "rest": 5.0}, abs=1e-9
    )
    with pytest.raises(ValueError, match=r"^no step of 'absent' recorded$"):
        task_spans.busy(one, "absent")
