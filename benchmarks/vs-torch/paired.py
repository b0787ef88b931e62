"""Identical work through torch's schedules and hintpipe's hints, interleaved step by step in the same ranks.

``vs_torch.py`` runs each configuration in ranks of its own and interleaves the configurations round by round;
on a 2-core machine whose speed moves by up to 2x within seconds, a round's ratio then still spans +-20%.
Here every configuration is built side by side in the same rank processes (each on its own copy of the same
model, hintpipe's pipelines on process groups of their own), and the steps alternate: one step of each
configuration per cycle, in an order that rotates every cycle, each step lined up by a barrier before and after
it. A configuration's ratio to torch's ``Schedule1F1B`` is then taken per cycle, between steps a few hundred
milliseconds apart, and the table gives the median of the cycles' ratios with a 95% confidence interval of that
median (distribution-free: the order statistics that the binomial distribution puts around it).

The lining up costs every step two barriers, the same for every configuration, and keeps a rank from starting
its next step before its neighbours end theirs (which a training loop allows, in either library).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from dataclasses import dataclass

import task_spans
import torch
from vs_torch import HINTPIPE_RUNS, TORCH_RUNS, Run, add_work_arguments, hintpipe_step, split_choice, torch_step

from hintpipe import run_ranks


@dataclass(frozen=True)
class Steps:
    """One rank's seconds and process CPU seconds of every timed step, per configuration, in cycle order, and with
    ``--gaps`` its tasks' spans (:mod:`task_spans`)."""

    seconds: dict[str, list[float]]
    cpu: dict[str, list[float]]
    spans: list[tuple[str, int, str, int, float, float]]


def rank_main(rank: int, world: int, runs: list[Run], args: argparse.Namespace) -> Steps:
    """Build every configuration, warm each up, then time ``args.cycles`` cycles of one step each."""
    torch.set_num_threads(1)
    if args.gaps:
        task_spans.install()
    with contextlib.ExitStack() as stack:
        steps = {
            run.name: torch_step(run, rank, world, args)
            if run.library == "torch"
            else hintpipe_step(run, world, args, stack, report_every=args.report_every, timelines=False)[1]
            for run in runs
        }
        for one_step in steps.values():
            for _ in range(args.warmup):
                one_step()
        seconds: dict[str, list[float]] = {name: [] for name in steps}
        cpu: dict[str, list[float]] = {name: [] for name in steps}
        names = list(steps)
        for cycle in range(args.cycles):
            turn = cycle % len(names)
            for name in names[turn:] + names[:turn]:
                torch.distributed.barrier()
                start, start_cpu = time.perf_counter(), time.process_time()
                task_spans.step(name, cycle, steps[name])
                torch.distributed.barrier()
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
        return Steps(seconds, cpu, task_spans.SPANS if args.gaps else [])


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% confidence interval of it: the order statistics ``j``, ``k`` with
    ``P(j <= B < k) >= 0.95`` for ``B ~ Binomial(n, 1/2)`` (normal approximation, n of 20 and more)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return statistics.median(ordered), ordered[low], ordered[high]


def ratio_cell(mine: list[float], base: list[float]) -> str:
    """The median over cycles of ``base``'s step time over ``mine``'s (a speed ratio), with its interval."""
    median, low, high = median_interval([b / m for m, b in zip(mine, base, strict=True)])
    return f"{median:.3f}x ({low:.3f}-{high:.3f})"


