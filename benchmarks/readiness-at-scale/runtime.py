"""The study's levers in the runtime: emulated compute at 16 and 32 ranks, then real compute on 2 ranks.

Emulated part (every task sleeps its profiled cost, scaled to a unit of
``--unit-ms`` per 1F1B stage forward and by each micro-batch's size; the
messages, scoreboards and notices are the runtime's own): gpt-mini with
lognormal sequence lengths and ``mm-mini`` (image count and text length drawn
apart; the encoder's stages sleep with the images, the decoder's with the
text). Each runs as fixed 1F1B in the given order (the baseline), and with
the levers added one at a time: the bfw hint, then ``ready`` with a
per-device budget (the configuration the README recommends), then a
micro-batch order by size (balanced, shortest-first), which buys more speed
for more activation memory.
Reported: the median step time over the steps after the first two (``ready``
has no plan in step 0) and its ratio to the baseline, and per rank the most
*tokens* (elements of the micro-batches' first-stage inputs) held in
activations at once, against the baseline's busiest rank: emulated tasks
keep no tensors, so memory is counted from the timelines and the inputs.

Real part (2 ranks, one thread each, gloo): fixed 1F1B, the recommended
configuration and the shortest-first one on gpt-mini with variable lengths,
plus torch.distributed.pipelining's ``Schedule1F1B`` on
the same 2-stage split padding every micro-batch to the longest length (its
schedules fix tensor shapes), through benchmarks/runtime-gpt-mini's harness.

Run from the repository root::

    .venv/bin/python benchmarks/readiness-at-scale/runtime.py [--ranks 16 32] [--steps 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hintpipe.apps.emulation import profile_costs
from hintpipe.apps.models import ModelConfig, SeqLenDist, make_batch
from hintpipe.apps.training import TrainConfig, TrainResult, predict_step_time, train
from hintpipe.dispatch.policy import Policy
from hintpipe.runtime.loop.emulated import EmulatedCosts
from hintpipe.runtime.loop.executor import as_tensors
from hintpipe.runtime.loop.reports import StepReport
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.microbatch_order import microbatch_order
from hintpipe.schedule.task import Kind


@dataclasses.dataclass(frozen=True)
class Setup:
    """One configuration: the hint, the order, the policy and the memory rule."""

    label: str
    hint: str
    order: str
    policy: str
    device_budget_fraction: float | None = None
    admission: str = "slots"


BASELINE = Setup("fixed 1F1B, given order", "1f1b", "given", "fixed")
RECOMMENDED = Setup("ready bfw, given order, device budget", "bfw", "given", "ready", 0.0)
SETUPS = [
    BASELINE,
    Setup("fixed bfw, given order", "bfw", "given", "fixed"),
    RECOMMENDED,
    Setup("ready bfw, balanced, device budget", "bfw", "balanced", "ready", 0.0),
    Setup("ready bfw, shortest-first, device budget", "bfw", "shortest-first", "ready", 0.0),
    # The simulator's best at fixed 1F1B's bytes: admitted by size within what fixed 1F1B's busiest rank
    # holds by size in the given order (device budget 0), the hint fitted to that room, as `simulate
    # --admission size` runs it; fixed order on the same fitted hint beside it.
    Setup("fixed zb-h1, front-then-back, by size, device budget", "zb-h1", "front-then-back", "fixed", 0.0, "size"),
    Setup("ready zb-h1, front-then-back, by size, device budget", "zb-h1", "front-then-back", "ready", 0.0, "size"),
    # The same on 1F1B: its room by size is fixed 1F1B's busiest rank's exactly (zb-h1's own is more: a
    # micro-batch counts as held until its deferred W).
    Setup("fixed 1F1B, front-then-back, by size, device budget", "1f1b", "front-then-back", "fixed", 0.0, "size"),
    Setup("ready 1F1B, front-then-back, by size, device budget", "1f1b", "front-then-back", "ready", 0.0, "size"),
]


def model_for(name: str, ranks: int) -> ModelConfig:
    """Enough layers for two stages per rank (bfw), small enough to profile quickly."""
    return ModelConfig(name, layers=2 * ranks, hidden=32, heads=2, vocab=64, max_seq_len=256, seed=0)


def config_for(name: str, ranks: int, microbatches: int, steps: int, setup: Setup) -> TrainConfig:
    return TrainConfig.of(
        model=model_for(name, ranks),
        ranks=ranks,
        microbatches=microbatches,
        microbatch_size=1,
        hint=setup.hint,
        policy=setup.policy,
        steps=steps,
        device_budget_fraction=setup.device_budget_fraction,
        seq_len_dist=SeqLenDist(32, 0.5),
        timeout=600.0,
        timelines=True,
        microbatch_order=setup.order,
        admission=setup.admission,
    )


#: Profiles, once per benchmark run: (model, ranks, stages) -> the stages' profiled costs (backward split).
_PROFILES: dict[tuple[str, int, int], EmulatedCosts] = {}


def profiled(config: TrainConfig) -> EmulatedCosts:
    """The stages' profiled costs for ``config``, measured once and kept for every later setup and repeat.

    Why kept: a profile measured afresh for each setup (as this benchmark did) carries the machine's noise
    into the emulated work itself; on 2 shared cores two profiles of the same stages differed by up to 2x,
    so setups and repeats slept different amounts of work and their ratios moved by as much (this was the
    "same configuration moves 2.7x between runs" the emulated tables showed). One profile with the
    backward split (``B`` and ``W``) serves every hint: a hint that does not split it sleeps ``B + W`` as
    its backward, so that hints compare on the same work (two profiles, one per split, made fixed bfw
    against fixed 1F1B come out 0.75x in one run and 1.49x in another).
    """
    hint = config.resolved_hint
    key = (config.model.name, config.parallelism.ranks, hint.stages)
    if key not in _PROFILES:
        chunks = hint.stages // config.parallelism.ranks
        split = config if hint.split_backward else config.replaced(hint="zb-h1" if chunks == 1 else "bfw")
        _PROFILES[key] = profile_costs(split, repeats=3)
    costs = _PROFILES[key]
    if hint.split_backward:
        return costs
    whole = tuple(b + w for b, w in zip(costs.backward, costs.weight, strict=True))
    return dataclasses.replace(costs, backward=whole, weight=(0.0,) * len(whole))


def scaled_costs(
    config: TrainConfig, unit_ms: float, reference: EmulatedCosts | None, balanced: bool = False
) -> EmulatedCosts:
    """The profiled costs, scaled so that the 1F1B baseline's mean stage forward costs ``unit_ms``
    (``reference``: the baseline's own profile; every setup scales by the same factor). ``balanced``: every
    stage costs the stages' mean of each kind (as a planner's cuts would make them), still scaled per
    micro-batch by the input that sizes it (images at the encoder's stages, text at the decoder's): the
    profile's layer-by-layer split leaves one rank of mm-mini with most of the work, which bounds every
    schedule alike."""
    costs = profiled(config)
    base = reference if reference is not None else costs
    costs = costs.scaled(unit_ms * 1e-3 / statistics.mean(base.forward))
    if not balanced:
        return costs
    stages = len(costs.forward)
    return dataclasses.replace(
        costs,
        forward=(statistics.mean(costs.forward),) * stages,
        backward=(statistics.mean(costs.backward),) * stages,
        weight=(statistics.mean(costs.weight),) * stages,
    )


def peak_tokens(result: TrainResult, config: TrainConfig) -> list[int]:
    """Per rank, the most input elements whose activations it held at once, over the measured steps:
    an ``F`` holds its micro-batch's elements until its stage's last backward task (``W`` when split)."""
    hint = config.resolved_hint
    release = Kind.W if hint.split_backward else Kind.B
    peaks = [0] * hint.ranks
    for report in result.measured:
        inputs, _, _ = make_batch(
            config.model,
            config.pipeline.microbatches,
            config.training.microbatch_size,
            config.data.seq_len_dist,
            report.step,
            config.training.seed,
        )
        elements = [sum(t.numel() for t in as_tensors(x)) for x in inputs]
        if report.sizes:  # the runtime's own (its order may use more than the sizes: front-then-back's ends)
            size = list(report.sizes)
        else:
            slots = microbatch_order(elements, config.pipeline.microbatch_order)  # slot i runs micro-batch slots[i]
            size = [elements[m] for m in slots]
        events: list[list[tuple[float, int]]] = [[] for _ in range(hint.ranks)]
        for rank, task, start, end in report.records:
            if task.kind is Kind.F:
                events[rank].append((start, size[task.mb]))
            elif task.kind is release:
                events[rank].append((end, -size[task.mb]))
        for rank, ranked in enumerate(events):
            live = 0
            for _, delta in sorted(ranked, key=lambda e: (e[0], e[1])):
                live += delta
                peaks[rank] = max(peaks[rank], live)
    return peaks


def work_ms(reports: Sequence[StepReport], ranks: int) -> list[float]:
    """Per rank, its tasks' time a step (ms; emulated tasks sleep their cost), from rank 0's timelines."""
    busy = [0.0] * ranks
    for report in reports:
        for rank, _, start, end in report.records:
            busy[rank] += end - start
    return [1e3 * b / max(1, len(reports)) for b in busy]


def predicted(hint: Hint, report: StepReport, setup: Setup) -> float:
    """The simulator's step time for a measured step: its measured task times as the sample, ``ready``
    planning with the costs the runtime planned with, within the budgets the step ran under (by size: the
    hint fitted to them as the runtime fitted it), producer notices on, as in the runtime."""
    return predict_step_time(hint, report, Policy(setup.policy), admission=setup.admission)


def emulated(
    name: str, ranks: int, steps: int, unit_ms: float, setups: Sequence[Setup] = tuple(SETUPS), balanced: bool = False
) -> list[dict[str, Any]]:
    microbatches = 2 * ranks
    reference = profiled(config_for(name, ranks, microbatches, steps, BASELINE))
    rows: list[dict[str, Any]] = []
    for setup in setups:
        config = config_for(name, ranks, microbatches, steps, setup)
        config = config.replaced(emulate=scaled_costs(config, unit_ms, reference, balanced))
        began = time.perf_counter()
        result = train(config)
        assert result is not None
        measured = result.reports[2:]
        times = [r.makespan for r in measured]
        hint = config.resolved_hint
        rows.append(
            {
                "model": name,
                "ranks": ranks,
                "microbatches": microbatches,
                "balanced": balanced,
                "setup": setup.label,
                "step_ms": 1e3 * statistics.median(times),
                "step_ms_each": [1e3 * t for t in times],
                "peak_tokens": peak_tokens(result, config),
                "wall_s": time.perf_counter() - began,
                # per rank, the runtime's own CPU and the tasks' (slept) work, ms a step
                "runtime_cpu_ms": list(result.runtime_cpu_ms or ()),
                "work_ms": work_ms(measured, hint.ranks),
                "predicted_ms": [1e3 * predicted(hint, r, setup) for r in measured],
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def real(steps: int, repeats: int) -> str:
    """2 ranks, real compute: fixed 1F1B, the recommended configuration, and torch's Schedule1F1B
    padded to the longest micro-batch, through benchmarks/runtime-gpt-mini's harness."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime-gpt-mini"))
    harness: Any = importlib.import_module("runtime_gpt_mini")

    model = ModelConfig("gpt-mini", layers=4, hidden=128, seed=harness.SEED)
    varied = SeqLenDist(96, 0.5)
    common: dict[str, Any] = {"model": model, "microbatches": 8, "microbatch_size": 4, "steps": steps}
    longest = max(x.shape[1] for step in range(steps) for x in make_batch(model, 8, 4, varied, step, harness.SEED)[0])
    fastest = SETUPS[-1]
    variants = [
        harness.Variant(
            f"torch Schedule1F1B, padded to {longest}", "torch", "1f1b", seq_len=varied, pad_to=longest, **common
        ),
        harness.Variant("hintpipe fixed", "hintpipe", "fixed", seq_len=varied, **common),
        *(
            harness.Variant(
                f"hintpipe {setup.label}",
                "hintpipe",
                setup.policy,
                seq_len=varied,
                hint=setup.hint,
                order=setup.order,
                device_budget_fraction=setup.device_budget_fraction,
                **common,
            )
            for setup in (RECOMMENDED, fastest)
        ),
    ]
    results = harness.run_variants(variants, repeats)
    return str(
        harness.d_table(
            "Real compute, 2 ranks, gpt-mini hidden 128, 8 micro-batches of 4 sequences, lengths lognormal:96:0.5",
            results,
            variants[0].label,
        )
    )


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| model | ranks x micro-batches | configuration | step ms | speedup | busiest rank's peak tokens "
        "| ratio to baseline's busiest |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    baseline: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        key = (row["model"], row["ranks"])
        if row["setup"] == BASELINE.label:
            baseline[key] = row
        base = baseline[key]
        lines.append(
            f"| {row['model']} | {row['ranks']} x {row['microbatches']} | {row['setup']} | {row['step_ms']:,.0f} | "
            f"{base['step_ms'] / row['step_ms']:.2f}x | {max(row['peak_tokens']):,} | "
            f"{max(row['peak_tokens']) / max(base['peak_tokens']):.2f} |"
        )
    return "\n".join(lines)


