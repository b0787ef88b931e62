"""The options that are not the pipeline's: the run's (``train``), the simulator's and the planner's, with the
pipeline run's count of ranks; :data:`hintpipe.options.OPTIONS` puts them beside the pipeline's own.

This module is torch-free.
"""

from __future__ import annotations

from hintpipe.forming.form import Forming
from hintpipe.modes import LrSchedule, OptimizerName
from hintpipe.option import Option

_TRAIN = frozenset({"train"})
_RUN = frozenset({"train", "simulate"})
_ALL = frozenset({"train", "simulate", "plan"})
_PLAN = frozenset({"plan"})
_TRAIN_PLAN = frozenset({"train", "plan"})

#: The pipeline's length in ranks (``Hint.ranks``): the run's, the simulator's and the planner's.
RANKS = Option(
    "ranks",
    "int",
    None,
    "pipeline ranks (one process each); each holds --chunks stages (train under torchrun: by default torchrun's "
    "ranks over --dp x --tp)",
    minimum=1,
    required=True,
    metavar="P",
    commands=_ALL,
    pipeline=False,
)

#: In ``--help``'s order: the simulator's, the run's and the planner's.
RUN_OPTIONS: tuple[Option, ...] = (
    # -- the run around the pipeline: ``hintpipe train`` and TrainConfig ------------------------------
    Option(
        "steps", "int", 4, "training steps", minimum=1, maximum=2**31 - 1, metavar="N", commands=_TRAIN, pipeline=False
    ),
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
        "sources",
        "synthetic",
        "synthetic: counting text with --seq-len-dist lengths; stdlib: the Python standard library's source "
        "files as byte-level text (real, heavy-tailed lengths; vocabulary 256); or a PATH: a text file "
        "(documents split by --data-split), a .jsonl or .json file (JSON objects, one per line or in one "
        "array, the document under --data-field), either compressed (.gz, .bz2, .xz), a folder of them, a "
        "Hugging Face dataset (a save_to_disk folder, or hf:BUILDER:FILES such as hf:parquet:data/*.parquet; "
        "a .parquet, .csv or .tsv file is one), or a folder `hintpipe data prepare` wrote; tokenized once by "
        "--tokenizer (raw files into a cache folder on first use), every 20th document held out for "
        "--eval-every. Repeatable with weights, PATH:WEIGHT (--data a.jsonl:0.7 --data code/:0.3): each "
        "document drawn from a source in the weights' proportion",
        metavar="synthetic|stdlib|PATH[:WEIGHT]",
        commands=_TRAIN_PLAN,
        pipeline=False,
    ),
    Option(
        "data_field",
        "str",
        "text",
        "the field of each JSONL line (or the column of a dataset) that holds its document",
        metavar="NAME",
        commands=_TRAIN_PLAN,
        pipeline=False,
    ),
    Option(
        "data_split",
        "str",
        "blank",
        "how a plain-text file becomes documents: blank (runs of lines between blank lines), file (each file "
        "one document: a folder of source code, of articles) or a separator between documents, as written "
        "(e.g. '<|endoftext|>'; \\n is a line break)",
        metavar="blank|file|SEP",
        commands=_TRAIN_PLAN,
        pipeline=False,
    ),
    Option(
        "tokenizer",
        "str",
        "bytes",
        "how --data PATH becomes tokens: bytes (UTF-8 bytes, vocabulary 256) or a folder a Hugging Face "
        "tokenizer was saved to (save_pretrained; local files only; needs the hf extra); the model's vocabulary "
        "is the tokenizer's; a prepared folder's own unless given",
        metavar="bytes|DIR",
        commands=_TRAIN_PLAN,
        pipeline=False,
    ),
    Option(
        "forming",
        "choice",
        Forming.CROP,
        "how --data stdlib or PATH makes micro-batches: crop (each micro-batch's documents cropped to its "
        "shortest), padded (the step's whole documents formed by predicted cost into even micro-batches, padded "
        "rows), packed (the same, several documents per row with document masks; gpt-mini) or concat (the "
        "drawn documents end to end, cut into full rows of the model's context; any model)",
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
    Option(
        "optimizer",
        "choice",
        OptimizerName.ADAMW,
        "adamw (torch.optim.AdamW) or sgd (torch.optim.SGD), over each rank's own stages",
        choices=OptimizerName,
        commands=_TRAIN,
        pipeline=False,
    ),
    Option("lr", "float", 1e-3, "the optimizer's learning rate", minimum=0.0, commands=_TRAIN, pipeline=False),
    Option(
        "weight_decay",
        "float",
        None,
        "the optimizer's weight decay (decoupled in AdamW); default: torch's own (AdamW 0.01, SGD 0)",
        minimum=0.0,
        optional=True,
        commands=_TRAIN,
        pipeline=False,
    ),
    Option(
        "betas",
        "str",
        "0.9,0.999",
        "AdamW's betas, B1,B2",
        metavar="B1,B2",
        commands=_TRAIN,
        pipeline=False,
    ),
    Option(
        "momentum",
        "float",
        0.0,
        "SGD's momentum",
        minimum=0.0,
        maximum=1.0,
        commands=_TRAIN,
        pipeline=False,
    ),
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
        "eval_batches",
        "int",
        0,
        "with --eval-every and --data PATH (or --eval-data): each evaluation's held-out loss over these many "
        "batches of held-out documents, taken in a fixed order without replacement (the same documents at every "
        "evaluation; hintpipe.held_out_batches gives them); 0: one batch drawn with replacement",
        minimum=0,
        metavar="K",
        commands=_TRAIN,
        pipeline=False,
    ),
    Option(
        "eval_data",
        "sources",
        None,
        "with --eval-every: evaluate on these files or folders (as --data takes them, with its --tokenizer, "
        "--data-field and --data-split) instead of --data's held-out documents; --data then trains on all of "
        "its documents. Repeatable with weights, PATH:WEIGHT",
        optional=True,
        metavar="PATH[:WEIGHT]",
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
        "verified checkpoints kept (one more only while hintpipe export reads an old one)",
        minimum=1,
        metavar="K",
        commands=_TRAIN,
        pipeline=False,
    ),
    Option(
        "group_readable",
        "bool",
        False,
        "make the run's checkpoint folder readable by its group (files 0640, folders 0750); without it, by its "
        "owner alone (0600, 0700)",
        commands=_TRAIN,
        pipeline=False,
    ),
    # -- the planner: ``hintpipe plan`` and ``hintpipe.plan`` ---------------------------------------------
    Option(
        "stage_memory",
        "size",
        None,
        "total memory of each stage's device (parameters, gradients, optimizer state and activations), "
        "in bytes or a size such as 512MiB or 2GiB; or one per stage, comma-separated",
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


def run_option(name: str) -> Option:
    """The run's option ``name``.

    Raises:
        KeyError: ``name`` is no run option (``next`` alone raised StopIteration, which a generator calling this
            would turn into a RuntimeError).
    """
    found = next((option for option in RUN_OPTIONS if option.name == name), None)
    if found is None:
        raise KeyError(name)
    return found
