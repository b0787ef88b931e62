"""Training the built-in models with the runtime: what ``hintpipe train`` runs on each rank.

The parent (``hintpipe train``) builds a :class:`TrainConfig`, starts the ranks
(:func:`hintpipe.runtime.launch.run_ranks`) and gets rank 0's :class:`TrainResult`.
Every rank builds the same model from the seed, keeps its stages, and trains
with its own optimizer on its own parameters; the data of step ``k`` is the
same for every policy, so runs compare like for like.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.apps.batches import HELD_OUT_STEP as HELD_OUT_STEP
from hintpipe.apps.batches import REPLICA_SEED_STRIDE as REPLICA_SEED_STRIDE
from hintpipe.apps.batches import held_out_batches
from hintpipe.apps.batches import step_batch as step_batch
from hintpipe.apps.emulation import profile_costs
from hintpipe.apps.gradcheck import compare_gradients, compare_plan_gradients
from hintpipe.apps.lr_schedule import LrSchedule, lr_factor
from hintpipe.apps.metrics import tensorboard_writer, write_step
from hintpipe.apps.models import (
    build_layers,
    layer_bounds,
    lm_loss_sum,
    loss_fn_for,
    split_layers,
)
from hintpipe.apps.optimizer import build_optimizer
from hintpipe.apps.prediction import predict_step_time as predict_step_time
from hintpipe.apps.progress import eta, line_every, log_line, progress_bar
from hintpipe.apps.run_agreement import agree_on_run
from hintpipe.apps.run_model import Whole, run_description, share_measured, unsplit_model, unsplit_stages
from hintpipe.apps.run_profiles import record_profiles
from hintpipe.apps.run_record import RunRecord
from hintpipe.apps.run_result import Collected, train_result
from hintpipe.apps.step_ends import microbatch_ends
from hintpipe.apps.tensor_parallel import parallelize_stage
from hintpipe.apps.train_config import TrainConfig as TrainConfig
from hintpipe.apps.train_config import TrainResult as TrainResult
from hintpipe.device import rank_device
from hintpipe.dispatch.policy import Policy
from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
from hintpipe.runtime.checkpoint.folder_lock import FolderLock
from hintpipe.runtime.checkpoint.permissions import use as use_modes
from hintpipe.runtime.checkpoint.run_folder import check_not_foreign, check_writable
from hintpipe.runtime.checkpoint.stopping import StopRequest
from hintpipe.runtime.faults import failing_writer
from hintpipe.runtime.launch import run_ranks, under_torchrun
from hintpipe.runtime.loop.emulated import EmulatedCosts
from hintpipe.runtime.model_names import ModelNames
from hintpipe.runtime.parallel.mesh import build_mesh
from hintpipe.runtime.parts import Seams
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.schedule.microbatch_order import MicrobatchOrder


def train(config: TrainConfig) -> TrainResult | None:
    """Start the ranks, train, and return rank 0's result (``None`` on the
    other ranks of a ``torchrun`` launch).

    With a checkpoint folder, this process holds it (see [Note: one run per folder at a time] in
    :mod:`hintpipe.runtime.checkpoint.folder_lock`) from before the ranks start until they have all ended;
    under ``torchrun`` rank 0 holds it instead. Every checkpoint's manifest describes the model (see
    :mod:`hintpipe.apps.model_description`), described here once rather than on every rank (a Hugging Face
    model's description imports transformers, which the ranks otherwise never do).

    Raises:
        hintpipe.runtime.errors.RankFailure: with each failed rank's error.
        hintpipe.runtime.checkpoint.folder_lock.FolderInUse: another run holds the checkpoint folder (before any
            rank started).
    """
    folder = config.checkpoint.folder
    hold = folder is not None and not under_torchrun()
    use_modes(config.checkpoint.group_readable)  # see [Note: a run folder is its owner's]
    if folder is not None:
        check_writable(Path(folder), "checkpoint_dir")  # a mistyped parent is refused, as the CLI does
        check_not_foreign(Path(folder), "checkpoint_dir")  # before the lock writes there
    description = run_description(config) if folder is not None else None
    with FolderLock(folder or ".") if hold else contextlib.nullcontext():
        results = run_ranks(
            _train_rank,
            config.world,
            config,
            description,
            timeout=config.pipeline.timeout,
            device=str(config.pipeline.device),
        )
    # Rank 0's result (every rank's is None but its): in the launcher, or on rank 0 under torchrun, where each
    # rank returns its own so that one prints.
    result = results[int(os.environ.get("RANK", "0"))] if under_torchrun() else results[0]
    assert result is None or isinstance(result, TrainResult)
    return result


def _build_pipeline(
    rank: int, world: int, config: TrainConfig
) -> tuple[Pipeline, list[torch.nn.Module] | None, list[torch.nn.Module] | Whole | None]:
    """This rank's pipeline over the built-in model (cut evenly, or as a saved plan says), with the run's
    injection built in; every stage's module when the model was cut here; and, on rank 0 with
    ``check_grads``, an unsplit reference copy of them.

    The reference is copied before the pipeline exists: the pipeline moves this rank's stages to its device
    in place, and a copy taken after would be half there and half on the host.
    """
    hint = config.resolved_hint
    device = rank_device(config.pipeline.device, rank)
    dp, tp = config.parallelism.dp, config.parallelism.tp
    mesh = build_mesh(world, dp=dp, tp=tp, device=device) if dp * tp > 1 else None
    # The run's pipeline options as its config holds them (a new option reaches the pipeline without a list to
    # keep in step), with the mesh this rank builds; the hint resolved, unless the plan's.
    pipeline = dataclasses.replace(config.pipeline, mesh=mesh)
    seams = Seams(injection=config.injection)
    loss_fn = lm_loss_sum if config.formed else loss_fn_for(config.model)
    modules: list[torch.nn.Module] | None = None
    reference: list[torch.nn.Module] | Whole | None = None
    if config.plan is not None:
        reference = unsplit_model(config) if config.training.check_grads and rank == 0 else None
        pipe = Pipeline.from_plan(config.plan, loss_fn=loss_fn, config=pipeline, seams=seams)
    else:
        layers = build_layers(config.model)
        modules = split_layers(layers, hint.stages)
        # Named by layer, as the unsplit model's nn.Sequential names them: checkpoints then resume with
        # another stage count. Tensor-parallel layers hold q, k and v apart (the unsplit model's qkv): their
        # names are the layers' own.
        names = ModelNames.of_sequential(nn.Sequential(*layers), layer_bounds(len(layers), len(modules)))
        names = names if config.parallelism.tp == 1 else dataclasses.replace(names, keys=())
        if mesh is not None and config.parallelism.tp > 1:
            modules = [parallelize_stage(m, mesh["tp"], config.model.heads) for m in modules]
        # Before the pipeline places rank 0's stages: the unsplit model runs whole on one device.
        reference = unsplit_stages(config) if config.training.check_grads and rank == 0 else None
        pipeline = dataclasses.replace(pipeline, hint=hint)
        pipe = Pipeline.from_modules(modules, loss_fn=loss_fn, config=pipeline, seams=seams, names=names)
    # The stream each step's seed is drawn from, the same on every rank whatever built its stages (a checkpoint
    # puts its state back): see [Note: a task's random numbers] in hintpipe.runtime.loop.task_seeds.
    torch.manual_seed(config.training.seed)
    return pipe, modules, reference


def _train_rank(
    rank: int, world: int, config: TrainConfig, description: Mapping[str, Any] | None = None
) -> TrainResult | None:
    """What ``train`` runs on each rank: the run of ``config``, closed whatever happens (its mailboxes and
    threads stop, so that a process can go on to other work after a failed run). ``description``: the model's,
    for its checkpoints (None: described here)."""
    if config.parallelism.shared:
        config = share_measured(config)
    if under_torchrun():  # [Note: a run made apart]
        agree_on_run(config)
    pipe, modules, reference = _build_pipeline(rank, world, config)
    mine = dict(pipe.modules)
    params = list({id(p): p for module in mine.values() for p in module.parameters()}.values())
    optimizer = _optimizer(config, params)
    scheduler = _scheduler(config, optimizer)
    checkpoints = _checkpointer(config, pipe, optimizer, scheduler, description)
    first = 0
    run = Collected()
    bar = writer = None
    # Leaving `with pipe` on an error tells the neighbours at once (a graceful close would wait a whole timeout
    # for a rank that stopped); otherwise it closes gracefully.
    try:
        with pipe:
            if checkpoints is not None:
                first = _start_or_resume(config, checkpoints, rank)
            metrics, steps = config.metrics, config.training.steps
            bar = progress_bar(steps - first) if metrics.progress and rank == 0 else None
            run.first, run.started = first, time.perf_counter()
            run.every = line_every(metrics.log_every, steps - first, shown=metrics.progress, bar=bar)
            writer = tensorboard_writer(metrics.tensorboard) if metrics.tensorboard and rank == 0 else None
            with StopRequest() as stop:
                for step in range(first, steps):
                    _step(config, pipe, modules, reference, optimizer, step, run)
                    if scheduler is not None:
                        scheduler.step()
                    _after_step(config, pipe, step, run, bar, writer)
                    stopping = stop.agreed(step=step)
                    if checkpoints is not None:
                        checkpoints.after_step(step + 1, stopping=stopping, last=step + 1 == steps)
                    if bar is not None:
                        bar.advance(bar.task_ids[0])
                    if stopping:
                        break
    finally:
        if writer is not None:
            writer.close()
        if bar is not None:
            bar.stop()
        if checkpoints is not None:
            checkpoints.close()
    state = pipe.state_dict() if config.training.return_state else None
    if rank != 0:
        return None
    return train_result(config, pipe, run, first, state, stop.name, checkpoints)


def _start_or_resume(config: TrainConfig, checkpoints: Checkpointer, rank: int) -> int:
    """Start the run in its checkpoint folder, or resume the folder's; returns the step to start from. Rank 0
    keeps a planned run's profiles there (see [Note: a resume plans as its run did] in
    :mod:`hintpipe.apps.run_profiles`)."""
    first = checkpoints.resume() if config.checkpoint.resume else checkpoints.start(replace=config.checkpoint.replace)
    if rank == 0 and config.plan is not None:
        record_profiles(checkpoints.directory, config.plan)
    record = checkpoints.extra.get("state")
    note = record.note(first) if isinstance(record, RunRecord) else None
    if note is not None:  # said with the checkpoints' own notes
        checkpoints.skipped.append(note)
    return first


def _optimizer(config: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer | None:
    """The run's optimizer over this rank's parameters (None: it holds none)."""
    if not params:
        return None
    return build_optimizer(params, config.optimizer)


def _step_line(config: TrainConfig, step: int, run: Collected) -> str:
    """The step line for the step just run: the global batch's loss and tokens, the step's time, and (before
    the last step) the time the rest of the run will take."""
    seconds = run.reports[-1].makespan
    unit = f"{config.model.spec.unit}/s"
    left = config.training.steps - step - 1
    remaining = f", ETA {eta(time.perf_counter() - run.started, step + 1 - run.first, left)}" if left else ""
    return (
        f"step {step + 1}/{config.training.steps}: loss {run.losses[-1]:.4f}, {seconds * 1e3:.1f} ms, "
        f"{run.tokens[-1] / seconds:,.0f} {unit}{remaining}"
    )


def _after_step(config: TrainConfig, pipe: Pipeline, step: int, run: Collected, bar: Any, writer: Any) -> None:
    """What a user watches after a step: its log line, its TensorBoard points, and (every ``eval_every``
    steps and after the last) the held-out loss, on every rank (an evaluation is collective)."""
    rank0, done, steps = pipe.global_rank == 0, step + 1, config.training.steps
    if rank0 and run.every and (done % run.every == 0 or done == steps):
        log_line(bar, _step_line(config, step, run))
    if writer is not None:
        _write_metrics(writer, config, step, run)
    every = config.metrics.eval_every
    if every and (done % every == 0 or done == steps):
        run.evals.append((done, _held_out_loss(config, pipe)))
        if rank0 and run.every:
            log_line(bar, f"step {done}/{steps}: held-out loss {run.evals[-1][1]:.4f}")
        if writer is not None:
            writer.add_scalar("held_out_loss", run.evals[-1][1], step + 1)


def _write_metrics(writer: Any, config: TrainConfig, step: int, run: Collected) -> None:
    unit = f"{config.model.spec.unit}_per_s"
    rate = run.learning_rates[-1] if run.learning_rates else None
    norm = run.grad_norms[-1] if run.grad_norms else None
    write_step(writer, step + 1, run.reports[-1], run.losses[-1], run.tokens[-1], unit, rate, norm)


def _scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer | None) -> Any:
    """The run's learning-rate schedule on ``optimizer`` (None: a constant rate, or no parameters here)."""
    schedule = config.lr_schedule.kind
    if optimizer is None or schedule is LrSchedule.CONSTANT:
        return None
    steps, warmup = config.training.steps, config.lr_schedule.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(schedule, step, steps, warmup))


