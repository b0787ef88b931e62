"""What a rank collects over its run's steps, and the :class:`~hintpipe.apps.train_config.TrainResult` rank 0
returns of it, with the pipeline's own figures (coordination, data-parallel overlap, the runtime's CPU)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch

from hintpipe.apps.train_config import TrainConfig, TrainResult
from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
from hintpipe.runtime.loop.emulated import EmulatedExecutor
from hintpipe.runtime.pipeline import Pipeline, StepReport

__all__ = ["Collected", "per_rank_ms", "train_result"]


@dataclasses.dataclass
class Collected:
    """What a rank collects over its steps (rank 0's is the run's result)."""

    losses: list[float] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    reports: list[StepReport] = dataclasses.field(default_factory=list)
    grad_diffs: tuple[float, float] | None = None
    learning_rates: list[float] = dataclasses.field(default_factory=list)
    grad_norms: list[float] = dataclasses.field(default_factory=list)
    evals: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    first: int = 0  # the step the loop started from (a resumed run's checkpoint)
    started: float = 0.0  # time.perf_counter() when the loop started
    every: int = 0  # a step line every this many steps (0: none; see hintpipe.apps.progress.line_every)


def train_result(
    config: TrainConfig,
    pipe: Pipeline,
    run: Collected,
    first: int,
    state: dict[str, torch.Tensor] | None,
    stopped_by: str,
    checkpoints: Checkpointer | None,
) -> TrainResult:
    """What rank 0 returns of its run: what the steps collected (``run``), the step it started from (``first``),
    the trained state if asked, the signal that stopped it, what its checkpoints did, and the pipeline's figures."""
    return TrainResult(
        config=config,
        reports=tuple(run.reports),
        losses=tuple(run.losses),
        tokens=tuple(run.tokens),
        max_grad_abs_diff=None if run.grad_diffs is None else run.grad_diffs[0],
        max_grad_rel_diff=None if run.grad_diffs is None else run.grad_diffs[1],
        resumed_from=first,
        nonfinite_steps=tuple(pipe.nonfinite_steps),
        state=state,
        stopped_by=stopped_by,
        checkpoint=None if checkpoints is None or checkpoints.last is None else str(checkpoints.last),
        resumed_checkpoint=None if checkpoints is None or checkpoints.resumed is None else str(checkpoints.resumed),
        notes=() if checkpoints is None else tuple(checkpoints.skipped),
        coordination_ms=_decision_ms(pipe),
        decisions_per_step=None if pipe.coordination is None else pipe.coordination.decisions / len(run.reports or [0]),
        decision_messages_per_step=(
            None if pipe.coordination is None else pipe.coordination.messages / len(run.reports or [0])
        ),
        tp_wait_ms=_tp_wait_ms(pipe, len(run.reports)),
        dp_overlap_ms=per_rank_ms([r.dp_overlap for r in run.reports[1:] or run.reports]),
        dp_exposed_ms=per_rank_ms([r.dp_exposed for r in run.reports[1:] or run.reports]),
        runtime_cpu_ms=per_rank_ms([r.runtime_cpu for r in run.reports[1:] or run.reports]),
        transport=pipe.transport.value,
        learning_rates=tuple(run.learning_rates),
        grad_norms=tuple(run.grad_norms),
        eval_losses=tuple(run.evals),
        wall_time=time.perf_counter() - run.started if run.reports else 0.0,
    )


def per_rank_ms(steps: list[tuple[float, ...]]) -> tuple[float, ...] | None:
    """Per rank, the mean over the steps in milliseconds; None without data parallelism (NaN values)."""
    complete = [values for values in steps if values and not any(math.isnan(v) for v in values)]
    if not complete:
        return None
    return tuple(1e3 * statistics.mean(column) for column in zip(*complete, strict=True))


def _tp_wait_ms(pipe: Pipeline, steps: int) -> float | None:
    executor = pipe.parts.compute
    if not isinstance(executor, EmulatedExecutor) or executor.couple is None or not steps:
        return None
    return 1e3 * executor.coupled_seconds / steps


def _decision_ms(pipe: Pipeline) -> float | None:
    coordination = pipe.coordination
    if coordination is None or not coordination.decisions:
        return None
    return 1e3 * coordination.announce_seconds / coordination.decisions
