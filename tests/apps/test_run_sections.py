"""A run's config as a tree of sections (hintpipe.apps.run_sections): each option's key has one place, the
sections check their own fields, and the config made from keys, changed by keys, and read back as keys is the
same config."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from hintpipe.apps.config_section import Section
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.optimizer import OptimizerConfig
from hintpipe.apps.run_sections import (
    KEYS,
    PIPELINE_KEYS,
    SECTIONS,
    CheckpointConfig,
    DataConfig,
    LrScheduleConfig,
    ParallelismConfig,
    TrainingConfig,
    place_of,
)
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli.config_file import SECTION_OF
from hintpipe.dispatch.policy import Policy
from hintpipe.modes import LrSchedule, OptimizerName, Precision
from hintpipe.options import PipelineConfig

GPT = ModelConfig()


def test_each_key_has_one_place_and_the_tree_holds_every_key_a_config_file_gives_a_run() -> None:
    """[Note: a key per field]: the keys of the sections, the pipeline's and the model's are apart, and every key
    of a config file that a run's config holds has its place; the file's keys that are the command line's own
    (an output file, the plan file, the model's sizes) have none."""
    sections = [{k for k, (s, _) in KEYS.items() if s == section.name} for section in SECTIONS]
    assert sum(len(keys) for keys in sections) == len(KEYS)
    assert not set(KEYS) & PIPELINE_KEYS
    placed = {key for key in SECTION_OF if place_of(key) is not None}
    assert set(SECTION_OF) - placed == {
        "init", "layers", "hidden", "heads", "vocab", "max_seq_len", "dropout", "seq_len", "emulate", "trace",
        "timeline", "save", "compare", "costs", "trials", "stage_memory", "optimizer_factor", "host_bandwidth",
        "repeats",
    } - {"emulate"}  # fmt: skip
    assert (place_of("lr"), place_of("checkpoint_dir"), place_of("policy")) == (
        "optimizer.lr",
        "checkpoint.folder",
        "pipeline.policy",
    )
    assert (place_of("model"), place_of("nonsense")) == ("model", None)


def test_a_config_of_keys_puts_each_in_its_section(tmp_path: Path) -> None:
    config = TrainConfig.of(
        model=GPT,
        ranks=2,
        microbatches=4,
        lr=0.01,
        optimizer="sgd",
        lr_schedule="warmup-cosine",
        warmup_steps=1,
        steps=3,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=2,
        policy="fixed",
        precision="bf16",
        dp=2,
    )
    assert config.optimizer == OptimizerConfig(kind=OptimizerName.SGD, lr=0.01)
    assert config.lr_schedule == LrScheduleConfig(kind=LrSchedule.WARMUP_COSINE, warmup_steps=1)
    assert config.training == TrainingConfig(steps=3)
    assert config.checkpoint == CheckpointConfig(folder=str(tmp_path), every=2)
    assert config.parallelism == ParallelismConfig(ranks=2, dp=2)
    assert config.pipeline == PipelineConfig(microbatches=4, policy=Policy.FIXED, precision=Precision.BF16)
    assert config.data == DataConfig() and config.world == 4


def test_keys_read_back_make_the_same_config() -> None:
    config = TrainConfig.of(model=GPT, ranks=2, microbatches=4, lr=0.02, eval_every=2, seed=5, policy="greedy")
    assert TrainConfig.of(**config.keys()) == config
    assert pickle.loads(pickle.dumps(config)) == config
    assert config.keys()["lr"] == 0.02 and config.keys()["eval_every"] == 2


def test_a_config_changed_by_keys_is_checked_again_and_the_first_is_kept() -> None:
    config = TrainConfig.of(model=GPT, ranks=2, microbatches=4)
    changed = config.replaced(lr=0.5, policy="fixed", steps=9)
    assert (changed.optimizer.lr, changed.pipeline.policy, changed.training.steps) == (0.5, Policy.FIXED, 9)
    assert (config.optimizer.lr, config.pipeline.policy, config.training.steps) == (1e-3, Policy.READY, 4)
    assert changed.data is config.data  # the sections not named are the same objects
    with pytest.raises(ValueError) as refused:
        config.replaced(warmup_steps=10)
    assert (
        str(refused.value)
        == "warmup_steps 10 is more than steps 4: the warm-up would never end; use warmup_steps 4 or fewer"
    )


def test_an_unknown_key_is_refused_with_the_nearest() -> None:
    with pytest.raises(TypeError) as refused:
        TrainConfig.of(model=GPT, ranks=2, microbatches=4, checkpoint_folder="x")
    assert str(refused.value) == "'checkpoint_folder' is no option of a training run; did you mean 'checkpoint_dir'?"
    with pytest.raises(TypeError) as refused:
        TrainConfig.of(model=GPT, ranks=2, microbatches=4, zzz=1)
    assert str(refused.value) == "'zzz' is no option of a training run"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: OptimizerConfig(lr=-1.0), "lr must be >= 0, got -1"),
        (lambda: OptimizerConfig(kind="adam"), "optimizer 'adam' is unknown: choose one of adamw, sgd"),
        (
            lambda: OptimizerConfig(betas="0.9"),
            "betas '0.9': give two numbers in [0, 1) as B1,B2, e.g. 0.9,0.999",
        ),
        (lambda: CheckpointConfig(every=-1), "checkpoint_every must be >= 0, got -1"),
        (lambda: TrainingConfig(steps=0), "steps must be between 1 and 2147483647, got 0"),
        (lambda: ParallelismConfig(ranks=0), "ranks must be at least 1, got 0"),
        (lambda: DataConfig(forming="rows"), "forming 'rows' is unknown: choose one of crop, padded, packed, concat"),
    ],
)
def test_a_section_checks_its_fields_by_their_keys(make: object, message: str) -> None:
    """Each section's fields are refused as their options are, under the option's name (its key), as it is made:
    not later, by the config or a rank."""
    assert callable(make)
    with pytest.raises(ValueError) as refused:
        make()
    assert str(refused.value) == message


def test_every_section_is_frozen_plain_data() -> None:
    for section in SECTIONS:
        assert issubclass(section, Section) and dataclasses.is_dataclass(section)
        made = section(ranks=2) if section is ParallelismConfig else section()
        field = dataclasses.fields(made)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, field, None)
