"""What a rank's step did, as it reports it (:mod:`hintpipe.runtime.loop.reports`): the micro-batches it held at
once, measured from its timeline, and its summary for rank 0 with what the step's hooks measured."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, cast

from hintpipe.runtime.loop.reports import RankSummary, durations_array, measured_peak
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.task import B, F, W

# One rank: F0 F1 B0 F2 W0 B1 W1 B2 W2, a second each (a split backward: W releases what F held).
RECORDS = [
    (0, F(0, 0), 0.0, 1.0), (0, F(0, 1), 1.0, 2.0), (0, B(0, 0), 2.0, 3.0), (0, F(0, 2), 3.0, 4.0),
    (0, W(0, 0), 4.0, 5.0), (0, B(0, 1), 5.0, 6.0), (0, W(0, 1), 6.0, 7.0), (0, B(0, 2), 7.0, 8.0),
    (0, W(0, 2), 8.0, 9.0),
]  # fmt: skip


def test_a_forward_is_held_from_its_start_to_the_end_of_what_releases_it() -> None:
    assert measured_peak(RECORDS, split_backward=True) == 3  # F0 held to W0's end (5), past F2's start (3)
    # B releases: F0 goes as B0 ends at 3, the moment F2 starts (a release is counted first), so 2 at most.
    assert measured_peak(RECORDS, split_backward=False) == 2
    assert measured_peak([], split_backward=True) == 0


def test_a_ranks_summary_carries_its_records_peaks_and_what_hooks_measured() -> None:
    state = cast(
        Any,
        SimpleNamespace(
            records=RECORDS,
            started=100.0,
            loop_time=9.5,
            peak_bytes=4096,
            measured={"device_peak": 2048.0, "runtime_cpu": 0.25},
            elements=[7, 5, 3],
        ),
    )
    summary = RankSummary.of(state, split=True, rank=1)
    assert (summary.rank, summary.busy, summary.peak_slots, summary.peak_bytes) == (1, 9.0, 3.0, 4096)
    assert (summary.device_peak, summary.runtime_cpu, summary.sizes) == (2048, 0.25, (7, 5, 3))
    assert math.isnan(summary.dp_overlap) and math.isnan(summary.allocated_over_counted)  # not measured
    assert summary.durations[:3] == ((0, 0, 0, 1.0), (0, 1, 0, 1.0), (0, 0, 1, 1.0))
    hint = generate_hint("zb-h1", 1, 3)
    durations = durations_array(hint, [summary])
    assert durations.shape == (1, 3, 3) and durations.sum() == 9.0 and durations[0, 2].tolist() == [1.0, 1.0, 1.0]
