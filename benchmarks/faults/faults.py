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
- ``savefail``: a random rank's save after a random checkpoint step fails as a full disk would;
- ``launcher``: SIGKILL of the launcher at a random moment, start-up included: no rank may go on;
- ``sighup``: SIGHUP to the launcher and its ranks (a dropped SSH session);
- ``fullfs``: the checkpoint folder on a real file system that fills up at a
  random save (a tmpfs sized between 0.3 and 2.8 checkpoints; where mounting is
  not allowed, a file-size limit, RLIMIT_FSIZE); the user then frees space
  and resumes;
- ``savestop``: SIGSTOP of a random rank while a save is under way (a frozen disk or machine);
- ``foreign``: the run stops at a random step; a fresh run (another seed)
  is started in its folder by mistake; then the first run is resumed;
- ``tworuns``: two fresh runs started at once (0-0.3 s apart) into one empty
  folder: one trains to the end, the other exits 2 in one line naming the
  holder; ``run.json`` and every step folder carry the winner's run; a
  ``--resume`` of the finished run is then accepted (nothing left, or it completes);
- ``resumeinto``: ``--resume`` while the same run is still going: refused in
  one line (exit 2); the running run ends equal to the uninterrupted one;
- ``forged``: the run stops at a random step; the newest checkpoint's
  ``.metadata`` is replaced by a pickle that would create a marker file
  (``os.system`` through ``__reduce__``), ``manifest.json`` and its digest
  recomputed so that it verifies: ``load_merged`` and ``--resume`` refuse it
  (or the resume falls back), the marker never appears; the user then removes
  that checkpoint and resumes;
- ``latestdir``: the run stops at a random step; ``latest`` is made a folder:
  the resume is refused at start in one line and nothing in the folder
  changes; the user then removes it and resumes;
- ``foreignstep``: the run stops at a random step; another run's step folder
  (a later step where there is one) is copied into its folder: after the
  resume to the end its files are unchanged;
- ``norunjson``: the run stops at a random step; ``run.json`` is deleted: the
  first ``--resume`` goes on from the newest verified checkpoint;
- ``agent``: the run under torchrun (``--standalone --nproc-per-node 2``);
  SIGKILL of torchrun's agent at a random moment: no rank left after 15 s, no
  checkpoint appears after the kill; then resumed (spawned ranks);
- ``badinput``: one of several bad command lines: exit 2, exactly one line on
  stderr, no rank started, no checkpoint folder made.
- ``symlink``: the run stops at a random step; a link to a file of the user's
  outside the folder is planted as ``latest.tmp``, ``run.lock``, ``run.json``,
  ``latest`` or a ``step-N.tmp`` the resume will write: ``--resume`` refuses
  it in one line naming it (exit 2), or goes on past a temporary one (removing
  it); the file outside is never changed; the user removes the link and resumes;
- ``tokenizer``: ``--tokenizer`` a folder whose ``tokenizer_config.json`` or
  ``config.json`` maps (``auto_map``) to a Python file of its own that would
  create a marker, with a small text ``--data`` file, stdin a ``y``, an open
  pipe no one writes or ``/dev/null``: exit 2 in one line, nothing on stdout,
  no question waited on, the marker never appears, nothing written;
- ``exportduring``: ``hintpipe export CK OUT`` 2-4 times, at random moments of
  a run saving (and pruning) every step: each export writes a model that
  builds and loads strictly, or refuses in one line; the run ends with exit 0;
- ``fifo``: the run stops at a random step; the newest checkpoint's index is
  forged to read one value from a FIFO in its folder (digests recomputed):
  ``--resume --timeout 20`` refuses it naming the FIFO (or falls back), never
  waits on it; the user removes that checkpoint and resumes;
