"""A training run as plain data: what every rank needs to train (:class:`TrainConfig`) and what the run did
(:class:`TrainResult`), apart from the loop that runs it (:mod:`~hintpipe.apps.training`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hintpipe.apps.evaluation_corpus import Evaluations, check_apart, check_eval_batches, evaluation_parts
from hintpipe.apps.flat_keys import read_by_key, taking_keys_before
from hintpipe.apps.model_rules import (
    check_activation_budgets,
    check_layer_count,
    check_model_options,
    check_sequence_lengths,
    check_tensor_parallel,
    check_vocabulary,
    layers_and_parameters,
)
from hintpipe.apps.models import ModelConfig
from hintpipe.apps.run_sections import (
    SECTIONS,
    CheckpointConfig,
    DataConfig,
    LrScheduleConfig,
    MetricsConfig,
    OptimizerConfig,
    ParallelismConfig,
    TrainingConfig,
    sectioned,
)
from hintpipe.data.run_data import resolve_data
from hintpipe.modes import TransportChoice
from hintpipe.observe.trace import Record
from hintpipe.option import said
from hintpipe.options import RENAMED_OPTIONS, PipelineConfig
from hintpipe.planner.plan import Plan
from hintpipe.renamed import renamed
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.pipeline import StepReport
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.resolve import resolve_hint

if TYPE_CHECKING:
    from hintpipe.apps.split_costs import AutoRun


#: ``hint="auto"``: see :func:`choose_auto_hint`.
AUTO = "auto"


def choose_auto_hint(config: AutoRun, chunks: int | None) -> str:
    """The hint ``auto`` stands for in the run ``config`` (a :class:`TrainConfig`, or the command line's):
    :func:`~hintpipe.apps.split_costs.auto_hint`, said on stderr with its predictions (the choice is the
    run's: its checkpoints and its report name the hint chosen). A resume keeps the hint its checkpoint records
    (measured again, the choice could go the other way, and the run would go on in another order).

    Raises:
        ValueError: under ``torchrun`` (every rank would measure for itself, and could choose otherwise), or as
            :func:`~hintpipe.apps.split_costs.auto_hint` refuses.
    """
    from hintpipe.apps.split_costs import auto_hint
    from hintpipe.runtime.rank_process import under_torchrun

    if under_torchrun():
        raise ValueError(
            "hint auto measures the stages in the launcher, and under torchrun every rank is one: choose once "
            "(hintpipe train --hint auto with --steps 1 prints the choice) and give the hint by name"
        )
    kept = _resumed_hint(config)
    if kept is not None:
        return kept
    chosen, predicted = auto_hint(config, chunks=chunks)
    figures = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in predicted.items())
    print(f"hint auto: {chosen} (the step simulated on the stages' measured costs: {figures})", file=sys.stderr)
    return chosen


def _resumed_hint(config: AutoRun) -> str | None:
    """The hint the newest checkpoint of the folder's run records, for a resume of ``config``, said on stderr;
    None: not a resume, or no checkpoint to read it from (see
    :func:`~hintpipe.runtime.checkpoint.run_folder.recorded_hint`)."""
    from hintpipe.runtime.checkpoint.run_folder import recorded_hint

    folder = config.checkpoint_dir
    found = recorded_hint(Path(folder)) if config.resume and folder else None
    if found is None:
        return None
    hint, step = found
    print(f"hint auto: {hint} (the run's, as {step} records)", file=sys.stderr)
    return hint


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a rank needs to train (picklable: it crosses process boundaries), as a tree of sections (see
    :mod:`~hintpipe.apps.run_sections`): the model, the pipeline's options (the
    :class:`~hintpipe.options.PipelineConfig` a :class:`~hintpipe.runtime.pipeline.Pipeline` takes), and the
    run's own, a section per concern. Each section checks its fields as it is made; the rules across sections
    (a model and its data, checkpoint settings, a hint and its ranks) are checked here, once, as the config is
    made, before any rank starts.

    ``TrainConfig.of(model=..., ranks=2, microbatches=8, lr=3e-4)`` makes one from the options' keys, the names
    the command line's flags and a config file's keys have; :meth:`replaced` changes some by key.
    """

    model: ModelConfig
    pipeline: PipelineConfig
    parallelism: ParallelismConfig
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    lr_schedule: LrScheduleConfig = dataclasses.field(default_factory=LrScheduleConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    plan: Plan | None = None  # train this plan's stages (a plan file, or a Hugging Face model planned by the caller)
    #: The prepared folder of each ``data.source`` entry, resolved when the config is made (raw files prepared
    #: then, in this process, before any rank starts): what the ranks read (see hintpipe.data.run_data).
    prepared: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False, compare=False)
    #: The prepared folder of each ``data.eval_source`` entry, resolved as ``prepared`` is.
    eval_prepared: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False, compare=False)

    @classmethod
    @renamed("TrainConfig.of", **RENAMED_OPTIONS)
    def of(cls, **keys: Any) -> TrainConfig:
        """The config of the options ``keys``, by the names the command line's flags and a config file's keys
        have (``checkpoint_dir``, ``lr``, ``policy``; see [Note: a key per field] in
        :mod:`~hintpipe.apps.run_sections`), each put in its section.

        Raises:
            TypeError: a key that is no option of a run, or a required one left out (``ranks``,
                ``microbatches``, ``model``).
            ValueError: as the config refuses its values.
        """
        return cls(**sectioned(keys))

    @renamed("TrainConfig.replaced", **RENAMED_OPTIONS)
    def replaced(self, **keys: Any) -> TrainConfig:
        """This config with the options ``keys`` (by key, as :meth:`of` takes them) changed, checked again."""
        return dataclasses.replace(self, **sectioned(keys, into=vars(self)))

    def keys(self) -> dict[str, Any]:
        """Every option of the config by its key, as :meth:`of` takes them (``TrainConfig.of(**config.keys())``
        is ``config``)."""
        keyed = {"model": self.model, "plan": self.plan} | self.pipeline.values()
        for section in SECTIONS:
            keyed |= getattr(self, section.name).keys()
        return keyed

    def __post_init__(self) -> None:
        if self.pipeline.hint == AUTO:  # measured once, here, in the launcher (see hintpipe.apps.split_costs)
            hint = choose_auto_hint(self.auto_run, self.pipeline.chunks)
            object.__setattr__(self, "pipeline", dataclasses.replace(self.pipeline, hint=hint))
        training = self.training
        Injection.parse(training.variability, training.faults, training.seed)  # refused here, not in every rank
        check_run_rules(self)
        self._check_model()
        self._check_data()

    def _check_model(self) -> None:
        """What the model, its data and its parallelism can honour (see [Note: the model's rules are the
        config's] in :mod:`hintpipe.apps.model_rules`), here rather than in every rank."""
        model, injection, data, parallelism = self.model, self.injection, self.data, self.parallelism
        check_tensor_parallel(parallelism.tp, model.spec, planned=self.plan is not None)
        check_model_options(
            model, data.source, parallelism.tp, data.forming, injection, self.training.steps, data.eval_source
        )
        check_sequence_lengths(model, data.source, data.seq_len_dist)
        hint = self.resolved_hint
        injection.check(self.world, hint.stages, self.pipeline.microbatches, parallelism.tp)
        if not model.spec.planned and self.plan is None:
            check_layer_count(model, layers_and_parameters(model)[0], hint.stages)
        budget = self.pipeline.activation_budget
        if budget is not None:
            budgets = budget if isinstance(budget, tuple) else (budget,)
            size, precision = self.training.microbatch_size, self.pipeline.precision
            check_activation_budgets(budgets, model, size, data.seq_len_dist.mean, precision)

    def _check_data(self) -> None:
        """Refuse data the model cannot take, here rather than in every rank: token ids beyond the model's
        vocabulary; files are prepared (once: see hintpipe.data.cache) and refused if bad."""
        data = self.data
        resolve = functools.partial(resolve_data, field=data.field, split=data.split, tokenizer=data.tokenizer)
        resolved = resolve(data.source)
        object.__setattr__(self, "prepared", resolved.folders)
        check_vocabulary(self.model, data.source, data.tokenizer, resolved.vocab)
        if data.eval_source is not None:
            evaluated = resolve(data.eval_source, option="eval_data")
            check_apart(data.eval_source, evaluated.folders, resolved.folders)
            object.__setattr__(self, "eval_prepared", evaluated.folders)
            check_vocabulary(self.model, data.eval_source, data.tokenizer, evaluated.vocab, "eval_data")
        size, dp, length = self.training.microbatch_size, self.parallelism.dp, self.model.max_seq_len - 1
        evaluations = Evaluations(self.metrics.eval_batches, self.pipeline.microbatches, size, dp, length)
        check_eval_batches(data, evaluations, evaluation_parts(data, self.prepared, self.eval_prepared))

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            return read_by_key(self, name)

    @property
    def auto_run(self) -> AutoRun:
        """What ``hint="auto"`` reads of the run."""
        from hintpipe.apps.split_costs import AutoRun

        data, training, checkpoint = self.data, self.training, self.checkpoint
        return AutoRun(
            self.model,
            self.parallelism.ranks,
            self.pipeline.microbatches,
            training.microbatch_size,
            data.seq_len_dist,
            training.seed,
            checkpoint.folder,
            checkpoint.resume,
        )

    @property
    def world(self) -> int:
        """Every process of the run: dp x ranks x tp."""
        parallelism = self.parallelism
        return parallelism.dp * parallelism.ranks * parallelism.tp

    @property
    def step_rows(self) -> int:
        """The rows (samples, documents) one step draws on each replica: ``microbatches`` x ``microbatch_size``."""
        return self.pipeline.microbatches * self.training.microbatch_size

    @property
    def injection(self) -> Injection:
        """The run's ``variability`` and ``faults``, parsed."""
        training = self.training
        return Injection.parse(training.variability, training.faults, training.seed)

    @property
    def formed(self) -> bool:
        """Whether the micro-batches are formed by cost (a summed loss over the step's tokens)."""
        return self.data.forming.by_cost

    @property
    def resolved_hint(self) -> Hint:
        """The run's hint for its ``ranks`` and ``microbatches``: generated by name (``chunks`` stages per rank),
        loaded from its file, or the given one checked; the one resolution of the run's hint, for its ranks, its
        reference model and its profile."""
        pipeline = self.pipeline
        return resolve_hint(pipeline.hint, self.parallelism.ranks, pipeline.microbatches, pipeline.chunks)

    @property
    def split_backward(self) -> bool:
        """Whether the run's hint splits weight gradients off (W tasks)."""
        return self.resolved_hint.split_backward


taking_keys_before(TrainConfig)


def check_run_rules(config: TrainConfig) -> None:
    """Refuse fields that contradict each other, in one line naming them: checkpoint settings without a folder, a
    fault that needs a save, a device the machine lacks, a warm-up longer than the run. Checked once, here, as a
    config is made: before, the command line checked these alone, so that ``TrainConfig(resume=True)`` without a
    folder trained afresh, saying nothing. Each message names the fields as the caller wrote them (keywords in
    Python, flags on the command line, which builds its config within :func:`~hintpipe.option.said_as_flags`).

    Raises:
        ValueError: the first rule broken.
    """
    _check_checkpointing(config)
    _check_device(config)
    _check_grads_comparable(config)
    training, metrics = config.training, config.metrics
    if config.data.eval_source is not None and not metrics.eval_every:
        every = said("eval_every")
        raise ValueError(f"{said('eval_data')} is evaluated every {every} steps, and {every} is 0 (none): give both")
    warmup_steps = config.lr_schedule.warmup_steps
    if warmup_steps > training.steps:  # see [Note: a resume keeps the schedule] in hintpipe.apps.lr_schedule
        warmup, steps = said("warmup_steps"), said("steps")
        raise ValueError(
            f"{warmup} {warmup_steps} is more than {steps} {training.steps}: the warm-up would never end; use "
            f"{warmup} {training.steps} or fewer"
        )


def _check_checkpointing(config: TrainConfig) -> None:
    checkpoint = config.checkpoint
    if checkpoint.folder is None:
        keys = checkpoint.keys()
        flags = ("resume", "replace_checkpoints", "checkpoint_every", "group_readable")
        given = [said(name) for name in flags if keys[name]]
        if given:
            needs = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{' and '.join(given)} {needs} {said('checkpoint_dir')}")
    elif checkpoint.resume and checkpoint.replace:
        raise ValueError(
            f"{said('resume')} continues the folder's run, {said('replace_checkpoints')} deletes it: give one"
        )
    injection = config.injection
    if (injection.save_failures or injection.save_stops) and not (checkpoint.folder and checkpoint.every):
        raise ValueError(
            f"{said('faults')} savefail and savestop need {said('checkpoint_dir')} and {said('checkpoint_every')}"
        )


def _check_grads_comparable(config: TrainConfig) -> None:
    """``check_grads`` compares the pipeline's first step with the unsplit model's on the same batch; dropout
    draws other masks in each, so the two differ by far more than any tolerance, and the check would call a
    correct pipeline wrong."""
    if not config.training.check_grads:
        return
    model = config.model
    dropout = f"{model.dropout:g}" if model.dropout else None
    if dropout is None and model.source is not None:
        found = model.spec.dropout_of(model.source)
        dropout = None if found is None else f"{found[0]} {found[1]:g}"
    if dropout is not None:
        raise ValueError(
            f"{said('check_grads')} compares a step with the unsplit model's, and {model.label}'s dropout "
            f"({dropout}) draws other masks in each: check the model with its dropout at 0, or leave "
            f"{said('check_grads')} out"
        )


def _check_device(config: TrainConfig) -> None:
    device = config.pipeline.device
    nccl = config.pipeline.transport is TransportChoice.NCCL
    if device == "cpu" and not nccl:
        return
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise ValueError(f"{said('device')} cuda was asked for, but torch.cuda.is_available() is False on this machine")
    if nccl and (device == "cpu" or not cuda):
        raise ValueError(
            f"{said('transport')} nccl moves tensors between GPUs; it needs {said('device')} cuda on a machine "
            "with CUDA"
        )


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run did (from rank 0, with every rank's figures gathered)."""

    config: TrainConfig
    reports: tuple[StepReport, ...]
    losses: tuple[float, ...]
    tokens: tuple[int, ...]
    max_grad_abs_diff: float | None = None
    max_grad_rel_diff: float | None = None
    resumed_from: int = 0
    nonfinite_steps: tuple[int, ...] = ()
    state: dict[str, torch.Tensor] | None = None
    stopped_by: str = ""  # the signal that stopped the run early ("SIGTERM"), if any
    checkpoint: str | None = None  # the last checkpoint this run saved
    resumed_checkpoint: str | None = None  # the checkpoint this run resumed from (None: it started afresh)
    notes: tuple[str, ...] = ()  # damaged checkpoints skipped when resuming, one line each
    coordination_ms: float | None = None  # mean cost of one tensor-parallel decision on rank 0 (the leader)
    decisions_per_step: float | None = None  # tensor-parallel decisions rank 0 announced per step
    #: The messages that carried them per step (fewer than decisions: see [Note: decisions in batches]).
    decision_messages_per_step: float | None = None
    #: Emulated tensor parallelism: rank 0's wait per step in its group's all-reduce that ends each task (the
    #: slowest member's own work, or a decision that reached a follower late), in milliseconds.
    tp_wait_ms: float | None = None
    # Per pipeline position, with data parallelism (see StepReport.dp_overlap): the mean time its gradient
    # reductions had to overlap the rest of the step, and the mean time the rank waited on them.
    dp_overlap_ms: tuple[float, ...] | None = None
    dp_exposed_ms: tuple[float, ...] | None = None
    #: Per pipeline position: the mean CPU time the runtime itself took per step (StepReport.runtime_cpu).
    runtime_cpu_ms: tuple[float, ...] | None = None
    transport: str = ""  # the transport the pipeline chose ("gloo", "nccl"; ``auto`` resolved)
    #: Per step run: the learning rate it stepped with, and the gradient norm before clipping (with clipping).
    learning_rates: tuple[float, ...] = ()
    grad_norms: tuple[float, ...] = ()
    #: ``eval_every``: (the number of steps run, the held-out loss then).
    eval_losses: tuple[tuple[int, float], ...] = ()
    #: Seconds from the loop's start to its end on rank 0: every step's whole time (the optimizer, evaluations
    #: and checkpoints too), where ``reports`` time the pipeline's steps alone.
    wall_time: float = 0.0

    @property
    def measured(self) -> tuple[StepReport, ...]:
        """Steps after the first (the first warms up and, for ``ready``, has no forecast yet)."""
        return self.reports[1:] if len(self.reports) > 1 else self.reports

    @property
    def step_time_median(self) -> float:
        """Seconds: the median over the measured steps."""
        return statistics.median(r.makespan for r in self.measured)

    @property
    def throughput(self) -> float:
        """Tokens (language models) or samples (mlp) per second over the measured steps."""
        steps = self.measured
        first = len(self.reports) - len(steps)
        return sum(self.tokens[first:]) / sum(r.makespan for r in steps)

    @property
    def efficiency(self) -> float:
        return statistics.median(r.efficiency for r in self.measured)

    @property
    def peak_live_bytes(self) -> list[int]:
        return [max(r.peak_live_bytes[i] for r in self.reports) for i in range(len(self.reports[0].ranks))]

    @property
    def device_peak_bytes(self) -> list[int] | None:
        """Per rank on GPUs, the allocator's peak over the run (``torch.cuda.max_memory_allocated``); None on CPU."""
        peaks = [max(r.device_peak_bytes[i] for r in self.reports) for i in range(len(self.reports[0].ranks))]
        return peaks if peaks and min(peaks) >= 0 else None

    @property
    def peak_live(self) -> list[float]:
        return [max(r.peak_live[i] for r in self.reports) for i in range(len(self.reports[0].ranks))]

    @property
    def peak_admitted(self) -> list[float]:
        """Per rank, the most its scoreboard admitted at once over the run, in admission's units (slots; input
        elements under ``admission="size"``; bytes under an ``activation_budget``)."""
        return [max(r.admitted_peak[i] for r in self.reports) for i in range(len(self.reports[0].ranks))]

    @property
    def held_of_budget(self) -> list[float]:
        """Per rank, the largest share of its admission budget any step held (what its scoreboard admitted over
        its budget, in admission's units: slots, input elements, bytes): at most 1.0, the budget being a hard
        limit."""
        ranks = range(len(self.reports[0].ranks))
        shares = [[r.admitted_peak[i] / r.budget[i] for r in self.reports if r.budget] for i in ranks]
        return [max(s, default=math.nan) for s in shares]

    def records(self, step: int = -1) -> tuple[Record, ...]:
        return self.reports[step].records
