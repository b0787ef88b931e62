"""A checkpoint folder belongs to one run.

A run gets an identity when it first starts in a folder: a random id, kept in
``run.json`` there and recorded in the manifest of every checkpoint it saves.
A fresh run refuses a folder that holds another run's checkpoints (naming
them) unless told to replace them, which deletes them; ``--resume`` continues
the folder's own run; pruning and resuming only ever look at checkpoints of
the folder's run. Without this, a second run in the same folder overwrote the
first one's checkpoints step by step, pruned its own as older than the other
run's, and a later resume went on from the other run's newest.

This module is torch-free.
"""

from __future__ import annotations

import datetime
import json
import shutil
import uuid
from pathlib import Path

from hintpipe.runtime.checkpoint.manifest import step_folders, write_synced
from hintpipe.runtime.errors import CheckpointError

RUN_FILE = "run.json"
LATEST = "latest"


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
    """Start a new run in ``folder`` (created, with its parents, if needed); returns its id.

    Raises:
        CheckpointError: the folder holds another run's checkpoints and ``replace`` is False: one line naming
            them, with what to do instead.
    """
    folder.mkdir(parents=True, exist_ok=True)
    found = step_folders(folder)
    if found and not replace:
        raise CheckpointError(another_run(folder, found))
    for old in [*found, *folder.glob("step-*.tmp")]:
        shutil.rmtree(old, ignore_errors=True)
    (folder / LATEST).unlink(missing_ok=True)
    run = uuid.uuid4().hex[:16]
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    write_synced(folder / RUN_FILE, json.dumps({"run": run, "created": created}))
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
        folder.mkdir(exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{flag} {folder} cannot be written: {exc.strerror or exc}") from None
