"""``hintpipe train``: train a built-in model with the readiness-driven runtime."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.model_rules import (
    layers_and_parameters,
)
from hintpipe.cli.common import (
    add_option,
    add_room_arguments,
    build_hint,
    bytes_progress,
    check_flags,
    check_folder_writable,
    print_json,
    room,
    stdout,
)
from hintpipe.cli.config_file import add_config_arguments
from hintpipe.cli.model_flags import add_model_flags, model_config
from hintpipe.cli.train_checks import (
    check_checkpoint_folder,
    check_memory,
    check_model_memory,
    check_output_files,
)
from hintpipe.cli.train_model import (
    FROM_PLAN,
    answered_by_plan,
    bad_fields,
    plan_model,
    plan_once,
    planned_elsewhere,
    planned_model,
    resolve_tokenizer,
)
from hintpipe.cli.train_model import under_torchrun as under_torchrun_here
from hintpipe.cli.train_report import result_json as result_json
from hintpipe.cli.train_report import (
    resumed_line,
    say_what_crop_trains,
    say_where_it_evaluates,
    step_table,
    summary_line,
)
from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.form import Forming
from hintpipe.modes import Precision
from hintpipe.observe.timeline import plot_timelines
from hintpipe.observe.trace import write_chrome_trace
from hintpipe.option import said_as_flags
from hintpipe.options import OPTIONS, ROOM

if TYPE_CHECKING:  # the training modules need torch; they are imported where a command runs
    from hintpipe.apps.training import TrainConfig, TrainResult
    from hintpipe.data.run_data import RunData
    from hintpipe.planner.plan import Plan

HELP = "train a model (built-in, a Hugging Face folder, or your own) across processes with pipeline parallelism"


#: The options of the model's data, whose flags come with the model's (options of the table: a config file
#: gives them too).
DATA_OPTIONS = ("data", "data_field", "data_split", "tokenizer")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and its data (shared with ``demo``)."""
    add_model_flags(parser, from_plan=True)
    add_option(parser, "microbatch_size")
    parser.add_argument(
        "--seq-len-dist",
        default="fixed:64",
        metavar="SPEC",
        help="counting text's sequence lengths per micro-batch (--data synthetic): fixed:T or lognormal:MEAN:SIGMA "
        "(default fixed:64)",
    )
    for name in DATA_OPTIONS:
        # The tokenizer: a model folder's own where it has one, unless given (None until resolved).
        add_option(parser, name, **({"default": None} if name == "tokenizer" else {}))


#: The pipeline's and the run's options that ``train`` takes as flags (the table says which), in the table's
#: order; the room options come as a group of their own, the micro-batch size with the model's flags.
TRAIN_OPTIONS = tuple(
    name
    for name, option in OPTIONS.items()
    if "train" in option.commands and name not in (*ROOM, "microbatch_size", *DATA_OPTIONS)
)


