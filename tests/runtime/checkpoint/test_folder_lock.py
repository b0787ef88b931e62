"""One run per checkpoint folder at a time (:mod:`hintpipe.runtime.checkpoint.folder_lock`): a second run, or a
resume of a running one, refused in one line naming the holder, before any rank starts; the folder free again
when its holder dies; a full disk at the lock's record named as such."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TRAIN_CLI, allow, hang_bound, refused_in_one_line, small_run, trained
from hintpipe.apps.training import train
from hintpipe.runtime.checkpoint.folder_lock import LOCK_FILE, FolderInUse, FolderLock
from hintpipe.runtime.checkpoint.manifest import Manifest
from hintpipe.runtime.errors import CheckpointError

TIMEOUT = 20.0


def _holder(folder: Path) -> str:
    record = json.loads((folder / LOCK_FILE).read_text())
    return f"pid {record['pid']} on host {socket.gethostname()}, started {record['started']}"


def _in_use(folder: Path) -> str:
    return (
        f"{folder} is in use by another run ({_holder(folder)}, holding {folder / LOCK_FILE}); wait for it to end "
        "or stop it, or use another checkpoint folder"
    )


def _hold_elsewhere(folder: Path) -> subprocess.Popen[str]:
    """Another process that holds ``folder`` until it is killed."""
    code = (
        "import sys, time\nfrom hintpipe.runtime.checkpoint.folder_lock import FolderLock\n"
        f"FolderLock({str(folder)!r}).acquire()\nprint('held', flush=True)\ntime.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


# -- the lock ----------------------------------------------------------------------------------------------------


def test_one_process_holds_a_folder_once_however_many_take_it(tmp_path: Path) -> None:
    # A training function called twice in one interpreter (a notebook cell run again, a suite's shared ranks):
    # its second checkpointer is not refused by the first one's lock, and the folder is free when both let go.
    first, second = FolderLock(tmp_path).acquire(), FolderLock(tmp_path).acquire()
    assert first.held and second.held
    first.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()  # the second still holds it
    holder = subprocess.run(
        [sys.executable, "-c", f"from hintpipe.runtime.checkpoint.folder_lock import FolderLock\n"
         f"FolderLock({str(tmp_path)!r}).acquire()"], capture_output=True, text=True, timeout=allow(60),
    )  # fmt: skip
    assert holder.returncode == 1 and holder.stderr.strip().splitlines()[-1].endswith(
        f"{tmp_path} is in use by another run ({_holder(tmp_path)}, holding {tmp_path / LOCK_FILE}); wait for it "
        "to end or stop it, or use another checkpoint folder"
    )
    second.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_a_held_folder_is_refused_naming_the_holder_and_freed_when_it_dies(tmp_path: Path) -> None:
    holder = _hold_elsewhere(tmp_path)
    try:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid
        with pytest.raises(FolderInUse) as refused:
            FolderLock(tmp_path).acquire()
        assert str(refused.value) == _in_use(tmp_path)
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.communicate(timeout=allow(30))  # (closes its pipe)
    with FolderLock(tmp_path) as lock:
        assert lock.held and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: it names no one


def _no_rank_starts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """``train``'s ranks, never started: each attempt is recorded (and fails the run)."""
    from hintpipe.apps import training

    started: list[object] = []

    def run_ranks(*args: object, **kwargs: object) -> None:
        started.append(args)
        raise AssertionError("a rank was started")

    monkeypatch.setattr(training, "run_ranks", run_ranks)
    return started


def test_the_python_entry_refuses_a_held_folder_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _no_rank_starts(monkeypatch)
    holder = _hold_elsewhere(tmp_path)  # another run's process
    try:
        with pytest.raises(FolderInUse) as refused:
            train(small_run(checkpoint_dir=str(tmp_path)))
        assert str(refused.value) == _in_use(tmp_path)
    finally:
        holder.kill()
        holder.communicate(timeout=allow(30))  # (closes its pipe)
    assert started == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]


