"""What a launcher leaves in its ranks' environment: read by the rank's entry point before anything slow is
imported, and by the checkpoints (which process holds a run's folder; whether the launcher is still there).
Torch-free, and nothing else."""

from __future__ import annotations

import os

#: The environment variable in which hintpipe's launcher gives its ranks its pid.
LAUNCHER_ENV = "HINTPIPE_LAUNCHER_PID"
#: Set by torchrun in every rank it starts.
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"

#: Under torchrun, this process's parent when this module was first imported: the agent that started it (see
#: [Note: ranks never outlive torchrun's agent] in :mod:`hintpipe.runtime.rank_entry`); None elsewhere. Read
#: this early, before a rank trains, so that an agent that dies before the rank is tied is still seen as gone.
AGENT_AT_START: int | None = os.getppid() if TORCHRUN_ENV in os.environ else None

#: The process this rank must not outlive (hintpipe's launcher, or torchrun's agent), once the rank is tied to
#: it (:mod:`hintpipe.runtime.rank_entry`); None where no one tied it (a process group the caller made).
_tied_to: int | None = None
#: Whether that process is this rank's parent's parent: a rank forked by the fork server (see
#: :mod:`hintpipe.runtime.fork_server`), whose parent is the server.
_through_server = False


def tie(process: int, *, through_server: bool = False) -> None:
    """Record the process this rank must not outlive: its parent, or its parent's parent (``through_server``)."""
    global _tied_to, _through_server
    _tied_to, _through_server = process, through_server


def tied() -> bool:
    """Whether this process is tied to a launcher or an agent already."""
    return _tied_to is not None


def orphaned() -> bool:
    """Whether the process this rank is tied to has gone (the rank, or the fork server it came from, was
    re-parented).

    [Note: nothing published after the launcher died]
    A rank notices its launcher's death within half a second (its watching thread), but a save already under
    way went on in that time: under torchrun a checkpoint appeared 0.31 s after the agent was killed (the fault
    campaign's ``agent`` kind). So rank 0 asks right before it publishes a checkpoint (the rename of its
    folder, then ``latest``) and leaves instead, publishing nothing.
    """
    parent = os.getppid()
    if _tied_to is None:  # not tied (yet): under torchrun, the agent this process started under
        return AGENT_AT_START is not None and parent != AGENT_AT_START
    return (parent_of(parent) if _through_server else parent) != _tied_to


def parent_of(pid: int) -> int | None:
    """The parent of process ``pid``, as /proc says; None where there is no /proc or no such process."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[1])


def stat_fields(pid: int | None) -> list[str] | None:
    """Process ``pid``'s /proc status fields after its name (state, parent, ...); None where there is no /proc
    or no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def is_torchrun(pid: int) -> bool:
    """Whether process ``pid`` is a torchrun agent (``torchrun`` or ``python -m torch.distributed.run``), as its
    command line in /proc says; False where there is no /proc or no such process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().split(b"\0")
    except OSError:
        return False
    return b"torch.distributed.run" in words or any(word.rsplit(b"/", 1)[-1] == b"torchrun" for word in words)