def register(commands: Any) -> None:
    parser = commands.add_parser("train", help=HELP, description=HELP)
    add_config_arguments(parser)
    for name in TRAIN_OPTIONS:
        if name in FROM_PLAN:  # a plan file may say them: None until resolved (see _answered_by_plan)
            default, option = FROM_PLAN[name], OPTIONS[name]
            if option.required:
                said = " (required, unless --plan FILE says it)"
            elif default is None:  # the option's own default (chunks: the hint's own)
                said = "; with --plan, the plan file's"
            else:
                said = f" (default {default}; with --plan, the plan file's)"
            help_text = option.help + said
            add_option(parser, name, default=None, required=False, help=help_text)
        else:
            add_option(parser, name)
    add_room_arguments(parser, activation_unit="bytes, or a size such as 64MiB")
    add_model_arguments(parser)
    parser.add_argument("--emulate", action="store_true", help="sleep each task's profiled cost instead of computing")
    parser.add_argument(
        "--plan", metavar="FILE", help="train the stages of a plan saved by `hintpipe plan --save` (and its weights)"
    )
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="save checkpoints here (torch.distributed.checkpoint)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir that verifies (damaged ones are skipped)",
    )
    parser.add_argument("--check-grads", action="store_true", help="compare step 1's gradients with an unsplit copy")
    parser.add_argument("--trace", metavar="FILE", help="Perfetto/Chrome trace of the last step")
    parser.add_argument("--timeline", metavar="FILE.png", help="Gantt chart of the last step")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def config_from(args: argparse.Namespace, policy: str) -> TrainConfig:
    """Build the run's config from the arguments. The command line checks what is its own (the flags' values, the
    output files, this machine's memory) and prepares the data (with a progress bar); every rule of the run is
    the config's, checked once, as it is made (naming flags: :func:`~hintpipe.option.said_as_flags`), before
    the model is planned and its sequence cost measured, which take seconds to minutes."""
    from hintpipe.apps.run_sections import place_of
    from hintpipe.apps.train_config import AUTO, choose_auto_hint
    from hintpipe.apps.training import TrainConfig, profile_costs

    plan_file = answered_by_plan(args)
    try:
        from_plan = None if plan_file is None else plan_model(args, args.plan, plan_file)
    except (KeyError, TypeError, AttributeError) as exc:
        raise bad_fields(args.plan, exc) from None
    resolve_tokenizer(args, from_plan)
    flagged = [name for name in (*TRAIN_OPTIONS, "microbatch_size", *DATA_OPTIONS) if hasattr(args, name)]
    check_flags(args, flagged)
    check_output_files(args)
    # A built-in model's vocabulary is the data's: files are prepared (or their prepared folder checked, and
    # refused if bad) here, once, before any rank starts; the config finds them prepared.
    run_data = prepare_data(args, enabled=not getattr(args, "json", False))
    prepare_data(args, enabled=not getattr(args, "json", False), option="eval_data")
    model = from_plan or model_config(args, seed=args.seed, data_vocab=run_data.vocab)
    seq_len = SeqLenDist.parse(args.seq_len_dist)
    length = seq_len.mean if model.spec.reads_text else model.hidden
    check_memory(args.microbatches, args.microbatch_size, args.ranks, length)  # before the hint is built
    if args.hint == AUTO:  # measured here, once, on the model as flagged (see hintpipe.apps.split_costs)
        from hintpipe.apps.split_costs import AutoRun

        sizes = {"microbatches": args.microbatches, "microbatch_size": args.microbatch_size, "seq_len_dist": seq_len}
        resumed = {"checkpoint_dir": args.checkpoint_dir, "resume": args.resume}
        run = AutoRun(model=model, ranks=args.ranks, seed=args.seed, **sizes, **resumed)
        args.hint = choose_auto_hint(run, args.chunks)
    planned = None if plan_file is None else _plan_from_file(args, plan_file, model, run_data)
    if plan_file is None and not model.spec.planned:  # a list of layers every rank builds (sized, not built)
        check_model_memory(model, layers_and_parameters(model)[1], args.ranks * args.dp * args.tp)
    # Every option given as a flag, checked above, fills the field of its name; then what the command line
    # resolves itself (the model, the room, the plan file's answers, the data).
    flags = {name: getattr(args, name) for name in flagged if place_of(name) is not None}
    resolved = _resolved_fields(args, policy, model, seq_len, room(args, args.ranks), planned)
    with said_as_flags():  # the config's rules name its flags (see hintpipe.apps.train_config.check_run_rules)
        config = TrainConfig.of(**(flags | resolved))
        if plan_file is None and model.spec.planned:
            bf16 = config.pipeline.precision is Precision.BF16
            config = config.replaced(plan=plan_once(args, model, build_hint(args), autocast=bf16))
        if config.data.forming.by_cost:
            config = config.replaced(sequence_cost=_sequence_cost(model, args.microbatch_size))
    if planned is not None and config.pipeline.precision is Precision.BF16 and not planned.graph.follows_autocast:
        raise ValueError(
            f"--plan {args.plan} was planned for float32 alone (autocast=False), and --precision bf16 runs its "
            "stages under a bfloat16 autocast: plan it with autocast=True (hintpipe plan does)"
        )
    if config.metrics.tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--tensorboard needs tensorboard: pip install -e '.[tensorboard]'")
    if config.metrics.tensorboard is not None:
        check_folder_writable(config.metrics.tensorboard, "--tensorboard", "TensorBoard")
    if config.checkpoint.folder is not None:
        check_checkpoint_folder(config)
    if args.emulate and not planned_elsewhere():
        config = config.replaced(emulate=profile_costs(config))
    return config


