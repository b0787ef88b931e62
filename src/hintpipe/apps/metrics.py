"""Metrics a user can watch while a run goes on: TensorBoard scalars, one point per step (``--tensorboard``).

torch's own ``SummaryWriter`` writes them (``pip install -e '.[tensorboard]'``: the ``tensorboard`` package it
needs is an optional extra), on rank 0, which holds every rank's report. The step of a point is the number of
steps run, as the log lines and the table count them (``step 4/100``). One tag per figure: ``loss``,
``learning_rate``, ``grad_norm`` (with clipping), ``tokens_per_s`` (``samples_per_s`` for ``mlp``),
``step_time_s``, ``bubble`` (the mean over ranks), ``peak_activation_bytes`` (the busiest rank's),
``device_peak_bytes`` (on GPUs), ``held_out_loss`` (``--eval-every``).
"""

from __future__ import annotations

import statistics
from typing import Any

from hintpipe.runtime.loop.reports import StepReport


def tensorboard_writer(log_dir: str) -> Any:
    """torch's ``SummaryWriter`` on ``log_dir``.

    Raises:
        ImportError: tensorboard is not installed, naming the extra.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch's module needs the tensorboard package
        raise ImportError("--tensorboard needs tensorboard: pip install -e '.[tensorboard]'") from exc
    return SummaryWriter(log_dir=log_dir)


def write_step(
    writer: Any,
    steps: int,
    report: StepReport,
    loss: float,
    tokens: int,
    unit: str,
    learning_rate: float | None,
    grad_norm: float | None,
) -> None:
    """The figures of the step after which ``steps`` steps have run."""
    figures = {
        "loss": loss,
        unit: tokens / report.makespan if report.makespan > 0 else 0.0,
        "step_time_s": report.makespan,
        "bubble": statistics.mean(report.bubble) if report.bubble else 0.0,
        "peak_activation_bytes": float(max(report.peak_live_bytes, default=0)),
    }
    if learning_rate is not None:
        figures["learning_rate"] = learning_rate
    if grad_norm is not None:
        figures["grad_norm"] = grad_norm
    if report.device_peak_bytes and min(report.device_peak_bytes) >= 0:
        figures["device_peak_bytes"] = float(max(report.device_peak_bytes))
    for tag, value in figures.items():
        writer.add_scalar(tag, value, steps)
