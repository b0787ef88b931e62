"""hintpipe: readiness-driven pipeline-parallel training for PyTorch.

The scheduling core (tasks, hints, the scoreboard, the simulator) imports no
torch; the runtime and the planner do, and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hintpipe.generators import generate_hint
from hintpipe.hint import Hint, Placement
from hintpipe.scoreboard import Policy, Scoreboard
from hintpipe.task import Kind, Task

if TYPE_CHECKING:
    from hintpipe.capture import split_point
    from hintpipe.pipeline import Pipeline
    from hintpipe.planning import Plan, plan

_LAZY = {
    "Pipeline": "hintpipe.pipeline",
    "Plan": "hintpipe.planning",
    "plan": "hintpipe.planning",
    "split_point": "hintpipe.capture",
}


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
