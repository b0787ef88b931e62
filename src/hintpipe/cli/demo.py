"""``hintpipe demo``: fixed order against readiness, training gpt-mini for real.

Two CPU ranks (one thread each) train gpt-mini with 1F1B on micro-batches
whose sequence lengths vary (lognormal), first in fixed order, then with the
``ready`` policy and room for two more in-flight micro-batches, on exactly the
same data. It prints both runs side by side and writes their last steps'
timelines to one PNG.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from rich.table import Table

from hintpipe.cli.common import print_json, stdout, whole_number
from hintpipe.cli.train import config_from, result_json
from hintpipe.observe.timeline import plot_timelines
from hintpipe.units import format_size

if TYPE_CHECKING:
    from hintpipe.apps.training import TrainResult

HELP = "train gpt-mini on 2 CPU ranks, fixed order then readiness, and compare"


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help=HELP, description=HELP)
    parser.add_argument("--steps", type=whole_number, default=8, help="steps per run (default 8)")
    parser.add_argument(
        "--timeline",
        default="demo-timeline.png",
        metavar="FILE.png",
        help="Gantt chart to write (default demo-timeline.png)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def demo_arguments(steps: int, timeline: str = "demo-timeline.png") -> argparse.Namespace:
    """The demo's run, as ``hintpipe train`` flags (the timelines are kept, to draw)."""
    from hintpipe.cli import build_parser

    argv = ["train", "--ranks", "2", "--microbatches", "8", "--layers", "4", "--hidden", "96"]
    argv += ["--seq-len-dist", "lognormal:96:0.5", "--steps", str(steps), "--slack-microbatches", "2"]
    argv += ["--timeout", "120", "--timeline", timeline]
    return build_parser().parse_args(argv)


def run(args: argparse.Namespace) -> int:
    from hintpipe.apps.training import train  # here, not above: ``hintpipe simulate`` runs without torch

    base = demo_arguments(args.steps, args.timeline)
    results: dict[str, TrainResult] = {}
    for policy in ("fixed", "ready"):
        if not args.json:
            stdout.print(f"training with policy {policy} ...")
        result = train(config_from(base, policy))
        assert result is not None
        if result.stopped_by:  # Ctrl-C (or SIGTERM, SIGHUP): the ranks stopped after a step; so does the demo
            return _stopped(result, policy)
        results[policy] = result
    fixed, ready = results["fixed"], results["ready"]
    plot_timelines(
        [(f"1f1b, {p}: last step {r.reports[-1].makespan * 1e3:.0f} ms", r.records()) for p, r in results.items()],
        args.timeline,
        unit="seconds",
    )
    speedup = ready.throughput / fixed.throughput
    if args.json:
        print_json(
            {"fixed": result_json(fixed), "ready": result_json(ready), "speedup": speedup, "timeline": args.timeline}
        )
        return 0
    stdout.print("gpt-mini, 2 CPU ranks, 1F1B, 8 micro-batches of lognormal length (mean 96, sigma 0.5)")
    table = Table()
    table.add_column("")
    for policy in results:
        table.add_column(policy, justify="right")
    rows = [
        ("step time, median ms", [f"{r.step_time_median * 1e3:.1f}" for r in results.values()]),
        ("tokens/s", [f"{r.throughput:,.0f}" for r in results.values()]),
        ("efficiency (vs lower bound)", [f"{r.efficiency:.3f}" for r in results.values()]),
        ("bubble per rank, last step", [" ".join(f"{b:.2f}" for b in r.reports[-1].bubble) for r in results.values()]),
        (
            "peak live activations per rank",
            [" ".join(format_size(b) for b in r.peak_live_bytes) for r in results.values()],
        ),
        ("peak in-flight micro-batches", [" ".join(f"{v:g}" for v in r.peak_live) for r in results.values()]),
        ("final loss", [f"{r.losses[-1]:.4f}" for r in results.values()]),
    ]
    for label, cells in rows:
        table.add_row(label, *cells)
    stdout.print(table)
    stdout.print(f"ready / fixed tokens/s: {speedup:.3f}x (steps after the first)")
    stdout.print(f"timelines of the last step: {args.timeline}")
    return 0


def _stopped(result: TrainResult, policy: str) -> int:
    """The demo stopped by a signal during the run of ``policy``: said in one line; the exit status says which
    signal (the second run, or the comparison, is not made: nothing would compare like with like)."""
    import signal

    done = result.resumed_from + len(result.reports)
    print(
        f"hintpipe demo: stopped by {result.stopped_by} after step {done} of {result.config.training.steps} of the "
        f"{policy} run; nothing compared",
        file=sys.stderr,
    )
    return 128 + int(signal.Signals[result.stopped_by])
