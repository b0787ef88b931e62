"""The GPU check's correctness part (checks 1 to 5): offload hooks against plain autograd, two ranks sharing the
GPU against the unsplit model, ``train --check-grads``, an injected NaN, a plan that offloads trained. Their rows
are :mod:`judge`'s."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import torch
from judge import (
    GRAD_TOLERANCE,
    judge_nan_abort,
    judge_offload_hooks,
    judge_offload_training,
    judge_shared_gpu,
    judge_train_grads,
    max_abs_diff,
)
from memory import offload_plans, offload_words
from report import Result
from sizes import CHECK_GRADS_REL, COMMAND_TIMEOUT_S, GROUP_TIMEOUT_S, REPO, Setup
from tables import SLACK, TIMEOUT_S, configure, mib
from torch import nn

from hintpipe.apps.models import SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.planner.plan import Plan
from hintpipe.planner.stagegen import host_copies, offload_hooks, resident
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline

# -- 1. offload hooks against plain autograd ----------------------------------------------------------------


def gradients(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().cpu() for n, p in module.named_parameters() if p.grad is not None}


def check_offload_hooks(setup: Setup, result: Result) -> None:
    device = configure(setup.device)
    sizes = setup.sizes
    torch.manual_seed(0)
    model = nn.Sequential(*build_layers(sizes.model)).to(device)
    inputs, targets, _ = make_batch(sizes.model, 1, sizes.microbatch_size, sizes.seq, 0)
    x, y = inputs[0].to(device), targets[0].to(device)
    torch.autograd.backward(lm_loss(model(x), y))
    plain = gradients(model)
    model.zero_grad(set_to_none=True)
    keep = resident(model)
    moved: list[torch.Tensor] = []
    if device.type == "cuda":  # the planner's own hooks: pinned host copies on a stream of their own
        pack, unpack = host_copies(device, keep)
    else:  # the same hooks with a plain host copy: what the CPU can check is which tensors go
        pack, unpack = offload_hooks(keep, lambda t: t.clone(), lambda copy: copy)

    def counting_pack(t: torch.Tensor) -> Any:
        packed = pack(t)
        if packed[0]:
            moved.append(t)
        return packed

    with torch.autograd.graph.saved_tensors_hooks(counting_pack, unpack):
        loss = lm_loss(model(x), y)
    sizes_moved = [t.numel() * t.element_size() for t in moved]
    parameters_moved = sum(t.untyped_storage().data_ptr() in keep for t in moved)
    moved.clear()  # the saved tensors' memory goes back to the allocator: the junk below may get it
    for _ in range(3):  # junk on the compute stream, before backward: a buffer reused too early is overwritten
        junk = [torch.full((max(1, n // 4),), float("nan"), device=device) for n in sizes_moved]
        del junk
    torch.autograd.backward(loss)
    got = gradients(model)
    result.judge(judge_offload_hooks(got, plain, len(sizes_moved), parameters_moved, setup.device))
    worst = max_abs_diff(got, plain)
    result.summary = (
        f"{len(sizes_moved)} saved tensors ({mib(sum(sizes_moved))} MiB) moved and back, {parameters_moved} of them "
        f"parameters; max |diff| against plain autograd {worst:.2e}."
    )
    result.notes.append(
        f"gpt-mini {sizes.model.layers} blocks, hidden {sizes.model.hidden}, one micro-batch of "
        f"{tuple(x.shape)} tokens; 3 rounds of NaN-filled junk of the moved tensors' sizes between forward and "
        + (
            "backward, on the compute stream, no synchronisation."
            if device.type == "cuda"
            else "backward. On CPU the copies are plain clones: the check shows which tensors go and that the "
            "hooks return them intact, not the streams."
        )
    )
    result.data = {"moved_bytes": sizes_moved, "parameters_moved": parameters_moved, "max_abs_diff": worst}


# -- 2. two ranks sharing the GPU, against the unsplit model -------------------------------------------------


def shared_gpu_rank(rank: int, world: int, setup: Setup) -> dict[str, Any]:
    """Per policy, two steps on the same data with the gradients zeroed between (``ready`` plans with the first
    step's costs, so the second runs ``ready``); the second step's gradients and what its report says."""
    configure(setup.device)
    sizes = setup.sizes
    inputs, targets, _ = make_batch(sizes.model, sizes.microbatches, sizes.microbatch_size, sizes.seq, 0)
    out: dict[str, Any] = {}
    for policy in ("fixed", "ready"):
        modules = split_layers(build_layers(sizes.model), world)
        with Pipeline(
            {rank: modules[rank]},
            loss_fn=lm_loss,
            microbatches=sizes.microbatches,
            policy=policy,
            slack_microbatches=SLACK,
            device=setup.device,
            transport="gloo",
            timeout=TIMEOUT_S,
        ) as pipe:
            for _ in range(2):
                modules[rank].zero_grad(set_to_none=True)
                pipe.step(inputs if rank == 0 else None, targets if rank == world - 1 else None)
            report = pipe.reports[-1]
            grads = {f"{rank}.{name}": grad for name, grad in gradients(modules[rank]).items()}
            out[policy] = {
                "grads": grads,
                "ran_as": report.policy.value,
                "transport": pipe.transport.value,
                "device_peak_bytes": report.device_peak_bytes,
                "allocated_over_counted": report.allocated_over_counted,
            }
    return out


def unsplit(
    model: nn.Module, inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], device: torch.device
) -> None:
    """The step on the unsplit ``model``: each micro-batch's loss divided by their count (the pipeline's)."""
    for x, y in zip(inputs, targets, strict=True):
        torch.autograd.backward(lm_loss(model(x.to(device)), y.to(device)) / len(inputs))


def check_shared_gpu(setup: Setup, result: Result) -> None:
    device = configure(setup.device)
    sizes = setup.sizes
    modules = split_layers(build_layers(sizes.model), 2)
    inputs, targets, _ = make_batch(sizes.model, sizes.microbatches, sizes.microbatch_size, sizes.seq, 0)
    whole = nn.Sequential(*modules).to(device)
    unsplit(whole, inputs, targets, device)
    expected = {f"{s}.{n}": g for s, m in enumerate(modules) for n, g in gradients(m).items()}
    per_rank = run_ranks(shared_gpu_rank, 2, setup, timeout=GROUP_TIMEOUT_S, device=setup.device)
    result.headers = ["policy", "ran as", "transport", "max abs diff", "allocator peak MiB", "allocated / counted"]
    result.left = 3
    for policy in ("fixed", "ready"):
        got = {k: v for r in per_rank for k, v in r[policy]["grads"].items()}
        ran_as = per_rank[0][policy]["ran_as"]
        result.judge(judge_shared_gpu(policy, ran_as, got, expected, setup.device))
        worst = max_abs_diff(got, expected)
        peaks = per_rank[0][policy]["device_peak_bytes"]
        ratios = per_rank[0][policy]["allocated_over_counted"]
        result.rows.append(
            [
                policy,
                ran_as,
                per_rank[0][policy]["transport"],
                f"{worst:.2e}",
                " / ".join(mib(p) for p in peaks) if min(peaks, default=-1) >= 0 else "- (CPU)",
                " / ".join(f"{r:.2f}" for r in ratios) if ratios and ratios[0] == ratios[0] else "- (CPU)",
            ]
        )
        result.data[policy] = {k: v for k, v in per_rank[0][policy].items() if k != "grads"} | {"max_abs_diff": worst}
    result.summary = (
        "Both policies' gradients " + ("equal" if result.passed else "do NOT all equal") + " the unsplit model's."
    )
    rtol, atol = GRAD_TOLERANCE[setup.device]
    result.notes += [
        f"gpt-mini {sizes.model.layers} blocks, hidden {sizes.model.hidden}, {sizes.microbatches} micro-batches "
        f"of {sizes.microbatch_size} sequences of lognormal lengths, hint 1f1b, 2 ranks on one {setup.device}; the "
        f"second of two steps compared (`ready` plans from the first); |diff| <= {atol:g} + {rtol:g} x |unsplit|.",
        "The allocator columns are rank 0's report of both ranks (`device_peak_bytes`, `allocated_over_counted`).",
    ]


# -- 3 and 4. the command line ------------------------------------------------------------------------------


def train_command(setup: Setup, *extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m hintpipe train`` on the check's model, 2 ranks, in a process of its own."""
    model = setup.sizes.model
    argv = [sys.executable, "-m", "hintpipe", "train", "--model", "gpt-mini", "--ranks", "2"]
    argv += ["--layers", str(model.layers), "--hidden", str(model.hidden), "--microbatches", "4"]
    seq = f"lognormal:{setup.sizes.seq.mean}:{setup.sizes.seq.sigma}"
    argv += ["--microbatch-size", str(setup.sizes.microbatch_size), "--seq-len-dist", seq]
    argv += ["--device", setup.device, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, cwd=REPO, check=False)


