"""The GPU check's throughput table (check 6): every hint in float32 and bf16, ``fixed`` and ``ready``, 2 ranks
sharing the device, against the bound (both stages' compute in one process) and torch's ``Schedule1F1B``;
:mod:`judge` holds the runs to their bounds."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from tables import POLICIES, SLACK, TIMEOUT_S, HostStaged, Table, configure, synchronize
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.loop.executor import as_input
from hintpipe.runtime.pipeline import Pipeline


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

#: The ranks of every throughput run (sharing the one device).
RANKS = 2
#: The hints the table runs, each with its chunks (stages per rank). One chunk is torch's rows' 2-stage split.
#: interleaved-1f1b with one chunk is 1f1b itself and zbv runs exactly two (its V), so both run the model split
#: into 2 x RANKS stages; bfw runs either way, and the issue's slow run had one chunk, so both.
HINT_CHUNKS: tuple[tuple[str, int], ...] = (
    ("1f1b", 1),
    ("zb-h1", 1),
    ("gpipe", 1),
    ("bfw", 1),
    ("bfw", 2),
    ("interleaved-1f1b", 2),
    ("zbv", 2),
)
PRECISIONS = ("fp32", "bf16")
#: The spawned groups of hintpipe runs, by hint: few, so that the processes' start (seconds on a GPU) stays a
#: small part of the check; several, so that a run that fails its group loses few rows.
HINT_GROUPS: tuple[tuple[str, ...], ...] = (("1f1b", "zb-h1", "gpipe"), ("bfw", "interleaved-1f1b", "zbv"))
#: What each runtime's rows are called (``bound`` and ``busiest`` are no pipeline: the stages' compute here).
RUNTIME_NAMES = {
    "hintpipe": "hintpipe",
    "torch": "torch Schedule1F1B",
    "torch-host": "torch Schedule1F1B, host-staged boundaries",
    "bound": "bound: both stages' compute in one process",
    "busiest": "busiest stage's compute alone",
}
#: Where the project's issue wants every hintpipe run on fixed lengths: within this of its bound.
OVER_BOUND_GOAL = 0.05


@dataclasses.dataclass(frozen=True)
class Run:
    """One row of the throughput table: who runs (``hintpipe``; ``torch`` with the stage's tensors on the
    device; ``torch-host``: torch's stage on the host, its module run on the device; ``bound`` and ``busiest``:
    the stages' compute in this process, no pipeline), which hint on how many stages, in which precision, under
    which policy, on what lengths."""

    runtime: str
    hint: str = "1f1b"
    chunks: int = 1
    precision: str = "fp32"
    policy: str = "fixed"
    variable: bool = False

    @property
    def stages(self) -> int:
        return RANKS * self.chunks

    @property
    def pipelined(self) -> bool:
        """Whether ranks ran it (a spawned group), rather than this process alone."""
        return self.runtime not in ("bound", "busiest")

    @property
    def cells(self) -> list[str]:
        """The row's leading cells: what ran."""
        hint = self.hint if self.pipelined else "-"
        policy = self.policy if self.runtime == "hintpipe" else "-"
        lengths = "variable" if self.variable else "fixed"
        return [RUNTIME_NAMES[self.runtime], hint, str(self.stages), self.precision, policy, lengths]

    @property
    def label(self) -> str:
        """The row's key in the JSON file: its leading cells."""
        return " | ".join(self.cells)

    @property
    def bound(self) -> Run:
        """The bound this run is measured against: both stages' compute in its precision, on its lengths."""
        return Run("bound", "-", 1, self.precision, "-", self.variable)


@dataclasses.dataclass(frozen=True)
class Measured:
    """A row's figures over the steps after the first: tokens per second and the median step; for hintpipe,
    the busiest rank's median CPU seconds in the runtime per step (``StepReport.runtime_cpu``: messages,
    staging, notices, scheduling) and that rank's tasks per step."""

    tokens_per_s: float
    step_s: float
    runtime_cpu_s: float = math.nan
    tasks: int = 0


@dataclasses.dataclass(frozen=True)
class Stepper:
    """What a rank runs each step, the parameters its optimizer steps, and for hintpipe how to read the
    runtime's CPU seconds in the step just run (this rank's) and the rank's tasks per step."""

    step: StepFn
    parameters: list[nn.Parameter]
    runtime_cpu: Callable[[], float] | None = None
    tasks: int = 0


def throughput_batch(
    sizes: Throughput, step: int, variable: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The step's micro-batches (the same for every run): fixed length, or lognormal lengths of the same mean."""
    seq = SeqLenDist(sizes.seq_len, 0.5) if variable else SeqLenDist(sizes.seq_len)
    inputs, targets, tokens = make_batch(sizes.model, sizes.microbatches, sizes.microbatch_size, seq, step)
    return inputs, targets, sum(tokens)


def hintpipe_stepper(sizes: Throughput, run: Run) -> tuple[Stepper, Pipeline]:
    """A hintpipe pipeline over this rank's stages of the model cut into ``run.stages`` (the hint's placement
    says which: zbv's V gives rank 0 the first and the last), on the shared device, gloo transport."""
    pipe = Pipeline.from_modules(
        split_layers(build_layers(sizes.model), run.stages),
        loss_fn=lm_loss,
        microbatches=sizes.microbatches,
        hint=run.hint,
        chunks=run.chunks,
        policy=run.policy,
        precision=run.precision,
        slack_microbatches=SLACK,
        device=sizes.device,
        transport="gloo",
        timeout=TIMEOUT_S,
    )
    first, last = 0 in pipe.stages, run.stages - 1 in pipe.stages

    def step(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        pipe.step(inputs if first else None, targets if last else None)

    def runtime_cpu() -> float:
        report = pipe.reports[-1]
        return dict(zip(report.ranks, report.runtime_cpu, strict=True)).get(pipe.rank, math.nan)

    parameters = [p for module in pipe.modules.values() for p in module.parameters()]
    return Stepper(step, parameters, runtime_cpu, len(pipe.hint.lists[pipe.rank])), pipe


def torch_stepper(
    rank: int, world: int, sizes: Throughput, modules: list[nn.Module], run: Run, device: torch.device
) -> Stepper:
    """torch's ``Schedule1F1B`` over this rank's stage."""
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

    return Stepper(step, list(stages[rank].parameters()))


def timed_steps(sizes: Throughput, run: Run, stepper: Stepper, device: torch.device) -> dict[str, Any]:
    """Train ``sizes.steps`` steps (AdamW), timing each from a barrier to the device's work done; the runtime's
    CPU seconds of each step are read after its timer stops."""
    optimizer = torch.optim.AdamW(stepper.parameters, lr=1e-3)
    times: list[float] = []
    tokens: list[int] = []
    runtime_cpu: list[float] = []
    for index in range(sizes.steps):
        inputs, targets, count = throughput_batch(sizes, index, run.variable)
        dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        stepper.step(inputs, targets)
        synchronize(device)
        times.append(time.perf_counter() - start)
        tokens.append(count)
        if stepper.runtime_cpu is not None:
            runtime_cpu.append(stepper.runtime_cpu())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"times": times, "tokens": tokens, "runtime_cpu": runtime_cpu, "tasks": stepper.tasks}


def throughput_rank(rank: int, world: int, sizes: Throughput, runs: list[Run]) -> list[dict[str, Any]]:
    """One rank: each run in turn, with a fresh copy of the same model."""
    device = configure(sizes.device)
    out = []
    for run in runs:
        if run.runtime == "hintpipe":
            stepper, pipe = hintpipe_stepper(sizes, run)
            with pipe:
                out.append(timed_steps(sizes, run, stepper, device))
        else:
            modules = split_layers(build_layers(sizes.model), world)
            out.append(timed_steps(sizes, run, torch_stepper(rank, world, sizes, modules, run, device), device))
    return out


def measured_run(per_rank: Sequence[dict[str, Any]]) -> Measured:
    """A run's figures over the steps after the first (a step lasts as long as its slowest rank), and the
    runtime's CPU time of the rank that spent the most of it."""
    steps = [max(ts) for ts in zip(*(r["times"] for r in per_rank), strict=True)][1:]
    tokens = per_rank[0]["tokens"][1:]
    cpu = [(statistics.median(r["runtime_cpu"][1:]), r["tasks"]) for r in per_rank if r["runtime_cpu"][1:]]
    busiest = max(cpu, default=(math.nan, 0))
    return Measured(sum(tokens) / sum(steps), statistics.median(steps), busiest[0], busiest[1])


def compute_steps(
    sizes: Throughput, device: torch.device, precision: str, variable: bool
) -> tuple[list[list[float]], list[int]]:
    """Each step's seconds per stage, forward + backward over the step's micro-batches in this process (no
    pipeline, no transport), and its tokens: the steps after a first that warms up."""
    modules = [m.to(device) for m in split_layers(build_layers(sizes.model), RANKS)]
    per_step: list[list[float]] = []
    tokens: list[int] = []
    for index in range(sizes.steps):
        inputs, targets, count = throughput_batch(sizes, index, variable)
        spent = [0.0, 0.0]
        for x, y in zip(inputs, targets, strict=True):
            hidden, first = forward_backward(modules[0], x.to(device), None, device, precision)
            _, second = forward_backward(modules[1], hidden, y.to(device), device, precision)
            spent[0] += first
            spent[1] += second
        per_step.append(spent)
        tokens.append(count)
    return per_step[1:] or per_step, tokens[1:] or tokens


def forward_backward(
    module: nn.Module, x: torch.Tensor, target: torch.Tensor | None, device: torch.device, precision: str
) -> tuple[torch.Tensor, float]:
    """One micro-batch through one stage and back; returns the output (detached) and the seconds it took. bf16
    runs the forward and the loss under autocast and the backward outside it, as ``Pipeline(precision="bf16")``
    runs its tasks (``runtime/loop/executor.py``)."""
    leaf = as_input(x)
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = module(leaf)
        loss = None if target is None else lm_loss(out, target)
    if loss is not None:
        torch.autograd.backward(loss)
    else:
        torch.autograd.backward(out, torch.ones_like(out))
    synchronize(device)
    return out.detach(), time.perf_counter() - start


def compute_rows(sizes: Throughput, device: torch.device, bounds: Sequence[Run]) -> dict[Run, Measured]:
    """The bounds (both stages in sequence: what ranks that time-share one device cannot beat), one per
    precision and lengths the runs need, and the busiest stage alone (fp32, fixed lengths: what ranks with a
    device each cannot beat)."""
    out: dict[Run, Measured] = {}
    for bound in bounds:
        per_step, tokens = compute_steps(sizes, device, bound.precision, bound.variable)
        totals = [sum(s) for s in per_step]
        out[bound] = Measured(sum(tokens) / sum(totals), statistics.median(totals))
        if bound.precision == "fp32" and not bound.variable:
            busiest = max(statistics.median(s[i] for s in per_step) for i in range(RANKS))
            out[Run("busiest", "-")] = Measured(statistics.median(tokens) / busiest, busiest)
    return out


def hintpipe_runs(hints: Sequence[str]) -> list[Run]:
    """``hints``' runs: each precision under each policy on fixed lengths, and 1f1b's fp32 on variable lengths."""
    runs = []
    for hint, chunks in HINT_CHUNKS:
        if hint in hints:
            runs += [Run("hintpipe", hint, chunks, p, policy) for p in PRECISIONS for policy in POLICIES]
        if hint == "1f1b" and hint in hints:  # variable lengths: 1f1b fp32 only, after its fixed runs
            runs += [Run("hintpipe", "1f1b", 1, "fp32", policy, variable=True) for policy in POLICIES]
    return runs


def throughput_runs(device: str) -> list[list[Run]]:
    """The spawned groups: hintpipe's by hint, torch's in groups of their own, so that one that crashes its
    processes (CUDA tensors over gloo) leaves the others' figures."""
    if device == "cuda":
        groups = [hintpipe_runs(hints) for hints in HINT_GROUPS]
    else:  # a dry run: every run in one group, as the rows' timing is not judged there and each start costs seconds
        groups = [hintpipe_runs([hint for hints in HINT_GROUPS for hint in hints])]
    groups.append([Run("torch")])
    if device == "cuda":
        groups.append([Run("torch-host")])
    return groups


def over_bound(step_s: float, bound_s: float) -> float:
    """How much longer a step took than its bound, as a fraction (0.05: 5% over)."""
    return step_s / bound_s - 1.0


def throughput_cells(run: Run, value: Measured | str, reference: Measured, bound: Measured | None) -> list[str]:
    """A row: what ran, then its figures (or why it did not run)."""
    if isinstance(value, str):
        return [*run.cells, "-", "-", "-", "-", value]
    cpu = "-"
    if value.tasks and not math.isnan(value.runtime_cpu_s):
        cpu = f"{value.runtime_cpu_s * 1e3:.1f} ({value.runtime_cpu_s / value.tasks * 1e6:.0f})"
    over = "-" if bound is None else f"{over_bound(value.step_s, bound.step_s) * 100:+.1f}%"
    rate = f"{value.tokens_per_s:,.0f}"
    return [
        *run.cells,
        f"{value.step_s * 1e3:.1f}",
        rate,
        cpu,
        f"{value.tokens_per_s / reference.tokens_per_s:.2f}x",
        over,
    ]


def run_groups(sizes: Throughput, group_timeout_s: float) -> tuple[dict[Run, Measured | str], dict[str, Any], bool]:
    """Every spawned group's runs: each run's figures or why it did not run, the per-rank steps (and each
    failed group's error) for the JSON file, and whether a hintpipe group failed."""
    measured: dict[Run, Measured | str] = {}
    data: dict[str, Any] = {"per_rank_steps": {}}
    failed = False
    for runs in throughput_runs(sizes.device):
        try:
            per_rank = run_ranks(throughput_rank, RANKS, sizes, runs, timeout=group_timeout_s, device=sizes.device)
        except Exception as exc:  # a group that fails: its rows say why, the other groups still run
            first_line = (str(exc).splitlines() or [""])[0][:300]
            measured |= {run: f"could not run: {type(exc).__name__}: {first_line}" for run in runs}
            data[f"error: {runs[0].label}"] = f"{type(exc).__name__}: {exc}"
            failed |= runs[0].runtime == "hintpipe"  # torch's failing on CUDA over gloo is a finding
            continue
        for i, run in enumerate(runs):
            measured[run] = measured_run([r[i] for r in per_rank])
            data["per_rank_steps"][run.label] = [r[i] for r in per_rank]
    return measured, data, failed


def row_data(run: Run, value: Measured | str, bound: Measured | None) -> dict[str, Any]:
    """A row's figures for the JSON file: its own, its bound's label and how far over it (or why it did not
    run)."""
    if isinstance(value, str):
        return {"error": value}
    over = None if bound is None else over_bound(value.step_s, bound.step_s)
    return dataclasses.asdict(value) | {"bound": None if bound is None else run.bound.label, "over_bound": over}


def throughput_table(sizes: Throughput, group_timeout_s: float) -> Table:
    """Every hint's hintpipe runs (fp32 and bf16, ``fixed`` and ``ready``) and torch's ``Schedule1F1B``, 2 ranks
    on the one device, each against the bound of its precision: both stages' compute in one process."""
    device = configure(sizes.device)
    measured, data, failed = run_groups(sizes, group_timeout_s)
    bounds = list(dict.fromkeys(run.bound for run in measured))
    computed = compute_rows(sizes, device, bounds)
    everything: dict[Run, Measured | str] = {**measured, **computed}
    usable = [r for r, v in everything.items() if isinstance(v, Measured) and r.runtime in ("torch", "busiest")]
    reference_run = usable[0]
    reference = everything[reference_run]
    assert isinstance(reference, Measured)
    rows = []
    for run, value in everything.items():
        bound = computed[run.bound] if run.pipelined else None
        rows.append(throughput_cells(run, value, reference, bound))
        data[run.label] = {"run": dataclasses.asdict(run)} | row_data(run, value, bound)
    data |= {"rows": [run.label for run in everything], "reference": reference_run.label}
    data["over_bound_goal"] = OVER_BOUND_GOAL
    headers = ["run", "hint", "stages", "precision", "policy", "lengths", "step ms", "tokens/s"]
    headers += ["runtime CPU ms (us / task)", "vs reference", "over bound"]
    return Table(headers, rows, throughput_notes(sizes, reference_run), data, failed, left=6)


def throughput_notes(sizes: Throughput, reference: Run) -> list[str]:
    """What the throughput table ran, and how to read its columns."""
    model = sizes.model
    notes = [
        f"gpt-mini {model.layers} blocks, hidden {model.hidden}, {RANKS} ranks, both on {sizes.device}; "
        f"{sizes.microbatches} micro-batches of {sizes.microbatch_size} x {sizes.seq_len} tokens (variable: "
        f"lognormal lengths of the same mean, sigma 0.5), {sizes.steps} steps with AdamW, the first left out; a "
        f"step lasts from a barrier to the slowest rank's device work done. hintpipe: slack_microbatches {SLACK:g}, "
        'transport gloo; bf16 is `Pipeline(precision="bf16")`: forwards and the loss under autocast to bfloat16, '
        "parameters, gradients and AdamW state float32.",
        f"Stages: one chunk per rank is torch's rows' {RANKS}-stage split; interleaved-1f1b and zbv run two chunks "
        f"per rank ({2 * RANKS} stages: with one chunk interleaved-1f1b is 1f1b, and zbv's V is exactly two), bfw "
        "both ways (the issue's slow run had one chunk). bf is left out (bfw's ranking without the split "
        "backward).",
        f"Over bound: the run's median step over the bound of its precision and lengths, minus 1. The bound is "
        f"both stages' forward + backward over the step's micro-batches in this process, in sequence, no pipeline "
        f"(bf16: forwards and the loss under `torch.autocast({sizes.device!r}, torch.bfloat16)`, as the pipeline "
        f"runs them): what ranks that time-share one GPU cannot beat; {2 * RANKS}-stage runs have the same bound "
        f"(the same layers, cut finer). The goal (the project's issue): every hintpipe run on fixed lengths within "
        f"+{OVER_BOUND_GOAL:.0%} of its bound, for every hint, bf16 as fp32 (before: 1f1b `ready` 108 ms against "
        "96 ms, +12.5%). torch's rows are over the fp32 bound.",
        "Runtime CPU: the CPU time hintpipe's runtime took per step on the rank that took the most (every thread "
        "but the computing thread's time inside tasks: messages, staging, notices, scheduling; "
        "`StepReport.runtime_cpu`), the median over the steps after the first, and per task of that rank.",
        f"Reference (the `vs` column): {reference.label}. torch's runs use fixed lengths only (its schedule fixes "
        "shapes). The busiest stage alone bounds ranks with a device each.",
    ]
    if sizes.device == "cuda":
        notes.append(
            "The host-staged torch run wraps each stage so that torch's stage (device cpu) sends host tensors over "
            "gloo while the module computes on the GPU: the staging hintpipe's gloo transport does itself."
        )
    return notes
