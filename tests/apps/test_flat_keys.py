"""A run's config as 0.7 first had it, flat (hintpipe.apps.flat_keys): still made and read, for a release, each
with a warning that says what to write now."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import raised_here
from hintpipe.apps.flat_keys import read_by_key
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.run_sections import DataConfig
from hintpipe.apps.train_config import TrainConfig
from hintpipe.modes import OptimizerName
from hintpipe.options import PipelineConfig

GPT = ModelConfig()


def _flat(**keys: Any) -> TrainConfig:
    """``TrainConfig(...)`` given keys, as a type checker would not allow."""
    make: Any = TrainConfig
    config: TrainConfig = make(**keys)
    return config


def test_a_config_made_of_keys_warms_and_is_the_config_of_them() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        flat = _flat(model=GPT, ranks=2, microbatches=4, lr=0.05, data="synthetic", optimizer="sgd")
    assert [str(w.message) for w in raised_here(caught)] == [
        "TrainConfig(ranks=...) with the options' keys is now TrainConfig.of(ranks=...), or "
        "TrainConfig(parallelism=ParallelismConfig(ranks=...)); the flat form goes in 0.8"
    ]
    assert flat == TrainConfig.of(model=GPT, ranks=2, microbatches=4, lr=0.05, optimizer="sgd")
    assert flat.optimizer.kind is OptimizerName.SGD and flat.data.source == "synthetic"


def test_an_option_read_by_its_key_warns_and_reads_its_section() -> None:
    config = TrainConfig.of(model=GPT, ranks=2, microbatches=4, lr=0.05, checkpoint_keep=3)
    read: Any = config
    with pytest.warns(DeprecationWarning, match=r"^TrainConfig\.lr is now TrainConfig\.optimizer\.lr$"):
        assert read.lr == 0.05
    with pytest.warns(DeprecationWarning, match=r"^TrainConfig\.checkpoint_keep is now TrainConfig\.checkpoint\.keep$"):
        assert read.checkpoint_keep == 3
    with pytest.warns(DeprecationWarning, match=r"^TrainConfig\.microbatches is now TrainConfig\.pipeline\."):
        assert read.microbatches == 4
    with pytest.raises(AttributeError, match=r"^'TrainConfig' object has no attribute 'lrr'$"):
        read.lrr  # noqa: B018
    # What is no option of a section is no attribute: a top-level key, a private name (pickling's probes).
    for name in ("model", "_fields", "__getstate__"):
        with pytest.raises(AttributeError, match=rf"^'TrainConfig' object has no attribute '{name}'$"):
            read_by_key(config, name)


def test_sections_and_keys_together_are_refused() -> None:
    with pytest.raises(TypeError) as refused:
        _flat(model=GPT, pipeline=PipelineConfig(microbatches=4), ranks=2, data=DataConfig())
    assert str(refused.value) == (
        "TrainConfig() takes its sections or, as TrainConfig.of(), the options' keys, not both: got pipeline, data "
        "with ranks"
    )
