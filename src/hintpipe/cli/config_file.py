"""``--config FILE``: the whole run from a TOML file; flags over the file over the flags' defaults.

Every flag of a command is a key of the file and every key a flag: the keys are read from the command's
argparse actions (their ``dest``: ``--checkpoint-dir`` is ``checkpoint_dir``), so a flag added to a command is a
key with nothing to change here but its line in :data:`SECTIONS`. Only the flags about the invocation, not the
run, are left out (:data:`INVOCATION`). The keys go in sections by concern, as torchtitan's ``JobConfig``
groups them (``[model]``, ``[data]``, ``[optimizer]``, ``[lr_schedule]``, ``[training]``, ``[parallelism]``,
``[checkpoint]``, ``[metrics]``, and the simulator's and the planner's own ``[simulate]`` and ``[plan]``);
:data:`SECTIONS` is the one map of key to section, and a test fails when a command has a flag it does not place.

One file drives ``train``, ``plan`` and ``simulate``: each takes the keys it has flags for and skips the other
commands' keys. A value is checked as its flag checks the same value (its type, its choices, and for the
options table's rows :meth:`Option.check <hintpipe.option.Option.check>`'s range), and a TOML value is the
type its flag's is: an integer flag refuses ``2.5``, ``2.0``, ``"2"`` and ``true``; a number flag takes integers
and floats; an on/off flag only ``true`` or ``false``; a repeatable flag a list of strings (or one string); a
choice only its strings; a size (``stage_memory``, ``activation_budget``) a string such as ``"2GiB"`` or a
number of bytes. Everything wrong in a file is refused in one line that starts ``--config FILE:``:

- a file that cannot be read, or is not TOML;
- an unknown section, with the nearest one (``unknown section [parallelsm]; did you mean [parallelism]?``);
- an unknown key, with the nearest one (``unknown key 'polcy' in [parallelism]; did you mean 'policy'?``);
- a key in another section than its own (``'steps' belongs in [training], not [model]``);
- a key at the top level (``'steps' belongs in [training], not at the top level``): every key has exactly one
  place, so that a file reads the same way whoever wrote it and a misplaced key cannot pass for a placed one
  (0.7's first form took keys at the top level too; no release wrote files that rely on it);
- a bad value, in its flag's own words (``[training] steps: --steps must be an integer, got 2.5``);
- the sections ``[pipeline]`` and ``[run]`` of 0.7's first form, which no release shipped: they are refused,
  not read, in one line that says where each of their keys goes now (``[run] is no longer a section: put
  data in [data]; steps in [training]``), so a file is fixed once rather than warned about on every run;
- a renamed option given under both its names in one section.

A renamed option's key before (:data:`~hintpipe.options.RENAMED_OPTIONS`) is read as its key now, with one line
on stderr that names the new key, until :data:`~hintpipe.renamed.REMOVED_IN` (its flag before is taken the same
way: :class:`~hintpipe.cli.common.RetiredFlag`).

``--print-config`` prints the file a command would run with (every key of the command, after the file and the
flags; values that are None left out, as TOML has no null) and exits; fed back with ``--config`` it parses to
the same arguments.

This module is torch-free.
"""

from __future__ import annotations

import argparse
import difflib
import os
import stat
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from hintpipe.cli.common import RetiredFlag, warn_once, whole_number
from hintpipe.option import LARGEST_INT
from hintpipe.options import OPTIONS, RENAMED_OPTIONS
from hintpipe.renamed import REMOVED_IN

