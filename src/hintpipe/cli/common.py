"""Pieces shared by the commands: flags derived from the options, budgets, output."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from hintpipe.option import LARGEST_INT, Option, flag_of
from hintpipe.options import OPTIONS, ROOM, check_options
from hintpipe.renamed import REMOVED_IN
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.resolve import resolve_hint
from hintpipe.units import parse_sizes

# Tables keep their columns when printed to a file or a pipe (rich would assume 80 columns).
stdout = Console() if sys.stdout.isatty() else Console(width=120)
stderr = Console(stderr=True)


def add_option(parser: argparse.ArgumentParser | Any, name: str, **overrides: Any) -> None:
    """Add the flag of option ``name`` (:data:`hintpipe.options.OPTIONS`): its flag, type, default,
    choices and help come from the option; ``overrides`` replace any of argparse's keywords. A renamed option
    (:attr:`Option.before <hintpipe.option.Option.before>`) also gets its flag before, a :class:`RetiredFlag`,
    exclusive of the new one (in the group of exclusive flags ``parser`` is, or in a group of the two)."""
    option = OPTIONS[name]
    keywords: dict[str, Any] = {"help": _help(option), "dest": option.name}
    if option.kind == "bool":
        keywords["action"] = "store_true"
    elif option.kind == "specs":
        keywords |= {"action": "append", "default": [], "metavar": option.metavar}
    elif option.kind == "sources":  # None until given: argparse would append to a default list
        keywords |= {"action": "append", "default": None, "metavar": option.metavar}
    else:
        keywords |= {"default": _cli_default(option), "metavar": option.metavar}
        if option.choices is not None:
            keywords["choices"] = [member.value for member in option.choices]
            keywords.pop("metavar")
        elif option.kind == "int":
            keywords["type"] = whole_number
        elif option.kind == "float":
            keywords["type"] = float
    if option.required:
        keywords["required"] = True
    keywords.update(overrides)
    if option.before is None:
        parser.add_argument(option.flag, **keywords)
        return
    assert not option.required, f"{option.flag}: a required flag and its retired one would both be required"
    exclusive = isinstance(parser, argparse._MutuallyExclusiveGroup)
    group = parser if exclusive else parser.add_mutually_exclusive_group()
    new = group.add_argument(option.flag, **keywords)
    same = {key: getattr(new, key) for key in ("nargs", "const", "type", "choices", "metavar")}
    group.add_argument(
        flag_of(option.before), action=RetiredFlag, dest=new.dest, now=new, default=argparse.SUPPRESS, **same
    )


class RetiredFlag(argparse.Action):
    """A renamed option's flag before the rename (:attr:`Option.before <hintpipe.option.Option.before>`), taken
    until :data:`~hintpipe.renamed.REMOVED_IN`: hidden from ``--help``, it says one line on stderr that names the
    new flag (``hintpipe train: warning: --old is now --new; the old flag goes in 0.8``) and then does what the
    new flag does. Giving both is refused as argparse refuses two flags of a group of exclusive flags, in one
    line (the two are in one: see :func:`add_option`). A config file's keys are the new flags' alone
    (:func:`~hintpipe.cli.config_file.config_keys` leaves these out); its old keys are warned about there."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, now: argparse.Action, **keywords: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **keywords)
        self.now = now

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        old, new = option_string or self.option_strings[0], self.now.option_strings[0]
        warn_once(f"{parser.prog}: warning: {old} is now {new}; the old flag goes in {REMOVED_IN}")
        self.now(parser, namespace, values, new)


def warn_once(line: str) -> None:
    """Say ``line`` on stderr once per launch: under ``torchrun`` every rank parses the same command line, and
    rank 0 alone says what it warns of (eight ranks said a renamed flag's warning eight times)."""
    torchrun = all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))
    if not torchrun or os.environ["RANK"] == "0":
        print(line, file=sys.stderr)