def _resolved_fields(
    args: argparse.Namespace,
    policy: str,
    model: ModelConfig,
    seq_len: SeqLenDist,
    flagged_room: tuple[float, list[float] | None, float | None],
    planned: Plan | None,
) -> dict[str, Any]:
    """The config's fields the command line resolves itself rather than taking a flag's value as it is: the
    model, the room (``slack_microbatches``, budgets, ``device_budget_fraction``), the plan file's plan, the
    lengths, what the output flags imply."""
    slack, budgets, device_budget_fraction = flagged_room
    forming: Forming = args.forming
    return {
        "model": model,
        "ranks": args.ranks,
        "microbatches": args.microbatches,
        "microbatch_size": args.microbatch_size,
        "hint": args.hint,
        "chunks": args.chunks,
        "policy": policy,
        "slack_microbatches": slack,
        "device_budget_fraction": device_budget_fraction,
        "activation_budget": None if budgets is None else tuple(budgets),
        "seq_len_dist": seq_len,
        "variability": tuple(args.variability),
        "faults": tuple(args.faults),
        "check_grads": getattr(args, "check_grads", False),
        "shared": under_torchrun_here(),
        "progress": not getattr(args, "json", False),
        "checkpoint_dir": getattr(args, "checkpoint_dir", None),
        "resume": getattr(args, "resume", False),
        "timelines": bool(getattr(args, "trace", None) or getattr(args, "timeline", None)),
        "plan": planned,
        "forming": forming.value,
        "dp": args.dp,
        "tp": args.tp,
    }


def prepare_data(args: argparse.Namespace, *, enabled: bool, option: str = "data") -> RunData:
    """Resolve the data the flag ``option`` names (``--data``, or ``--eval-data``: none given, none), checked
    (preparing raw files on first use, with a progress bar where ``enabled``): its prepared folders and the
    vocabulary its token ids need."""
    from hintpipe.data.run_data import RunData, resolve_data

    data = getattr(args, option)
    if data is None:
        return RunData((), (), None)
    with bytes_progress("preparing data", enabled=enabled) as progress:
        return resolve_data(
            data,
            field=args.data_field,
            split=args.data_split,
            tokenizer=args.tokenizer,
            cli=True,
            progress=progress,
            option=option,
        )


def _plan_from_file(args: argparse.Namespace, plan_file: dict[str, Any], model: ModelConfig, data: RunData) -> Plan:
    """The ``--plan`` file's plan of ``model``, its vocabulary checked against the data's."""
    try:
        planned = planned_model(args, args.plan, plan_file, model)
    except (KeyError, TypeError, AttributeError) as exc:
        raise bad_fields(args.plan, exc) from None
    if data.vocab is not None and model.vocab < data.vocab:
        raise ValueError(
            f"--plan {args.plan}'s model has a vocabulary of {model.vocab}; --data {args.data} has token ids up to "
            f"{data.vocab - 1}"
        )
    return planned


