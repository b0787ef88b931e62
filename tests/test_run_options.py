"""The options that are not the pipeline's (:mod:`hintpipe.run_options`): the run's, the simulator's and the
planner's, each once, each for the commands that take it, found by name."""

from __future__ import annotations

import pytest

from hintpipe.modes import OptimizerName
from hintpipe.run_options import RANKS, RUN_OPTIONS, run_option


def test_no_run_option_is_the_pipelines_and_each_is_defined_once() -> None:
    names = [option.name for option in (RANKS, *RUN_OPTIONS)]
    assert len(names) == len(set(names))
    assert not any(option.pipeline for option in (RANKS, *RUN_OPTIONS))
    assert all(option.commands and option.commands <= {"train", "simulate", "plan"} for option in RUN_OPTIONS)
    assert RANKS.required and RANKS.commands == {"train", "simulate", "plan"}


def test_a_run_option_is_found_by_its_name_and_another_name_is_a_key_error() -> None:
    assert run_option("steps").default == 4 and run_option("steps").commands == {"train"}
    assert run_option("optimizer").default in (OptimizerName.ADAMW, "adamw")
    with pytest.raises(KeyError, match=r"^'ranks'$"):  # the pipeline run's count of ranks is RANKS, not a run option
        run_option("ranks")
