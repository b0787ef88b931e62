"""Tasks: the unit of pipeline work, ``(stage, kind, mb)``.

The text form ``"2F0"`` (stage 2, forward, micro-batch 0) is the one
torch.distributed.pipelining uses for its actions, so schedules can be
exchanged with it as CSV (see :mod:`hintpipe.schedule.hint_csv`).

This module is torch-free: the scoreboard and the simulator build on it.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple


class Kind(enum.IntEnum):
    """What a task computes.

    ``F`` is the forward pass of a stage. ``B`` computes the gradient with
    respect to the stage input; when a hint has no ``W`` tasks, ``B`` is the
    full backward (input and weight gradients together). ``W`` computes the
    weight gradients that ``B`` left out.
    """

    F = 0
    B = 1
    W = 2


class Task(NamedTuple):
    """One unit of work: run ``kind`` of ``stage`` on micro-batch ``mb``."""

    stage: int
    kind: Kind
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.name}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Task:
        """Parse the text form, e.g. ``"2F0"``.

        Raises:
            ValueError: if ``text`` is not ``<stage><F|B|W><mb>``.
        """
        match = _TASK_RE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"bad task {text!r}: expected <stage><F|B|W><micro-batch>, e.g. '2F0'")
        return cls(int(match.group(1)), Kind[match.group(2)], int(match.group(3)))


_TASK_RE = re.compile(r"(\d+)([FBW])(\d+)")


def F(stage: int, mb: int) -> Task:
    """Forward task of ``stage`` on ``mb``."""
    return Task(stage, Kind.F, mb)


def B(stage: int, mb: int) -> Task:
    """Backward (to the stage input) task of ``stage`` on ``mb``."""
    return Task(stage, Kind.B, mb)


def W(stage: int, mb: int) -> Task:
    """Weight-gradient task of ``stage`` on ``mb``."""
    return Task(stage, Kind.W, mb)
