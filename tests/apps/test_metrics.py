"""Metrics a user watches while a run goes on (:mod:`hintpipe.apps.metrics`): one TensorBoard point per figure per
step, each under its one tag."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hintpipe.apps.metrics import write_step


class Writer:
    """Keeps what ``SummaryWriter.add_scalar`` would write."""

    def __init__(self) -> None:
        self.points: dict[str, tuple[float, int]] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        assert tag not in self.points, f"{tag} written twice"
        self.points[tag] = (value, step)


def _report(**changes: object) -> Any:
    fields: dict[str, object] = {
        "makespan": 2.0,
        "bubble": (0.25, 0.75),
        "peak_live_bytes": (100, 300),
        "device_peak_bytes": (),
    }
    return cast(Any, SimpleNamespace(**{**fields, **changes}))


def test_a_steps_figures_are_written_at_the_number_of_steps_run() -> None:
    writer = Writer()
    write_step(writer, 4, _report(device_peak_bytes=(7000, 9000)), 1.5, 512, "tokens_per_s", 0.001, 0.5)
    assert writer.points == {
        "loss": (1.5, 4),
        "tokens_per_s": (256.0, 4),
        "step_time_s": (2.0, 4),
        "bubble": (0.5, 4),
        "peak_activation_bytes": (300.0, 4),
        "learning_rate": (0.001, 4),
        "grad_norm": (0.5, 4),
        "device_peak_bytes": (9000.0, 4),
    }


def test_a_figure_the_step_does_not_have_is_left_out_not_written_as_zero() -> None:
    writer = Writer()
    # No schedule of the learning rate, no clipping, no device figures (a CPU run, or one rank's unknown: -1).
    write_step(writer, 1, _report(device_peak_bytes=(5, -1)), 3.0, 10, "samples_per_s", None, None)
    assert sorted(writer.points) == ["bubble", "loss", "peak_activation_bytes", "samples_per_s", "step_time_s"]
    empty = Writer()
    write_step(empty, 1, _report(makespan=0.0, bubble=(), peak_live_bytes=()), 3.0, 10, "samples_per_s", None, None)
    assert (empty.points["samples_per_s"], empty.points["bubble"], empty.points["peak_activation_bytes"]) == (
        (0.0, 1),
        (0.0, 1),
        (0.0, 1),
    )
