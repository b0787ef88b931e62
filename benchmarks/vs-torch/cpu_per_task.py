"""The runtime's own CPU per task: 2 ranks, emulated tasks (each sleeps its cost), so that nearly all the
CPU a rank spends in its dispatch loop is the runtime's (``StepReport.runtime_cpu``; see [Note: the runtime's
own CPU time] in ``hintpipe.runtime.loop.step_loop``)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

from torch import nn

from hintpipe import run_ranks
from hintpipe.runtime.loop.emulated import EmulatedCosts
from hintpipe.runtime.pipeline import Pipeline


def thread_cpu() -> dict[str, tuple[int, int]]:
    """Each thread's CPU time so far in ns and the times it was scheduled in (Linux's schedstat), by its Python
    name, else the system's (gloo's ``gloo_tcp_loop``); threads of one name summed."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, tuple[int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns, _, runs = (int(v) for v in f.read().split())
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended
            continue
        name = names.get(int(tid), comm)
        name = "computing" if name == "MainThread" else name.split("-")[0]
        had = out.get(name, (0, 0))
        out[name] = (had[0] + ns, had[1] + runs)
    return out


def worker(
    rank: int, world: int, hint: str, policy: str, microbatches: int, steps: int, cost: float, send_thread: bool
) -> dict[str, object]:
    import hintpipe.runtime.transport.mailbox as mailbox

    mailbox.SEND_THREAD_ON_CPU = send_thread
    split = hint in ("zb-h1", "bfw", "zbv")
    w = cost / 2 if split else 0.0
    b = cost / 2 if split else cost
    costs = EmulatedCosts((cost,) * world, (b,) * world, (w,) * world, reference_size=1)
    pipe = Pipeline.from_modules(
        [nn.Identity() for _ in range(world)],
        loss_fn=lambda o, t: o.sum(),
        microbatches=microbatches,
        hint=hint,
        policy=policy,
        timeout=300,
        emulate=costs,
        report_every=1,
    )
    walls = []
    for _ in range(2):  # warm-up
        pipe.step()
    thread0, process0, threads0 = time.thread_time(), time.process_time(), thread_cpu()
    for _ in range(steps):
        began = time.perf_counter()
        pipe.step()
        walls.append(time.perf_counter() - began)
    threads = {}
    for name, (ns, runs) in thread_cpu().items():
        ns0, runs0 = threads0.get(name, (0, 0))
        threads[name] = (ns - ns0, runs - runs0)
    computing, process_cpu = time.thread_time() - thread0, time.process_time() - process0
    tasks = len(pipe.hint.lists[rank]) * steps
    mine = [r.runtime_cpu[r.ranks.index(rank)] if r.ranks else r.runtime_cpu[0] for r in pipe.reports[-steps:]]
    runtime_cpu = statistics.median(mine) / len(pipe.hint.lists[rank])
    pipe.close()
    return {
        "runtime_cpu_us_per_task": round(runtime_cpu * 1e6),
        "computing_thread_us_per_task": round(computing / tasks * 1e6),
        "process_us_per_task": round(process_cpu / tasks * 1e6),
        "step_ms": round(statistics.median(walls) * 1e3, 1),
        # per thread: CPU us per task, and wake-ups (times scheduled in) per task
        "threads_per_task": {
            k: (round(ns / tasks / 1e3), round(runs / tasks, 1))
            for k, (ns, runs) in sorted(threads.items())
            if ns >= tasks * 1e3
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cost", type=float, default=0.001)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--runs", default="1f1b:fixed,1f1b:ready,zb-h1:fixed,zb-h1:ready")
    parser.add_argument("--sends", choices=("both", "inline", "thread"), default="both")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for item in args.runs.split(","):
            hint, policy = item.split(":")
            for send_thread in {"both": (False, True), "inline": (False,), "thread": (True,)}[args.sends]:
                results = run_ranks(
                    worker,
                    2,
                    hint,
                    policy,
                    args.microbatches,
                    args.steps,
                    args.cost,
                    send_thread,
                    timeout=600,
                    device="cpu",
                )
                print(
                    json.dumps({"hint": hint, "policy": policy, "send_thread": send_thread, "ranks": results}),
                    flush=True,
                )


if __name__ == "__main__":
    main()