def whole_number(text: str) -> int:
    """An integer flag's value, at most :data:`~hintpipe.option.LARGEST_INT` (see [Note: no integer without a
    bound] in :mod:`hintpipe.option`): refused as argparse refuses a word that is no integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value > LARGEST_INT:
        raise argparse.ArgumentTypeError(f"must be at most {LARGEST_INT}, got {value}")
    return value


def _cli_default(option: Option) -> Any:
    default = option.default
    return default.value if hasattr(default, "value") else default


def _help(option: Option) -> str:
    default = _cli_default(option)
    shown = "" if default in (None, (), False) else f" (default {default})"
    return option.help + shown


def add_room_arguments(parser: argparse.ArgumentParser, *, activation_unit: str) -> None:
    """``--slack-microbatches``, ``--activation-budget`` or ``--device-budget-fraction``: the room each rank has
    for in-flight activations (at most one of them)."""
    group = parser.add_mutually_exclusive_group()
    add_option(group, "slack_microbatches")
    add_option(
        group,
        "activation_budget",
        help=f"activations each rank may hold ({activation_unit}); one value, or one per rank separated by commas",
    )
    add_option(group, "device_budget_fraction", nargs="?", const=0.0)


def check_flags(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Check the parsed flags of ``names`` by their options, in place: each becomes its option's value (a
    choice its enum, a size its bytes), or the first out of range is refused naming its flag. The namespace is
    then what the command reads, and what fills the fields of the run's config by name: no mapping of option
    names travels beside it. Checking a checked value gives it again, so a flag checked twice is the same."""
    given = check_options({name: getattr(args, name) for name in names if name != "activation_budget"}, cli=True)
    for name, value in given.items():
        setattr(args, name, value)


def room(args: argparse.Namespace, ranks: int) -> tuple[float, list[float] | None, float | None]:
    """``(slack_microbatches, activation budgets per rank or None, device_budget_fraction or None)`` from the
    flags, checked."""
    check_flags(args, ROOM)
    budgets = None
    if args.activation_budget is not None:
        flag = OPTIONS["activation_budget"].flag
        try:
            parsed = parse_sizes(args.activation_budget, ranks, flag)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
        budgets = [OPTIONS["activation_budget"].check(value, cli=True) for value in parsed]
    return args.slack_microbatches, budgets, args.device_budget_fraction


def build_hint(args: argparse.Namespace) -> Hint:
    """The hint the flags name, generated or loaded (and then checked against them)."""
    check_flags(args, ["ranks", "microbatches", "chunks"])
    return resolve_hint(args.hint, args.ranks, args.microbatches, args.chunks)


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


@contextmanager
def bytes_progress(label: str, enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """A progress bar in bytes on stderr (only on a terminal, and only when ``enabled``), shown from its first
    report: yields what to tell ``(bytes done, bytes in all)``."""
    progress = Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
        disable=not (enabled and stderr.is_terminal),
    )
    task = progress.add_task(label, total=None, start=False)

    def report(done: int, total: int) -> None:
        if not progress.live.is_started:
            progress.start()
            progress.start_task(task)
        progress.update(task, completed=done, total=total)

    try:
        yield report
    finally:
        if progress.live.is_started:
            progress.stop()


def check_folder_writable(path: str, option: str, what: str) -> None:
    """Refuse an output folder that cannot be made or written, before any rank starts (nothing is created):
    ``path`` itself a file, a file on its way (``runs/tb`` where ``runs`` is a file), or the nearest existing
    folder on its way not writable. ``what`` says who writes there, for the message."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{option} {path} is a file; {what} writes into a folder")
    existing = next(p for p in (target, *target.parents) if p.exists())  # "/" or "." at the last
    if not existing.is_dir():
        raise ValueError(f"{option} {path}: {existing} is a file, so the folder cannot be made; give a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: {existing} is not writable by this user; give a folder you can write")


def check_writable(path: str, option: str) -> None:
    """Refuse an output file that cannot be created, before any work is done (it is created, and removed
    again if it was not there)."""
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")
    if target.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name")
    existed = target.exists()
    try:
        with target.open("a"):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path} cannot be written: {exc.strerror or exc}") from None
    if not existed:
        target.unlink()
