"""A prepared GPU check: four short parts that a machine with one CUDA device answers in under 10 minutes.

1. Gradients equal the unsplit model's: gpt-mini on 2 and 4 ranks sharing the one device (gloo transport, a
   GPU's tensors staged through host memory), variable sequence lengths, policies ``fixed`` and ``ready``,
   every parameter gradient against the unsplit model run on the same device in one process.
2. Throughput: ``fixed`` and ``ready`` against torch.distributed.pipelining's ``Schedule1F1B`` on the same
   2-stage split and data, 2 ranks on the one device, tokens/s; hintpipe also with variable lengths.
3. The planner's predicted activation bytes per micro-batch against what a stage's forward leaves allocated
   (``torch.cuda.memory_allocated`` and ``max_memory_allocated`` deltas; on CPU saved-tensor accounting).
4. Offload on and off: a plan under a memory budget that makes it offload, against the plan without one:
   per stage, memory held after one micro-batch's forward and forward + backward time.

With ``--device cpu`` it runs end to end on a machine without a GPU (only the CUDA calls go unexercised), as
a check of the script, not of GPU figures. Run from the repository root::

    bash benchmarks/gpu/run.sh OUT_DIR [--device cuda|cpu] [--quick]

Writes ``OUT_DIR/results.md`` and ``OUT_DIR/results.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import hintpipe
from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.search import PlanError
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.loop.executor import as_input
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.tensor_bytes import count_saved, nbytes, parameter_storages

MiB = 2**20
#: Room for this many more in-flight micro-batches than 1F1B's own, for both policies (as the demo runs).
SLACK = 2.0
#: Seconds a rank may wait with nothing ready before the pipeline's watchdog ends the step.
TIMEOUT_S = 60.0
#: The spawned ranks' process-group timeout: a collective or a point-to-point transfer stuck this long fails
#: instead of hanging the check (torch's schedule sending CUDA tensors over gloo may fail that way).
GROUP_TIMEOUT_S = 60.0
#: Per-element gradient tolerance (rtol, atol), as tests/test_runtime.py: float32 on both devices; the
#: micro-batch gradients may be summed in another order, and on CUDA (TF32 off) attention and embedding
#: backward kernels reduce with atomics, whose order varies from run to run.
GRAD_TOLERANCE = {"cpu": (1e-5, 1e-6), "cuda": (1e-4, 1e-5)}
#: Host link bandwidth the planner is told for offload (bytes/s), and a generous one to fall back to when the
#: planner prefers recomputing at the real one (a fast GPU recomputes a small model's layers cheaply).
HOST_BANDWIDTH = 25e9
GENEROUS_HOST_BANDWIDTH = 1e12
#: Budgets for part 4, as fractions of the unconstrained plan's busiest stage, tried until the plan offloads.
BUDGET_FRACTIONS = (0.85, 0.7, 0.55)
#: Part 3's goal: predicted activation bytes within this share of the measured.
MEMORY_GOAL = 0.05


# -- sizes ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Model and run sizes per device: small enough for a 2-core CPU dry run, big enough on a GPU that the
    figures are not all launch overhead."""

    grad_model: ModelConfig
    grad_microbatch_size: int
    grad_seq: SeqLenDist
    tput_model: ModelConfig
    tput_microbatch_size: int
    tput_seq_len: int
    steps: int
    plan_model: ModelConfig
    plan_microbatch_size: int
    plan_seq_len: int
    time_repeats: int
    microbatches: int = 8


def sizes_for(device: str, quick: bool) -> Sizes:
    """The sizes for ``device``; ``quick`` runs fewer steps and repeats."""
    if device == "cuda":
        return Sizes(
            grad_model=ModelConfig("gpt-mini", layers=4, hidden=256, heads=8, vocab=512, max_seq_len=257),
            grad_microbatch_size=4,
            grad_seq=SeqLenDist(128, 0.5),
            tput_model=ModelConfig("gpt-mini", layers=8, hidden=512, heads=8, vocab=1024, max_seq_len=513),
            tput_microbatch_size=8,
            tput_seq_len=256,
            steps=4 if quick else 10,
            plan_model=ModelConfig("gpt-mini", layers=12, hidden=256, heads=8, vocab=256, max_seq_len=257),
            plan_microbatch_size=8,
            plan_seq_len=256,
            time_repeats=3 if quick else 10,
        )
    return Sizes(
        grad_model=ModelConfig("gpt-mini", layers=2, hidden=32, heads=2, vocab=64, max_seq_len=65),
        grad_microbatch_size=2,
        grad_seq=SeqLenDist(32, 0.5),
        tput_model=ModelConfig("gpt-mini", layers=4, hidden=64, heads=4, vocab=128, max_seq_len=129),
        tput_microbatch_size=4,
        tput_seq_len=64,
        steps=3 if quick else 8,
        plan_model=ModelConfig("gpt-mini", layers=4, hidden=64, heads=4, vocab=128, max_seq_len=129),
        plan_microbatch_size=4,
        plan_seq_len=128,
        time_repeats=3 if quick else 5,
    )


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every part (and every spawned rank) needs to know."""

    device: str  # "cuda" or "cpu"
    sizes: Sizes


def configure(device: str) -> torch.device:
    """One CPU thread, and full float32 matmuls on CUDA (TF32 would make gradients differ by ~1e-3)."""
    torch.set_num_threads(1)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer read after it covers the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- report sections ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Section:
    """One part's result: a Markdown table with notes, and its figures for the JSON file."""

    title: str
    headers: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    left: int = 1  # leading text columns (aligned left)
    failed: bool = False  # a check in it failed (the script then exits with status 1)

    def markdown(self) -> str:
        lines = [f"## {self.title}", ""]
        if self.error is not None:
            lines += [f"**Could not run:** {self.error}", ""]
        if self.rows:
            align = ["---" if i < self.left else "---:" for i in range(len(self.headers))]
            lines += ["| " + " | ".join(cells) + " |" for cells in [self.headers, align, *self.rows]]
            lines.append("")
        lines += [f"- {note}" for note in self.notes]
        lines.append(f"- ({self.seconds:.0f} s)")
        return "\n".join(lines) + "\n"


