"""The projection admission looks ahead at (:mod:`hintpipe.dispatch.projected_live`): early runs noted and applied
late give the very floats that applying each at once would give."""

from __future__ import annotations

import numpy as np

from hintpipe.dispatch.projected_live import PENDING_LIMIT, ProjectedLive


def test_an_early_run_moves_the_positions_between_the_hints_next_and_its_own() -> None:
    projection = ProjectedLive(np.array([1.0, 2.0, 3.0, 2.0, 1.0]))
    projection.ran_early(1, 4, 1.5)  # position 4 ran while the hint's next was 1: positions 1..3 hold 1.5 more
    assert projection.peak(1, 5) == 4.5
    assert projection.peak(3, 5) == 3.5
    assert projection.peak(4, 5) == 1.0  # the task's own position and after: unchanged
    projection.ran_early(4, 2, -5.0)  # a note the hint has passed changes nothing
    assert projection.peak(4, 5) == 1.0


def test_notes_applied_late_give_the_same_floats_as_each_applied_at_once() -> None:
    rng = np.random.default_rng(0)
    start = rng.random(400)
    projection, direct = ProjectedLive(start), start.copy()
    hint_next = 0
    for step in range(3 * PENDING_LIMIT):  # enough notes to drop and apply them on the way
        pos = hint_next + 1 + int(rng.integers(50))
        delta = float(rng.normal())
        projection.ran_early(hint_next, pos, delta)
        direct[hint_next:pos] += delta
        hint_next = min(step // 3, 300)
    assert projection.peak(hint_next, 400) == float(direct[hint_next:].max())
    assert np.array_equal(projection._values[hint_next:], direct[hint_next:])
