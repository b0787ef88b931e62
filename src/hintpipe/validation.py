"""Hint validation: every task exactly once, dependencies respected within a
rank, and the hint completes under fixed-order execution.

A bad hint is refused with a :class:`~hintpipe.hint.HintError` that names the
rank, the position and the rule broken, followed by the step-by-rank grid with
the offending cell marked.

This module is torch-free.
"""

from __future__ import annotations

from hintpipe.costs import CostModel
from hintpipe.hint import Hint, HintError
from hintpipe.scoreboard import Policy
from hintpipe.simulator import DeadlockError, Simulator
from hintpipe.task import Kind, Task


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
    stages, mbs = hint.num_stages, hint.num_microbatches
    stage_rank = hint.placement.stage_rank
    if len(hint.ranks) != hint.num_ranks:
        raise HintError(
            f"hint {hint.name!r} has {len(hint.ranks)} rank lists, its placement has {hint.num_ranks} ranks"
        )
    seen: dict[Task, tuple[int, int]] = {}
    for r, tasks in enumerate(hint.ranks):
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
                    raise _fail(hint, r, len(hint.ranks[r]), f"{task} is missing from rank {r}")
    for r, tasks in enumerate(hint.ranks):
        for i, t in enumerate(tasks):
            for before, why in _local_dependencies(t, hint):
                where = seen[before]
                if where[0] == r and where[1] > i:
                    raise _fail(hint, r, i, f"{t} comes before {before} at position {where[1]}: {why}")
    try:
        Simulator(hint, CostModel.uniform(stages)).run(Policy.FIXED)
    except DeadlockError as exc:
        raise HintError(f"hint {hint.name!r} cannot complete in fixed order: {exc}") from None


def _local_dependencies(t: Task, hint: Hint) -> list[tuple[Task, str]]:
    s, kind, mb = t
    deps: list[tuple[Task, str]] = []
    if kind is Kind.F and s > 0:
        deps.append((Task(s - 1, Kind.F, mb), "a forward needs the previous stage's forward"))
    elif kind is Kind.B:
        deps.append((Task(s, Kind.F, mb), "a backward needs its forward"))
        if s < hint.num_stages - 1:
            deps.append((Task(s + 1, Kind.B, mb), "a backward needs the next stage's backward"))
    elif kind is Kind.W:
        deps.append((Task(s, Kind.B, mb), "a weight gradient needs its backward"))
    return deps
