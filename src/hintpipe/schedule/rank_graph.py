"""One rank's tasks and how they depend: the fixed part of its dispatch state.

Built once per hint and rank from the dependency rules, and shared by every
:class:`~hintpipe.scoreboard.Scoreboard` that runs that rank's hint (the
simulator's trials, the runtime's steps). Byte admission builds one per step,
with each forward's activation size.

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind, Task


class RankGraph:
    """The fixed part of one rank's dispatch state: its tasks and how they depend.

    Built once per hint and rank and shared by every scoreboard that runs it.

    Args:
        hint: the whole hint (the graph reads its own rank's list).
        rank: which rank.
        sizes: activation size of each of this rank's ``F`` tasks, by
            position in the rank's hint (bytes, or ``None`` for one slot per
            micro-batch). Released by the last backward task of the same stage
            and micro-batch (``W`` when split, else ``B``).
    """

    def __init__(self, hint: Hint, rank: int, sizes: Sequence[float] | None = None) -> None:
        self.hint = hint
        self.rank = rank
        self.tasks: tuple[Task, ...] = hint.ranks[rank]
        n = len(self.tasks)
        if sizes is not None and len(sizes) != n:
            raise ValueError(f"sizes has {len(sizes)} entries, rank {rank} has {n} tasks")
        self.index: dict[Task, int] = {t: i for i, t in enumerate(self.tasks)}
        stage_rank = hint.placement.stage_rank
        stages, split = hint.num_stages, hint.split_backward
        need = [len(rules.dependencies(t, stages)) for t in self.tasks]
        local: list[tuple[int, ...]] = [()] * n
        remote: list[tuple[int, Task] | None] = [None] * n
        source: list[tuple[int, Task] | None] = [None] * n
        delta = [0.0] * n
        index = self.index
        for i, task in enumerate(self.tasks):
            after: list[int] = []
            for nxt in rules.successors(task, stages, split):
                if stage_rank[nxt.stage] == rank:
                    after.append(index[nxt])
                else:
                    assert remote[i] is None, f"{task} feeds two remote tasks"
                    remote[i] = (stage_rank[nxt.stage], nxt)
            local[i] = tuple(after)
            for dep in rules.dependencies(task, stages):
                if stage_rank[dep.stage] != rank:
                    source[i] = (stage_rank[dep.stage], dep)
            units = rules.memory_delta(task, split)
            if units > 0:
                delta[i] = 1.0 if sizes is None else float(sizes[i])
        for i, task in enumerate(self.tasks):
            if rules.memory_delta(task, split) < 0:
                delta[i] = -delta[index[Task(task.stage, Kind.F, task.mb)]]

        self.need = tuple(need)
        self.local = tuple(local)
        #: ``remote[pos]``: (rank, task) to notify when ``pos`` finishes, or None.
        self.remote = tuple(remote)
        #: ``source[pos]``: (rank, task) whose result is ``pos``'s remote input, or None.
        self.source = tuple(source)
        self.delta = tuple(delta)
        self.is_forward = tuple(t.kind is Kind.F for t in self.tasks)
        #: Each position's micro-batch.
        self.mbs = np.array([t.mb for t in self.tasks], dtype=np.int64)
        projected = []
        live = 0.0
        for d in delta:
            live += d
            projected.append(live)
        #: Live activations after each position when the hint runs in order.
        self.projected = tuple(projected)
        #: The most a fixed-order run of the hint holds at once on this rank.
        self.peak = max(projected, default=0.0)
        #: The largest single activation: one micro-batch's worth of room.
        self.unit = max(delta, default=0.0)
