"""``hintpipe train``'s checks before any rank starts (:mod:`hintpipe.cli.train_checks`): flags a model, its data
or the run cannot honour, and runs that would not fit this machine's memory, each one line naming the flags."""

from __future__ import annotations

import pytest

from hintpipe.apps.model_config import ModelConfig
from hintpipe.cli import train_checks
from hintpipe.cli.train_checks import available_memory, check_memory, check_model_memory

GPT = ModelConfig("gpt-mini")


def test_a_model_its_ranks_could_not_build_is_refused_with_the_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_checks, "available_memory", lambda: 3.0 * 2**30)
    check_model_memory(GPT, 2**27, 1)  # 512MiB in float32 for one rank: fits
    with pytest.raises(ValueError) as refused:
        check_model_memory(GPT, 2**27, 8)
    assert str(refused.value) == (
        "--model gpt-mini of --layers 4 --hidden 64 has 134,217,728 parameters (512MiB in float32); each of the 8 "
        "ranks builds it whole: about 4GiB, over the 3GiB this machine has available; use a smaller model"
    )
    monkeypatch.setattr(train_checks, "available_memory", lambda: None)
    check_model_memory(GPT, 2**40, 8)  # where the machine cannot tell: not refused


def test_a_step_whose_data_alone_would_take_half_the_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_checks, "available_memory", lambda: 2.0 * 2**30)
    check_memory(8, 4, 2, 1023)
    with pytest.raises(ValueError) as refused:
        check_memory(4096, 4, 2, 8191)
    assert str(refused.value) == (
        "--microbatches 4096 x --microbatch-size 4 x 8191 tokens: a step's data and bookkeeping take about 2.05GiB, "
        "over half of the 2GiB this machine has available; use fewer or smaller micro-batches"
    )


def test_the_memory_available_is_the_kernels_figure() -> None:
    available = available_memory()
    assert available is not None and available > 0 and available % 1024 == 0  # kB in /proc/meminfo
