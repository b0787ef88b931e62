"""What a spawned rank runs once it is tied to its launcher (:mod:`~hintpipe.runtime.rank_entry`): join the
process group, run the function, leave its result; and what a rank under ``torchrun`` shares with it (joining
the group, which attempt this is).

Kept apart from the launcher's side (:mod:`~hintpipe.runtime.launch`, which spawns the ranks and collects
what they leave), so that the rank's entry point calls into this without importing the launcher.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import multiprocessing.util
import os
import pickle
import socket
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FileStore
from torch.distributed.distributed_c10d import PrefixStore
from torch.distributed.rendezvous import rendezvous

from hintpipe.device import gpu_identity, own_gpu, rank_device
from hintpipe.device_choice import DeviceChoice
from hintpipe.renamed import renamed
from hintpipe.runtime import liveness, planning_beats
from hintpipe.runtime.checkpoint.stopping import STOP_FILE_ENV
from hintpipe.runtime.errors import PeerFailure

#: What a rank leaves when a SIGINT ended it (a ``KeyboardInterrupt``), and its exit status when the signal
#: came before it could leave anything.
INTERRUPTED = "interrupted"
INTERRUPTED_STATUS = 130

#: The spawned ranks' rendezvous store, in the launcher's temporary folder.
STORE_FILE = "store"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@renamed("init_rank", timeout_s="timeout")
def init_rank(
    rank: int,
    world: int,
    timeout: float = 300.0,
    device: str | DeviceChoice = DeviceChoice.AUTO,
    store_file: str | None = None,
) -> torch.device:
    """Join the process group on ``device`` (a choice: the rank's GPU where there is one with ``auto``); returns
    the rank's device. The ranks meet in the file store ``store_file`` (spawned by :func:`run_ranks`, see [Note:
    no listening socket beyond loopback]), or where the environment says (MASTER_ADDR/PORT: torchrun's store).
    ``timeout``: seconds a rank waits on its peers (at least 30; ``timeout_s`` before 0.7, still taken, with a
    ``DeprecationWarning``).

    On CUDA, the default group takes CPU tensors over gloo and CUDA tensors over
    NCCL, and gloo alone where ranks share a GPU (NCCL refuses two ranks on one
    device; see [Note: who shares a GPU] in :mod:`hintpipe.device`). With ``cpu``
    no CUDA call is made: a rank that computes on the host makes no CUDA context.
    """
    torch.set_num_threads(1)
    # The mailbox threads must get the interpreter promptly while the main
    # thread computes: hand it over every 0.5 ms instead of every 5 ms.
    sys.setswitchinterval(0.0005)
    chosen = rank_device(device, rank)  # the rank's GPU where asked and present, set current
    wait = datetime.timedelta(seconds=max(timeout, 30.0))
    store: Any
    if store_file is not None:
        store = FileStore(store_file, world)
        store.set_timeout(wait)
    else:
        store, _, _ = next(rendezvous("env://", rank, world, timeout=wait))
    prefixed = attempt_store(store)
    gpus = gather_over_store(prefixed, rank, world, "hintpipe/gpu", gpu_identity(chosen))
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if own_gpu(gpus) else "gloo",
        store=prefixed,
        rank=rank,
        world_size=world,
        timeout=wait,
    )
    liveness.start(prefixed, rank, world, timeout)  # see [Note: naming a frozen rank]
    return chosen


def gather_over_store(store: Any, rank: int, world: int, key: str, value: str) -> list[str]:
    """Every rank's ``value``, in rank order, through the rendezvous ``store`` (before any process group
    exists: the default group's backend depends on what the ranks say).

    Raises:
        PeerFailure: naming the ranks that never said theirs within the store's timeout (stopped or killed
            while they started), instead of the store's list of keys.
    """
    store.set(f"{key}/{rank}", value)
    keys = [f"{key}/{r}" for r in range(world)]
    waited, heard = 0.0, planning_beats.beats(store)
    while True:
        try:
            return [v.decode() for v in store.multi_get(keys)]
        except RuntimeError:  # torch.distributed.DistStoreError: the wait timed out
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            if not missing:  # the last one came as the wait ran out: read them again
                continue
            waited += store.timeout.total_seconds()
            now = planning_beats.beats(store)
            if now != heard and waited < planning_beats.PATIENCE:  # a rank still planning: [Note: a rank that
                heard = now  # plans before it joins]
                continue
            names = ", ".join(f"rank {r}" for r in missing)
            raise PeerFailure(
                f"rank {rank}: {names} never joined the run (waited {waited:g} s for "
                f"{'it' if len(missing) == 1 else 'them'} at the start: stopped, killed, or still starting)"
            ) from None


@contextlib.contextmanager
def planning_heartbeat() -> Iterator[None]:
    """Within, on rank 0 of a ``torchrun`` launch: beat in the rendezvous store while it plans before it joins (see
    [Note: a rank that plans before it joins] in :mod:`hintpipe.runtime.planning_beats`). Nothing elsewhere, nor
    where the rendezvous store is not torchrun's agent's (a launcher of the environment's variables alone would
    have this rank serve the store, which ``init_rank`` then does)."""
    if os.environ.get("RANK") != "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        yield
        return
    world = int(os.environ["WORLD_SIZE"])
    store, _, _ = next(rendezvous("env://", 0, world, timeout=datetime.timedelta(seconds=60)))
    with planning_beats.beat_on(attempt_store(store)):
        yield


def attempt_store(store: Any) -> PrefixStore:
    """``store`` as this attempt's ranks share it: every key under the attempt's prefix, so that a restarted job's
    ranks never read what an earlier attempt left (the start's gathers, the liveness marks, the planning beats)."""
    return PrefixStore(f"hintpipe/attempt-{attempt()}", store)


def attempt() -> int:
    """Which attempt of an elastic job this is (0 unless torchrun restarted it)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def run_rank(rank: int, world: int, packed: bytes, out: str, timeout: float, device: str = "auto") -> None:
    """One spawned rank (started by :func:`hintpipe.runtime.rank_entry.start_rank`, already tied to its
    launcher): join the group on ``device``, run the function ``packed`` holds, and leave its result in
    ``out``."""
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    os.environ[STOP_FILE_ENV] = str(Path(out) / "stop")
    loopback = loopback_interface()
    if loopback is not None:  # gloo's and NCCL's own listening sockets on loopback, whatever the hostname says
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    path = Path(out) / f"rank{rank}.pkl"
    try:
        init_rank(rank, world, timeout, device, store_file=str(Path(out) / STORE_FILE))
        fn, args = pickle.loads(packed)
        result = fn(rank, world, *args)
        path.write_bytes(pickle.dumps(("ok", result)))
    except BaseException as exc:
        text = error_text(exc)
        # Ctrl-C reached the rank (the launcher's process group) where it was not handling it: see [Note: Ctrl-C
        # to the process group] in hintpipe.runtime.launch.
        outcome = INTERRUPTED if isinstance(exc, KeyboardInterrupt) else "error"
        path.write_bytes(pickle.dumps((outcome, text, traceback.format_exc())))
        # Leave at once: tearing the process group down would wait on peers
        # that may be dead or stuck, which is exactly what must not hang us.
        _leave(1)
    liveness.stop()
    dist.destroy_process_group()
    # The result is written and the group is down: leave without the interpreter's finalisation, in which
    # a transport thread still returning from a C++ call would abort the process (exit code -6) for
    # nothing.
    _leave(0)


def error_text(exc: BaseException) -> str:
    """A rank's error as its launcher reports it (``RankFailure``'s ``rank N: ...`` lines): hintpipe's own errors by
    their class's name alone (``PeerFailure: rank 1: ...``), any other as Python ends a traceback with it."""
    if type(exc).__module__.startswith("hintpipe."):
        return f"{type(exc).__name__}: {exc}"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` elsewhere), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((name for name in names if name in ("lo", "lo0")), None)


def _leave(code: int) -> NoReturn:
    """End a spawned rank now, without the interpreter's finalisation, but with multiprocessing's own
    finalizers: a lock the rank made (tqdm makes one whenever torch.fx's interpreter runs, as the planner's
    capture does) is then removed here, not reported as leaked by the launcher's resource tracker when the
    launcher exits (a warning users would read as the library's leak)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):  # nothing at exit may keep a rank from ending
        multiprocessing.util._run_finalizers(0)  # type: ignore[attr-defined]  # what a normal exit runs first
    os._exit(code)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
