"""A hint laid out for the engine: its rank graphs and, by position, where results go.

Every run of one hint shares its layout: the graphs (dependencies and memory),
each position's stage, micro-batch and kind (to pick its cost from a sample),
and the cross-rank links as positions (the rank and position a task's result
goes to, and the one its remote input comes from), all as arrays. A run under
admission by size may run a hint fitted to its budget: a layout of its own.

This module is torch-free.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.engine import fixed_order
from hintpipe.dispatch.per_position import float_view
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.dispatch.rank_graph import RankGraph, linked_positions
from hintpipe.schedule.hint import Hint

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class HintLayout:
    """One hint's graphs and links by position.

    Args:
        hint: the hint.
        graphs: one per rank, built on ``hint``.
        like: a layout of the same hint whose links can be shared (they do not depend on sizes).
    """

    def __init__(self, hint: Hint, graphs: Sequence[RankGraph], like: HintLayout | None = None) -> None:
        self.hint = hint
        self.graphs = list(graphs)
        self.stage = [tasks.stage for tasks in hint.lists]
        self.mb = [tasks.mb for tasks in hint.lists]
        self.kind = [tasks.kind for tasks in hint.lists]
        #: ``source_rank[r][pos]``, ``source_pos[r][pos]``: the remote task that feeds ``pos`` (rank -1: none).
        self.source_rank: list[IntArray]
        self.source_pos: list[IntArray]
        #: ``link_rank[r][pos]``, ``link_pos[r][pos]``: the remote task ``pos`` feeds (rank -1: none).
        self.link_rank: list[IntArray]
        self.link_pos: list[IntArray]
        if like is not None and like.hint is hint:
            self.source_rank, self.source_pos = like.source_rank, like.source_pos
            self.link_rank, self.link_pos = like.link_rank, like.link_pos
        else:
            self.source_rank = [g.source_rank for g in self.graphs]
            self.source_pos = [linked_positions(self.graphs, g.source_rank, g.source_key) for g in self.graphs]
            self.link_rank = [g.remote_rank for g in self.graphs]
            self.link_pos = [linked_positions(self.graphs, g.remote_rank, g.remote_key) for g in self.graphs]
        self._forecasts: dict[tuple[float, bytes], list[RankForecast]] = {}

    def gather(self, values: FloatArray, rank: int) -> FloatArray:
        """``values[stage, mb, kind]`` of each of ``rank``'s positions."""
        return values[self.stage[rank], self.mb[rank], self.kind[rank]]

    @functools.cached_property
    def links(self) -> list[list[tuple[int, int] | None]]:
        """``links[r][pos]``: (rank, position there) that rank ``r``'s task at ``pos`` feeds, or None."""
        return _pairs(self.link_rank, self.link_pos)

    @functools.cached_property
    def sources(self) -> list[list[tuple[int, int] | None]]:
        """``sources[r][pos]``: (rank, position there) of the remote task that feeds ``pos``, or None."""
        return _pairs(self.source_rank, self.source_pos)

    def forecasts(self, expected: FloatArray, latency: float = 0.0) -> list[RankForecast]:
        """Per rank, what ``ready`` expects: a fixed-order run on ``expected`` costs ``[stage, mb, kind]``
        (cached per latency and costs)."""
        key = (latency, expected.tobytes())
        if key not in self._forecasts:
            ranks = range(self.hint.ranks)
            costs = [self.gather(expected, r) for r in ranks]
            cost = [float_view(c) for c in costs]
            delay = [[latency] * len(c) for c in costs]
            timeline = fixed_order(cost, delay, self.source_rank, self.source_pos)
            assert timeline is not None, "a valid hint runs in its own order"
            starts, ends = timeline
            forecasts = []
            for r in ranks:
                src_rank, src_pos = self.source_rank[r], self.source_pos[r]
                producer = np.zeros(len(costs[r]))
                for q in np.unique(src_rank[src_rank >= 0]).tolist():
                    where = src_rank == q
                    producer[where] = costs[q][src_pos[where]]
                forecasts.append(RankForecast.from_timeline(starts[r], ends[r], costs[r], producer, latency))
                starts[r] = ends[r] = []  # a rank's timeline at a time: its floats are 64 bytes a task
            self._forecasts[key] = forecasts
        return self._forecasts[key]


def _pairs(ranks: Sequence[IntArray], positions: Sequence[IntArray]) -> list[list[tuple[int, int] | None]]:
    return [
        [None if q < 0 else (q, j) for q, j in zip(rank.tolist(), pos.tolist(), strict=True)]
        for rank, pos in zip(ranks, positions, strict=True)
    ]
