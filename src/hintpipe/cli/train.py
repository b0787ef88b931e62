"""``hintpipe train``: train a built-in model with the readiness-driven runtime."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from hintpipe.apps.model_config import MODELS, PLANNED_MODELS, ModelConfig, SeqLenDist
from hintpipe.apps.text_files import BYTES, data_vocab
from hintpipe.cli.common import (
    add_option,
    add_room_arguments,
    build_hint,
    checked,
    print_json,
    room,
    stdout,
)
from hintpipe.cli.config_file import add_config_arguments
from hintpipe.cli.train_checks import check_config, check_memory, check_model_flags, check_run_options
from hintpipe.cli.train_report import result_json as result_json
from hintpipe.cli.train_report import step_table, summary_line
from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.form import Forming
from hintpipe.observe.timeline import plot_timelines
from hintpipe.observe.trace import write_chrome_trace
from hintpipe.options import OPTIONS, ROOM
from hintpipe.runtime.injection import Injection
from hintpipe.schedule.hint import Hint
from hintpipe.units import format_size

if TYPE_CHECKING:  # the training modules need torch; they are imported where a command runs
    from hintpipe.apps.training import TrainConfig, TrainResult
    from hintpipe.planner.plan import Plan

HELP = "train a built-in model across processes with pipeline parallelism"


#: What a plan file says: these flags default to the file's values with ``--plan``, and to the usual ones
#: without (where ``--ranks`` and ``--microbatches`` are then required).
FROM_PLAN = {"ranks": None, "microbatches": None, "hint": "1f1b", "chunks": None, "model": "gpt-mini", "layers": 4}
FROM_PLAN |= {"hidden": 64}


#: The options of the model's data, whose flags come with the model's (options of the table: a config file
#: gives them too).
DATA_OPTIONS = ("data", "data_field", "tokenizer")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The built-in model and its data (shared with ``demo``)."""
    parser.add_argument(
        "--model", choices=MODELS, help="built-in model (default gpt-mini; with --plan, the plan file's)"
    )
    parser.add_argument(
        "--layers", type=int, help="transformer blocks / MLP layers (default 4; with --plan, the file's)"
    )
    parser.add_argument("--hidden", type=int, help="hidden size (default 64; with --plan, the plan file's)")
    add_option(parser, "microbatch_size")
    parser.add_argument(
        "--seq-len-dist",
        default="fixed:64",
        metavar="SPEC",
        help="gpt-mini sequence lengths per micro-batch: fixed:T or lognormal:MEAN:SIGMA (default fixed:64)",
    )
    for name in DATA_OPTIONS:
        add_option(parser, name)


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
            default = FROM_PLAN[name]
            said = f" (default {default}; with --plan, the plan file's)" if default is not None else ""
            help_text = OPTIONS[name].help + (said or " (required, unless --plan FILE says it)")
            add_option(parser, name, default=None, required=False, help=help_text)
        else:
            add_option(parser, name)
    add_room_arguments(parser, activation_unit="bytes, e.g. 64MiB")
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


def _answered_by_plan(args: argparse.Namespace) -> dict[str, Any] | None:
    """Fill in what ``--plan`` says (refusing flags that contradict it), or the defaults without it; returns the
    plan file's contents (tensors and plain values, read safely) or None."""
    from hintpipe.planner.plan_file import read_plan_file

    path = getattr(args, "plan", None)
    if path is None:
        for name, default in FROM_PLAN.items():
            if getattr(args, name, None) is None:
                setattr(args, name, default)
        missing = [f"--{name}" for name in ("ranks", "microbatches") if getattr(args, name) is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} must be given (or --plan FILE, which says them)")
        return None
    payload = read_plan_file(path)
    try:
        return _fill_from_plan(args, path, payload)
    except (KeyError, TypeError, AttributeError) as exc:  # a file of the right format with wrong fields
        raise _bad_fields(path, exc) from None


