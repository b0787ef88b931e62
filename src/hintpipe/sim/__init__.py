"""The event simulator: the scoreboard on a virtual clock, with cost and variability models.

Torch-free. The runtime uses :mod:`hintpipe.sim.expected` to plan the
``ready`` policy from measured task times, so a simulation and the runtime's
expectations come from the same engine.
"""

from hintpipe.sim.compare import Summary, run_study
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import DeadlockError, Sample, SimResult, Simulator
from hintpipe.sim.variability import parse_variability

__all__ = [
    "CostModel",
    "DeadlockError",
    "Sample",
    "SimResult",
    "Simulator",
    "Summary",
    "parse_variability",
    "run_study",
]
