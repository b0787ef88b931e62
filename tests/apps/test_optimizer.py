"""The run's optimizer (:mod:`hintpipe.apps.optimizer`): AdamW or SGD with torch's own defaults where a flag is left
out, and AdamW's betas read from one flag."""

from __future__ import annotations

import pytest
import torch

from hintpipe.apps.optimizer import OptimizerConfig, OptimizerName, build_optimizer, parse_betas


def test_betas_are_two_numbers_in_zero_to_one() -> None:
    assert parse_betas("0.9,0.95") == (0.9, 0.95)
    assert parse_betas("0,0.5") == (0.0, 0.5)


@pytest.mark.parametrize("text", ["0.9", "0.9,1", "0.9,0.99,0.999", "a,b", "-0.1,0.9", ""])
def test_other_betas_are_refused_naming_the_flag_and_the_form(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_betas(text, "betas")
    assert str(refused.value) == f"betas {text!r}: give two numbers in [0, 1) as B1,B2, e.g. 0.9,0.999"


def test_a_flag_left_out_is_torchs_own_default_for_that_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = build_optimizer(params, OptimizerConfig(kind="adamw", lr=0.1))
    assert isinstance(adamw, torch.optim.AdamW)
    assert (adamw.defaults["weight_decay"], adamw.defaults["betas"]) == (0.01, (0.9, 0.999))
    sgd = build_optimizer(params, OptimizerConfig(kind="sgd", lr=0.1))
    assert isinstance(sgd, torch.optim.SGD) and (sgd.defaults["weight_decay"], sgd.defaults["momentum"]) == (0.0, 0.0)


def test_the_flags_given_reach_the_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = build_optimizer(params, OptimizerConfig(lr=0.5, weight_decay=0.0, betas="0.8,0.9"))
    assert (adamw.defaults["lr"], adamw.defaults["weight_decay"], adamw.defaults["betas"]) == (0.5, 0.0, (0.8, 0.9))
    sgd = build_optimizer(params, OptimizerConfig(kind=OptimizerName.SGD, lr=0.5, weight_decay=0.1, momentum=0.9))
    assert (sgd.defaults["weight_decay"], sgd.defaults["momentum"]) == (0.1, 0.9)
