"""Which rank stopped answering: heartbeats in the rendezvous store, read when a collective phase waits too long.

[Note: naming a frozen rank]
A collective phase (a save, a load, the start-up checks) waits for every
rank. A rank that is stopped (SIGSTOP, a frozen machine) holds the others in
the phase's collective until its timeout, and the collective's error names no
one ("Application timeout caused pair closure"). So every rank started by
:func:`hintpipe.runtime.launch.init_rank` writes a heartbeat (the wall clock)
into the store every second, from a thread of its own, which stops when its
process stops. When a phase fails, the ranks whose heartbeat is older than
:data:`SILENT_AFTER` are the ones that stopped answering, and the error names
them; the phase then ends at once instead of waiting again for them in its
own meeting. The phases run on a group whose timeout is the watchdog's
(:func:`phase_group`), so it all ends within the timeout and a few seconds.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import torch.distributed as dist

from hintpipe.runtime.errors import PeerFailure, backend_reason

#: Seconds without a heartbeat after which a rank counts as stopped (heartbeats come every second).
SILENT_AFTER = 3.0
_PERIOD = 1.0
_KEY = "hintpipe/alive/"


class _Liveness:
    """This process's heartbeat and the group its collective phases run on."""

    def __init__(self) -> None:
        self.store: Any = None
        self.world = 0
        self.group: dist.ProcessGroup | None = None
        self.timeout: float | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()


_STATE = _Liveness()


def start(store: Any, rank: int, world: int, timeout: float) -> None:
    """Beat every second into ``store`` and make the phases' group (call on every rank, after joining)."""
    _STATE.store, _STATE.world, _STATE.timeout = store, world, timeout
    _STATE.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))

    def once() -> bool:
        try:
            store.set(f"{_KEY}{rank}", repr(time.time()))
        except Exception:  # the store is gone: the job is ending
            return False
        return True

    def beat() -> None:
        while once() and not _STATE._stopping.wait(_PERIOD):
            pass

    _STATE._stopping.clear()
    once()  # now, so that a rank that never beats again is seen as silent from the start
    _STATE._thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    _STATE._thread.start()


def stop() -> None:
    """End the heartbeat before the process ends.

    Why: a daemon thread still inside a store call while the interpreter finalises is unwound through C++
    frames, which aborts the process ("terminate called without an active exception") after its work is
    done and its result written."""
    thread, _STATE._thread = _STATE._thread, None
    _STATE._stopping.set()
    if thread is not None:
        thread.join(timeout=5.0)


def phase_group() -> dist.ProcessGroup | None:
    """Every rank, with the watchdog's timeout (None where this process was not started by hintpipe)."""
    return _STATE.group


def phase_timeout() -> float | None:
    """The seconds a rank waits on a peer in a phase (the watchdog's), or None where hintpipe did not start
    this process."""
    return _STATE.timeout if _STATE.group is not None else None


def silent_ranks(world: int | None = None) -> dict[int, float]:
    """Rank -> seconds since its last heartbeat, for the ranks that stopped answering (empty when every rank
    answers, or where there are no heartbeats to read)."""
    store = _STATE.store
    if store is None:
        return {}
    now = time.time()
    silent = {}
    for rank in range(world if world is not None else _STATE.world):
        try:
            store.wait([f"{_KEY}{rank}"], datetime.timedelta(seconds=1))
            age = now - float(store.get(f"{_KEY}{rank}").decode())
        except Exception:
            continue  # no heartbeat to read: nothing to say about that rank
        if age > SILENT_AFTER:
            silent[rank] = age
    return silent


def wait_for_silence(seconds: float = SILENT_AFTER + 2 * _PERIOD) -> dict[int, float]:
    """The silent ranks, waiting up to ``seconds`` for one to show: when a collective fails because a peer
    died (its connection reset), that peer's last heartbeat is still recent."""
    deadline = time.monotonic() + seconds
    silent = silent_ranks()
    while not silent and _STATE.store is not None and time.monotonic() < deadline:
        time.sleep(_PERIOD / 2)
        silent = silent_ranks()
    return silent


def describe(silent: dict[int, float]) -> str:
    """``rank 1 stopped answering (no sign of life for 21 s)`` for each silent rank."""
    return "; ".join(f"rank {r} stopped answering (no sign of life for {age:.0f} s)" for r, age in silent.items())


def lost_peer(rank: int, where: str, exc: BaseException) -> PeerFailure:
    """The error for a collective of ``where`` that failed on ``rank`` (``exc``, the backend's own): the rank
    that stopped answering, when its heartbeat stops within seconds (a killed peer resets the connection at
    once, and the backend's text names an address, not a rank); the backend's first line otherwise."""
    silent = wait_for_silence()
    if silent:
        ranks = ", ".join(f"rank {r}" for r in silent)
        return PeerFailure(f"rank {rank}: {ranks} failed in {where} ({describe(silent)})")
    return PeerFailure(f"rank {rank}: {where} failed: {type(exc).__name__}: {backend_reason(str(exc))}")
