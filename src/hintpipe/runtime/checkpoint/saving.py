"""Checkpoints: each rank saves its own stages; a checkpoint is verified before it is trusted.

torch.distributed.checkpoint (DCP) writes every rank's share in parallel. The
state of a rank is its stages' parameters (named ``<stage>.<parameter>``, so
keys never collide between ranks) and, under ``rank<r>``, its optimizer state
(through DCP's ``get_state_dict``, which names optimizer entries by
parameter), the step counter and its RNG state.

[Note: atomic checkpoints]
A save checks that every parameter and optimizer tensor is finite (a NaN saved
is a run lost), writes into ``step-<n>.tmp``, syncs every file, and lets rank 0
write ``manifest.json`` last (the run's identity and each file's digest, see
:mod:`hintpipe.runtime.checkpoint.manifest`) and rename the folder to ``step-<n>``; then
``latest`` is replaced atomically. A crash at any point leaves the previous
checkpoints as they were and a ``.tmp`` folder that the next save removes.
Each phase ends with every rank learning every other rank's outcome
(:func:`hintpipe.runtime.checkpoint.collective.together`), so a rank whose disk is full
stops the others at once instead of leaving them in a barrier.

[Note: which checkpoint a resume uses]
The newest folder whose manifest verifies (every file present, of its size and
digest). A damaged one is skipped, saying so, and the next older one is tried;
``latest`` is only a pointer for people and tools. A checkpoint of *another*
run (other tensors, stage count or placement) is refused, never skipped.
Pruning (:func:`prune_checkpoints`) deletes old checkpoints only after the
newest has been verified again and a step after it has completed.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeAlias

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hintpipe.runtime.checkpoint.collective import together
from hintpipe.runtime.checkpoint.liveness import phase_group
from hintpipe.runtime.checkpoint.manifest import (
    CheckpointError,
    DamagedCheckpoint,
    Manifest,
    RunIdentity,
    digests,
    step_folders,
    sync_file,
    sync_folder,
    write_synced,
)
from hintpipe.runtime.checkpoint.run_folder import LATEST
from hintpipe.tensor_bytes import local

__all__ = [
    "CheckpointError",
    "DamagedCheckpoint",
    "find_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "load_merged",
    "prune_checkpoints",
    "resume",
    "run_identity",
    "save_checkpoint",
]

#: Makes torch.distributed.checkpoint's writer for a checkpoint folder.
WriterFactory: TypeAlias = Callable[[str], FileSystemWriter]
log = logging.getLogger(__name__)


def _container(modules: Mapping[int, nn.Module]) -> nn.ModuleDict:
    return nn.ModuleDict({str(stage): module for stage, module in modules.items()})


def _state(
    modules: Mapping[int, nn.Module], optimizer: torch.optim.Optimizer | None, step: int, rank: int
) -> dict[str, Any]:
    container = _container(modules)
    if optimizer is not None:
        model_state, optim_state = get_state_dict(container, optimizer)
    else:
        model_state, optim_state = container.state_dict(), {}
    # Parameters are keyed by stage, so every pipeline position's names are its
    # own; the copies of a stage in data-parallel replicas, and the shards of a
    # DTensor (FSDP2 over dp, tensor parallel over tp), share their keys, which
    # is how torch.distributed.checkpoint saves a replicated tensor once and puts
    # a sharded one together. The optimizer's param_groups are a list whose
    # index would collide between pipeline positions, so the optimizer state
    # lives under the stages it belongs to; the step and the random state, which
    # may differ between replicas, under the rank.
    return {
        "model": model_state,
        _optim_key(modules): optim_state,
        f"rank{rank}": {"step": torch.tensor(step), "rng": torch.get_rng_state()},
    }


def _optim_key(modules: Mapping[int, nn.Module]) -> str:
    return "optim-stages-" + "-".join(str(s) for s in sorted(modules))


def _versions() -> dict[str, str]:
    try:
        own = version("hintpipe")
    except PackageNotFoundError:  # running from a source tree
        own = "unknown"
    return {"hintpipe": own, "torch": torch.__version__}


def run_identity(
    modules: Mapping[int, nn.Module], *, hint: str = "", group: dist.ProcessGroup | None = None, run: str = ""
) -> RunIdentity:
    """What this run's checkpoints belong to (call on every rank): the run, every rank's stage tensors and
    their placement."""
    group = group if group is not None else phase_group()
    own = {f"{s}.{n}": list(t.shape) for s, m in modules.items() for n, t in m.state_dict().items()}
    stages = sorted(modules)
    shares = together(lambda: (own, stages), "comparing the ranks' stages", group=group, error=CheckpointError)
    stage_rank: dict[int, int] = {s: rank for rank, (_, held) in enumerate(shares) for s in held}
    placement = [stage_rank.get(s, -1) for s in range(max(stage_rank, default=-1) + 1)]
    tensors = {name: shape for share, _ in shares for name, shape in share.items()}
    return RunIdentity(tensors=tensors, stage_ranks=placement, hint=hint, versions=_versions(), run=run)


def _first_nonfinite(modules: Mapping[int, nn.Module], optimizer: torch.optim.Optimizer | None) -> str | None:
    for stage, module in modules.items():
        for name, tensor in module.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(local(tensor)).all()):
                return f"parameter {stage}.{name}"
    if optimizer is not None:
        names = {id(p): f"{s}.{n}" for s, m in modules.items() for n, p in m.named_parameters()}
        for param, slots in optimizer.state.items():
            for slot, value in slots.items():
                finite = not isinstance(value, torch.Tensor) or bool(torch.isfinite(local(value)).all())
                if not finite:
                    return f"optimizer state {slot!r} of {names.get(id(param), 'a parameter')}"
    return None


def save_checkpoint(
    directory: str | Path,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    hint: str = "",
    group: dist.ProcessGroup | None = None,
    storage_writer: WriterFactory = FileSystemWriter,
    run: str = "",
) -> Path:
    """Save this rank's share of step ``step`` of run ``run`` (call on every rank); returns the checkpoint folder.

    ``storage_writer`` makes torch.distributed.checkpoint's writer for a folder: its
    :class:`~torch.distributed.checkpoint.FileSystemWriter` by default (the manifest's digests and the
    atomic rename need files). Old checkpoints are not removed here: see :func:`prune_checkpoints`.

    Raises:
        CheckpointError: on every rank, one line naming the rank that failed and why.
    """
    group = group if group is not None else phase_group()
    root = Path(directory)
    rank = dist.get_rank(group)
    final = root / f"step-{step:08d}"
    tmp = root / f"step-{step:08d}.tmp"
    what = f"saving checkpoint step {step} in {root}"
    identity = run_identity(modules, hint=hint, group=group, run=run)

    def prepare() -> None:
        bad = _first_nonfinite(modules, optimizer)
        if bad is not None:
            raise CheckpointError(f"{bad} is not finite; nothing was saved, the earlier checkpoints are kept")
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob("step-*.tmp"):
                shutil.rmtree(stale)

    together(prepare, what, group=group, error=CheckpointError)
    try:
        return _write(modules, optimizer, step, rank, identity, tmp, final, what, group, storage_writer)
    except CheckpointError:
        if rank == 0:  # every rank has left the failed phase: nothing writes there any more
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk gets its space back
        raise


def _write(
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    step: int,
    rank: int,
    identity: RunIdentity,
    tmp: Path,
    final: Path,
    what: str,
    group: dist.ProcessGroup | None,
    storage_writer: WriterFactory,
) -> Path:
    """Write the checkpoint into ``tmp``, vouch for its files and rename it to ``final`` (rank 0)."""
    root = final.parent
    state = _state(modules, optimizer, step, rank)
    together(
        lambda: dcp_save(state, storage_writer=storage_writer(str(tmp)), process_group=group),
        what,
        group=group,
        error=CheckpointError,
    )

    def own_files() -> dict[str, tuple[int, str]]:
        # Each rank vouches for the files it wrote (``__<rank>_<i>.distcp``); rank 0 also for the rest.
        mine = [p for p in tmp.iterdir() if p.name.startswith(f"__{rank}_")]
        if rank == 0:
            mine += [p for p in tmp.iterdir() if p.is_file() and not p.name.startswith("__")]
        for path in mine:
            sync_file(path)
        return digests(mine, tmp)

    files = {k: v for share in together(own_files, what, group=group, error=CheckpointError) for k, v in share.items()}

    def finish() -> None:
        if rank != 0:
            return
        Manifest(step, identity, files).write(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
        sync_folder(root)
        write_synced(root / LATEST, final.name)

    together(finish, what, group=group, error=CheckpointError)
    return final


def prune_checkpoints(directory: str | Path, keep: int = 2, run: str | None = None) -> list[Path]:
    """Keep the ``keep`` newest checkpoints that verify; remove older ones and damaged ones older than the
    newest that verifies. Returns what was removed.

    Call on rank 0, after a step completed past the newest checkpoint. Nothing
    is removed while the newest checkpoint is damaged: the older ones are then
    all there is. With ``run``, only that run's checkpoints are looked at (a
    folder's run owns every checkpoint in it; see :mod:`hintpipe.runtime.checkpoint.run_folder`).
    """
    folders = step_folders(Path(directory))
    kept: list[Path] = []
    removed: list[Path] = []
    for folder in folders:
        try:
            manifest = Manifest.read(folder)
            manifest.verify(folder)
        except DamagedCheckpoint as exc:
            if not kept:
                log.warning("keeping every older checkpoint: %s", exc)
                return []
            removed.append(folder)
            continue
        if run is not None and manifest.identity.run != run:
            continue  # another run's: never touched
        (kept if len(kept) < max(keep, 1) else removed).append(folder)
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
    return removed


def find_checkpoint(directory: str | Path, identity: RunIdentity | None = None) -> tuple[Path | None, list[str]]:
    """The newest verified checkpoint in ``directory`` (of ``identity``'s run, given one; None if there is
    none) and what was skipped on the way, one line each.

    Raises:
        CheckpointError: the newest verified checkpoint of the run holds other tensors (another model), or
            checkpoints exist and none of them verifies.
    """
    root = Path(directory)
    skipped: list[str] = []
    for folder in step_folders(root):
        try:
            manifest = Manifest.read(folder)
            manifest.verify(folder)
        except DamagedCheckpoint as exc:
            skipped.append(str(exc))
            continue
        if identity is not None and manifest.identity.run != identity.run:
            skipped.append(f"{folder.name} belongs to another run ({manifest.identity.run or 'before 0.6'})")
            continue
        changes = [] if identity is None else identity.differences(manifest.identity)
        if changes:
            raise CheckpointError(
                f"{folder} was written for another model ({'; '.join(changes)}); resume with the model it was "
                f"written for, or start fresh in another checkpoint folder ({root} is left as it is)"
            )
        if skipped:
            skipped[-1] += f"; resuming from {folder.name}"
        return folder, skipped
    if skipped:
        raise CheckpointError(
            f"no usable checkpoint in {root} ({'; '.join(skipped)}); start fresh without resuming, or in another "
            "checkpoint folder"
        )
    return None, skipped


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint in ``directory`` that verifies, or None (a damaged one is skipped)."""
    try:
        return find_checkpoint(directory)[0]
    except CheckpointError:
        return None


