"""The learning rate over a run: constant, or a linear warm-up followed by a cosine or linear decay to zero.

What torchtitan and Hugging Face's ``get_cosine_schedule_with_warmup`` do, as a factor of the optimizer's
rate at each step (:func:`lr_factor`); the run applies it with ``torch.optim.lr_scheduler.LambdaLR``, whose
state the checkpoints keep, so a resumed run goes on at the rate it stopped at.

[Note: a resume keeps the schedule]
The schedule's shape depends on the run's ``steps``, ``warmup_steps``, ``lr`` and kind. A resume with
``--steps`` raised reshaped a warm-up-cosine schedule silently (the rate went to 0, then back up to 5.1e-5).
So each checkpoint keeps them (:class:`ScheduleRecord`), and a resume whose fields differ is refused in one
line naming the field and both values. For a constant rate only ``lr`` counts: a longer run of it is the
same schedule. ``warmup_steps`` over ``steps`` is refused before the run starts.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from hintpipe.modes import LrSchedule as LrSchedule
from hintpipe.runtime.errors import CheckpointError


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


@dataclasses.dataclass(frozen=True)
class ScheduleRecord:
    """What a run's learning rate follows, saved with every checkpoint and compared by a resume (see [Note: a
    resume keeps the schedule]): a ``state`` for :class:`~hintpipe.runtime.checkpoint.checkpointer.Checkpointer`."""

    lr_schedule: str
    steps: int
    warmup_steps: int
    lr: float
    #: A checkpoint written before 0.7 holds no record: its resume compares nothing (any other state a caller
    #: gives a :class:`~hintpipe.runtime.checkpoint.checkpointer.Checkpointer` must be in the checkpoint).
    absent_from_older_checkpoints: ClassVar[bool] = True

    def __post_init__(self) -> None:  # plain values, as a checkpoint keeps them (an enum is not plain data)
        object.__setattr__(self, "lr_schedule", str(LrSchedule.parse(self.lr_schedule).value))

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Refuse a checkpoint whose schedule this run would reshape.

        Raises:
            CheckpointError: one line naming the field, the checkpoint's value and this run's, and what to do.
        """
        constant = LrSchedule.CONSTANT.value
        fields = ("lr_schedule", "lr") if constant == self.lr_schedule == saved.get("lr_schedule") else None
        for name in fields or ("lr_schedule", "steps", "warmup_steps", "lr"):
            then, now = saved.get(name), getattr(self, name)
            if then is not None and then != now:
                raise CheckpointError(
                    f"the checkpoint's run has {name} {then}, this one {now}: resuming would change the learning-"
                    f"rate schedule ({saved.get('lr_schedule')}) mid-run; resume with {name} {then} to keep it, or "
                    "start a new run in another checkpoint folder"
                )
