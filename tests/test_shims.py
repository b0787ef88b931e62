"""The 0.6 modules that moved into :mod:`hintpipe.dispatch` in 0.7 (``hintpipe.scoreboard``, ``hintpipe.policy``):
each still imports for a release, warning once with its new home, and gives the new home's own objects."""

from __future__ import annotations

import sys

import pytest

from hintpipe.dispatch.budgets import device_budgets, rank_budget
from hintpipe.dispatch.fit import BudgetError
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_forecast import RankForecast
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard


def _fresh(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``name`` imported afresh by the next import: its warning again."""
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_hintpipe_scoreboard_still_imports_and_says_its_new_home(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch, "hintpipe.scoreboard")
    with pytest.warns(DeprecationWarning, match=r"^hintpipe\.scoreboard is now hintpipe\.dispatch\.scoreboard$") as w:
        import hintpipe.scoreboard as module
    assert len(w) == 1
    assert (module.Scoreboard, module.RankGraph, module.RankPlan, module.Policy) == (
        Scoreboard,
        RankGraph,
        RankForecast,
        Policy,
    )
    assert (module.device_budgets, module.rank_budget, module.BudgetError) == (device_budgets, rank_budget, BudgetError)
    given = ["LATENESS_TOLERANCE", "PATIENCE_TOLERANCE", "BudgetError", "Policy", "RankGraph", "RankPlan"]
    assert sorted(module.__all__) == sorted([*given, "Scoreboard", "device_budgets", "rank_budget"])


def test_hintpipe_policy_still_imports_and_says_its_new_home(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch, "hintpipe.policy")
    with pytest.warns(DeprecationWarning, match=r"^hintpipe\.policy is now hintpipe\.dispatch\.policy$") as w:
        import hintpipe.policy as module
    assert len(w) == 1
    assert module.Policy is Policy
