"""The files of a checkpoint as torch.distributed.checkpoint opens them: read only when they are plain files,
written with the run's mode, a write that fails kept to be named.

[Note: a checkpoint's reads never block]
A forged ``.metadata`` may name any path for a tensor (``../../outside/secret.distcp``), and a path may be a
FIFO: opening one blocks until a writer comes, and ``--resume --timeout 20`` hung until it was killed. So a
checkpoint's file is opened ``O_NONBLOCK | O_NOFOLLOW`` and read only when ``fstat`` says it is a regular file
(:func:`hintpipe.runtime.checkpoint.links.open_regular`); before that, every path the index names is checked to
be inside its step folder and covered by a digest of its manifest
(:func:`hintpipe.runtime.checkpoint.reading.check_items`).

[Note: a full disk is named]
torch's zip writer loses the error of a failed write: a save onto a full file system (or over the process's
file-size limit) said ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598``.
So every stream a save writes records the first ``OSError`` of its writes, flushes and closes
(:class:`Watched`), and the save's failure names it instead (``<file>: No space left on device; ...``).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem

from hintpipe.runtime.checkpoint.links import open_regular
from hintpipe.runtime.checkpoint.permissions import file_mode, folder_mode


class Watched(io.RawIOBase):
    """A written stream that records the first ``OSError`` of its writes (into ``failures``, with its path)."""

    def __init__(self, stream: Any, path: Path, failures: list[tuple[Path, OSError]]) -> None:
        super().__init__()
        self._stream, self._path, self._failures = stream, path, failures

    def _guard(self, action: Any, *args: Any) -> Any:
        try:
            return action(*args)
        except OSError as exc:
            if not self._failures:
                self._failures.append((self._path, exc))
            raise

    def write(self, data: Any) -> int:
        return int(self._guard(self._stream.write, data))

    def flush(self) -> None:
        if not self._stream.closed:
            self._guard(self._stream.flush)

    def close(self) -> None:
        if not self._stream.closed:
            self._guard(self._stream.close)
        super().close()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._stream.seekable())

    def tell(self) -> int:
        return int(self._stream.tell())

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._stream.seek(offset, whence))

    def fileno(self) -> int:
        return int(self._stream.fileno())


def _new_file(path: str, flags: int) -> int:
    """A file of the run's, opened for writing: of its mode, never through a link."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())


class RunFiles(FileSystem):
    """torch.distributed.checkpoint's file system, for a run's folder: reads as [Note: a checkpoint's reads
    never block] says, writes of the run's mode (see [Note: a run folder is its owner's]) and watched (see
    [Note: a full disk is named]), never through a link."""

    def __init__(self) -> None:
        super().__init__()
        #: The first failed write of each stream: (its path, the error).
        self.failures: list[tuple[Path, OSError]] = []

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        path = Path(path)
        if "r" in mode:
            with os.fdopen(open_regular(path), "rb") as stream:
                yield stream
            return
        try:
            written = open(path, "wb", opener=_new_file)  # noqa: SIM115  # closed by Watched, below
        except OSError as exc:
            self.failures.append((path, exc))
            raise
        with Watched(written, path, self.failures) as stream:
            yield stream

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        Path(path).mkdir(mode=folder_mode(), parents=True, exist_ok=True)
