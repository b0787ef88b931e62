"""The ranks' one comparison of their options at start-up (:mod:`hintpipe.runtime.option_agreement`): ranks that
would run different pipelines are refused in one line naming each difference; every rank learns every rank's byte
budget."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch.distributed as dist

from hintpipe.dispatch.policy import Policy
from hintpipe.modes import TransportChoice
from hintpipe.options import PipelineConfig
from hintpipe.runtime.errors import OptionMismatch
from hintpipe.runtime.option_agreement import agree_on_options, compared_options
from hintpipe.schedule.generators import generate_hint

CONFIG = PipelineConfig(microbatches=4, policy=Policy.READY)


def _wiring(hint: str = "1f1b") -> Any:
    layout = SimpleNamespace(pp=2, dp=1, tp=1)
    return cast(
        Any,
        SimpleNamespace(
            hint=generate_hint(hint, 2, 4), transport_choice=TransportChoice.GLOO, layout=layout, coll=None, rank=0
        ),
    )


def _other_rank(monkeypatch: pytest.MonkeyPatch, theirs: dict[str, Any], budget: float | None) -> None:
    def all_gather_object(gathered: list[Any], mine: Any, group: Any = None) -> None:
        gathered[:] = [mine, (theirs, budget)]

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)


def test_ranks_of_one_pipeline_agree_and_learn_each_others_byte_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = compared_options(_wiring(), CONFIG, by_bytes=True)
    assert {k: mine[k] for k in ("hint", "stages", "split_backward", "transport", "byte_admission")} == {
        "hint": "1f1b",
        "stages": 2,
        "split_backward": False,
        "transport": TransportChoice.GLOO.value,
        "byte_admission": True,
    }
    assert mine["policy"] == "ready"  # an option compared by its value, an enum by its string
    _other_rank(monkeypatch, mine, 2e9)
    assert agree_on_options(_wiring(), CONFIG, 1e9) == (1e9, 2e9)
    _other_rank(monkeypatch, compared_options(_wiring(), CONFIG, by_bytes=False), None)
    assert agree_on_options(_wiring(), CONFIG, None) is None  # no byte admission: no budgets to learn


def test_ranks_that_would_run_different_pipelines_are_refused_naming_each_difference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    theirs = compared_options(_wiring("gpipe"), dataclasses.replace(CONFIG, policy=Policy.FIXED), by_bytes=False)
    _other_rank(monkeypatch, theirs, None)
    with pytest.raises(OptionMismatch) as refused:
        agree_on_options(_wiring(), CONFIG, None)
    assert str(refused.value) == (
        "rank 0: ranks disagree on pipeline options (hint: '1f1b' here, 'gpipe' on rank 1, policy: 'ready' here, "
        "'fixed' on rank 1); start every rank with the same options"
    )
