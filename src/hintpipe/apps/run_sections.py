"""The sections of a training run's config (:class:`~hintpipe.apps.train_config.TrainConfig`), one per concern,
as torchtitan's ``JobConfig`` has them and as a config file groups its keys: what the run reads (``data``), how
it updates (``optimizer``, ``lr_schedule``), how long and how (``training``), on how many processes
(``parallelism``), what it keeps (``checkpoint``) and what it says (``metrics``). The pipeline's own options are
the section :class:`~hintpipe.options.PipelineConfig`, which a :class:`~hintpipe.runtime.pipeline.Pipeline`
takes as it is.

[Note: a key per field]
Each option has one name, its *key*: the command line's flag (``--checkpoint-dir``), a config file's key
(``checkpoint_dir`` in ``[checkpoint]``), :meth:`TrainConfig.of <hintpipe.apps.train_config.TrainConfig.of>`'s
keyword, and the name messages give it. In the tree the field drops what its section already says
(``config.checkpoint.folder``, ``config.optimizer.lr``); the field's metadata records its key where the two
differ, and :data:`KEYS` is the one map from a key to its place, derived from the fields. Each section checks
its fields by their keys' rows of the options table (:data:`hintpipe.options.OPTIONS`), once, as it is made.

This module is torch-free (a section is plain data; the run's rules that need a model are the config's).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, ClassVar

from hintpipe.apps.config_section import Section, key_of, keyed
from hintpipe.apps.model_config import SeqLenDist
from hintpipe.apps.optimizer import OptimizerConfig as OptimizerConfig
from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.form import Forming
from hintpipe.modes import LrSchedule
from hintpipe.option import ChoiceField
from hintpipe.options import RENAMED_OPTIONS, PipelineConfig
from hintpipe.run_options import run_option


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(Section):
    """What the run trains and evaluates on, and how documents become micro-batches."""

    name: ClassVar[str] = "data"

    #: "synthetic", "stdlib" (the standard library's source, byte tokens), or paths (PATH[:WEIGHT]: one, or a
    #: tuple of several with weights; see hintpipe.data.sources).
    source: str | tuple[str, ...] = keyed("synthetic", "data")
    field: str = keyed("text", "data_field")  # a JSONL line's (or a dataset's column's) document
    split: str = keyed("blank", "data_split")  # plain text's documents: "blank", "file" or a separator
    tokenizer: str = "bytes"  # a file corpus's tokens: UTF-8 bytes, or a Hugging Face tokenizer's folder
    #: documents as they are (crop), or micro-batches formed by cost (padded, packed; see hintpipe.forming)
    forming: ChoiceField[Forming] = ChoiceField(run_option("forming"))
    #: A corpus of its own to evaluate on, as ``source`` takes paths (its tokenizer, field and split):
    #: evaluations draw from all of its documents, and ``source`` trains on all of its own (see [Note: an
    #: evaluation corpus of its own] in hintpipe.apps.batches).
    eval_source: str | tuple[str, ...] | None = keyed(None, "eval_data")
    #: Synthetic documents' lengths (and the lengths a model is sized and checked for).
    seq_len_dist: SeqLenDist = dataclasses.field(default_factory=lambda: SeqLenDist(64))
    sequence_cost: SequenceCost | None = None  # the model's cost per row, for forming (fitted once, by the caller)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LrScheduleConfig(Section):
    """How the learning rate moves over the run (see :mod:`hintpipe.apps.lr_schedule`)."""

    name: ClassVar[str] = "lr_schedule"

    kind: ChoiceField[LrSchedule] = ChoiceField(run_option("lr_schedule"))
    warmup_steps: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingConfig(Section):
    """How long the run trains, on what batches, from what seed, with what checks and injected faults."""

    name: ClassVar[str] = "training"

    steps: int = 4
    microbatch_size: int = 4
    seed: int = 0
    check_grads: bool = False  # the first step's gradients compared with the unsplit model's
    variability: tuple[str, ...] = ()  # emulated variability (see hintpipe.runtime.injection)
    faults: tuple[str, ...] = ()  # injected faults (see hintpipe.runtime.injection)
    return_state: bool = False  # rank 0 returns the trained weights in the result


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelismConfig(Section):
    """The run's processes: ``dp`` replicas of a pipeline of ``ranks`` ranks, each ``tp`` tensor-parallel ranks
    (the world is their product)."""

    name: ClassVar[str] = "parallelism"

    ranks: int  # pipeline ranks (one pipeline's length)
    dp: int = 1  # data-parallel replicas of the pipeline
    tp: int = 1  # tensor-parallel ranks per stage
    shared: bool = False  # under torchrun: rank 0's plan, sequence cost and emulated costs go to every rank


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Section):
    """Where and how often the run saves, how many saves it keeps, and whether it resumes."""

    name: ClassVar[str] = "checkpoint"

    folder: str | None = keyed(None, "checkpoint_dir")
    every: int = keyed(0, "checkpoint_every")  # a save every this many steps (0: none but at a stop)
    keep: int = keyed(2, "checkpoint_keep")  # verified checkpoints kept (one more while an export reads one)
    replace: bool = keyed(False, "replace_checkpoints")  # a fresh run in another run's folder deletes its saves
    group_readable: bool = False  # the folder's files 0640 and folders 0750 (else 0600, 0700)
    resume: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetricsConfig(Section):
    """What the run reports as it goes: its log, held-out losses, TensorBoard scalars, a progress bar."""

    name: ClassVar[str] = "metrics"

    log_every: int = 0  # rank 0 prints step, loss, step time, throughput and ETA to stderr every this many steps
    eval_every: int = 0  # the held-out loss every this many steps and after the last (0: none)
    eval_batches: int = 0  # each held-out loss over this many fixed batches of held-out documents (0: one drawn)
    tensorboard: str | None = None  # a folder for TensorBoard scalars, written by rank 0 every step
    progress: bool = False


#: The run's sections other than the model and the pipeline, in a config file's order.
SECTIONS: tuple[type[Section], ...] = (
    DataConfig,
    OptimizerConfig,
    LrScheduleConfig,
    TrainingConfig,
    ParallelismConfig,
    CheckpointConfig,
    MetricsConfig,
)

#: Each section by its name in the run's config.
SECTION_NAMED: dict[str, type[Section]] = {section.name: section for section in SECTIONS}

#: Each key of the sections (see [Note: a key per field]): its section's name and its field's.
KEYS: dict[str, tuple[str, str]] = {
    key_of(section, f): (section.name, f.name)
    for section in SECTIONS
    for f in dataclasses.fields(section)  # type: ignore[arg-type]
    if f.init
}

#: The keys a run's config holds outside the sections: its model and its plan.
TOP_KEYS = ("model", "plan")

#: The pipeline's keys (the fields of :class:`~hintpipe.options.PipelineConfig`).
PIPELINE_KEYS = frozenset(f.name for f in dataclasses.fields(PipelineConfig))


def place_of(key: str) -> str | None:
    """Where the option ``key`` lives in a run's config (``"optimizer.lr"``, ``"pipeline.policy"``,
    ``"model"``), or None: no option of a run (a renamed option's key before is read as its key now)."""
    key = RENAMED_OPTIONS.get(key, key)
    if key in TOP_KEYS:
        return key
    if key in PIPELINE_KEYS:
        return f"pipeline.{key}"
    if key in KEYS:
        return ".".join(KEYS[key])
    return None


def sectioned(keys: Mapping[str, Any], *, into: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The keywords of a run's config for the options ``keys`` (key -> value, as the command line and a config
    file name them): each section made from its keys, or, given the sections ``into`` (another config's), each
    of those with its keys replaced.

    Raises:
        TypeError: a key that is no option of a run, naming the nearest.
    """
    grouped: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {}
    for given, value in keys.items():
        place = place_of(given)
        if place is None:
            near = difflib.get_close_matches(given, [*TOP_KEYS, *PIPELINE_KEYS, *KEYS], n=1)
            fix = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"{given!r} is no option of a training run{fix}")
        if "." not in place:
            out[place] = value
            continue
        section, field = place.split(".")
        grouped.setdefault(section, {})[field] = value
    kinds: dict[str, type[Any]] = {**SECTION_NAMED, "pipeline": PipelineConfig}
    for section, values in grouped.items():
        before = None if into is None else into[section]
        out[section] = kinds[section](**values) if before is None else dataclasses.replace(before, **values)
    return out
