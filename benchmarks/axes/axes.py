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
import dataclasses
import json
import statistics
from typing import Any

from hintpipe.apps.models import ModelConfig, SeqLenDist
from hintpipe.apps.training import TrainConfig, TrainResult, profile_costs, train

# (dp, pp, tp, data parallelism): 4, 4 and 8 processes with real compute, then 16 and 32 emulated.
REAL = [(2, 2, 1, "replicate"), (2, 2, 1, "fsdp"), (1, 2, 2, "replicate"), (2, 2, 2, "fsdp")]
EMULATED = [(2, 4, 2, "replicate"), (2, 8, 2, "replicate")]


def run(dp: int, pp: int, tp: int, mode: str, policy: str, steps: int, emulated: bool) -> TrainResult:
    config = TrainConfig(
        model=ModelConfig("gpt-mini", layers=max(2, pp), hidden=64, heads=4),
        ranks=pp,
        microbatches=2 * pp,
        microbatch_size=2,
        steps=steps,
        policy=policy,
        memory_slack=2.0 if policy == "ready" else 0.0,
        seq_len_dist=SeqLenDist(32, 0.5),
        variability=("mb:0.5", "tp:2:0.3") if tp == 2 else ("mb:0.5",),
        timeout=120.0,
        dp=dp,
        tp=tp,
        data_parallel=mode,
    )
    if emulated:
        config = dataclasses.replace(config, emulate=profile_costs(config))
    result = train(config)
    assert result is not None
    return result


def row(layout: tuple[int, int, int, str], policy: str, result: TrainResult, emulated: bool) -> dict[str, Any]:
    dp, pp, tp, mode = layout
    times = [r.step_time for r in result.measured]
    return {
        "layout": f"DP{dp} x PP{pp} x TP{tp}" + (f" ({mode})" if dp > 1 and not emulated else ""),
        "ranks": dp * pp * tp,
        "compute": "emulated" if emulated else "real",
        "policy": policy,
        "step_ms": 1e3 * statistics.median(times),
        "tokens_per_s": result.throughput,
        "decision_ms": result.coordination_ms,
        "decisions_per_step": result.decisions_per_step,
        "dp_overlap_ms": result.dp_overlap_ms,
        "dp_exposed_ms": result.dp_exposed_ms,
    }


def _cell(value: Any, digits: int = 1) -> str:
    if isinstance(value, (list, tuple)):
        return " / ".join(_cell(v, digits) for v in value)
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--skip-emulated", action="store_true")
    args = parser.parse_args()
    rows = []
    layouts = [(layout, False) for layout in REAL]
    if not args.skip_emulated:
        layouts += [(layout, True) for layout in EMULATED]
    for layout, emulated in layouts:
        for policy in ("fixed", "ready"):
            rows.append(row(layout, policy, run(*layout, policy, args.steps, emulated), emulated))
            print(json.dumps(rows[-1]), flush=True)
    print(
        "| layout | ranks | compute | policy | step ms | tokens/s | ready vs fixed | decision ms | decisions/step "
        "| coordination ms/step | DP overlap ms per position | DP waited ms per position |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fixed, ready in zip(rows[::2], rows[1::2], strict=True):
        for r in (fixed, ready):
            ratio = fixed["step_ms"] / r["step_ms"]
            per_step = None
            if r["decision_ms"] is not None and r["decisions_per_step"] is not None:
                per_step = r["decision_ms"] * r["decisions_per_step"]
            print(
                f"| {r['layout']} | {r['ranks']} | {r['compute']} | {r['policy']} | {r['step_ms']:.1f} | "
                f"{r['tokens_per_s']:,.0f} | {ratio:.2f}x | {_cell(r['decision_ms'], 3)} | "
                f"{_cell(r['decisions_per_step'], 0)} | {_cell(per_step)} | {_cell(r['dp_overlap_ms'])} | "
                f"{_cell(r['dp_exposed_ms'])} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
