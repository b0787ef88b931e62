"""A progress bar over training steps, on rank 0's terminal."""

from __future__ import annotations

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
