"""``--config FILE``: a command's options from a TOML file; flags over the file over the options' defaults.

The file's keys are the options' names (:data:`hintpipe.options.OPTIONS`), in sections as the table groups
them: ``[pipeline]`` (the :class:`~hintpipe.options.PipelineConfig` fields), ``[run]`` (``train``'s own),
``[simulate]`` and ``[plan]``; keys at the top level are taken too. One file can drive ``train``, ``plan``
and ``simulate``: each takes the keys it has flags for and leaves the others. A key that names no option, a
section that is not one of these, or a file that is not TOML is refused in one line. ``--print-config``
prints the file a command would run with (every option it takes, after the file and the flags) and exits.

This module is torch-free.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hintpipe.option import Option
from hintpipe.options import OPTIONS, ROOM

#: The file's sections, in the order ``--print-config`` writes them.
SECTIONS = ("pipeline", "run", "simulate", "plan")


def section_of(option: Option) -> str:
    """The section an option belongs in: the pipeline's, the planner's, the simulator's, or the run's."""
    if option.pipeline:
        return "pipeline"
    if option.commands == frozenset({"plan"}):
        return "plan"
    if option.commands == frozenset({"simulate"}):
        return "simulate"
    return "run"


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="take the options from this TOML file (keys: the options' names; flags given here override it)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the options as a TOML file for --config, and exit"
    )


def read_config(path: str | Path) -> dict[str, Any]:
    """The options a config file gives, by name.

    Raises:
        ValueError: unreadable, not TOML, an unknown section or option (one line, naming it).
    """
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--config {path} is not TOML: {exc}") from None
    values: dict[str, Any] = {}
    for key, value in data.items():
        items: list[tuple[str, Any]] = [(key, value)]
        if isinstance(value, dict):
            if key not in SECTIONS:
                raise ValueError(f"--config {path}: unknown section [{key}]; the sections are {', '.join(SECTIONS)}")
            items = list(value.items())
        for name, given in items:
            if name not in OPTIONS:
                raise ValueError(f"--config {path}: unknown option {name!r}; see `hintpipe COMMAND --help`")
            values[name] = given
    return values


def apply_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Make the options of ``argv``'s ``--config`` file the defaults of its command's flags (so that a flag
    given overrides it; a required flag the file gives is required no more). Nothing without ``--config``.

    Raises:
        ValueError: as :func:`read_config`.
    """
    path = _config_path(argv)
    command = _subparser(parser, argv)
    if path is None or command is None:
        return
    values = read_config(path)
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if any(OPTIONS[name].flag in given for name in ROOM):  # the room the flags give replaces the file's
        values = {name: value for name, value in values.items() if name not in ROOM}
    # A repeatable flag given replaces the file's list (argparse would append to it).
    values = {name: value for name, value in values.items() if OPTIONS[name].flag not in given}
    for action in command._actions:
        if action.dest in values:
            action.default = values[action.dest]
            action.required = False


def config_text(args: argparse.Namespace) -> str:
    """The options ``args`` holds (every flag of its command that is an option), as a TOML file."""
    import tomli_w

    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for name, option in OPTIONS.items():
        if not hasattr(args, name) or args.command not in option.commands:
            continue
        value = _plain(getattr(args, name))
        if value is not None:
            sections[section_of(option)][name] = value
    return tomli_w.dumps({name: values for name, values in sections.items() if values})


def _plain(value: Any) -> Any:
    """A value as TOML writes it: enums as their strings, tuples as arrays; None left out (TOML has no null)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "value"):
        return value.value
    return value


def _config_path(argv: Sequence[str]) -> str | None:
    for i, word in enumerate(argv):
        if word == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--config="):
            return word.split("=", 1)[1]
    return None


def _subparser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser | None:
    commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if commands is None:
        return None
    chosen = next((word for word in argv if word in commands.choices), None)
    return None if chosen is None else commands.choices[chosen]
