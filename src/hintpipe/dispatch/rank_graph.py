"""One rank's tasks and how they depend: the fixed part of its dispatch state.

Built once per hint and rank from the dependency rules, and shared by every
:class:`~hintpipe.dispatch.scoreboard.Scoreboard` that runs that rank's hint (the
simulator's trials, the runtime's steps). Byte admission builds one per step,
with each forward's activation size.

The graph is computed with arrays from the rank's :class:`TaskList` (a rank of
a 1024 x 4096 pipeline has 12 thousand tasks, the pipeline 8.4 million); the
per-position tuples a scoreboard walks (``need``, ``local``, ``remote``, ...)
are built from them the first time one is asked for, so a fixed-order
simulation, which needs none of them, never builds them.

This module is torch-free.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.per_position import shared_ints
from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind, Task
from hintpipe.schedule.task_list import TaskList, positions_of

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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

    Raises:
        ValueError: if ``sizes`` does not have one entry per task, or a task's
            successor on this rank is missing from its list (validate the hint first).
    """

    def __init__(self, hint: Hint, rank: int, sizes: Sequence[float] | FloatArray | None = None) -> None:
        self.hint = hint
        self.rank = rank
        self.tasks: TaskList = hint.lists[rank]
        n = len(self.tasks)
        if sizes is not None and len(sizes) != n:
            raise ValueError(f"sizes has {len(sizes)} entries, rank {rank} has {n} tasks")
        stages, mbs = hint.stages, hint.microbatches
        stage_rank = np.asarray(hint.placement.stage_rank, dtype=np.int64)
        stage, kind, mb = self.tasks.stage, self.tasks.kind, self.tasks.mb
        is_f, is_b = kind == Kind.F, kind == Kind.B
        last = stages - 1
        self._keys, self._order = positions_of(self.tasks, mbs)

        #: Per position, how many inputs it waits for (see :func:`rules.dependencies`).
        self.need_array: IntArray = np.where(is_f, stage > 0, np.where(is_b, 1 + (stage < last), 1)).astype(np.int64)
        # The one neighbour a task feeds (F(s) -> F(s+1), B(s) -> B(s-1)) and the one that feeds it.
        feeds = np.where(is_f & (stage < last), stage + 1, np.where(is_b & (stage > 0), stage - 1, -1))
        fed_by = np.where(is_f & (stage > 0), stage - 1, np.where(is_b & (stage < last), stage + 1, -1))
        feeds_rank = np.where(feeds >= 0, stage_rank[np.maximum(feeds, 0)], -1)
        fed_by_rank = np.where(fed_by >= 0, stage_rank[np.maximum(fed_by, 0)], -1)
        remote = (feeds_rank >= 0) & (feeds_rank != rank)
        source = (fed_by_rank >= 0) & (fed_by_rank != rank)
        #: ``remote_rank[pos]``: the rank that the task at ``pos`` feeds, or -1; ``remote_key[pos]``: that task's key.
        self.remote_rank: IntArray = np.where(remote, feeds_rank, -1)
        self.remote_key: IntArray = np.where(remote, (feeds * 3 + kind) * mbs + mb, -1)
        #: ``source_rank[pos]``: the rank whose task feeds ``pos``, or -1; ``source_key[pos]``: that task's key.
        self.source_rank: IntArray = np.where(source, fed_by_rank, -1)
        self.source_key: IntArray = np.where(source, (fed_by * 3 + kind) * mbs + mb, -1)
        # Local successors, in the order of rules.successors: F(s) -> B(s), F(s+1); B(s) -> B(s-1), W(s).
        split = hint.split_backward
        first = np.full(n, -1, dtype=np.int64)
        second = np.full(n, -1, dtype=np.int64)
        f = np.flatnonzero(is_f)
        forwards_only = hint.forward_only  # an evaluation: no backward follows a forward
        if not forwards_only:
            first[f] = self._at(stage[f], Kind.B, mb[f])
        on_rank = f[(stage[f] < last) & (feeds_rank[f] == rank)]
        second[on_rank] = self._at(stage[on_rank] + 1, Kind.F, mb[on_rank])
        b = np.flatnonzero(is_b)
        on_rank = b[(stage[b] > 0) & (feeds_rank[b] == rank)]
        first[on_rank] = self._at(stage[on_rank] - 1, Kind.B, mb[on_rank])
        if split:
            second[b] = self._at(stage[b], Kind.W, mb[b])
        alone = (first < 0) & (second >= 0)
        first[alone], second[alone] = second[alone], -1
        #: Per position, the (up to two) positions on this rank its result satisfies, in the order of
        #: :func:`rules.successors`, -1 for none (the first is -1 only where both are).
        self.successor_positions = (first, second)

        delta = np.zeros(n)  # an evaluation's forwards keep nothing for a backward
        if not forwards_only:
            delta[f] = 1.0 if sizes is None else np.asarray(sizes, dtype=float)[f]
            freed = np.flatnonzero(kind == rules.releaser(split))
            delta[freed] = -delta[self._at(stage[freed], Kind.F, mb[freed])]
        #: Per position, the live activations it adds (an ``F``) or frees (its releaser).
        self.delta_array: FloatArray = delta
        #: Live activations after each position when the hint runs in order.
        self.projected_array: FloatArray = np.cumsum(delta)
        #: The most a fixed-order run of the hint holds at once on this rank.
        self.peak = float(self.projected_array.max(initial=0.0)) if n else 0.0
        #: The largest single activation: one micro-batch's worth of room.
        self.unit = float(delta.max(initial=0.0)) if n else 0.0
        #: Each position's micro-batch.
        self.mbs = mb

    def _at(self, stage: npt.ArrayLike, kind: Kind, mb: npt.ArrayLike) -> IntArray:
        """The positions of tasks ``(stage, kind, mb)`` on this rank."""
        keys = (np.asarray(stage, dtype=np.int64) * 3 + int(kind)) * self.hint.microbatches + np.asarray(mb)
        return self.positions(keys)

    def positions(self, keys: IntArray) -> IntArray:
        """The positions of the tasks with these keys (:meth:`TaskList.keys`) on this rank.

        Raises:
            ValueError: if a task is not on this rank.
        """
        keys = np.asarray(keys, dtype=np.int64)
        found = np.searchsorted(self._keys, keys)
        present = found < len(self._keys)
        present[present] = self._keys[found[present]] == keys[present]
        if not present.all():
            key, mbs = int(keys[~present][0]), self.hint.microbatches
            task = Task(key // mbs // 3, Kind(key // mbs % 3), key % mbs)
            raise ValueError(f"rank {self.rank} of hint {self.hint.name!r} has no task {task}: validate the hint")
        return self._order[found]

    # -- the per-position tuples a scoreboard walks, built on first use ---------------------------

    @functools.cached_property
    def index(self) -> dict[Task, int]:
        """Each task's position."""
        return {t: i for i, t in enumerate(self.tasks)}

    @functools.cached_property
    def need(self) -> tuple[int, ...]:
        return tuple(self.need_array.tolist())

    @functools.cached_property
    def local(self) -> tuple[tuple[int, ...], ...]:
        """``local[pos]``: the positions on this rank that the task at ``pos`` satisfies."""
        first, second = self.successor_positions
        return tuple(
            (a, b) if a >= 0 and b >= 0 else (a,) if a >= 0 else (b,) if b >= 0 else ()
            for a, b in zip(first.tolist(), second.tolist(), strict=True)
        )

    @functools.cached_property
    def successor_lists(self) -> tuple[list[int], list[int]]:
        """:attr:`successor_positions` as lists, for the scoreboard's hot path (of shared ints: see
        :func:`~hintpipe.dispatch.per_position.shared_ints`)."""
        first, second = self.successor_positions
        return shared_ints(first), shared_ints(second)

    @functools.cached_property
    def remote(self) -> tuple[tuple[int, Task] | None, ...]:
        """``remote[pos]``: (rank, task) to notify when ``pos`` finishes, or None."""
        return self._links(self.remote_rank, self.remote_key)

    @functools.cached_property
    def source(self) -> tuple[tuple[int, Task] | None, ...]:
        """``source[pos]``: (rank, task) whose result is ``pos``'s remote input, or None."""
        return self._links(self.source_rank, self.source_key)

    @functools.cached_property
    def fed_remotely(self) -> tuple[bool, ...]:
        """``fed_remotely[pos]``: whether the task at ``pos`` waits for an input from another rank."""
        return tuple((self.source_rank >= 0).tolist())

    @functools.cached_property
    def delta(self) -> tuple[float, ...]:
        return tuple(self.delta_array.tolist())

    @functools.cached_property
    def projected(self) -> tuple[float, ...]:
        return tuple(self.projected_array.tolist())

    @functools.cached_property
    def is_forward(self) -> tuple[bool, ...]:
        return tuple((self.tasks.kind == Kind.F).tolist())

    def _links(self, ranks: IntArray, keys: IntArray) -> tuple[tuple[int, Task] | None, ...]:
        out: list[tuple[int, Task] | None] = [None] * len(ranks)
        mbs = self.hint.microbatches
        kinds = (Kind.F, Kind.B, Kind.W)
        for pos in np.flatnonzero(ranks >= 0).tolist():
            key = int(keys[pos])
            out[pos] = (int(ranks[pos]), Task(key // mbs // 3, kinds[key // mbs % 3], key % mbs))
        return tuple(out)


def linked_positions(graphs: Sequence[RankGraph], ranks: IntArray, keys: IntArray) -> IntArray:
    """The positions, each on its own rank of ``ranks`` (-1: none), of the tasks with these keys:
    where a rank's links (``remote_rank``, ``remote_key``) or sources point, by position."""
    out = np.full(len(ranks), -1, dtype=np.int64)
    for q in np.unique(ranks[ranks >= 0]).tolist():
        where = ranks == q
        out[where] = graphs[q].positions(keys[where])
    return out
