"""Collective phases whose failures reach every rank at once.

Saving, loading and start-up checks are phases in which every rank does its own
part and then meets the others. If one rank's part fails and it simply
raised, the others would wait at the next meeting point until the timeout,
printing nothing. :func:`together` makes each rank's outcome part of the
meeting: every rank runs its part, then one ``all_gather_object`` carries
either its result or its error, and if any rank failed *every* rank raises the
same one-line error naming it.

torch.distributed.checkpoint raises ``CheckpointException``, which derives from
``BaseException``; it is caught here with ``Exception`` so that a failed save
is reported like any other failure. KeyboardInterrupt and SystemExit are never
caught: a signal must stop the process. The class is looked up where
torch.distributed.checkpoint was loaded (:func:`_checkpoint_errors`), not
imported here: that package pulls in DTensor and takes about 0.6 s to import,
which every rank would pay at start-up for a run that never saves.

[Note: a rank stuck in its own part]
A rank blocked in its own part of a phase (file I/O that never returns: a
FIFO opened for reading, a hung file system) still beats its heartbeat, so
nothing named it, and when every rank was blocked so, nothing ended: a
``--resume`` whose checkpoint named a FIFO hung until it was killed. So a
rank's own part runs under a watchdog (:func:`_own_part`): when the part
has read and written nothing for the phase's timeout and a few seconds
(every peer waiting on it has given up by then; a long save that writes
goes on), a ``SIGALRM`` to the main thread interrupts the blocked call, and
the phase fails on that rank at once, naming what it awaited. Only on the
main thread (where a signal can be handled) and in a process hintpipe
started.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch.distributed as dist

from hintpipe.runtime import liveness

T = TypeVar("T")
_RANK = re.compile(r"^rank \d+: ")


def _checkpoint_errors() -> tuple[type[BaseException], ...]:
    """torch.distributed.checkpoint's ``CheckpointException``, if that package was loaded (nothing can have
    raised it otherwise)."""
    api = sys.modules.get("torch.distributed.checkpoint.api")
    found = getattr(api, "CheckpointException", None)
    return (found,) if isinstance(found, type) and issubclass(found, BaseException) else ()


class PhaseError(RuntimeError):
    """A collective phase failed on some rank; raised on every rank with the same text."""


class StuckInPhase(RuntimeError):
    """This rank's own part of a phase did not return within the phase's timeout (see [Note: a rank stuck in
    its own part])."""


#: Seconds past the phase's timeout before a rank's own part counts as stuck.
STUCK_GRACE_S = 5.0


@contextlib.contextmanager
def _own_part(what: str) -> Iterator[None]:
    """Run the block under the watchdog of [Note: a rank stuck in its own part]."""
    timeout = liveness.phase_timeout()
    if timeout is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    limit = timeout + STUCK_GRACE_S
    main = threading.main_thread()
    done = threading.Event()

    def stuck(signum: int, frame: object) -> None:
        raise StuckInPhase(
            f"its own part of {what} made no progress in {limit:.0f} s (blocked in file I/O: a FIFO, a hung file "
            "system?)"
        )

    def watch() -> None:
        last = _io_of(main)
        while not done.wait(limit):
            now = _io_of(main)
            if now is None or now == last:
                assert main.ident is not None
                signal.pthread_kill(main.ident, signal.SIGALRM)
                return
            last = now

    previous = signal.signal(signal.SIGALRM, stuck)
    watcher = threading.Thread(target=watch, name="phase-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGALRM, previous)


def _io_of(thread: threading.Thread) -> tuple[str, str] | None:
    """The bytes ``thread`` has read and written so far (Linux's per-thread counters: a save writing for longer
    than the timeout makes progress, a blocked ``open`` none; the heartbeat's writes are its own thread's);
    None where there are none to read."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/io") as counters:
            lines = counters.read().splitlines()
    except OSError:
        return None
    return lines[0], lines[1]  # rchar, wchar


def one_line(exc: BaseException) -> str:
    """An error as one line: torch's checkpoint errors carry each rank's traceback, which is not for users."""
    if isinstance(exc, _checkpoint_errors()) and getattr(exc, "failures", None):
        # torch gathers every rank's failure to every rank: {rank: (exception, its stack)}; name the first.
        rank, failure = next(iter(sorted(exc.failures.items())))  # type: ignore[attr-defined]
        inner = failure[0] if isinstance(failure, tuple) and failure else failure
        said = one_line(inner) if isinstance(inner, BaseException) else str(inner).splitlines()[0]
        return f"rank {rank}: {_strip_rank(said, rank)}"
    lines = str(exc).strip().splitlines()
    if type(exc).__module__.startswith("hintpipe"):  # our own errors are written to be read as they are
        return lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def together(
    action: Callable[[], T],
    what: str,
    *,
    group: dist.ProcessGroup | None = None,
    error: type[RuntimeError] = PhaseError,
) -> list[T]:
    """Run this rank's part of a collective phase; return every rank's result.

    Raises:
        ``error``: on every rank, if any rank's part raised; the text names
        each failed rank and its error, and starts with ``what``.
    """
    outcome: tuple[bool, Any]
    try:
        with _own_part(what):
            outcome = (True, action())
    except BaseException as exc:
        if not isinstance(exc, (Exception, *_checkpoint_errors())):
            raise  # KeyboardInterrupt, SystemExit: a signal must stop the process
        rank = dist.get_rank(group)
        stuck = _stuck_in(exc, rank)
        if stuck is not None:  # every peer has given up on this rank by now: no meeting to go to
            raise error(f"{what} failed (rank {rank}: {stuck})") from None
        outcome = (False, one_line(exc))
        silent = liveness.silent_ranks()
        if silent:  # a rank stopped: it will not come to the meeting either (see [Note: naming a frozen rank])
            raise error(f"{what} failed ({liveness.describe(silent)})") from None
    gathered: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(gathered, outcome, group=group)
    except RuntimeError as exc:
        silent = liveness.wait_for_silence()  # a peer that died a moment ago is silent a few seconds later
        raise error(f"{what} failed ({liveness.describe(silent) if silent else one_line(exc)})") from None
    failed = [(rank, text) for rank, (ok, text) in enumerate(gathered) if not ok]
    if failed:
        # An error that names its rank already (torch's checkpoint errors reach every rank) is said once.
        said = [text if _RANK.match(text) else f"rank {rank}: {text}" for rank, text in failed]
        raise error(f"{what} failed ({'; '.join(dict.fromkeys(said))})")
    return [result for _, result in gathered]


def _stuck_in(exc: BaseException, rank: int) -> StuckInPhase | None:
    """The watchdog's error of this rank (``rank``) inside ``exc`` (torch.distributed.checkpoint wraps what
    every rank's part raised: another rank's is not this one's)."""
    seen: list[BaseException | None] = [exc]
    looked: set[int] = set()
    while seen:
        found = seen.pop()
        if isinstance(found, StuckInPhase):
            return found
        if found is not None and id(found) not in looked:
            looked.add(id(found))
            failures = getattr(found, "failures", None)
            pair = failures.get(rank) if isinstance(failures, dict) else None
            seen += [pair[0] if isinstance(pair, tuple) and pair else None, found.__cause__, found.__context__]
    return None


def _strip_rank(text: str, rank: int) -> str:
    """Errors already naming their rank ("rank 1: ...") are not named twice."""
    prefix = f"rank {rank}: "
    return text[len(prefix) :] if text.startswith(prefix) else text
