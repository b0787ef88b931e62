"""hintpipe: readiness-driven pipeline-parallel training for PyTorch.

The scheduling core (tasks, hints, the scoreboard, the simulator) imports no
torch; the runtime and the planner do, and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hintpipe import _compat
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, Placement
from hintpipe.schedule.task import Kind, Task
from hintpipe.scoreboard import Policy, Scoreboard

if TYPE_CHECKING:
    from hintpipe.planner.capture import split_point
    from hintpipe.planner.plan import Plan, plan
    from hintpipe.runtime.pipeline import Pipeline

_LAZY = {
    "Pipeline": "hintpipe.runtime.pipeline",
    "Plan": "hintpipe.planner.plan",
    "plan": "hintpipe.planner.plan",
    "split_point": "hintpipe.planner.capture",
}


_compat.install()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hintpipe' has no attribute {name!r}")


__all__ = [
    "Hint",
    "Kind",
    "Pipeline",
    "Placement",
    "Plan",
    "Policy",
    "Scoreboard",
    "Task",
    "generate_hint",
    "plan",
    "split_point",
]
