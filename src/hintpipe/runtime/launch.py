"""Starting ranks: spawn them on one machine, or join a ``torchrun`` launch.

``hintpipe train`` calls :func:`run_ranks`. Under ``torchrun`` (the
environment has ``RANK`` and ``WORLD_SIZE``) this process *is* one rank and the
function runs once, in place; otherwise it spawns one process per rank on this
machine, meeting in a file store in the launcher's private folder. Either way each rank initialises
torch.distributed (gloo on CPU, NCCL when the rank has a GPU), uses one CPU
thread, runs ``fn(rank, world_size, *args)``, and its return value comes back
to the caller (rank 0's under torchrun).

If any rank fails, the others get a few seconds to report what they saw, then
are stopped, and the failure is raised with the failing ranks' errors, so
nothing is left hanging. A spawned rank whose launcher dies exits too, however early (see [Note: ranks
never outlive their launcher] in :mod:`hintpipe.runtime.rank_entry`).

[Note: signals to the launcher]
The first SIGINT, SIGTERM or SIGHUP to the launcher writes the stop file that
every rank's :class:`~hintpipe.runtime.checkpoint.stopping.StopRequest` watches: the ranks
finish their step, save and return. A second signal, SIGQUIT (or ranks still
running ``timeout + 10`` seconds later) kills them at once and raises
:class:`Interrupted`. The temporary folder is removed either way.

[Note: Ctrl-C to the process group]
Ctrl-C at a terminal sends SIGINT to the whole process group: the launcher,
the fork server (which ignores it) and every rank. A rank that handles it (a
training loop inside a :class:`~hintpipe.runtime.checkpoint.stopping.StopRequest`)
stops after its step; a rank that does not (still starting, or a function of
the caller's own) ends with a ``KeyboardInterrupt``, which its peers then see
as a failure. That was reported as ``failed: ranks 0, 1: KeyboardInterrupt``
with exit status 1; now, when the launcher received the SIGINT too and a rank
ended by it, the launcher raises :class:`Interrupted` (exit status 130), as
for any stop by a signal.

[Note: no listening socket beyond loopback]
A rendezvous store is an unauthenticated key-value server: anyone who can
reach it reads and writes every key (the ranks' addresses, heartbeats, error
reports). The launcher's TCPStore listened on every interface for the whole
run, though ranks spawned on one machine need no network to meet. So they
meet in a ``torch.distributed.FileStore`` in the launcher's temporary folder
(made by :func:`tempfile.mkdtemp`: mode 0700, this user's alone); only
gloo's own connections between the ranks remain, on the loopback interface
(``GLOO_SOCKET_IFNAME``, and NCCL's, unless the caller set them; ``tests/runtime/test_sockets.py`` lists every listening
socket of a run and finds none elsewhere). Heartbeats append to the file
(about 60 bytes per rank per second); it goes with the folder. Under
``torchrun`` the store is torchrun's (see the README's "Under torchrun").

[Note: elastic restarts]
Under ``torchrun --max-restarts N`` a restarted attempt meets in the same
rendezvous store as the failed one, where the failed attempt's keys (gloo's
peer addresses among them) are still present. Each attempt therefore works
under its own key prefix (``TORCHELASTIC_RESTART_COUNT``).
"""

from __future__ import annotations

import ast
import multiprocessing
import multiprocessing.context
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch.distributed as dist

from hintpipe.device_choice import DeviceChoice
from hintpipe.runtime import liveness
from hintpipe.runtime.checkpoint.stopping import SIGNALS
from hintpipe.runtime.errors import Interrupted, RankFailure
from hintpipe.runtime.launcher_env import LAUNCHER_ENV, stat_fields
from hintpipe.runtime.rank_entry import LauncherStreams, start_rank, tie_to_agent
from hintpipe.runtime.rank_process import (
    INTERRUPTED,
    INTERRUPTED_STATUS,
    attempt,
    error_text,
    free_port,
    init_rank,
    under_torchrun,
)

