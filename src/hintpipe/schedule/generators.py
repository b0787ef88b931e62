"""Hint generators: the classic pipeline schedules as per-rank task lists.

Each generator returns a :class:`~hintpipe.schedule.hint.Hint`. With ``p`` ranks and
``m`` micro-batches, 1F1B on 4 ranks and 6 micro-batches reads (``F``/``B``
with the micro-batch, one column per rank)::

    rank 0:  F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
    rank 1:  F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5
    rank 2:  F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5
    rank 3:  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5

Sources: GPipe (Huang et al. 2019); 1F1B (PipeDream-Flush, Narayanan et al.
2021); interleaved 1F1B (Megatron-LM, Narayanan et al. 2021); ZB-H1 and ZB-V
(Qi et al., "Zero Bubble Pipeline Parallelism", 2024), following the
constructions torch.distributed.pipelining uses. ``bf`` and ``bfw`` are
rankings by kind, turned into lists by running them once with uniform costs.

This module is torch-free.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint, HintError, HintName, Placement
from hintpipe.schedule.task import Kind, Task
from hintpipe.schedule.task_list import TaskList


def generate_hint(name: str | HintName, ranks: int, microbatches: int, chunks: int | None = None) -> Hint:
    """Build the hint ``name`` for ``ranks`` ranks, ``microbatches`` micro-batches
    and ``chunks`` stages per rank (default: the hint's :attr:`~HintName.default_chunks`).

    Raises:
        ValueError: for an unknown name.
        HintError: for sizes the schedule does not support, with the fix.
    """
    hint_name = HintName.parse(name) if isinstance(name, str) else name
    if chunks is None:
        chunks = hint_name.default_chunks
    if ranks < 1 or microbatches < 1 or chunks < 1:
        raise HintError(f"ranks, micro-batches and chunks must be at least 1, got {ranks}, {microbatches}, {chunks}")
    single_chunk = {HintName.ONE_F_ONE_B: "interleaved-1f1b", HintName.ZB_H1: "zbv"}
    if hint_name in single_chunk and chunks != 1:
        raise HintError(
            f"{hint_name.value} runs one chunk per rank, got --chunks {chunks}; "
            f"use {single_chunk[hint_name]} for several chunks per rank"
        )
    if hint_name is HintName.ZBV and chunks != 2:
        raise HintError(f"zbv runs exactly two chunks per rank in V shape, got --chunks {chunks}")
    build = _BUILDERS[hint_name]
    return build(ranks, microbatches, chunks)


def _gpipe(p: int, m: int, v: int) -> Hint:
    # With several chunks this is "looped BFS": all forwards of a stage, then the next.
    placement = Placement.loop(p, v)
    order = []
    mbs = np.arange(m)
    for r in range(p):
        stages = np.asarray(placement.stages_of(r))
        stage = np.concatenate([np.repeat(stages, m), np.repeat(stages[::-1], m)])
        kind = np.repeat([int(Kind.F), int(Kind.B)], len(stages) * m)
        order.append(TaskList(stage, kind, np.tile(mbs, 2 * len(stages))))
    return Hint(HintName.GPIPE.value, placement, m, tuple(order))


def _one_f_one_b_rank(r: int, p: int, m: int, split: bool) -> TaskList:
    """Rank ``r``'s 1F1B (ZB-H1 when ``split``): ``min(p - r - 1, m)`` warm-up forwards, then for each
    micro-batch ``i`` the next forward, if any, and ``B(i)``; under ZB-H1 rank ``r`` keeps its first ``r``
    weight passes back to fill the cool-down bubble, then runs one ``W`` after each ``B``."""
    warmup = min(p - r - 1, m)
    i = np.arange(m)
    # One row per micro-batch i: (forward, backward, weight) slots, each present or not.
    kinds = np.tile([int(Kind.F), int(Kind.B), int(Kind.W)], (m, 1))
    mbs = np.stack([warmup + i, i, i - r], axis=1)
    present = np.stack([warmup + i < m, np.ones(m, dtype=bool), (i >= r) & split], axis=1)
    late = np.arange(max(0, m - r), m) if split else np.arange(0)
    kind = np.concatenate([np.full(warmup, int(Kind.F)), kinds[present], np.full(len(late), int(Kind.W))])
    mb = np.concatenate([np.arange(warmup), mbs[present], late])
    return TaskList(np.full(len(kind), r), kind, mb)


def _one_f_one_b(p: int, m: int, v: int) -> Hint:
    order = tuple(_one_f_one_b_rank(r, p, m, split=False) for r in range(p))
    return Hint(HintName.ONE_F_ONE_B.value, Placement.loop(p), m, order)


def _zb_h1(p: int, m: int, v: int) -> Hint:
    order = tuple(_one_f_one_b_rank(r, p, m, split=True) for r in range(p))
    return Hint(HintName.ZB_H1.value, Placement.loop(p), m, order)


def _interleaved(p: int, m: int, v: int) -> Hint:
    if v == 1:
        hint = _one_f_one_b(p, m, v)
        return Hint(HintName.INTERLEAVED_1F1B.value, hint.placement, m, hint.lists)
    if m % p:
        raise HintError(
            f"interleaved-1f1b needs the micro-batch count ({m}) to be a multiple of "
            f"the rank count ({p}); use {m + (-m) % p} micro-batches"
        )
    total = m * v

    def mb_of(k: int) -> int:
        return (k // (p * v)) * p + k % p

    order = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        tasks = [Task(((k // p) % v) * p + r, Kind.F, mb_of(k)) for k in range(warmup)]
        for i in range(total):
            k = warmup + i
            if k < total:
                tasks.append(Task(((k // p) % v) * p + r, Kind.F, mb_of(k)))
            tasks.append(Task((v - 1 - (i // p) % v) * p + r, Kind.B, mb_of(i)))
        order.append(tasks)
    return Hint.from_lists(HintName.INTERLEAVED_1F1B.value, Placement.loop(p, v), m, order)


def _zbv(p: int, m: int, v: int) -> Hint:
    # The ZB-V construction of the zero-bubble paper, as in torch's
    # ScheduleZBVZeroBubble: run it for at least 2p - 1 micro-batches, then drop
    # the ones beyond m (the order of the rest stays valid).
    n = max(2 * p - 1, m)
    order = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r
        tasks: list[Task] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - r) - 1):
            tasks.append(Task(c0, Kind.F, f0))
            f0 += 1
        for _ in range(r):
            tasks += [Task(c1, Kind.F, f1), Task(c0, Kind.F, f0)]
            f1 += 1
            f0 += 1
        for _ in range(p - r):
            tasks += [Task(c1, Kind.F, f1), Task(c1, Kind.B, b1), Task(c1, Kind.W, b1)]
            f1 += 1
            b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                tasks.append(Task(c0, Kind.F, f0))
                f0 += 1
            tasks += [Task(c0, Kind.B, b0), Task(c0, Kind.W, b0)]
            b0 += 1
            tasks += [Task(c1, Kind.F, f1), Task(c1, Kind.B, b1), Task(c1, Kind.W, b1)]
            f1 += 1
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):
            tasks += [Task(c0, Kind.B, b0), Task(c1, Kind.B, b1)]
            b0 += 1
            b1 += 1
        for _ in range(p - r):
            tasks += [Task(c0, Kind.B, b0), Task(c0, Kind.W, w0)]
            b0 += 1
            w0 += 1
        tasks += [Task(c1, Kind.W, mb) for mb in range(w1, b1)]
        tasks += [Task(c0, Kind.W, mb) for mb in range(w0, b0)]
        order.append([t for t in tasks if t.mb < m])
    return Hint.from_lists(HintName.ZBV.value, Placement.v_shape(p), m, order)


def _bf(p: int, m: int, v: int) -> Hint:
    return _rank_by_kind(HintName.BF, p, m, v, split=False)


def _bfw(p: int, m: int, v: int) -> Hint:
    return _rank_by_kind(HintName.BFW, p, m, v, split=True)


_KIND_ORDER = {Kind.B: 0, Kind.F: 1, Kind.W: 2}


def _rank_by_kind(name: HintName, p: int, m: int, v: int, split: bool) -> Hint:
    """Run "B first, then F, then W; earlier micro-batch first" once.

    Uniform costs (F = B = W = 1, or B = 2 when not split), zero latency, and
    1F1B's admission: each stage holds at most as many micro-batches in flight
    as it does under 1F1B (interleaved 1F1B when ``v > 1``). Per-stage quotas
    keep several chunks on one rank from starving each other. The order in
    which each rank ran its tasks is the hint.
    """
    reference = _interleaved(p, m, v) if v > 1 else _one_f_one_b(p, m, v)
    placement = reference.placement
    quota = reference.stage_peaks
    stages = placement.stages
    cost = {Kind.F: 1, Kind.B: 1 if split else 2, Kind.W: 1}
    release = rules.releaser(split)

    def key(t: Task) -> tuple[int, int, int]:
        return (_KIND_ORDER[t.kind], t.mb, -t.stage)

    ready: list[list[tuple[tuple[int, int, int], Task]]] = [[] for _ in range(p)]
    need: dict[Task, int] = {}
    in_flight = [0] * stages
    order: list[list[Task]] = [[] for _ in range(p)]
    busy_until = [0] * p
    events: list[tuple[int, int, Task]] = []  # (finish time, rank, task)

    def satisfy(t: Task) -> None:
        left = need.get(t, len(rules.dependencies(t, stages))) - 1
        need[t] = left
        if left == 0:
            heapq.heappush(ready[placement.stage_rank[t.stage]], (key(t), t))

    for mb in range(m):
        heapq.heappush(ready[0], (key(Task(0, Kind.F, mb)), Task(0, Kind.F, mb)))
    now = 0
    while True:
        for r in range(p):
            if busy_until[r] > now:
                continue
            chosen = _pop_admitted(ready[r], in_flight, quota)
            if chosen is None:
                continue
            if chosen.kind is Kind.F:
                in_flight[chosen.stage] += 1
            order[r].append(chosen)
            busy_until[r] = now + cost[chosen.kind]
            heapq.heappush(events, (busy_until[r], r, chosen))
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, r, t = heapq.heappop(events)
            if t.kind is release:
                in_flight[t.stage] -= 1
            for nxt in rules.successors(t, stages, split):
                satisfy(nxt)
    if sum(len(o) for o in order) != reference.num_tasks * (3 if split else 2) // 2:
        raise HintError(f"{name.value} could not be built for {p} ranks, {m} micro-batches, {v} chunks")
    return Hint.from_lists(name.value, placement, m, order)


def _pop_admitted(
    ready: list[tuple[tuple[int, int, int], Task]], in_flight: list[int], quota: Sequence[int]
) -> Task | None:
    """The best-keyed ready task whose stage has room (an F over its quota waits)."""
    skipped = []
    chosen = None
    while ready:
        item = heapq.heappop(ready)
        if item[1].kind is Kind.F and in_flight[item[1].stage] >= quota[item[1].stage]:
            skipped.append(item)
            continue
        chosen = item[1]
        break
    for item in skipped:
        heapq.heappush(ready, item)
    return chosen


_BUILDERS: dict[HintName, Callable[[int, int, int], Hint]] = {
    HintName.GPIPE: _gpipe,
    HintName.ONE_F_ONE_B: _one_f_one_b,
    HintName.INTERLEAVED_1F1B: _interleaved,
    HintName.ZB_H1: _zb_h1,
    HintName.ZBV: _zbv,
    HintName.BF: _bf,
    HintName.BFW: _bfw,
}
