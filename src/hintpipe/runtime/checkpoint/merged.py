"""The whole model out of a checkpoint, in one process: for ``load_state_dict`` on the unsplit model, or for
``hintpipe export``.

A checkpoint is every rank's share of the stages, saved by the model's names (see
:mod:`~hintpipe.runtime.checkpoint.saving`); reading it back whole needs no process group and no pipeline, only
its manifest (which names each tensor the stages share under every one of its names) and its files, verified.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hintpipe.runtime.checkpoint.manifest import MANIFEST, Manifest, step_folders
from hintpipe.runtime.checkpoint.readers import reading
from hintpipe.runtime.checkpoint.run_folder import LATEST
from hintpipe.runtime.checkpoint.saving import find_checkpoint
from hintpipe.runtime.model_names import ModelNames

__all__ = ["held_checkpoint", "load_merged", "read_merged", "resolve_checkpoint"]


def load_merged(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole model's parameters and buffers from a checkpoint, in one process, by the model's names (a tied
    tensor under each of its names), ready for ``model.load_state_dict(state, strict=True)`` on the unsplit
    model. ``path`` is a checkpoint (``step-N``) or a checkpoint folder (its newest verified checkpoint); a
    run saving into the folder meanwhile does not prune it while it is read (:func:`held_checkpoint`).

    Raises:
        DamagedCheckpoint: if the checkpoint does not verify.
        UnsafeCheckpoint: its files would run code when read (see [Note: nothing from disk runs code]).
        CheckpointError: a folder with no usable checkpoint.
    """
    with held_checkpoint(path) as (folder, manifest):
        return read_merged(folder, manifest)


@contextlib.contextmanager
def held_checkpoint(path: str | Path) -> Iterator[tuple[Path, Manifest]]:
    """:func:`resolve_checkpoint`, the checkpoint held against pruning until the block ends: read it there (see
    [Note: a reader's hold on a checkpoint] in :mod:`hintpipe.runtime.checkpoint.readers`).

    Raises:
        as :func:`resolve_checkpoint`.
    """
    with contextlib.ExitStack() as holds:
        yield resolve_checkpoint(path, holds=holds)


def resolve_checkpoint(path: str | Path, *, holds: contextlib.ExitStack | None = None) -> tuple[Path, Manifest]:
    """The checkpoint ``path`` names (a ``step-N`` folder; a checkpoint folder or its ``latest``: the folder's
    newest verified checkpoint) and its manifest, every file verified. ``holds``: the checkpoint is held
    against pruning, from before it is verified until ``holds`` closes (:func:`held_checkpoint`).

    Raises:
        DamagedCheckpoint: if the checkpoint does not verify.
        CheckpointError: a folder with no usable checkpoint.
    """
    folder = Path(path)
    if folder.name == LATEST and folder.is_file():
        folder = folder.parent
    if not (folder / MANIFEST).exists() and folder.is_dir() and step_folders(folder):
        found, _ = find_checkpoint(folder, holds=holds)
        assert found is not None  # find_checkpoint raises when none verifies
        folder = found
    elif holds is not None:
        holds.enter_context(reading(folder))  # gone: its manifest's absence says so below
    manifest = Manifest.read(folder)
    manifest.verify(folder)
    return folder, manifest


def read_merged(folder: Path, manifest: Manifest) -> dict[str, torch.Tensor]:
    """:func:`load_merged` of a checkpoint :func:`resolve_checkpoint` found (its files are not hashed again).

    Raises:
        UnsafeCheckpoint: its files would run code when read (see [Note: nothing from disk runs code]).
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from hintpipe.runtime.checkpoint.reading import SafeEmptyPlanner, SafeReader, read_metadata, refusals_said

    state: dict[str, Any] = {}
    # What torch's dcp_to_torch_save does, with its reader and planner made safe: tensors and plain values only,
    # a file runs no code (see [Note: nothing from disk runs code]).
    read_metadata(folder)  # refused here in its own words, before torch's loader wraps them
    with refusals_said():
        _load_state_dict(state, storage_reader=SafeReader(str(folder)), planner=SafeEmptyPlanner(), no_dist=True)
    model = {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    identity = manifest.identity
    names = ModelNames(keys=tuple(identity.keys), aliases=tuple(tuple(g) for g in identity.aliases))
    return names.expand(model)