def run_part(name: str, fn: Callable[[Setup], Section], setup: Setup) -> Section:
    """Run one part; a part that fails becomes a section that says why, and the others still run."""
    print(f"[{time.strftime('%H:%M:%S')}] part {name} ...", flush=True)
    start = time.perf_counter()
    try:
        section = fn(setup)
    except Exception as exc:  # any failure of one part: report it, go on with the next
        section = Section(f"{name}. (failed)", error=f"{type(exc).__name__}: {exc}", failed=True)
        section.data["traceback"] = traceback.format_exc()
    section.seconds = time.perf_counter() - start
    print("\n" + section.markdown(), flush=True)
    return section


def mib(value: float) -> str:
    return f"{value / MiB:.2f}"


# -- part 1: gradients against the unsplit model ----------------------------------------------------------

POLICIES = ("fixed", "ready")


def gradient_rank(rank: int, world: int, setup: Setup, transport: str = "gloo") -> dict[str, Any]:
    """One rank of part 1: per policy, a pipeline on the shared device, two steps on the same data with the
    gradients zeroed between them (``ready`` plans with the first step's measured costs, so the second step
    is the one that runs ``ready``); returns the second step's gradients (on the host) and its policy."""
    configure(setup.device)
    sizes = setup.sizes
    inputs, targets, _ = make_batch(sizes.grad_model, sizes.microbatches, sizes.grad_microbatch_size, sizes.grad_seq, 0)
    first, last = rank == 0, rank == world - 1
    out: dict[str, Any] = {}
    for policy in POLICIES:
        modules = split_layers(build_layers(sizes.grad_model), world)
        with Pipeline(
            {rank: modules[rank]},
            loss_fn=lm_loss,
            microbatches=sizes.microbatches,
            hint="1f1b",
            policy=policy,
            memory_slack=SLACK,
            device=setup.device,
            transport=transport,
            timeout=TIMEOUT_S,
        ) as pipe:
            loss = None
            for _ in range(2):
                modules[rank].zero_grad(set_to_none=True)
                loss = pipe.step(inputs if first else None, targets if last else None, broadcast_loss=True)
            grads = {
                f"{rank}.{n}": p.grad.detach().cpu() for n, p in modules[rank].named_parameters() if p.grad is not None
            }
            report = pipe.reports[-1]
            out[policy] = {
                "grads": grads,
                "ran_as": report.policy.value,
                "loss": None if loss is None else float(loss),
                "device_peak_bytes": report.device_peak_bytes,
                "allocated_over_counted": report.allocated_over_counted,
            }
    return out


def unsplit_gradients(setup: Setup, device: torch.device, world: int) -> tuple[dict[str, torch.Tensor], float]:
    """The unsplit model on ``device`` in this process: each micro-batch's loss divided by the micro-batch
    count (the pipeline's default ``loss_divisor``), gradients summed; returns them by ``stage.name``."""
    sizes = setup.sizes
    modules = split_layers(build_layers(sizes.grad_model), world)
    model = nn.Sequential(*modules).to(device)
    inputs, targets, _ = make_batch(sizes.grad_model, sizes.microbatches, sizes.grad_microbatch_size, sizes.grad_seq, 0)
    total = 0.0
    for x, y in zip(inputs, targets, strict=True):
        loss = lm_loss(model(x.to(device)), y.to(device)) / sizes.microbatches
        torch.autograd.backward(loss)
        total += float(loss.detach())
    grads = {
        f"{s}.{n}": p.grad.detach().cpu()
        for s, m in enumerate(modules)
        for n, p in m.named_parameters()
        if p.grad is not None
    }
    return grads, total