def _sequence_cost(model: ModelConfig, rows: int) -> SequenceCost:
    """The model's cost per row of ``t`` tokens, fitted once, here, to the planner's profile at two lengths
    (every rank then forms the same micro-batches)."""
    import torch

    from hintpipe.apps.models import whole_model
    from hintpipe.forming.profiled import profile_sequence_cost

    torch.set_num_threads(1)
    whole, kwargs = whole_model(model)
    longest = model.max_seq_len - 1
    return profile_sequence_cost(
        whole,
        lambda t: torch.zeros(rows, t, dtype=torch.int64),
        (max(2, longest // 8), longest // 2),
        repeats=2,
        kwargs=kwargs,
    )


def _stopped(result: TrainResult) -> int:
    """A run stopped by a signal: say what was saved, in one line; the exit status says which signal."""
    import signal

    config = result.config
    last = result.resumed_from + len(result.reports)
    if result.checkpoint is not None:
        saved = f"checkpoint {result.checkpoint} saved; --resume continues from step {last}"
    else:
        saved = "nothing saved (no --checkpoint-dir)"
    stopped = f"stopped by {result.stopped_by} after step {last} of {config.training.steps}"
    print(f"hintpipe train: {stopped}: {saved}", file=sys.stderr)
    return 128 + int(signal.Signals[result.stopped_by])


def _held_before_the_ranks_meet(config: TrainConfig) -> contextlib.AbstractContextManager[Any]:
    """Under ``torchrun``, rank 0 takes the run's checkpoint folder before the ranks meet, as the command line's
    own launcher takes it before it starts them; elsewhere nothing (the launcher, or ``train``, takes it).

    [Note: a held folder under torchrun]
    Under ``torchrun`` rank 0's Checkpointer took the folder once every rank had built its pipeline, inside the
    collective phase of the run's start: a folder held by another run failed that phase on every rank, each with
    its traceback and ``CheckpointError: starting a run in D failed (rank 0: D is in use by another run ...)``,
    98 lines in all with torchrun's report. Taken here, it is refused before any process group exists: rank 0
    says the one line the command line's own launcher says and exits with status 2; torchrun stops the other
    ranks (still waiting to meet rank 0), which say nothing, and names rank 0's line as the root cause of its
    own report (see :func:`hintpipe.cli.tell_torchrun`). The Checkpointer holds the folder again in the same
    process (counted, not a second lock) and gives it back before this does."""
    from hintpipe.runtime.checkpoint.folder_lock import FolderLock

    if config.checkpoint.folder is None or not under_torchrun_here() or int(os.environ["RANK"]) != 0:
        return contextlib.nullcontext()
    return FolderLock(config.checkpoint.folder)


def run(args: argparse.Namespace) -> int:
    from hintpipe.apps.training import train
    from hintpipe.runtime.checkpoint.folder_lock import FolderInUse
    from hintpipe.runtime.errors import CheckpointError
    from hintpipe.runtime.rank_process import planning_heartbeat

    with planning_heartbeat():  # under torchrun, rank 0 plans before it joins: the others wait on while it beats
        config = config_from(args, args.policy)
    if not planned_elsewhere():  # (under torchrun, rank 0 says it)
        say_what_crop_trains(config)
        say_where_it_evaluates(config)
    try:
        with _held_before_the_ranks_meet(config):
            result = train(config)
    except FolderInUse as exc:  # refused before any rank started (under torchrun: before they met)
        raise ValueError(f"--checkpoint-dir {exc}") from None
    except CheckpointError as exc:  # the folder, before any rank started (a link put there since, a full disk)
        raise ValueError(str(exc)) from None
    if result is None:  # a non-zero rank under torchrun: rank 0 reports
        return 0
    if result.resumed_checkpoint is not None and (result.reports or result.stopped_by):
        print(f"hintpipe train: {resumed_line(result)}", file=sys.stderr)
    for note in result.notes:
        print(f"hintpipe train: {note}", file=sys.stderr)
    if result.stopped_by:
        return _stopped(result)
    if not result.reports:
        raise ValueError(
            f"--resume: the checkpoint in {config.checkpoint.folder} is at step {result.resumed_from}, the run has "
            f"--steps {config.training.steps}: nothing left to train (raise --steps to go on)"
        )
    if args.trace:
        write_chrome_trace(
            result.records(), args.trace, unit_us=1e6, label=f"{config.pipeline.hint} / {config.pipeline.policy}"
        )
    if args.timeline:
        plot_timelines(
            [(f"{config.pipeline.hint}, {config.pipeline.policy}: last step", result.records())],
            args.timeline,
            unit="seconds",
        )
    failed = _grads_differ(result)
    if args.json:
        print_json(result_json(result))
        return failed
    mode = " (emulated compute: tasks sleep their profiled cost)" if config.pipeline.emulate else ""
    parallelism = config.parallelism
    ranks = (
        f"{parallelism.dp} x {parallelism.ranks} x {parallelism.tp} ranks (data x pipeline x tensor)"
        if parallelism.dp * parallelism.tp > 1
        else f"{parallelism.ranks} ranks"
    )
    stdout.print(f"{config.model.label} on {ranks}, {config.pipeline.hint}, {config.pipeline.policy}{mode}")
    stdout.print(step_table(result))
    stdout.print(summary_line(result))
    if result.max_grad_abs_diff is not None:
        from hintpipe.apps.gradcheck import relative_tolerance

        stdout.print(
            f"gradients vs unsplit model: max abs diff {result.max_grad_abs_diff:.3g}, "
            f"max rel diff {result.max_grad_rel_diff:.3g} (tolerance {relative_tolerance(config.pipeline.precision):g})"
        )
    return failed


def _grads_differ(result: TrainResult) -> int:
    """1 (said on stderr) when ``--check-grads`` found a gradient beyond the tolerance, else 0."""
    from hintpipe.apps.gradcheck import relative_tolerance

    worst, tolerance = result.max_grad_rel_diff, relative_tolerance(result.config.pipeline.precision)
    if worst is None or worst <= tolerance:
        return 0
    print(
        f"hintpipe train: --check-grads: a gradient differs from the unsplit model's by {worst:.3g} (relative), "
        f"over the tolerance {tolerance:g}",
        file=sys.stderr,
    )
    return 1
