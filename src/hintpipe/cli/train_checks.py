"""``hintpipe train``'s checks before any rank starts: flag combinations, the device, the checkpoint folder
and whether a step fits in the machine's memory, each refused in one line naming the flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from hintpipe.apps.model_config import ModelConfig
from hintpipe.cli.common import check_writable
from hintpipe.units import format_size

if TYPE_CHECKING:
    from hintpipe.apps.training import TrainConfig


def available_memory() -> float | None:
    """Bytes of memory this machine has available now (``MemAvailable``), or None where it cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_model_memory(model: ModelConfig, parameters: int, world: int) -> None:
    """Refuse a built-in model that its ranks could not build in this machine's available memory: every rank
    builds the whole list of layers (the same weights from the seed) before it keeps its stages, in float32."""
    available = available_memory()
    needed = 4.0 * parameters * world
    if available is None or needed <= available:
        return
    raise ValueError(
        f"--model {model.label} of --layers {model.layers} --hidden {model.hidden} has {parameters:,} parameters "
        f"({format_size(4.0 * parameters)} in float32); each of the {world} ranks builds it whole: about "
        f"{format_size(needed)}, over the {format_size(available)} this machine has available; use a smaller model"
    )


def check_memory(microbatches: int, size: int, ranks: int, length: float) -> None:
    """Refuse a step whose data alone would take over half of the memory the machine has available (``size``
    rows per micro-batch, ``length`` tokens or features per row): a run that would swap for minutes, and then
    not stop on a signal until its step ends."""
    available = available_memory()
    if available is None:
        return
    data = 2 * 8 * microbatches * size * (length + 1)  # inputs and targets, 64-bit ids or floats
    bookkeeping = 2_000 * 3 * microbatches * ranks  # a task's records, messages and reports
    if data + bookkeeping > available / 2:
        raise ValueError(
            f"--microbatches {microbatches} x --microbatch-size {size} x {length} tokens: a step's data and "
            f"bookkeeping take about {format_size(data + bookkeeping)}, over half of the {format_size(available)} "
            "this machine has available; use fewer or smaller micro-batches"
        )


def check_checkpoint_folder(config: TrainConfig) -> None:
    """The checkpoint folder, before any rank starts: writable (its parent exists), and for a fresh run free of
    another run's checkpoints unless they are to be replaced."""
    from hintpipe.runtime.checkpoint.manifest import step_folders
    from hintpipe.runtime.checkpoint.run_folder import (
        another_run,
        check_layout,
        check_not_foreign,
        check_writable,
        read_run,
    )
    from hintpipe.runtime.errors import CheckpointError

    assert config.checkpoint.folder is not None
    folder = Path(config.checkpoint.folder)
    check_writable(folder)
    try:
        check_layout(folder)
        check_not_foreign(folder)
        owner = read_run(folder)
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    found = step_folders(folder)
    if not config.checkpoint.resume and not config.checkpoint.replace and found and owner is not None:
        raise ValueError(f"--checkpoint-dir {another_run(folder, found)}")


def check_output_files(args: argparse.Namespace) -> None:
    """Refuse output files that cannot be written, before any rank starts."""
    for option in ("trace", "timeline"):
        if getattr(args, option, None):
            check_writable(getattr(args, option), f"--{option}")
