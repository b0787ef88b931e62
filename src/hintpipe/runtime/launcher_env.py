"""What a launcher leaves in its ranks' environment: read by the rank's entry point before anything slow is
imported, and by the checkpoints (which process holds a run's folder; whether the launcher is still there).
Torch-free, and nothing else."""

from __future__ import annotations

import os

#: The environment variable in which hintpipe's launcher gives its ranks its pid.
LAUNCHER_ENV = "HINTPIPE_LAUNCHER_PID"
#: Set by torchrun in every rank it starts.
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"

#: The process this rank must not outlive (hintpipe's launcher, or torchrun's agent), once the rank is tied to
#: it (:mod:`hintpipe.runtime.rank_entry`); None where no one tied it (a process group the caller made).
_tied_to: int | None = None


def tie(parent: int) -> None:
    """Record the process this rank must not outlive."""
    global _tied_to
    _tied_to = parent


def orphaned() -> bool:
    """Whether the process this rank is tied to has gone (the rank was re-parented).

    [Note: nothing published after the launcher died]
    A rank notices its launcher's death within half a second (its watching thread), but a save already under
    way went on in that time: under torchrun a checkpoint appeared 0.31 s after the agent was killed (the fault
    campaign's ``agent`` kind). So rank 0 asks right before it publishes a checkpoint (the rename of its
    folder, then ``latest``) and leaves instead, publishing nothing.
    """
    return _tied_to is not None and os.getppid() != _tied_to
