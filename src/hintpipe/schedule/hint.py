"""Hints: per-rank ordered task lists, and where each stage lives.

A hint is what a pipeline schedule (GPipe, 1F1B, zero-bubble, ...) produces:
for every rank, the order in which its tasks would run in a fixed-order
pipeline. hintpipe treats that order as a *ranking* of ready work, not a
sequence to wait on; the scoreboard decides what actually runs.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from hintpipe.choice import Choice
from hintpipe.renamed import renamed, retired_attribute
from hintpipe.schedule import rules
from hintpipe.schedule.task import Kind, Task
from hintpipe.schedule.task_list import TaskList, as_task_lists


class HintError(ValueError):
    """A hint (generated, loaded or hand-written) that cannot run."""


class HintName(Choice):
    """The schedules hintpipe can generate."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZB_H1 = "zb-h1"
    ZBV = "zbv"
    BF = "bf"
    BFW = "bfw"

    @classmethod
    def noun(cls) -> str:
        return "hint"

    @classmethod
    def alternatives(cls) -> str:
        return ", or load a CSV file"

    @property
    def default_chunks(self) -> int:
        """Stages per rank when none are given: two for ZB-V (its V shape), else one."""
        return 2 if self is HintName.ZBV else 1


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which rank hosts each stage.

    ``stage_rank[s]`` is the rank of global stage ``s``. Two layouts are
    built in: ``loop`` (stage ``s`` on rank ``s % ranks``: interleaved
    schedules) and ``v`` (two chunks per rank, the second one mirrored, so the
    last rank hosts the middle two stages: ZB-V).
    """

    stage_rank: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.stage_rank:
            raise ValueError("a placement needs at least one stage")
        missing = set(range(self.ranks)) - set(self.stage_rank)
        if missing:
            raise ValueError(f"ranks {sorted(missing)} host no stage")

    @property
    def stages(self) -> int:
        """The number of stages."""
        return len(self.stage_rank)

    @property
    def num_stages(self) -> int:
        """Deprecated: :attr:`stages` (its name before 0.7)."""
        retired_attribute("Placement.num_stages", "Placement.stages")
        return self.stages

    @property
    def ranks(self) -> int:
        """The ranks the stages are on."""
        return max(self.stage_rank) + 1

    @property
    def num_ranks(self) -> int:
        """Deprecated: :attr:`ranks` (its name before 0.7)."""
        retired_attribute("Placement.num_ranks", "Placement.ranks")
        return self.ranks

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Global stage ids hosted by ``rank``, in increasing order."""
        return tuple(s for s, r in enumerate(self.stage_rank) if r == rank)

    @classmethod
    def loop(cls, ranks: int, chunks: int = 1) -> Placement:
        """Stage ``s`` on rank ``s % ranks`` (``ranks * chunks`` stages)."""
        _check_positive(ranks=ranks, chunks=chunks)
        return cls(tuple(s % ranks for s in range(ranks * chunks)))

    @classmethod
    def v_shape(cls, ranks: int) -> Placement:
        """Two chunks per rank in V shape: rank ``r`` hosts ``r`` and ``2*ranks-1-r``."""
        _check_positive(ranks=ranks)
        return cls(tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(2 * ranks)))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


@dataclasses.dataclass(frozen=True, init=False)
class Hint:
    """Per-rank task order plus the layout it runs on.

    Attributes:
        name: where the hint came from (a generator name or a file).
        placement: the stage-to-rank map.
        microbatches: micro-batches per step.
        lists: ``lists[r]`` is rank ``r``'s tasks in hint order, a :class:`TaskList` (any
            sequences of tasks given are converted).

    Before 0.7 ``microbatches`` was ``num_microbatches`` and ``lists`` was ``ranks``: both keywords are still
    taken, with a ``DeprecationWarning``; :attr:`ranks` is now the number of ranks (``num_ranks`` before).
    """

    name: str
    placement: Placement
    microbatches: int
    lists: tuple[TaskList, ...]

    @renamed("Hint", num_microbatches="microbatches", ranks="lists")
    def __init__(self, name: str, placement: Placement, microbatches: int, lists: tuple[TaskList, ...]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "microbatches", microbatches)
        if not all(isinstance(tasks, TaskList) for tasks in lists):
            lists = as_task_lists(lists)
        object.__setattr__(self, "lists", lists)

    @property
    def ranks(self) -> int:
        """The ranks the hint runs on (its placement's)."""
        return self.placement.ranks

    @property
    def num_ranks(self) -> int:
        """Deprecated: :attr:`ranks` (its name before 0.7)."""
        retired_attribute("Hint.num_ranks", "Hint.ranks")
        return self.ranks

    @property
    def num_microbatches(self) -> int:
        """Deprecated: :attr:`microbatches` (its name before 0.7)."""
        retired_attribute("Hint.num_microbatches", "Hint.microbatches")
        return self.microbatches

    @property
    def stages(self) -> int:
        """The number of stages (its placement's)."""
        return self.placement.stages

    @property
    def num_stages(self) -> int:
        """Deprecated: :attr:`stages` (its name before 0.7)."""
        retired_attribute("Hint.num_stages", "Hint.stages")
        return self.stages

    @functools.cached_property
    def split_backward(self) -> bool:
        """True when weight gradients are separate ``W`` tasks."""
        return any(bool((tasks.kind == Kind.W).any()) for tasks in self.lists)

    @functools.cached_property
    def stage_peaks(self) -> tuple[int, ...]:
        """Per stage, the most micro-batches a fixed-order run holds at once (see :mod:`~hintpipe.schedule.rules`)."""
        return tuple(rules.stage_peaks(self.lists, self.stages, self.split_backward))

    @property
    def num_tasks(self) -> int:
        return sum(len(tasks) for tasks in self.lists)

    @functools.cached_property
    def forward_only(self) -> bool:
        """True for a hint of forwards alone (an evaluation step: no gradients, nothing held in flight)."""
        return all(bool((tasks.kind == Kind.F).all()) for tasks in self.lists)

    def forwards(self) -> Hint:
        """The hint's forwards, in its order: an evaluation step on the same ranks (see :attr:`forward_only`)."""
        keep = [tasks.kind == Kind.F for tasks in self.lists]
        lists = tuple(TaskList(t.stage[f], t.kind[f], t.mb[f]) for t, f in zip(self.lists, keep, strict=True))
        return Hint(f"{self.name} (forwards)", self.placement, self.microbatches, lists)

    @classmethod
    @renamed("Hint.from_lists", num_microbatches="microbatches", ranks="lists")
    def from_lists(
        cls,
        name: str,
        placement: Placement,
        microbatches: int,
        lists: Sequence[Sequence[Task]],
    ) -> Hint:
        return cls(name, placement, microbatches, as_task_lists(lists))

    def grid(self, mark: tuple[int, int] | None = None) -> str:
        """The step-by-rank table, one column per rank; ``mark=(rank, pos)`` flags a cell."""
        width = max((len(str(t)) for tasks in self.lists for t in tasks), default=3) + 2
        depth = max((len(tasks) for tasks in self.lists), default=0)
        lines = ["step " + "".join(f"rank {r}".ljust(width + 2) for r in range(self.ranks))]
        for i in range(depth):
            cells = []
            for r, tasks in enumerate(self.lists):
                text = str(tasks[i]) if i < len(tasks) else ""
                if mark == (r, i):
                    text = f">{text}<"
                cells.append(text.ljust(width + 2))
            lines.append(f"{i:<5}" + "".join(cells))
        return "\n".join(line.rstrip() for line in lines)
