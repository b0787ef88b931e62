"""How long ``run_ranks`` takes to start ranks that return at once: spawned (a fresh interpreter per rank, which
imports torch) against forked from the fork server (torch imported once per launcher process), alternating.

    python benchmarks/rank-start/start.py --ranks 4 --launches 3 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from typing import Any

from hintpipe.runtime import launch
from hintpipe.runtime.launch import run_ranks


def _nothing(rank: int, world: int) -> int:
    return rank


def _launches(method: str, ranks: int, launches: int) -> list[float]:
    """Seconds per launch, in this process (the fork server, once started, serves the later launches)."""
    if method == "spawn":
        launch.rank_starter = lambda: multiprocessing.get_context("spawn")
    seconds = []
    for _ in range(launches):
        began = time.perf_counter()
        run_ranks(_nothing, ranks)
        seconds.append(time.perf_counter() - began)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--method", choices=("spawn", "forkserver"), help="one process's launches (internal)")
    args = parser.parse_args()
    if args.method:
        print(json.dumps(_launches(args.method, args.ranks, args.launches)))
        return
    import subprocess
    import sys

    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for method in ("spawn", "forkserver"):  # each in a fresh process: the server starts with the first launch
            argv = [sys.executable, __file__, "--method", method, "--ranks", str(args.ranks)]
            done = subprocess.run([*argv, "--launches", str(args.launches)], capture_output=True, text=True, check=True)
            seconds = json.loads(done.stdout.splitlines()[-1])
            runs.append({"round": round_, "method": method, "seconds": seconds})
            print(f"round {round_} {method:10s} " + "  ".join(f"{s:.2f} s" for s in seconds), flush=True)
    print(json.dumps({"ranks": args.ranks, "cpus": os.cpu_count(), "runs": runs}))


if __name__ == "__main__":
    main()
