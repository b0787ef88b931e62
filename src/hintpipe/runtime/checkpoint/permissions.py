"""Who may read a run's folder: its owner alone, unless the run says its group may too.

[Note: a run folder is its owner's]
A checkpoint holds the model's weights, its optimizer state and its random state; ``run.json`` and
``run.lock`` say who runs it. They were created with the process's umask (commonly 022: every user of the
machine could read every checkpoint). Now every file a run writes in its folder (checkpoint files,
``manifest.json``, ``latest``, ``run.json``, ``run.lock``) is created 0600 and every folder it makes (the run
folder on a fresh run, ``step-<n>``) 0700; ``group_readable`` (``--group-readable``) makes them 0640 and 0750,
for a team that shares a group. The umask still applies, only ever to make a mode stricter: it is a
permission mask at creation, and a mode set afterwards (``chmod``) is masked with it here as well.

The choice is the process's (:func:`use`): the launcher sets it before it holds the folder and every rank
before it writes (:class:`~hintpipe.runtime.checkpoint.checkpointer.Checkpointer`).

This module is torch-free.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: (files, folders): the owner's alone, or the group's to read as well.
PRIVATE = (0o600, 0o700)
GROUP_READABLE = (0o640, 0o750)

_modes = PRIVATE


def use(group_readable: bool) -> None:
    """The modes of what this process writes in a run folder from now on (see [Note: a run folder is its
    owner's])."""
    global _modes
    _modes = GROUP_READABLE if group_readable else PRIVATE


def _umask() -> int:
    mask = os.umask(0o077)  # read by setting it: the only way; set back at once
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a run's file is created with (the umask applies on top, as at any creation)."""
    return _modes[0]


def folder_mode() -> int:
    """The mode a run's folder is made with (the umask applies on top)."""
    return _modes[1]


def make_folder(path: Path) -> None:
    """``path`` and its missing parents (those with the process's usual modes); ``path`` itself the run's
    folder mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=folder_mode(), exist_ok=True)


def restrict(path: Path) -> None:
    """Set the run's mode on an existing file or folder of the run's (a folder it claims; never through a
    link), masked by the umask; one another user owns (a shared folder) keeps its own."""
    if path.is_symlink():
        return
    mode = (folder_mode() if path.is_dir() else file_mode()) & ~_umask()
    with contextlib.suppress(PermissionError):
        os.chmod(path, mode)