#: The file's sections and the keys each holds, in the order ``--print-config`` writes them. Each key is in
#: exactly one section; names without a flag yet (Python-only options, flags to come) may be listed.
SECTIONS: dict[str, tuple[str, ...]] = {
    "model": (
        "model", "init", "layers", "hidden", "heads", "vocab", "max_seq_len", "dropout", "seq_len_dist", "seq_len",
    ),
    "data": ("data", "data_field", "data_split", "tokenizer", "forming", "eval_data"),
    "optimizer": ("optimizer", "lr", "weight_decay", "betas", "momentum", "clip_grad_norm"),
    "lr_schedule": ("lr_schedule", "warmup_steps"),
    "training": (
        "steps", "microbatches", "microbatch_size", "seed", "precision", "on_nonfinite", "timeout", "emulate",
        "check_grads", "variability", "faults",
    ),
    "parallelism": (
        "ranks", "hint", "chunks", "policy", "microbatch_order", "admission", "slack_microbatches", "activation_budget",
        "device_budget_fraction", "dp", "tp", "data_parallel", "device", "transport", "tied", "mesh", "fsdp",
    ),
    "checkpoint": (
        "checkpoint_dir", "checkpoint_every", "checkpoint_keep", "replace_checkpoints", "group_readable", "resume",
        "plan", "save",
    ),
    "metrics": (
        "log_every", "eval_every", "eval_batches", "tensorboard", "trace", "timeline", "report_every", "history",
        "timelines",
    ),
    "simulate": ("compare", "costs", "trials"),
    "plan": ("stage_memory", "optimizer_factor", "host_bandwidth", "repeats"),
}  # fmt: skip

#: Each key's section (from :data:`SECTIONS`).
SECTION_OF: dict[str, str] = {key: section for section, keys in SECTIONS.items() for key in keys}

#: The flags about the invocation, not the run: where the options come from (``--config``), what to do instead
#: of running (``--print-config``, ``--help``, ``--version``) and how to show the results (``--json``). A file
#: neither gives nor prints them, so a printed file runs the same whether it was printed with ``--json`` or not.
INVOCATION = frozenset({"config", "print_config", "json", "help", "version"})

#: 0.7's first sections, refused with where their keys go now.
OLD_SECTIONS = ("pipeline", "run")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="take the run from this TOML file (keys: the flags' names, in sections; flags given here override it)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the run as a TOML file for --config, and exit"
    )


def config_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands of ``hintpipe``'s ``parser`` that take ``--config``, by name."""
    subparsers = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if subparsers is None:
        return {}
    return {
        name: command
        for name, command in subparsers.choices.items()
        if any(action.dest == "config" for action in command._actions)
    }


