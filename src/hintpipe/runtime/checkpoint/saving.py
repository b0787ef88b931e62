"""Checkpoints: each rank saves its own stages; a checkpoint is verified before it is trusted.

torch.distributed.checkpoint (DCP) writes every rank's share in parallel, each
tensor under the model's own name (see [Note: checkpoints by name] in
:mod:`hintpipe.runtime.checkpoint.rank_state`), so that a run resumes under
another plan of the same model.

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
run, or of another model (other tensor names or shapes), is refused, never skipped.
Pruning (:func:`~hintpipe.runtime.checkpoint.pruning.prune_checkpoints`) deletes
old checkpoints only after the newest has been verified again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.runtime.checkpoint.collective import together
from hintpipe.runtime.checkpoint.disk import disk_named, full_disk
from hintpipe.runtime.checkpoint.links import remove_temporary
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
from hintpipe.runtime.checkpoint.pruning import prune_checkpoints
from hintpipe.runtime.checkpoint.rank_state import RankState, Stateful, rng_key
from hintpipe.runtime.checkpoint.readers import reading
from hintpipe.runtime.checkpoint.run_folder import LATEST, check_layout
from hintpipe.runtime.launcher_env import orphaned
from hintpipe.runtime.liveness import phase_group
from hintpipe.runtime.model_names import ModelNames

if TYPE_CHECKING:
    # torch.distributed.checkpoint is imported where a checkpoint is written or read: it pulls in DTensor,
    # about 0.6 s of every rank's start-up, which a run that never saves should not pay.
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

__all__ = [
    "CheckpointError",
    "DamagedCheckpoint",
    "find_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "resume",
    "run_identity",
    "save_checkpoint",
    "step_name",
]

#: Makes torch.distributed.checkpoint's writer for a checkpoint folder.
WriterFactory: TypeAlias = "Callable[[str], FileSystemWriter]"
log = logging.getLogger(__name__)


def _versions() -> dict[str, str]:
    try:
        own = version("hintpipe")
    except PackageNotFoundError:  # running from a source tree
        own = "unknown"
    return {"hintpipe": own, "torch": torch.__version__}


def run_identity(
    modules: Mapping[int, nn.Module],
    *,
    hint: str = "",
    group: dist.ProcessGroup | None = None,
    run: str = "",
    names: ModelNames | None = None,
    what: str = "comparing the ranks' stages",
    model_description: Mapping[str, Any] | None = None,
) -> RunIdentity:
    """What this run's checkpoints belong to (call on every rank): the run, and the model's tensors by name
    with their shapes (the stages' placement, the hint and ``model_description`` are recorded beside them).
    ``what``: the phase a failure names (a save's or a resume's own words, so that a rank lost here is
    reported as lost in it)."""
    group = group if group is not None else phase_group()
    names = names if names is not None else ModelNames()
    own = {name: list(t.shape) for name, t in names.named_tensors(modules).items()}
    stages = sorted(modules)
    shares = together(lambda: (own, stages), what, group=group, error=CheckpointError)
    stage_rank: dict[int, int] = {s: rank for rank, (_, held) in enumerate(shares) for s in held}
    placement = [stage_rank.get(s, -1) for s in range(max(stage_rank, default=-1) + 1)]
    found = {name: shape for share, _ in shares for name, shape in share.items()}
    order = [k for k in names.keys if k in found] + sorted(k for k in found if k not in set(names.keys))
    return RunIdentity(
        tensors={k: found[k] for k in order},
        stage_ranks=placement,
        hint=hint,
        versions=_versions(),
        run=run,
        aliases=[list(group) for group in names.aliases],
        keys=list(names.keys),
        model=None if model_description is None else dict(model_description),
    )


def save_checkpoint(
    directory: str | Path,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    hint: str = "",
    group: dist.ProcessGroup | None = None,
    storage_writer: WriterFactory | None = None,
    run: str = "",
    names: ModelNames | None = None,
    extra: Mapping[str, Stateful] | None = None,
    model_description: Mapping[str, Any] | None = None,
) -> Path:
    """Save this rank's share of step ``step`` of run ``run`` (call on every rank); returns the checkpoint folder.

    ``names``: the model's names for the stages' tensors (default ``<stage>.<name>``); ``extra``: the caller's
    state saved with them (an LR scheduler); ``model_description``: what rebuilds the model, in the manifest
    (see :mod:`hintpipe.runtime.checkpoint.description`). ``storage_writer`` makes DCP's writer for a folder
    (None: its ``FileSystemWriter``; the digests and the atomic rename need files). Old checkpoints stay: see
    :func:`prune_checkpoints`.

    Raises:
        CheckpointError: on every rank, one line naming the rank that failed and why.
    """
    group = group if group is not None else phase_group()
    root = Path(directory)
    rank = dist.get_rank(group)
    final = root / step_name(step)
    tmp = root / f"{step_name(step)}.tmp"
    what = f"saving checkpoint step {step} in {root}"
    names = names if names is not None else ModelNames()
    identity = run_identity(
        modules, hint=hint, group=group, run=run, names=names, what=what, model_description=model_description
    )
    state = RankState(modules, names, optimizer, extra)

    def prepare() -> None:
        bad = state.first_nonfinite()
        if bad is not None:
            raise CheckpointError(f"{bad} is not finite; nothing was saved, the earlier checkpoints are kept")
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            check_layout(root)
            foreign = foreign_owner(root, step, run)
            if foreign is not None:
                raise CheckpointError(
                    f"{final} belongs to another run ({foreign}); nothing was saved and it is kept: move it elsewhere"
                )
            for stale in root.glob("step-*.tmp"):
                remove_temporary(stale)  # a link among them removed, never followed

    together(prepare, what, group=group, error=CheckpointError)
    try:
        return _write(state.entries(step, rank), rank, identity, tmp, final, what, group, storage_writer)
    except CheckpointError:
        # Every rank that could write has left the failed phase; each removes the partial folder (rank 0 may be
        # the one that stopped answering), so that a full disk gets its space back.
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def step_name(step: int) -> str:
    """The folder of step ``step``'s checkpoint: ``step-00000012``."""
    return f"step-{step:08d}"


def foreign_owner(root: Path, step: int, run: str) -> str | None:
    """The run of an existing checkpoint of step ``step`` in ``root`` when it is not ``run`` (named as its
    manifest says; ``before 0.6`` for an unnamed one), or None (no such folder, one of ``run``, or one whose
    manifest is unreadable: a damaged folder that any save may replace)."""
    folder = root / step_name(step)
    if not folder.is_dir():
        return None
    try:
        owner = Manifest.read(folder).identity.run
    except DamagedCheckpoint:
        return None
    return None if owner == run else owner or "before 0.6"


def _write(
    state: dict[str, Any],
    rank: int,
    identity: RunIdentity,
    tmp: Path,
    final: Path,
    what: str,
    group: dist.ProcessGroup | None,
    storage_writer: WriterFactory | None,
) -> Path:
    """Write ``state`` into ``tmp``, vouch for its files and rename it to ``final`` (rank 0)."""
    from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from hintpipe.runtime.checkpoint.files import RunFiles

    writer = storage_writer if storage_writer is not None else FileSystemWriter
    root = final.parent
    step = int(state["step"])
    files = RunFiles()

    def write_here() -> None:
        made = writer(str(tmp))
        if type(made.fs) is FileSystem:  # torch's own: the run's (its mode, its writes watched)
            made.fs = files
        try:
            dcp_save(state, storage_writer=made, process_group=group)
        except BaseException as exc:
            if rank not in getattr(exc, "failures", {rank: None}):
                return  # another rank's write failed, not this one's: that rank says why
            full = full_disk(exc, files.failures, tmp)
            if full is not None:
                raise CheckpointError(full) from None
            raise

    together(write_here, what, group=group, error=CheckpointError)

    def own_files() -> dict[str, tuple[int, str]]:
        # Each rank vouches for the files it wrote (``__<rank>_<i>.distcp``); rank 0 also for the rest.
        mine = [p for p in tmp.iterdir() if p.name.startswith(f"__{rank}_")]
        if rank == 0:
            mine += [p for p in tmp.iterdir() if p.is_file() and not p.name.startswith("__")]
        with disk_named(tmp):
            for path in mine:
                sync_file(path)
            return digests(mine, tmp)

    vouched = together(own_files, what, group=group, error=CheckpointError)
    written = {k: v for share in vouched for k, v in share.items()}

    def finish() -> None:
        if rank != 0:
            return
        with disk_named(tmp):
            Manifest(step, identity, written).write(tmp)
        if orphaned():  # see [Note: nothing published after the launcher died]
            os._exit(1)
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
        sync_folder(root)
        with disk_named(root / LATEST):
            write_synced(root / LATEST, final.name)

    try:
        together(finish, what, group=group, error=CheckpointError)
    except CheckpointError as exc:
        # Every rank had vouched for its files before rank 0 published them: a rank lost after that leaves a
        # whole checkpoint, which the error says rather than calling the save failed.
        if rank == 0 and final.is_dir() and (root / LATEST).is_file() and (root / LATEST).read_text() == final.name:
            raise CheckpointError(
                f"{exc}; {final} was whole and published before that: --resume continues from it"
            ) from None
        raise
    return final


def find_checkpoint(
    directory: str | Path, identity: RunIdentity | None = None, *, holds: contextlib.ExitStack | None = None
) -> tuple[Path | None, list[str]]:
    """The newest verified checkpoint in ``directory`` (of ``identity``'s run, given one; None if there is
    none) and what was skipped on the way, one line each. ``holds``: a reader's; each folder looked at is held
    against pruning, from before it is verified until ``holds`` closes (see [Note: a reader's hold on a
    checkpoint] in :mod:`hintpipe.runtime.checkpoint.readers`).

    Raises:
        CheckpointError: the newest verified checkpoint of the run holds other tensors (another model), or
            checkpoints exist and none of them verifies.
    """
    root = Path(directory)
    skipped: list[str] = []
    for folder in step_folders(root):
        if holds is not None and not holds.enter_context(reading(folder)):
            continue  # pruned since it was listed
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
    names: ModelNames | None = None,
    extra: Mapping[str, Stateful] | None = None,
) -> int:
    """Restore this rank's share of a checkpoint (call on every rank); returns the step it ended.

    Raises:
        CheckpointError: on every rank, if any rank cannot load its share.
    """
    return _load(Path(path), RankState(modules, names or ModelNames(), optimizer, extra), group)[0]


