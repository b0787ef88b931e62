"""The prepared GPU check: what a machine with one CUDA device answers, in order (sized for 5 minutes at most).

1. **Offload hooks against plain autograd**: a model's forward with its saved activations moved to pinned
   host memory (the planner's offload hooks), junk allocations on the device between forward and backward
   (a buffer the allocator handed out again before its copy finished would show in the gradients), against
   the same model without hooks; and no parameter moved.
2. **Two ranks sharing the GPU** (gloo transport, a GPU's tensors staged through pinned host buffers),
   policies ``fixed`` and ``ready``, every gradient against the unsplit model.
3. **``hintpipe train --device cuda --check-grads``**, the command line end to end.
4. **An injected NaN**: the last stage's rank stops, and its words must reach its neighbour.
5. **A plan that offloads, trained**: a plan under a budget that makes it offload, trained on the GPU by two
   ranks, gradients against the unsplit model.
6. **Throughput** of every hint, float32 and bf16, ``fixed`` and ``ready``, against the bound of its precision
   (both stages' compute in one process) and torch's ``Schedule1F1B`` (:mod:`tables`).
7. **Memory**: the planner's activation bytes against the allocator's, offload on and off (:mod:`tables`);
   every stage within ``MEMORY_BOUNDS``.
8-11. **Hugging Face models** (:mod:`hf_checks`): planned on either device and trained here against the
   unsplit model (float32 and bf16), predicted against measured stage times, GPT-2's throughput against the
   unsplit model in one process and torch's schedule, the largest micro-batch under a memory cap.
12. **bf16 10x slow: bf16 or the hint?** (:mod:`slow_bf16`): the issue's slow ``train`` run and its fast one,
   each also in the other precision.

Every check runs, whatever the ones before did, and judges rows: each row's figures against its stated bound,
PASS, FAIL, or SKIP with the reason where it cannot be measured here (:mod:`judge`, pure functions of the
figures). Each check writes its result to the output folder as it ends (``NN-name.md`` and ``.json``, and
``results.md`` / ``results.json`` so far); the last line printed names the first failing row (or says all
passed), and the exit status is 1 if any row failed. With ``--device cpu`` it runs end to end on a machine
without a GPU (only the CUDA calls go unexercised; timing rows skip), at smaller sizes. Run from anywhere::

    bash benchmarks/gpu/run.sh OUT_DIR [--device cuda|cpu] [--only 1,3]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hf_checks
import torch
from judge import (
    GRAD_TOLERANCE,
    MEMORY_BOUNDS,
    OFFLOAD_OFF_CUDA,
    judge_memory,
    judge_nan_abort,
    judge_offload_hooks,
    judge_offload_training,
    judge_shared_gpu,
    judge_slow_bf16,
    judge_throughput,
    judge_train_grads,
    max_abs_diff,
)
from report import Result, final_line, run_check, total_time, write_summary
from slow_bf16 import slow_bf16_table
from tables import (
    SLACK,
    TIMEOUT_S,
    Throughput,
    configure,
    memory_table,
    mib,
    offload_plans,
    offload_words,
    throughput_table,
)
from torch import nn

import hintpipe
from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.planner.plan import Plan
from hintpipe.planner.stagegen import host_copies, offload_hooks, resident
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[2]
#: A spawned group's limit: a collective or a transfer stuck this long fails instead of hanging the check.
GROUP_TIMEOUT_S = 90.0
#: A command line check's limit.
COMMAND_TIMEOUT_S = 180.0
#: ``train --check-grads``'s largest relative difference allowed (tests/test_train.py's on CPU).
CHECK_GRADS_REL = {"cpu": 1e-5, "cuda": 1e-4}


# -- sizes ----------------------------------------------------------------------------------------------

#: Check 12 on CUDA: the slow run's flags as the project's issue quotes them (``--device``, the hint, the policy,
#: the precision and the room are the check's), a few steps.
SLOW_TRAIN = (
    *("--model", "gpt-mini", "--layers", "4", "--hidden", "256", "--ranks", "2", "--microbatches", "8"),
    *("--seq-len-dist", "lognormal:128:0.5", "--steps", "4"),
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Model and run sizes per device: small for a dry run on a 2-core CPU beside a test suite, big enough on a
    GPU that the figures are not all launch overhead, and all of it within 5 minutes there."""

    model: ModelConfig  # checks 1, 2, 3-4 (its layers and hidden), 5
    microbatch_size: int
    seq: SeqLenDist
    plan_model: ModelConfig  # check 5 and the memory table
    plan_seq_len: int
    throughput: Throughput
    repeats: int
    slow_train: tuple[str, ...]  # check 12: ``hintpipe train``'s model and batch flags
    microbatches: int = 4


