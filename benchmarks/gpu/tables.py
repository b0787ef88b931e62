"""The GPU check's tables (:mod:`gpu_check` runs them last): throughput against torch's ``Schedule1F1B``, and
the planner's memory figures against the allocator's, with offload on and off.

Run through ``gpu_check.py``; the figures are the device's, not a check of correctness (a table fails only
when a hintpipe run or a plan could not be made).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

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
#: Host link bandwidth the planner is told for offload (bytes/s), and a generous one to fall back to when the
#: planner prefers recomputing at the real one (a fast GPU recomputes a small model's layers cheaply).
HOST_BANDWIDTH = 25e9
GENEROUS_HOST_BANDWIDTH = 1e12
#: Budgets that make a plan offload, as fractions of the unconstrained plan's busiest stage, tried in turn.
BUDGET_FRACTIONS = (0.85, 0.7, 0.55)
POLICIES = ("fixed", "ready")


@dataclasses.dataclass(frozen=True)
class Table:
    """A table's cells, its notes, its figures for the JSON file, and whether something in it failed."""

    headers: list[str]
    rows: list[list[str]]
    notes: list[str]
    data: dict[str, Any]
    failed: bool = False
    left: int = 1  # leading text columns


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


def mib(value: float) -> str:
    return f"{value / MiB:.2f}"


# -- throughput against torch's Schedule1F1B ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Throughput:
    """The throughput table's sizes."""

    device: str
    model: ModelConfig
    microbatches: int
    microbatch_size: int
    seq_len: int
    steps: int


StepFn = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


@dataclasses.dataclass(frozen=True)
class Run:
    """One throughput run: who schedules (``hintpipe``; ``torch`` with the stage's tensors on the device;
    ``torch-host``: torch's stage on the host, its module run on the device), which policy, what lengths."""

    label: str
    runtime: str
    policy: str = "fixed"
    variable: bool = False


def throughput_batch(
    sizes: Throughput, step: int, variable: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The step's micro-batches (the same for every run): fixed length, or lognormal lengths of the same mean."""
    seq = SeqLenDist(sizes.seq_len, 0.5) if variable else SeqLenDist(sizes.seq_len)
    inputs, targets, tokens = make_batch(sizes.model, sizes.microbatches, sizes.microbatch_size, seq, step)
    return inputs, targets, sum(tokens)


class HostStaged(nn.Module):
    """A stage whose boundary tensors live on the host: torch's stage then sends CPU tensors over gloo (which
    moves no CUDA tensors between processes), while the module computes on the device, as hintpipe's gloo
    transport stages a GPU's tensors through host memory. The last stage's output stays on the device."""

    def __init__(self, inner: nn.Module, device: torch.device, last: bool) -> None:
        super().__init__()
        self.inner = inner.to(device)
        self.device = device
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x.to(self.device))
        return out if self.last else out.to("cpu")


