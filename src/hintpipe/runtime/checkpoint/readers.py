"""A checkpoint being read is not pruned under its reader.

[Note: a reader's hold on a checkpoint]
``hintpipe export`` (and :func:`~hintpipe.runtime.checkpoint.merged.load_merged`) may read a checkpoint folder
while its run saves into it. The run prunes old checkpoints one step after each save, and 14 of 14 exports
during a run with ``--checkpoint-every 1`` failed with ``FileNotFoundError`` on the step they were reading.
So a reader holds the step folder it reads: a shared ``flock`` on the folder itself (opened read-only, so
that nothing is written and a read-only copy reads as well) from before its manifest is verified until its
last tensor is read (:func:`reading`). Pruning takes an exclusive ``flock`` on the folder without waiting
(:func:`remove_unread`): a folder someone reads is kept, and the next save's pruning removes it once the
reader is done, so a run keeps one checkpoint more than ``keep`` only while an export reads an old one.

A reader takes its hold before it verifies the folder: one pruned between being listed and being held is
seen as gone (:func:`reading` says so), and the reader goes on to the next older checkpoint. On a file system
without ``flock`` on folders (some network ones), nothing is held and pruning removes as before.

This module is torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

#: The ``flock`` errors of a file system that has no ``flock`` on folders: nothing is held there.
_UNSUPPORTED = (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP)


@contextlib.contextmanager
def reading(folder: Path) -> Iterator[bool]:
    """Hold the step folder ``folder`` against pruning for the block (shared: any number of readers at once).
    Yields False when the folder is gone (pruned since it was listed, or never there): nothing is held then."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a pruning removes it, then sees it gone
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        yield os.fstat(fd).st_nlink > 0
    finally:
        os.close(fd)  # the hold goes with the descriptor


def remove_unread(folder: Path) -> bool:
    """Remove the step folder ``folder`` unless a reader holds it (see [Note: a reader's hold on a checkpoint]);
    returns whether it is gone. A link is never followed: it is not removed here (``check_layout`` refuses it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:  # a link (ELOOP), or not a folder: not a checkpoint to remove
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being read: a later save's pruning removes it
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        shutil.rmtree(folder, ignore_errors=True)  # under the exclusive hold: a reader waits, then sees it gone
        return not folder.exists()
    finally:
        os.close(fd)
