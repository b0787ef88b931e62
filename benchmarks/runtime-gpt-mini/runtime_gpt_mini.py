"""Runtime benchmark: hintpipe's readiness against fixed order and against torch.distributed.pipelining.

Four parts, all on CPU with gloo and one thread per rank, training gpt-mini:

A. ``ready`` vs ``fixed`` with real compute on 2 ranks, under each injected variability model and
   under variable sequence lengths (``hintpipe.apps.training.train``).
B. The same comparison with emulated compute (tasks sleep their profiled cost) on 4 and 8 ranks.
C. How well the event simulator predicts the measured step times of the hintpipe runs of parts A, B and D.
D. hintpipe against torch's ``Schedule1F1B`` and ``ScheduleGPipe`` on the same 2-stage split and data:
   packed fixed-shape batches with and without per-micro-batch slowdowns, and variable sequence lengths
   (torch padded to a fixed shape).

Each run waits for the machine to be quiet and is redone if other work used its cores meanwhile (within budgets).

Run from the repository root::

    .venv/bin/python benchmarks/runtime-gpt-mini/runtime_gpt_mini.py [--quick] [--parts ABCD] [--repeats N]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import hintpipe
from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.apps.training import TrainConfig, TrainResult, predict_step_time, profile_costs, train
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import MicrobatchNoise
from hintpipe.runtime.injection import CostFactors, Injection
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline, StepReport
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind

SLACK = 2.0
SEED = 0
IGNORE = -100  # cross-entropy's ignore_index: padded target positions
Gradients = tuple[torch.Tensor, ...] | torch.Tensor  # what torch passes module backward hooks


# -- environment and tables ------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """What the figures depend on, read off the machine."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text().splitlines()
        cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), cpu)
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "os": f"{platform.system()} {platform.release()}",
        "loadavg_start": os.getloadavg()[0],
        "hintpipe": source_version(),
    }


