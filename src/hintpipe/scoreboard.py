"""The scoreboard's module before 0.7: it is :mod:`hintpipe.dispatch.scoreboard` now, in the package the simulator
and the runtime share. This one imports, with a ``DeprecationWarning``, through 0.7, and gives the names it gave.

This module is torch-free.
"""

from __future__ import annotations

from hintpipe.dispatch.budgets import device_budgets, rank_budget
from hintpipe.dispatch.fit import BudgetError
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_forecast import PATIENCE_TOLERANCE
from hintpipe.dispatch.rank_forecast import RankForecast as RankPlan
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import LATENESS_TOLERANCE, Scoreboard
from hintpipe.renamed import retired_module

retired_module("hintpipe.scoreboard", "hintpipe.dispatch.scoreboard")

__all__ = [
    "LATENESS_TOLERANCE",
    "PATIENCE_TOLERANCE",
    "BudgetError",
    "Policy",
    "RankGraph",
    "RankPlan",
    "Scoreboard",
    "device_budgets",
    "rank_budget",
]
