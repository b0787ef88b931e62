"""Training the built-in models with the runtime: what ``hintpipe train`` runs on each rank.

The parent (``hintpipe train``) builds a :class:`TrainConfig`, starts the ranks
(:func:`hintpipe.launch.run_ranks`) and gets rank 0's :class:`TrainResult`.
Every rank builds the same model from the seed, keeps its stages, and trains
with its own optimizer on its own parameters; the data of step ``k`` is the
same for every policy, so runs compare like for like.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, loss_fn_for, make_batch, split_layers
from hintpipe.observe.trace import Record
from hintpipe.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hintpipe.runtime.faults import Injection
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline, StepReport
from hintpipe.schedule.hint import Hint
from hintpipe.schedule.task import Kind
from hintpipe.scoreboard import Policy
from hintpipe.sim.cost_model import CostModel
from hintpipe.sim.simulator import Sample, Simulator


@dataclasses.dataclass(frozen=True)
class EmulatedCosts:
    """Per-stage task costs in seconds for one reference micro-batch of
    ``reference_tokens`` tokens; a micro-batch costs in proportion to its tokens."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    reference_tokens: int
    tokens: tuple[int, ...] = ()

    def for_step(self, tokens: list[int]) -> EmulatedCosts:
        return dataclasses.replace(self, tokens=tuple(tokens))

    def __call__(self, stage: int, kind: str, mb: int) -> float:
        base = {"F": self.forward, "B": self.backward, "W": self.weight}[kind][stage]
        return base * self.tokens[mb] / self.reference_tokens


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a rank needs to train (picklable: it crosses process boundaries)."""

    model: ModelConfig
    ranks: int
    microbatches: int
    microbatch_size: int = 4
    hint: str = "1f1b"
    chunks: int | None = None
    policy: str = "ready"
    steps: int = 4
    memory_slack: float = 0.0
    memory_budget: float | None = None
    seq_len: SeqLenDist = dataclasses.field(default_factory=lambda: SeqLenDist(64))
    inject: tuple[str, ...] = ()
    seed: int = 0
    lr: float = 1e-3
    timeout: float = 300.0
    check_grads: bool = False
    emulate: EmulatedCosts | None = None
    split_backward: bool = False
    progress: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    on_nonfinite: str = "raise"
    return_state: bool = False


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run did (from rank 0, with every rank's figures gathered)."""

    config: TrainConfig
    reports: tuple[StepReport, ...]
    losses: tuple[float, ...]
    tokens: tuple[int, ...]
    max_grad_abs_diff: float | None = None
    max_grad_rel_diff: float | None = None
    resumed_from: int = 0
    skipped_steps: tuple[int, ...] = ()
    state: dict[str, torch.Tensor] | None = None

    @property
    def measured(self) -> tuple[StepReport, ...]:
        """Steps after the first (the first warms up and, for ``ready``, has no plan yet)."""
        return self.reports[1:] if len(self.reports) > 1 else self.reports

    @property
    def step_time_median(self) -> float:
        return statistics.median(r.step_time for r in self.measured)

    @property
    def throughput(self) -> float:
        """Tokens (gpt-mini) or samples (mlp) per second over the measured steps."""
        steps = self.measured
        first = len(self.reports) - len(steps)
        return sum(self.tokens[first:]) / sum(r.step_time for r in steps)

    @property
    def efficiency(self) -> float:
        return statistics.median(r.efficiency for r in self.measured)

    @property
    def peak_live_bytes(self) -> list[int]:
        return [max(r.peak_live_bytes[i] for r in self.reports) for i in range(self.config.ranks)]

    @property
    def peak_live(self) -> list[float]:
        return [max(r.peak_live[i] for r in self.reports) for i in range(self.config.ranks)]

    def records(self, step: int = -1) -> tuple[Record, ...]:
        return self.reports[step].records