__all__ = ["Interrupted", "RankFailure", "attempt", "free_port", "init_rank", "run_ranks", "under_torchrun"]

#: Seconds the surviving ranks get, after one failed, to report what they saw (at most the watchdog's timeout and 5
#: more). A survivor inside a checkpoint's phase names the dead peer once its heartbeat has been silent a few seconds
#: and the phase has met that; on a loaded machine that took over 10 s (the survivor was stopped by the launcher,
#: unnamed), so 20.
FAILURE_GRACE_S = 20.0


#: Signals that stop the ranks at once (SIGQUIT, Ctrl-\\: "quit now"); the launcher still ends every rank,
#: removes its folder and says so in one line.
AT_ONCE = (signal.SIGQUIT,)


class _Signals:
    """The launcher's signal handling while its ranks run (see [Note: signals to the launcher])."""

    def __init__(self, stop_file: Path) -> None:
        self.stop_file = stop_file
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (*SIGNALS, *AT_ONCE):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        name = signal.Signals(signum).name
        if len(self.received) == 1 and signum not in AT_ONCE:
            self.stop_file.write_text(str(signum))
            print(
                f"hintpipe: {name}: the ranks stop after their step (saving a checkpoint if they keep them); "
                f"{name} again stops at once",
                file=sys.stderr,
                flush=True,
            )

    @property
    def at_once(self) -> bool:
        return len(self.received) > 1 or any(sig in AT_ONCE for sig in self.received)