def _bad_fields(path: str, exc: BaseException) -> ValueError:
    what = f"no field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
    return ValueError(
        f"{path} says it is a hintpipe plan file but its fields are not a plan's ({what}); write it again with "
        "`hintpipe plan ... --save FILE`"
    )


def _fill_from_plan(args: argparse.Namespace, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    config = payload["model"].get("config")
    if config is None:
        raise ValueError(f"{path} does not say which built-in model it was planned for: plan it with `hintpipe plan`")
    data = payload["plan"]
    planned = {"ranks": data["ranks"], "microbatches": data["microbatches"], "hint": data["hint"]}
    planned |= {"chunks": data["chunks"], "model": config["name"], "layers": config["layers"]}
    planned |= {"hidden": config["hidden"]}
    for name, value in planned.items():
        given = getattr(args, name, None)
        if given is not None and given != value and not (name == "chunks" and value == 1):
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{path} is planned for {flag} {value}, this run asks for {flag} {given}; leave {flag} out (the plan "
                "file says it) or plan again"
            )
        setattr(args, name, value if name != "chunks" or given is not None else None)
    return payload


def config_from(args: argparse.Namespace, policy: str) -> TrainConfig:
    """Validate the arguments once, here, and build the run's config."""
    from hintpipe.apps.training import TrainConfig, profile_costs

    plan_file = _answered_by_plan(args)
    values = checked(args, [n for n in (*TRAIN_OPTIONS, "microbatch_size", *DATA_OPTIONS) if hasattr(args, n)])
    check_run_options(args, values)
    data = values.get("data", "synthetic")
    # The model's vocabulary is the data's: a file corpus is loaded (and refused if bad) here, once.
    vocab = data_vocab(data, values.get("data_field", "text"), values.get("tokenizer", BYTES), cli=True)
    vocab = ModelConfig.vocab if vocab is None else vocab
    model = ModelConfig(args.model, layers=args.layers, hidden=args.hidden, seed=values["seed"], vocab=vocab)
    seq_len = SeqLenDist.parse(args.seq_len_dist)
    if model.name != "mlp" and data == "synthetic" and seq_len.mean > model.max_seq_len - 1:
        raise ValueError(
            f"--seq-len-dist {args.seq_len_dist}: {model.name}'s positions end at {model.max_seq_len - 1} tokens; "
            f"use a mean of at most {model.max_seq_len - 1}"
        )
    check_memory(values, seq_len.mean if model.name != "mlp" else model.hidden)  # before the hint is built
    hint = build_hint(args)
    dp, tp = values.get("dp", 1), values.get("tp", 1)
    injection = Injection.parse(values.get("variability", ()), values.get("faults", ()), values["seed"])
    injection.check(args.ranks * dp * tp, hint.num_stages, args.microbatches, tp)
    forming = values.get("forming", Forming.CROP)
    check_model_flags(model, data, tp, forming, injection, values["steps"])
    planned = None
    if plan_file is not None:
        try:
            model, planned = _planned_model(args, args.plan, plan_file)
        except (KeyError, TypeError, AttributeError) as exc:
            raise _bad_fields(args.plan, exc) from None
        if model.vocab < vocab:
            raise ValueError(
                f"--plan {args.plan}'s model has a vocabulary of {model.vocab}; --data {data} has token ids up to "
                f"{vocab - 1}"
            )
    elif model.name in PLANNED_MODELS:
        planned = _plan_hf(args, model, hint)
    else:
        _check_layers(model, hint.num_stages)  # refuses too few layers here, not in every rank
    slack, budgets, device_budget = room(args, args.ranks)
    if budgets is not None:
        _check_budgets(budgets, model, args.microbatch_size, seq_len.mean, str(values.get("precision", "fp32")))
    # Every option given as a flag, checked above, fills the field of its name; then what the command line
    # resolves itself (the model, the room, the plan file's answers, the data).
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    resolved: dict[str, Any] = {
        "model": model,
        "ranks": args.ranks,
        "microbatches": args.microbatches,
        "microbatch_size": args.microbatch_size,
        "hint": args.hint,
        "chunks": args.chunks,
        "policy": policy,
        "memory_slack": slack,
        "device_budget": device_budget,
        "activation_budget": None if budgets is None else tuple(budgets),
        "seq_len_dist": seq_len,
        "variability": tuple(values.get("variability", ())),
        "faults": tuple(values.get("faults", ())),
        "check_grads": getattr(args, "check_grads", False),
        "progress": not getattr(args, "json", False),
        "checkpoint_dir": getattr(args, "checkpoint_dir", None),
        "resume": getattr(args, "resume", False),
        "timelines": bool(getattr(args, "trace", None) or getattr(args, "timeline", None)),
        "plan": planned,
        "forming": forming.value,
        "sequence_cost": None if forming is Forming.CROP else _sequence_cost(model, args.microbatch_size),
        "dp": dp,
        "tp": tp,
    }
    config = TrainConfig(**({name: value for name, value in values.items() if name in fields} | resolved))
    if config.tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--tensorboard needs tensorboard: pip install -e '.[tensorboard]'")
    check_config(config, injection)
    if args.emulate:
        config = dataclasses.replace(config, emulate=profile_costs(config))
    return config


def _check_budgets(budgets: list[float], model: ModelConfig, rows: int, tokens: float, precision: str) -> None:
    """Refuse, before any rank starts, an ``--activation-budget`` below one micro-batch's hidden states: what
    any stage keeps of a micro-batch in flight at the least (the hint holds several), so that no rank could
    ever run."""
    per_value = 4 if precision == "fp32" else 2
    length = 1 if model.name == "mlp" else tokens
    floor = rows * length * model.hidden * per_value
    low = min(budgets)
    if low < floor:
        shape = f"{rows} x {model.hidden}" if model.name == "mlp" else f"{rows} x {tokens:g} tokens x {model.hidden}"
        raise ValueError(
            f"--activation-budget {format_size(low)} is below one micro-batch's hidden states, {format_size(floor)} "
            f"({shape} values of {per_value} bytes), which every stage keeps while a micro-batch is in flight; give "
            "several times that (the hint holds several micro-batches), or leave it out"
        )


def _check_layers(model: ModelConfig, stages: int) -> None:
    """Refuse a model with fewer layers than stages, advising the ``--layers`` that fills them (gpt-mini has an
    embedding and a head beside its ``--layers`` blocks)."""
    from hintpipe.apps.models import build_layers

    layers = len(build_layers(model))
    if layers >= stages:
        return
    extra = layers - model.layers
    beside = f" ({model.layers} and {extra} more of {model.name}'s own)" if extra else ""
    raise ValueError(
        f"--layers {model.layers} makes {layers} layers{beside}, too few for {stages} stages; use --layers "
        f"{stages - extra} or more, or fewer stages"
    )


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


def _plan_hf(args: argparse.Namespace, model: ModelConfig, hint: Hint) -> Plan:
    """A Hugging Face model captured (torch.export) and cut into stages once, here, for every rank."""
    import torch

    from hintpipe.apps.hf_models import CALL_KWARGS, build_hf_model
    from hintpipe.apps.models import make_batch
    from hintpipe.planner.plan import plan

    if getattr(args, "check_grads", False):
        raise ValueError(f"--check-grads compares with a list of layers; {model.name} is planned, not listed")
    torch.set_num_threads(1)
    inputs, _, _ = make_batch(model, 1, args.microbatch_size, SeqLenDist(16), 0, args.seed)
    return plan(
        build_hf_model(model),
        inputs[0],
        ranks=args.ranks,
        microbatches=args.microbatches,
        hint=hint,
        repeats=1,
        kwargs=CALL_KWARGS,
    )


def _planned_model(args: argparse.Namespace, path: str, payload: dict[str, Any]) -> tuple[ModelConfig, Plan]:
    """A plan file's plan for the built-in model it was made for (built here from the file's config), after
    checking them against the other options.

    The plan travels to every rank inside the run's config (each rank gets its own copy), so the file is read
    once, here."""
    from hintpipe.apps.models import whole_model
    from hintpipe.planner.plan_file import check_plan, load_plan

    if getattr(args, "check_grads", False):
        raise ValueError("--check-grads compares with the built-in model's layers; it does not apply to --plan")
    config = ModelConfig(**payload["model"]["config"])
    planned, _ = load_plan(path, whole_model(config)[0])
    check_plan(planned, path, ranks=args.ranks, microbatches=args.microbatches)
    return config, planned  # its sizes and weights are the plan's


def _stopped(result: TrainResult) -> int:
    """A run stopped by a signal: say what was saved, in one line; the exit status says which signal."""
    import signal

    config = result.config
    last = result.resumed_from + len(result.reports)
    if result.checkpoint is not None:
        saved = f"checkpoint {result.checkpoint} saved; --resume continues from step {last}"
    else:
        saved = "nothing saved (no --checkpoint-dir)"
    stopped = f"stopped by {result.stopped_by} after step {last} of {config.steps}"
    print(f"hintpipe train: {stopped}: {saved}", file=sys.stderr)
    return 128 + int(signal.Signals[result.stopped_by])


def run(args: argparse.Namespace) -> int:
    from hintpipe.apps.training import train
    from hintpipe.runtime.checkpoint.folder_lock import FolderInUse

    config = config_from(args, args.policy)
    try:
        result = train(config)
    except FolderInUse as exc:  # refused before any rank started
        raise ValueError(f"--checkpoint-dir {exc}") from None
    if result is None:  # a non-zero rank under torchrun: rank 0 reports
        return 0
    for note in result.notes:
        print(f"hintpipe train: {note}", file=sys.stderr)
    if result.stopped_by:
        return _stopped(result)
    if not result.reports:
        raise ValueError(
            f"--resume: the checkpoint in {config.checkpoint_dir} is at step {result.resumed_from}, the run has "
            f"--steps {config.steps}: nothing left to train (raise --steps to go on)"
        )
    if args.trace:
        write_chrome_trace(result.records(), args.trace, unit_us=1e6, label=f"{config.hint} / {config.policy}")
    if args.timeline:
        plot_timelines(
            [(f"{config.hint}, {config.policy}: last step", result.records())], args.timeline, unit="seconds"
        )
    failed = _grads_differ(result)
    if args.json:
        print_json(result_json(result))
        return failed
    mode = " (emulated compute: tasks sleep their profiled cost)" if config.emulate else ""
    ranks = (
        f"{config.dp} x {config.ranks} x {config.tp} ranks (data x pipeline x tensor)"
        if config.dp * config.tp > 1
        else f"{config.ranks} ranks"
    )
    stdout.print(f"{config.model.name} on {ranks}, {config.hint}, {config.policy}{mode}")
    stdout.print(step_table(result))
    stdout.print(summary_line(result))
    if result.max_grad_abs_diff is not None:
        from hintpipe.apps.gradcheck import RELATIVE_TOLERANCE

        stdout.print(
            f"gradients vs unsplit model: max abs diff {result.max_grad_abs_diff:.3g}, "
            f"max rel diff {result.max_grad_rel_diff:.3g} (tolerance {RELATIVE_TOLERANCE:g})"
        )
    return failed


def _grads_differ(result: TrainResult) -> int:
    """1 (said on stderr) when ``--check-grads`` found a gradient beyond the tolerance, else 0."""
    from hintpipe.apps.gradcheck import RELATIVE_TOLERANCE

    worst = result.max_grad_rel_diff
    if worst is None or worst <= RELATIVE_TOLERANCE:
        return 0
    print(
        f"hintpipe train: --check-grads: a gradient differs from the unsplit model's by {worst:.3g} (relative), "
        f"over the tolerance {RELATIVE_TOLERANCE:g}",
        file=sys.stderr,
    )
    return 1
