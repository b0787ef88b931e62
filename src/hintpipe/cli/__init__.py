"""The ``hintpipe`` command line: ``simulate``, ``train``, ``plan``, ``export``, ``demo``, ``data``.

Every command prints a readable table by default and one JSON object with
``--json``. Errors in the user's input end the command with exit status 2 and
one line that says what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import os
import platform
import signal
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from hintpipe.cli import data, demo, export, plan, simulate, train
from hintpipe.cli.config_file import apply_config, config_text
from hintpipe.runtime.errors import Interrupted, RankFailure


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"hintpipe: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hintpipe",
        description="Readiness-driven pipeline-parallel training: simulate schedules, train, plan, export.",
    )
    parser.add_argument("--version", action="version", version=version_line(), help="print the versions and exit")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    simulate.register(commands)
    train.register(commands)
    plan.register(commands)
    export.register(commands)
    demo.register(commands)
    data.register(commands)
    return parser


def version_line() -> str:
    """hintpipe's version and the torch it would run with (the installed one, read without importing torch:
    ``hintpipe simulate`` runs without it), for bug reports and to check an install."""
    return f"hintpipe {_installed('hintpipe')} (torch {_installed('torch')}, Python {platform.python_version()})"


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(words)
    except KeyboardInterrupt:  # Ctrl-C before any rank started (importing, planning, profiling, preparing)
        return interrupted(words[0] if words and words[0] in COMMANDS else None)


#: The commands, by name.
COMMANDS = ("simulate", "train", "plan", "export", "demo", "data")


def interrupted(command: str | None) -> int:
    """Ctrl-C (SIGINT) where the command was not handling it: one line, exit status 130, no traceback.

    [Note: Ctrl-C is one line]
    Python answers SIGINT with a ``KeyboardInterrupt`` wherever the main thread is: an import, ``plan``'s
    profiling, a data preparation; uncaught, it printed a traceback of the interpreter's innards. Once ranks
    run, the launcher handles the signal (see [Note: signals to the launcher] in
    :mod:`hintpipe.runtime.launch`); before that, the command stops here, having saved nothing."""
    print(f"hintpipe{'' if command is None else ' ' + command}: stopped by SIGINT; nothing was saved", file=sys.stderr)
    return 128 + signal.SIGINT


def _warning_line(
    command: str, message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """A warning of hintpipe's own (an ``EvalModeWarning``, a ``ParameterWriteWarning``) as the command's line:
    ``hintpipe train: EvalModeWarning: ...``, not Python's two lines of a file, a line number and a source line
    that mean nothing to the command's user; another library's warning as Python writes it."""
    if category.__module__.startswith("hintpipe"):
        return f"hintpipe {command}: {category.__name__}: {message}\n"
    return _PYTHONS_WARNING_LINE(message, category, filename, lineno, line)


#: Python's own way of writing a warning.
_PYTHONS_WARNING_LINE = warnings.formatwarning


def _main(words: list[str]) -> int:
    parser = build_parser()
    try:
        apply_config(parser, words)
    except ValueError as exc:
        print(f"hintpipe: error: {exc}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "print_config", False):
        print(config_text(parser, args), end="")
        return 0
    with _warnings_as_lines(args.command):
        return _run(args)


@contextlib.contextmanager
def _warnings_as_lines(command: str) -> Iterator[None]:
    """Within: hintpipe's own warnings written as the command's lines (:func:`_warning_line`)."""
    before = warnings.formatwarning
    warnings.formatwarning = functools.partial(_warning_line, command)
    try:
        yield
    finally:
        warnings.formatwarning = before


def _run(args: argparse.Namespace) -> int:
    try:
        code: int = args.run(args)
    except ValueError as exc:
        said = f"hintpipe {args.command}: error: {exc}"
        print(said, file=sys.stderr)
        tell_torchrun(said)
        return 2
    except MemoryError:  # numpy's or the interpreter's: the sizes asked for do not fit this process's memory
        sizes = " ".join(f"--{k} {getattr(args, k)}" for k in ("ranks", "microbatches") if hasattr(args, k))
        print(
            f"hintpipe {args.command}: error: {sizes or 'this run'} does not fit in this process's memory; use fewer "
            "ranks or micro-batches",
            file=sys.stderr,
        )
        return 2
    except Interrupted as exc:
        print(f"hintpipe {args.command}: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except RankFailure as exc:
        text = str(exc)
        tell_torchrun(f"hintpipe {args.command}: failed: {text}")
        print(f"hintpipe {args.command}: failed:{' ' if chr(10) not in text else chr(10)}{text}", file=sys.stderr)
        return 1
    return code


def tell_torchrun(line: str) -> None:
    """Under ``torchrun``, leave ``line`` where its agent reads a failed rank's error
    (``TORCHELASTIC_ERROR_FILE``): torchrun's report then shows it as the rank's failure (and as the root
    cause when this rank failed first) instead of "To enable traceback see ..."; nothing elsewhere."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    with contextlib.suppress(OSError):  # the report is torchrun's: nothing here may fail because of it
        said = {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}
        Path(path).write_text(json.dumps({"message": said}))  # the form torchrun's own @record writes


if __name__ == "__main__":
    sys.exit(main())
