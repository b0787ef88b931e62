"""Hint validation: every task exactly once, dependencies respected within a
rank, and the hint completes under fixed-order execution.

A bad hint is refused with a :class:`~hintpipe.schedule.hint.HintError` that names the
rank, the position and the rule broken, followed by the step-by-rank grid with
the offending cell marked.

This module is torch-free.
"""

from __future__ import annotations

from hintpipe.schedule import rules
from hintpipe.schedule.hint import Hint, HintError
from hintpipe.schedule.task import Kind, Task


def _fail(hint: Hint, rank: int, pos: int, rule: str) -> HintError:
    return HintError(f"hint {hint.name!r}, rank {rank}, position {pos}: {rule}\n{hint.grid(mark=(rank, pos))}")


def validate_hint(hint: Hint) -> None:
    """Check ``hint`` and raise :class:`HintError` on the first rule it breaks.

    Rules, in the order checked:

    1. every task names an existing stage and micro-batch, hosted by its rank;
    2. no task appears twice;
    3. every F and B (and W, when the hint splits backward) appears once;
    4. within a rank, a task comes after its local dependencies (F before its
       B, B before its W, and stage order between stages of the same rank);
    5. a fixed-order run completes (no cross-rank deadlock).
    """
    stages, mbs = hint.stages, hint.microbatches
    stage_rank = hint.placement.stage_rank
    if len(hint.lists) != hint.ranks:
        raise HintError(f"hint {hint.name!r} has {len(hint.lists)} rank lists, its placement has {hint.ranks} ranks")
    seen: dict[Task, tuple[int, int]] = {}
    for r, tasks in enumerate(hint.lists):
        for i, t in enumerate(tasks):
            if not 0 <= t.stage < stages:
                raise _fail(hint, r, i, f"{t} names stage {t.stage}, the pipeline has stages 0..{stages - 1}")
            if not 0 <= t.mb < mbs:
                raise _fail(hint, r, i, f"{t} names micro-batch {t.mb}, the step has 0..{mbs - 1}")
            if stage_rank[t.stage] != r:
                raise _fail(hint, r, i, f"{t} belongs to rank {stage_rank[t.stage]}, which hosts stage {t.stage}")
            if t in seen:
                raise _fail(hint, r, i, f"{t} appears twice (first at position {seen[t][1]})")
            seen[t] = (r, i)
    kinds = (Kind.F, Kind.B, Kind.W) if hint.split_backward else (Kind.F, Kind.B)
    for s in range(stages):
        for mb in range(mbs):
            for kind in kinds:
                task = Task(s, kind, mb)
                if task not in seen:
                    r = stage_rank[s]
                    raise _fail(hint, r, len(hint.lists[r]), f"{task} is missing from rank {r}")
    for r, tasks in enumerate(hint.lists):
        for i, t in enumerate(tasks):
            for before in rules.dependencies(t, stages):
                where = seen[before]
                if where[0] == r and where[1] > i:
                    raise _fail(hint, r, i, f"{t} comes before {before} at position {where[1]}: {rules.why(t, before)}")
    stuck = _fixed_order_stuck(hint)
    if stuck:
        raise HintError(f"hint {hint.name!r} cannot complete in fixed order: every rank waits\n{stuck}")


def _fixed_order_stuck(hint: Hint) -> str:
    """Run every rank's list in order, each task once its dependencies are done; a dump
    of the ranks left waiting (a cycle between ranks), or "" when all complete."""
    stages, stage_rank = hint.stages, hint.placement.stage_rank
    done: set[Task] = set()
    position = [0] * hint.ranks
    progress = True
    while progress:
        progress = False
        for r, tasks in enumerate(hint.lists):
            i = position[r]
            while i < len(tasks) and all(d in done for d in rules.dependencies(tasks[i], stages)):
                done.add(tasks[i])
                i += 1
            progress = progress or i != position[r]
            position[r] = i
    if len(done) == hint.num_tasks:
        return ""
    lines = []
    for r, tasks in enumerate(hint.lists):
        i = position[r]
        if i == len(tasks):
            lines.append(rules.pending_report(r, 0, 0, None, i, []))
            continue
        unmet = [d for d in rules.dependencies(tasks[i], stages) if d not in done]
        waits = [rules.waiting_words(tasks[i], d, stage_rank) for d in unmet]
        lines.append(rules.pending_report(r, len(tasks) - i, 0, tasks[i], i, waits))
    return "\n".join(lines)
