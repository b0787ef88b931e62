"""Stopping on a signal: finish the step, save, leave; a second signal stops at once.

A preemption (SIGTERM), a Ctrl-C (SIGINT) or a dropped session (SIGHUP) may reach every process of the job
(a terminal sends Ctrl-C to its whole process group; torchrun forwards
SIGTERM to its workers) or only the launcher (``kill -INT <pid>``). Each rank
therefore listens for both: its own signals, and a *stop file* that
:func:`hintpipe.runtime.launch.run_ranks` creates when the launcher alone is
signalled (the path is in ``HINTPIPE_STOP_FILE``).

Ranks notice a request at different moments, so stopping is agreed: after
each step, :meth:`StopRequest.agreed` takes one all-reduce (the largest signal
number any rank received), and every rank stops after the same step.

The first signal only records itself and puts the default action back, so a
second signal ends the process at once, whatever it is doing.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist

from hintpipe.runtime import liveness

STOP_FILE_ENV = "HINTPIPE_STOP_FILE"
#: What asks a job to stop: Ctrl-C, a preemption, and a dropped terminal or SSH session (SIGHUP reaches the
#: launcher and its ranks, the session's process group).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequest:
    """Whether this job has been asked to stop (use as a context manager on every rank).

    Example::

        with StopRequest() as stop:
            for step in range(steps):
                pipe.step(inputs, targets)
                optimizer.step()
                if stop.agreed(step=step):
                    save_checkpoint(...)
                    break
    """

    def __init__(self, stop_file: str | Path | None = None) -> None:
        path = stop_file if stop_file is not None else os.environ.get(STOP_FILE_ENV)
        self.stop_file = Path(path) if path else None
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum
        for sig in SIGNALS:  # the next one takes the default action: the process ends at once
            signal.signal(sig, signal.SIG_DFL)

    @property
    def requested(self) -> bool:
        """This rank was signalled, or the launcher was."""
        if self.signal is None and self.stop_file is not None and self.stop_file.exists():
            try:
                self.signal = int(self.stop_file.read_text().strip() or signal.SIGTERM)
            except ValueError:
                self.signal = int(signal.SIGTERM)
        return self.signal is not None

    def agreed(self, group: dist.ProcessGroup | None = None, *, step: int | None = None) -> bool:
        """Whether any rank was asked to stop (call on every rank after each step; one all-reduce).

        ``step``, the step just run, is named in the error when a peer is lost during the check, so that a
        killed rank's neighbour says which step the job had reached.
        """
        flag = torch.tensor([self.signal if self.requested else 0], dtype=torch.int64)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        except RuntimeError as exc:
            after = "a step" if step is None else f"step {step}"
            raise liveness.lost_peer(dist.get_rank(), f"the check for a stop request after {after}", exc) from None
        if int(flag) and self.signal is None:
            self.signal = int(flag)
        return bool(int(flag))

    @property
    def name(self) -> str:
        """The signal's name (``SIGTERM``), or an empty string."""
        return signal.Signals(self.signal).name if self.signal else ""
