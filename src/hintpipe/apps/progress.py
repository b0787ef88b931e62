"""A progress bar over training steps, on rank 0's terminal."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(steps: int) -> Progress | None:
    """A progress bar over steps on rank 0's stderr, when that is a terminal."""
    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    bar = Progress(
        TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    )
    bar.add_task("steps", total=steps)
    bar.start()
    return bar


def log_line(bar: Progress | None, text: str) -> None:
    """``text`` on rank 0's stderr as a line of its own: above the progress bar while one is shown (rich
    redraws the bar below it), else plainly, so a pipe or a log file gets one line per call and stdout stays
    free for ``--json``."""
    if bar is not None:
        bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        print(text, file=sys.stderr, flush=True)
