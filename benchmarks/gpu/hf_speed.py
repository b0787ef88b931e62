"""The GPU check's Hugging Face speed and memory (checks 10 and 11): GPT-2's throughput on 2 ranks sharing the
GPU against the unsplit model in one process and torch's ``Schedule1F1B`` on the same two stages, and the
largest micro-batch each partition trains under a memory cap (:mod:`hf_checks` has the models and sizes)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from hf_checks import (
    BUDGET_FRACTIONS,
    HfSizes,
    batch,
    build,
    example,
    hf_sizes,
    lm_loss,
    plan_for,
    unsplit_step,
)
from judge import (
    judge_memory_cap,
    judge_throughput,
)
from tables import TIMEOUT_S, HostStaged, configure, mib, synchronize
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from hintpipe.planner.plan import Plan
from hintpipe.planner.search import PlanError
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline

# -- 10. throughput of GPT-2 ----------------------------------------------------------------------------------


class TensorsOnly(nn.Module):
    """A built stage as torch's ``PipelineStage`` takes it, tensors in and out: the numbers a stage passes on
    (a sequence length for the next stage's positions) are the same for every micro-batch of one length, so
    they stay here as constants, put back among the inputs and left out of the outputs."""

    def __init__(self, inner: nn.Module, constants: dict[int, Any], last: bool) -> None:
        super().__init__()
        self.inner, self.constants, self.last = inner, constants, last

    def forward(self, *tensors: torch.Tensor) -> Any:
        values: list[Any] = list(tensors)
        for index in sorted(self.constants):
            values.insert(index, self.constants[index])
        out = self.inner(*values)
        if self.last:
            return out
        kept = tuple(t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor))
        return kept if len(kept) > 1 else kept[0]


def tensor_stages(planned: Plan, world: int, example: torch.Tensor) -> list[nn.Module]:
    """The plan's built stages wrapped in :class:`TensorsOnly`, each with the numbers it receives for
    micro-batches shaped like ``example`` (found by running the stages once on it, on the host)."""
    modules = [copy.deepcopy(planned).build_stage(i) for i in range(world)]
    values: tuple[Any, ...] = (example,)
    wrapped: list[nn.Module] = []
    with torch.no_grad():
        for index, module in enumerate(modules):
            constants = {i: v for i, v in enumerate(values) if not isinstance(v, torch.Tensor)}
            wrapped.append(TensorsOnly(module, constants, index == world - 1))
            if index < world - 1:
                out = module(*values)
                values = out if isinstance(out, tuple) else (out,)
    return wrapped


def throughput_rank(rank: int, world: int, device_name: str, planned: Plan, runs: list[str]) -> list[list[float]]:
    """Per run, this rank's seconds per step (from a barrier to its device's work done)."""
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    first, last = rank == 0, rank == world - 1
    out = []
    for run in runs:
        runtime, policy, precision = run.split()
        if runtime == "hintpipe":
            pipe = Pipeline.from_plan(
                copy.deepcopy(planned), loss_fn=lm_loss, policy=policy, precision=precision, device=device_name,
                transport="gloo", timeout=TIMEOUT_S, slack_microbatches=2,
            )  # fmt: skip
            params = [p for m in pipe.modules.values() for p in m.parameters()]

            def step(xs: list[torch.Tensor], ys: list[torch.Tensor], pipe: Pipeline = pipe) -> None:
                pipe.step(xs if first else None, ys if last else None)

        else:
            pipe = None
            step, params = torch_schedule(rank, world, planned, device, sizes)
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        times = []
        for index in range(sizes.steps):
            xs, ys = batch("gpt2", sizes, index, variable=False)
            dist.barrier()
            synchronize(device)
            start = time.perf_counter()
            step(xs, ys)
            synchronize(device)
            times.append(time.perf_counter() - start)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if pipe is not None:
            pipe.close()
        out.append(times)
    return out


def torch_schedule(
    rank: int, world: int, planned: Plan, device: torch.device, sizes: HfSizes
) -> tuple[Any, list[nn.Parameter]]:
    """torch's ``Schedule1F1B`` over this rank's built stage (host-staged boundaries on CUDA)."""
    example = batch("gpt2", sizes, 0, variable=False)[0][0]
    modules = tensor_stages(planned, world, example)
    where = torch.device("cpu")
    stages = [HostStaged(m, device, i == world - 1) if device.type == "cuda" else m for i, m in enumerate(modules)]
    values: tuple[torch.Tensor, ...] = (example,)
    for module in stages[:rank]:
        out = module(*values)
        values = out if isinstance(out, tuple) else (out,)
    outputs = stages[rank](*values)
    stage = PipelineStage(stages[rank], rank, world, where, input_args=values, output_args=outputs)
    schedule = Schedule1F1B(stage, sizes.microbatches, loss_fn=lm_loss)

    def step(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        if rank == 0:
            schedule.step(torch.cat(xs), return_outputs=False)
        elif rank == world - 1:
            schedule.step(target=torch.cat(ys), losses=[], return_outputs=False)
        else:
            schedule.step(return_outputs=False)

    return step, list(stages[rank].parameters())


def unsplit_seconds(model: nn.Module, sizes: HfSizes, device: torch.device, bf16: bool) -> float:
    """The unsplit model's step (forward + backward of every micro-batch, AdamW) in one process: the median over
    the steps after the first."""
    placed = copy.deepcopy(model).to(device)
    optimizer = torch.optim.AdamW(placed.parameters(), lr=1e-4)
    times = []
    for index in range(sizes.steps):
        xs, ys = batch("gpt2", sizes, index, variable=False)
        synchronize(device)
        start = time.perf_counter()
        unsplit_step(placed, xs, ys, device, bf16)
        synchronize(device)
        times.append(time.perf_counter() - start)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return statistics.median(times[1:] or times)


def check_hf_throughput(device_name: str, result: Any, group_timeout_s: float) -> None:
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    model = build("gpt2", sizes)
    planned = plan_for(model, "gpt2", sizes, device)
    planned.graph.module.cpu()  # the ranks build their stages on the device from the host's copy
    runs = [f"hintpipe {p} {x}" for x in ("fp32", "bf16") for p in ("fixed", "ready")]
    measured: dict[str, float | str] = {}
    try:
        per_rank = run_ranks(
            throughput_rank, 2, device_name, planned, runs, timeout=group_timeout_s, device=device_name
        )
        for i, run in enumerate(runs):
            steps = [max(t) for t in zip(*(r[i] for r in per_rank), strict=True)][1:]
            measured[run] = statistics.median(steps)
    except Exception as exc:  # the rows say why
        for run in runs:
            measured[run] = f"could not run: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    torch_run = "torch Schedule1F1B fp32" + (" (host-staged boundaries)" if device_name == "cuda" else "")
    try:
        per_rank = run_ranks(
            throughput_rank, 2, device_name, planned, ["torch 1f1b fp32"], timeout=group_timeout_s, device=device_name
        )
        measured[torch_run] = statistics.median([max(t) for t in zip(*(r[0] for r in per_rank), strict=True)][1:])
    except Exception as exc:  # torch's failing is a finding, not the check's failure
        measured[torch_run] = f"could not run: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    bounds = {precision: unsplit_seconds(model, sizes, device, precision == "bf16") for precision in ("fp32", "bf16")}
    tokens = sizes.microbatches * sizes.microbatch_size * sizes.seq_len
    result.headers = ["run", "step ms", "tokens/s", "over the unsplit model's step"]
    for label, value in [*measured.items(), *((f"unsplit model in one process {p}", s) for p, s in bounds.items())]:
        if isinstance(value, str):
            result.rows.append([label, "-", "-", value])
            continue
        bound = bounds["bf16" if "bf16" in label else "fp32"]
        result.rows.append([label, f"{value * 1e3:.1f}", f"{tokens / value:,.0f}", f"{value / bound:.3f}x"])
    result.data = {"step_s": measured, "unsplit_step_s": bounds}
    run_steps = {label: measured[label] for label in runs}
    run_bounds = {label: bounds[label.split()[-1]] for label in runs}
    fp32 = [label for label in runs if label.endswith("fp32")]
    result.judge(judge_throughput(run_steps, run_bounds, measured[torch_run], fp32, device_name))
    failed = [label for label in runs if isinstance(measured[label], str)]
    result.summary = "Every hintpipe run ran." if not failed else f"hintpipe runs failed: {', '.join(failed)}."
    result.notes += [
        f"GPT-2 {sizes.layers} layers, hidden {sizes.hidden}, 2 stages on 2 ranks sharing one {device_name}; "
        f"{sizes.microbatches} micro-batches of {sizes.microbatch_size} x {sizes.seq_len} tokens, {sizes.steps} steps "
        "with AdamW, the first left out, median step (the slowest rank's); hint 1f1b, slack_microbatches 2, gloo.",
        "The unsplit model in one process runs both stages' work in sequence with no pipeline: the bound for ranks "
        "that time-share one GPU; the last column is each run's step over it (1.000x: no overhead).",
    ]


# -- 11. the largest micro-batch under a memory cap -----------------------------------------------------------


def trains_under_cap(planned: Plan, size: int, name: str, sizes: HfSizes, device: torch.device, cap: float) -> bool:
    """Whether every stage of ``planned`` trains micro-batches of ``size`` rows under ``cap`` bytes of this
    process's device memory: parameters, AdamW state, and 1F1B's in-flight micro-batches (stage s of p holds
    p - s) kept for backward, each stage on its own."""
    values: tuple[Any, ...] | None = (example(name, sizes, torch.device("cpu"), size),)
    stages = planned.stages
    for index in range(stages):
        assert values is not None
        values = _one_stage(planned.build_stage(index), values, stages - index, device, cap)
        if values is None:
            return False
    return True


def _one_stage(
    module: nn.Module, values: tuple[Any, ...], inflight: int, device: torch.device, cap: float
) -> tuple[Any, ...] | None:
    """The stage's outputs (the next stage's inputs, on the host) if it trained under the cap, else None."""
    gc.collect()
    torch.cuda.empty_cache()
    placed = copy.deepcopy(module).to(device)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        optimizer = torch.optim.AdamW(placed.parameters(), lr=1e-4)
        kept = []
        for _ in range(inflight):
            leaves = [
                v.to(device).detach().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v
                for v in values
            ]
            out = placed(*leaves)
            outputs = out if isinstance(out, tuple) else (out,)
            kept.append([t for t in outputs if t.requires_grad])
        for grads_from in kept:
            torch.autograd.backward(grads_from, [torch.ones_like(t) for t in grads_from])
        optimizer.step()
        synchronize(device)
        return tuple(t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in outputs)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        del placed
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def check_memory_cap(device_name: str, result: Any) -> None:
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    model = build("gpt2", sizes)
    ample = plan_for(model, "gpt2", sizes, device)
    ample.graph.module.cpu()  # nothing of the planning stays on the device, under the cap
    reuse: dict[str, Any] = {"captured": ample.graph, "profiles": ample.profiles}
    busiest = max(s.memory_bytes for s in ample.baselines["time"].stages)
    for fraction in BUDGET_FRACTIONS:  # the tightest budget the plan fits at the base size
        budget = fraction * busiest
        try:
            predicted_plan = plan_for(model, "gpt2", sizes, device, stage_memory=budget, **reuse)
            break
        except PlanError:
            continue
    else:
        raise PlanError(f"no budget of {BUDGET_FRACTIONS} x the busiest stage's {mib(busiest)} MiB fits a plan")
    rows: dict[str, dict[str, Any]] = {}
    base = sizes.microbatch_size
    for label in ("hintpipe plan (recompute / offload)", "time-balanced cuts, nothing saved"):
        rows[label] = {"predicted": 0, "measured": 0, "tried": []}
    rows["hintpipe plan (recompute / offload)"]["predicted"] = predicted_plan.partition.max_microbatch_size
    rows["time-balanced cuts, nothing saved"]["predicted"] = predicted_plan.baselines["time"].max_microbatch_size
    if device_name == "cuda":
        for size in sorted({base * k for k in (1, 2, 3, 4, 6, 8, 12, 16)}):
            for label, row in rows.items():
                if row["measured"] < size - base and row["tried"]:
                    continue  # failed at a smaller size already
                try:
                    planned = plan_for(model, "gpt2", sizes, device, stage_memory=budget, microbatch_size=size, **reuse)
                except PlanError:
                    row["tried"].append((size, "no plan"))
                    continue
                if label.startswith("time"):
                    planned = dataclasses.replace(planned, partition=planned.baselines["time"])
                ok = trains_under_cap(planned, size, "gpt2", sizes, device, budget)
                row["tried"].append((size, ok))
                if ok:
                    row["measured"] = size
    result.headers = [
        "partition",
        "largest micro-batch (planner)",
        "largest micro-batch (measured under the cap)",
        "tried",
    ]
    for label, row in rows.items():
        measured = str(row["measured"]) if device_name == "cuda" else "- (CUDA only)"
        tried = ", ".join(f"{s}: {'yes' if ok is True else 'no' if ok is False else ok}" for s, ok in row["tried"])
        result.rows.append([label, str(row["predicted"]), measured, tried or "-"])
    result.data = {"budget_bytes": budget, "fraction": fraction, "rows": rows}
    plan_row, cuts_row = rows.values()
    planned_pair = (plan_row["predicted"], cuts_row["predicted"])
    measured_pair = (plan_row["measured"], cuts_row["measured"]) if device_name == "cuda" else None
    result.judge(judge_memory_cap(planned_pair, measured_pair, device_name))
    ours, theirs = measured_pair or planned_pair
    result.summary = (
        f"Under {mib(budget)} MiB per stage the plan trains micro-batches of up to {ours} rows, the compute-balanced "
        f"cuts {theirs}." + ("" if device_name == "cuda" else " (planner's figures: no cap on a CPU)")
    )
    result.notes += [
        f"GPT-2 {sizes.layers} layers, hidden {sizes.hidden}, 2 stages, 1F1B with {sizes.microbatches} micro-batches; "
        f"rows of {sizes.seq_len} tokens. The cap: the tightest of {BUDGET_FRACTIONS} x the time-balanced cuts' "
        f"busiest stage at {base} rows that the plan fits ({result.data['fraction']:g}) "
        "(parameters, gradients, AdamW state, in-flight activations), set with "
        "`torch.cuda.set_per_process_memory_fraction` while each stage alone trains its in-flight micro-batches.",
    ]
