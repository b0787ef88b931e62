"""What a rank collects over its steps and rank 0 returns (hintpipe.apps.run_result): the per-rank figures, in
milliseconds, over the steps that have them."""

from __future__ import annotations

import math

import pytest

from hintpipe.apps.run_result import Collected, per_rank_ms


def test_per_rank_figures_are_means_in_milliseconds_over_the_steps_that_have_them() -> None:
    steps: list[tuple[float, ...]] = [
        (0.002, 0.004),
        (0.004, 0.008),
        (math.nan, math.nan),
    ]  # a step without data parallelism's figures
    assert per_rank_ms(steps) == pytest.approx((3.0, 6.0))
    assert per_rank_ms([(math.nan,), ()]) is None  # none: not a run of several replicas
    assert Collected().reports == [] and Collected().first == 0
