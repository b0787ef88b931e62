"""Several axes: fixed order vs readiness on data x tensor x pipeline layouts; coordination and overlap costs.

For each layout, ``fixed`` and ``ready`` (1F1B hint, 2 micro-batches of slack)
train gpt-mini on identical work with ``mb:0.5`` (one lognormal factor per
micro-batch: sequence-length variability) and, with tensor parallelism,
``tp:2:0.3`` (each member of a group its own lognormal factor per task), and
report: the median step time, tokens/s over all replicas, the cost of one
tensor-parallel decision on rank 0 and the decisions per step (``ready`` only:
``fixed`` needs none), and, with data parallelism, per pipeline position, how
long its gradient reduction had to overlap the rest of the step and how long
the rank waited on it.

Real compute where the ranks fit the machine; emulated compute (every task
sleeps its profiled cost) for more ranks than cores. Emulated tasks run no
modules: a tensor-parallel group's members end each task together (an
all-reduce stands in for the task's collectives), and there are no gradients
to reduce.

Run from the repository root::

    .venv/bin/python benchmarks/axes/axes.py [--steps N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any

from hintpipe.apps.models import ModelConfig, SeqLenDist
from hintpipe.apps.training import TrainConfig, TrainResult, profile_costs, train
from hintpipe.runtime.loop.emulated import EmulatedCosts

# (dp, pp, tp, data parallelism): 4, 4 and 8 processes with real compute, then 8, 16 and 32 emulated (8 real
# processes on 2 cores measure the machine: DP2 x PP2 x TP2 runs both ways).
REAL = [(2, 2, 1, "replicate"), (2, 2, 1, "fsdp"), (1, 2, 2, "replicate"), (2, 2, 2, "fsdp")]
EMULATED = [(2, 2, 2, "replicate"), (2, 4, 2, "replicate"), (2, 8, 2, "replicate")]


def configure(dp: int, pp: int, tp: int, mode: str, policy: str, steps: int) -> TrainConfig:
    return TrainConfig.of(
        model=ModelConfig("gpt-mini", layers=max(2, pp), hidden=64, heads=4),
        ranks=pp,
        microbatches=2 * pp,
        microbatch_size=2,
        steps=steps,
        policy=policy,
        slack_microbatches=2.0 if policy == "ready" else 0.0,
        seq_len_dist=SeqLenDist(32, 0.5),
        variability=("mb:0.5", "tp:2:0.3") if tp == 2 else ("mb:0.5",),
        timeout=120.0,
        dp=dp,
        tp=tp,
        data_parallel=mode,
    )


def scaled(costs: EmulatedCosts, unit_ms: float) -> EmulatedCosts:
    """The profiled costs scaled so that the mean stage forward costs ``unit_ms``: the real ones (about 1 ms
    at this size) are shorter than what 16-32 processes sharing 2 cores take to pass a message, so emulated
    steps would measure the machine, not the policies (see the README)."""
    return costs.scaled(unit_ms * 1e-3 / statistics.mean(costs.forward))


def run(config: TrainConfig, emulate: EmulatedCosts | None) -> TrainResult:
    """One training run; ``emulate``: the costs every task sleeps (one profile per layout, shared by its
    policies: profiled afresh per run on a busy machine, the same work would differ between them)."""
    if emulate is not None:
        config = config.replaced(emulate=emulate)
    result = train(config)
    assert result is not None
    return result


def row(layout: tuple[int, int, int, str], policy: str, result: TrainResult, emulated: bool) -> dict[str, Any]:
    dp, pp, tp, mode = layout
    times = [r.makespan for r in result.measured]
    return {
        "layout": f"DP{dp} x PP{pp} x TP{tp}" + (f" ({mode})" if dp > 1 and not emulated else ""),
        "ranks": dp * pp * tp,
        "compute": "emulated" if emulated else "real",
        "policy": policy,
        "step_ms": 1e3 * statistics.median(times),
        "tokens_per_s": result.throughput,
        "decision_ms": result.coordination_ms,
        "decisions_per_step": result.decisions_per_step,
        # The leader's messages per step (one per decision before decisions travelled in batches).
        "decision_messages_per_step": getattr(result, "decision_messages_per_step", result.decisions_per_step),
        "tp_wait_ms": getattr(result, "tp_wait_ms", None),
        "dp_overlap_ms": result.dp_overlap_ms,
        "dp_exposed_ms": result.dp_exposed_ms,
        "runtime_cpu_ms": result.runtime_cpu_ms,
    }


def _cell(value: Any, digits: int = 1) -> str:
    if isinstance(value, (list, tuple)):
        return " / ".join(_cell(v, digits) for v in value)
    return "-" if value is None else f"{value:,.{digits}f}"


def _spread(values: list[float]) -> str:
    """The median, and every run's value: ``1.03x (0.98 1.03 1.10)``."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}x (" + " ".join(f"{v:.2f}" for v in values) + ")"


