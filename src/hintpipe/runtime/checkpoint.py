"""Checkpoints: each rank saves its own stages, written atomically.

torch.distributed.checkpoint (DCP) writes every rank's share in parallel. The
state of a rank is its stages' parameters (named ``<stage>.<parameter>``, so
keys never collide between ranks) and, under ``rank<r>``, its optimizer state
(through DCP's ``get_state_dict``, which names optimizer entries by
parameter), the step counter and its RNG state.

[Note: atomic checkpoints]
A checkpoint is written into ``step-<n>.tmp`` and renamed to ``step-<n>`` by
rank 0 only after every rank finished writing (a barrier); then ``latest`` is
replaced atomically (``os.replace`` of a file written beside it). A crash at
any point leaves ``latest`` naming the previous complete checkpoint, and a
``.tmp`` folder that the next save cleans up. Older checkpoints beyond
``keep`` are removed after the new one is in place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

LATEST = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not match the run."""


def _container(modules: dict[int, nn.Module]) -> nn.ModuleDict:
    return nn.ModuleDict({str(stage): module for stage, module in modules.items()})


def _state(
    modules: dict[int, nn.Module], optimizer: torch.optim.Optimizer | None, step: int, rank: int
) -> dict[str, Any]:
    container = _container(modules)
    if optimizer is not None:
        model_state, optim_state = get_state_dict(container, optimizer)
    else:
        model_state, optim_state = container.state_dict(), {}
    # Parameters are keyed by stage, so every rank's names are its own. The
    # optimizer's param_groups are a list whose index would collide between
    # ranks, so all of a rank's private state lives under its rank.
    return {
        "model": model_state,
        f"rank{rank}": {"optim": optim_state, "step": torch.tensor(step), "rng": torch.get_rng_state()},
    }


def save_checkpoint(
    directory: str | Path,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    group: dist.ProcessGroup | None = None,
    keep: int = 2,
) -> Path:
    """Save this rank's share of step ``step`` (call on every rank); returns the checkpoint folder."""
    root = Path(directory)
    rank = dist.get_rank(group)
    final = root / f"step-{step:08d}"
    tmp = root / f"step-{step:08d}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    dist.barrier(group=group)
    dcp_save(_state(modules, optimizer, step, rank), checkpoint_id=str(tmp), process_group=group)
    dist.barrier(group=group)
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = root / (LATEST + ".tmp")
        pointer.write_text(final.name)
        os.replace(pointer, root / LATEST)
        for old in sorted(p for p in root.glob("step-*") if p.is_dir() and p.suffix != ".tmp")[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob("step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
    dist.barrier(group=group)
    return final


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None."""
    pointer = Path(directory) / LATEST
    if not pointer.exists():
        return None
    path = Path(directory) / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


def load_checkpoint(
    path: str | Path,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    *,
    group: dist.ProcessGroup | None = None,
) -> int:
    """Restore this rank's share (call on every rank); returns the step the checkpoint ended.

    Raises:
        CheckpointError: if the checkpoint does not hold this rank's stages.
    """
    rank = dist.get_rank(group)
    state = _state(modules, optimizer, 0, rank)
    try:
        dcp_load(state, checkpoint_id=str(path), process_group=group)
    except Exception as exc:
        raise CheckpointError(
            f"rank {rank}: cannot load {path} for stages {sorted(modules)}: {exc}; resume with the same "
            "model, stage count and hint the checkpoint was written with"
        ) from exc
    container = _container(modules)
    own = state[f"rank{rank}"]
    if optimizer is not None:
        set_state_dict(container, optimizer, model_state_dict=state["model"], optim_state_dict=own["optim"])
    else:
        container.load_state_dict(state["model"])
    torch.set_rng_state(own["rng"])
    return int(own["step"])


def load_merged(path: str | Path) -> dict[str, torch.Tensor]:
    """All stages' parameters as one state dict, in one process (for evaluation):
    keys are ``<stage>.<parameter>``."""
    target = Path(path) / "merged.pt.tmp"
    dcp_to_torch_save(str(path), str(target))
    try:
        state = torch.load(target, weights_only=False)
    finally:
        target.unlink(missing_ok=True)
    model = state["model"]
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