def _held_out_loss(config: TrainConfig, pipe: Pipeline) -> float:
    """The held-out loss (every rank): the mean over the held-out batches (:func:`held_out_batches`: a file
    corpus's held-out documents), forwards only."""
    losses = []
    for inputs, targets, counts in held_out_batches(config, pipe.layout.replica_of(pipe.global_rank)):
        divisor = float(sum(counts)) if config.formed else None
        loss = pipe.eval_step(inputs, targets, broadcast_loss=True, loss_divisor=divisor)
        assert loss is not None
        losses.append(float(loss))
    mean = sum(losses) / len(losses)
    if pipe.replica_group is not None:  # the mean over the replicas' held-out batches
        both = torch.tensor([mean / config.parallelism.dp], dtype=torch.float64)
        dist.all_reduce(both, group=pipe.replica_group)
        return float(both[0])
    return mean


def _checkpointer(
    config: TrainConfig,
    pipe: Pipeline,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any = None,
    description: Mapping[str, Any] | None = None,
) -> Checkpointer | None:
    """The run's checkpoints (None without a folder), each describing the built-in model (``description``, or
    described here), so that ``hintpipe export`` rebuilds it from the checkpoint alone."""
    if config.checkpoint.folder is None:
        return None
    checkpoints = Checkpointer(
        config.checkpoint.folder,
        pipe,
        optimizer,
        scheduler=scheduler,
        every=config.checkpoint.every,
        keep=config.checkpoint.keep,
        storage_writer=failing_writer(config.injection, pipe.global_rank),
        model_description=description if description is not None else run_description(config),
        # See [Note: a resume keeps the schedule] in hintpipe.apps.lr_schedule and [Note: a resume says when its
        # batches change] in hintpipe.apps.run_record.
        state=RunRecord.of(config),
        group_readable=config.checkpoint.group_readable,
    )
    return checkpoints


