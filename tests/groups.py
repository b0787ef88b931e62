"""Many small cases on one spawned group of ranks.

Starting ranks (a process each, importing torch, joining a process group)
costs seconds on a small machine, far more than a small case runs. So a test
module lists its cases, a module-scoped fixture runs them all on one group of
ranks (one spawn, :func:`run_cases`), and each test reads its own case's
per-rank results. A case that raises on a rank is recorded as a
:class:`CaseFailed` for that rank, and the group goes on to the next case, so
that one broken behaviour fails one test, not the module. New tests of other
work add a case to a group: seconds, not minutes.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from hintpipe.runtime.launch import run_ranks


@dataclasses.dataclass(frozen=True)
class Case:
    """``fn(rank, world, *args)``, run on every rank of the group."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class CaseFailed:
    """What a case raised on one rank: its one-line error, its traceback, and the seconds the case ran."""

    error: str
    details: str
    elapsed: float


def _run_all(rank: int, world: int, cases: list[tuple[str, Case]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, case in cases:
        began = time.monotonic()
        try:
            results[name] = case.fn(rank, world, *case.args)
        except Exception as exc:
            results[name] = CaseFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc(), time.monotonic() - began)
    return results


def run_cases(world: int, cases: Mapping[str, Case], *, timeout: float = 120.0) -> dict[str, list[Any]]:
    """Run every case, in order, on one group of ``world`` spawned ranks; returns each case's per-rank results."""
    results = run_ranks(_run_all, world, list(cases.items()), timeout=timeout)
    return {name: [per_rank[name] for per_rank in results] for name in cases}


def succeeded(results: list[Any]) -> list[Any]:
    """A case's per-rank results, or the test fails with every failed rank's error and traceback (the first to
    fail is often a neighbour of the one that caused it)."""
    failed = [f"rank {rank}: {r.error}\n{r.details}" for rank, r in enumerate(results) if isinstance(r, CaseFailed)]
    if failed:
        raise AssertionError("\n".join(failed))
    return results


def failure_text(results: list[Any]) -> str:
    """A case that failed on every rank, as :class:`~hintpipe.runtime.errors.RankFailure` would say it (ranks
    that failed with the same error in one line)."""
    errors = [r.error for r in results if isinstance(r, CaseFailed)]
    assert len(errors) == len(results), f"the case did not fail on every rank: {results}"
    by_text: dict[str, list[str]] = {}
    for rank, text in enumerate(errors):
        by_text.setdefault(text, []).append(str(rank))
    return "\n".join(
        f"rank {ranks[0]}: {text}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}: {text}"
        for text, ranks in by_text.items()
    )