def run_ranks(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    timeout: float = 300.0,
    device: str | DeviceChoice = "auto",
    timeout_s: float | None = None,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on every rank; returns every rank's result, in rank order, however the
    ranks were started.

    Where the code after it runs: spawned here (``python train.py``), the ranks are other processes and the
    list comes back in this one, the launcher, alone: what follows runs once. Under ``torchrun`` this process
    is one of the ranks and every rank gets the whole list (gathered once ``fn`` returned everywhere): what
    follows runs on every rank, so write files from one of them (``int(os.environ["RANK"]) == 0``).

    ``device`` (``auto``, ``cpu``, ``cuda``) is where the ranks compute: it sets each rank's GPU current and
    the default group's backends (see :func:`init_rank`); ``cpu`` makes no CUDA call. ``timeout``: seconds a
    rank waits on a peer before it fails naming what it awaited, as ``Pipeline(timeout=...)``'s
    (``timeout_s``: its name before 0.7, still taken, with a ``DeprecationWarning``).

    Raises:
        RankFailure: naming each rank that failed and its error.
        Interrupted: the ranks were killed after a second signal, or did not stop in time after the first.
        ValueError: an unknown ``device``.
    """
    if timeout_s is not None:
        warnings.warn("run_ranks(timeout_s=...) is now run_ranks(timeout=...)", DeprecationWarning, stacklevel=2)
        timeout = timeout_s
    device = DeviceChoice.parse(device)
    if under_torchrun():
        return _as_a_torchrun_rank(fn, world, args, timeout, device)
    _check_importable_again(fn)
    # The ranks meet in a file in this launcher's private folder, served by no one: no port is open, and a rank
    # stopped by SIGSTOP (or a debugger) stops no store with it (see [Note: no listening socket beyond
    # loopback]).
    remove_stale_folders()
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX) as out, _Signals(Path(out) / "stop") as signals:
        (Path(out) / LAUNCHER_FILE).write_text(str(os.getpid()))
        # [Note: every rank its own copy] The arguments travel as plain pickled bytes: torch's
        # process spawning would otherwise move their tensors into shared memory, and every rank
        # would train one and the same parameters (a plan's weights, stepped by each optimizer).
        # The function travels as plain pickled bytes too, so that a rank unpickles it (importing torch) only
        # once it is tied to this launcher (see [Note: ranks never outlive their launcher]).
        packed = pickle.dumps((fn, args))
        os.environ[LAUNCHER_ENV] = str(os.getpid())
        spawner = rank_starter()
        environment = dict(os.environ)  # the server's are the ones it started with (see fork_server)
        processes = [
            spawner.Process(
                target=start_rank,
                args=(rank, world, packed, out, timeout, device.value, environment, LauncherStreams()),
                name=f"rank {rank}",
            )
            for rank in range(world)
        ]
        for process in processes:
            process.start()
        killed, stopped_here = _watch(processes, signals, timeout)
        return _collect(Path(out), processes, signals, killed, stopped_here)


def _as_a_torchrun_rank(
    fn: Callable[..., Any], world: int, args: tuple[Any, ...], timeout: float, device: DeviceChoice
) -> list[Any]:
    """:func:`run_ranks` under ``torchrun``: this process is one of the ranks; every rank gets every result.

    [Note: a torchrun rank's error]
    A spawned rank's error reaches its launcher as a line of a ``RankFailure`` (``rank 1: PeerFailure: ...``),
    which the command line says in one line. Under ``torchrun`` this process is the rank, and its error came out
    as itself: the command line said it as a traceback (``hintpipe.runtime.errors.PeerFailure: rank 1: rank 0
    never joined the run ...`` at the end of 40 lines), and torchrun's report as "To enable traceback see ...".
    So it is raised as the ``RankFailure`` a spawned rank's would be, the same words, the error itself chained."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if size != world:
        raise RankFailure(f"torchrun started {size} ranks, the pipeline needs {world}")
    tie_to_agent()  # see [Note: ranks never outlive torchrun's agent]
    try:
        init_rank(rank, size, timeout, device)
    except Exception as exc:
        raise RankFailure(f"rank {rank}: {error_text(exc)}") from exc
    try:
        results: list[Any] = [None] * size
        dist.all_gather_object(results, fn(rank, size, *args))
        return results
    except RankFailure:
        raise
    except Exception as exc:  # this rank's error, worded as a spawned rank's (see [Note: a torchrun rank's error])
        raise RankFailure(f"rank {rank}: {error_text(exc)}") from exc
    finally:
        liveness.stop()
        dist.destroy_process_group()


def _check_importable_again(fn: Callable[..., Any]) -> None:
    """Refuse, before any rank starts, a ``fn`` the spawned ranks could not import again (see [Note: the main
    guard]): defined in code that is no file, or called at a script's top level outside its main guard."""
    unreadable = _main_not_a_file(fn)
    if unreadable is not None:
        raise RankFailure(
            f"run_ranks starts processes that import the code defining {getattr(fn, '__qualname__', fn)} again, and "
            f"{unreadable} is not a file they can read: save it as a file and run that (python train.py), or "
            "import the function from a module"
        )
    unguarded = _outside_main_guard()
    if unguarded is not None:
        path, line = unguarded
        raise RankFailure(
            f"{path}, line {line}: run_ranks starts processes that import this script again; put the code that "
            'calls it under `if __name__ == "__main__":`'
        )


def rank_starter() -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """How ranks start: forked from the fork server on Linux (torch imported once, see [Note: ranks forked from a
    server that imported torch once] in :mod:`hintpipe.runtime.fork_server`), spawned elsewhere."""
    if sys.platform != "linux" or stat_fields(os.getpid()) is None:  # a forked rank finds its launcher in /proc
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["hintpipe.runtime.fork_server", *_loaded_libraries()])
    return context


def _loaded_libraries() -> list[str]:
    """transformers, where this process has imported it, and the Hugging Face model code it has (each
    ``transformers.models.<name>.modeling_<name>`` module), in the order imported.

    [Note: what the fork server imports]
    A launcher that built or read a Hugging Face model (``hintpipe train --model FOLDER`` reads its config and
    plans it, a script builds its model before ``run_ranks``) starts ranks that build it again: each rank
    imported transformers, 1.3 s of CPU, and the model's code after it. The fork server imports them once
    instead, as it does torch (see [Note: ranks forked from a server that imported torch once] in
    :mod:`hintpipe.runtime.fork_server`), where the launcher imported them before its first launch: a
    launcher that never imports them does not make its ranks pay for them. Importing them starts no thread (a
    tokenizer's start when it first encodes), so forking after it is safe; ``datasets`` is left to the ranks:
    its pyarrow starts jemalloc's background thread on import."""
    if "transformers" not in sys.modules:
        return []
    return ["transformers"] + [n for n in sys.modules if n.startswith("transformers.models.") and ".modeling_" in n]


#: The launcher's temporary folder (results, the stop file) and the file in it that names the launcher.
FOLDER_PREFIX = "hintpipe-"
LAUNCHER_FILE = "launcher.pid"


def remove_stale_folders() -> list[Path]:
    """Remove the temporary folders of launchers that died without removing them (SIGKILL, SIGQUIT); their
    ranks died with them (see :mod:`hintpipe.runtime.rank_entry`). Returns what was removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"):
        try:
            pid = int((folder / LAUNCHER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not a launcher's folder, or one still being made
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _watch(processes: list[Any], signals: _Signals, timeout: float) -> tuple[bool, set[int]]:
    """Wait for the ranks; returns whether they had to be killed on a signal, and the ranks this launcher
    killed (a rank killed by anyone else is reported as such).

    Watched here rather than with context.join(), which kills the survivors the
    moment one rank fails: they must get the chance to notice and report it.
    """
    failed_at: float | None = None
    signalled_at: float | None = None
    killed = False
    stopped_here: set[int] = set()
    while any(p.is_alive() for p in processes):
        now = time.monotonic()
        if failed_at is None and any(p.exitcode not in (None, 0) for p in processes):
            failed_at = now
        if signalled_at is None and signals.received:
            signalled_at = now
        late_failure = failed_at is not None and now - failed_at > min(timeout + 5.0, FAILURE_GRACE_S)
        # A rank stopped by SIGSTOP cannot notice anything: once a peer has failed and every
        # rank still alive is stopped, nobody is left to report, so waiting out the grace is waste.
        if failed_at is not None and all(_stopped(p.pid) for p in processes if p.is_alive()):
            late_failure = True
        late_stop = signalled_at is not None and now - signalled_at > timeout + 10.0
        if signals.at_once or late_stop or late_failure:
            killed = signals.at_once or late_stop
            for rank, process in enumerate(processes):
                if process.is_alive():
                    process.kill()
                    stopped_here.add(rank)
            break
        time.sleep(0.05)
    for process in processes:
        process.join(timeout=5.0)
    return killed, stopped_here


def _stopped(pid: int | None) -> bool:
    """Whether a process is stopped (SIGSTOP, SIGTSTP), as /proc says; False where there is no /proc."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def _collect(out: Path, processes: list[Any], signals: _Signals, killed: bool, stopped_here: set[int]) -> list[Any]:
    results: list[Any] = []
    errors: list[str] = []
    interrupted = False  # a rank ended by SIGINT (see [Note: Ctrl-C to the process group])
    for rank, process in enumerate(processes):
        path = out / f"rank{rank}.pkl"
        if not path.exists():
            how = "stopped by the launcher" if rank in stopped_here else _how_it_ended(process.exitcode)
            interrupted |= process.exitcode in (INTERRUPTED_STATUS, -signal.SIGINT)
            errors.append(f"rank {rank}: exited without a result ({how})")
            results.append(None)
            continue
        outcome = pickle.loads(path.read_bytes())
        if outcome[0] == "ok":
            results.append(outcome[1])
        else:
            interrupted |= outcome[0] == INTERRUPTED
            errors.append(f"rank {rank}: {outcome[1]}")
            results.append(None)
    if interrupted and signal.SIGINT in signals.received and not killed:
        raise Interrupted(
            "ranks stopped by SIGINT before they could finish their step; nothing more was saved", int(signal.SIGINT)
        )
    if killed:
        name = signal.Signals(signals.received[-1]).name
        if signals.received[-1] in AT_ONCE:
            how = name
        elif signals.at_once:
            how = f"a second {name}"
        else:
            how = f"{name}, and they did not stop in time"
        raise Interrupted(f"ranks killed after {how}; nothing more was saved", signals.received[-1])
    if errors or any(p.exitcode != 0 for p in processes):
        raise RankFailure(_merge(errors) or "a rank failed")
    return results


def _how_it_ended(exitcode: int | None) -> str:
    """Why a rank that wrote no result (and that this launcher did not stop) ended, in words: a signal killed
    it (the out-of-memory killer sends SIGKILL), or it exited before it could report (an error while it
    started: its traceback is on stderr)."""
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    if exitcode == FORK_SERVER_GONE:
        return "its fork server ended (killed?), and it with it, or exit status 255 before it could report"
    return f"exit status {exitcode} before it could report; its error is on stderr above"


#: What multiprocessing gives as the exit status of a process whose fork server is gone.
FORK_SERVER_GONE = 255


def _outside_main_guard() -> tuple[str, int] | None:
    """Where the script being run calls :func:`run_ranks` outside ``if __name__ == "__main__":`` (its file and
    line), or None (guarded, or not run from a file).

    [Note: the main guard]
    A spawned rank starts a fresh interpreter that imports the script again (as ``__mp_main__``): a call at
    the script's top level would run again in every rank, which torch's spawning refuses with a long
    traceback per rank. So the launcher refuses it first, in one line that names the line to move.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not str(path).endswith(".py") or not Path(path).is_file():
        return None
    spec = getattr(main, "__spec__", None)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return None  # a package's __main__ (python -m hintpipe): multiprocessing does not import it again
    frame: FrameType | None = sys._getframe(1)
    line = None
    while frame is not None:  # the script's own top-level frame: where the chain of calls began
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    tree = ast.parse(Path(path).read_text())
    guards = [n for n in tree.body if isinstance(n, ast.If) and {"__name__", "__main__"} <= _words(n.test)]
    if any(n.lineno <= line <= (n.end_lineno or n.lineno) for n in guards):
        return None
    return str(path), line


def _main_not_a_file(fn: Callable[..., Any]) -> str | None:
    """What the ranks could not import again where ``fn`` is defined (``<stdin>``: code piped into
    ``python -``; code given with ``-c``, typed at the prompt or in a notebook's cell), else None.

    A spawned rank re-runs the launcher's ``__main__`` from its file (see [Note: the main guard]) to find a
    function defined there. Without one each rank died, with ``FileNotFoundError: ... '<stdin>'`` (and the
    launcher said only that the ranks exited without a result), or with ``AttributeError: Can't get attribute
    'f' on <module '__main__' (built-in)>``. A module run by name (``python -m``) is imported by its name."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None):
        return None
    path = getattr(main, "__file__", None)
    if path is not None:
        return None if Path(path).is_file() else f"the script {path}"
    if getattr(fn, "__module__", None) != "__main__":
        return None  # the function is a module's: the ranks import that
    return "code given with python -c" if sys.argv[:1] == ["-c"] else "code typed at the prompt or in a notebook"


def _words(test: ast.expr) -> set[str]:
    """The names and strings a condition mentions (``__name__ == "__main__"``: both)."""
    return {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} | {
        n.value for n in ast.walk(test) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _merge(errors: list[str]) -> str:
    """Ranks that failed with the same error (a collective phase raises it on every rank) in one line."""
    by_text: dict[str, list[str]] = {}
    for line in errors:
        rank, _, text = line.partition(": ")
        by_text.setdefault(text, []).append(rank.removeprefix("rank "))
    return "\n".join(
        f"rank {ranks[0]}: {text}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}: {text}"
        for text, ranks in by_text.items()
    )
