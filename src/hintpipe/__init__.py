"""hintpipe: readiness-driven pipeline-parallel training for PyTorch."""

from hintpipe.generators import generate_hint
from hintpipe.hint import Hint, Placement
from hintpipe.scoreboard import Policy, Scoreboard
from hintpipe.task import Kind, Task

__all__ = ["Hint", "Kind", "Placement", "Policy", "Scoreboard", "Task", "generate_hint"]