def train(config: TrainConfig) -> TrainResult | None:
    """Start the ranks, train, and return rank 0's result (``None`` on the
    other ranks of a ``torchrun`` launch).

    Raises:
        hintpipe.launch.RankFailure: with each failed rank's error.
    """
    results = run_ranks(_train_rank, config.ranks, config, timeout_s=config.timeout)
    result = results[0]
    assert result is None or isinstance(result, TrainResult)
    return result


_TIMELINES = 10  # steps whose full timelines a run keeps (the first, and this many latest)


def _train_rank(rank: int, world: int, config: TrainConfig) -> TrainResult | None:
    layers = build_layers(config.model)
    stages = world * (config.chunks or (2 if config.hint == "zbv" else 1))
    modules = split_layers(layers, stages)
    reference = copy.deepcopy(modules) if config.check_grads and rank == 0 else None
    injection = Injection.parse(list(config.inject), seed=config.seed)
    injection.check_ranks(world)
    pipe = Pipeline.from_modules(
        modules,
        loss_fn=loss_fn_for(config.model.name),
        microbatches=config.microbatches,
        hint=config.hint,
        policy=config.policy,
        chunks=config.chunks,
        memory_slack=config.memory_slack,
        memory_budget=config.memory_budget,
        timeout=config.timeout,
        injection=injection,
        emulate=config.emulate,
        on_nonfinite=config.on_nonfinite,
    )
    params = [p for s in pipe.stages for p in modules[s].parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.lr) if params else None
    mine = {s: modules[s] for s in pipe.stages}
    first = 0
    if config.resume and config.checkpoint_dir is not None:
        found = latest_checkpoint(config.checkpoint_dir)
        if found is not None:
            first = load_checkpoint(found, mine, optimizer)
            pipe.step_count = first
    losses: list[float] = []
    tokens: list[int] = []
    reports: list[StepReport] = []
    grad_diffs: tuple[float, float] | None = None
    bar = _progress(config.steps - first) if config.progress and rank == 0 else None
    try:
        for step in range(first, config.steps):
            inputs, targets, counts = make_batch(
                config.model, config.microbatches, config.microbatch_size, config.seq_len, step, config.seed
            )
            if config.emulate is not None:
                pipe.executor.costs = config.emulate.for_step(counts)  # type: ignore[union-attr]
            loss = pipe.step(inputs, targets, broadcast_loss=True)
            assert loss is not None
            if len(reports) > _TIMELINES:  # keep the first step's timeline and the latest ones
                old = len(reports) - _TIMELINES
                reports[old] = dataclasses.replace(reports[old], records=())
            reports.append(pipe.reports[-1])
            losses.append(float(loss))
            tokens.append(
                sum(counts) if config.model.name == "gpt-mini" else config.microbatches * config.microbatch_size
            )
            if step == 0 and config.check_grads:
                grad_diffs = _compare_gradients(pipe, modules, reference, inputs, targets, config)
            if optimizer is not None and math.isfinite(float(loss)):
                optimizer.step()
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            done = step + 1
            if config.checkpoint_dir is not None and config.checkpoint_every and done % config.checkpoint_every == 0:
                save_checkpoint(config.checkpoint_dir, mine, optimizer, done)
            if bar is not None:
                bar.advance(bar.task_ids[0])
    finally:
        if bar is not None:
            bar.stop()
        pipe.close()
    state = None
    if config.return_state:
        shares: list[Any] = [None] * world
        dist.all_gather_object(
            shares, {f"{s}.{n}": t.detach().clone() for s, m in mine.items() for n, t in m.state_dict().items()}
        )
        state = {k: v for share in shares for k, v in share.items()}
    if rank != 0:
        return None
    return TrainResult(
        config=config,
        reports=tuple(reports),
        losses=tuple(losses),
        tokens=tuple(tokens),
        max_grad_abs_diff=None if grad_diffs is None else grad_diffs[0],
        max_grad_rel_diff=None if grad_diffs is None else grad_diffs[1],
        resumed_from=first,
        skipped_steps=tuple(pipe.nonfinite_steps),
        state=state,
    )


