"""A checkpoint folder belongs to one run.

A run gets an identity when it first starts in a folder: a random id, kept in
``run.json`` there and recorded in the manifest of every checkpoint it saves.
A fresh run refuses a folder that holds another run's checkpoints (naming
them) unless told to replace them, which deletes them; ``--resume`` continues
the folder's own run; pruning and resuming only ever look at checkpoints of
the folder's run. Without this, a second run in the same folder overwrote the
first one's checkpoints step by step, pruned its own as older than the other
run's, and a later resume went on from the other run's newest.

Claiming is atomic: ``run.json`` is written whole beside it and linked into
place, which fails if another process linked its own first, so two runs never
both think they own the folder (the folder's lock, see
:mod:`hintpipe.runtime.checkpoint.folder_lock`, keeps a second run out
altogether; the link keeps a process of an older hintpipe out of a claim too).
A ``run.json`` already there is never removed to make room: it is replaced
(atomically, by a rename) only by the process that holds the folder, the one
live run there; any other claim of a claimed folder is refused. Two claims
raced before: each unlinked what it found and linked its own, and both
succeeded, the second replacing the first.
A folder whose ``run.json`` was lost resumes the run its verified checkpoints
belong to (and gets ``run.json`` back); when they belong to several runs, the
refusal says which file to write.

This module is torch-free.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import uuid
from pathlib import Path

from hintpipe.runtime.checkpoint.disk import NO_ROOM, cannot_write
from hintpipe.runtime.checkpoint.folder_lock import LOCK_FILE, holds
from hintpipe.runtime.checkpoint.links import refuse_links, remove_temporary
from hintpipe.runtime.checkpoint.manifest import Manifest, step_folders, step_of, sync_folder
from hintpipe.runtime.checkpoint.permissions import file_mode, make_folder, restrict
from hintpipe.runtime.errors import CheckpointError, DamagedCheckpoint

RUN_FILE = "run.json"
LATEST = "latest"
#: A planned run's node profiles, what its resume plans with (see [Note: a resume plans as its run did] in
#: :mod:`hintpipe.apps.run_profiles`).
PROFILES_FILE = "profiles.json"


def read_run(folder: Path) -> str | None:
    """The id of the run that owns ``folder``, or None when no run has claimed it. A folder with checkpoints
    but no ``run.json`` was written by hintpipe 0.5 or earlier: its run is ``""``.

    Raises:
        CheckpointError: ``run.json`` exists and cannot be read.
    """
    path = folder / RUN_FILE
    if not path.is_file():
        return "" if step_folders(folder) else None
    try:
        return str(json.loads(path.read_text())["run"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); it names the folder's run"
        ) from None


def claim(folder: Path, *, replace: bool = False) -> str:
    """Start a new run in ``folder`` (created, with its parents, if needed); returns its id. A folder claimed
    already (``run.json``) is claimed again only by the process that holds it (see
    :func:`~hintpipe.runtime.checkpoint.folder_lock.holds`): the one live run there.

    Raises:
        CheckpointError: the folder holds another run's checkpoints and ``replace`` is False: one line naming
            them, with what to do instead; ``latest`` is not a file; another process claimed the folder (before,
            or at the same moment).
    """
    make_folder(folder)
    check_layout(folder)
    check_not_foreign(folder, "the checkpoint folder")
    held = holds(folder)
    if (folder / RUN_FILE).is_file() and not held:
        raise CheckpointError(claimed(folder, read_run(folder)))
    found = step_folders(folder)
    if found and not replace:
        raise CheckpointError(another_run(folder, found))
    for old in found:
        shutil.rmtree(old, ignore_errors=True)
    for stale in folder.glob("step-*.tmp"):
        remove_temporary(stale)
    (folder / LATEST).unlink(missing_ok=True)
    (folder / PROFILES_FILE).unlink(missing_ok=True)  # a planned run writes its own; no other run's stays
    restrict(folder)  # a fresh run's folder (see [Note: a run folder is its owner's])
    run = uuid.uuid4().hex[:16]
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    write_run(folder, run, created, replace=held)
    return run


def claimed(folder: Path, other: str | None) -> str:
    """Why a claim of ``folder``, claimed by run ``other``, is refused, in one line."""
    return (
        f"{folder} was claimed by another run ({other or '?'}, in {folder / RUN_FILE}); only one run can use a "
        "checkpoint folder: resume that run (--resume), or use another folder"
    )


def write_run(folder: Path, run: str, created: str, *, replace: bool = False) -> None:
    """Write ``run.json`` naming ``run``, atomically: only where there is none (see the module's doc), or, with
    ``replace`` (the caller holds the folder), in place of the one there by a rename.

    Raises:
        CheckpointError: another process wrote one first (naming its run); no room for it (a full disk, the
            file-size limit: named in one line, as a save's, see :mod:`hintpipe.runtime.checkpoint.disk`).
    """
    path = folder / RUN_FILE
    temporary = folder / f".{RUN_FILE}.{uuid.uuid4().hex[:8]}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        try:
            with os.fdopen(os.open(temporary, flags, file_mode()), "w") as f:
                f.write(json.dumps({"run": run, "created": created}))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # a full disk: named (the lock fitted, run.json did not)
            if exc.errno not in NO_ROOM:
                raise
            raise CheckpointError(f"{cannot_write(path, exc)} (the run did not start)") from None
        if replace:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)
            except FileExistsError:
                raise CheckpointError(claimed(folder, read_run(folder))) from None
    finally:
        temporary.unlink(missing_ok=True)
    sync_folder(folder)


def check_layout(folder: Path) -> None:
    """Refuse a folder where hintpipe's own names are taken by something else: ``latest`` (a pointer file) or
    ``run.json`` made folders; ``run.lock``, ``run.json``, ``latest`` or a ``step-<n>`` checkpoint a link (see
    [Note: no link in a run folder is followed] in :mod:`hintpipe.runtime.checkpoint.links`).

    Raises:
        CheckpointError: one line naming the path and what to do.
    """
    if folder.is_dir():
        refuse_links(sorted(p for p in folder.iterdir() if p.name in _KEPT or step_of(p) is not None))
    for name, what in ((LATEST, "the pointer to the newest checkpoint"), (RUN_FILE, "the folder's run")):
        path = folder / name
        if path.exists() and not path.is_file():
            raise CheckpointError(
                f"{path} is a folder; hintpipe writes {what} there as a file: move it elsewhere (nothing was changed)"
            )


#: The files a run keeps at the top of its folder (besides its ``step-<n>`` checkpoints): never a link.
_KEPT = frozenset({RUN_FILE, LOCK_FILE, LATEST, PROFILES_FILE})
#: What a run writes at the top of its folder, besides its ``step-<n>`` (and ``step-<n>.tmp``) folders: the run's
#: id, the lock of the process that runs it, the pointer to the newest checkpoint, a planned run's profiles, and
#: their temporaries.
_RUN_NAMES = frozenset({RUN_FILE, LOCK_FILE, LATEST, f"{LATEST}.tmp", PROFILES_FILE, f"{PROFILES_FILE}.tmp"})


def foreign_files(folder: Path) -> list[str]:
    """The names at the top of ``folder`` that no run writes, sorted (empty for a new, empty or run folder)."""
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.name not in _RUN_NAMES and not entry.name.startswith(("step-", f".{RUN_FILE}."))
    )


def check_not_foreign(folder: Path, flag: str = "--checkpoint-dir") -> None:
    """Refuse, before anything is written there, a folder that no run has claimed (no ``run.json``) and that
    holds files no run writes: a model folder (``config.json``, weights) or any other folder of the user's is
    never made a run's. A folder a run has claimed may hold the user's own files beside the run's.

    Raises:
        CheckpointError: one line naming the folder, the first files found and what to do.
    """
    if (folder / RUN_FILE).is_file():
        return
    found = foreign_files(folder)
    if not found:
        return
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    what = "a model folder" if "config.json" in found else "a folder of other files"
    raise CheckpointError(
        f"{flag} {folder} is {what} ({shown}), not a run's checkpoint folder: give a new or empty folder for the "
        "run's checkpoints (nothing was written)"
    )


def adopt(folder: Path) -> str:
    """The run of a folder without ``run.json``: the one run its verified checkpoints belong to, written back
    into ``run.json`` (``""``: checkpoints of hintpipe 0.5 or earlier, or none that verifies; the resume then
    says what it found).

    Raises:
        CheckpointError: the verified checkpoints belong to several runs: one line naming them and the file to
            write.
    """
    runs: dict[str, list[str]] = {}
    for step in step_folders(folder):
        try:
            manifest = Manifest.read(step)
            manifest.verify(step)
        except DamagedCheckpoint:
            continue
        runs.setdefault(manifest.identity.run, []).append(step.name)
    if len(runs) > 1:
        named = "; ".join(f"run {run or '(before 0.6)'}: {', '.join(steps)}" for run, steps in runs.items())
        newest = next(iter(runs))
        raise CheckpointError(
            f"{folder} has no {RUN_FILE} and holds the checkpoints of {len(runs)} runs ({named}); write the run to "
            f'resume into {folder / RUN_FILE}, e.g. {{"run": "{newest}"}}, or move the other runs\' step folders '
            "elsewhere"
        )
    run = next(iter(runs), "")
    if run:
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        write_run(folder, run, created)
    return run


def another_run(folder: Path, found: list[Path]) -> str:
    """Why a fresh run cannot start in ``folder``, which holds the checkpoints ``found``, and what to do."""
    names = ", ".join(sorted(p.name for p in found)[:3]) + (", ..." if len(found) > 3 else "")
    return (
        f"{folder} holds the checkpoints of another run ({names}): resume that run (--resume), start in another "
        "folder, or replace them (--replace-checkpoints)"
    )


def check_writable(folder: Path, flag: str = "--checkpoint-dir") -> None:
    """Refuse, before any work, a checkpoint folder that cannot be written: one whose parent does not exist
    (likely a typo), a file, or one where a file cannot be created.

    Raises:
        ValueError: naming the flag, the folder and why.
    """
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {folder} is a file, not a folder")
    if folder.parent.exists() and not folder.parent.is_dir():
        raise ValueError(f"{flag} {folder}: its parent {folder.parent} is a file, not a folder")
    if not folder.parent.is_dir():
        raise ValueError(f"{flag} {folder}: its parent {folder.parent} does not exist (a typo?); create it first")
    probe = folder / f".hintpipe-write-test-{uuid.uuid4().hex[:8]}"
    try:
        make_folder(folder)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{flag} {folder} cannot be written: {exc.strerror or exc}") from None


def recorded_hint(folder: Path) -> tuple[str, Path] | None:
    """The hint the newest checkpoint of ``folder``'s run records, and that checkpoint; None where no checkpoint's
    manifest reads (or it records none).

    Only manifests are read (each checks its own digest): verifying a checkpoint's tensors is the ranks' work when
    they load it, and reading them here too would read the whole model twice before a resume starts. A newest
    checkpoint the ranks then find damaged falls back to an older one of the same run, which ran the same hint.
    """
    try:
        owner = read_run(folder)
    except CheckpointError:
        owner = None  # refused where the ranks resume, in their words
    for step in step_folders(folder):
        try:
            identity = Manifest.read(step).identity
        except DamagedCheckpoint:
            continue
        if not owner or identity.run == owner:
            return (identity.hint, step) if identity.hint else None
    return None
