"""Timelines as Perfetto / Chrome trace JSON.

Open the file in https://ui.perfetto.dev or ``chrome://tracing``: one track
per rank, one slice per task, coloured by kind.

This module is torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hintpipe.schedule.task import Kind, Task

Record = tuple[int, Task, float, float]
"""``(rank, task, start, end)``."""

_COLOURS = {Kind.F: "thread_state_running", Kind.B: "good", Kind.W: "rail_load"}


def chrome_trace(records: Iterable[Record], *, unit_us: float = 1000.0, label: str = "hintpipe") -> dict[str, Any]:
    """Trace events for ``records``; times are multiplied by ``unit_us`` to
    get microseconds (the simulator's unit of cost becomes one millisecond)."""
    events: list[dict[str, Any]] = []
    ranks = set()
    for rank, task, start, end in records:
        ranks.add(rank)
        events.append(
            {
                "name": str(task),
                "cat": task.kind.name,
                "ph": "X",
                "pid": 0,
                "tid": rank,
                "ts": start * unit_us,
                "dur": (end - start) * unit_us,
                "cname": _COLOURS[task.kind],
                "args": {"stage": task.stage, "mb": task.mb},
            }
        )
    meta: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": label}}]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}} for r in sorted(ranks)
    ]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_chrome_trace(records: Iterable[Record], path: str | Path, **kwargs: Any) -> None:
    """Write :func:`chrome_trace` of ``records`` to ``path``."""
    Path(path).write_text(json.dumps(chrome_trace(records, **kwargs)))
