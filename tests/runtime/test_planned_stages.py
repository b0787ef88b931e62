"""A pipeline's stages from the model (:mod:`hintpipe.runtime.planned_stages`): a sequential cut before each split
point, its slices keeping the model's layer names, and stage counts checked against the hint."""

from __future__ import annotations

import pytest
from torch import nn

from hintpipe.runtime.planned_stages import sequential_stages, stages_of_this_rank
from hintpipe.schedule.generators import generate_hint


def test_a_sequential_is_cut_before_each_split_point_keeping_its_names() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    stages = sequential_stages(model, [2, 4])
    assert [len(stage) for stage in stages] == [2, 2, 1]  # type: ignore[arg-type]
    assert [list(stage.state_dict()) for stage in stages] == [
        ["0.weight", "0.bias"],
        ["2.weight", "2.bias"],
        ["4.weight", "4.bias"],
    ]
    assert stages[2][0] is model[4]  # type: ignore[index]  # the model's own layers, not copies


@pytest.mark.parametrize("split", [[2, 2], [0, 3], [3, 5], [4, 2]])
def test_split_points_that_do_not_increase_within_the_model_are_refused(split: list[int]) -> None:
    model = nn.Sequential(*(nn.Linear(1, 1) for _ in range(5)))
    with pytest.raises(ValueError) as refused:
        sequential_stages(model, split)
    assert str(refused.value) == f"split points {split} must increase strictly within 1..4"


def test_a_stage_count_other_than_the_hints_is_refused_naming_both() -> None:
    hint = generate_hint("interleaved-1f1b", 2, 4, 2)
    with pytest.raises(ValueError) as refused:
        stages_of_this_rank([nn.Linear(1, 1)] * 3, hint, None)
    assert str(refused.value) == "got 3 stage modules; hint 'interleaved-1f1b' on 2 ranks needs 4 (2 per rank)"