def sizes_for(device: str) -> Sizes:
    if device == "cuda":
        model = ModelConfig("gpt-mini", layers=4, hidden=256, heads=8, vocab=512, max_seq_len=257)
        plan_model = ModelConfig("gpt-mini", layers=8, hidden=256, heads=8, vocab=256, max_seq_len=257)
        throughput_model = ModelConfig("gpt-mini", layers=8, hidden=512, heads=8, vocab=1024, max_seq_len=513)
        throughput = Throughput(device, throughput_model, 8, 8, 256, 4)
        return Sizes(model, 4, SeqLenDist(128, 0.5), plan_model, 256, throughput, 5, SLOW_TRAIN)
    model = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=33)
    throughput_model = ModelConfig("gpt-mini", layers=2, hidden=32, heads=2, vocab=64, max_seq_len=65)
    throughput = Throughput(device, throughput_model, 4, 2, 32, 2)
    slow_train = (
        *("--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"),
        *("--microbatch-size", "2", "--seq-len-dist", "lognormal:16:0.5", "--steps", "2"),
    )
    return Sizes(model, 2, SeqLenDist(16, 0.5), model, 32, throughput, 2, slow_train)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every check (and every spawned rank) needs to know."""

    device: str  # "cuda" or "cpu"
    sizes: Sizes


Check = Callable[[Setup, Result], None]


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
            memory_slack=SLACK,
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


# -- 6 and 7. the tables ----------------------------------------------------------------------------------------


def check_throughput(setup: Setup, result: Result) -> None:
    table = throughput_table(setup.sizes.throughput, GROUP_TIMEOUT_S)
    result.table(table)
    result.judge(judge_throughput(*throughput_figures(table.data), setup.device))
    ran = "Every hintpipe run ran" if not table.failed else "A hintpipe run failed (its row says why)"
    result.summary = f"{ran}; {goal_words(table.data)}"


def throughput_figures(data: dict[str, Any]) -> tuple[dict[str, float | str], dict[str, float], float | str, list[str]]:
    """From the throughput table's JSON figures: each hintpipe run's median step (or why it did not run) and its
    bound's, torch's step on the same work (host-staged where it ran, as hintpipe's gloo stages; else as is), and
    the runs whose work that is (float32, fixed lengths)."""
    steps: dict[str, float | str] = {}
    bounds: dict[str, float] = {}
    torch_work = []
    torch_steps: dict[str, float | str] = {}
    for label in data["rows"]:
        row = data[label]
        step = row.get("step_s", row.get("error", "no figures"))
        runtime = row["run"]["runtime"]
        if runtime.startswith("torch"):
            torch_steps[runtime] = step
        if runtime != "hintpipe":
            continue
        steps[label] = step
        if "bound" in row:
            bounds[label] = data[row["bound"]]["step_s"]
        if row["run"]["precision"] == "fp32" and not row["run"]["variable"]:
            torch_work.append(label)
    torch_step = next(
        (s for s in (torch_steps.get("torch-host"), torch_steps.get("torch")) if isinstance(s, float)), None
    )
    shown = torch_step if torch_step is not None else "; ".join(str(s) for s in torch_steps.values()) or "not run"
    return steps, bounds, shown, torch_work


def goal_words(data: dict[str, Any]) -> str:
    """How the hintpipe runs on fixed lengths stand against the goal (within ``over_bound_goal`` of the bound)."""
    rows = [data[label] for label in data["rows"]]
    fixed = [
        row["over_bound"]
        for row in rows
        if row["run"]["runtime"] == "hintpipe" and not row["run"]["variable"] and "error" not in row
    ]
    goal = data["over_bound_goal"]
    if not fixed:
        return "no hintpipe run on fixed lengths to hold to the goal."
    within = sum(over <= goal for over in fixed)
    return (
        f"{within} of {len(fixed)} hintpipe runs on fixed lengths within +{goal:.0%} of their bound (over bound "
        f"{min(fixed):+.1%} to {max(fixed):+.1%}); the goal is not a pass condition."
    )


def check_memory(setup: Setup, result: Result) -> None:
    device = configure(setup.device)
    sizes = setup.sizes
    model = nn.Sequential(*build_layers(sizes.plan_model)).to(device)
    inputs, targets, _ = make_batch(sizes.plan_model, 1, sizes.microbatch_size, SeqLenDist(sizes.plan_seq_len), 0)
    table = memory_table(model, inputs[0].to(device), targets[0].to(device), sizes.microbatches, sizes.repeats)
    result.table(table)
    predicted, measured, offloaded = (table.data[k] for k in ("predicted", "measured", "offloaded"))
    cpu = setup.device != "cuda"
    stages = [
        (
            f"stage {i}, {plan}: held / predicted",
            predicted[plan][i],
            measured[plan][i]["held"],
            OFFLOAD_OFF_CUDA if cpu and offloaded[plan][i] else "",
        )
        for i in range(len(predicted["no budget"]))
        for plan in ("no budget", "budget")
    ]
    result.judge(judge_memory(stages))
    result.data["bounds"] = MEMORY_BOUNDS
    low, high = MEMORY_BOUNDS
    ratios = [held / max(p, 1.0) for _, p, held, why_not in stages if not why_not]
    result.summary = (
        f"Held / predicted activation bytes {min(ratios, default=0):.3f}-{max(ratios, default=0):.3f} per stage "
        f"(bound {low:g}-{high:g})."
    )


def check_hf_training(setup: Setup, result: Result) -> None:
    hf_checks.check_hf_training(setup.device, result, GROUP_TIMEOUT_S)


def check_stage_times(setup: Setup, result: Result) -> None:
    hf_checks.check_stage_times(setup.device, result)


def check_hf_throughput(setup: Setup, result: Result) -> None:
    hf_checks.check_hf_throughput(setup.device, result, GROUP_TIMEOUT_S)


def check_memory_cap(setup: Setup, result: Result) -> None:
    hf_checks.check_memory_cap(setup.device, result)


def check_slow_bf16(setup: Setup, result: Result) -> None:
    table = slow_bf16_table(setup.device, setup.sizes.slow_train)
    result.table(table)
    steps = {tuple(key.split()): step for key, step in table.data["steps"].items()}
    result.judge(judge_slow_bf16(steps, setup.device))
    result.summary = table.data["answer"] if not table.failed else "A run failed (its row says why)."


CHECKS: list[tuple[str, Check]] = [
    ("Offload hooks against plain autograd", check_offload_hooks),
    ("Two ranks sharing the GPU, against the unsplit model", check_shared_gpu),
    ("train --check-grads", check_train_grads),
    ("An injected NaN reaches the neighbour", check_nan_abort),
    ("A plan that offloads, trained", check_offload_training),
    ("Throughput against torch's Schedule1F1B", check_throughput),
    ("Memory: planned against measured", check_memory),
    ("Hugging Face models planned on either device, trained here", check_hf_training),
    ("Predicted against measured stage times", check_stage_times),
    ("Throughput of GPT-2 against the unsplit model", check_hf_throughput),
    ("The largest micro-batch under a memory cap", check_memory_cap),
    ("bf16 10x slow: bf16 or the hint?", check_slow_bf16),
]


# -- the whole check ------------------------------------------------------------------------------------------


def source_version() -> str:
    """The commit checked, and whether the tree had uncommitted changes (read only: ``--no-optional-locks``)."""
    git = ["git", "--no-optional-locks", "-C", str(Path(hintpipe.__file__).resolve().parent)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return commit.stdout.strip() + (" with uncommitted changes" if status.stdout.strip() else "")


def environment(device: str) -> dict[str, Any]:
    """What the results depend on."""
    cuda = device == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else "CPU",
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": f"{platform.system()} {platform.release()}",
        "cpus": len(os.sched_getaffinity(0)),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hintpipe": source_version(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the folder the results go to")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", default="", help="run these checks only, e.g. 1,3 (default: all, in order)")
    args = parser.parse_args(argv)
    known = {str(i) for i in range(1, len(CHECKS) + 1)}
    if args.only and not set(args.only.split(",")) <= known:
        parser.error(f"--only takes check numbers from 1 to {len(CHECKS)}, got {args.only!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        message = "gpu_check: --device cuda, but torch.cuda.is_available() is False here; use --device cpu"
        print(message, file=sys.stderr)
        return 2
    configure(args.device)
    setup = Setup(args.device, sizes_for(args.device))
    env = environment(args.device)
    shown = sys.argv[1:] if argv is None else list(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = {int(n) for n in args.only.split(",")} if args.only else set(range(1, len(CHECKS) + 1))
    results: list[Result] = []
    started = time.perf_counter()
    for number, (title, check) in enumerate(CHECKS, start=1):
        if number in chosen:
            results.append(run_check(number, title, check, setup, args.out))
            write_summary(args.out, env, shown, results)
    failed = [r.number for r in results if not r.passed]
    elapsed = time.perf_counter() - started
    whole = total_time(elapsed, args.device)
    write_summary(args.out, env, shown, results, whole)
    print(f"{len(results) - len(failed)} of {len(results)} checks passed in {elapsed:.0f} s; results: {args.out}")
    if failed:
        print(f"failed: {', '.join(map(str, failed))}", file=sys.stderr)
    print(final_line(results, whole), flush=True)
    return 1 if failed or whole.status == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