def source_version() -> str:
    """The commit of the source tree measured, and whether ``src`` had uncommitted changes."""
    package = Path(hintpipe.__file__).resolve().parent
    try:
        git = ["git", "-C", str(package)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changes = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return f"imported from {package} (not a git checkout)"
    dirty = changes.stdout.split()
    return commit.stdout.strip() + (f" with uncommitted changes to {', '.join(dirty[1::2])}" if dirty else "")


def table(title: str, headers: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A Markdown table (first ``left`` columns text, the rest numbers), printed as it is made."""
    align = ["---" if i < left else "---:" for i in range(len(headers))]
    lines = [f"**{title}**", "", *("| " + " | ".join(cells) + " |" for cells in [headers, align, *rows])]
    text = "\n".join(lines)
    print(f"\n{text}\n", flush=True)
    return text


def ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}x"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- other work on the machine ----------------------------------------------------------------------------

QUIET = 0.2  # cores busy with other work: below it a run may start, above it (on average) a run is redone
WAIT_BUDGET = 900.0  # seconds the whole benchmark may spend waiting for the machine to quieten (idle, not measuring)
REDO_BUDGET = 150.0  # seconds the whole benchmark may spend redoing runs that other work disturbed


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process and its finished ranks)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    me, ranks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, me.ru_utime + me.ru_stime + ranks.ru_utime + ranks.ru_stime


@dataclasses.dataclass
class Monitor:
    """Other work on the machine, per run: the cores it kept busy on average (the machine's busy CPU time
    minus the benchmark's own, over the run's wall time).

    Before each run it waits, within ``WAIT_BUDGET``, until other work is below ``QUIET``; a run during
    which other work averaged more than ``QUIET`` is discarded and redone, within ``REDO_BUDGET``.
    """

    waited: float = 0.0
    redone: float = 0.0
    loads: list[float] = dataclasses.field(default_factory=list)  # of the runs kept
    discarded: list[float] = dataclasses.field(default_factory=list)  # of the runs redone

    def other_load(self, seconds: float) -> float:
        busy0, own0 = cpu_seconds()
        began = time.perf_counter()
        time.sleep(seconds)
        busy1, own1 = cpu_seconds()
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - began)

    def run(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """``fn()`` on a machine as quiet as the budgets allow; returns (result, other load during it)."""
        while True:
            while self.waited < WAIT_BUDGET and self.other_load(1.0) > QUIET:
                time.sleep(2.0)
                self.waited += 3.0
            busy0, own0 = cpu_seconds()
            began = time.perf_counter()
            result = fn()
            busy1, own1 = cpu_seconds()
            wall = time.perf_counter() - began
            load = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
            if load <= QUIET or self.redone >= REDO_BUDGET:
                self.loads.append(load)
                return result, load
            log(f"  other work used {load:.2f} cores during the run: redoing it")
            self.discarded.append(load)
            self.redone += wall


MONITOR = Monitor()


# -- parts A, B, C: hintpipe's own trainer -------------------------------------------------------------------


@dataclasses.dataclass
class PolicyRuns:
    """Every run of one policy under one condition (interleaved with the other policy's runs)."""

    results: list[TrainResult] = dataclasses.field(default_factory=list)
    loads: list[float] = dataclasses.field(default_factory=list)  # cores other work used during each run

    @property
    def throughput(self) -> float:
        """Tokens per second pooled over every run's measured steps (the first step of each run excluded)."""
        tokens = sum(sum(r.tokens[1:]) for r in self.results)
        return tokens / sum(sum(s.makespan for s in r.measured) for r in self.results)

    @property
    def each(self) -> list[float]:
        return [r.throughput for r in self.results]


def compare_policies(config: TrainConfig, repeats: int) -> dict[str, PolicyRuns]:
    """Run ``fixed`` and ``ready`` ``repeats`` times each, in the order fixed, ready, ready, fixed, ..."""
    runs = {"fixed": PolicyRuns(), "ready": PolicyRuns()}
    for i in range(repeats):
        order = ["fixed", "ready"] if i % 2 == 0 else ["ready", "fixed"]
        for policy in order:
            run_config = config.replaced(policy=policy)
            result, load = MONITOR.run(functools.partial(train, run_config))
            assert isinstance(result, TrainResult)
            runs[policy].results.append(result)
            runs[policy].loads.append(load)
    return runs


def policy_row(label: str, runs: dict[str, PolicyRuns]) -> list[str]:
    fixed, ready = runs["fixed"], runs["ready"]
    pairs = " ".join(f"{r / f:.3f}" for f, r in zip(fixed.each, ready.each, strict=True))
    step = statistics.median(s.makespan for r in fixed.results for s in r.measured)
    return [
        label,
        f"{step * 1e3:.0f}",
        f"{fixed.throughput:,.0f}",
        f"{ready.throughput:,.0f}",
        ratio(ready.throughput, fixed.throughput),
        pairs,
        f"{max(fixed.loads + ready.loads):.2f}",
    ]


POLICY_HEADERS = ["condition", "fixed step ms", "fixed tok/s", "ready tok/s", "ready / fixed", "per pair", "other load"]


def part_a(quick: bool, repeats: int) -> tuple[str, dict[str, dict[str, PolicyRuns]]]:
    model = ModelConfig("gpt-mini", layers=4, hidden=64 if quick else 128, seed=SEED)
    base = TrainConfig.of(
        model=model,
        ranks=2,
        microbatches=8,
        microbatch_size=4,
        hint="1f1b",
        steps=3 if quick else 8,
        slack_microbatches=SLACK,
        seq_len_dist=SeqLenDist(96),
        seed=SEED,
        timeout=120.0,
        timelines=True,  # every rank's task records on rank 0: part C predicts each measured step
    )
    # Stage 1 (rank 1 under 1f1b on 2 ranks) 1.5x slower on every micro-batch.
    straggler = f"straggler:1.5:1:0:{base.pipeline.microbatches - 1}"
    conditions: list[tuple[str, TrainConfig]] = [("none", base)]
    for spec in ("iid:0.5", "mb:0.5", straggler, "comm:2ms"):
        conditions.append((spec, base.replaced(variability=(spec,))))
    conditions.append(("seq lognormal:96:0.5", base.replaced(seq_len_dist=SeqLenDist(96, 0.5))))
    out: dict[str, dict[str, PolicyRuns]] = {}
    for label, config in conditions:
        log(f"A: {label}")
        out[label] = compare_policies(config, repeats)
    title = (
        f"A. Real compute, 2 ranks: gpt-mini {model.layers} blocks x {model.hidden} hidden, 1f1b, "
        f"{base.pipeline.microbatches} micro-batches of {base.training.microbatch_size} x 96 tokens (mean), "
        f"slack {SLACK:g}, {base.training.steps} steps ({base.training.steps - 1} measured) x {repeats} runs per policy"
    )
    md = table(title, POLICY_HEADERS, [policy_row(k, v) for k, v in out.items()])
    return md, out


def part_b(quick: bool, repeats: int) -> tuple[str, dict[str, dict[str, PolicyRuns]]]:
    model = ModelConfig("gpt-mini", layers=6 if quick else 14, hidden=64 if quick else 128, seed=SEED)
    out: dict[str, dict[str, PolicyRuns]] = {}
    costs_md: list[str] = []
    for ranks in (4, 8):
        base = TrainConfig.of(
            model=model,
            ranks=ranks,
            microbatches=16,
            microbatch_size=4,
            hint="1f1b",
            steps=3 if quick else 6,
            slack_microbatches=SLACK,
            seq_len_dist=SeqLenDist(96),
            seed=SEED,
            timeout=120.0,
            timelines=True,
        )
        costs = profile_costs(base)
        costs_md.append(
            f"{ranks} ranks: F ms {' '.join(f'{c * 1e3:.1f}' for c in costs.forward)}; "
            f"B ms {' '.join(f'{c * 1e3:.1f}' for c in costs.backward)} (per {costs.reference_size} tokens)"
        )
        base = base.replaced(emulate=costs)
        for label, config in [
            ("mb:0.5", base.replaced(variability=("mb:0.5",))),
            ("seq lognormal:96:0.5", base.replaced(seq_len_dist=SeqLenDist(96, 0.5))),
        ]:
            log(f"B: {ranks} ranks, {label}")
            out[f"{ranks} ranks, {label}"] = compare_policies(config, repeats)
    title = (
        f"B. Emulated compute, gpt-mini {model.layers} blocks x {model.hidden} hidden, 1f1b, 16 micro-batches, "
        f"slack {SLACK:g}, {base.training.steps} steps x {repeats} runs per policy"
    )
    md = table(title, POLICY_HEADERS, [policy_row(k, v) for k, v in out.items()])
    md += "\n\nProfiled costs: " + "; ".join(costs_md)
    return md, out


@dataclasses.dataclass
class Agreement:
    """The measured steps of one condition that part C compares with the simulator."""

    hint: Hint
    slack: float
    reports: dict[str, list[StepReport]]  # policy -> measured steps that kept their timelines
    measured_gain: float  # ready / fixed throughput as measured


def agreement_from_runs(runs: dict[str, dict[str, PolicyRuns]]) -> dict[str, Agreement]:
    """Part A/B runs: every measured step whose report holds every rank's tasks (all of them, as the runs
    train with ``timelines=True``)."""
    out = {}
    for label, by_policy in runs.items():
        c = by_policy["fixed"].results[0].config
        hint = c.resolved_hint
        out[label] = Agreement(
            hint,
            c.pipeline.slack_microbatches,
            {
                p: [s for r in pr.results for s in r.measured if len(s.records) == hint.num_tasks]
                for p, pr in by_policy.items()
            },
            by_policy["ready"].throughput / by_policy["fixed"].throughput,
        )
    return out


def part_c(groups: dict[str, Agreement], what: str) -> tuple[str, list[dict[str, Any]]]:
    """Simulator prediction of each measured step (its measured task times as the sample) vs the measurement,
    and the gain the simulator predicts for ``ready`` on the task times the ready runs measured."""
    rows: list[list[str]] = []
    records: list[dict[str, Any]] = []
    for label, group in groups.items():
        cells = [label]
        entry: dict[str, Any] = {"condition": label}
        for policy_name, reports in group.reports.items():
            errors, signed = [], []
            for report in reports:
                predicted = predict_step_time(group.hint, report, Policy(policy_name), group.slack)
                errors.append(abs(predicted - report.makespan) / report.makespan)
                signed.append((predicted - report.makespan) / report.makespan)
            entry[policy_name] = {"mare": statistics.mean(errors), "mean_signed": statistics.mean(signed)}
            cells += [f"{statistics.mean(errors):.1%}", f"{statistics.mean(signed):+.1%}", str(len(errors))]
        gains = [
            predict_step_time(group.hint, report, Policy.FIXED, group.slack)
            / predict_step_time(group.hint, report, Policy.READY, group.slack)
            for report in group.reports["ready"]
        ]
        entry["simulated_gain"], entry["measured_gain"] = statistics.mean(gains), group.measured_gain
        cells += [f"{statistics.mean(gains):.3f}x", f"{group.measured_gain:.3f}x"]
        records.append(entry)
        rows.append(cells)
    headers = ["condition", "fixed MARE", "fixed bias", "steps", "ready MARE", "ready bias", "steps"]
    headers += ["simulated ready / fixed", "measured ready / fixed"]
    title = f"C. Simulator vs measured step time ({what}): mean absolute relative error, mean signed error"
    return table(title, headers, rows), records


# -- part D: hintpipe vs torch.distributed.pipelining ----------------------------------------------------


class InjectedStage(nn.Module):
    """A stage module that sleeps ``X * t`` after its forward and after its backward.

    ``t`` is the forward's (backward's) measured time and ``X`` the ``mb:SIGMA`` cost factor for
    (step, micro-batch), drawn by ``hintpipe.runtime.injection.Injection`` (one mean-one lognormal
    factor per micro-batch, the same on every stage). A task thus takes ``(1 + X) t``: the wrapper
    keeps the benchmark's own model of a slowdown, the same for both runtimes, rather than the
    runtime's ``--variability mb:SIGMA`` (which makes a task of ``t`` take ``max(X, 1) t``). Forwards and
    backwards are counted per step to know the micro-batch: both torch schedules and hintpipe's
    ``1f1b`` run each stage's forwards, and its backwards, in micro-batch order (checked per step).

    The backward is timed with module backward hooks from the gradient of the output arriving to the
    gradient of the input leaving. On stage 0 the input is token ids, which get no gradient, so the
    hooks sit on the layers after the embedding (whose backward, a scatter into its weights, is cheap).
    """

    def __init__(
        self, module: nn.Sequential, stage: int, stages: int, microbatches: int, sigma: float, seed: int
    ) -> None:
        super().__init__()
        layers = list(module)
        cut = 1 if stage == 0 else 0
        self.front = nn.Sequential(*layers[:cut])
        self.body = nn.Sequential(*layers[cut:])
        self.body.register_full_backward_pre_hook(self._backward_start)
        self.body.register_full_backward_hook(self._backward_end)
        self.stage = stage
        self.factor: CostFactors | None = None
        if sigma:
            self.factor = Injection(variability=(MicrobatchNoise(sigma),), seed=seed).factors(stages, microbatches)
        self.step_index = 0
        self.forwards = 0
        self.backwards = 0
        self.slept = 0.0
        self._began = 0.0

    def begin_step(self, step: int) -> None:
        self.step_index, self.forwards, self.backwards = step, 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out: torch.Tensor = self.body(self.front(x))
        self._sleep(Kind.F, self.forwards, time.perf_counter() - start)
        self.forwards += 1
        return out

    def _backward_start(self, module: nn.Module, grad_output: Gradients) -> None:
        self._began = time.perf_counter()

    def _backward_end(self, module: nn.Module, grad_input: Gradients, grad_output: Gradients) -> None:
        self._sleep(Kind.B, self.backwards, time.perf_counter() - self._began)
        self.backwards += 1

    def _sleep(self, kind: Kind, mb: int, elapsed: float) -> None:
        if self.factor is not None:
            extra = self.factor(self.step_index, self.stage, kind, mb) * elapsed
            self.slept += extra
            time.sleep(extra)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One run of part D: who schedules, with what data."""

    label: str
    runtime: str  # "torch" or "hintpipe"
    schedule: str  # torch: "1f1b" or "gpipe"; hintpipe: its policy
    model: ModelConfig
    microbatches: int
    microbatch_size: int
    seq_len: SeqLenDist
    steps: int
    sigma: float = 0.0
    pad_to: int | None = None  # torch: pad every micro-batch to this length
    lr: float = 1e-3
    hint: str = "1f1b"  # hintpipe: the hint (stages per rank as the hint says)
    order: str = "given"  # hintpipe: the micro-batch order
    device_budget_fraction: float | None = None  # hintpipe: a per-device budget instead of the slack in micro-batches


def batch(v: Variant, step: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """The step's micro-batches, padded to ``v.pad_to`` (targets of the padding ignored by the loss)."""
    inputs, targets, counts = make_batch(v.model, v.microbatches, v.microbatch_size, v.seq_len, step, SEED)
    if v.pad_to is not None:
        inputs = [F.pad(x, (0, v.pad_to - x.shape[1]), value=0) for x in inputs]
        targets = [F.pad(y, (0, v.pad_to - y.shape[1]), value=IGNORE) for y in targets]
    return inputs, targets, counts


def compare_rank(rank: int, world: int, v: Variant) -> dict[str, Any]:
    """One rank of a part D run: build the same stage, train ``v.steps`` steps, time each step."""
    hint = generate_hint(v.hint if v.runtime == "hintpipe" else "1f1b", world, v.microbatches)
    modules = split_layers(build_layers(v.model), hint.stages)
    stages = {}
    for s in hint.placement.stages_of(rank):
        module = modules[s]
        assert isinstance(module, nn.Sequential)
        stages[s] = InjectedStage(module, s, hint.stages, v.microbatches, v.sigma, SEED)
    optimizer = torch.optim.AdamW([p for m in stages.values() for p in m.parameters()], lr=v.lr)
    first, last = rank == 0, rank == world - 1
    run_step: Callable[[list[torch.Tensor], list[torch.Tensor]], float | None]
    pipe: Pipeline | None = None
    if v.runtime == "torch":
        wrapped, stage_module = stages[rank], modules[rank]  # 1F1B and GPipe: one stage per rank
        x0, _, _ = batch(v, 0)
        # Example tensors (with autograd, so that torch knows which outputs carry gradients): given them,
        # torch runs no shape inference at the first step, which would call the stage module once more.
        example_in = x0[0] if first else build_example(v, rank, world, x0[0])
        example_out = stage_module(example_in)
        stage = PipelineStage(wrapped, rank, world, torch.device("cpu"), input_args=example_in, output_args=example_out)
        schedule_class = Schedule1F1B if v.schedule == "1f1b" else ScheduleGPipe
        schedule = schedule_class(stage, v.microbatches, loss_fn=lm_loss)

        def run_torch(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float | None:
            if first:
                schedule.step(torch.cat(inputs), return_outputs=False)
                return None
            if last:
                losses: list[torch.Tensor] = []
                schedule.step(target=torch.cat(targets), losses=losses, return_outputs=False)
                return float(torch.stack([loss.detach() for loss in losses]).mean())
            schedule.step(return_outputs=False)
            return None

        run_step = run_torch
    else:
        pipe = Pipeline(
            dict(stages),
            loss_fn=lm_loss,
            microbatches=v.microbatches,
            hint=hint,
            policy=v.schedule,
            slack_microbatches=SLACK if v.device_budget_fraction is None else 0.0,
            device_budget_fraction=v.device_budget_fraction,
            microbatch_order=v.order,
            timeout=120.0,
            timelines=True,  # every rank's task records on rank 0, for part C and the order check
        )

        def run_hintpipe(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float | None:
            assert pipe is not None
            loss = pipe.step(inputs if first else None, targets if last else None)
            return None if loss is None else float(loss)

        run_step = run_hintpipe
    times: list[float] = []
    losses: list[float] = []
    tokens: list[int] = []
    try:
        for step in range(v.steps):
            inputs, targets, counts = batch(v, step)
            for module in stages.values():
                module.begin_step(step)
            dist.barrier()
            start = time.perf_counter()
            loss = run_step(inputs, targets)
            times.append(time.perf_counter() - start)
            for s, module in stages.items():
                if (module.forwards, module.backwards) != (v.microbatches, v.microbatches):
                    raise RuntimeError(f"rank {rank} stage {s} step {step}: {module.forwards} F / {module.backwards} B")
            if loss is not None:
                losses.append(loss)
            tokens.append(sum(counts))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        if pipe is not None:
            pipe.close()
    in_order = True
    internal: list[float] = []
    if pipe is not None:
        for report in pipe.reports:
            internal.append(report.makespan)
            for kind in (Kind.F, Kind.B):
                for s in range(hint.stages):
                    mbs = [t.mb for _, t, _, _ in report.records if t.stage == s and t.kind is kind]
                    in_order &= mbs == sorted(mbs)
    reports = list(pipe.reports) if pipe is not None and rank == 0 else []
    return {
        "times": times,
        "losses": losses,
        "tokens": tokens,
        "in_order": in_order,
        "internal": internal,
        "reports": reports,
    }


def build_example(v: Variant, rank: int, world: int, ids: torch.Tensor) -> torch.Tensor:
    """The input of stage ``rank`` for one micro-batch (run through the stages before it)."""
    x = ids
    for module in split_layers(build_layers(v.model), world)[:rank]:
        x = module(x)
    return x


@dataclasses.dataclass
class VariantRuns:
    variant: Variant
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def step_times(self, run: dict[str, Any]) -> list[float]:
        return [max(t) for t in zip(*run["times"], strict=True)]

    @property
    def throughput(self) -> float:
        """Real tokens per second over every run's steps after the first (step time: the slowest rank's)."""
        tokens = sum(sum(run["tokens"][1:]) for run in self.runs)
        return tokens / sum(sum(self.step_times(run)[1:]) for run in self.runs)

    def each(self) -> list[float]:
        return [sum(run["tokens"][1:]) / sum(self.step_times(run)[1:]) for run in self.runs]


def run_variants(variants: list[Variant], repeats: int) -> dict[str, VariantRuns]:
    """Every variant ``repeats`` times, each run in its own spawned group, the order reversed on odd repeats."""
    out = {v.label: VariantRuns(v) for v in variants}
    for i in range(repeats):
        for v in variants if i % 2 == 0 else variants[::-1]:
            per_rank, load = MONITOR.run(functools.partial(run_ranks, compare_rank, 2, v, timeout=120.0))
            merged = {
                "times": [r["times"] for r in per_rank],
                "losses": next(r["losses"] for r in per_rank if r["losses"]),
                "tokens": per_rank[0]["tokens"],
                "in_order": all(r["in_order"] for r in per_rank),
                "internal": per_rank[0]["internal"],
                "reports": per_rank[0]["reports"],
                "other_load": load,
            }
            out[v.label].runs.append(merged)
    return out


def d_agreement(res: dict[str, VariantRuns]) -> Agreement:
    """Part D's hintpipe runs for part C: the runtime keeps every step's timeline."""
    v = res["hintpipe fixed"].variant
    return Agreement(
        generate_hint("1f1b", 2, v.microbatches),
        SLACK,
        {p: [s for run in res[f"hintpipe {p}"].runs for s in run["reports"][1:]] for p in ("fixed", "ready")},
        res["hintpipe ready"].throughput / res["hintpipe fixed"].throughput,
    )


def part_d(quick: bool, repeats: int) -> tuple[str, dict[str, Any], dict[str, Agreement]]:
    model = ModelConfig("gpt-mini", layers=4, hidden=64 if quick else 128, seed=SEED)
    steps = 3 if quick else 8
    common: dict[str, Any] = {"model": model, "microbatches": 8, "microbatch_size": 4, "steps": steps}
    md: list[str] = []
    payload: dict[str, Any] = {}
    agreements: dict[str, Agreement] = {}
    packed = SeqLenDist(128)
    for sigma in (0.0, 0.5):
        log(f"D: packed fixed:128, mb sigma {sigma}")
        variants = [
            Variant("torch Schedule1F1B", "torch", "1f1b", seq_len=packed, sigma=sigma, **common),
            Variant("torch ScheduleGPipe", "torch", "gpipe", seq_len=packed, sigma=sigma, **common),
            Variant("hintpipe fixed", "hintpipe", "fixed", seq_len=packed, sigma=sigma, **common),
            Variant("hintpipe ready", "hintpipe", "ready", seq_len=packed, sigma=sigma, **common),
        ]
        res = run_variants(variants, repeats)
        label = "no injection" if sigma == 0 else f"mb:{sigma:g} (same module wrapper in both)"
        md.append(d_table(f"D(a). Packed fixed:128 batches, {label}", res, "torch Schedule1F1B"))
        payload[f"packed sigma {sigma:g}"] = d_payload(res)
        agreements["packed fixed:128" + ("" if sigma == 0 else f", mb:{sigma:g}")] = d_agreement(res)
    # Variable lengths: torch freezes shapes, so it pads every micro-batch to the longest length of the run.
    varied = SeqLenDist(96, 0.5)
    lengths = [
        x.shape[1]
        for step in range(steps)
        for x in make_batch(model, common["microbatches"], common["microbatch_size"], varied, step, SEED)[0]
    ]
    longest = max(lengths)
    cap = model.max_seq_len - 1
    log(f"D: variable lengths lognormal:96:0.5 (longest {longest}, cap {cap})")
    variants = [
        Variant(f"torch Schedule1F1B, padded to {longest}", "torch", "1f1b", seq_len=varied, pad_to=longest, **common),
        Variant(
            f"torch ScheduleGPipe, padded to {longest}", "torch", "gpipe", seq_len=varied, pad_to=longest, **common
        ),
        Variant("hintpipe fixed", "hintpipe", "fixed", seq_len=varied, **common),
        Variant("hintpipe ready", "hintpipe", "ready", seq_len=varied, **common),
    ]
    res = run_variants(variants, repeats)
    real = sum(lengths[common["microbatches"] :])  # steps after the first
    measured_mbs = len(lengths) - common["microbatches"]
    padding = {longest: longest * measured_mbs / real, cap: cap * measured_mbs / real}
    md.append(
        d_table(
            f"D(b). Variable lengths lognormal:96:0.5 (real tokens only; padding factor over the measured steps: "
            f"{padding[longest]:.2f} at {longest}, {padding[cap]:.2f} at {cap})",
            res,
            f"torch Schedule1F1B, padded to {longest}",
        )
    )
    payload["variable"] = d_payload(res) | {"longest": longest, "cap": cap, "padding_factor": padding}
    agreements["seq lognormal:96:0.5"] = d_agreement(res)
    return "\n\n".join(md), payload, agreements


def d_table(title: str, res: dict[str, VariantRuns], reference: str) -> str:
    ref = res[reference].throughput
    fixed = res["hintpipe fixed"].throughput
    rows = []
    for label, vr in res.items():
        internal = ""
        if vr.variant.runtime == "hintpipe":
            internal = f"{statistics.median(t for run in vr.runs for t in run['internal'][1:]) * 1e3:.0f}"
        step = statistics.median(t for run in vr.runs for t in vr.step_times(run)[1:])
        rows.append(
            [
                label,
                f"{step * 1e3:.0f}",
                internal,
                f"{vr.throughput:,.0f}",
                ratio(vr.throughput, ref),
                ratio(vr.throughput, fixed),
                " ".join(f"{x:,.0f}" for x in vr.each()),
                f"{max(run['other_load'] for run in vr.runs):.2f}",
            ]
        )
    headers = ["run", "step ms", "own step ms", "tok/s", "vs torch 1F1B", "vs hintpipe fixed", "each run", "other load"]
    text = table(title, headers, rows)
    torch_loss, hp_loss = res[reference].runs[0]["losses"], res["hintpipe fixed"].runs[0]["losses"]
    worst = max(abs(a - b) for a, b in zip(torch_loss, hp_loss, strict=True))
    note = (
        f"First-step loss: {reference} {torch_loss[0]:.7f}, hintpipe fixed {hp_loss[0]:.7f} "
        f"(difference {abs(torch_loss[0] - hp_loss[0]):.1e}); largest difference over all {len(hp_loss)} steps "
        f"{worst:.1e}."
    )
    if not all(run["in_order"] for vr in res.values() for run in vr.runs):
        note += " hintpipe ran some stage's micro-batches out of order: the injected factors were misassigned."
    print(note, flush=True)
    return f"{text}\n\n{note}"


def d_payload(res: dict[str, VariantRuns]) -> dict[str, Any]:
    return {
        label: {
            "throughput": vr.throughput,
            "each": vr.each(),
            "step_times": [vr.step_times(run) for run in vr.runs],
            "losses": [run["losses"] for run in vr.runs],
            "in_order": all(run["in_order"] for run in vr.runs),
        }
        for label, vr in res.items()
    }


def runs_payload(runs: dict[str, dict[str, PolicyRuns]]) -> dict[str, Any]:
    return {
        label: {
            policy: {
                "throughput": pr.throughput,
                "each": pr.each,
                "step_times": [[s.makespan for s in r.reports] for r in pr.results],
                "losses": [list(r.losses) for r in pr.results],
            }
            for policy, pr in by_policy.items()
        }
        for label, by_policy in runs.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, 3 steps, one run per policy")
    parser.add_argument("--parts", default="ABCD", help="which parts to run (default ABCD; C needs A)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per policy (default 2; --quick 1)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 2)
    env = environment()
    log(f"environment: {env}")
    began = time.perf_counter()
    sections: list[str] = []
    payload: dict[str, Any] = {"environment": env, "quick": args.quick, "repeats": repeats}
    if "A" in args.parts:
        md, a_runs = part_a(args.quick, repeats)
        sections.append(md)
        payload["A"] = runs_payload(a_runs)
        if "C" in args.parts:
            md, records = part_c(agreement_from_runs(a_runs), "part A, real compute")
            sections.append(md)
            payload["C"] = records
    if "B" in args.parts:
        md, b_runs = part_b(args.quick, repeats)
        sections.append(md)
        payload["B"] = runs_payload(b_runs)
        if "C" in args.parts:
            md, records = part_c(agreement_from_runs(b_runs), "part B, emulated compute")
            sections.append(md)
            payload["C emulated"] = records
    if "D" in args.parts:
        md, d, agreements = part_d(args.quick, repeats)
        sections.append(md)
        payload["D"] = d
        if "C" in args.parts:
            md, records = part_c(agreements, "part D's hintpipe runs, every measured step")
            sections.append(md)
            payload["C part D"] = records
    payload["total_seconds"] = time.perf_counter() - began
    payload["loadavg_end"] = end_load = os.getloadavg()[0]
    loads = MONITOR.loads
    busy = sum(load > QUIET for load in loads)
    payload["other_load"] = {
        "runs": len(loads),
        "busy_runs": busy,
        "max": max(loads),
        "discarded": MONITOR.discarded,
        "waited_s": MONITOR.waited,
        "redone_s": MONITOR.redone,
    }
    sections.append(
        f"Other work on the machine: {len(MONITOR.discarded)} runs redone because other work used more than "
        f"{QUIET:g} cores on average during them ({MONITOR.redone:.0f} s); of the {len(loads)} runs kept, "
        f"{busy} still had more (largest {max(loads):.2f} cores); {MONITOR.waited:.0f} s spent waiting for quiet."
    )
    log(f"total {payload['total_seconds']:.0f} s, load average {env['loadavg_start']:.2f} -> {end_load:.2f}")
    print("\n\n".join(sections))
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
