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

from hintpipe.apps.evaluation_corpus import check_apart, check_eval_batches, evaluation_parts
from hintpipe.apps.lr_schedule import LrSchedule
from hintpipe.apps.model_rules import (
    check_activation_budgets,
    check_layer_count,
    check_model_options,
    check_sequence_lengths,
    check_tensor_parallel,
    check_vocabulary,
    layers_and_parameters,
)
from hintpipe.apps.models import ModelConfig, SeqLenDist
from hintpipe.apps.optimizer import OptimizerName, parse_betas
from hintpipe.data.run_data import resolve_data
from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.form import Forming
from hintpipe.modes import TransportChoice
from hintpipe.observe.trace import Record
from hintpipe.option import ChoiceField, said
from hintpipe.options import OPTIONS, PipelineConfig, check_options, taking_names_before
from hintpipe.planner.plan import Plan
from hintpipe.run_options import run_option
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.pipeline import StepReport
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.resolve import resolve_hint

if TYPE_CHECKING:
    from hintpipe.apps.split_costs import AutoRun
    from hintpipe.dispatch.fit import AdmissionUnit
    from hintpipe.dispatch.policy import Policy
    from hintpipe.modes import DataParallel, OnNonFinite, Precision
    from hintpipe.schedule.microbatch_order import MicrobatchOrder


def _inherited() -> Any:
    """A type checker's stand-in for a field :class:`~hintpipe.options.PipelineConfig` declares.

    [Note: inherited choices]
    mypy types the fields a frozen dataclass inherits as their ``__init__`` parameters' types: a
    :class:`~hintpipe.option.ChoiceField` inherited by :class:`TrainConfig` would read as ``str`` (its
    ``str | Policy``, a ``StrEnum`` being a ``str``), not as the enum it is. So the class declares them
    again for the type checker alone (nothing runs: the fields are PipelineConfig's); a test holds the
    list to PipelineConfig's choice fields.
    """
    return None


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

    folder = getattr(config, "checkpoint_dir", None)
    found = recorded_hint(Path(folder)) if getattr(config, "resume", False) and folder else None
    if found is None:
        return None
    hint, step = found
    print(f"hint auto: {hint} (the run's, as {step} records)", file=sys.stderr)
    return hint


@taking_names_before
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(PipelineConfig):
    """Everything a rank needs to train (picklable: it crosses process boundaries): the pipeline's options
    (:class:`~hintpipe.options.PipelineConfig`, whose fields it has) and the run's own.

    The fields that are options (:data:`hintpipe.options.OPTIONS`) have the option's name, default and range,
    and are checked when the config is made; ``activation_budget`` may give one budget per pipeline rank.
    """

    model: ModelConfig
    ranks: int  # pipeline ranks (one pipeline's length)
    microbatch_size: int = 4
    steps: int = 4
    seq_len_dist: SeqLenDist = dataclasses.field(default_factory=lambda: SeqLenDist(64))
    variability: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()
    seed: int = 0
    optimizer: ChoiceField[OptimizerName] = ChoiceField(run_option("optimizer"))  # (see hintpipe.apps.optimizer)
    lr: float = 1e-3
    weight_decay: float | None = None  # None: torch's default for the optimizer (AdamW 0.01, SGD 0)
    betas: str = "0.9,0.999"  # AdamW's
    momentum: float = 0.0  # SGD's
    lr_schedule: ChoiceField[LrSchedule] = ChoiceField(run_option("lr_schedule"))  # (see hintpipe.apps.lr_schedule)
    warmup_steps: int = 0
    clip_grad_norm: float | None = None  # the whole model's gradient norm clipped to this before each update
    eval_every: int = 0  # the held-out loss every this many steps and after the last (0: none)
    eval_batches: int = 0  # each held-out loss over this many fixed batches of held-out documents (0: one drawn)
    #: A corpus of its own to evaluate on, as ``data`` takes paths (its tokenizer, field and split): evaluations
    #: draw from all of its documents, and ``data`` trains on all of its own (see [Note: an evaluation corpus of
    #: its own] in hintpipe.apps.batches).
    eval_data: str | tuple[str, ...] | None = None
    tensorboard: str | None = None  # a folder for TensorBoard scalars, written by rank 0 every step
    log_every: int = 0  # rank 0 prints step, loss, step time, throughput and ETA to stderr every this many steps
    check_grads: bool = False
    progress: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_keep: int = 2  # verified checkpoints kept (one more only while an export reads an old one)
    replace_checkpoints: bool = False  # a fresh run in a folder of another run's checkpoints deletes them
    group_readable: bool = False  # the checkpoint folder's files 0640 and folders 0750 (else 0600, 0700)
    resume: bool = False
    return_state: bool = False
    plan: Plan | None = None  # train this plan's stages (a plan file, or a Hugging Face model planned by the caller)
    #: "synthetic", "stdlib" (the standard library's source, byte tokens), or paths (PATH[:WEIGHT]: one, or a
    #: tuple of several with weights; see hintpipe.data.sources)
    data: str | tuple[str, ...] = "synthetic"
    data_field: str = "text"  # a JSONL line's (or a dataset's column's) document
    data_split: str = "blank"  # plain text's documents: "blank", "file" or a separator (see hintpipe.data.split)
    tokenizer: str = "bytes"  # a file corpus's tokens: UTF-8 bytes, or a Hugging Face tokenizer's folder
    #: documents as they are (crop), or micro-batches formed by cost (padded, packed; see hintpipe.forming)
    forming: ChoiceField[Forming] = ChoiceField(run_option("forming"))
    sequence_cost: SequenceCost | None = None  # the model's cost per row, for forming (fitted once, by the caller)
    shared: bool = False  # under torchrun: rank 0's plan, sequence cost and emulated costs go to every rank
    dp: int = 1  # data-parallel replicas of the pipeline
    tp: int = 1  # tensor-parallel ranks per stage: the world is dp x ranks x tp
    #: The prepared folder of each ``data`` entry, resolved when the config is made (raw files prepared then, in
    #: this process, before any rank starts): what the ranks read (see hintpipe.data.run_data).
    prepared: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False, compare=False)
    #: The prepared folder of each ``eval_data`` entry, resolved as ``prepared`` is.
    eval_prepared: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False, compare=False)

    if TYPE_CHECKING:  # the pipeline's choices, as PipelineConfig types them: see [Note: inherited choices]
        policy: ChoiceField[Policy] = _inherited()
        admission: ChoiceField[AdmissionUnit] = _inherited()
        on_nonfinite: ChoiceField[OnNonFinite] = _inherited()
        precision: ChoiceField[Precision] = _inherited()
        data_parallel: ChoiceField[DataParallel] = _inherited()
        microbatch_order: ChoiceField[MicrobatchOrder] = _inherited()
        transport: ChoiceField[TransportChoice] = _inherited()

    def __post_init__(self) -> None:
        if self.hint == AUTO:  # measured once, here, in the launcher (see hintpipe.apps.split_costs)
            object.__setattr__(self, "hint", choose_auto_hint(self, self.chunks))
        super().__post_init__()  # the pipeline's options
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in OPTIONS}
        check_options({name: value for name, value in own.items() if name not in PipelineConfig.values(self)})
        # ``data`` given as a list or a tuple of one is kept as its string (the same run).
        object.__setattr__(self, "data", OPTIONS["data"].check(self.data))
        object.__setattr__(self, "eval_data", OPTIONS["eval_data"].check(self.eval_data))
        Injection.parse(self.variability, self.faults, self.seed)  # refuses bad specs here, not in every rank
        parse_betas(self.betas, "betas")
        check_run_rules(self)
        self._check_model()
        self._check_data()

    def _check_model(self) -> None:
        """What the model, its data and its parallelism can honour (see [Note: the model's rules are the
        config's] in :mod:`hintpipe.apps.model_rules`), here rather than in every rank."""
        model, injection = self.model, self.injection
        check_tensor_parallel(self.tp, model.spec, planned=self.plan is not None)
        check_model_options(model, self.data, self.tp, self.forming, injection, self.steps, self.eval_data)
        check_sequence_lengths(model, self.data, self.seq_len_dist)
        hint = self.resolved_hint
        injection.check(self.world, hint.stages, self.microbatches, self.tp)
        if not model.spec.planned and self.plan is None:
            check_layer_count(model, layers_and_parameters(model)[0], hint.stages)
        budget = self.activation_budget
        if budget is not None:
            budgets = budget if isinstance(budget, tuple) else (budget,)
            check_activation_budgets(budgets, model, self.microbatch_size, self.seq_len_dist.mean, self.precision)

    def _check_data(self) -> None:
        """Refuse data the model cannot take, here rather than in every rank: token ids beyond the model's
        vocabulary; files are prepared (once: see hintpipe.data.cache) and refused if bad."""
        field, split, tokenizer = self.data_field, self.data_split, self.tokenizer
        resolve = functools.partial(resolve_data, field=field, split=split, tokenizer=tokenizer)
        resolved = resolve(self.data)
        object.__setattr__(self, "prepared", resolved.folders)
        check_vocabulary(self.model, self.data, self.tokenizer, resolved.vocab)
        if self.eval_data is not None:
            evaluated = resolve(self.eval_data, option="eval_data")
            check_apart(self.eval_data, evaluated.folders, resolved.folders)
            object.__setattr__(self, "eval_prepared", evaluated.folders)
            check_vocabulary(self.model, self.eval_data, self.tokenizer, evaluated.vocab, "eval_data")
        check_eval_batches(self, evaluation_parts(self))

    @property
    def world(self) -> int:
        """Every process of the run: dp x ranks x tp."""
        return self.dp * self.ranks * self.tp

    @property
    def injection(self) -> Injection:
        """The run's ``variability`` and ``faults``, parsed."""
        return Injection.parse(self.variability, self.faults, self.seed)

    @property
    def formed(self) -> bool:
        """Whether the micro-batches are formed by cost (a summed loss over the step's tokens)."""
        return self.forming.by_cost

    @property
    def resolved_hint(self) -> Hint:
        """The run's hint for its ``ranks`` and ``microbatches``: generated by name (``chunks`` stages per rank),
        loaded from its file, or the given one checked; the one resolution of the run's hint, for its ranks, its
        reference model and its profile."""
        return resolve_hint(self.hint, self.ranks, self.microbatches, self.chunks)

    @property
    def split_backward(self) -> bool:
        """Whether the run's hint splits weight gradients off (W tasks)."""
        return self.resolved_hint.split_backward


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
    if config.eval_data is not None and not config.eval_every:
        every = said("eval_every")
        raise ValueError(f"{said('eval_data')} is evaluated every {every} steps, and {every} is 0 (none): give both")
    if config.warmup_steps > config.steps:  # see [Note: a resume keeps the schedule] in hintpipe.apps.lr_schedule
        warmup, steps = said("warmup_steps"), said("steps")
        raise ValueError(
            f"{warmup} {config.warmup_steps} is more than {steps} {config.steps}: the warm-up would never end; use "
            f"{warmup} {config.steps} or fewer"
        )


