"""Dispatch's engine, the simulator's two hot paths: the fixed-order sweep and the event loop.

The sweep also forecasts for ``ready`` (:meth:`hintpipe.dispatch.layout.HintLayout.forecasts`), in the simulator
and in the runtime alike; the event loop drives one :class:`~hintpipe.dispatch.scoreboard.Scoreboard` per rank on a
virtual clock (the simulator's run).

Both time every task of every rank from per-rank lists: ``cost[r][pos]``, how long
rank ``r``'s task at hint position ``pos`` runs, and ``delay[r][pos]``, how late
the message it sends arrives. They are plain functions over lists of floats
and ints, locals only, because they run millions of tasks per study.

This module is torch-free.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from hintpipe.dispatch.per_position import shared_ints
from hintpipe.dispatch.scoreboard import Scoreboard

IntArray = npt.NDArray[np.int64]


def fixed_order(
    cost: Sequence[Sequence[float]],
    delay: Sequence[Sequence[float]],
    source_rank: Sequence[IntArray],
    source_pos: Sequence[IntArray],
) -> tuple[list[list[float]], list[list[float]]] | None:
    """Every rank runs its hint in order: each task starts when the rank is free and its
    remote input has arrived. Returns each task's start and end, or None if the hint
    deadlocks (the event loop then explains why).

    ``source_rank[r][pos]`` and ``source_pos[r][pos]``: the rank and position of the remote
    task that feeds rank ``r``'s task at ``pos`` (rank -1: none).

    The same times as the event loop under ``fixed``, without its events: a rank's local
    inputs always come earlier in its own order, so only the remote one can make it wait.
    Each rank is a generator that sweeps forward until its next remote input is not yet
    computed; the rank that computes it resumes it. Planning ``ready`` and every fixed run
    of a study use it.
    """
    num_ranks = len(cost)
    starts = [[math.nan] * len(c) for c in cost]
    ends = [[math.nan] * len(c) for c in cost]
    done = [0] * num_ranks  # positions finished on each rank
    waiter: list[dict[int, int]] = [{} for _ in range(num_ranks)]  # waiter[r][pos]: the rank waiting on it
    todo = list(range(num_ranks))

    def sweep(r: int) -> Iterator[None]:
        # One rank runs at a time, so ``done[r]`` need only be right while this one is suspended.
        t = 0.0
        c, s_r, e_r, waits = cost[r], starts[r], ends[r], waiter[r]
        src_rank, src_pos = shared_ints(source_rank[r]), shared_ints(source_pos[r])
        for i, q in enumerate(src_rank):
            if q >= 0:
                j = src_pos[i]
                if j >= done[q]:
                    done[r] = i
                    waiter[q][j] = r
                    yield
                e_q = ends[q][j] + delay[q][j]
                if e_q > t:
                    t = e_q
            s_r[i] = t
            t += c[i]
            e_r[i] = t
            if waits:
                woken = waits.pop(i, None)
                if woken is not None:
                    todo.append(woken)
        done[r] = len(src_rank)

    sweeps = [sweep(r) for r in range(num_ranks)]
    while todo:
        next(sweeps[todo.pop()], None)
    if any(d != len(c) for d, c in zip(done, cost, strict=True)):
        return None
    return starts, ends


def drive(
    boards: Sequence[Scoreboard],
    cost: Sequence[Sequence[float]],
    delay: Sequence[Sequence[float]] | None,
    link_rank: Sequence[IntArray],
    link_pos: Sequence[IntArray],
    notices: bool,
) -> tuple[list[list[float]], list[list[float]], float]:
    """The event loop: every rank's scoreboard on one virtual clock until no event is left.

    The message of rank ``r``'s task at ``pos`` goes to rank ``link_rank[r][pos]``, position
    ``link_pos[r][pos]`` there (rank -1: none), ``delay[r][pos]`` later (None: every message at once, and
    one read less per task, on a stream of its own at 1024 ranks). With ``notices`` each consumer hears when its
    remote producer starts and ends. Returns each task's start and end (NaN if it never ran)
    and the clock at the end. This is the simulator's hot path: one function, locals only.
    """
    # Each event is a new tuple, none of them in a cycle: the cyclic collector's passes over them, a
    # gen-0 collection every few hundred tasks, cost 6-14% of the loop (128 and 1024 ranks) and find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run_events(boards, cost, delay, link_rank, link_pos, notices)
    finally:
        if collecting:
            gc.enable()


def _run_events(
    boards: Sequence[Scoreboard],
    cost: Sequence[Sequence[float]],
    delay: Sequence[Sequence[float]] | None,
    link_rank: Sequence[IntArray],
    link_pos: Sequence[IntArray],
    notices: bool,
) -> tuple[list[list[float]], list[list[float]], float]:
    """:func:`drive`'s loop itself, with the collector off: locals only."""
    num_ranks = len(boards)
    etas = [sb.eta for sb in boards]
    leads = [sb.lead for sb in boards]
    takes = [sb.take for sb in boards]
    completes = [sb.complete for sb in boards]
    satisfies = [sb.satisfy for sb in boards]
    delayed = delay is not None
    delays = delay if delay is not None else ()
    to_rank = [shared_ints(q) for q in link_rank]
    to_pos = [shared_ints(j) for j in link_pos]
    starts = [[math.nan] * len(c) for c in cost]
    ends = [[math.nan] * len(c) for c in cost]
    running = [False] * num_ranks
    wake_pending = [math.inf] * num_ranks
    # (time, rank, pos): pos >= 0 a task finishes, -1 a patience wake-up,
    # -2 - p a message making position p ready.
    events: list[tuple[float, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    now = 0.0
    dirty = set(range(num_ranks))
    while True:
        for r in dirty:
            if running[r]:
                continue
            pos = takes[r](now)
            if pos >= 0:
                running[r] = True
                starts[r][pos] = now
                push(events, (now + cost[r][pos], r, pos))
                if notices:
                    q = to_rank[r][pos]
                    if q >= 0:  # Scoreboard.producer_started, inline
                        j = to_pos[r][pos]
                        etas[q][j] = now + leads[q][j]
            else:
                wake = boards[r].wake_at
                if wake < wake_pending[r]:
                    wake_pending[r] = wake
                    push(events, (wake, r, -1))
        dirty.clear()
        if not events:
            return starts, ends, now
        now, r, pos = pop(events)
        while True:  # every event at ``now``
            dirty.add(r)
            if pos >= 0:
                running[r] = False
                ends[r][pos] = now
                completes[r](pos, now)
                q = to_rank[r][pos]
                if q >= 0:
                    j = to_pos[r][pos]
                    if delayed and delays[r][pos] > 0.0:
                        push(events, (now + delays[r][pos], q, -2 - j))
                        if notices:
                            boards[q].producer_finished(j, now)
                            dirty.add(q)
                    else:
                        satisfies[q](j)
                        dirty.add(q)
            elif pos == -1:
                if wake_pending[r] <= now:
                    wake_pending[r] = math.inf
            else:
                satisfies[r](-2 - pos)
            if not events or events[0][0] > now:
                break
            _, r, pos = pop(events)