def _step(
    config: TrainConfig,
    pipe: Pipeline,
    modules: list[torch.nn.Module] | None,
    reference: list[torch.nn.Module] | Whole | None,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    run: Collected,
) -> None:
    """One training step: forward and backward through the pipeline, then the optimizer."""
    replica = pipe.layout.replica_of(pipe.global_rank)
    inputs, targets, counts = step_batch(config, step, replica)
    divisor = float(sum(counts)) if config.formed else None  # a summed loss over the step's own tokens
    front_then_back = config.pipeline.microbatch_order is MicrobatchOrder.FRONT_THEN_BACK
    ends = microbatch_ends(config.model.spec, inputs) if front_then_back else None
    loss = pipe.step(inputs, targets, broadcast_loss=True, loss_divisor=divisor, ends=ends)
    assert loss is not None
    samples = config.model.spec.unit == "samples"
    tokens = config.step_rows if samples else sum(counts)
    if pipe.replica_group is not None:  # the global batch's loss (the mean over replicas) and its tokens
        both = torch.tensor([float(loss) / config.parallelism.dp, float(tokens)], dtype=torch.float64)
        dist.all_reduce(both, group=pipe.replica_group)
        loss, tokens = both[0].to(loss.dtype), int(both[1])
    run.reports.append(pipe.reports[-1])
    run.losses.append(float(loss))
    run.tokens.append(tokens)
    if step == 0 and config.training.check_grads and config.plan is not None:
        every = [step_batch(config, step, r) for r in range(config.parallelism.dp)] if reference is not None else []
        assert reference is None or isinstance(reference, tuple)
        run.grad_diffs = compare_plan_gradients(
            pipe,
            None if reference is None else reference[0],
            [(x, y) for x, y, _ in every],
            lm_loss_sum if config.formed else loss_fn_for(config.model),
            {} if reference is None else reference[1],
            [float(sum(c)) for _, _, c in every] if config.formed else None,
        )
    elif step == 0 and config.training.check_grads and modules is not None:
        every = [step_batch(config, step, r) for r in range(config.parallelism.dp)] if reference is not None else []
        assert not isinstance(reference, tuple)
        run.grad_diffs = compare_gradients(
            pipe,
            modules,
            reference,
            [(x, y) for x, y, _ in every],
            config.model.name,
            lm_loss_sum if config.formed else None,
            [float(sum(c)) for _, _, c in every] if config.formed else None,
        )
    if config.optimizer.clip_grad_norm is not None:  # every rank: the norm is the whole model's
        run.grad_norms.append(float(pipe.clip_grad_norm(config.optimizer.clip_grad_norm)))
    if optimizer is not None:
        run.learning_rates.append(float(optimizer.param_groups[0]["lr"]))
    if optimizer is not None and math.isfinite(float(loss)):
        optimizer.step()
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)


__all__ = ["EmulatedCosts", "Policy", "TrainConfig", "TrainResult", "predict_step_time", "profile_costs", "train"]
