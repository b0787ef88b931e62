"""The learning rate over a run: constant, or a linear warm-up followed by a cosine or linear decay to zero.

What torchtitan and Hugging Face's ``get_cosine_schedule_with_warmup`` do, as a factor of the optimizer's
rate at each step (:func:`lr_factor`); the run applies it with ``torch.optim.lr_scheduler.LambdaLR``, whose
state the checkpoints keep, so a resumed run goes on at the rate it stopped at.

This module is torch-free.
"""

from __future__ import annotations

import math

from hintpipe.modes import LrSchedule as LrSchedule


def lr_factor(schedule: LrSchedule, step: int, steps: int, warmup: int) -> float:
    """The factor of the base rate the optimizer steps with after ``step`` steps (0-based) of ``steps``.

    The warm-up never starts at 0 (a first step that changes nothing is a wasted step): step ``s`` of the
    warm-up takes ``(s + 1) / (warmup + 1)``. The decay reaches 0 at step ``steps``, after the last step.
    """
    if schedule is LrSchedule.CONSTANT:
        return 1.0
    if step < warmup:
        return (step + 1) / (warmup + 1)
    remaining = max(1, steps - warmup)
    progress = min(1.0, (step - warmup) / remaining)
    if schedule is LrSchedule.WARMUP_COSINE:
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress
