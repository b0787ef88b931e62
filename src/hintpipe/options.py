"""Every option of the pipeline, defined once: name, type, default, range and help.

:class:`~hintpipe.runtime.pipeline.Pipeline`'s keywords,
:class:`~hintpipe.apps.training.TrainConfig`'s fields and the command line's
flags are the same options under the same names (``activation_budget`` is
``--activation-budget``); a test holds the three to this table. Values are
checked here and nowhere else, in one message style that names the option the
way the caller wrote it (``timeout`` in Python, ``--timeout`` on the command
line).

The options with a fixed set of values are :class:`~hintpipe.choice.Choice`
enums, converted from strings once, at the boundary; the command line's
choice lists are read from them.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hintpipe.apps.lr_schedule import LrSchedule
from hintpipe.device_choice import DeviceChoice
from hintpipe.forming.form import Forming
from hintpipe.option import MAX_TIMEOUT, MIN_TIMEOUT, Option
from hintpipe.runtime.modes import DataParallel, OnNonFinite, Precision, TransportChoice
from hintpipe.schedule.fit import AdmissionUnit
from hintpipe.schedule.hint import Hint, HintName
from hintpipe.schedule.microbatch_order import DEFAULT_ORDER, MicrobatchOrder
from hintpipe.scoreboard import Policy

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from hintpipe.runtime.loop.executor import EmulatedCosts
    from hintpipe.runtime.parallel.fsdp import FsdpOptions
    from hintpipe.runtime.parallel.tied import TiedParameter

_TRAIN = frozenset({"train"})
_RUN = frozenset({"train", "simulate"})
_ALL = frozenset({"train", "simulate", "plan"})
_PLAN = frozenset({"plan"})


def _option(kind: str, default: Any, help: str, **more: Any) -> Any:
    """A field of :class:`PipelineConfig`: the option (named once the class exists) in its metadata, its
    default as the field's (none for a required option)."""
    option = Option("", kind, default, help, **more)
    if option.required:
        return dataclasses.field(metadata={"option": option})
    return dataclasses.field(default=default, metadata={"option": option})


def _named(option: Option, name: str) -> Option:
    return dataclasses.replace(option, name=name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Every option a :class:`~hintpipe.runtime.pipeline.Pipeline` takes, checked once, here: the options table's
    pipeline rows are this class's fields (each field's metadata is its :class:`~hintpipe.option.Option`:
    kind, default, range, help, the commands that take it as a flag). Values are converted as they come in
    (``"ready"`` becomes :attr:`Policy.READY <hintpipe.scoreboard.Policy.READY>`); a value out of range, or
    two of the room options together, is refused naming the option.

    ``Pipeline(modules, loss_fn=..., config=PipelineConfig(microbatches=8, policy="ready"))`` or the same as
    keywords (``Pipeline(modules, loss_fn=..., microbatches=8, policy="ready")``) build the same pipeline;
    ``dataclasses.replace(config, policy="fixed")`` makes another.
    """

    microbatches: int = _option(
        "int", None, "micro-batches per step", minimum=1, required=True, metavar="M", commands=_ALL
    )
    hint: str | Hint = _option(
        "object",
        "1f1b",
        f"the schedule that ranks each rank's work: {', '.join(h.value for h in HintName)}, or a CSV file in "
        "torch.distributed.pipelining's compute-only format",
        metavar="H",
        commands=_ALL,
    )
    policy: str | Policy = _option(
        "choice",
        Policy.READY,
        "fixed: the hint's order; greedy: the best-ranked ready task; ready: deviates from the hint only where "
        "the hint's next task cannot be delayed by it",
        choices=Policy,
        commands=_RUN,
    )
    chunks: int | None = _option(
        "int",
        None,
        "stages per rank (interleaved-1f1b, gpipe, bf, bfw; zbv always 2); default: the hint's own (1)",
        minimum=1,
        optional=True,
        metavar="V",
        commands=_ALL,
    )
    memory_slack: float = _option(
        "float",
        0.0,
        "room for this many more in-flight micro-batches of activations than the hint's own peak",
        minimum=0.0,
        metavar="K",
        commands=_RUN,
    )
    activation_budget: float | tuple[float, ...] | None = _option(
        "size",
        None,
        "activation bytes a rank may hold, each micro-batch counted by its own size (instead of memory_slack)",
        minimum=0.0,
        optional=True,
        metavar="SIZE",
        commands=_RUN,
    )
    device_budget: float | None = _option(
        "float",
        None,
        "every rank may hold as many micro-batches as the hint's busiest rank, times 1 + this fraction "
        "(0: as many; 0.25: a quarter more): equal devices lend the later ranks' idle memory to running ahead",
        minimum=0.0,
        optional=True,
        metavar="FRACTION",
        commands=_RUN,
    )
    timeout: float = _option(
        "float",
        300.0,
        "seconds a rank may wait with nothing ready (or for a collective) before every rank ends with an error "
        "naming what was awaited",
        minimum=MIN_TIMEOUT,
        maximum=MAX_TIMEOUT,
        metavar="S",
        commands=_TRAIN,
    )
    emulate: EmulatedCosts | None = _option("object", None, "sleep these costs instead of computing", optional=True)
    on_nonfinite: str | OnNonFinite = _option(
        "choice",
        OnNonFinite.RAISE,
        "a NaN or infinite loss stops the run (raise) or skips that step's update (skip)",
        choices=OnNonFinite,
        commands=_TRAIN,
    )
    precision: str | Precision = _option(
        "choice",
        Precision.FP32,
        "fp32, or bf16: forwards and the loss under torch.autocast to bfloat16 (parameters, gradients and "
        "optimizer state stay float32)",
        choices=Precision,
        commands=_TRAIN,
    )
    history: int = _option("int", 100, "how many steps' reports to keep", minimum=1)
    timelines: bool = _option("bool", False, "gather every rank's task timeline to rank 0 each step")
    report_every: int = _option(
        "int",
        1,
        "gather every rank's summary to rank 0 every this many steps (0: never)",
        minimum=0,
    )
    tied: Sequence[TiedParameter] = _option("object", (), "parameters shared by stages on different ranks, kept equal")
    mesh: DeviceMesh | None = _option(
        "object",
        None,
        "a DeviceMesh with dimensions named from dp, pp and tp (or torchtitan's dp_replicate and dp_shard for dp)",
        optional=True,
    )
    fsdp: FsdpOptions | None = _option(
        "object",
        None,
        "FSDP2's options for each stage (mp_policy, offload_policy, reshard_after_forward), with data_parallel='fsdp'",
        optional=True,
    )
    data_parallel: str | DataParallel = _option(
        "choice",
        DataParallel.REPLICATE,
        "data-parallel replicas hold whole stages and all-reduce gradients (replicate), or FSDP2 shards them",
        choices=DataParallel,
        commands=_TRAIN,
    )
    microbatch_order: str | MicrobatchOrder = _option(
        "choice",
        MicrobatchOrder.parse(DEFAULT_ORDER),
        "the order each step runs its micro-batches in, by their known sizes; sorted orders are faster but "
        "hold more activation memory (benchmarks/readiness-at-scale)",
        choices=MicrobatchOrder,
        commands=_RUN,
    )
    device: str | DeviceChoice | torch.device = _option(
        "choice",
        DeviceChoice.CPU,
        "where each rank computes: cpu, cuda (its GPU: LOCAL_RANK modulo the GPUs) or auto (cuda where available)",
        choices=DeviceChoice,
        commands=_TRAIN,
    )
    transport: str | TransportChoice = _option(
        "choice",
        TransportChoice.AUTO,
        "how tensors travel between ranks: gloo (through host memory; ranks may share a GPU), nccl (GPU to GPU; "
        "a GPU per rank) or auto (nccl where every rank has its own GPU)",
        choices=TransportChoice,
        commands=_TRAIN,
    )

    def __post_init__(self) -> None:
        given = PipelineConfig.values(self)
        if not isinstance(given["device"], str):  # a torch.device, as it is
            given.pop("device")
        budget = given.pop("activation_budget")
        per_rank = isinstance(budget, (tuple, list))  # one per pipeline rank (the rank takes its own)
        # The room options are checked together: budgets per rank count as one budget given.
        given["activation_budget"] = (budget[0] if budget else None) if per_rank else budget
        checked = check_options(given)
        if per_rank:
            checked["activation_budget"] = tuple(OPTIONS["activation_budget"].check(b) for b in budget) or None
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def given(self) -> dict[str, Any]:
        """The pipeline's options that differ from their defaults (a constructor that fills in what the caller
        left, as :meth:`Pipeline.from_plan <hintpipe.runtime.pipeline.Pipeline.from_plan>` does, sees these as
        given)."""
        out = {}
        for f in dataclasses.fields(PipelineConfig):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or (value is not f.default and value != f.default):
                out[f.name] = value
        return out

    def values(self) -> dict[str, Any]:
        """The pipeline's options, name -> value (the values themselves, not copies: a mesh or tied parameters
        stay what they are); a config that adds options of its own (the run's) keeps them out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(PipelineConfig)}


#: Every option, by name. The order is the order of ``--help``: the pipeline's run's count of ranks, the
#: pipeline's own (:class:`PipelineConfig`), then the simulator's, the run's and the planner's.
OPTIONS: Mapping[str, Option] = {
    o.name: o
    for o in (
        Option(
            "ranks",
            "int",
            None,
            "pipeline ranks (one process each); each holds --chunks stages",
            minimum=1,
            required=True,
            metavar="P",
            commands=_ALL,
            pipeline=False,
        ),
        *(_named(f.metadata["option"], f.name) for f in dataclasses.fields(PipelineConfig)),
        Option(
            "admission",
            "choice",
            AdmissionUnit.SLOTS,
            "what admission counts a micro-batch as: one slot (slots), or its known size (size), so that a sorted "
            "order runs within the memory the given order needs (the hint then runs fitted to that budget)",
            choices=AdmissionUnit,
            commands=frozenset({"simulate"}),
            pipeline=False,
        ),
        # -- the run around the pipeline: ``hintpipe train`` and TrainConfig ------------------------------
        Option("steps", "int", 4, "training steps", minimum=1, metavar="N", commands=_TRAIN, pipeline=False),
        Option(
            "microbatch_size",
            "int",
            4,
            "samples per micro-batch",
            minimum=1,
            metavar="B",
            commands=frozenset({"train", "plan"}),
            pipeline=False,
        ),
        Option(
            "data",
            "str",
            "synthetic",
            "synthetic: counting text with --seq-len-dist lengths; stdlib: the Python standard library's source "
            "files as byte-level text (real, heavy-tailed lengths; vocabulary 256); or a PATH: a text file "
            "(documents separated by blank lines), a .jsonl file (one JSON object per line, the document under "
            "--data-field) or a folder of .txt and .jsonl files, tokenized by --tokenizer (every 20th document "
            "held out for --eval-every)",
            metavar="synthetic|stdlib|PATH",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "data_field",
            "str",
            "text",
            "the field of each JSONL line that holds its document (--data FILE.jsonl or a folder)",
            metavar="NAME",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "tokenizer",
            "str",
            "bytes",
            "how --data PATH becomes tokens: bytes (UTF-8 bytes, vocabulary 256) or a folder a Hugging Face "
            "tokenizer was saved to (save_pretrained; local files only; needs the hf extra); the model's vocabulary "
            "is the tokenizer's",
            metavar="bytes|DIR",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "forming",
            "choice",
            Forming.CROP,
            "how --data stdlib or PATH makes micro-batches: crop (each micro-batch's documents cropped to its "
            "shortest), padded (the step's whole documents formed by predicted cost into even micro-batches, padded "
            "rows) or packed (the same, several documents per row with document masks; gpt-mini)",
            choices=Forming,
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "dp",
            "int",
            1,
            "data-parallel replicas of the pipeline",
            minimum=1,
            metavar="D",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "tp",
            "int",
            1,
            "tensor-parallel ranks per stage (gpt-mini): dp x ranks x tp processes",
            minimum=1,
            metavar="T",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "variability",
            "specs",
            (),
            "iid:SIGMA, mb:SIGMA, mm:SIGMA_ENC:SIGMA_DEC[:FRACTION[:RHO]], straggler:FACTOR[:STAGE[:FIRST:LAST]], "
            "comm:LATENCY[:JITTER], tp:MEMBERS:SIGMA[:DECISION] (the simulator's DECISION only; times with a unit in "
            "train: 2ms); one grammar for both commands; repeatable",
            metavar="SPEC",
            commands=_RUN,
            pipeline=False,
        ),
        Option(
            "faults",
            "specs",
            (),
            "crash:RANK:STEP, hang:RANK:STEP, nan:STEP, savefail:RANK:STEP: faults to inject, for tests of failure "
            "handling; repeatable",
            metavar="SPEC",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "seed",
            "int",
            0,
            "model, data, sampling and injection seed",
            minimum=0,
            maximum=2**32 - 1,
            metavar="S",
            commands=_ALL,
            pipeline=False,
        ),
        Option("lr", "float", 1e-3, "AdamW's learning rate", minimum=0.0, commands=_TRAIN, pipeline=False),
        Option(
            "lr_schedule",
            "choice",
            LrSchedule.CONSTANT,
            "the learning rate over the run: constant, or --warmup-steps of linear warm-up, then a cosine or "
            "linear decay to 0 at the last step (kept in the checkpoints)",
            choices=LrSchedule,
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "warmup_steps",
            "int",
            0,
            "steps of linear warm-up before the schedule's decay",
            minimum=0,
            metavar="N",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "clip_grad_norm",
            "float",
            None,
            "clip the whole model's gradient norm to this before each optimizer step (torch's clip_grad_norm_ "
            "over every rank)",
            minimum=0.0,
            optional=True,
            metavar="MAX_NORM",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "tensorboard",
            "object",
            None,
            "write TensorBoard scalars to this folder every step: loss, learning rate, gradient norm, tokens/s, "
            "step time, bubble, peak memory, held-out loss (needs the tensorboard extra)",
            optional=True,
            metavar="DIR",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "eval_every",
            "int",
            0,
            "every this many steps (and after the last), the loss on a held-out batch, forwards only in eval "
            "mode (0: none)",
            minimum=0,
            metavar="N",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "log_every",
            "int",
            0,
            "every this many steps and after the last, one line on stderr: the step, its loss, its time, tokens/s "
            "and the time left (0: every tenth of the run when stderr is not a terminal and --json is not given, "
            "else none; the table and --json come at the end)",
            minimum=0,
            metavar="N",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "checkpoint_every",
            "int",
            0,
            "save a checkpoint after every this many steps (0: only after the last step and on a stop; needs "
            "--checkpoint-dir)",
            minimum=0,
            metavar="K",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "replace_checkpoints",
            "bool",
            False,
            "start a new run in a --checkpoint-dir that holds another run's checkpoints, deleting them (without it, "
            "such a folder is refused: resume it with --resume, or use another folder)",
            commands=_TRAIN,
            pipeline=False,
        ),
        Option(
            "checkpoint_keep",
            "int",
            2,
            "verified checkpoints kept",
            minimum=1,
            metavar="K",
            commands=_TRAIN,
            pipeline=False,
        ),
        # -- the planner: ``hintpipe plan`` and ``hintpipe.plan`` ---------------------------------------------
        Option(
            "stage_memory",
            "size",
            None,
            "total memory of each stage's device (parameters, gradients, optimizer state and activations), "
            "e.g. 512MiB or 2GiB; or one per stage, comma-separated",
            optional=True,
            metavar="SIZE",
            commands=_PLAN,
            pipeline=False,
        ),
        Option(
            "optimizer_factor",
            "float",
            2.0,
            "optimizer state bytes per parameter byte (Adam 2, SGD 0)",
            minimum=0.0,
            commands=_PLAN,
            pipeline=False,
        ),
        Option(
            "host_bandwidth",
            "float",
            None,
            "bytes per second to host memory for offloading activations (default: 0, no offload, on a CPU)",
            minimum=0.0,
            optional=True,
            metavar="BYTES_PER_S",
            commands=_PLAN,
            pipeline=False,
        ),
        Option("repeats", "int", 5, "profiling repeats per node", minimum=1, commands=_PLAN, pipeline=False),
    )
}

#: The options that say how much a rank may hold in flight; at most one of them is given.
ROOM = ("memory_slack", "activation_budget", "device_budget")


def check_options(values: Mapping[str, Any], *, cli: bool = False) -> dict[str, Any]:
    """``values`` (option name -> value) each checked and converted, and their combinations checked.

    Raises:
        ValueError: for the first value out of its range, or for two of :data:`ROOM` given together.
    """
    unknown = sorted(set(values) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown options {unknown}; known: {', '.join(OPTIONS)}")
    checked = {name: OPTIONS[name].check(value, cli=cli) for name, value in values.items()}
    given = [
        name for name in ROOM if checked.get(name) is not None and not (name == "memory_slack" and not checked[name])
    ]
    if len(given) > 1:
        labels = [OPTIONS[name].label(cli) for name in given]
        raise ValueError(f"give one of {', '.join(OPTIONS[n].label(cli) for n in ROOM)}, got {' and '.join(labels)}")
    return checked
