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
import datetime
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hf_checks
import hf_speed
import torch
from correctness import (
    check_nan_abort,
    check_offload_hooks,
    check_offload_training,
    check_shared_gpu,
    check_train_grads,
)
from judge import (
    MEMORY_BOUNDS,
    OFFLOAD_OFF_CUDA,
    judge_memory,
    judge_slow_bf16,
    judge_throughput,
)
from memory import memory_table
from report import Result, final_line, run_check, total_time, write_summary
from sizes import GROUP_TIMEOUT_S, Check, Setup, sizes_for
from slow_bf16 import slow_bf16_table
from tables import configure
from throughput import throughput_table
from torch import nn

import hintpipe
from hintpipe.apps.models import SeqLenDist, build_layers, make_batch

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
    hf_speed.check_hf_throughput(setup.device, result, GROUP_TIMEOUT_S)


def check_memory_cap(setup: Setup, result: Result) -> None:
    hf_speed.check_memory_cap(setup.device, result)


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