def decidability(rows: Sequence[dict[str, Any]]) -> str:
    """Per configuration over repeated, interleaved runs: the step time of each run, the runtime's own CPU
    beside the work, the simulator's prediction, and ``ready`` against ``fixed`` on the same hint (each
    repeat's ratio: their spread says whether a difference is decided)."""
    lines = [
        "| model | ranks | configuration | step ms (each run) | runtime CPU ms a rank-step: mean, max "
        "| of the work | simulator / measured | vs fixed, same hint (each run) |",
        "|---|---:|---|---|---|---:|---:|---|",
    ]
    key = lambda r: (r["model"], r["ranks"], r["setup"])  # noqa: E731
    groups = {k: list(g) for k, g in itertools.groupby(sorted(rows, key=key), key=key)}
    by_label = {s.label: s for s in SETUPS}
    for (model, ranks, label), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        setup = by_label[label]
        steps = [r["step_ms"] for r in runs]
        cpu = [c for r in runs for c in r["runtime_cpu_ms"]]
        work = statistics.mean(w for r in runs for w in r["work_ms"])
        ratio = [
            statistics.median(p / m for p, m in zip(r["predicted_ms"], r["step_ms_each"], strict=True)) for r in runs
        ]
        same = ""
        fixed = groups.get(
            (
                model,
                ranks,
                next(
                    (
                        s.label
                        for s in SETUPS
                        if s.hint == setup.hint
                        and s.policy == "fixed"
                        and s.order == setup.order
                        and s.admission == setup.admission
                    ),
                    "",
                ),
            )
        )
        if setup.policy != "fixed" and fixed:
            each = [f["step_ms"] / r["step_ms"] for f, r in zip(fixed, runs, strict=False)]
            same = f"{statistics.median(each):.2f}x ({' '.join(f'{x:.2f}' for x in each)})"
        lines.append(
            f"| {model} | {ranks} | {label} | {statistics.median(steps):,.0f} ({' '.join(f'{x:,.0f}' for x in steps)}) "
            f"| {statistics.mean(cpu):.1f}, {max(cpu):.1f} | {statistics.mean(cpu) / work:.1%} "
            f"| {statistics.median(ratio):.2f} | {same} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[16, 32], help="emulated rank counts (none: skip)")
    parser.add_argument("--models", nargs="+", default=["gpt-mini", "mm-mini"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--unit-ms", type=float, default=20.0, help="a 1F1B stage's mean forward (default 20)")
    parser.add_argument("--real-steps", type=int, default=8, help="steps of the real 2-rank part (0: skip it)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each real configuration")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--emulated-repeats", type=int, default=1, help="interleaved runs of each emulated setup")
    parser.add_argument("--setups", type=int, nargs="+", help="emulated setups to run (0-based; default: all)")
    parser.add_argument("--balanced", action="store_true", help="every stage the stages' mean cost (see scaled_costs)")
    args = parser.parse_args()
    setups = [SETUPS[i] for i in args.setups] if args.setups else list(SETUPS)
    if args.setups and BASELINE not in setups:
        setups.insert(0, BASELINE)  # the table's speedups are over it
    rows = []
    for repeat in range(args.emulated_repeats):
        order = setups if repeat % 2 == 0 else list(reversed(setups))
        for ranks in args.ranks:
            for name in args.models:
                rows += emulated(name, ranks, args.steps, args.unit_ms, order, args.balanced)
    if rows:
        first = [r for i, r in enumerate(rows) if i < len(args.ranks) * len(args.models) * len(setups)]
        print(table(first), flush=True)
        if args.emulated_repeats > 1 or args.setups:
            print()
            print(decidability(rows), flush=True)
    real_table = real(args.real_steps, args.repeats) if args.real_steps else ""
    print(real_table)
    if args.json:
        Path(args.json).write_text(json.dumps({"emulated": rows, "real": real_table}, indent=1))


if __name__ == "__main__":
    main()
