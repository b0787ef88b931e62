"""Fault campaign: seeded random faults over a 30-step training run with checkpoints, resumed after each.

Every trial runs ``hintpipe train`` (gpt-mini: 4 blocks, hidden 128; 2 ranks,
8 micro-batches; ``fixed`` policy so that results are bitwise reproducible; a
checkpoint every 3 steps, 2 kept) as a user would, injects one fault, then resumes with ``--resume`` until the run
reaches step 30, and compares the final parameters with an uninterrupted run.

Faults, one per trial, drawn from the trial's seed:

- ``kill``: SIGKILL of a random rank at a random moment (start-up, a step, a save);
- ``corrupt``: the run stops at a random step; one random file of one random
  checkpoint is truncated, overwritten or removed (``manifest.json``
  included), or ``latest`` is emptied;
- ``sigterm``: SIGTERM to the launcher at a random moment (a preemption);
- ``savefail``: a random rank's save after a random checkpoint step fails as a full disk would.

Per trial it records: whether a run hung (did not end within ``--hang-after``
seconds; must never happen), whether the final parameters equal the
uninterrupted run's (a difference is a *silent mismatch*), and whether a
checkpoint that should have survived the fault was lost: after the fault, the
newest checkpoint that verifies must be at least as new as the newest one
that verified before it (before the corruption, the newest one not corrupted).

Run from the repository root::

    .venv/bin/python benchmarks/faults/faults.py [--trials 50] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from hintpipe.runtime.checkpoint.saving import find_checkpoint, load_merged
from hintpipe.runtime.errors import CheckpointError

STEPS = 30
EVERY = 3
KINDS = ("kill", "corrupt", "sigterm", "savefail")
TRAIN = [sys.executable, "-m", "hintpipe", "train", "--model", "gpt-mini", "--layers", "4", "--hidden", "128"]
TRAIN += ["--ranks", "2", "--microbatches", "8", "--policy", "fixed", "--timeout", "30", "--json"]
TRAIN += ["--checkpoint-every", str(EVERY), "--checkpoint-keep", "2"]


class Hang(Exception):
    """A run that did not end in time."""


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _start(folder: Path, steps: int = STEPS, *extra: str) -> subprocess.Popen[str]:
    argv = [*TRAIN, "--steps", str(steps), "--checkpoint-dir", str(folder), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(process: subprocess.Popen[str], hang_after: float) -> tuple[int, str]:
    """The exit status and the last line of stderr."""
    try:
        _, err = process.communicate(timeout=hang_after)
    except subprocess.TimeoutExpired:
        process.kill()
        for child in _children(process.pid):
            subprocess.run(["kill", "-9", str(child)], check=False)
        process.communicate()
        raise Hang from None
    lines = err.strip().splitlines()
    return process.returncode, lines[-1] if lines else ""


def _ranks(pid: int) -> list[int]:
    """The launcher's rank processes (not multiprocessing's resource tracker)."""
    found = []
    for child in _children(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in command:
            found.append(child)
    return found


def _signal(process: subprocess.Popen[str], kind: str, rng: random.Random, delay: float) -> str:
    """SIGKILL to a random rank (waiting for the ranks to exist), or SIGTERM to the launcher."""
    if kind == "sigterm":
        if process.poll() is not None:
            return "none (the run had ended)"
        process.send_signal(signal.SIGTERM)
        return f"SIGTERM to the launcher after {delay:.1f} s"
    deadline = time.monotonic() + 60.0
    while len(ranks := _ranks(process.pid)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.poll() is not None or not ranks:
        return "none (the run had ended)"
    victim = rng.randrange(len(ranks))
    subprocess.run(["kill", "-9", str(ranks[victim])], check=False)
    return f"SIGKILL of rank process {victim} after {delay:.1f} s"


def _newest_verified(folder: Path) -> int:
    try:
        found = find_checkpoint(folder)[0]
    except CheckpointError:
        return 0
    return 0 if found is None else int(found.name.removeprefix("step-"))


def _corrupt(folder: Path, rng: random.Random) -> tuple[str, int]:
    """Damage one random thing; returns what and the step of the damaged checkpoint (0: only ``latest``)."""
    folders = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step-") and "." not in p.name)
    if not folders or rng.random() < 0.1:
        (folder / "latest").write_text("")
        return "emptied latest", 0
    target = rng.choice(folders)
    path = rng.choice(sorted(p for p in target.iterdir() if p.is_file()))
    how = rng.choice(("truncated", "overwritten", "removed"))
    if how == "removed":
        path.unlink()
    elif how == "truncated":
        with path.open("r+b") as f:
            f.truncate(rng.randrange(path.stat().st_size))
    else:
        data = bytearray(path.read_bytes())
        start = rng.randrange(max(1, len(data) - 400))
        data[start : start + 400] = bytes(rng.randrange(256) for _ in range(len(data[start : start + 400])))
        path.write_bytes(bytes(data))
    return f"{how} {target.name}/{path.name}", int(target.name.removeprefix("step-"))


def trial(seed: int, work: Path, reference: dict[str, torch.Tensor], run_s: float, hang_after: float) -> dict[str, Any]:
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)] if seed < len(KINDS) else rng.choice(KINDS)
    folder = work / f"trial-{seed}"
    outcome: dict[str, Any] = {"seed": seed, "kind": kind, "hung": False, "lost": False}
    try:
        if kind == "corrupt":
            stop = rng.randrange(EVERY, STEPS)
            _finish(_start(folder, stop), hang_after)
            before_all = _newest_verified(folder)
            outcome["fault"], damaged = _corrupt(folder, rng)
            # What must survive: the newest checkpoint that was not damaged.
            survivors = [
                int(p.name.removeprefix("step-"))
                for p in folder.iterdir()
                if p.name.startswith("step-") and "." not in p.name and int(p.name.removeprefix("step-")) != damaged
            ]
            before = max([s for s in survivors if s <= before_all], default=0)
        else:
            extra, at = [], 0
            if kind == "savefail":
                at = rng.randrange(EVERY, STEPS + 1, EVERY)
                extra = ["--faults", f"savefail:{rng.randrange(2)}:{at - 1}"]
                outcome["fault"] = f"save of step {at} fails on rank {extra[1].split(':')[1]}"
            process = _start(folder, STEPS, *extra)
            if kind in ("kill", "sigterm"):
                delay = rng.uniform(0.0, run_s)
                time.sleep(delay)
                before = _newest_verified(folder)  # a save finishing right now only makes the check laxer
                outcome["fault"] = _signal(process, kind, rng, delay)
            else:
                before = at - EVERY if kind == "savefail" else 0
            outcome["exit"] = _finish(process, hang_after)[0]
        outcome["lost"] = _newest_verified(folder) < before
        resumes = 0
        while not (folder / f"step-{STEPS:08d}").is_dir() and resumes < 3:
            resumes += 1
            status, said = _finish(_start(folder, STEPS, "--resume"), hang_after)
            if status != 0 and "no usable checkpoint" in said:
                # Every checkpoint was damaged: refused in one line, as it must be; start afresh.
                outcome["refused"] = said
                shutil.rmtree(folder)
                _finish(_start(folder, STEPS), hang_after)
        outcome["resumes"] = resumes
        final = folder / f"step-{STEPS:08d}"
        state = load_merged(final) if final.is_dir() else None
        outcome["completed"] = state is not None
        outcome["equal"] = state is not None and all(torch.equal(state[k], reference[k]) for k in reference)
    except Hang:
        outcome["hung"] = True
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-after", type=float, default=180.0, metavar="S", help="a run longer than this hung")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as scratch:
        work = Path(scratch)
        began = time.monotonic()
        if _finish(_start(work / "reference"), args.hang_after)[0] != 0:
            raise SystemExit("the uninterrupted run failed")
        run_s = time.monotonic() - began
        reference = load_merged(work / "reference" / f"step-{STEPS:08d}")
        outcomes = []
        for seed in range(args.seed, args.seed + args.trials):
            outcome = trial(seed, work, reference, run_s, args.hang_after)
            outcomes.append(outcome)
            print(json.dumps(outcome), flush=True)
    kinds = Counter(o["kind"] for o in outcomes)
    summary = {
        "trials": len(outcomes),
        "by_kind": dict(kinds),
        "completed_equal": sum(o.get("equal", False) for o in outcomes),
        "hangs": sum(o["hung"] for o in outcomes),
        "silent_mismatches": sum(o.get("completed", False) and not o["equal"] for o in outcomes),
        "not_completed": sum(not o.get("completed", False) for o in outcomes),
        "checkpoints_lost": sum(o["lost"] for o in outcomes),
        "refused_no_valid_checkpoint": sum("refused" in o for o in outcomes),
        "resumes": sum(o.get("resumes", 0) for o in outcomes),
        "uninterrupted_run_s": round(run_s, 1),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "trials": outcomes}, indent=1))


if __name__ == "__main__":
    main()
