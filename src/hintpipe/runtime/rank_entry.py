"""The first code a spawned rank runs: it ties itself to its launcher before anything slow.

[Note: ranks never outlive their launcher]
A rank spawned by :func:`hintpipe.runtime.launch.run_ranks` must end when its
launcher does, even when the launcher is killed with SIGKILL and cannot stop
it: otherwise the rank trains the whole job on its own and writes checkpoints
into a folder a restarted job will use. Importing torch takes seconds, and a
launcher killed during them is gone before any check after the import could
run. So this module imports nothing slow at its top, and a rank starts here:
it asks the kernel to kill it when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, Linux), so that a launcher killed during the
import takes the rank with it; imports torch; then checks that its parent is
still the launcher whose pid the launcher put in the environment (it may
have died before the request, or during the import where there is no
``prctl``: the rank was re-parented), and only then runs. A rank forked by
the fork server (Linux; see :mod:`hintpipe.runtime.fork_server`) has the
server as its parent and the launcher as its parent's parent, and the
server outlives the launcher while any rank it forked lives (a forked process
holds the server's pipe): the parent-death signal never reaches such a rank,
and it checks its parent's parent instead. A thread that compares the parent
(or the parent's parent) with that pid every half second covers the rest of
the run, and systems without ``prctl``; it starts after torch's import (see [Note: torch
before threads]).

[Note: ranks never outlive torchrun's agent]
Under ``torchrun`` the ranks are the agent's children: when the agent is
killed (SIGKILL, the out-of-memory killer) nobody stops them, and they trained
on and wrote checkpoints into the folder a restarted job would use. So a rank
that torchrun started (``TORCHELASTIC_RUN_ID`` is set) takes its parent at
start as its agent and ends (exit status 1, nothing more written) once its
parent changes: the same watching thread, every half second. However the
rank's process group was made: :func:`~hintpipe.runtime.launch.run_ranks`
ties it as it joins, and a :class:`~hintpipe.runtime.pipeline.Pipeline` built
in a process group of the caller's own (``init_process_group`` in the user's
script) ties it as it is built; the agent is the parent the rank had when it
first imported this module's torch-free companion
(:data:`~hintpipe.runtime.launcher_env.AGENT_AT_START`), so an agent that died
in between is seen as gone, and rank 0 publishes no checkpoint once it is (see
[Note: nothing published after the launcher died]), tied or not. No
``PR_SET_PDEATHSIG`` here: it fires when the *thread* that started the
process ends, and the agent's threads are not ours to know. A rank started
through a wrapper (``torchrun ... sh -c 'python train.py'``) has the wrapper
as parent: it is watched instead, and must itself end with the agent.

[Note: torch before threads]
A rank that imported torch while the watching thread already ran computed
the last stage's forward on variable-length micro-batches 1.5-1.9x as long
as the same computation alone (CPU time), against 1.2-1.4x when torch came
first; equal lengths and the other tasks were the same either way
(``benchmarks/shape-tax``, "The last stage's forward, rerun", interleaved
repeats). Why the import's order matters is not known (oneDNN off around
the tasks changed nothing); the import comes before the thread because that
is what was measured, and it costs nothing: the parent check after it still
ends a rank whose launcher died at any moment of start-up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import Any

from hintpipe.runtime import launcher_env
from hintpipe.runtime.launcher_env import LAUNCHER_ENV, TORCHRUN_ENV

_PR_SET_PDEATHSIG = 1
#: What :mod:`hintpipe.runtime.fork_server` ignores (not imported here: importing it makes a process ignore them).
_SERVER_IGNORES = (signal.SIGTERM, signal.SIGHUP)

#: The process a SIGINT reached while :func:`note_sigint_while_starting` was its handler (None: none did).
_sigint_reached: int | None = None


def note_sigint_while_starting(signum: int, frame: Any) -> None:
    """The SIGINT handler a rank forked by the fork server starts with: it notes the signal, for
    :func:`start_rank` to act on, instead of raising where multiprocessing cannot take it.

    [Note: a SIGINT before the rank's own code]
    A rank forked by the fork server gets the handlers the server had after its preload back in
    multiprocessing's ``_serve_one``, then unpickles its process object and runs multiprocessing's
    ``_bootstrap`` before :func:`start_rank`. With Python's own handler, a Ctrl-C to the process group that
    landed there raised ``KeyboardInterrupt`` in multiprocessing's code: it printed ``Process ...:`` and a
    traceback, and the rank ended with exit status 1, which the launcher reported as a failure (seen once in a
    loaded test suite, which expects exit status 130). The preload installs this handler instead, so the
    signal is noted, not raised, and :func:`start_rank` ends the rank as a SIGINT would have (exit status 130)
    once its own code runs. The process's pid is noted rather than a flag, so a SIGINT that reached the server
    itself (while it finished its preload) is not taken by every rank it forks for one of its own. Between the
    fork and ``_serve_one``'s handlers, a few lines, the server's ``SIG_IGN`` holds: a SIGINT there is lost,
    and the rank stops at the launcher's stop file after its first step instead.
    """
    global _sigint_reached
    _sigint_reached = os.getpid()


def _die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent dies (Linux); nothing elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watching thread alone


def tie_to_launcher() -> None:
    """End this process at once if its launcher is gone, now or later; import torch on the way, before this
    process's first thread (see the module's Notes). Nothing where no launcher of ours started the process."""
    expected = os.environ.get(LAUNCHER_ENV)
    if expected is None:
        return
    launcher = int(expected)
    _die_with_parent()
    import torch  # noqa: F401  # before this process's first thread (see [Note: torch before threads])

    parent = os.getppid()
    through_server = parent != launcher  # forked by the fork server: the launcher is the server's parent
    if through_server and launcher_env.parent_of(parent) != launcher:
        os._exit(1)  # it died while this rank started: stop before anything is written
    _watch(launcher, through_server=through_server)


def tie_to_agent() -> None:
    """Under torchrun, end this process within a second of its agent's death (see [Note: ranks never outlive
    torchrun's agent]); nothing elsewhere, or where it is tied already. Call once torch is imported."""
    if TORCHRUN_ENV not in os.environ or launcher_env.tied():
        return
    agent = launcher_env.AGENT_AT_START or os.getppid()
    # Orphaned already, before or since hintpipe was first imported: re-parented to init, unless init is the
    # agent itself (torchrun as a container's entry point, PID 1 of its namespace).
    if os.getppid() != agent or (agent == 1 and not launcher_env.is_torchrun(1)):
        os._exit(1)
    _watch(agent)