def table(rows: list[dict[str, Any]]) -> None:
    """One line per layout and policy: medians over the runs, and ``ready`` against ``fixed`` of the same run."""
    print(
        "| layout | ranks | compute | policy | step ms | tokens/s | ready vs fixed (step time) | ready vs fixed "
        "(tokens/s) | decision ms | decisions/step | messages/step | coordination ms/step | runtime CPU ms/step "
        "(rank 0) | TP group wait ms/step (rank 0) | DP overlap ms per position | DP waited ms per position |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = list(dict.fromkeys((r["layout"], r["policy"]) for r in rows))
    by_run = {(r["layout"], r["policy"], r["run"]): r for r in rows}
    for layout, policy in keys:
        mine = [r for r in rows if (r["layout"], r["policy"]) == (layout, policy)]
        pairs = [(by_run[(layout, "fixed", r["run"])], r) for r in mine if (layout, "fixed", r["run"]) in by_run]
        pairs = [(f, r) for f, r in pairs if f is not r] or pairs
        step_ratio = _spread([f["step_ms"] / r["step_ms"] for f, r in pairs])
        token_ratio = _spread([r["tokens_per_s"] / f["tokens_per_s"] for f, r in pairs])

        def median(key: str, mine: list[dict[str, Any]] = mine) -> float | None:
            values = [r[key] for r in mine if r[key] is not None]
            return statistics.median(values) if values else None

        decision, per_step, messages = (
            median("decision_ms"),
            median("decisions_per_step"),
            median("decision_messages_per_step"),
        )
        cost = None if decision is None or per_step is None else decision * per_step
        cpu = [r["runtime_cpu_ms"][0] for r in mine if r["runtime_cpu_ms"]]
        first = mine[0]
        print(
            f"| {layout} | {first['ranks']} | {first['compute']} | {policy} | {median('step_ms'):.1f} | "
            f"{median('tokens_per_s'):,.0f} | {step_ratio} | {token_ratio} | {_cell(decision, 3)} | "
            f"{_cell(per_step, 0)} | {_cell(messages, 1)} | {_cell(cost)} | "
            f"{_cell(statistics.median(cpu) if cpu else None)} | {_cell(median('tp_wait_ms'))} | "
            f"{_cell(first['dp_overlap_ms'])} | "
            f"{_cell(first['dp_exposed_ms'])} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--skip-emulated", action="store_true")
    parser.add_argument("--tp-only", action="store_true", help="only the layouts with tensor parallelism")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every layout, interleaved")
    parser.add_argument("--ranks", type=int, nargs="*", help="only the layouts of these many ranks")
    parser.add_argument("--policies", nargs="+", default=["fixed", "ready"], choices=["fixed", "ready"])
    parser.add_argument("--label", default="", help="appended to each policy's name (a variant of the code)")
    parser.add_argument("--run-index", type=int, default=0, help="the first run's number (runs pair by it)")
    parser.add_argument("--from-json", nargs="+", metavar="FILE", help="print the table of earlier runs' JSON")
    parser.add_argument("--unit-ms", type=float, default=20.0, help="emulated rows: a stage's mean forward")
    args = parser.parse_args()
    if args.from_json:
        merged: list[dict[str, Any]] = []
        for name in args.from_json:
            with open(name) as f:
                merged += json.load(f)
        table(merged)
        return
    layouts = [(layout, False) for layout in REAL]
    if not args.skip_emulated:
        layouts += [(layout, True) for layout in EMULATED]
    if args.tp_only:
        layouts = [(layout, emulated) for layout, emulated in layouts if layout[2] > 1]
    if args.ranks:
        layouts = [(layout, emulated) for layout, emulated in layouts if math.prod(layout[:3]) in args.ranks]
    profiles: dict[tuple[int, int, int, str], EmulatedCosts] = {}
    rows = []
    for repeat in range(args.repeats):
        for layout, emulated in layouts:
            for policy in args.policies:
                config = configure(*layout, policy, args.steps)
                if emulated and layout not in profiles:
                    profiles[layout] = scaled(profile_costs(config), args.unit_ms)
                result = run(config, profiles.get(layout) if emulated else None)
                described = row(layout, policy + args.label, result, emulated)
                unit = args.unit_ms if emulated else None
                rows.append({**described, "run": args.run_index + repeat, "unit_ms": unit})
                print(json.dumps(rows[-1]), flush=True)
    table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