def check_train_grads(setup: Setup, result: Result) -> None:
    done = train_command(setup, "--steps", "2", "--check-grads", "--json")
    result.data = {"returncode": done.returncode, "stderr": done.stderr[-4000:]}
    limit = CHECK_GRADS_REL[setup.device]
    if done.returncode != 0:
        result.judge(judge_train_grads(done.returncode, None, [], limit))
        result.summary = f"exit status {done.returncode}: " + (done.stderr.strip().splitlines() or [""])[-1][:400]
        return
    out = json.loads(done.stdout)
    rel = out["max_grad_rel_diff"]
    result.judge(judge_train_grads(done.returncode, rel, out["losses"], limit))
    result.summary = (
        f"`train --device {setup.device} --check-grads`: max abs diff {out['max_grad_abs_diff']:.2e}, max rel diff "
        f"{rel if rel is None else format(rel, '.2e')} (at most {limit:g}); losses "
        f"{[round(v, 4) for v in out['losses']]}."
    )
    result.data |= {k: out.get(k) for k in ("max_grad_abs_diff", "max_grad_rel_diff", "losses", "transport")}


#: What the neighbour of the rank whose loss is NaN must say: the failing rank's own words.
NAN_WORDS = (
    "rank 0: PeerFailure: rank 0: rank 1 failed in step 1; it said: rank 1: the loss of micro-batch 0 in step 1 is "
    "nan; the step stops before the optimizer runs"
)