def _progress(steps: int) -> Progress | None:
    """A progress bar over steps on rank 0's stderr, when that is a terminal."""
    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    bar = Progress(
        TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    )
    bar.add_task("steps", total=steps)
    bar.start()
    return bar


def _compare_gradients(
    pipe: Pipeline,
    modules: list[torch.nn.Module],
    reference: list[torch.nn.Module] | None,
    inputs: list[torch.Tensor],
    targets: list[torch.Tensor],
    config: TrainConfig,
) -> tuple[float, float] | None:
    """Rank 0 runs the same step on an unsplit copy and compares every gradient."""
    local = {
        (s, n): p.grad.detach().clone()
        for s in pipe.stages
        for n, p in modules[s].named_parameters()
        if p.grad is not None
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    if reference is None:
        return None
    model = torch.nn.Sequential(*reference)
    loss_fn = loss_fn_for(config.model.name)
    for x, y in zip(inputs, targets, strict=True):
        torch.autograd.backward(loss_fn(model(x), y) / len(inputs))
    worst_abs = worst_rel = 0.0
    for part in gathered:
        for (stage, name), grad in part.items():
            expected = dict(reference[stage].named_parameters())[name].grad
            assert expected is not None
            diff = (grad - expected).abs().max().item()
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / max(expected.abs().max().item(), 1e-12))
    return worst_abs, worst_rel


def predict_step_time(hint: Hint, report: StepReport, policy: Policy, slack: float = 0.0) -> float:
    """What the simulator predicts for a measured step.

    The step's measured task times are the sample; the expected costs (what
    ``ready`` plans with) are each stage's median over this step (the runtime
    plans each step from the previous step's medians).
    """
    if not report.records:
        raise ValueError(f"step {report.step}'s timeline was not kept; predict from a step that has its records")
    durations = np.zeros((hint.num_stages, hint.num_microbatches, 3))
    for _, task, start, end in report.records:
        durations[task.stage, task.mb, task.kind] = end - start
    medians = np.median(durations, axis=1)
    cost_model = CostModel.uniform(
        hint.num_stages,
        forward=medians[:, Kind.F].tolist(),
        backward=medians[:, Kind.B].tolist(),
        weight=medians[:, Kind.W].tolist(),
    )
    sample = Sample(durations, np.zeros_like(durations), 0.0)
    return Simulator(hint, cost_model).run(policy, sample, slack=slack).makespan


def profile_costs(config: TrainConfig, repeats: int = 5) -> EmulatedCosts:
    """Measure each stage's forward and backward on one reference micro-batch in
    this process (median of ``repeats`` after a warm-up): the costs ``--emulate`` sleeps.

    When the hint splits weight gradients off, the measured backward is shared
    equally between B and W.
    """
    torch.set_num_threads(1)
    stages = config.ranks * (config.chunks or (2 if config.hint == "zbv" else 1))
    modules = split_layers(build_layers(config.model), stages)
    inputs, _, counts = make_batch(
        config.model, 1, config.microbatch_size, SeqLenDist(config.seq_len.mean), 0, config.seed
    )
    forward, backward = [], []
    x: torch.Tensor = inputs[0]
    for module in modules:
        f_times, b_times = [], []
        for _ in range(repeats + 1):
            leaf = x.detach().requires_grad_(x.is_floating_point())
            start = time.perf_counter()
            out = module(leaf)
            middle = time.perf_counter()
            out.backward(torch.ones_like(out))
            end = time.perf_counter()
            f_times.append(middle - start)
            b_times.append(end - middle)
        forward.append(statistics.median(f_times[1:]))
        backward.append(statistics.median(b_times[1:]))
        x = out.detach()
    if config.split_backward:
        half = tuple(b / 2 for b in backward)
        return EmulatedCosts(tuple(forward), half, half, counts[0])
    return EmulatedCosts(tuple(forward), tuple(backward), (0.0,) * stages, counts[0])


__all__ = ["EmulatedCosts", "Policy", "TrainConfig", "TrainResult", "profile_costs", "train"]
