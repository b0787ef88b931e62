"""A write into a run folder that finds no room is said as such, in one line naming the file.

See [Note: a full disk is named] in :mod:`hintpipe.runtime.checkpoint.files`: torch's zip writer loses the
error of a failed write, and a lock or manifest write on a full disk was a traceback. This module is
torch-free.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from hintpipe.runtime.errors import CheckpointError


def cannot_write(path: Path, exc: OSError) -> str:
    """``path`` could not be written: why (a full disk named as such, whatever torch made of it) and what to
    do, in one line."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on its file system, or use another checkpoint folder"
    elif exc.errno == errno.EFBIG:
        fix = "this process's file-size limit (ulimit -f) is reached: raise it, or use another checkpoint folder"
    else:
        fix = "use another checkpoint folder"
    return f"{path}: {why}; {fix}"


#: The errors of a write that found no room: a full disk, a quota, the process's file-size limit.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def full_disk(exc: BaseException, failures: list[tuple[Path, OSError]], where: Path) -> str | None:
    """What a save that found no room says (see [Note: a full disk is named] in
    :mod:`hintpipe.runtime.checkpoint.files`): the file whose write failed (``where`` when unknown) and why,
    in one line; None for any other failure."""
    found = failures[0] if failures else None
    seen: list[BaseException | None] = [exc]
    looked: set[int] = set()
    while found is None and seen:
        error = seen.pop()
        if isinstance(error, OSError) and error.errno in NO_ROOM:
            found = (Path(error.filename) if error.filename else where, error)
        elif error is not None and id(error) not in looked:
            looked.add(id(error))
            pairs = getattr(error, "failures", None)
            seen += [pair[0] for pair in pairs.values() if isinstance(pair, tuple)] if isinstance(pairs, dict) else []
            seen += [error.__cause__, error.__context__]
    if found is None or found[1].errno not in NO_ROOM:
        return None
    return f"{cannot_write(*found)}; nothing of this checkpoint was kept, the earlier ones are"


@contextlib.contextmanager
def disk_named(where: Path) -> Iterator[None]:
    """A write of a save's own files (digests, the manifest, ``latest``) that finds no room is said in one line
    naming ``where`` (see :func:`full_disk`)."""
    try:
        yield
    except OSError as exc:
        full = full_disk(exc, [], where)
        if full is None:
            raise
        raise CheckpointError(full) from None