def load_checkpoint(
    path: str | Path,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    *,
    group: dist.ProcessGroup | None = None,
) -> int:
    """Restore this rank's share of a checkpoint (call on every rank); returns the step it ended.

    Raises:
        CheckpointError: on every rank, if any rank cannot load its share.
    """
    group = group if group is not None else phase_group()
    rank = dist.get_rank(group)
    state = _state(modules, optimizer, 0, rank)
    together(
        lambda: dcp_load(state, checkpoint_id=str(path), process_group=group),
        f"loading {path} (stages {sorted(modules)} on rank {rank})",
        group=group,
        error=CheckpointError,
    )
    container = _container(modules)
    own = state[f"rank{rank}"]
    if optimizer is not None:
        optim_state = state[_optim_key(modules)]
        set_state_dict(container, optimizer, model_state_dict=state["model"], optim_state_dict=optim_state)
    else:
        container.load_state_dict(state["model"])
    torch.set_rng_state(own["rng"])
    return int(own["step"])


def resume(
    directory: str | Path,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    *,
    hint: str = "",
    group: dist.ProcessGroup | None = None,
    run: str = "",
) -> tuple[int, list[str]]:
    """Load the newest verified checkpoint of run ``run`` (call on every rank).

    Returns the step to continue from (0 when there is no checkpoint) and the
    damaged checkpoints skipped on the way, one line each. Rank 0 reads the
    folder and every rank loads what it chose.

    Raises:
        CheckpointError: on every rank, when the checkpoint belongs to another run or none is usable.
    """
    group = group if group is not None else phase_group()
    identity = run_identity(modules, hint=hint, group=group, run=run)
    rank = dist.get_rank(group)
    chosen = together(
        lambda: find_checkpoint(directory, identity) if rank == 0 else None,
        f"resuming from {directory}",
        group=group,
        error=CheckpointError,
    )[0]
    assert chosen is not None
    folder, skipped = chosen
    if folder is None:
        return 0, skipped
    step = load_checkpoint(folder, modules, optimizer, group=group)
    return step, skipped


def load_merged(path: str | Path) -> dict[str, torch.Tensor]:
    """All stages' parameters as one state dict, in one process (for evaluation):
    keys are ``<stage>.<parameter>``.

    Raises:
        DamagedCheckpoint: if the checkpoint does not verify.
    """
    folder = Path(path)
    Manifest.read(folder).verify(folder)
    with tempfile.TemporaryDirectory(prefix="hintpipe-merge-") as scratch:
        target = Path(scratch) / "merged.pt"
        dcp_to_torch_save(str(folder), str(target))
        state = torch.load(target, weights_only=True)  # tensors and plain values only: a file runs no code
    model = state["model"]
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
