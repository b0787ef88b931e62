"""The rules every part of hintpipe agrees on: dependencies and in-flight memory.

One definition each, used by the scoreboard, the validator, the generators,
the simulator, the planner and the runtime (a test checks that they agree):

- :func:`dependencies`: ``F(s)`` needs ``F(s-1)``; ``B(s)`` needs ``F(s)`` and
  ``B(s+1)`` (the last stage's ``B`` needs only its forward: the loss is
  computed in it); ``W(s)`` needs ``B(s)``. :func:`successors` is its inverse.
- :func:`memory_delta`: an ``F`` takes one micro-batch of activations; the
  last backward task of the same stage and micro-batch (``W`` when weight
  gradients are split off, else ``B``) gives it back.
- :func:`in_flight_peak`: the most micro-batches a task order holds at once.

This module is torch-free.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from hintpipe.schedule.task import Kind, Task

_WHY = {
    (Kind.F, Kind.F): "a forward needs the previous stage's forward",
    (Kind.B, Kind.F): "a backward needs its forward",
    (Kind.B, Kind.B): "a backward needs the next stage's backward",
    (Kind.W, Kind.B): "a weight gradient needs its backward",
}


def dependencies(task: Task, stages: int) -> tuple[Task, ...]:
    """The tasks whose results ``task`` needs, all of the same micro-batch."""
    s, kind, mb = task
    if kind is Kind.F:
        return (Task(s - 1, Kind.F, mb),) if s > 0 else ()
    if kind is Kind.B:
        if s < stages - 1:
            return (Task(s, Kind.F, mb), Task(s + 1, Kind.B, mb))
        return (Task(s, Kind.F, mb),)
    return (Task(s, Kind.B, mb),)


def successors(task: Task, stages: int, split_backward: bool) -> tuple[Task, ...]:
    """The tasks that need ``task``'s result: the inverse of :func:`dependencies`,
    derived from it (for a stage with the same neighbours, hence cached)."""
    s, kind, mb = task
    before, after = min(s, 1), min(stages - 1 - s, 1)
    offsets = _successor_offsets(kind, before, after, split_backward)
    return tuple(Task(s + d, k, mb) for d, k in offsets)


@functools.cache
def _successor_offsets(kind: Kind, before: int, after: int, split_backward: bool) -> tuple[tuple[int, Kind], ...]:
    # A representative stage ``before`` of a pipeline with ``before + after + 1`` stages.
    s, stages = before, before + after + 1
    task = Task(s, kind, 0)
    candidates = [
        Task(stage, k, 0)
        for stage in (s - 1, s, s + 1)
        if 0 <= stage < stages
        for k in (Kind.F, Kind.B, Kind.W)
        if k is not Kind.W or split_backward
    ]
    return tuple((t.stage - s, t.kind) for t in candidates if task in dependencies(t, stages))


def why(task: Task, dependency: Task) -> str:
    """In words, why ``task`` needs ``dependency``."""
    return _WHY[(task.kind, dependency.kind)]


def releaser(split_backward: bool) -> Kind:
    """The kind of task whose end frees a forward's activations."""
    return Kind.W if split_backward else Kind.B


def memory_delta(task: Task, split_backward: bool) -> int:
    """``+1`` for an ``F`` (it keeps one micro-batch), ``-1`` for its releaser, else 0."""
    if task.kind is Kind.F:
        return 1
    return -1 if task.kind is releaser(split_backward) else 0


def in_flight(tasks: Iterable[Task], split_backward: bool) -> list[int]:
    """Micro-batches held after each task of ``tasks``, run in that order."""
    live = 0
    out = []
    for t in tasks:
        live += memory_delta(t, split_backward)
        out.append(live)
    return out


def in_flight_peak(tasks: Iterable[Task], split_backward: bool) -> int:
    """The most micro-batches ``tasks`` hold at once, run in that order."""
    return max(in_flight(tasks, split_backward), default=0)


def stage_peaks(lists: Sequence[Sequence[Task]], stages: int, split_backward: bool) -> list[int]:
    """Per stage, the most micro-batches a fixed-order run of the per-rank lists holds at once."""
    peaks = [0] * stages
    for tasks in lists:
        for s in {t.stage for t in tasks}:
            peaks[s] = in_flight_peak((t for t in tasks if t.stage == s), split_backward)
    return peaks


def waiting_words(task: Task, dependency: Task, stage_rank: Sequence[int]) -> str:
    """What ``task`` waits for while ``dependency`` is unmet, in the words of a watchdog dump."""
    if dependency.kind is Kind.F and task.kind is Kind.F:
        return f"activation of stage {dependency.stage} from rank {stage_rank[dependency.stage]}"
    if dependency.kind is Kind.B and task.kind is Kind.B:
        return f"gradient of stage {dependency.stage} from rank {stage_rank[dependency.stage]}"
    return f"its {'forward' if dependency.kind is Kind.F else 'backward'} {dependency}"


def pending_report(
    rank: int, pending: int, running: int, task: Task | None, position: int, waits: Sequence[str]
) -> str:
    """One line of a deadlock or watchdog dump: what a rank still has to do and why it cannot."""
    if pending == 0:
        return f"rank {rank}: done"
    return (
        f"rank {rank}: {pending} tasks pending"
        + (f", {running} running" if running else "")
        + (f"; next in hint {task} (position {position}) waits for {'; '.join(waits) or 'nothing'}" if task else "")
    )