def compare_gradients(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], device: str
) -> tuple[float, float, bool, list[str]]:
    """(max |difference|, max |expected gradient|, every element within tolerance, names missing)."""
    rtol, atol = GRAD_TOLERANCE[device]
    missing = sorted(set(expected) - set(got))
    worst, largest, ok = 0.0, 0.0, not missing
    for name, grad in got.items():
        ref = expected[name]
        worst = max(worst, float((grad - ref).abs().max()))
        largest = max(largest, float(ref.abs().max()))
        ok &= bool(torch.allclose(grad, ref, rtol=rtol, atol=atol))
    return worst, largest, ok, missing


def part_gradients(setup: Setup) -> Section:
    """Part 1: gradients of 2- and 4-rank pipelines on one device against the unsplit model."""
    sizes = setup.sizes
    device = configure(setup.device)
    rtol, atol = GRAD_TOLERANCE[setup.device]
    _, _, tokens = make_batch(sizes.grad_model, sizes.microbatches, sizes.grad_microbatch_size, sizes.grad_seq, 0)
    lengths = [t // sizes.grad_microbatch_size for t in tokens]
    model = sizes.grad_model
    section = Section(
        "1. Gradients equal the unsplit model's",
        ["ranks", "transport", "policy", "ran as", "max abs diff", "max abs grad", "loss diff", "within tolerance"],
        left=4,
    )
    section.notes += [
        f"gpt-mini {model.layers} blocks, hidden {model.hidden}, {sizes.microbatches} micro-batches of "
        f"{sizes.grad_microbatch_size} sequences, lengths {lengths}; hint 1f1b; transport gloo: every rank on "
        f"{setup.device} (one device shared), nccl: a GPU per rank; the second of two steps compared (`ready` "
        "plans from the first).",
        f"Tolerance per element: |diff| <= {atol:g} + {rtol:g} x |unsplit| (as tests/test_runtime.py), float32"
        + (", TF32 off." if setup.device == "cuda" else "."),
    ]
    gpus = torch.cuda.device_count() if setup.device == "cuda" else 0
    # Transport (b), NCCL GPU to GPU, needs a GPU per rank: it runs where there are that many.
    runs = [(world, "gloo") for world in (2, 4)] + [(world, "nccl") for world in (2, 4) if gpus >= world]
    if setup.device == "cuda" and gpus < 2:
        section.notes.append(f"{gpus} GPU here: transport nccl (a GPU per rank) not run.")
    for world, transport in runs:
        expected, reference_loss = unsplit_gradients(setup, device, world)
        per_rank = run_ranks(gradient_rank, world, setup, transport, timeout_s=GROUP_TIMEOUT_S)
        for policy in POLICIES:
            got = {k: v for result in per_rank for k, v in result[policy]["grads"].items()}
            worst, largest, ok, missing = compare_gradients(got, expected, setup.device)
            loss = per_rank[-1][policy]["loss"]
            loss_diff = abs(loss - reference_loss) if loss is not None else float("nan")
            verdict = "yes" if ok else "**NO**" + (f" (missing {missing})" if missing else "")
            section.failed |= not ok
            section.rows.append(
                [
                    str(world),
                    transport,
                    policy,
                    per_rank[0][policy]["ran_as"],
                    f"{worst:.2e}",
                    f"{largest:.2e}",
                    f"{loss_diff:.1e}",
                    verdict,
                ]
            )
            section.data[f"{world}-{transport}-{policy}"] = {
                "max_abs_diff": worst,
                "max_abs_grad": largest,
                "ok": ok,
                "loss_diff": loss_diff,
                # rank 0's report covers every rank: the allocator's view of the step (CUDA only)
                "device_peak_bytes": per_rank[0][policy]["device_peak_bytes"],
                "allocated_over_counted": per_rank[0][policy]["allocated_over_counted"],
            }
    return section


# -- part 2: throughput against torch's Schedule1F1B -------------------------------------------------------

StepFn = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


@dataclasses.dataclass(frozen=True)
class Run:
    """One throughput run: who schedules (``hintpipe``; ``torch`` with the stage's tensors on the device;
    ``torch-host``: torch's stage on the host, its module run on the device), which policy, what lengths."""

    label: str
    runtime: str
    policy: str = "fixed"
    variable: bool = False


def throughput_batch(setup: Setup, step: int, variable: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The step's micro-batches (the same for every run): fixed length, or lognormal lengths of the same mean."""
    sizes = setup.sizes
    seq = SeqLenDist(sizes.tput_seq_len, 0.5) if variable else SeqLenDist(sizes.tput_seq_len)
    inputs, targets, tokens = make_batch(sizes.tput_model, sizes.microbatches, sizes.tput_microbatch_size, seq, step)
    return inputs, targets, sum(tokens)


class HostStaged(nn.Module):
    """A stage whose boundary tensors live on the host: torch's stage then sends CPU tensors over gloo (which
    moves no CUDA tensors between processes), while the module computes on the device, as hintpipe's gloo
    transport stages a GPU's tensors through host memory. The last stage's output (the logits) stays on the
    device, where the loss is computed."""

    def __init__(self, inner: nn.Module, device: torch.device, last: bool) -> None:
        super().__init__()
        self.inner = inner.to(device)
        self.device = device
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x.to(self.device))
        return out if self.last else out.to("cpu")


def hintpipe_stepper(rank: int, world: int, setup: Setup, module: nn.Module, run: Run) -> tuple[StepFn, Pipeline]:
    """A hintpipe pipeline over this rank's stage on the shared device (gloo transport)."""
    pipe = Pipeline(
        {rank: module},
        loss_fn=lm_loss,
        microbatches=setup.sizes.microbatches,
        hint="1f1b",
        policy=run.policy,
        memory_slack=SLACK,
        device=setup.device,
        transport="gloo",
        timeout=TIMEOUT_S,
    )
    first, last = rank == 0, rank == world - 1

    def step(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        pipe.step(inputs if first else None, targets if last else None)

    return step, pipe


def torch_stepper(
    rank: int, world: int, setup: Setup, modules: list[nn.Module], run: Run, device: torch.device
) -> tuple[StepFn, nn.Module]:
    """torch's ``Schedule1F1B`` over this rank's stage; returns the step and the module that trains."""
    host = run.runtime == "torch-host"
    first, last = rank == 0, rank == world - 1
    stages: list[nn.Module]
    if host:
        stages = [HostStaged(m, device, i == world - 1) for i, m in enumerate(modules)]
        where = torch.device("cpu")
    else:
        stages = [m.to(device) for m in modules]
        where = device
    ids = throughput_batch(setup, 0, False)[0][0].to(where)
    # Example tensors with autograd (torch then knows which outputs carry gradients, and infers no shapes).
    example_in = ids
    for stage_module in stages[:rank]:
        example_in = stage_module(example_in)
    example_out = stages[rank](example_in)
    stage = PipelineStage(stages[rank], rank, world, where, input_args=example_in, output_args=example_out)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return lm_loss(out, target.to(out.device))

    schedule = Schedule1F1B(stage, setup.sizes.microbatches, loss_fn=loss_fn)

    def step(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        if first:
            schedule.step(torch.cat(inputs).to(where), return_outputs=False)
        elif last:
            schedule.step(target=torch.cat(targets).to(where), losses=[], return_outputs=False)
        else:
            schedule.step(return_outputs=False)

    return step, stages[rank]


def timed_steps(setup: Setup, run: Run, step: StepFn, module: nn.Module, device: torch.device) -> dict[str, Any]:
    """Train ``setup.sizes.steps`` steps (AdamW), timing each from a barrier to the device's work done."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    times: list[float] = []
    tokens: list[int] = []
    for index in range(setup.sizes.steps):
        inputs, targets, count = throughput_batch(setup, index, run.variable)
        dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        step(inputs, targets)
        synchronize(device)
        times.append(time.perf_counter() - start)
        tokens.append(count)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"times": times, "tokens": tokens}


def throughput_rank(rank: int, world: int, setup: Setup, runs: list[Run]) -> list[dict[str, Any]]:
    """One rank of part 2: each run in turn, with a fresh copy of the same model."""
    device = configure(setup.device)
    out = []
    for run in runs:
        modules = split_layers(build_layers(setup.sizes.tput_model), world)
        if run.runtime == "hintpipe":
            step, pipe = hintpipe_stepper(rank, world, setup, modules[rank], run)
            with pipe:
                out.append(timed_steps(setup, run, step, modules[rank], device))
        else:
            step, module = torch_stepper(rank, world, setup, modules, run, device)
            out.append(timed_steps(setup, run, step, module, device))
    return out


def tokens_per_second(per_rank: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(tokens/s, median step seconds) over the steps after the first; a step lasts as long as its slowest rank."""
    steps = [max(ts) for ts in zip(*(r["times"] for r in per_rank), strict=True)][1:]
    tokens = per_rank[0]["tokens"][1:]
    return sum(tokens) / sum(steps), statistics.median(steps)


def stage_compute(setup: Setup, device: torch.device) -> list[float]:
    """Seconds of each stage's forward + backward over one step's fixed-length micro-batches, in this process
    (no pipeline, no transport): the median over ``steps`` steps after a first that warms up."""
    sizes = setup.sizes
    modules = [m.to(device) for m in split_layers(build_layers(sizes.tput_model), 2)]
    per_step: list[list[float]] = []
    for index in range(sizes.steps):
        inputs, targets, _ = throughput_batch(setup, index, False)
        spent = [0.0, 0.0]
        for x, y in zip(inputs, targets, strict=True):
            hidden, first = forward_backward(modules[0], x.to(device), None, device)
            _, second = forward_backward(modules[1], hidden, y.to(device), device)
            spent[0] += first
            spent[1] += second
        per_step.append(spent)
    return [statistics.median(s[i] for s in per_step[1:] or per_step) for i in range(2)]


def forward_backward(
    module: nn.Module, x: torch.Tensor, target: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, float]:
    """One micro-batch through one stage and back (the loss at the last stage, gradients of ones elsewhere);
    returns the output (detached) and the seconds it took."""
    leaf = as_input(x)
    synchronize(device)
    start = time.perf_counter()
    out = module(leaf)
    if target is not None:
        torch.autograd.backward(lm_loss(out, target))
    else:
        torch.autograd.backward(out, torch.ones_like(out))
    synchronize(device)
    return out.detach(), time.perf_counter() - start


def throughput_runs(setup: Setup) -> list[list[Run]]:
    """The spawned groups of part 2: torch's runs in groups of their own, so that one that crashes its
    processes (CUDA tensors over gloo) leaves the others' figures."""
    hintpipe_runs = [
        Run(f"hintpipe {policy}, {'variable' if variable else 'fixed'} lengths", "hintpipe", policy, variable)
        for variable in (False, True)
        for policy in POLICIES
    ]
    groups = [hintpipe_runs, [Run("torch Schedule1F1B, fixed lengths", "torch")]]
    if setup.device == "cuda":
        groups.append([Run("torch Schedule1F1B, host-staged boundaries, fixed lengths", "torch-host")])
    return groups


def part_throughput(setup: Setup) -> Section:
    """Part 2: hintpipe ``fixed`` and ``ready`` against torch's ``Schedule1F1B``, 2 ranks on the one device."""
    sizes = setup.sizes
    device = configure(setup.device)
    model = sizes.tput_model
    section = Section(
        "2. Throughput: hintpipe against torch's Schedule1F1B", ["run", "step ms", "tokens/s", "vs reference"]
    )
    measured: dict[str, tuple[float, float] | str] = {}
    for runs in throughput_runs(setup):
        try:
            per_rank = run_ranks(throughput_rank, 2, setup, runs, timeout_s=GROUP_TIMEOUT_S)
        except Exception as exc:  # a group that fails: its rows say why, the other groups still run
            first_line = (str(exc).splitlines() or [""])[0][:300]
            for run in runs:
                measured[run.label] = f"could not run: {type(exc).__name__}: {first_line}"
            section.data[f"error: {runs[0].runtime}"] = f"{type(exc).__name__}: {exc}"
            section.failed |= runs[0].runtime == "hintpipe"  # torch's failing on CUDA over gloo is a finding
            continue
        for i, run in enumerate(runs):
            measured[run.label] = tokens_per_second([r[i] for r in per_rank])
            section.data.setdefault("per_rank_steps", {})[run.label] = [r[i] for r in per_rank]
    compute = stage_compute(setup, device)
    step_tokens = sizes.microbatches * sizes.tput_microbatch_size * sizes.tput_seq_len
    measured["busiest stage's compute alone (no pipeline, no transport)"] = (step_tokens / max(compute), max(compute))
    measured["both stages' compute in one process (no pipeline)"] = (step_tokens / sum(compute), sum(compute))
    reference = next(
        label
        for label, value in measured.items()
        if label.startswith(("torch", "busiest")) and not isinstance(value, str)
    )
    base = measured[reference]
    assert not isinstance(base, str)
    for label, value in measured.items():
        if isinstance(value, str):
            section.rows.append([label, "-", "-", value])
            continue
        rate, step_s = value
        section.rows.append([label, f"{step_s * 1e3:.1f}", f"{rate:,.0f}", f"{rate / base[0]:.2f}x"])
    section.data |= {
        k: v if isinstance(v, str) else {"tokens_per_s": v[0], "step_s": v[1]} for k, v in measured.items()
    }
    section.data["reference"] = reference
    section.notes += [
        f"gpt-mini {model.layers} blocks, hidden {model.hidden}, 2 stages on 2 ranks, both on {setup.device}; "
        f"{sizes.microbatches} micro-batches of {sizes.tput_microbatch_size} x {sizes.tput_seq_len} tokens "
        f"(variable: lognormal lengths of the same mean, sigma 0.5), {sizes.steps} steps with AdamW, the first "
        "left out; a step lasts from a barrier to the slowest rank's device work done. hintpipe: hint 1f1b, "
        f"memory slack {SLACK:g}, transport gloo.",
        f"Reference (the `vs` column): {reference}. torch's runs use fixed lengths only (its schedule fixes shapes).",
        "The compute rows: each stage's forward + backward over one step's micro-batches, in the parent process: "
        "the busiest stage alone bounds a pipeline whose ranks each have a device of their own (cores on CPU); "
        "both stages in sequence bounds ranks that time-share one GPU.",
    ]
    if setup.device == "cuda":
        section.notes.append(
            "The host-staged torch run wraps each stage so that torch's stage (device cpu) sends host tensors over "
            "gloo while the module computes on the GPU: the staging hintpipe's gloo transport does itself."
        )
    return section


# -- parts 3 and 4: planned stages measured one micro-batch at a time --------------------------------------


@dataclasses.dataclass(frozen=True)
class StageMeasure:
    """One planned stage's micro-batch: bytes held after its forward (activations kept for backward, its
    received inputs and its outputs, as the planner counts them), on CUDA the forward's peak above where it
    started and the pinned host bytes it left held, and the median seconds of forward + backward."""

    held: float
    peak: float | None
    pinned: float | None
    seconds: float


def planning_inputs(setup: Setup, device: torch.device) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model to plan (on the device) and one fixed-length micro-batch with its targets."""
    sizes = setup.sizes
    model = nn.Sequential(*build_layers(sizes.plan_model)).to(device)
    inputs, targets, _ = make_batch(sizes.plan_model, 1, sizes.plan_microbatch_size, SeqLenDist(sizes.plan_seq_len), 0)
    return model, inputs[0].to(device), targets[0].to(device)


def run_forward(module: nn.Module, inputs: list[torch.Tensor], target: torch.Tensor, last: bool) -> list[torch.Tensor]:
    """The stage's outputs for one micro-batch (the loss at the last stage)."""
    out = module(*inputs)
    outputs = list(out) if isinstance(out, tuple) else [out]
    return [lm_loss(outputs[0], target)] if last else outputs


def run_backward(outputs: list[torch.Tensor]) -> None:
    """Backward from the outputs that carry gradients (gradients of ones: the bytes, not the values, matter)."""
    roots = [o for o in outputs if o.requires_grad]
    torch.autograd.backward(roots, [torch.ones_like(o) for o in roots])


def pinned_bytes() -> float:
    """Pinned host bytes handed out by CUDA's host allocator (where offloaded activations go)."""
    try:
        return float(torch.cuda.host_memory_stats().get("active_bytes.current", 0))
    except (AttributeError, RuntimeError):  # a torch without host allocator statistics
        return float("nan")


def held_on_cuda(
    module: nn.Module, inputs: list[torch.Tensor], target: torch.Tensor, first: bool, last: bool, device: torch.device
) -> tuple[StageMeasure, list[torch.Tensor]]:
    """The allocator's figures for one forward: what it leaves allocated and its peak, above where it started,
    plus the received inputs (allocated before it; stage 0's token ids are the caller's, not counted)."""
    boundary = 0.0 if first else float(nbytes(inputs))
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    host = pinned_bytes()
    outputs = run_forward(module, inputs, target, last)
    synchronize(device)
    held = torch.cuda.memory_allocated(device) - base + boundary
    peak = torch.cuda.max_memory_allocated(device) - base + boundary
    return StageMeasure(held, peak, pinned_bytes() - host, 0.0), outputs


def held_on_cpu(
    module: nn.Module, inputs: list[torch.Tensor], target: torch.Tensor, first: bool, last: bool
) -> tuple[StageMeasure, list[torch.Tensor]]:
    """Saved-tensor accounting for one forward, as the runtime's executor counts it: what autograd saves, the
    received inputs and the outputs, each storage once, parameters (and stage 0's inputs) left out. Tensors
    saved inside an offloaded region are packed by the offload hooks, not seen here."""
    exclude = parameter_storages(module)
    if first:
        exclude |= {t.untyped_storage().data_ptr() for t in inputs}
    with count_saved(exclude) as counter:
        outputs = run_forward(module, inputs, target, last)
    for t in [*inputs, *outputs]:
        counter.add(t)
    return StageMeasure(float(counter.total), None, None, 0.0), outputs


def stage_inputs(values: list[torch.Tensor], first: bool) -> list[torch.Tensor]:
    """A stage's inputs: stage 0 takes the token ids as they are, later stages fresh leaves (as received)."""
    return values if first else [as_input(v) for v in values]


def median_step_seconds(
    module: nn.Module,
    values: list[torch.Tensor],
    target: torch.Tensor,
    first: bool,
    last: bool,
    device: torch.device,
    repeats: int,
) -> float:
    """Median forward + backward seconds of one micro-batch through the stage."""
    times = []
    for _ in range(repeats):
        inputs = stage_inputs(values, first)
        synchronize(device)
        start = time.perf_counter()
        run_backward(run_forward(module, inputs, target, last))
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_plan(
    planned: Plan, x: torch.Tensor, y: torch.Tensor, device: torch.device, repeats: int
) -> list[StageMeasure]:
    """Each planned stage (with its recompute and offload choices) on one micro-batch, in order, each fed the
    one before's outputs; a warm-up pass first, so that the allocator's pools and cuBLAS's workspace exist
    before anything is measured."""
    values: list[torch.Tensor] = [x]
    out = []
    for index in range(planned.num_stages):
        module = planned.build_stage(index).to(device)
        first, last = index == 0, index == planned.num_stages - 1
        run_backward(run_forward(module, stage_inputs(values, first), y, last))
        inputs = stage_inputs(values, first)
        if device.type == "cuda":
            measure, outputs = held_on_cuda(module, inputs, y, first, last, device)
        else:
            measure, outputs = held_on_cpu(module, inputs, y, first, last)
        run_backward(outputs)
        seconds = median_step_seconds(module, values, y, first, last, device, repeats)
        out.append(dataclasses.replace(measure, seconds=seconds))
        values = [o.detach() for o in outputs]
    return out


def ratio_cell(measured: float | None, predicted: float) -> str:
    return "-" if measured is None else f"{measured / max(predicted, 1.0):.3f}"


def part_planner_memory(setup: Setup) -> Section:
    """Part 3: the plan's predicted activation bytes per micro-batch against measured, per stage."""
    sizes = setup.sizes
    device = configure(setup.device)
    model, x, y = planning_inputs(setup, device)
    planned = plan(model, x, ranks=4, microbatches=sizes.microbatches, repeats=3)
    measures = measure_plan(planned, x, y, device, sizes.time_repeats)
    cuda = device.type == "cuda"
    headers = ["stage", "nodes", "predicted MiB / mb", "held MiB", "held / predicted"]
    headers += ["forward peak MiB", "peak / predicted"] if cuda else []
    section = Section("3. Planner memory: predicted against measured", [*headers, f"held within {MEMORY_GOAL:.0%}"])
    for index, (stage, m) in enumerate(zip(planned.partition.stages, measures, strict=True)):
        predicted = stage.activation_bytes
        row = [str(index), str(stage.nodes), mib(predicted), mib(m.held), ratio_cell(m.held, predicted)]
        if cuda:
            row += [mib(m.peak or 0.0), ratio_cell(m.peak, predicted)]
        row.append("yes" if abs(m.held / max(predicted, 1.0) - 1) <= MEMORY_GOAL else "**no**")
        section.rows.append(row)
        section.data[str(index)] = {"predicted": predicted, **dataclasses.asdict(m)}
    model_config = sizes.plan_model
    section.notes += [
        f"gpt-mini {model_config.layers} blocks, hidden {model_config.hidden}, one micro-batch of "
        f"{sizes.plan_microbatch_size} x {sizes.plan_seq_len} tokens; planned into 4 stages (1f1b, "
        f"{sizes.microbatches} micro-batches), no budget; each stage run once (after a warm-up pass), fed the "
        "previous stage's outputs.",
        (
            "Measured: `torch.cuda.memory_allocated` after the forward minus before it, plus the received inputs "
            "(`held`, what the planner predicts, and what the goal is judged on); `forward peak`: "
            "`torch.cuda.max_memory_allocated` during the forward minus before it, plus the received inputs "
            "(above `held` by the forward's transient buffers)."
            if cuda
            else "Measured on CPU: saved-tensor accounting (`hintpipe.tensor_bytes.count_saved`, as the runtime's "
            "executor counts it: what autograd saves, the received inputs and the outputs, each storage once), "
            "not an allocator's figure."
        ),
    ]
    return section


def offload_plans(model: nn.Module, x: torch.Tensor, microbatches: int) -> tuple[Plan, Plan, dict[str, float]]:
    """The plan without a budget, and the first plan under a tighter budget (fractions of the unconstrained
    plan's busiest stage) that offloads: at the real host bandwidth, else at a generous one (where the device
    recomputes cheaper than the host link moves bytes, the planner rightly recomputes instead)."""
    free = plan(model, x, ranks=4, microbatches=microbatches, repeats=3, host_bandwidth=HOST_BANDWIDTH)
    need = max(s.memory_bytes for s in free.partition.stages)
    for bandwidth in (HOST_BANDWIDTH, GENEROUS_HOST_BANDWIDTH):
        for fraction in BUDGET_FRACTIONS:
            try:
                tight = plan(
                    model,
                    x,
                    ranks=4,
                    microbatches=microbatches,
                    stage_memory=fraction * need,
                    host_bandwidth=bandwidth,
                    profiles=free.profiles,
                )
            except PlanError:
                continue
            if any(s.offload for s in tight.partition.stages):
                return free, tight, {"budget": fraction * need, "fraction": fraction, "host_bandwidth": bandwidth}
    raise RuntimeError(f"no budget of {BUDGET_FRACTIONS} x {need / MiB:.1f} MiB made the plan offload")


def offload_row(index: int, label: str, stage: Any, m: StageMeasure, cuda: bool) -> list[str]:
    row = [
        str(index),
        label,
        f"{len(stage.offload)} / {len(stage.recompute)}",
        mib(stage.activation_bytes),
        mib(m.held),
    ]
    if cuda:
        row += [mib(m.peak or 0.0), mib(m.pinned or 0.0)]
    return [*row, f"{m.seconds * 1e3:.2f}"]


def part_offload(setup: Setup) -> Section:
    """Part 4: a plan that offloads under a budget against the plan without one, stage by stage."""
    sizes = setup.sizes
    device = configure(setup.device)
    cuda = device.type == "cuda"
    model, x, y = planning_inputs(setup, device)
    free, tight, chosen = offload_plans(model, x, sizes.microbatches)
    measured = {
        "no budget": measure_plan(free, x, y, device, sizes.time_repeats),
        "budget": measure_plan(tight, x, y, device, sizes.time_repeats),
    }
    headers = ["stage", "plan", "offloaded / recomputed nodes", "predicted MiB / mb", "held MiB"]
    headers += ["forward peak MiB", "pinned host MiB"] if cuda else []
    section = Section("4. Offload on and off", [*headers, "F+B ms"], left=2)
    budget_label = f"budget {chosen['budget'] / MiB:.1f} MiB"
    for index in range(4):
        for label, planned in (("no budget", free), (budget_label, tight)):
            m = measured["no budget" if planned is free else "budget"][index]
            section.rows.append(offload_row(index, label, planned.partition.stages[index], m, cuda))
    held = {k: sum(m.held for m in v) for k, v in measured.items()}
    seconds = {k: sum(m.seconds for m in v) for k, v in measured.items()}
    section.data = {
        "chosen": chosen,
        "cuts": {"no budget": list(free.partition.cuts), "budget": list(tight.partition.cuts)},
        "measured": {k: [dataclasses.asdict(m) for m in v] for k, v in measured.items()},
        "held_bytes_total": held,
        "seconds_total": seconds,
    }
    section.notes += [
        f"Same model and micro-batch as part 3. Budget: {chosen['fraction']:g} x the unconstrained plan's busiest "
        f"stage ({budget_label} per stage), host bandwidth told to the planner {chosen['host_bandwidth']:.3g} B/s"
        + (" (generous: at the real one it recomputed instead)" if chosen["host_bandwidth"] != HOST_BANDWIDTH else "")
        + f". Cuts without budget {list(free.partition.cuts)}, with {list(tight.partition.cuts)}.",
        f"All stages: held {mib(held['budget'])} MiB with the budget against {mib(held['no budget'])} MiB without "
        f"({held['budget'] / max(held['no budget'], 1.0):.2f}x); forward + backward "
        f"{seconds['budget'] / max(seconds['no budget'], 1e-12):.2f}x the time.",
        (
            "Offloaded saved tensors go to pinned host memory, copied on a side stream "
            "(`hintpipe.planner.stagegen.offload`): `pinned host MiB` is what CUDA's host allocator handed out "
            "during the forward and still held; `held` and `forward peak` as in part 3."
            if cuda
            else "On CPU offload is a no-op (host = device): the offloaded tensors stay in the same memory. `held` is "
            "saved-tensor accounting, which does not see what the offload hooks pack, so it shows what a device "
            "would keep, not a saving of CPU memory; the time shows the hooks' own cost."
        ),
    ]
    return section


# -- the whole check ------------------------------------------------------------------------------------

PARTS: dict[str, Callable[[Setup], Section]] = {
    "1": part_gradients,
    "2": part_throughput,
    "3": part_planner_memory,
    "4": part_offload,
}


def source_version() -> str:
    """The commit measured, and whether the tree had uncommitted changes (read only: ``--no-optional-locks``
    keeps git from refreshing the index, which another process may be using)."""
    package = Path(hintpipe.__file__).resolve().parent
    git = ["git", "--no-optional-locks", "-C", str(package)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return f"imported from {package} (not a git checkout)"
    return commit.stdout.strip() + (" with uncommitted changes" if status.stdout.strip() else "")


def environment(device: str) -> dict[str, Any]:
    """What the figures depend on."""
    cuda = device == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else "CPU",
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": f"{platform.node()}, {platform.system()} {platform.release()}",
        "cpus": len(os.sched_getaffinity(0)),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hintpipe": source_version(),
    }


def header(env: dict[str, Any], argv: Sequence[str]) -> str:
    lines = [
        "# hintpipe GPU check",
        "",
        f"- device: **{env['device']}**" + (f" (CUDA {env['cuda']})" if env["cuda"] else ""),
        f"- torch {env['torch']}, Python {env['python']}, {env['cpus']} CPUs ({env['host']})",
        f"- hintpipe {env['hintpipe']}",
        f"- {env['date']}; `{' '.join(['gpu_check.py', *argv])}`",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for results.md and results.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--parts", default="1234", help="which parts to run (default all: 1234)")
    args = parser.parse_args(argv)
    if set(args.parts) - set(PARTS):
        parser.error(f"--parts takes digits from {''.join(PARTS)}, got {args.parts!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: --device cuda, but torch.cuda.is_available() is False here; use --device cpu", file=sys.stderr
        )
        return 2
    configure(args.device)
    setup = Setup(args.device, sizes_for(args.device, args.quick))
    env = environment(args.device)
    shown = sys.argv[1:] if argv is None else list(argv)
    print(header(env, shown), flush=True)
    sections = [run_part(name, PARTS[name], setup) for name in sorted(set(args.parts))]
    args.out.mkdir(parents=True, exist_ok=True)
    markdown = header(env, shown) + "\n" + "\n".join(s.markdown() for s in sections)
    (args.out / "results.md").write_text(markdown)
    payload = {"environment": env, "quick": args.quick, "sections": [dataclasses.asdict(s) for s in sections]}
    (args.out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 1 if any(s.failed for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
