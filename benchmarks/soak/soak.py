"""Soak: many steps with variable lengths and injected jitter; memory per rank must not grow.

Four ranks train gpt-mini for 200 steps (micro-batches of lognormal length,
``iid:0.3`` jitter injected, ``ready`` policy with two micro-batches of
slack) and record each rank's resident set size (RSS) after the first step,
after a warm-up of 20 steps (the first at the longest length the data can
have, so that the allocator's high-water mark is reached), and at the end. Leaked messages, send buffers,
stashed activations or autograd graphs would show as growth after warm-up.

Run from the repository root::

    .venv/bin/python benchmarks/soak/soak.py [--steps N] [--ranks N] [--sigma S] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from typing import Any

import torch

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.parts import Seams
from hintpipe.runtime.pipeline import Pipeline

WARMUP = 20
JITTER = "iid:0.3"  # every task's cost times an independent lognormal factor (real compute: max(X, 1) t)
LONGEST = 256  # gpt-mini's max_seq_len - 1: lognormal lengths are clipped to it


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def checkpoints(steps: int) -> tuple[int, int, int]:
    """The steps after which RSS is read besides the first: end of warm-up, half-way and the end
    (a run shorter than the warm-up ends its warm-up at its last step)."""
    return min(WARMUP, steps), max(1, steps // 2), steps


def worker(rank: int, world: int, steps: int, sigma: float) -> dict[str, Any]:
    warmup = checkpoints(steps)[0]
    config = ModelConfig("gpt-mini", layers=4, hidden=64, heads=4, vocab=128, max_seq_len=LONGEST + 1)
    modules = split_layers(build_layers(config), world)
    pipe = Pipeline.from_modules(
        modules,
        loss_fn=lm_loss,
        microbatches=8,
        hint="1f1b",
        policy="ready",
        slack_microbatches=2,
        timeout=120,
        seams=Seams(injection=Injection.parse([JITTER], seed=1)),
    )
    optimizer = torch.optim.AdamW([p for s in pipe.stages for p in modules[s].parameters()], lr=1e-3)
    samples: dict[int, int] = {}
    step_times: list[float] = []
    peaks: list[int] = []
    began = time.perf_counter()
    for step in range(steps):
        # Step 0 runs every micro-batch at the longest length the data can have,
        # so the allocator's high-water mark is reached during warm-up.
        lengths = SeqLenDist(LONGEST) if step == 0 else SeqLenDist(64, sigma)
        inputs, targets, _ = make_batch(config, 8, 2, lengths, step, data_seed=7)
        pipe.step(inputs, targets)
        report = pipe.reports[-1]
        step_times.append(report.makespan)
        # Rank 0's report covers every rank, another rank's only itself: ``ranks`` says which.
        peaks.append(report.peak_live_bytes[report.ranks.index(rank)])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step + 1 in (1, *checkpoints(steps)):
            samples[step + 1] = rss_bytes()
    pipe.close()
    return {
        "rss": samples,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "seconds": time.perf_counter() - began,
        "peak_live_bytes_max": max(peaks),
        "step_time_median": statistics.median(step_times[warmup:] or step_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sigma", type=float, default=0.6, help="lognormal sigma of the lengths (0: fixed)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.steps < 1 or args.ranks < 1:
        parser.error("--steps and --ranks must be at least 1")
    results = run_ranks(worker, args.ranks, args.steps, args.sigma, timeout=120)
    mib = 2**20
    print(f"{args.steps} steps, {args.ranks} ranks, gpt-mini, lognormal lengths, {JITTER} jitter, ready + slack 2")
    warmup, half, last = checkpoints(args.steps)
    cache = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default")
    print(f"oneDNN primitive cache capacity: {cache}")
    print(f"| rank | RSS after step 1 | step {warmup} | step {half} | step {last} | growth {warmup}-{last} |")
    print("|---|---:|---:|---:|---:|---:|")
    for rank, result in enumerate(results):
        rss = result["rss"]
        growth = rss[last] - rss[warmup]
        print(
            f"| {rank} | {rss[1] / mib:.1f} MiB | {rss[warmup] / mib:.1f} MiB | {rss[half] / mib:.1f} MiB "
            f"| {rss[last] / mib:.1f} MiB | {growth / mib:+.2f} MiB ({growth / rss[warmup]:+.2%}) |"
        )
    print(
        "wall time per rank: " + ", ".join(f"{r['seconds']:.0f} s" for r in results) + "; "
        f"median step after warm-up: {results[0]['step_time_median'] * 1e3:.0f} ms"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