def hintpipe_stepper(rank: int, world: int, sizes: Throughput, module: nn.Module, run: Run) -> tuple[StepFn, Pipeline]:
    """A hintpipe pipeline over this rank's stage on the shared device (gloo transport)."""
    pipe = Pipeline(
        {rank: module},
        loss_fn=lm_loss,
        microbatches=sizes.microbatches,
        hint="1f1b",
        policy=run.policy,
        memory_slack=SLACK,
        device=sizes.device,
        transport="gloo",
        timeout=TIMEOUT_S,
    )
    first, last = rank == 0, rank == world - 1

    def step(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        pipe.step(inputs if first else None, targets if last else None)

    return step, pipe


def torch_stepper(
    rank: int, world: int, sizes: Throughput, modules: list[nn.Module], run: Run, device: torch.device
) -> tuple[StepFn, nn.Module]:
    """torch's ``Schedule1F1B`` over this rank's stage; returns the step and the module that trains."""
    first, last = rank == 0, rank == world - 1
    stages: list[nn.Module]
    if run.runtime == "torch-host":
        stages = [HostStaged(m, device, i == world - 1) for i, m in enumerate(modules)]
        where = torch.device("cpu")
    else:
        stages = [m.to(device) for m in modules]
        where = device
    example_in = throughput_batch(sizes, 0, False)[0][0].to(where)
    for stage_module in stages[:rank]:
        example_in = stage_module(example_in)
    example_out = stages[rank](example_in)
    stage = PipelineStage(stages[rank], rank, world, where, input_args=example_in, output_args=example_out)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return lm_loss(out, target.to(out.device))

    schedule = Schedule1F1B(stage, sizes.microbatches, loss_fn=loss_fn)

    def step(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        if first:
            schedule.step(torch.cat(inputs).to(where), return_outputs=False)
        elif last:
            schedule.step(target=torch.cat(targets).to(where), losses=[], return_outputs=False)
        else:
            schedule.step(return_outputs=False)

    return step, stages[rank]


def timed_steps(sizes: Throughput, run: Run, step: StepFn, module: nn.Module, device: torch.device) -> dict[str, Any]:
    """Train ``sizes.steps`` steps (AdamW), timing each from a barrier to the device's work done."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    times: list[float] = []
    tokens: list[int] = []
    for index in range(sizes.steps):
        inputs, targets, count = throughput_batch(sizes, index, run.variable)
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


def throughput_rank(rank: int, world: int, sizes: Throughput, runs: list[Run]) -> list[dict[str, Any]]:
    """One rank: each run in turn, with a fresh copy of the same model."""
    device = configure(sizes.device)
    out = []
    for run in runs:
        modules = split_layers(build_layers(sizes.model), world)
        if run.runtime == "hintpipe":
            step, pipe = hintpipe_stepper(rank, world, sizes, modules[rank], run)
            with pipe:
                out.append(timed_steps(sizes, run, step, modules[rank], device))
        else:
            step, module = torch_stepper(rank, world, sizes, modules, run, device)
            out.append(timed_steps(sizes, run, step, module, device))
    return out


def tokens_per_second(per_rank: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(tokens/s, median step seconds) over the steps after the first; a step lasts as long as its slowest rank."""
    steps = [max(ts) for ts in zip(*(r["times"] for r in per_rank), strict=True)][1:]
    tokens = per_rank[0]["tokens"][1:]
    return sum(tokens) / sum(steps), statistics.median(steps)


def stage_compute(sizes: Throughput, device: torch.device) -> list[float]:
    """Seconds of each stage's forward + backward over one step's fixed-length micro-batches, in this process
    (no pipeline, no transport): the median over the steps after a first that warms up."""
    modules = [m.to(device) for m in split_layers(build_layers(sizes.model), 2)]
    per_step: list[list[float]] = []
    for index in range(sizes.steps):
        inputs, targets, _ = throughput_batch(sizes, index, False)
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
    """One micro-batch through one stage and back; returns the output (detached) and the seconds it took."""
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


def throughput_runs(device: str) -> list[list[Run]]:
    """The spawned groups: torch's runs in groups of their own, so that one that crashes its processes (CUDA
    tensors over gloo) leaves the others' figures."""
    hintpipe_runs = [
        Run(f"hintpipe {policy}, {'variable' if variable else 'fixed'} lengths", "hintpipe", policy, variable)
        for variable in (False, True)
        for policy in POLICIES
    ]
    groups = [hintpipe_runs, [Run("torch Schedule1F1B, fixed lengths", "torch")]]
    if device == "cuda":
        groups.append([Run("torch Schedule1F1B, host-staged boundaries, fixed lengths", "torch-host")])
    return groups


def throughput_table(sizes: Throughput, group_timeout_s: float) -> Table:
    """hintpipe ``fixed`` and ``ready`` against torch's ``Schedule1F1B``, 2 ranks on the one device."""
    device = configure(sizes.device)
    measured: dict[str, tuple[float, float] | str] = {}
    data: dict[str, Any] = {}
    failed = False
    for runs in throughput_runs(sizes.device):
        try:
            per_rank = run_ranks(throughput_rank, 2, sizes, runs, timeout=group_timeout_s, device=sizes.device)
        except Exception as exc:  # a group that fails: its rows say why, the other groups still run
            first_line = (str(exc).splitlines() or [""])[0][:300]
            for run in runs:
                measured[run.label] = f"could not run: {type(exc).__name__}: {first_line}"
            data[f"error: {runs[0].runtime}"] = f"{type(exc).__name__}: {exc}"
            failed |= runs[0].runtime == "hintpipe"  # torch's failing on CUDA over gloo is a finding
            continue
        for i, run in enumerate(runs):
            measured[run.label] = tokens_per_second([r[i] for r in per_rank])
            data.setdefault("per_rank_steps", {})[run.label] = [r[i] for r in per_rank]
    compute = stage_compute(sizes, device)
    step_tokens = sizes.microbatches * sizes.microbatch_size * sizes.seq_len
    measured["busiest stage's compute alone (no pipeline, no transport)"] = (step_tokens / max(compute), max(compute))
    measured["both stages' compute in one process (no pipeline)"] = (step_tokens / sum(compute), sum(compute))
    usable = [label for label, value in measured.items() if not isinstance(value, str)]
    reference = next(label for label in usable if label.startswith(("torch", "busiest")))
    base = measured[reference]
    assert not isinstance(base, str)
    rows = []
    for label, value in measured.items():
        if isinstance(value, str):
            rows.append([label, "-", "-", value])
            continue
        rate, step_s = value
        rows.append([label, f"{step_s * 1e3:.1f}", f"{rate:,.0f}", f"{rate / base[0]:.2f}x"])
    data |= {k: v if isinstance(v, str) else {"tokens_per_s": v[0], "step_s": v[1]} for k, v in measured.items()}
    data["reference"] = reference
    model = sizes.model
    notes = [
        f"gpt-mini {model.layers} blocks, hidden {model.hidden}, 2 stages on 2 ranks, both on {sizes.device}; "
        f"{sizes.microbatches} micro-batches of {sizes.microbatch_size} x {sizes.seq_len} tokens (variable: "
        f"lognormal lengths of the same mean, sigma 0.5), {sizes.steps} steps with AdamW, the first left out; a "
        f"step lasts from a barrier to the slowest rank's device work done. hintpipe: hint 1f1b, memory slack "
        f"{SLACK:g}, transport gloo.",
        f"Reference (the `vs` column): {reference}. torch's runs use fixed lengths only (its schedule fixes shapes).",
        "The compute rows: each stage's forward + backward over one step's micro-batches, in this process: the "
        "busiest stage alone bounds ranks with a device each; both stages in sequence bounds ranks that "
        "time-share one GPU.",
    ]
    if sizes.device == "cuda":
        notes.append(
            "The host-staged torch run wraps each stage so that torch's stage (device cpu) sends host tensors over "
            "gloo while the module computes on the GPU: the staging hintpipe's gloo transport does itself."
        )
    return Table(["run", "step ms", "tokens/s", "vs reference"], rows, notes, data, failed)


# -- planner memory against the allocator, offload on and off --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageMeasure:
    """One planned stage's micro-batch: bytes held after its forward (activations kept for backward, its
    received inputs and its outputs, as the planner counts them), on CUDA the forward's peak above where it
    started and the pinned host bytes it left held, and the median seconds of forward + backward."""

    held: float
    peak: float | None
    pinned: float | None
    seconds: float


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
    """Saved-tensor accounting for one forward, as the runtime's executor counts it (each storage once,
    parameters and stage 0's inputs left out). Tensors saved inside an offloaded region are packed by the
    offload hooks, not seen here."""
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


def measure_plan(
    planned: Plan, x: torch.Tensor, y: torch.Tensor, device: torch.device, repeats: int
) -> list[StageMeasure]:
    """Each planned stage (with its recompute and offload choices) on one micro-batch, in order, each fed the
    one before's outputs; a warm-up pass first (the allocator's pools and cuBLAS's workspace exist before
    anything is measured)."""
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
        times = []
        for _ in range(repeats):
            again = stage_inputs(values, first)
            synchronize(device)
            start = time.perf_counter()
            run_backward(run_forward(module, again, y, last))
            synchronize(device)
            times.append(time.perf_counter() - start)
        out.append(dataclasses.replace(measure, seconds=statistics.median(times)))
        values = [o.detach() for o in outputs]
    return out


def offload_plans(
    model: nn.Module, x: torch.Tensor, ranks: int, microbatches: int
) -> tuple[Plan, Plan, dict[str, float]]:
    """The plan without a budget, and the first plan under a tighter budget (fractions of the unconstrained
    plan's busiest stage) that offloads: at the real host bandwidth, else at a generous one (where the device
    recomputes cheaper than the host link moves bytes, the planner rightly recomputes instead)."""
    free = plan(model, x, ranks=ranks, microbatches=microbatches, repeats=3, host_bandwidth=HOST_BANDWIDTH)
    need = max(s.memory_bytes for s in free.partition.stages)
    for bandwidth in (HOST_BANDWIDTH, GENEROUS_HOST_BANDWIDTH):
        for fraction in BUDGET_FRACTIONS:
            try:
                tight = plan(
                    model,
                    x,
                    ranks=ranks,
                    microbatches=microbatches,
                    stage_memory=fraction * need,
                    host_bandwidth=bandwidth,
                    profiles=free.profiles,
                )
            except PlanError:
                continue
            if any(s.offload for s in tight.partition.stages):
                return free, tight, {"budget": fraction * need, "fraction": fraction, "host_bandwidth": bandwidth}
    return free, every_node_offloaded(free), {"budget": math.inf, "fraction": math.inf, "host_bandwidth": math.nan}


def every_node_offloaded(planned: Plan) -> Plan:
    """``planned`` with every node of every stage offloaded: what runs where no budget made the planner choose
    offload (its choice depends on the times it measured)."""
    stages = []
    for stage, (a, b) in zip(planned.partition.stages, itertools.pairwise(planned.partition.cuts), strict=True):
        stages.append(dataclasses.replace(stage, offload=tuple(n.name for n in planned.graph.nodes[a:b])))
    return dataclasses.replace(planned, partition=dataclasses.replace(planned.partition, stages=tuple(stages)))


def offload_words(chosen: dict[str, float]) -> str:
    """How the offloading plan came about, in words."""
    if math.isinf(chosen["budget"]):
        return (
            f"no budget of {BUDGET_FRACTIONS} x the unconstrained plan's busiest stage made the planner offload at "
            "these sizes (its choice follows the times it measured): every node offloaded"
        )
    generous = " (generous: at the real one it recomputed)" if chosen["host_bandwidth"] != HOST_BANDWIDTH else ""
    return (
        f"budget {chosen['fraction']:g} x the unconstrained plan's busiest stage ({chosen['budget'] / MiB:.1f} MiB "
        f"per stage), host bandwidth told to the planner {chosen['host_bandwidth']:.3g} B/s{generous}"
    )


def memory_table(model: nn.Module, x: torch.Tensor, y: torch.Tensor, microbatches: int, repeats: int) -> Table:
    """Per stage of a 4-stage plan, without a budget and under one that offloads: the planner's activation
    bytes per micro-batch against what the forward held (the allocator's figure on CUDA)."""
    device = x.device
    cuda = device.type == "cuda"
    free, tight, chosen = offload_plans(model, x, 4, microbatches)
    measured = {
        key: measure_plan(planned, x, y, device, repeats) for key, planned in (("no budget", free), ("budget", tight))
    }
    headers = ["stage", "plan", "offloaded / recomputed nodes", "predicted MiB / mb", "held MiB", "held / predicted"]
    headers += ["forward peak MiB", "pinned host MiB"] if cuda else []
    rows = []
    budget_label = (
        "every node offloaded" if math.isinf(chosen["budget"]) else f"budget {chosen['budget'] / MiB:.1f} MiB"
    )
    for index in range(4):
        for key, label, planned in (("no budget", "no budget", free), ("budget", budget_label, tight)):
            stage, m = planned.partition.stages[index], measured[key][index]
            row = [
                str(index),
                label,
                f"{len(stage.offload)} / {len(stage.recompute)}",
                mib(stage.activation_bytes),
                mib(m.held),
                f"{m.held / max(stage.activation_bytes, 1.0):.3f}",
            ]
            if cuda:
                row += [mib(m.peak or 0.0), mib(m.pinned or 0.0)]
            rows.append([*row, f"{m.seconds * 1e3:.2f}"])
    notes = [
        f"The offloading plan: {offload_words(chosen)}. Cuts without budget {list(free.partition.cuts)}, with "
        f"{list(tight.partition.cuts)}. Each stage runs one micro-batch after a warm-up pass, fed the previous "
        "stage's outputs.",
        (
            "Measured: `torch.cuda.memory_allocated` after the forward minus before it, plus the received inputs "
            "(`held`, what the planner predicts); `forward peak`: `max_memory_allocated` during the forward; "
            "`pinned host MiB`: what CUDA's host allocator handed out during the forward and still held (the "
            "offloaded activations)."
            if cuda
            else "Measured on CPU: saved-tensor accounting (as the runtime's executor counts), not an allocator's "
            "figure; offload is a no-op on CPU (host = device) and the accounting does not see what the hooks pack."
        ),
    ]
    data = {
        "chosen": chosen,
        "cuts": {"no budget": list(free.partition.cuts), "budget": list(tight.partition.cuts)},
        "predicted": {
            "no budget": [s.activation_bytes for s in free.partition.stages],
            "budget": [s.activation_bytes for s in tight.partition.stages],
        },
        "measured": {k: [dataclasses.asdict(m) for m in v] for k, v in measured.items()},
    }
    return Table([*headers, "F+B ms"], rows, notes, data, left=2)
