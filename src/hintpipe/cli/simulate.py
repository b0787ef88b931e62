"""``hintpipe simulate``: run a schedule on the event simulator."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from hintpipe.cli.common import (
    add_option,
    add_room_arguments,
    build_hint,
    check_flags,
    check_writable,
    print_json,
    progress_bar,
    room,
    stdout,
    whole_number,
)
from hintpipe.cli.config_file import add_config_arguments
from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import parse_variability
from hintpipe.observe.timeline import plot_timelines
from hintpipe.observe.trace import write_chrome_trace
from hintpipe.options import OPTIONS
from hintpipe.sim.compare import Summary, run_study

HELP = "simulate a schedule and policy on a virtual clock"


def register(commands: Any) -> None:
    parser = commands.add_parser("simulate", help=HELP, description=HELP)
    add_config_arguments(parser)
    for name in ("ranks", "microbatches", "hint", "chunks", "policy"):
        add_option(parser, name)
    parser.add_argument("--compare", action="store_true", help="run fixed, greedy and ready on the same samples")
    variability = OPTIONS["variability"].help + "; simulate only: moe:EXPERTS:TOPK[:SKEW[:SHARE]]"
    add_option(parser, "variability", help=variability)
    add_option(parser, "microbatch_order")
    add_option(parser, "admission")
    add_room_arguments(parser, activation_unit="slots; bytes, or a size such as 2GiB, when the cost model has sizes")
    parser.add_argument("--costs", metavar="FILE", help="cost model JSON (default F = B = W = 1)")
    parser.add_argument("--trials", type=whole_number, default=1, metavar="N", help="independent samples (default 1)")
    add_option(parser, "seed")
    parser.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace of the last trial")
    parser.add_argument("--timeline", metavar="FILE.png", help="write a Gantt chart of the last trial")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for option in ("trace", "timeline"):
        if getattr(args, option):
            check_writable(getattr(args, option), f"--{option}")
    if args.trials < 1:
        raise ValueError(f"--trials must be at least 1, got {args.trials}")
    check_flags(args, ["seed", "policy", "microbatch_order", "admission"])
    hint = build_hint(args)
    models = [parse_variability(spec) for spec in args.variability]
    cost_model = CostModel.from_json(args.costs, hint.stages) if args.costs else None
    slack, budgets, device_budget_fraction = room(args, hint.ranks)
    by_size = args.admission is AdmissionUnit.SIZE
    in_bytes = cost_model is not None and cost_model.activation is not None
    unit = "bytes" if in_bytes else "size" if by_size else "slots"
    policy: Policy = args.policy
    policies = list(Policy) if args.compare else [policy]
    with progress_bar("simulating", args.trials, enabled=not args.json and args.trials > 1) as bar:
        summaries = run_study(
            hint,
            policies,
            cost_model=cost_model,
            variability=models,
            trials=args.trials,
            seed=args.seed,
            slack_microbatches=slack,
            activation_budget=budgets,
            device_budget_fraction=device_budget_fraction,
            microbatch_order=args.microbatch_order,
            admission=args.admission,
            on_trial=lambda _: bar.advance(bar.task_ids[0]),
        )
    shown = summaries.get(policy, summaries[policies[-1]])
    if args.trace:
        write_chrome_trace(shown.last.timeline(), args.trace, label=f"{hint.name} / {shown.policy.value}")
    if args.timeline:
        plot_timelines(
            [
                (f"{hint.name}, {s.policy.value}: makespan {s.last.makespan:.4g}", s.last.timeline())
                for s in summaries.values()
            ],
            args.timeline,
        )
    if args.json:
        if args.compare:
            payload: dict[str, Any] = {p.value: s.to_json(unit) for p, s in summaries.items()}
            payload["speedup"] = summaries[Policy.FIXED].makespan / summaries[Policy.READY].makespan
            payload["speedup_greedy"] = summaries[Policy.FIXED].makespan / summaries[Policy.GREEDY].makespan
        else:
            payload = shown.to_json(unit) | {"policy": shown.policy.value}
        payload |= {
            "hint": hint.name,
            "stages": hint.stages,
            "ranks": hint.ranks,
            "microbatches": hint.microbatches,
            "variability": args.variability,
            "microbatch_order": args.microbatch_order,
            "admission": args.admission,
        }
        print_json(payload)
        return 0
    title = (
        f"{hint.name}: {hint.ranks} ranks, {hint.stages} stages, {hint.microbatches} micro-batches"
        + (f", variability {' '.join(args.variability)}" if args.variability else "")
        + f", {args.trials} trial{'s' if args.trials != 1 else ''}"
    )
    stdout.print(title)
    stdout.print(_table(list(summaries.values())))
    if args.compare:
        fixed = summaries[Policy.FIXED].makespan
        stdout.print(
            f"speedup over fixed: ready {fixed / summaries[Policy.READY].makespan:.3f}x, "
            f"greedy {fixed / summaries[Policy.GREEDY].makespan:.3f}x"
        )
    return 0


def _table(summaries: list[Summary]) -> Table:
    table = Table()
    table.add_column("")
    for s in summaries:
        table.add_column(s.policy.value, justify="right")
    fixed = next((s.makespan for s in summaries if s.policy is Policy.FIXED), None)
    rows: list[tuple[str, list[str]]] = [
        ("makespan", [f"{s.makespan:.4g}" for s in summaries]),
        ("lower bound", [f"{s.lower_bound:.4g}" for s in summaries]),
        ("lower bound at the budget", [f"{s.memory_bound:.4g}" for s in summaries]),
        ("efficiency", [f"{s.efficiency:.3f}" for s in summaries]),
        ("bubble (mean over ranks)", [f"{s.bubble_fraction:.3f}" for s in summaries]),
        ("peak live per rank", [" ".join(f"{v:.3g}" for v in s.peak_live) for s in summaries]),
        ("budget per rank", [" ".join(f"{v:.3g}" for v in s.budget) for s in summaries]),
        ("tasks", [str(s.tasks) for s in summaries]),
        ("simulated tasks/s", [f"{s.tasks / s.sim_seconds:,.0f}" for s in summaries]),
    ]
    if fixed is not None and len(summaries) > 1:
        rows.insert(1, ("speedup over fixed", [f"{fixed / s.makespan:.3f}x" for s in summaries]))
    for label, cells in rows:
        table.add_row(label, *cells)
    return table
