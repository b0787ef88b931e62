"""The GPU check's memory table (check 7): the planner's activation bytes against what each planned stage's
forward held (the allocator's figure on CUDA), offload on and off; and the plan that offloads (check 5)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time

import torch
from tables import BUDGET_FRACTIONS, GENEROUS_HOST_BANDWIDTH, HOST_BANDWIDTH, MiB, Table, mib, synchronize
from torch import nn

from hintpipe.apps.models import lm_loss
from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.search import PlanError
from hintpipe.runtime.loop.executor import as_input
from hintpipe.runtime.transport.wire import Value, tensors_of
from hintpipe.tensor_bytes import count_saved, nbytes, parameter_storages


@dataclasses.dataclass(frozen=True)
class StageMeasure:
    """One planned stage's micro-batch: bytes held after its forward (activations kept for backward, its
    received inputs and its outputs, as the planner counts them), on CUDA the forward's peak above where it
    started and the pinned host bytes it left held, and the median seconds of forward + backward."""

    held: float
    peak: float | None
    pinned: float | None
    seconds: float


def run_forward(module: nn.Module, inputs: list[Value], target: torch.Tensor, last: bool) -> list[Value]:
    """The stage's outputs for one micro-batch (the loss at the last stage): tensors, and numbers it sends on."""
    out = module(*inputs)
    outputs = list(out) if isinstance(out, tuple) else [out]
    return [lm_loss(outputs[0], target)] if last else outputs


def run_backward(outputs: list[Value]) -> None:
    """Backward from the outputs that carry gradients (gradients of ones: the bytes, not the values, matter)."""
    roots = [o for o in tensors_of(outputs) if o.requires_grad]
    torch.autograd.backward(roots, [torch.ones_like(o) for o in roots])


def pinned_bytes() -> float:
    """Pinned host bytes handed out by CUDA's host allocator (where offloaded activations go)."""
    try:
        return float(torch.cuda.host_memory_stats().get("active_bytes.current", 0))
    except (AttributeError, RuntimeError):  # a torch without host allocator statistics
        return float("nan")


def held_on_cuda(
    module: nn.Module, inputs: list[Value], target: torch.Tensor, first: bool, last: bool, device: torch.device
) -> tuple[StageMeasure, list[Value]]:
    """The allocator's figures for one forward: what it leaves allocated and its peak, above where it started,
    plus the received inputs (allocated before it; stage 0's token ids are the caller's, not counted)."""
    boundary = 0.0 if first else float(nbytes(tensors_of(inputs)))
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
    module: nn.Module, inputs: list[Value], target: torch.Tensor, first: bool, last: bool
) -> tuple[StageMeasure, list[Value]]:
    """Saved-tensor accounting for one forward, as the runtime's executor counts it (each storage once,
    parameters and stage 0's inputs left out). Tensors saved inside an offloaded region are packed by the
    offload hooks, not seen here."""
    exclude = parameter_storages(module)
    if first:
        exclude |= {t.untyped_storage().data_ptr() for t in tensors_of(inputs)}
    with count_saved(exclude) as counter:
        outputs = run_forward(module, inputs, target, last)
    for t in tensors_of([*inputs, *outputs]):
        counter.add(t)
    return StageMeasure(float(counter.total), None, None, 0.0), outputs


def stage_inputs(values: list[Value], first: bool) -> list[Value]:
    """A stage's inputs: stage 0 takes the token ids as they are, later stages fresh leaves (as received)."""
    return values if first else [as_input(v) for v in values]


def measure_plan(
    planned: Plan, x: torch.Tensor, y: torch.Tensor, device: torch.device, repeats: int
) -> list[StageMeasure]:
    """Each planned stage (with its recompute and offload choices) on one micro-batch, in order, each fed the
    one before's outputs; a warm-up pass first (the allocator's pools and cuBLAS's workspace exist before
    anything is measured)."""
    values: list[Value] = [x]
    out = []
    for index in range(planned.stages):
        module = planned.build_stage(index).to(device)
        first, last = index == 0, index == planned.stages - 1
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
        values = [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]
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
        "offloaded": {
            "no budget": [len(s.offload) for s in free.partition.stages],
            "budget": [len(s.offload) for s in tight.partition.stages],
        },
        "predicted": {
            "no budget": [s.activation_bytes for s in free.partition.stages],
            "budget": [s.activation_bytes for s in tight.partition.stages],
        },
        "measured": {k: [dataclasses.asdict(m) for m in v] for k, v in measured.items()},
    }
    return Table([*headers, "F+B ms"], rows, notes, data, left=2)
