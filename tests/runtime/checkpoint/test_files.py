"""A checkpoint's files as torch.distributed.checkpoint opens them (:mod:`hintpipe.runtime.checkpoint.files`):
written of the run's mode and never through a link, the first failed write of each stream kept to be named, and
only a plain file read."""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

import pytest

from hintpipe.runtime.checkpoint.files import RunFiles, Watched
from hintpipe.runtime.checkpoint.links import NotAFile
from hintpipe.runtime.checkpoint.permissions import file_mode


class Full(io.BytesIO):
    """A stream on a disk that fills after ``room`` bytes."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, data: object) -> int:
        if self.tell() + len(data) > self.room:  # type: ignore[arg-type]
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)  # type: ignore[arg-type]


def test_the_first_failed_write_of_a_stream_is_kept_with_its_path() -> None:
    failures: list[tuple[Path, OSError]] = []
    stream = Watched(Full(4), Path("/ck/0_0.distcp"), failures)
    assert stream.write(b"abc") == 3
    for _ in range(2):
        with pytest.raises(OSError):
            stream.write(b"defg")
    assert [(path, exc.errno) for path, exc in failures] == [(Path("/ck/0_0.distcp"), errno.ENOSPC)]  # the first


def test_a_write_is_of_the_runs_mode_and_never_through_a_link(tmp_path: Path) -> None:
    files = RunFiles()
    with files.create_stream(tmp_path / "0_0.distcp", "wb") as stream:
        stream.write(b"tensors")
    assert (tmp_path / "0_0.distcp").read_bytes() == b"tensors"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "0_0.distcp").stat().st_mode) == file_mode() & ~umask
    (tmp_path / "elsewhere").write_bytes(b"keep me")
    (tmp_path / "1_0.distcp").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError) as refused, files.create_stream(tmp_path / "1_0.distcp", "wb"):
        pass
    assert refused.value.errno == errno.ELOOP and (tmp_path / "elsewhere").read_bytes() == b"keep me"
    assert files.failures == [(tmp_path / "1_0.distcp", refused.value)]  # kept to be named


def test_only_a_plain_file_is_read(tmp_path: Path) -> None:
    files = RunFiles()
    (tmp_path / ".metadata").write_bytes(b"index")
    with files.create_stream(tmp_path / ".metadata", "rb") as stream:
        assert stream.read() == b"index"
    os.mkfifo(tmp_path / "0_0.distcp")
    fifo = pytest.raises(NotAFile, match=r"0_0\.distcp is a FIFO, not a file: never read$")
    with fifo, files.create_stream(tmp_path / "0_0.distcp", "rb"):
        pass
    files.mkdir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
