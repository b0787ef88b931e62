"""Starting ranks: spawn them on one machine, or join a ``torchrun`` launch.

``hintpipe train`` calls :func:`run_ranks`. Under ``torchrun`` (the
environment has ``RANK`` and ``WORLD_SIZE``) this process *is* one rank and the
function runs once, in place; otherwise it spawns one process per rank on this
machine with a free loopback port. Either way each rank initialises
torch.distributed (gloo on CPU, NCCL when the rank has a GPU), uses one CPU
thread, runs ``fn(rank, world_size, *args)``, and its return value comes back
to the caller (rank 0's under torchrun).

If any rank fails, the others are stopped and the failure is raised with the
failing ranks' errors, so nothing is left hanging.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import start_processes

from hintpipe.runtime.errors import RankFailure

__all__ = ["RankFailure", "free_port", "init_rank", "run_ranks", "under_torchrun"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_rank(rank: int, world: int, timeout_s: float = 300.0) -> torch.device:
    """Join the process group (already in the environment: MASTER_ADDR/PORT)."""
    torch.set_num_threads(1)
    # The mailbox threads must get the interpreter promptly while the main
    # thread computes: hand it over every 0.5 ms instead of every 5 ms.
    sys.setswitchinterval(0.0005)
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        torch.cuda.set_device(local)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=max(timeout_s, 30.0)),
    )
    return torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")


def _child(rank: int, world: int, fn: Callable[..., Any], packed: bytes, out: str, timeout_s: float) -> None:
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    path = Path(out) / f"rank{rank}.pkl"
    try:
        init_rank(rank, world, timeout_s)
        result = fn(rank, world, *pickle.loads(packed))
        path.write_bytes(pickle.dumps(("ok", result)))
    except BaseException as exc:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        path.write_bytes(pickle.dumps(("error", text, traceback.format_exc())))
        # Leave at once: tearing the process group down would wait on peers
        # that may be dead or stuck, which is exactly what must not hang us.
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 300.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on every rank; returns the per-rank results.

    Raises:
        RankFailure: naming each rank that failed and its error.
    """
    if under_torchrun():
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if size != world:
            raise RankFailure(f"torchrun started {size} ranks, the pipeline needs {world}")
        init_rank(rank, size, timeout_s)
        try:
            return [fn(rank, size, *args)]
        finally:
            dist.destroy_process_group()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    with tempfile.TemporaryDirectory(prefix="hintpipe-") as out:
        # [Note: every rank its own copy] The arguments travel as plain pickled bytes: torch's
        # process spawning would otherwise move their tensors into shared memory, and every rank
        # would train one and the same parameters (a plan's weights, stepped by each optimizer).
        packed = pickle.dumps(args)
        context = start_processes(  # type: ignore[no-untyped-call]
            _child, args=(world, fn, packed, out, timeout_s), nprocs=world, join=False, start_method="spawn"
        )
        # Watch the ranks ourselves rather than with context.join(), which
        # kills the survivors the moment one rank fails: they must get the
        # chance to notice and report it (peer failure or watchdog).
        processes = context.processes
        failed_at: float | None = None
        while any(p.is_alive() for p in processes):
            if failed_at is None and any(p.exitcode not in (None, 0) for p in processes):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > timeout_s + 5.0:
                break
            time.sleep(0.05)
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join(timeout=5.0)
        failed = any(p.exitcode != 0 for p in processes)
        results: list[Any] = []
        errors: list[str] = []
        for rank in range(world):
            path = Path(out) / f"rank{rank}.pkl"
            if not path.exists():
                errors.append(f"rank {rank}: exited without a result (killed, or crashed hard)")
                results.append(None)
                continue
            outcome = pickle.loads(path.read_bytes())
            if outcome[0] == "ok":
                results.append(outcome[1])
            else:
                errors.append(f"rank {rank}: {outcome[1]}")
                results.append(None)
        if errors or failed:
            raise RankFailure("\n".join(errors) or "a rank failed")
        return results
