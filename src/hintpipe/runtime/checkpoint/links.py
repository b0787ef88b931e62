"""Nothing is written, truncated or removed through a link in a run folder.

[Note: no link in a run folder is followed]
A run writes and removes files in its checkpoint folder by names it chose (``run.lock``, ``run.json``,
``latest``, ``step-<n>`` and their temporaries). A link planted under one of them made hintpipe write through
it, outside the folder: ``run.lock -> ~/file`` truncated the file to 0 bytes (the lock was opened with
``O_CREAT``), ``latest.tmp -> ~/file`` was overwritten with ``step-00000008`` on ``--resume``, and a stale
``step-<n>.tmp`` link stopped every save with ``Cannot call rmtree on a symbolic link`` and no path. So:

- a file hintpipe keeps (``run.lock``, ``run.json``, ``latest``) or a checkpoint (``step-<n>``) found as a
  link is refused in one line naming it, before anything is written (:func:`refuse_links`, from
  ``check_layout``; ``run.lock`` is opened with ``O_NOFOLLOW`` as well, since the lock is taken first);
- a temporary (``latest.tmp``, ``step-<n>.tmp``) is hintpipe's own: whatever is found under its name, a link
  included, is stale and removed without following it (:func:`remove_temporary`: a link is unlinked, never
  its target), and the new one is created with ``O_EXCL | O_NOFOLLOW`` (:func:`create_new`).

This module is torch-free.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from hintpipe.runtime.checkpoint.permissions import file_mode
from hintpipe.runtime.errors import CheckpointError


def linked(path: Path) -> str:
    """Why the link ``path`` is refused, and what to do, in one line."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (
        f"{path} is a link (to {target}); hintpipe writes and removes files in a run folder and follows no link "
        "there: remove the link (nothing was changed)"
    )


def refuse_links(paths: Iterable[Path]) -> None:
    """Refuse the first of ``paths`` that is a link (see [Note: no link in a run folder is followed]).

    Raises:
        CheckpointError: one line naming the link, its target and what to do.
    """
    for path in paths:
        if path.is_symlink():
            raise CheckpointError(linked(path))


def remove_temporary(path: Path) -> None:
    """Remove a stale temporary of hintpipe's: a folder with what is in it; a file or a link by itself (a link's
    target is never touched); nothing if there is none."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def create_new(path: Path) -> int:
    """A descriptor of ``path`` created new for writing, after a stale temporary there is removed; never opened
    through a link (``O_EXCL | O_NOFOLLOW``); of the run's file mode (see [Note: a run folder is its owner's]).

    Raises:
        CheckpointError: something was put there again between the removal and the creation.
    """
    remove_temporary(path)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
    except FileExistsError:
        raise CheckpointError(
            f"{path} was created by another process while hintpipe wrote it; only one run can use a checkpoint "
            "folder: find the other process, or use another folder"
        ) from None


#: What a path that is not a regular file is, by its ``lstat`` type.
_KINDS = ((stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))


def not_a_file(path: Path) -> str | None:
    """What ``path`` is when it is there and not a regular file (``a link``, ``a FIFO``, ``a device``...), by
    ``lstat`` (a link is not followed); None for a regular file or nothing at all."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a device")


class NotAFile(OSError):
    """A checkpoint's file that is not a regular file (a link, a FIFO, a device): never read."""


def open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file ``path``: opened ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO does not
    block the open, a link is not followed) and checked with ``fstat`` before anything is read (see [Note: a
    checkpoint's reads never block] in :mod:`hintpipe.runtime.checkpoint.files`).

    Raises:
        NotAFile: naming the path and what it is.
        FileNotFoundError: there is nothing there.
    """
    kind = not_a_file(path)
    if kind is not None:
        raise NotAFile(f"{path} is {kind}, not a file: never read")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotAFile(f"{path} is a link, not a file: never read") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the lstat above
        os.close(fd)
        raise NotAFile(f"{path} is not a file: never read")
    os.set_blocking(fd, True)
    return fd
