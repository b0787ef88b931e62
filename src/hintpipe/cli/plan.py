"""``hintpipe plan``: cut a built-in model into stages under memory budgets."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from rich.table import Table

from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.cli.common import add_option, check_flags, check_writable, print_json, stdout, whole_number
from hintpipe.cli.config_file import add_config_arguments
from hintpipe.cli.model_flags import add_model_flags, model_config
from hintpipe.schedule.hint import HintName
from hintpipe.units import format_size

HELP = "plan stage cuts that minimise the slowest stage under per-device memory budgets"


def register(commands: Any) -> None:
    parser = commands.add_parser("plan", help=HELP, description=HELP)
    add_config_arguments(parser)
    add_model_flags(parser)
    parser.add_argument(
        "--seq-len", type=whole_number, default=64, help="the sequence length to profile, in tokens (default 64)"
    )
    for name in ("data", "data_field", "data_split"):
        add_option(parser, name)
    add_option(parser, "tokenizer", default=None)
    for name in ("ranks", "microbatches"):
        add_option(parser, name)
    names = [h.value for h in HintName]
    add_option(parser, "hint", choices=names, metavar=None, help=f"the schedule the ranks will run: {', '.join(names)}")
    add_option(parser, "chunks")
    add_option(parser, "stage_memory")  # none: unlimited, as hintpipe.plan's default
    for name in ("microbatch_size", "optimizer_factor", "host_bandwidth", "repeats", "seed"):
        add_option(parser, name)
    parser.add_argument(
        "--save", metavar="FILE", help="write the plan (with the model's weights) for `hintpipe train --plan FILE`"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch  # here, not above: ``hintpipe simulate`` runs without torch

    from hintpipe.apps.model_description import describe_model
    from hintpipe.apps.models import make_batch, whole_model
    from hintpipe.planner.plan import plan
    from hintpipe.planner.plan_file import save_plan

    if args.save is not None:
        check_writable(args.save, "--save")
    check_flags(args, ["ranks", "microbatches", "chunks", "microbatch_size", "optimizer_factor", "repeats"])
    check_flags(args, ["host_bandwidth", "seed"])
    torch.set_num_threads(1)
    config = planned_model(args, args.seed)
    if args.seq_len > config.max_seq_len - 1:
        raise ValueError(f"--seq-len {args.seq_len}: {config.label}'s positions end at {config.max_seq_len - 1} tokens")
    model, kwargs = whole_model(config)  # the model --model names (a Hugging Face one through torch.export)
    inputs, _, _ = make_batch(config, 1, args.microbatch_size, SeqLenDist(args.seq_len), 0)
    result = plan(
        model,
        inputs[0],
        ranks=args.ranks,
        microbatches=args.microbatches,
        hint=args.hint,
        chunks=args.chunks,
        stage_memory=args.stage_memory if args.stage_memory is not None else math.inf,
        host_bandwidth=args.host_bandwidth,
        optimizer_factor=args.optimizer_factor,
        repeats=args.repeats,
        kwargs=kwargs or None,
    )
    if args.save is not None:
        # The config trains it again (train --plan); the description rebuilds it without hintpipe or the folder
        # (a Hugging Face model's transformers class and config).
        described = {"config": dataclasses.asdict(config), "description": describe_model(config)}
        save_plan(result, args.save, model=described)
    if args.json:
        print_json(_finite(result.to_json()))
        return 0
    stdout.print(
        f"{config.label} ({config.layers} layers, hidden {config.hidden}), {result.stages} stages, {args.hint}"
    )
    memory = "unlimited" if args.stage_memory is None else args.stage_memory
    stdout.print(f"{args.microbatches} micro-batches of {args.microbatch_size}, stage memory {memory}")
    table = Table()
    for column in ("stage", "nodes", "from", "time ms", "memory", "in flight", "recompute", "offload"):
        table.add_column(column, justify="left" if column == "from" else "right", no_wrap=True)
    for i, (stage, module) in enumerate(zip(result.partition.stages, result.first_modules(), strict=True)):
        table.add_row(
            str(i),
            str(stage.nodes),
            module,
            f"{stage.time_ms:.3f}",
            format_size(stage.memory_bytes),
            str(stage.inflight),
            str(len(stage.recompute)),
            str(len(stage.offload)),
        )
    stdout.print(table)
    stdout.print("against the baselines (memory-blind: no recompute or offload)")
    compare = Table()
    for column in ("partition", "bottleneck ms", "largest micro-batch", "peak stage memory"):
        compare.add_column(column, justify="right")
    rows = {"hintpipe": result.partition, **result.baselines}
    for name, part in rows.items():
        compare.add_row(
            name,
            f"{part.bottleneck_ms:.3f}",
            str(part.max_microbatch_size) if args.stage_memory is not None else "no limit",
            format_size(max(s.memory_bytes for s in part.stages)),
        )
    stdout.print(compare)
    if result.tied:
        groups = "; ".join(" = ".join(group) for group in result.tied)
        stdout.print(f"parameters used by more than one stage (tied): {groups}")
    if args.save is not None:
        stdout.print(f"plan saved to {args.save}: hintpipe train --plan {args.save} --ranks {args.ranks} ...")
    return 0


def planned_model(args: argparse.Namespace, seed: int) -> ModelConfig:
    """The model the flags name, as ``train`` resolves it: a built-in one's vocabulary the data's (through
    ``--tokenizer``, or a model folder's own tokenizer), so that ``train --plan`` takes the same data."""
    from hintpipe.cli.train import prepare_data
    from hintpipe.cli.train_model import resolve_tokenizer

    resolve_tokenizer(args)
    check_flags(args, ["data", "data_field", "data_split", "tokenizer"])
    vocab = prepare_data(args, enabled=not args.json).vocab
    return model_config(args, seed=seed, data_vocab=vocab)


def _finite(value: Any) -> Any:
    """``value`` with every infinite number (no budget) as None: JSON has no infinity."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and math.isinf(value) else value
