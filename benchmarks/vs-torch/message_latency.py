"""One message's cost on its own: a round trip between 2 gloo ranks, an activation-sized tensor each way.

Three ways of moving it, interleaved (``--rounds`` rounds of each, in turn):

- ``torch``: ``isend`` and ``irecv(...).wait()`` on the computing thread, as torch's ``Schedule1F1B`` does.
- ``thread hop``: the same tensors, received by a thread of their own that hands each to the computing thread
  through a ``queue.SimpleQueue``: what any receiver that does not know the next message costs at least.
- ``hintpipe``: the runtime's own transport (:class:`hintpipe.runtime.transport.mailbox.GlooTransport`): a
  mailbox thread per peer, a header in front of each payload, the receive of the next message posted ahead.

``--work MS`` makes the replying rank compute that long before it answers (a task between messages).
Prints the median round trip per way and round, after ``--warmup`` trips.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from hintpipe import run_ranks

WAYS = ("torch", "thread hop", "hintpipe")


def _busy(ms: float) -> None:
    """Compute for ``ms`` milliseconds (small matrix products, on one thread)."""
    end = time.perf_counter() + ms / 1000
    a = torch.randn(64, 64)
    while time.perf_counter() < end:
        a = a @ a
        a = a / a.norm()


def _isend(tensor: torch.Tensor, peer: int) -> dist.Work:
    work = dist.isend(tensor, peer)
    assert work is not None
    return work


def _recv(buffer: torch.Tensor, peer: int) -> None:
    work = dist.irecv(buffer, peer)
    assert work is not None
    work.wait()


def _torch(rank: int, trips: int, tensor: torch.Tensor, work: float) -> list[float]:
    other, buffer, times = 1 - rank, torch.empty_like(tensor), []
    for _ in range(trips):
        began = time.perf_counter()
        if rank == 0:
            sent = _isend(tensor, other)
            _recv(buffer, other)
        else:
            _recv(buffer, other)
            _busy(work)
            sent = _isend(tensor, other)
        sent.wait()
        times.append(time.perf_counter() - began)
    return times


def _thread_hop(rank: int, trips: int, tensor: torch.Tensor, work: float) -> list[float]:
    other, inbox, times = 1 - rank, queue.SimpleQueue[torch.Tensor](), []

    def receive() -> None:
        for _ in range(trips):
            buffer = torch.empty_like(tensor)
            _recv(buffer, other)
            inbox.put(buffer)

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    sends = []
    for _ in range(trips):
        began = time.perf_counter()
        if rank == 0:
            sends.append(_isend(tensor, other))
            inbox.get()
        else:
            inbox.get()
            _busy(work)
            sends.append(_isend(tensor, other))
        times.append(time.perf_counter() - began)
    for sent in sends:
        sent.wait()
    receiver.join()
    return times


def _hintpipe(rank: int, trips: int, tensor: torch.Tensor, work: float) -> list[float]:
    from hintpipe.runtime.transport.mailbox import GlooTransport
    from hintpipe.runtime.transport.wire import MessageKind

    transport = GlooTransport([0, 1], torch.device("cpu"))
    other, times = 1 - rank, []
    for mb in range(trips):
        began = time.perf_counter()
        if rank == 0:
            transport.send(other, MessageKind.ACTIVATION, 0, 1, mb, [tensor])
            got = transport.get(60)
        else:
            got = transport.get(60)
            _busy(work)
            transport.send(other, MessageKind.GRADIENT, 0, 0, mb, [tensor])
        assert got is not None and got.mb == mb
        times.append(time.perf_counter() - began)
    transport.close()
    return times


def worker(rank: int, world: int, rounds: int, trips: int, warmup: int, numel: int, work: float) -> Any:
    torch.set_num_threads(1)
    tensor = torch.randn(numel)
    ways = {"torch": _torch, "thread hop": _thread_hop, "hintpipe": _hintpipe}
    medians: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            dist.barrier()
            times = ways[way](rank, warmup + trips, tensor, work)
            medians[way].append(statistics.median(times[warmup:]))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trips", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--numel", type=int, default=4 * 64 * 128, help="float32 elements each way (128 KiB)")
    parser.add_argument("--work", type=float, default=0.0, help="ms the replying rank computes before it answers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run_ranks(worker, 2, args.rounds, args.trips, args.warmup, args.numel, args.work, timeout=600)
    medians = results[0]
    if args.json:
        print(json.dumps(medians))
        return
    print(f"round trip of {args.numel * 4} bytes each way, replier computing {args.work:g} ms, median per round (us)")
    base = statistics.median(medians["torch"])
    for way in WAYS:
        rounds = " ".join(f"{1e6 * m:7.0f}" for m in medians[way])
        middle = statistics.median(medians[way])
        print(f"{way:>10}: {rounds}   median {1e6 * middle:5.0f}   per message over torch {5e5 * (middle - base):4.0f}")


if __name__ == "__main__":
    main()
