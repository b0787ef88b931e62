"""``hintpipe demo``: the readiness idea in one picture.

Until the runtime trains a real model, the demo is a simulation: 1F1B on 4
ranks, 16 micro-batches whose lengths vary (lognormal, sigma 0.5), fixed order
against readiness with room for two extra micro-batches.
"""

from __future__ import annotations

import argparse
from typing import Any

from hintpipe.cli import simulate
from hintpipe.cli.common import stdout

HELP = "compare fixed-order and readiness-driven pipelines under variable micro-batch lengths"


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help=HELP, description=HELP)
    parser.add_argument(
        "--timeline",
        default="demo-timeline.png",
        metavar="FILE.png",
        help="Gantt chart to write (default demo-timeline.png)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sim_args = argparse.Namespace(
        stages=4,
        microbatches=16,
        hint="1f1b",
        chunks=None,
        policy="ready",
        compare=True,
        variability=["mb:0.5"],
        memory_slack=2.0,
        memory_budget=None,
        costs=None,
        trials=20,
        seed=0,
        trace=None,
        timeline=args.timeline,
        json=args.json,
    )
    code = simulate.run(sim_args)
    if not args.json:
        stdout.print(f"timeline of the last trial: {args.timeline}")
    return code
