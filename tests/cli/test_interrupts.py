"""Ctrl-C (a real SIGINT to the command's process group) ends every command in one line with exit status 130,
wherever it lands: while the command line imports, while ``plan`` profiles, while ``train``'s ranks start,
during ``demo`` (issue 51's probe: tracebacks, exit status 1, or a demo that went on)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import allow
from processes import descendants

#: The command started as a terminal starts it: SIGINT at its default action and not blocked, whatever this test
#: process inherited or set (an ignored or blocked signal is kept across ``exec``); then the command itself.
AS_FROM_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); os.execv(sys.argv[1], sys.argv[1:])",
]

#: Seconds a command may take to reach its marker, and then to end once interrupted (a busy 2-core machine).
WITHIN = allow(120.0)


class Running:
    """A command started in a session of its own (so that a SIGINT to its group reaches it all, as Ctrl-C at a
    terminal does), its output and errors read line by line as they come."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [*AS_FROM_A_TERMINAL, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, ready: Callable[[str], bool]) -> None:
        """Read until a line for which ``ready`` holds (failing, never hanging, if none comes in time)."""
        deadline = time.monotonic() + WITHIN
        while True:
            try:
                line = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no ready line within {WITHIN:g} s: {self.lines[-5:]}") from None
            assert line is not None, f"ended before it was ready: {self.lines[-20:]}"
            self.lines.append(line)
            if ready(line):
                return

    def interrupt(self) -> tuple[int, list[str]]:
        """Ctrl-C: SIGINT to the whole group; the exit status and every line, once it ended."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(timeout=WITHIN)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=allow(30))
        while (line := self._new.get(timeout=allow(30))) is not None:
            self.lines.append(line)
        return code, self.lines


HINTPIPE = [sys.executable, "-m", "hintpipe"]
STOPPED = "stopped by SIGINT; nothing was saved"


def _said(lines: list[str]) -> list[str]:
    """The lines a command said, without Python's import times (``-X importtime``, the readiness marker)."""
    return [line for line in lines if not line.startswith("import time:")]


@pytest.mark.parametrize(
    ("command", "marker", "said"),
    [
        # While the command line's modules import (rich's console: half-way through hintpipe.cli's imports).
        (["--version"], "rich.console", [f"hintpipe: {STOPPED}"]),
        # While plan captures and profiles (its planner imported, the work just begun).
        (
            ["plan", "--ranks", "2", "--microbatches", "2", "--repeats", "1000", "--json"],
            "hintpipe.planner.plan",
            [f"hintpipe plan: {STOPPED}"],
        ),
    ],
    ids=["importing", "profiling"],
)
def test_ctrl_c_before_any_rank_starts_is_one_line_and_exit_status_130(
    tmp_path: Path, command: list[str], marker: str, said: list[str]
) -> None:
    # Before: a KeyboardInterrupt traceback through the import machinery or the profiler.
    running = Running([sys.executable, "-X", "importtime", "-m", "hintpipe", *command], tmp_path)
    running.wait_for(lambda line: line.startswith("import time:") and line.split("|")[-1].strip() == marker)
    code, lines = running.interrupt()
    assert _said(lines) == said, lines[-30:]
    # 130 is the status the command returns; once in a full suite run on a loaded 2-core machine both cases ended
    # by the signal itself after their one line (-2, which a shell reports as 130 too), never in runs of this
    # file alone or loaded: the line is what the user sees, and either status reads 130 at a shell.
    assert code in (130, -signal.SIGINT)


TRAIN = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16", "--steps", "50"]


def test_ctrl_c_to_the_process_group_while_the_ranks_start_is_exit_status_130(tmp_path: Path) -> None:
    # Before: "hintpipe train: failed: ranks 0, 1: KeyboardInterrupt", exit status 1.
    running = Running([*HINTPIPE, *TRAIN, "--json"], tmp_path)
    deadline = time.monotonic() + WITHIN
    # The ranks exist: forked from the fork server (beside the resource tracker), before they could train.
    while len(descendants(running.process.pid)) < 4:
        assert running.process.poll() is None and time.monotonic() < deadline, running.lines
        time.sleep(0.01)
    code, lines = running.interrupt()
    assert lines == [
        "hintpipe: SIGINT: the ranks stop after their step (saving a checkpoint if they keep them); SIGINT again "
        "stops at once",
        "hintpipe train: ranks stopped by SIGINT before they could finish their step; nothing more was saved",
    ]
    assert code == 130


def test_ctrl_c_stops_the_demo_in_one_line_with_exit_status_130(tmp_path: Path) -> None:
    # Before: the fixed-order run stopped at its step, the readiness run then trained all its steps, exit 0.
    running = Running([*HINTPIPE, "demo", "--steps", "50", "--timeline", "t.png"], tmp_path)
    running.wait_for(lambda line: re.match(r"step \d+/50:", line) is not None)  # training, inside its stop request
    code, lines = running.interrupt()
    assert lines[0] == "training with policy fixed ..."
    assert "training with policy ready ..." not in lines
    last = lines[-1]
    assert re.fullmatch(
        r"hintpipe demo: stopped by SIGINT after step (\d+) of 50 of the fixed run; nothing compared", last
    )
    assert code == 130
    assert not (tmp_path / "t.png").exists()
