"""A run holds its checkpoint folder while it runs.

[Note: one run per folder at a time]
Two runs writing one folder destroy each other's work: two fresh runs started
at once both claimed it, one failed mid-save and ``run.json`` kept the loser's
id, so the winner's own checkpoints were later refused; a ``--resume`` of a run
still going wrote the same step folders as the run until one failed. So a run
takes an exclusive lock (``flock``) on ``run.lock`` in the folder before any
rank starts and holds it for its whole life. The kernel releases it when the
holder dies, however it dies (SIGKILL included): no stale lock is ever left to
clear by hand. The file names the holder (pid, host, start time), so a second
run is refused in one line that says who has the folder.

Who holds it:

- ``hintpipe train`` and :func:`hintpipe.apps.training.train` on one machine:
  the launcher, before it spawns the ranks, until they have all ended.
- Under ``torchrun`` (or any process group the caller made): global rank 0,
  the rank that writes ``run.json`` and the manifests, from
  :meth:`~hintpipe.runtime.checkpoint.checkpointer.Checkpointer.start` or
  :meth:`~hintpipe.runtime.checkpoint.checkpointer.Checkpointer.resume` until
  :meth:`~hintpipe.runtime.checkpoint.checkpointer.Checkpointer.close` or its
  process ends. The other ranks write only inside ``step-<n>.tmp`` folders that
  rank 0 prepared, so one holder per run is enough; a refusal reaches them
  through the phase's collective. A rank 0 whose launcher holds the lock (its
  pid is the one in ``run.lock`` and in the environment) goes on without it.

Across machines the folder must be on a file system whose ``flock`` is seen by
every machine (local disks, NFSv4 and Lustre with ``flock`` mounted are; some
network file systems only pretend).

This module is torch-free.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from pathlib import Path
from types import TracebackType

from hintpipe.runtime.checkpoint.disk import cannot_write
from hintpipe.runtime.checkpoint.links import linked, refuse_links
from hintpipe.runtime.checkpoint.permissions import file_mode, make_folder
from hintpipe.runtime.errors import CheckpointError

LOCK_FILE = "run.lock"

#: The folders this process holds: the lock file's path -> [its descriptor, how many holders in this process].
#: An flock belongs to an open file description, so a second open of the same file in one process would be
#: refused by the first: a process holds a folder once, however many checkpointers in it take it (a training
#: function called twice in one interpreter, a notebook cell run again), until the last gives it back.
_HELD: dict[Path, list[int]] = {}
#: The folders that this process's launcher holds on its behalf (see ``acquire``'s ``ours``).
_HELD_FOR_US: set[Path] = set()


def holds(folder: Path) -> bool:
    """Whether this process holds ``folder`` (or its launcher does, for it): then no other run is live there."""
    key = (folder / LOCK_FILE).resolve()
    return key in _HELD or key in _HELD_FOR_US


class FolderInUse(CheckpointError):
    """Another process holds the checkpoint folder (one line naming it)."""


class FolderLock:
    """The exclusive hold of one checkpoint folder (see [Note: one run per folder at a time]).

    ``acquire`` takes it or raises :class:`FolderInUse`; ``release`` (or the holder's death) gives it back.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, ours: int | None = None) -> FolderLock:
        """Take the folder (created, with its parents, if needed). ``ours``: the pid of a launcher that may
        hold it on this process's behalf; then a hold by that pid is no refusal (nothing is taken here).

        Raises:
            FolderInUse: another process holds it: one line naming the holder and what to do.
        """
        if self._fd is not None:
            return self
        try:
            make_folder(self.folder)
        except OSError as exc:
            raise CheckpointError(unwritable(self.folder, exc)) from None
        refuse_links([self.path])  # see [Note: no link in a run folder is followed]
        held = _HELD.get(self.path.resolve())
        if held is not None:  # this process holds it already
            held[1] += 1
            self._fd = held[0]
            return self
        # No O_TRUNC: the file names the holder, which must stay readable until this process holds it. O_NOFOLLOW:
        # a link put there since the check above is refused too, never opened (ELOOP).
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
        except OSError as exc:
            if self.path.is_symlink():
                raise CheckpointError(linked(self.path)) from None
            raise CheckpointError(unwritable(self.path, exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if ours is not None and holder.get("pid") == ours and holder.get("host") == socket.gethostname():
                _HELD_FOR_US.add(self.path.resolve())
                return self  # our launcher holds it for us
            raise FolderInUse(
                f"{self.folder} is in use by another run ({describe(holder)}, holding {self.path}); wait for it to "
                "end or stop it, or use another checkpoint folder"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise CheckpointError(f"{self.path} cannot be locked: {exc.strerror or exc}") from None
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)
        except OSError as exc:  # a full disk: said in one line, and the lock given back
            os.close(fd)
            raise CheckpointError(unwritable(self.path, exc)) from None
        self._fd = fd
        _HELD[self.path.resolve()] = [fd, 1]
        return self

    def release(self) -> None:
        """Give the folder back. The file stays (removing it would let a waiting process lock a file no one else
        opens), emptied: a folder no run holds names no one."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        key = self.path.resolve()
        held = _HELD.get(key)
        if held is not None:
            held[1] -= 1
            if held[1] > 0:  # another holder in this process keeps it
                return
            del _HELD[key]
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def unwritable(path: Path, exc: OSError) -> str:
    """Why ``path`` of a run folder cannot be written (a full disk, a file-size limit, no permission), in one
    line: nothing was changed."""
    return f"{cannot_write(path, exc)} (nothing was changed)"


def _holder(fd: int) -> dict[str, object]:
    """What the holder wrote into the lock file; empty while it has not written yet."""
    try:
        found = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError):
        return {}
    return found if isinstance(found, dict) else {}


def describe(holder: dict[str, object]) -> str:
    """``pid 123 on host h, started 2025-01-01T10:00:00+00:00``, or what is known of it."""
    if not holder:
        return "a process that has not yet written its name"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"
