"""What rank 0 shows while a run trains: a progress bar on a terminal, else a line every few steps; both with
the time left.

A run whose stderr is a pipe or a log file (a batch job, ``tee``) gets no bar: rich draws none there. It gets
lines instead, ``step 20/100: loss ..., ETA 0:01:04``, every ``log_every`` steps, or by default every tenth of
the run (:func:`line_every`), so that a job's log says how far it got and when it will end.
"""

from __future__ import annotations

import datetime
import math
import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: Lines a run without a terminal prints by default over its steps (``log_every`` 0).
DEFAULT_LINES = 10


def progress_bar(steps: int) -> Progress | None:
    """A progress bar over steps on rank 0's stderr, with the time left, when that is a terminal."""
    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    bar = Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    bar.add_task("steps", total=steps)
    bar.start()
    return bar


def line_every(log_every: int, steps: int, *, shown: bool, bar: Progress | None) -> int:
    """Every how many steps rank 0 prints a step line (0: never): ``log_every`` when given; else, when
    progress is shown and no bar can be (stderr is not a terminal), a tenth of the run's ``steps``."""
    if log_every:
        return log_every
    if shown and bar is None:
        return max(1, math.ceil(steps / DEFAULT_LINES))
    return 0


def eta(elapsed: float, done: int, left: int) -> str:
    """The time left, ``H:MM:SS``, for ``left`` more steps at the mean of the ``done`` ones (``elapsed``
    seconds, every step's whole time: optimizer, evaluation and checkpoints included)."""
    seconds = elapsed / done * left if done else 0.0
    return str(datetime.timedelta(seconds=round(seconds)))


def log_line(bar: Progress | None, text: str) -> None:
    """``text`` on rank 0's stderr as a line of its own: above the progress bar while one is shown (rich
    redraws the bar below it), else plainly, so a pipe or a log file gets one line per call and stdout stays
    free for ``--json``."""
    if bar is not None:
        bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        print(text, file=sys.stderr, flush=True)