def test_the_python_entry_refuses_a_folder_whose_parent_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, train() made the mistyped parent and trained there; the command line refused it.
    started = _no_rank_starts(monkeypatch)
    folder = tmp_path / "typo" / "ck"
    with pytest.raises(ValueError) as refused:
        train(small_run(checkpoint_dir=str(folder)))
    assert str(refused.value) == (
        f"checkpoint_dir {folder}: its parent {folder.parent} does not exist (a typo?); create it first"
    )
    assert started == [] and list(tmp_path.iterdir()) == []


def test_a_second_run_or_a_resume_of_a_running_one_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    argv = [*TRAIN_CLI, "--steps", "100000", "--checkpoint-dir", str(folder), "--checkpoint-every", "2"]
    running = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + hang_bound(TIMEOUT)
        while not (folder / "latest").is_file():
            assert running.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == running.pid  # the launcher holds it
        # Paused (as a run stopped with Ctrl-Z, or swapped out): it holds its folder as it did, and its ranks
        # take none of the CPU that the two refused commands need to start.
        os.killpg(running.pid, signal.SIGSTOP)
        said = f"hintpipe train: error: --checkpoint-dir {_in_use(folder)}"
        assert (
            refused_in_one_line([*TRAIN_CLI, "--steps", "2", "--checkpoint-dir", str(folder), "--replace-checkpoints"])
            == said
        )
        assert (
            refused_in_one_line([*TRAIN_CLI, "--steps", "100000", "--checkpoint-dir", str(folder), "--resume"]) == said
        )
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.communicate(timeout=allow(30))
    # Killed: the folder is free again, and its own newest checkpoint resumes.
    step = int((folder / "latest").read_text().removeprefix("step-"))
    resumed = trained(folder, step + 1, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == step


def test_two_fresh_runs_started_at_once_one_trains_the_other_isrefused_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    argv = [*TRAIN_CLI, "--steps", "3", "--checkpoint-dir", str(folder), "--checkpoint-every", "1"]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [(run.pid, *run.communicate(timeout=hang_bound(TIMEOUT)), run.returncode) for run in runs]
    codes = sorted(code for *_, code in outcomes)
    assert codes == [0, 2], outcomes
    winner = next(pid for pid, _, _, code in outcomes if code == 0)
    loser_err = next(err for _, _, err, code in outcomes if code == 2)
    # The refusal named the winner (its record is gone now that it released the folder).
    assert (
        loser_err.strip()
        .splitlines()[-1]
        .startswith(f"hintpipe train: error: --checkpoint-dir {folder} is in use by another run (pid {winner} on host ")
    ), loser_err
    run = json.loads((folder / "run.json").read_text())["run"]
    assert {Manifest.read(p).identity.run for p in folder.glob("step-*")} == {run}


# -- a full disk is named (issue 51) ------------------------------------------------------------------------------


def test_a_full_disk_at_the_start_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, a 15-line OSError traceback from the lock's record.
    def no_room(*args: object) -> int:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "pwrite", no_room)
        with pytest.raises(CheckpointError) as refused:
            FolderLock(tmp_path).acquire()
    assert str(refused.value) == (
        f"{tmp_path / LOCK_FILE}: No space left on device; free space on its file system, or use another checkpoint "
        "folder (nothing was changed)"
    )
    # The command line, its lock's record meeting a full disk (in a process of its own).
    folder = tmp_path / "ck"
    code = (
        "import os, sys\nfrom hintpipe.cli import main\n"
        "def no_room(*args):\n    raise OSError(28, 'No space left on device')\n"
        f"os.pwrite = no_room\nsys.exit(main({[*TRAIN_CLI[3:], '--steps', '1', '--checkpoint-dir', str(folder)]!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=allow(120))
    assert (done.returncode, done.stderr.strip().splitlines()) == (
        2,
        [
            f"hintpipe train: error: {folder / LOCK_FILE}: No space left on device; free space on its file system, or "
            "use another checkpoint folder (nothing was changed)"
        ],
    ), done.stderr
