"""A write into a run folder that finds no room is said as such (:mod:`hintpipe.runtime.checkpoint.disk`): one line
naming the file, whatever wrapped the error, and what to do."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from hintpipe.runtime.checkpoint.disk import cannot_write, disk_named, full_disk
from hintpipe.runtime.errors import CheckpointError

FILE = Path("/runs/a/step-00000002/model.safetensors")


def _error(code: int, filename: str | None = None) -> OSError:
    return OSError(code, os.strerror(code), filename)


def test_the_fix_named_is_the_one_for_the_error() -> None:
    assert cannot_write(FILE, _error(errno.ENOSPC)) == (
        f"{FILE}: No space left on device; free space on its file system, or use another checkpoint folder"
    )
    assert cannot_write(FILE, _error(errno.EFBIG)) == (
        f"{FILE}: File too large; this process's file-size limit (ulimit -f) is reached: raise it, or use another "
        "checkpoint folder"
    )
    assert cannot_write(FILE, _error(errno.EACCES)) == f"{FILE}: Permission denied; use another checkpoint folder"


def test_a_full_disk_is_found_inside_what_wrapped_it() -> None:
    where = Path("/runs/a/step-00000002")
    try:
        try:
            raise _error(errno.EDQUOT, str(FILE))
        except OSError as exc:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from exc
    except RuntimeError as wrapped:
        said = full_disk(wrapped, [], where)
    assert said == (
        f"{FILE}: Disk quota exceeded; free space on its file system, or use another checkpoint folder; nothing of "
        "this checkpoint was kept, the earlier ones are"
    )
    unnamed = full_disk(RuntimeError("failed"), [(where, _error(errno.ENOSPC))], where)  # a failure recorded
    assert unnamed is not None and unnamed.startswith(f"{where}: No space left on device;")
    assert full_disk(RuntimeError("failed"), [], where) is None
    assert full_disk(_error(errno.EACCES), [], where) is None  # not a full disk: said by its caller


def test_a_save_of_its_own_files_without_room_is_one_line_and_any_other_error_is_raised() -> None:
    where = Path("/runs/a/latest")
    with pytest.raises(CheckpointError) as refused, disk_named(where):
        raise _error(errno.ENOSPC)
    assert str(refused.value) == (
        f"{where}: No space left on device; free space on its file system, or use another checkpoint folder; "
        "nothing of this checkpoint was kept, the earlier ones are"
    )
    assert refused.value.__suppress_context__
    with pytest.raises(PermissionError), disk_named(where):
        raise PermissionError(errno.EACCES, "Permission denied")
