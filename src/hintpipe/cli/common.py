"""Pieces shared by the commands: hint selection, budgets, output."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, HintError, HintName
from hintpipe.schedule.hint_csv import load_hint_csv
from hintpipe.units import parse_sizes

# Tables keep their columns when printed to a file or a pipe (rich would assume 80 columns).
stdout = Console() if sys.stdout.isatty() else Console(width=120)
stderr = Console(stderr=True)


def add_hint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stages",
        type=int,
        required=True,
        metavar="P",
        help="pipeline ranks; each holds --chunks model chunks (P x V stages in all)",
    )
    parser.add_argument("--microbatches", type=int, required=True, metavar="M", help="micro-batches per step")
    parser.add_argument(
        "--hint",
        default="1f1b",
        metavar="H",
        help=f"schedule to rank work by: {', '.join(h.value for h in HintName)}, or a CSV file "
        "in torch.distributed.pipelining's compute-only format (default: 1f1b)",
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=None,
        metavar="V",
        help="model chunks per rank (interleaved-1f1b, gpipe, bf, bfw; zbv always 2; default 1)",
    )


def build_hint(args: argparse.Namespace) -> Hint:
    """The hint the arguments name, generated or loaded (and then checked against them)."""
    if args.stages < 1 or args.microbatches < 1:
        raise ValueError(f"--stages and --microbatches must be at least 1, got {args.stages} and {args.microbatches}")
    if args.hint.endswith(".csv") or Path(args.hint).is_file():
        hint = load_hint_csv(args.hint)
        if hint.num_ranks != args.stages or hint.num_microbatches != args.microbatches:
            raise HintError(
                f"{args.hint} has {hint.num_ranks} ranks and {hint.num_microbatches} micro-batches, "
                f"but --stages {args.stages} --microbatches {args.microbatches} were given"
            )
        return hint
    return generate_hint(HintName.parse(args.hint), args.stages, args.microbatches, args.chunks)


def add_budget_arguments(parser: argparse.ArgumentParser, *, bytes_only: bool) -> None:
    """``--memory-slack``, ``--activation-budget`` or ``--device-budget``: the room each rank has for in-flight
    activations."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--memory-slack",
        type=float,
        default=0.0,
        metavar="K",
        help="room for K more micro-batches of activations than the hint's own peak (default 0)",
    )
    unit = "bytes, e.g. 64MiB" if bytes_only else "slots, or bytes such as 2GiB when the cost model has sizes"
    group.add_argument(
        "--activation-budget",
        default=None,
        metavar="SIZE",
        help=f"activations each rank may hold ({unit}); one value, or one per rank separated by commas",
    )
    group.add_argument(
        "--device-budget",
        nargs="?",
        type=float,
        const=0.0,
        default=None,
        metavar="PERCENT",
        help="every rank may hold as many micro-batches as the hint's busiest rank holds, plus PERCENT (default 0)",
    )
    renamed(parser, "--memory-budget", "--activation-budget (activation room per rank)")


def renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Refuse a flag that was renamed, naming the new one."""

    class _Renamed(argparse.Action):
        def __call__(self, *args: Any, **kwargs: Any) -> None:
            parser.exit(2, f"{parser.prog}: error: {old} was renamed: use {new}\n")

    parser.add_argument(old, action=_Renamed, help=argparse.SUPPRESS)


def parse_budgets(text: str | None, ranks: int) -> list[float] | None:
    if text is None:
        return None
    return list(parse_sizes(text, ranks, "--activation-budget"))


def print_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


@contextmanager
def progress_bar(label: str, total: int, enabled: bool) -> Iterator[Progress]:
    """A progress bar on stderr (only on a terminal, and only when ``enabled``)."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not (enabled and stderr.is_terminal),
    )
    with progress:
        progress.add_task(label, total=total)
        yield progress


def check_writable(path: str, option: str) -> None:
    """Refuse an output path whose folder does not exist, before any work is done."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")