def _watch(process: int, *, through_server: bool = False) -> None:
    launcher_env.tie(process, through_server=through_server)  # checked again right before a checkpoint is published

    def watch() -> None:
        while not launcher_env.orphaned():
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


class LauncherStreams:
    """The launcher's stdout and stderr, given to a rank as they are at this launch.

    A rank forked by the fork server inherits the server's file descriptors, which are the launcher's as they
    were when the server started: a launcher that redirected its output since (a test capturing it, a job
    writing a log) would lose its ranks' lines. Pickled while multiprocessing starts the rank, this sends the
    two descriptors along (``multiprocessing.reduction.DupFd``), and :meth:`attach` puts them in place."""

    def __init__(self, fds: tuple[Any, ...] | None = None) -> None:
        self._fds = fds

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (LauncherStreams, (tuple(reduction.DupFd(fd) for fd in _STREAMS),))

    def attach(self) -> None:
        """In the rank: the launcher's streams as this process's stdout and stderr."""
        if self._fds is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip(_STREAMS, self._fds, strict=True):
            received = fd.detach()
            os.dup2(received, target)
            os.close(received)


#: Standard output and standard error.
_STREAMS = (1, 2)


def start_rank(
    rank: int,
    world: int,
    packed: bytes,
    out: str,
    timeout: float,
    device: str = "auto",
    environment: dict[str, str] | None = None,
    streams: LauncherStreams | None = None,
) -> None:
    """A spawned rank's entry point: tied to its launcher first (torch imported meanwhile), then
    :func:`hintpipe.runtime.rank_process.run_rank` on the function and arguments ``packed`` holds, on ``device``
    (a choice). ``environment``: the launcher's, which a rank forked by the fork server takes in place of the
    server's (see :mod:`hintpipe.runtime.fork_server`), with its ``streams``; the server's ignored signals get
    their default actions back."""
    if streams is not None:
        streams.attach()
    if environment is not None:
        os.environ.clear()
        os.environ.update(environment)
    for sig in _SERVER_IGNORES:
        signal.signal(sig, signal.SIG_DFL)
    try:
        # See [Note: a SIGINT before the rank's own code].
        if signal.getsignal(signal.SIGINT) is note_sigint_while_starting:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if _sigint_reached == os.getpid():
            raise KeyboardInterrupt
        tie_to_launcher()
        from hintpipe.runtime.rank_process import run_rank
    except KeyboardInterrupt:  # Ctrl-C to the process group while this rank started: said by the launcher
        os._exit(_INTERRUPTED_STATUS)
    run_rank(rank, world, packed, out, timeout, device)


#: :data:`hintpipe.runtime.rank_process.INTERRUPTED_STATUS` (not imported: this module imports nothing slow).
_INTERRUPTED_STATUS = 130