def _load(path: Path, state: RankState, group: dist.ProcessGroup | None) -> tuple[int, list[str]]:
    """Load ``path`` into ``state``; returns the step and what the caller should be told."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from hintpipe.runtime.checkpoint.reading import SafeLoadPlanner, SafeReader, read_metadata, refusals_said

    group = group if group is not None else phase_group()
    rank = dist.get_rank(group)
    entries = state.entries(0, rank)
    # Every rank reads the same file: a refusal is the same on every rank, said once (see [Note: nothing from
    # disk runs code] in hintpipe.runtime.checkpoint.reading).
    saved = together(
        lambda: read_metadata(path).state_dict_metadata if rank == 0 else None,
        f"loading {path}",
        group=group,
        error=CheckpointError,
    )[0]
    assert saved is not None
    world = dist.get_world_size(group)
    fresh = [r for r in range(world) if rng_key(r) not in saved]  # the same list on every rank
    if rank in fresh:
        del entries[rng_key(rank)]
    notes = []
    for key in [k for k in entries if k.startswith("user-")]:
        name = key.removeprefix("user-")
        older = getattr(state.extra.get(name), "absent_from_older_checkpoints", False)
        if not _saved_key(key, saved):
            if older:
                del entries[key]  # a checkpoint of an older hintpipe, saved without it: the run's own is kept
                state.extra.pop(name, None)
            # else: a caller's own state the checkpoint lacks is refused by the load, named (nothing restored
            # silently)
        elif older and isinstance(entries[key], dict):  # hintpipe's record, grown fields since: what was saved
            entries[key] = {field: value for field, value in entries[key].items() if f"{key}.{field}" in saved}
    if fresh:
        who = f"rank {fresh[0]}" if len(fresh) == 1 else f"ranks {', '.join(map(str, fresh))}"
        notes.append(f"{who} found no random state in {path.name} (saved by fewer ranks) and kept its own")

    def load_here() -> None:
        with refusals_said():
            dcp_load(entries, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner(), process_group=group)

    together(
        load_here,
        f"loading {path} (stages {state.stages} on rank {rank})",
        group=group,
        error=CheckpointError,
    )
    return state.restore(entries, rank), notes


def _saved_key(key: str, saved: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's index holds ``key`` (torch.distributed.checkpoint flattens a dict's entries)."""
    return key in saved or any(name.startswith(f"{key}.") for name in saved)


def resume(
    directory: str | Path,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    *,
    hint: str = "",
    group: dist.ProcessGroup | None = None,
    run: str = "",
    names: ModelNames | None = None,
    extra: Mapping[str, Stateful] | None = None,
) -> tuple[int, list[str], Path | None]:
    """Load the newest verified checkpoint of run ``run`` (call on every rank), whichever plan saved it.

    Returns the step to continue from (0 when there is no checkpoint), what
    the caller should be told, one line each (the damaged checkpoints skipped on
    the way, a rank left with its own random state), and the checkpoint loaded.
    Rank 0 reads the folder and every rank loads what it chose.

    Raises:
        CheckpointError: on every rank, when the checkpoint belongs to another run or model, or none is usable.
    """
    group = group if group is not None else phase_group()
    names = names if names is not None else ModelNames()
    identity = run_identity(modules, hint=hint, group=group, run=run, names=names, what=f"resuming from {directory}")
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
        return 0, skipped, None
    step, notes = _load(folder, RankState(modules, names, optimizer, extra), group)
    return step, skipped + notes, folder