def print_table(ranks: list[Steps], args: argparse.Namespace) -> None:
    """Per configuration: the median step time (the slowest rank's, per cycle), its ratios, the CPU per step."""
    names = list(ranks[0].seconds)
    slowest = {name: [max(r.seconds[name][i] for r in ranks) for i in range(args.cycles)] for name in names}
    tokens = args.microbatches * args.rows * args.seq
    print(
        f"| run ({args.model}, {args.ranks} ranks, {args.microbatches} micro-batches, {args.cycles} cycles) | "
        "ms/step, median | tokens/s | vs torch Schedule1F1B, per cycle (95% CI) | "
        "ready vs fixed, per cycle (95% CI) | vs hintpipe 1f1b fixed, per cycle (95% CI) | CPU ms/step/rank |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    base, unsplit = "torch Schedule1F1B", "hintpipe 1f1b, fixed"
    for name in names:
        median = statistics.median(slowest[name])
        versus_torch = ratio_cell(slowest[name], slowest[base]) if base in slowest and name != base else ""
        fixed = name.replace(", ready", ", fixed")
        versus_fixed = ratio_cell(slowest[name], slowest[fixed]) if ", ready" in name and fixed in slowest else ""
        other_hint = name.startswith("hintpipe ") and not name.startswith("hintpipe 1f1b,")
        versus_1f1b = ratio_cell(slowest[name], slowest[unsplit]) if other_hint and unsplit in slowest else ""
        cpu = statistics.mean(statistics.median(r.cpu[name]) for r in ranks) * 1e3
        print(
            f"| {name} | {median * 1e3:.1f} | {tokens / median:,.0f} | {versus_torch} | {versus_fixed} | "
            f"{versus_1f1b} | {cpu:.1f} |"
        )
    if args.gaps:
        print_gaps(ranks, names)


def print_gaps(ranks: list[Steps], names: list[str]) -> None:
    """The hand-overs between ranks 0 and 1 per configuration (:func:`task_spans.hand_overs`), in ms."""
    print()
    print(
        "| run | activation: rank 0's F end to rank 1's F start | gradient: rank 1's B end to rank 0's B start | "
        "rank 0: step start to first F | rank 0: last B to step end |"
    )
    print("|---|---:|---:|---:|---:|")
    spans = [r.spans for r in ranks]
    for name in names:
        got = task_spans.hand_overs(spans, name)
        print(f"| {name} | " + " | ".join(f"{ms:.2f}" for ms in got.values()) + " |")
    print()
    print("| run | rank | F, ms/step | B | W | rest of the step |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        for rank, rank_spans in enumerate(spans):
            row = task_spans.busy(rank_spans, name)
            print(f"| {name} | {rank} | " + " | ".join(f"{ms:.1f}" for ms in row.values()) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_work_arguments(parser)
    parser.add_argument("--warmup", type=int, default=5, help="steps of each configuration before the timed ones")
    parser.add_argument("--cycles", type=int, default=100, help="timed steps of each configuration")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--report-every",
        type=int,
        default=0,
        help="hintpipe's report_every (default 0, as vs_torch.py: torch's schedules gather no report)",
    )
    parser.add_argument(
        "--only",
        default="torch Schedule1F1B;hintpipe 1f1b, fixed;hintpipe 1f1b, ready",
        help="the configurations, by name, separated by ; (torch Schedule1F1B is the base of the ratios)",
    )
    parser.add_argument(
        "--gaps",
        action="store_true",
        help="time every F, B and W: each configuration's hand-overs between ranks 0 and 1 (one stage a rank) and "
        "each rank's time in F, B and W",
    )
    parser.add_argument(
        "--choose",
        action="store_true",
        help="first the stages' costs, whole and split, and the simulator's step for 1f1b and zb-h1 on them (the "
        "choice hint auto makes), as vs_torch.py --choose",
    )
    args = parser.parse_args(argv)
    wanted = [name.strip() for name in args.only.split(";") if name.strip()]
    known = {run.name: run for run in TORCH_RUNS + HINTPIPE_RUNS}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        sys.exit(f"paired.py: no configuration named {unknown[0]!r}; known: {'; '.join(known)}")
    runs = [known[name] for name in wanted]
    if args.gaps and (args.ranks != 2 or any(run.per_rank != 1 for run in runs)):
        sys.exit("paired.py: --gaps times hand-overs between two ranks of one stage each: --ranks 2, no interleaving")
    if args.choose:  # measured before the ranks start, on this process's one thread
        print(split_choice(args), flush=True)
    ranks: list[Steps] = run_ranks(rank_main, args.ranks, runs, args, timeout=args.timeout, device="cpu")
    print_table(ranks, args)


if __name__ == "__main__":
    main()