def _check_checkpointing(config: TrainConfig) -> None:
    if config.checkpoint_dir is None:
        flags = ("resume", "replace_checkpoints", "checkpoint_every", "group_readable")
        given = [said(name) for name in flags if getattr(config, name)]
        if given:
            needs = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{' and '.join(given)} {needs} {said('checkpoint_dir')}")
    elif config.resume and config.replace_checkpoints:
        raise ValueError(
            f"{said('resume')} continues the folder's run, {said('replace_checkpoints')} deletes it: give one"
        )
    injection = config.injection
    if (injection.save_failures or injection.save_stops) and not (config.checkpoint_dir and config.checkpoint_every):
        raise ValueError(
            f"{said('faults')} savefail and savestop need {said('checkpoint_dir')} and {said('checkpoint_every')}"
        )


def _check_grads_comparable(config: TrainConfig) -> None:
    """``check_grads`` compares the pipeline's first step with the unsplit model's on the same batch; dropout
    draws other masks in each, so the two differ by far more than any tolerance, and the check would call a
    correct pipeline wrong."""
    if not config.check_grads:
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
    nccl = config.transport is TransportChoice.NCCL
    if config.device == "cpu" and not nccl:
        return
    cuda = torch.cuda.is_available()
    if config.device == "cuda" and not cuda:
        raise ValueError(f"{said('device')} cuda was asked for, but torch.cuda.is_available() is False on this machine")
    if nccl and (config.device == "cpu" or not cuda):
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
