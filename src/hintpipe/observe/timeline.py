"""Timelines as PNG Gantt charts (matplotlib).

One row per rank, one box per task: forward blue, backward green, weight
gradient purple; a box wide enough carries its micro-batch number.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hintpipe.observe.trace import Record
from hintpipe.schedule.task import Kind

_COLOURS = {Kind.F: "#4C72B0", Kind.B: "#55A868", Kind.W: "#8172B2"}


def plot_timelines(
    panels: Sequence[tuple[str, Sequence[Record]]],
    path: str | Path,
    *,
    unit: str = "time",
) -> None:
    """Draw one Gantt panel per ``(title, records)`` and save a PNG to ``path``.

    Panels share the time axis, so policies can be compared by eye.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = max((r for _, recs in panels for r, *_ in recs), default=0) + 1
    horizon = max((end for _, recs in panels for *_, end in recs), default=1.0)
    height = 0.6 + 0.32 * ranks
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, height * len(panels) + 0.6), sharex=True, squeeze=False)
    for ax, (title, records) in zip(axes[:, 0], panels, strict=True):
        for rank, task, start, end in records:
            ax.broken_barh(
                [(start, end - start)],
                (rank - 0.4, 0.8),
                facecolors=_COLOURS[task.kind],
                edgecolors="white",
                linewidth=0.4,
            )
            if (end - start) / horizon > 0.012 and ranks <= 32:
                ax.text((start + end) / 2, rank, str(task.mb), ha="center", va="center", fontsize=6, color="white")
        ax.set_ylim(ranks - 0.5, -0.5)
        ax.set_yticks(range(ranks) if ranks <= 32 else range(0, ranks, max(1, ranks // 16)))
        ax.set_ylabel("rank")
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlim(0, horizon * 1.01)
    axes[-1, 0].set_xlabel(unit)
    handles = [
        Patch(color=c, label={Kind.F: "forward", Kind.B: "backward", Kind.W: "weight grad"}[k])
        for k, c in _COLOURS.items()
    ]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
