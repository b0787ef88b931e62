"""The event simulator: dispatch's scoreboards on a virtual clock, and studies of many steps.

``simulator`` (runs and results), ``compare`` (a study: every policy on the same drawn work), ``simulate``
(one step as ``hintpipe simulate`` runs it), ``hint_choice`` (the hint that predicts fastest) and ``predict``
(a measured step's prediction). The engine, the layout, the bounds, the cost model, the samples and the
variability models are :mod:`hintpipe.dispatch`'s, which the runtime shares: the runtime forecasts for ``ready``
with :mod:`hintpipe.dispatch.expected` on the same engine, so a simulation and the runtime's expectations
come from one definition. This package re-exports the names a study needs. Torch-free.
"""

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.variability import parse_variability
from hintpipe.sim.compare import Summary, run_study
from hintpipe.sim.simulator import DeadlockError, Sample, SimResult, Simulator

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
