"""The event simulator: the scoreboard on a virtual clock, with cost and variability models.

``simulator`` (samples, runs, results) over ``engine`` (the fixed-order sweep and the event loop),
``layout`` (a hint's graphs and links by position, as arrays) and ``bounds`` (what no policy can beat,
with any memory or at a budget). Torch-free. The runtime uses :mod:`hintpipe.sim.expected` to plan the
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