def check_nan_abort(setup: Setup, result: Result) -> None:
    done = train_command(setup, "--steps", "2", "--faults", "nan:1")
    result.data = {"returncode": done.returncode, "stderr": done.stderr[-4000:]}
    heard = NAN_WORDS in done.stderr
    result.judge(judge_nan_abort(done.returncode, done.stderr, NAN_WORDS))
    result.summary = (
        "The neighbour (rank 0) said the failing rank's words."
        if heard
        else f"exit status {done.returncode}; rank 0 did not say rank 1's words: "
        + " | ".join(done.stderr.strip().splitlines()[-3:])[:500]
    )
    result.notes.append(f"`train --device {setup.device} --faults nan:1`; expected on stderr: `{NAN_WORDS} ...`")


# -- 5. a plan that offloads, trained ------------------------------------------------------------------------


def offload_rank(rank: int, world: int, setup: Setup, planned: Plan) -> dict[str, Any]:
    """Step 0 of the plan's pipeline on the device: its gradients by the model's names, and its report."""
    configure(setup.device)
    sizes = setup.sizes
    inputs, targets, _ = make_batch(
        sizes.plan_model, sizes.microbatches, sizes.microbatch_size, SeqLenDist(sizes.plan_seq_len), 0
    )
    with Pipeline.from_plan(planned, loss_fn=lm_loss, policy="fixed", device=setup.device, transport="gloo") as pipe:
        loss = pipe.step(inputs if rank == 0 else None, targets if rank == world - 1 else None, broadcast_loss=True)
        grads = {n: g for module in pipe.modules.values() for n, g in gradients(module).items()}
        report = pipe.reports[-1]
        return {
            "grads": grads,
            "loss": None if loss is None else float(loss),
            "device_peak_bytes": report.device_peak_bytes,
            "allocated_over_counted": report.allocated_over_counted,
        }


def check_offload_training(setup: Setup, result: Result) -> None:
    device = configure(setup.device)
    sizes = setup.sizes
    model = nn.Sequential(*build_layers(sizes.plan_model)).to(device)
    inputs, targets, _ = make_batch(
        sizes.plan_model, sizes.microbatches, sizes.microbatch_size, SeqLenDist(sizes.plan_seq_len), 0
    )
    _, tight, chosen = offload_plans(model, inputs[0].to(device), 2, sizes.microbatches)
    unsplit(model, inputs, targets, device)
    expected = gradients(model)
    per_rank = run_ranks(offload_rank, 2, setup, tight, timeout=GROUP_TIMEOUT_S, device=setup.device)
    got = {k: v for r in per_rank for k, v in r["grads"].items()}
    offloaded = [len(s.offload) for s in tight.partition.stages]
    result.judge(judge_offload_training(offloaded, got, expected, setup.device))
    worst = max_abs_diff(got, expected)
    result.summary = (
        f"Offloaded nodes per stage {offloaded}; max |diff| against the unsplit model's gradients {worst:.2e}; "
        f"loss {per_rank[-1]['loss']:.4f}."
    )
    result.notes.append(
        f"gpt-mini {sizes.plan_model.layers} blocks, hidden {sizes.plan_model.hidden}, planned for 2 ranks: "
        f"{offload_words(chosen)}; {sizes.microbatches} micro-batches of {sizes.microbatch_size} x "
        f"{sizes.plan_seq_len} tokens, `Pipeline.from_plan` on the device (gloo transport), step 0's gradients by "
        "the model's own names."
    )
    result.data = {
        "chosen": chosen,
        "offloaded": offloaded,
        "max_abs_diff": worst,
        "device_peak_bytes": per_rank[0]["device_peak_bytes"],
        "allocated_over_counted": per_rank[0]["allocated_over_counted"],
    }