def config_keys(command: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A command's keys: every flag's ``dest`` but the invocation's (:data:`INVOCATION`), with its action (a
    renamed option's flag before, a :class:`~hintpipe.cli.common.RetiredFlag`, is no key: its old key is read as
    the new one, see :func:`read_config`)."""
    return {
        a.dest: a
        for a in command._actions
        if a.option_strings and a.dest not in INVOCATION and not isinstance(a, RetiredFlag)
    }


#: The largest config file read: a run's whole config is a few kilobytes; a larger file is no config (and
#: ``/dev/zero`` would be read for ever).
MAX_CONFIG_BYTES = 1 << 20


def _toml(path: str | Path) -> dict[str, Any]:
    """The file's TOML, read from a regular file of at most :data:`MAX_CONFIG_BYTES`.

    Raises:
        ValueError: in one line: not a regular file, too large, not UTF-8, not TOML, nested too deep.
    """
    try:
        with open(path, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ValueError(f"--config {path} is not a regular file; give a TOML file")
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"--config {path} is over {MAX_CONFIG_BYTES >> 20} MiB; a config file is a few kilobytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--config {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--config {path} is not TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"--config {path} nests too deep to be a config file") from None


def read_config(path: str | Path, parser: argparse.ArgumentParser, command: str) -> dict[str, Any]:
    """The values a config file gives ``command`` (a command of ``hintpipe``'s ``parser``), by key, each as its
    flag puts it in the arguments; the other commands' keys are skipped.

    Raises:
        ValueError: in one line starting ``--config PATH:`` (see the module's docstring).
    """
    data = _toml(path)
    known = {key for each in config_commands(parser).values() for key in config_keys(each)}
    _refuse_old_sections(path, data, known)
    actions = config_keys(config_commands(parser)[command])
    values: dict[str, Any] = {}
    for name, content in data.items():
        if not isinstance(content, dict):
            _check_place(path, RENAMED_OPTIONS.get(name, name), None, known)
            continue
        if name not in SECTIONS:
            near = difflib.get_close_matches(name, SECTIONS, n=1)
            fix = f"did you mean [{near[0]}]?" if near else f"the sections are {', '.join(SECTIONS)}"
            raise ValueError(f"--config {path}: unknown section [{name}]; {fix}")
        for given, value in content.items():
            key = _renamed_key(path, given, name, content, command)
            _check_place(path, key, name, known)
            if key in actions:
                try:
                    values[key] = file_value(actions[key], value)
                except ValueError as exc:
                    raise ValueError(f"--config {path}: [{name}] {key}: {exc}") from None
    return values


def _renamed_key(path: str | Path, key: str, section: str, content: dict[str, Any], command: str) -> str:
    """``key``, or the name now of a renamed option's name before (:data:`~hintpipe.options.RENAMED_OPTIONS`),
    said in one line on stderr, as a flag before is (:class:`~hintpipe.cli.common.RetiredFlag`).

    Raises:
        ValueError: the section gives the option under both names.
    """
    new = RENAMED_OPTIONS.get(key)
    if new is None:
        return key
    if new in content:
        raise ValueError(f"--config {path}: [{section}] gives {new} and {key}, its name before; keep {new} alone")
    warn_once(
        f"hintpipe {command}: warning: --config {path}: [{section}] {key} is now {new}; the old key goes in "
        f"{REMOVED_IN}"
    )
    return new


def file_value(action: argparse.Action, value: Any) -> Any:
    """A file's ``value`` for ``action``'s flag, as the flag would put it in the arguments.

    Raises:
        ValueError: the flag's own message for the value (``--steps must be an integer, got 2.5``).
    """
    flag = action.option_strings[-1]
    if isinstance(action, argparse._StoreConstAction) and isinstance(action.const, bool):  # store_true/false
        if not isinstance(value, bool):
            raise ValueError(f"{flag} must be true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or (action.type is None and not all(isinstance(v, str) for v in items)):
            raise ValueError(f"{flag} must be a list of strings, got {value!r}")
        converted: Any = [_one(action, flag, item) for item in items]
    elif action.nargs in ("*", "+") or isinstance(action.nargs, int):
        count = action.nargs if isinstance(action.nargs, int) else None
        if not isinstance(value, list) or (count is not None and len(value) != count):
            raise ValueError(f"{flag} must be a list of {count or 'some'} values, got {value!r}")
        converted = [_one(action, flag, item) for item in value]
    else:
        converted = _one(action, flag, value)
    option = OPTIONS.get(action.dest)
    if option is not None and flag == option.flag:  # a row of the options table: its range too
        sizes = option.kind == "size" and isinstance(converted, str)
        for part in converted.split(",") if sizes else [converted]:
            option.check(part, cli=True)
    return converted


def _one(action: argparse.Action, flag: str, value: Any) -> Any:
    """One value as the flag's type and choices take it."""
    if action.choices is not None and action.type is None:
        if not isinstance(value, str) or value not in action.choices:
            raise ValueError(f"{flag} {value!r} is unknown: choose one of {', '.join(map(str, action.choices))}")
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if action.type in (int, whole_number):
        if not number or not isinstance(value, int):
            raise ValueError(f"{flag} must be an integer, got {value!r}")
        if action.type is whole_number and value > LARGEST_INT:  # see [Note: no integer without a bound]
            raise ValueError(f"{flag} must be at most {LARGEST_INT}, got {value}")
    elif action.type is float:
        if not number:
            raise ValueError(f"{flag} must be a number, got {value!r}")
        value = float(value)
    elif action.type is None:
        size = getattr(OPTIONS.get(action.dest), "kind", None) == "size"
        if not isinstance(value, str) and not (size and number):
            raise ValueError(f"{flag} must be {'a size' if size else 'a string'}, got {value!r}")
    else:  # the flag's own conversion of the word given; argparse applies it to a string default
        if not isinstance(value, str):
            raise ValueError(f"{flag} must be a string, got {value!r}")
        try:
            converted = cast("Callable[[str], Any]", action.type)(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise ValueError(f"{flag} {value!r}: {exc}") from None
        if action.choices is not None and converted not in action.choices:
            raise ValueError(f"{flag} {value!r} is unknown: choose one of {', '.join(map(str, action.choices))}")
        return value
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{flag} {value!r} is unknown: choose one of {', '.join(map(str, action.choices))}")
    return value


def _check_place(path: str | Path, key: str, section: str | None, known: set[str]) -> None:
    """Refuse a key no command has, or one outside its own section (``section`` None: the top level)."""
    where = "at the top level" if section is None else f"in [{section}]"
    if key not in known:
        inside = [k for k in SECTIONS.get(section or "", ()) if k in known]
        near = difflib.get_close_matches(key, sorted(known), n=1)
        if near:
            there = _section(near[0])
            fix = f"did you mean {near[0]!r}{'' if there == section else f' in [{there}]'}?"
        elif inside:
            fix = f"its keys are {', '.join(inside)}"
        else:
            fix = f"keys go in the sections {', '.join(SECTIONS)}"
        raise ValueError(f"--config {path}: unknown key {key!r} {where}; {fix}")
    own = _section(key)
    if section != own:
        raise ValueError(f"--config {path}: {key!r} belongs in [{own}], not {where.removeprefix('in ')}")


def _refuse_old_sections(path: str | Path, data: dict[str, Any], known: set[str]) -> None:
    old = [name for name in OLD_SECTIONS if isinstance(data.get(name), dict)]
    if not old:
        return
    keys = [key for name in old for key in data[name] if key in known]
    moves = "; ".join(
        f"{_and([k for k in keys if SECTION_OF[k] == section])} in [{section}]"
        for section in SECTIONS
        if any(SECTION_OF[k] == section for k in keys)
    )
    sections = _and([f"[{name}]" for name in old])
    said = "is no longer a section" if len(old) == 1 else "are no longer sections"
    where = f"put {moves}" if moves else f"keys go in the sections {', '.join(SECTIONS)}"
    raise ValueError(f"--config {path}: {sections} {said}: {where}")


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _section(key: str) -> str:
    try:
        return SECTION_OF[key]
    except KeyError:
        raise LookupError(f"the flag of {key!r} has no section: add it to SECTIONS in {__name__}") from None


def apply_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Make the values of ``argv``'s ``--config`` file the defaults of its command's flags (so that a flag
    given overrides it; a required flag the file gives is required no more). Nothing without ``--config``.

    A flag given replaces the file's value whole: a repeatable flag's list (argparse would append to the
    file's), and every flag of its group of exclusive flags (``--device-budget-fraction`` given replaces the file's
    ``slack_microbatches``).

    Raises:
        ValueError: as :func:`read_config`.
    """
    path = _config_path(argv)
    name = _command_name(parser, argv)
    if path is None or name is None or name not in config_commands(parser):
        return
    command = config_commands(parser)[name]
    values = read_config(path, parser, name)
    given = _given(command, argv)
    for group in command._mutually_exclusive_groups:
        if any(action.dest in given for action in group._group_actions):
            given |= {action.dest for action in group._group_actions}
    for key, action in config_keys(command).items():
        if key in values and key not in given:
            action.default = values[key]
            action.required = False


def config_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The run ``args`` holds (every key of its command, a command of ``hintpipe``'s ``parser``), as a TOML file
    for ``--config``: in :data:`SECTIONS`'s order, values that are None left out."""
    import tomli_w

    keys = config_keys(config_commands(parser)[args.command])
    for key in keys:
        _section(key)  # every key has its place
    sections: dict[str, dict[str, Any]] = {}
    for section, names in SECTIONS.items():
        for key in names:
            value = getattr(args, key, None) if key in keys else None
            if value is not None:
                sections.setdefault(section, {})[key] = _plain(value)
    return tomli_w.dumps(sections)


def _plain(value: Any) -> Any:
    """A value as TOML writes it: enums as their strings, tuples as arrays."""
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


def _command_name(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    subparsers = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if subparsers is None:
        return None
    return next((word for word in argv if word in subparsers.choices), None)


def _given(command: argparse.ArgumentParser, argv: Iterable[str]) -> set[str]:
    """The keys whose flags ``argv`` gives (a unique prefix of a flag counts, as argparse takes it)."""
    flags = {flag: action.dest for action in command._actions for flag in action.option_strings}
    given = set()
    for word in argv:
        if not word.startswith("--"):
            continue
        word = word.split("=", 1)[0]
        matches = [flag for flag in flags if flag == word] or [flag for flag in flags if flag.startswith(word)]
        if len(matches) == 1:
            given.add(flags[matches[0]])
    return given
