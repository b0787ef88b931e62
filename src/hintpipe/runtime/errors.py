"""The runtime's errors, in one torch-free module (the command line catches them
without importing torch).

Every error that ends a step names the rank that raised it, what it waited
for or what failed, and the step.
"""

from __future__ import annotations

import re


class WatchdogTimeout(RuntimeError):
    """A rank waited longer than the timeout with nothing ready (or for a collective)."""


class NonFiniteLoss(FloatingPointError):
    """The loss of a micro-batch is NaN or infinite: the step stops before the optimizer runs."""


class TaskError(RuntimeError):
    """A stage's computation failed (e.g. a shape it cannot accept), named by task and micro-batch."""


class OptionMismatch(ValueError):
    """Ranks were started with different pipeline options."""


class PeerFailure(RuntimeError):
    """A neighbour crashed, closed its connection or reported an error."""


class RankFailure(RuntimeError):
    """One or more ranks ended with an error; the message has each rank's error."""


class Interrupted(RankFailure):
    """The ranks were killed by a signal (a second Ctrl-C, or a stop that took too long)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, read, or does not match the run (one line)."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are missing, incomplete or altered."""


def backend_reason(text: str) -> str:
    """The first line of a communication backend's error without what only its developers need: gloo's
    ``[/__w/.../pair.cc:553] Connection closed by peer [127.0.0.1]:5506. This is typically caused by a remote
    worker crashing. ...`` is ``Connection closed by peer [127.0.0.1]:5506``."""
    lines = text.strip().splitlines()
    first = re.sub(r"^\[[^\]]*\]\s*", "", lines[0] if lines else "")
    return first.split(". This is typically")[0].rstrip(".")