- ``fulldisk``: a fresh run on a full tmpfs (0 to 64 KiB free: not even the
  lock, or the lock and no checkpoint): it ends naming the full disk (exit 2
  in one line at the start, or a save's one line), no traceback; the user
  frees space and runs the same command again.

Per trial it records: whether a run hung (did not end within ``--hang-after``
seconds; must never happen), whether the final parameters equal the
uninterrupted run's (a difference is a *silent mismatch*), whether a
checkpoint that should have survived the fault was lost (the newest
checkpoint that verifies afterwards is older than the newest one seen
verified while the run ran; for ``corrupt``, the newest one not corrupted;
for ``foreign``, any change to the folder), whether a process of the run was
left once its launcher had gone, and the seconds from the fault to the end of
every process of the run. The kinds of issue 38 and 51 also record whether their own
expected outcome (above) held, whether code ran from disk (the ``forged`` or
``tokenizer`` marker file appeared) and whether a refusal was other than one line.

Run from the repository root::

    python benchmarks/faults/faults.py [--trials 150] [--seed 0] [--kinds KIND ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hintpipe.runtime.checkpoint.manifest import Manifest, digests
from hintpipe.runtime.checkpoint.merged import load_merged
from hintpipe.runtime.checkpoint.saving import find_checkpoint
from hintpipe.runtime.errors import CheckpointError

STEPS = 30
EVERY = 3
TIMEOUT_S = 30
KINDS: tuple[str, ...] = ("kill", "corrupt", "sigterm", "savefail", "launcher", "sighup", "fullfs", "savestop")
KINDS += ("foreign", "tworuns", "resumeinto", "forged", "latestdir", "foreignstep", "norunjson", "agent", "badinput")
KINDS += ("symlink", "tokenizer", "exportduring", "fifo", "fulldisk")
UNTRAINED = ("badinput", "tokenizer")  # refused before anything ran: nothing to resume
LINKED = ("latest.tmp", "run.lock", "run.json", "step-N.tmp", "latest")  # where ``symlink`` plants its link
MODEL = ["--model", "gpt-mini", "--layers", "4", "--hidden", "128", "--ranks", "2", "--microbatches", "8"]
OPTIONS = [*MODEL, "--policy", "fixed", "--timeout", str(TIMEOUT_S), "--json"]
OPTIONS += ["--checkpoint-every", str(EVERY), "--checkpoint-keep", "2"]
TRAIN = [sys.executable, "-m", "hintpipe", "train", *OPTIONS]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


class Hang(Exception):
    """A run that did not end in time."""


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _descendants(pid: int) -> list[int]:
    found = _children(pid)
    return found + [d for child in found for d in _descendants(child)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _session(pid: int) -> list[int]:
    """The live processes of the session the launcher ``pid`` leads: it and its ranks."""
    found = subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found if _alive(int(p))]


def _start(
    folder: Path, steps: int = STEPS, *extra: str, limit: int | None = None, command: list[str] = TRAIN
) -> subprocess.Popen[str]:
    argv = [*command, "--steps", str(steps), "--checkpoint-dir", str(folder), *extra]

    def limited() -> None:
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=limited if limit is not None else None,
    )


def _finish(process: subprocess.Popen[str], hang_after: float) -> tuple[int, str]:
    """The exit status and the last line of stderr."""
    status, lines = _finish_lines(process, hang_after)
    return status, lines[-1] if lines else ""


def _finish_lines(process: subprocess.Popen[str], hang_after: float) -> tuple[int, list[str]]:
    """The exit status and every line of stderr."""
    try:
        _, err = process.communicate(timeout=hang_after)
    except subprocess.TimeoutExpired:
        for pid in _session(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.communicate()
        raise Hang from None
    return process.returncode, err.strip().splitlines()


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


def _wait_ranks(process: subprocess.Popen[str]) -> list[int]:
    deadline = time.monotonic() + 60.0
    while len(ranks := _ranks(process.pid)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return ranks if process.poll() is None else []


def _newest_verified(folder: Path) -> int:
    try:
        found = find_checkpoint(folder)[0]
    except (CheckpointError, OSError):
        return 0
    return 0 if found is None else int(found.name.removeprefix("step-"))


class Watch:
    """The newest checkpoint seen verified while a run ran (looked at whenever the folder's listing changes)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.newest, self._listing = folder, 0, ""

    def look(self) -> None:
        try:
            listing = " ".join(sorted(p.name for p in self.folder.iterdir()))
        except OSError:
            return
        if listing != self._listing:
            self._listing = listing
            self.newest = max(self.newest, _newest_verified(self.folder))

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.look()
            time.sleep(0.02)


def _ended_after(process: subprocess.Popen[str], since: float, hang_after: float) -> tuple[int, str, float, bool]:
    """Wait for the run; returns its exit status, last line, the seconds from ``since`` until every process of
    the run had ended, and whether one was left once the launcher had gone."""
    status, said = _finish(process, hang_after)
    left = False
    deadline = time.monotonic() + 10.0
    while _session(process.pid):
        if time.monotonic() > deadline:
            left = True
            for pid in _session(process.pid):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    return status, said, time.monotonic() - since, left


def _ended_lines(process: subprocess.Popen[str], hang_after: float) -> tuple[int, list[str], bool]:
    """Wait for the run; returns its exit status, every line of stderr, and whether a process of it was left."""
    status, lines = _finish_lines(process, hang_after)
    deadline = time.monotonic() + 10.0
    while _session(process.pid):
        if time.monotonic() > deadline:
            for pid in _session(process.pid):
                os.kill(pid, signal.SIGKILL)
            return status, lines, True
        time.sleep(0.02)
    return status, lines, False


def _expect(out: dict[str, Any], problems: list[str]) -> None:
    """Record whether a trial's own expected outcome held (and what did not)."""
    problems = [*out.get("problems", []), *problems]  # a trial checks in several places: none undoes another
    out["expected"] = not problems
    if problems:
        out["problems"] = problems


class _Planted:
    """A pickle that creates ``marker`` when loaded (``os.system`` through ``__reduce__``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def step_folders_of(folder: Path) -> list[Path]:
    """The finished step folders, newest first."""
    found = [p for p in folder.glob("step-*") if p.is_dir() and "." not in p.name]
    return sorted(found, key=lambda p: p.name, reverse=True)


def _finished_steps(folder: Path) -> list[str]:
    return [p.name for p in step_folders_of(folder)] if folder.is_dir() else []


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder``: a file's bytes, None for a folder."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


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


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _regular_with(path: Path, data: bytes) -> bool:
    """Whether ``path`` is still a regular file holding ``data``."""
    return path.is_file() and not path.is_symlink() and path.read_bytes() == data


def _hostile_tokenizer(folder: Path, marker: Path, file: str) -> None:
    """A tokenizer folder whose ``file`` maps (``auto_map``) to a Python file of its own that creates ``marker``
    when imported: in ``tokenizer_config.json``, AutoTokenizer's class; in ``config.json``, AutoConfig's."""
    folder.mkdir()
    ran = f"import os\nos.system('touch {marker}')\nimport transformers\n"
    said: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64}
    if file == "tokenizer_config.json":
        said |= {"tokenizer_class": "OwnTokenizer", "auto_map": {"AutoTokenizer": [None, "own.OwnTokenizer"]}}
        (folder / "own.py").write_text(ran + "class OwnTokenizer(transformers.PreTrainedTokenizerFast): ...\n")
    else:
        config = {"model_type": "own", "auto_map": {"AutoConfig": "own.OwnConfig"}}
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "own.py").write_text(ran + "class OwnConfig(transformers.PretrainedConfig): ...\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(said))


def _said(process: subprocess.Popen[str], hang_after: float) -> tuple[str, list[str]]:
    """A command's stdout and the lines of its stderr."""
    try:
        said, err = process.communicate(timeout=hang_after)
    except subprocess.TimeoutExpired:
        for pid in _session(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.communicate()
        raise Hang from None
    return said, err.strip().splitlines()


def _loads(out_dir: Path) -> list[str]:
    """What is wrong with an exported built-in model (nothing: it builds and loads, strictly, finite)."""
    from safetensors.torch import load_file

    from hintpipe.apps.models import ModelConfig, whole_model

    try:
        config = ModelConfig(**json.loads((out_dir / "hintpipe_model.json").read_text()))
        tensors = load_file(out_dir / "model.safetensors")
        whole_model(config)[0].load_state_dict(tensors, strict=True)
    except Exception as exc:  # whatever fails, the export did not load
        return [f"{out_dir.name} does not load: {type(exc).__name__}: {exc}"[:300]]
    return [] if all(bool(t.isfinite().all()) for t in tensors.values()) else [f"{out_dir.name}: a value not finite"]


def _forge_index(step: Path, rename: Callable[[str], str]) -> None:
    """Point the values of ``step``'s index at ``rename(file)``, its digests recomputed: it verifies."""
    from hintpipe.runtime.checkpoint.reading import read_metadata

    metadata = read_metadata(step)
    for info in metadata.storage_data.values():
        info.relative_path = rename(info.relative_path)
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    manifest = Manifest.read(step)
    files = {**manifest.files, ".metadata": digests([step / ".metadata"], step)[".metadata"]}
    Manifest(manifest.step, manifest.identity, files).write(step)


def _fill(path: Path, room: int) -> None:
    """Fill the file system of ``path`` with ``path``, then free ``room`` bytes."""
    with path.open("wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:  # full
            pass
    with path.open("r+b") as f:
        f.truncate(max(0, path.stat().st_size - room))


class Campaign:
    """What every trial shares: the scratch folder, the uninterrupted run, its length, the hang bound."""

    def __init__(self, work: Path, reference: dict[str, torch.Tensor], run_s: float, hang_after: float) -> None:
        self.work, self.reference, self.run_s, self.hang_after = work, reference, run_s, hang_after
        some = next((work / "reference").glob("step-*"))
        self.checkpoint_bytes = sum(p.stat().st_size for p in some.iterdir())
        self._foreign: tuple[Path, dict[str, bytes]] | None = None
        self._checks: list[Callable[[], list[str]]] = []
        self.can_mount = _mount(work / "probe", 1 << 20)
        if self.can_mount:
            _unmount(work / "probe")

    # -- faults while a run runs --------------------------------------------------------------------------

    def signalled(self, kind: str, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """kill, sigterm, launcher, sighup: a signal at a random moment; returns the newest checkpoint seen."""
        process = _start(folder)
        watch = Watch(folder)
        delay = rng.uniform(0.0, self.run_s)
        watch.sleep(delay)
        sent = time.monotonic()
        if process.poll() is not None:
            out["fault"] = "none (the run had ended)"
        elif kind == "kill":
            ranks = _wait_ranks(process)
            if ranks:
                victim = rng.randrange(len(ranks))
                os.kill(ranks[victim], signal.SIGKILL)
                out["fault"] = f"SIGKILL of rank process {victim} after {delay:.1f} s"
            else:
                out["fault"] = "none (the run had ended)"
        elif kind == "sigterm":
            process.send_signal(signal.SIGTERM)
            out["fault"] = f"SIGTERM to the launcher after {delay:.1f} s"
        elif kind == "sighup":
            os.killpg(process.pid, signal.SIGHUP)
            out["fault"] = f"SIGHUP to the launcher and its ranks after {delay:.1f} s"
        else:
            process.kill()
            out["fault"] = f"SIGKILL of the launcher after {delay:.1f} s"
        if kind == "launcher":
            process.wait()  # not communicate(): a rank left behind would hold the pipes open
            listing = sorted(p.name for p in folder.glob("step-*")) if folder.is_dir() else []
            left = True
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                if not _session(process.pid):
                    left = False
                    break
                time.sleep(0.02)
            out["end_s"] = round(time.monotonic() - sent, 2)
            out["left"] = left
            for pid in _session(process.pid):
                os.kill(pid, signal.SIGKILL)
            process.communicate()
            time.sleep(1.0)
            after = sorted(p.name for p in folder.glob("step-*")) if folder.is_dir() else []
            out["written_after"] = after != listing
            out["exit"] = process.returncode
        else:
            out["exit"], out["said"], end_s, out["left"] = _ended_after(process, sent, self.hang_after)
            out["end_s"] = round(end_s, 2)
        return watch.newest

    def savefail(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        at = rng.randrange(EVERY, STEPS + 1, EVERY)
        rank = rng.randrange(2)
        out["fault"] = f"save of step {at} fails on rank {rank}"
        process = _start(folder, STEPS, "--faults", f"savefail:{rank}:{at - 1}")
        out["exit"], out["said"], _, out["left"] = _ended_after(process, time.monotonic(), self.hang_after)
        return at - EVERY

    def fullfs(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        fraction = rng.uniform(0.3, 2.8)
        room = int(self.checkpoint_bytes * fraction) + 64 * 1024
        watch = Watch(folder)
        if self.can_mount:
            _mount(folder.parent, room)
            out["fault"] = f"a {room // 1024} KiB tmpfs ({fraction:.1f} checkpoints)"
            process = _start(folder)
        else:
            limit = int(self.checkpoint_bytes / 2 * fraction)  # a rank writes about half of a checkpoint
            out["fault"] = f"files limited to {limit // 1024} KiB (RLIMIT_FSIZE)"
            process = _start(folder, limit=limit)
        while process.poll() is None:
            watch.sleep(0.2)
        out["exit"], out["said"], _, out["left"] = _ended_after(process, time.monotonic(), self.hang_after)
        if self.can_mount:  # the user frees space: the folder moves to a disk with room
            kept = self.work / "moved"
            shutil.copytree(folder, kept)
            _unmount(folder.parent)
            shutil.rmtree(folder.parent, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(kept, folder)
        return watch.newest

    def savestop(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        which = rng.randrange(1, STEPS // EVERY + 1)  # the save to stop in
        rank = rng.randrange(2)
        process = _start(folder)
        watch = Watch(folder)
        saves = 0
        while process.poll() is None:
            temporary = list(folder.glob("step-*.tmp")) if folder.is_dir() else []
            if temporary:
                saves += 1
                if saves == which:
                    ranks = _wait_ranks(process)
                    if ranks:
                        os.kill(ranks[rank], signal.SIGSTOP)
                        out["fault"] = f"SIGSTOP of rank process {rank} in the save of {temporary[0].name}"
                    break
                while temporary[0].exists() and process.poll() is None:
                    time.sleep(0.005)
                watch.look()
            time.sleep(0.005)
        out.setdefault("fault", "none (the run had ended)")
        sent = time.monotonic()
        out["exit"], out["said"], end_s, out["left"] = _ended_after(process, sent, self.hang_after)
        out["end_s"] = round(end_s, 2)
        return watch.newest

    # -- mistakes between runs --------------------------------------------------------------------------------

    def corrupt(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        before_all = _newest_verified(folder)
        out["fault"], damaged = _corrupt(folder, rng)
        # What must survive: the newest checkpoint that was not damaged.
        survivors = [
            int(p.name.removeprefix("step-"))
            for p in folder.iterdir()
            if p.name.startswith("step-") and "." not in p.name and int(p.name.removeprefix("step-")) != damaged
        ]
        return max([s for s in survivors if s <= before_all], default=0)

    def foreign(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        before = _snapshot(folder)
        status, said = _finish(_start(folder, STEPS, "--seed", "1"), self.hang_after)
        out["fault"] = f"a fresh run (--seed 1) in the folder of a run stopped after step {stop}"
        out["exit"], out["said"] = status, said
        out["foreign_changed"] = _snapshot(folder) != before
        return _newest_verified(folder)

    # -- one run per folder, nothing from disk runs code (issue 38) --------------------------------------------

    def tworuns(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """Two fresh runs started at once into one empty folder: one trains, the other is refused in one line."""
        gap = rng.uniform(0.0, 0.3)
        first = _start(folder)
        time.sleep(gap)
        second = _start(folder)
        out["fault"] = f"two fresh runs into one empty folder, {gap:.2f} s apart"
        ended = [_ended_lines(p, self.hang_after) for p in (first, second)]
        out["exit"] = [status for status, _, _ in ended]
        out["left"] = any(left for _, _, left in ended)
        problems = []
        if sorted(out["exit"]) != [0, 2]:
            problems.append(f"exit statuses {out['exit']}, not one 0 and one 2")
        else:
            refused = next(lines for status, lines, _ in ended if status == 2)
            out["said"] = refused[-1] if refused else ""
            if len(refused) != 1 or "is in use by another run" not in refused[0] or "pid" not in refused[0]:
                problems.append(f"the refusal is not one line naming the holder: {refused}")
        run = json.loads((folder / "run.json").read_text())["run"] if (folder / "run.json").is_file() else None
        steps = sorted(p for p in folder.glob("step-*") if "." not in p.name)
        others = [p.name for p in steps if Manifest.read(p).identity.run != run]
        if run is None or others:
            problems.append(f"run.json's run {run}, step folders of another run: {others}")
        status, lines = _finish_lines(_start(folder, STEPS, "--resume"), self.hang_after)
        if status != 0 and not (status == 2 and len(lines) == 1 and "nothing left" in lines[0]):
            problems.append(f"--resume of the finished run: exit {status}, {lines[-1:] or 'nothing said'}")
        _expect(out, problems)
        return _newest_verified(folder)

    def resumeinto(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """``--resume`` while the same run is still going: refused in one line; the run goes on undisturbed."""
        process = _start(folder)
        watch = Watch(folder)
        while not (folder / "run.json").is_file() and process.poll() is None:  # the run holds its folder
            watch.sleep(0.05)
        delay = rng.uniform(0.0, self.run_s * 0.4)
        watch.sleep(delay)
        going = process.poll() is None
        status, lines = _finish_lines(_start(folder, STEPS, "--resume"), self.hang_after)
        out["fault"] = f"--resume {delay:.1f} s after the run claimed its folder" + ("" if going else " (it had ended)")
        out["resume_exit"], out["said"] = status, lines[-1] if lines else ""
        out["exit"], _, _, out["left"] = _ended_after(process, time.monotonic(), self.hang_after)
        problems = []
        refused = status == 2 and len(lines) == 1 and "is in use by another run" in lines[0]
        if going and not refused and not (status in (0, 2) and process.poll() is not None):
            problems.append(f"--resume of a running run: exit {status}, {lines[-3:]}")
        if out["exit"] != 0:
            problems.append(f"the running run ended with exit {out['exit']}")
        _expect(out, problems)
        return watch.newest

    def forged(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """The newest checkpoint's ``.metadata`` replaced by a pickle that runs a command, its digests
        recomputed: ``load_merged`` and ``--resume`` refuse it and nothing runs."""
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        newest = step_folders_of(folder)[0]
        marker = folder.parent / "code-ran"
        out["marker"] = str(marker)
        (newest / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))
        manifest = Manifest.read(newest)
        files = {**manifest.files, ".metadata": digests([newest / ".metadata"], newest)[".metadata"]}
        Manifest(manifest.step, manifest.identity, files).write(newest)  # it verifies
        out["fault"] = f"forged {newest.name}/.metadata (run stopped after step {stop})"
        problems = []
        try:
            load_merged(newest)
            problems.append("load_merged read the forged checkpoint")
        except CheckpointError as exc:
            out["load_merged"] = str(exc)
        status, lines = _finish_lines(_start(folder, STEPS, "--resume"), self.hang_after)
        out["exit"], out["said"] = status, lines[-1] if lines else ""
        if status == 0:
            out["fell_back"] = True  # went on from an older checkpoint; the forged one must not be the final's
        elif "refused unread" not in out["said"]:
            problems.append(f"--resume: exit {status}, not refused by name: {out['said']}")
        else:  # the user removes the forged checkpoint, and resumes from the one before
            shutil.rmtree(newest)
        out["code_ran"] = marker.exists()
        _expect(out, problems)
        return _newest_verified(folder)

    def latestdir(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """``latest`` made a folder: the resume is refused at start in one line and nothing changes."""
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        newest = _newest_verified(folder)
        (folder / "latest").unlink()
        (folder / "latest").mkdir()
        out["fault"] = f"latest made a folder (run stopped after step {stop})"
        before = _tree(folder)
        process = _start(folder, STEPS, "--resume")
        status, lines, out["left"] = _ended_lines(process, self.hang_after)
        out["exit"], out["said"] = status, lines[-1] if lines else ""
        problems = []
        if status != 2 or len(lines) != 1:
            problems.append(f"exit {status}, {len(lines)} lines: {lines[-3:]}")
        if _tree(folder) != before:
            problems.append("the folder changed")
        _expect(out, problems)
        (folder / "latest").rmdir()  # what the refusal says to do
        return newest

    def foreignstep(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """Another run's step folder copied into the run's folder: never overwritten, never pruned."""
        stop = rng.randrange(EVERY, STEPS - EVERY)
        _finish(_start(folder, stop), self.hang_after)
        newest = _newest_verified(folder)
        other = self._other_run()
        free = [s for s in range(EVERY, STEPS, EVERY) if not (folder / f"step-{s:08d}").exists()]
        later = [s for s in free if s > stop]
        at = rng.choice(later or free)
        name = f"step-{at:08d}"
        shutil.copytree(other / name, folder / name)
        out["fault"] = f"another run's {name} copied in (run stopped after step {stop})"
        out["foreign_step"] = at
        self._foreign = (folder / name, _snapshot(other / name))
        return newest

    def _other_run(self) -> Path:
        """Another run's folder (``--seed 1``) with every checkpoint kept; made once."""
        other = self.work / "other-run"
        if not other.is_dir():
            keep = str(STEPS // EVERY)
            _finish(_start(other, STEPS - EVERY, "--seed", "1", "--checkpoint-keep", keep), self.hang_after)
        return other

    def norunjson(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """``run.json`` deleted after a stop: ``--resume`` goes on from the newest verified checkpoint."""
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        (folder / "run.json").unlink()
        out["fault"] = f"run.json deleted (run stopped after step {stop})"
        out["first_resume_must_work"] = True
        return _newest_verified(folder)

    def agent(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """SIGKILL to torchrun's agent at a random moment: no rank goes on, no checkpoint appears after."""
        if importlib.util.find_spec("torch.distributed.run") is None:
            out["fault"] = "none (torchrun is not available)"
            return 0
        process = _start(folder, command=[*TORCHRUN, "-m", "hintpipe", "train", *OPTIONS])
        watch = Watch(folder)
        delay = rng.uniform(0.1, 0.8) * self.run_s  # torchrun starts sooner than the spawning launcher
        watch.sleep(delay)
        if process.poll() is not None:
            out["fault"] = "none (the run had ended)"
            out["exit"], out["said"] = _finish(process, self.hang_after)
            return watch.newest
        ranks = _descendants(process.pid)  # torchrun starts each worker in a session of its own
        process.kill()
        killed = time.monotonic()
        process.wait()
        out["fault"] = f"SIGKILL of torchrun's agent after {delay:.1f} s ({len(ranks)} workers)"
        listing = _finished_steps(folder)
        appeared: dict[str, float] = {}
        while any(_alive(pid) for pid in ranks) and time.monotonic() < killed + 15.0:
            for name in set(_finished_steps(folder)) - set(listing) - set(appeared):
                appeared[name] = round(time.monotonic() - killed, 2)
            time.sleep(0.01)
        out["end_s"] = round(time.monotonic() - killed, 2)
        out["left"] = any(_alive(pid) for pid in ranks)
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.communicate()
        time.sleep(1.0)
        for name in set(_finished_steps(folder)) - set(listing) - set(appeared):
            appeared[name] = -1.0  # after every worker had ended
        out["written_after"] = bool(appeared)  # a checkpoint appeared after the kill
        if appeared:
            out["appeared_s_after_kill"] = appeared
        problems = [f"{name} appeared {s} s after the kill" for name, s in sorted(appeared.items())]
        _expect(out, problems + (["a worker outlived the agent by 15 s"] if out["left"] else []))
        return watch.newest

    def badinput(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """A bad command line: exit 2, exactly one line on stderr, no rank started, nothing written."""
        plan = folder.parent / "plan.pt"
        torch.save({"format": "hintpipe-plan/2", "model": {"config": {"name": "gpt-mini"}}, "plan": {}}, plan)
        blocker = folder.parent / "a-file"
        blocker.write_text("")
        cases = {
            "--activation-budget 1B": [*TRAIN, "--checkpoint-dir", str(folder), "--activation-budget", "1B"],
            "--layers 2 --ranks 5": [*TRAIN, "--checkpoint-dir", str(folder), "--layers", "2", "--ranks", "5"],
            "a plan file with wrong fields": [*TRAIN[:4], "--plan", str(plan), "--steps", "1"],
            "--checkpoint-dir under a file": [*TRAIN, "--checkpoint-dir", str(blocker / "ck")],
            "--checkpoint-keep 0": [*TRAIN, "--checkpoint-dir", str(folder), "--checkpoint-keep", "0"],
            "--faults crash:1:99": [*TRAIN, "--checkpoint-dir", str(folder), "--steps", "5", "--faults", "crash:1:99"],
            "--timeout 0": [*TRAIN, "--checkpoint-dir", str(folder), "--timeout", "0"],
        }
        what = rng.choice(sorted(cases))
        out["fault"] = what
        process = subprocess.Popen(
            cases[what], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        started = False
        while process.poll() is None:
            started = started or bool(_ranks(process.pid))
            time.sleep(0.01)
        status, lines, out["left"] = _ended_lines(process, self.hang_after)
        out["exit"], out["said"] = status, lines[-1] if lines else ""
        out["one_line"] = status == 2 and len(lines) == 1 and not started and not folder.exists()
        if not out["one_line"]:
            out["lines"] = lines[-5:]
            out["ranks_started"] = started
        return 0

    # -- links, a tokenizer's code, readers, FIFOs, a full disk at the start (issue 51) ----------------------------

    def symlink(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """A link planted in the run folder, to a file of the user's outside it: ``--resume`` refuses it in one
        line naming it, or goes on past a temporary one; the file it points to is never changed."""
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        name = rng.choice(LINKED)
        if name == "step-N.tmp":  # a checkpoint the resume will write
            name = f"step-{rng.randrange((stop // EVERY + 1) * EVERY, STEPS + 1, EVERY):08d}.tmp"
        outside = folder.parent / "users-file.txt"
        data = f"a file of the user's, not the run's ({rng.random()})\n".encode()
        outside.write_bytes(data)
        link = folder / name
        if link.is_file():
            link.unlink()
        link.symlink_to(outside)
        out["fault"] = f"{name} a link to a file outside the folder (run stopped after step {stop})"
        self._checks.append(lambda: [] if _regular_with(outside, data) else [f"the file {name} pointed to changed"])
        status, lines, out["left"] = _ended_lines(_start(folder, STEPS, "--resume"), self.hang_after)
        out["exit"], out["said"] = status, lines[-1] if lines else ""
        problems = []
        if status == 2:
            out["one_line"] = len(lines) == 1 and f"{name} is a link" in lines[0]
            if not out["one_line"]:
                problems.append(f"refused, not in one line naming {name}: {lines[-3:]}")
            link.unlink()  # what the refusal says to do
        elif status == 0 and name.endswith(".tmp"):
            out["went_on"] = True
            if link.is_symlink():
                problems.append(f"{name} still a link after the resume went on")
        else:
            problems.append(f"--resume: exit {status}, {lines[-3:]}")
        if not _regular_with(outside, data):
            problems.append(f"the file {name} pointed to changed")
        _expect(out, problems)
        return _newest_verified(folder)

    def tokenizer(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """``--tokenizer`` a folder whose config maps to its own Python file: refused in one line at once (nothing
        on stdout, no question asked, stdin unread), the file never runs."""
        tokenizer, marker = folder.parent / "tokenizer", folder.parent / "code-ran"
        out["marker"] = str(marker)
        _hostile_tokenizer(tokenizer, marker, file := rng.choice(("tokenizer_config.json", "config.json")))
        text = folder.parent / "text.txt"
        text.write_text("\n\n".join(f"document {i}: " + "the cat sat on the mat " * (i % 5 + 1) for i in range(40)))
        stdin = rng.choice(("y", "an open pipe no one writes", "/dev/null"))
        out["fault"] = f"--tokenizer a folder whose {file} has an auto_map; stdin {stdin}"
        argv = [*TRAIN, "--steps", "2", "--checkpoint-dir", str(folder), "--data", str(text)]
        reading, writing = os.pipe()
        began = time.monotonic()
        with open(os.devnull) as null:
            process = subprocess.Popen(
                [*argv, "--tokenizer", str(tokenizer)],
                stdin=null if stdin == "/dev/null" else reading,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        os.close(reading)
        if stdin == "y":
            os.write(writing, b"y\n")
        try:
            said, err = process.communicate(timeout=self.hang_after)
        except subprocess.TimeoutExpired:
            for pid in _session(process.pid):
                os.kill(pid, signal.SIGKILL)
            process.communicate()
            raise Hang from None
        finally:
            os.close(writing)
        out["refused_s"] = round(time.monotonic() - began, 2)
        lines = err.strip().splitlines()
        out["exit"], out["said"] = process.returncode, lines[-1] if lines else ""
        out["one_line"] = process.returncode == 2 and len(lines) == 1 and "auto_map" in lines[0]
        problems = [] if out["one_line"] else [f"exit {process.returncode}, {len(lines)} lines: {lines[-3:]}"]
        if said:
            problems.append(f"stdout: {said[-200:]!r}")
        if folder.exists():
            problems.append("the checkpoint folder was made")
        if out["refused_s"] >= 60.0:  # transformers' question (on stdout) waited 15 s; start-up is seconds on 2 cores
            problems.append(f"refused only after {out['refused_s']} s")
        _expect(out, problems)
        return 0

    def exportduring(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """``hintpipe export`` at random moments of a run that saves and prunes every step: each export writes
        a model that loads, or refuses in one line; the run ends normally."""
        process = _start(folder, STEPS, "--checkpoint-every", "1")
        watch = Watch(folder)
        began, problems, exports = time.monotonic(), [], []
        moments = sorted(rng.uniform(0.2, 1.0) * self.run_s for _ in range(rng.randint(2, 4)))  # mostly saving
        for i, at in enumerate(moments):
            watch.sleep(max(0.0, began + at - time.monotonic()))
            if process.poll() is not None:
                break
            target = folder.parent / f"export-{i}"
            exporting = subprocess.Popen(
                [sys.executable, "-m", "hintpipe", "export", str(folder), str(target), "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            said, lines = _said(exporting, self.hang_after)
            step = json.loads(said)["step"] if exporting.returncode == 0 else None
            exports.append({"at_s": round(at, 1), "exit": exporting.returncode, "step": step, "said": lines[-1:]})
            if exporting.returncode == 0:
                problems += _loads(target)
            elif exporting.returncode != 2 or len(lines) != 1:
                problems.append(f"export {i}: exit {exporting.returncode}, {len(lines)} lines: {lines[-3:]}")
        out["fault"] = f"{len(exports)} exports while the run saves every step"
        out["exports"] = exports
        out["exit"], out["said"], _, out["left"] = _ended_after(process, time.monotonic(), self.hang_after)
        if out["exit"] != 0:
            problems.append(f"the run ended with exit {out['exit']}: {out['said']}")
        _expect(out, problems)
        return watch.newest

    def fifo(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """The newest checkpoint's index forged to read one value from a FIFO, its digests recomputed:
        ``--resume --timeout 20`` refuses it in one line (or falls back), never waits on the FIFO."""
        stop = rng.randrange(EVERY, STEPS)
        _finish(_start(folder, stop), self.hang_after)
        newest = step_folders_of(folder)[0]
        victim = rng.choice(sorted(p.name for p in newest.glob("*.distcp")))
        os.mkfifo(newest / "pipe.distcp")
        _forge_index(newest, lambda name: "pipe.distcp" if name == victim else name)
        out["fault"] = f"{newest.name}/.metadata names a FIFO for {victim} (run stopped after step {stop})"
        began = time.monotonic()
        status, lines, out["left"] = _ended_lines(_start(folder, STEPS, "--resume", "--timeout", "20"), self.hang_after)
        out["refused_s"] = round(time.monotonic() - began, 2)
        out["exit"], out["said"], out["stderr_lines"] = status, lines[-1] if lines else "", len(lines)
        problems = []
        if status == 0:
            out["fell_back"] = True
        else:
            out["one_line"] = "which is a FIFO, not a file" in out["said"] and not any("Traceback" in x for x in lines)
            if not out["one_line"]:
                problems.append(f"--resume: exit {status}, not refused naming the FIFO: {lines[-3:]}")
            shutil.rmtree(newest)  # the user removes the forged checkpoint, and resumes from the one before
        _expect(out, problems)
        return _newest_verified(folder)

    def fulldisk(self, folder: Path, rng: random.Random, out: dict[str, Any]) -> int:
        """A fresh run on a file system with no room, or a few pages: not even the lock, or the lock and no
        checkpoint: ended in one line naming the full disk; the user frees space and starts again."""
        if not self.can_mount:
            out["fault"] = "none (no tmpfs can be mounted here)"
            return 0
        _mount(folder.parent, 1 << 20)
        room = rng.choice((0, 0, 1, 2, 4, 16)) * 4096
        _fill(folder.parent / "filler", room)
        out["fault"] = f"a full tmpfs with {room // 1024} KiB free"
        status, lines, out["left"] = _ended_lines(_start(folder), self.hang_after)
        out["exit"], out["said"], out["stderr_lines"] = status, lines[-1] if lines else "", len(lines)
        full = "No space left on device" in out["said"] and not any("Traceback" in x for x in lines)
        out["one_line"] = full and (status != 2 or len(lines) == 1)
        _expect(out, [] if out["one_line"] and status in (1, 2) else [f"exit {status}: {lines[-3:]}"])
        kept = self.work / "moved"  # the user frees space: the folder moves to a disk with room
        if folder.exists():
            shutil.copytree(folder, kept, symlinks=True)
        _unmount(folder.parent)
        shutil.rmtree(folder.parent, ignore_errors=True)
        folder.parent.mkdir(parents=True)
        if kept.exists():
            shutil.move(kept, folder)
        out["restarted"] = True  # nothing was saved: the same command again, not --resume
        return 0

    # -- a trial ------------------------------------------------------------------------------------------------

    def trial(self, seed: int, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
        rng = random.Random(seed)
        kind = kinds[seed % len(kinds)] if seed < len(kinds) else rng.choice(kinds)
        folder = self.work / f"trial-{seed}" / "ck"
        folder.parent.mkdir(parents=True)
        out: dict[str, Any] = {"seed": seed, "kind": kind, "hung": False, "lost": False}
        faults: dict[str, Callable[[Path, random.Random, dict[str, Any]], int]] = {
            "corrupt": self.corrupt,
            "savefail": self.savefail,
            "fullfs": self.fullfs,
            "savestop": self.savestop,
            "foreign": self.foreign,
            "tworuns": self.tworuns,
            "resumeinto": self.resumeinto,
            "forged": self.forged,
            "latestdir": self.latestdir,
            "foreignstep": self.foreignstep,
            "norunjson": self.norunjson,
            "agent": self.agent,
            "badinput": self.badinput,
            "symlink": self.symlink,
            "tokenizer": self.tokenizer,
            "exportduring": self.exportduring,
            "fifo": self.fifo,
            "fulldisk": self.fulldisk,
        }
        self._foreign, self._checks = None, []
        try:
            before = faults.get(kind, functools.partial(self.signalled, kind))(folder, rng, out)
            if kind in UNTRAINED:
                return out  # nothing ran: nothing to resume
            if out.pop("restarted", False):  # nothing was saved: the same command again
                out["restart_exit"] = _finish(_start(folder), self.hang_after)[0]
            out["lost"] = _newest_verified(folder) < before or out.get("foreign_changed", False)
            out["resumes"] = self._resume(folder, out)
            final = folder / f"step-{STEPS:08d}"
            state = load_merged(final) if final.is_dir() else None
            out["completed"] = state is not None
            out["equal"] = state is not None and all(torch.equal(state[k], self.reference[k]) for k in self.reference)
            if out.pop("first_resume_must_work", False):
                _expect(out, [] if out["resume_exits"][:1] == [0] else [f"--resume: {out['resume_exits']}"])
            if self._foreign is not None:
                path, files = self._foreign
                kept = path.is_dir() and _snapshot(path) == files
                _expect(out, [] if kept else [f"{path.name} of another run was overwritten or removed"])
            for check in self._checks:  # what must hold after the resume to the end too
                _expect(out, check())
        except Hang:
            out["hung"] = True
        finally:
            if "marker" in out:
                out["code_ran"] = Path(out.pop("marker")).exists()
            if _mounted(folder.parent):
                _unmount(folder.parent)
            shutil.rmtree(folder.parent, ignore_errors=True)
        return out

    def _resume(self, folder: Path, out: dict[str, Any]) -> int:
        resumes = 0
        out["resume_exits"] = []
        while not (folder / f"step-{STEPS:08d}").is_dir() and resumes < 3:
            resumes += 1
            status, said = _finish(_start(folder, STEPS, "--resume"), self.hang_after)
            out["resume_exits"].append(status)
            if status != 0 and "no usable checkpoint" in said:
                # Every checkpoint was damaged: refused in one line, as it must be; start afresh.
                out["refused"] = said
                _finish(_start(folder, STEPS, "--replace-checkpoints"), self.hang_after)
        return resumes


def _mount(folder: Path, size: int) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def _mounted(folder: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(folder)]).returncode == 0


def _unmount(folder: Path) -> None:
    subprocess.run(["umount", str(folder)], check=False, capture_output=True)


def summarize(outcomes: list[dict[str, Any]], run_s: float) -> dict[str, Any]:
    kinds = Counter(o["kind"] for o in outcomes)
    ends = [o["end_s"] for o in outcomes if "end_s" in o]
    trained = [o for o in outcomes if o["kind"] not in UNTRAINED]
    return {
        "trials": len(outcomes),
        "seeds": [outcomes[0]["seed"], outcomes[-1]["seed"]] if outcomes else [],
        "by_kind": dict(kinds),
        "completed_equal": sum(o.get("equal", False) for o in outcomes),
        "hangs": sum(o["hung"] for o in outcomes),
        "silent_mismatches": sum(o.get("completed", False) and not o["equal"] for o in outcomes),
        "not_completed": sum(not o.get("completed", False) for o in trained),
        "expected_outcome_not_met": sum(o.get("expected") is False for o in outcomes),
        "code_run_from_disk": sum(o.get("code_ran", False) for o in outcomes),
        "bad_input_not_one_line": sum(o.get("one_line") is False for o in outcomes),
        "checkpoints_lost": sum(o["lost"] for o in outcomes),
        "processes_left": sum(o.get("left", False) for o in outcomes),
        "written_after_launcher_died": sum(o.get("written_after", False) for o in outcomes),
        "longest_end_s": max(ends, default=0.0),
        "refused_no_valid_checkpoint": sum("refused" in o for o in outcomes),
        "resumes": sum(o.get("resumes", 0) for o in outcomes),
        "uninterrupted_run_s": round(run_s, 1),
    }


def table(outcomes: list[dict[str, Any]]) -> str:
    """The result as a markdown table, a row per fault kind and one for all."""
    head = (
        "| fault | trials | ended equal to the uninterrupted run | resumes | hangs | silent mismatches "
        "| checkpoints lost | processes left | code run from disk | not one line | expected outcome not met "
        "| longest s from the fault to the end of every process (a refusal: to the refusal) |"
    )
    rows = [head, "|---|" + "---:|" * 11]
    kinds = [k for k in KINDS if any(o["kind"] == k for o in outcomes)]
    for kind, some in [(k, [o for o in outcomes if o["kind"] == k]) for k in kinds] + [("all", outcomes)]:
        trained = [o for o in some if o["kind"] not in UNTRAINED]
        ends: list[float] = [
            o["end_s"] if "end_s" in o else o["refused_s"] for o in some if {"end_s", "refused_s"} & set(o)
        ]
        cells = [
            len(some),
            sum(o.get("equal", False) for o in trained) if trained else "-",
            sum(o.get("resumes", 0) for o in trained) if trained else "-",
            sum(o["hung"] for o in some),
            sum(o.get("completed", False) and not o["equal"] for o in some),
            sum(o.get("lost", False) for o in some),
            sum(o.get("left", False) for o in some),
            sum(o.get("code_ran", False) for o in some),
            sum(o.get("one_line") is False for o in some),
            sum(o.get("expected") is False for o in some),
            max(ends) if ends else "(ends by itself)",
        ]
        line = [kind, *map(str, cells)]
        rows.append("| " + " | ".join(f"**{c}**" if kind == "all" else c for c in line) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-after", type=float, default=180.0, metavar="S", help="a run longer than this hung")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="the faults to draw from")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument(
        "--stop-after", type=float, metavar="S", help="start no trial after S seconds (the seeds run are said)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as scratch:
        work = Path(scratch)
        began = time.monotonic()
        if _finish(_start(work / "reference"), args.hang_after)[0] != 0:
            raise SystemExit("the uninterrupted run failed")
        run_s = time.monotonic() - began
        reference = load_merged(work / "reference" / f"step-{STEPS:08d}")
        campaign = Campaign(work, reference, run_s, args.hang_after)
        outcomes: list[dict[str, Any]] = []
        for seed in range(args.seed, args.seed + args.trials):
            if args.stop_after is not None and time.monotonic() - began > args.stop_after:
                print(f"stopped after {len(outcomes)} trials (--stop-after {args.stop_after:g})", flush=True)
                break
            outcome = campaign.trial(seed, tuple(args.kinds))
            outcomes.append(outcome)
            print(json.dumps(outcome), flush=True)
    summary = summarize(outcomes, run_s)
    print(json.dumps(summary, indent=1))
    print(table(outcomes))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "trials": outcomes}, indent=1))


if __name__ == "__main__":
    main()
