"""One run per checkpoint folder at a time, nothing read from a checkpoint runs code, no link in it is followed,
and a checkpoint being read is not pruned.

Each test reproduces a row of issue 38's fault campaign: two runs in one folder (at once, or a ``--resume`` of a
running one), a lost ``run.json``, ``latest`` made a folder, another run's step folder in the way, a forged
``.metadata`` or value; or of issue 51's probe: links planted in a run folder, an export while its run prunes.
Asserted: the exact one-line refusal, who holds the folder, what is left on disk (and outside it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import allow, hang_bound, small_run
from hintpipe.apps.training import train
from hintpipe.runtime.checkpoint.folder_lock import LOCK_FILE, FolderInUse, FolderLock
from hintpipe.runtime.checkpoint.manifest import Manifest, RunIdentity, digests, write_synced
from hintpipe.runtime.checkpoint.merged import held_checkpoint, load_merged, read_merged
from hintpipe.runtime.checkpoint.reading import UnsafeCheckpoint
from hintpipe.runtime.checkpoint.run_folder import adopt, claim, write_run
from hintpipe.runtime.checkpoint.saving import prune_checkpoints
from hintpipe.runtime.errors import CheckpointError, RankFailure
from hintpipe.runtime.launch import run_ranks

TIMEOUT = 20.0
CLI = [sys.executable, "-m", "hintpipe", "train", "--model", "gpt-mini", "--layers", "2", "--hidden", "16"]
CLI += ["--ranks", "2", "--microbatches", "4", "--microbatch-size", "2", "--policy", "fixed", "--json"]
CLI += ["--timeout", str(TIMEOUT)]


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
        holder.wait(timeout=allow(30))
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
        holder.wait(timeout=allow(30))
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


def _refused(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=allow(120))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_second_run_or_a_resume_of_a_running_one_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    argv = [*CLI, "--steps", "100000", "--checkpoint-dir", str(folder), "--checkpoint-every", "2"]
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
        assert _refused([*CLI, "--steps", "2", "--checkpoint-dir", str(folder), "--replace-checkpoints"]) == said
        assert _refused([*CLI, "--steps", "100000", "--checkpoint-dir", str(folder), "--resume"]) == said
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.communicate(timeout=allow(30))
    # Killed: the folder is free again, and its own newest checkpoint resumes.
    step = int((folder / "latest").read_text().removeprefix("step-"))
    resumed = subprocess.run(
        [*CLI, "--steps", str(step + 1), "--checkpoint-dir", str(folder), "--resume"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == step


def test_two_fresh_runs_started_at_once_one_trains_the_other_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    argv = [*CLI, "--steps", "3", "--checkpoint-dir", str(folder), "--checkpoint-every", "1"]
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


# -- claiming, a lost run.json, hintpipe's names taken -----------------------------------------------------------


def _claimed(folder: Path, run: str) -> str:
    return (
        f"{folder} was claimed by another run ({run}, in {folder / 'run.json'}); only one run can use a checkpoint "
        "folder: resume that run (--resume), or use another folder"
    )


def test_two_claims_racing_for_a_folder_one_wins_the_other_is_refused(tmp_path: Path) -> None:
    # Before, each claim unlinked the run.json it found and linked its own: both succeeded, the second replacing
    # the first. Two claims start together (a barrier); neither holds the folder.
    barrier = threading.Barrier(2)
    said: list[str] = ["", ""]

    def one(i: int) -> None:
        barrier.wait(timeout=allow(30))
        try:
            said[i] = "claimed " + claim(tmp_path)
        except CheckpointError as exc:
            said[i] = str(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=allow(60))
    won = [text.removeprefix("claimed ") for text in said if text.startswith("claimed ")]
    assert len(won) == 1, said
    run = json.loads((tmp_path / "run.json").read_text())["run"]
    assert won == [run]
    assert [text for text in said if not text.startswith("claimed ")] == [_claimed(tmp_path, run)]
    with pytest.raises(CheckpointError) as refused:  # and any later claim, without the folder's hold
        claim(tmp_path, replace=True)
    assert str(refused.value) == _claimed(tmp_path, run)
    assert json.loads((tmp_path / "run.json").read_text())["run"] == run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temporary file left


def test_the_folders_holder_claims_it_again(tmp_path: Path) -> None:
    # A run.json without checkpoints (a run that ended before its first save) is the holder's to replace.
    write_run(tmp_path, "aaaa", "now")
    with pytest.raises(CheckpointError) as refused:
        write_run(tmp_path, "bbbb", "now")  # the link: only where there is none
    assert str(refused.value) == _claimed(tmp_path, "aaaa")
    with FolderLock(tmp_path):
        run = claim(tmp_path)
    assert run != "aaaa" and json.loads((tmp_path / "run.json").read_text())["run"] == run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", LOCK_FILE]


def test_latest_made_a_folder_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    (tmp_path / "latest").mkdir()
    with pytest.raises(CheckpointError) as refused:
        claim(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'latest'} is a folder; hintpipe writes the pointer to the newest checkpoint there as a file: "
        "move it elsewhere (nothing was changed)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    said = _refused([*CLI, "--steps", "2", "--checkpoint-dir", str(tmp_path)])
    assert said == f"hintpipe train: error: {refused.value}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run's folder, a checkpoint after each step (the command line's, as a user's)."""
    folder = tmp_path_factory.mktemp("saved") / "ck"
    argv = [*CLI, "--steps", "2", "--checkpoint-dir", str(folder), "--checkpoint-every", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=hang_bound(TIMEOUT))
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def _copy(saved: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ck"
    shutil.copytree(saved, folder)
    return folder


def test_a_folder_that_lost_run_json_resumes_its_own_checkpoints(saved: Path, tmp_path: Path) -> None:
    folder = _copy(saved, tmp_path)
    run = json.loads((folder / "run.json").read_text())["run"]
    (folder / "run.json").unlink()
    resumed = subprocess.run(
        [*CLI, "--steps", "3", "--checkpoint-dir", str(folder), "--resume"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = f"resumed from {folder / 'step-00000002'} (step 2 of 3)"  # before, nothing said where it went on from
    assert f"hintpipe train: {said}" in resumed.stderr.splitlines(), resumed.stderr
    assert (json.loads(resumed.stdout)["resumed_from"], json.loads(resumed.stdout)["resumed"]) == (2, said)
    assert json.loads((folder / "run.json").read_text())["run"] == run  # written back
    assert Manifest.read(folder / "step-00000003").identity.run == run


def _as_other_run(step: Path, run: str) -> None:
    manifest = Manifest.read(step)
    Manifest(manifest.step, dataclasses.replace(manifest.identity, run=run), manifest.files).write(step)


def test_a_folder_without_run_json_and_two_runs_says_which_file_to_write(saved: Path, tmp_path: Path) -> None:
    folder = _copy(saved, tmp_path)
    run = json.loads((folder / "run.json").read_text())["run"]
    (folder / "run.json").unlink()
    _as_other_run(folder / "step-00000001", "other")
    with pytest.raises(CheckpointError) as refused:
        adopt(folder)
    assert str(refused.value) == (
        f"{folder} has no run.json and holds the checkpoints of 2 runs (run {run}: step-00000002; run other: "
        f'step-00000001); write the run to resume into {folder / "run.json"}, e.g. {{"run": "{run}"}}, or move the '
        "other runs' step folders elsewhere"
    )
    assert not (folder / "run.json").exists()


def _resumed_to_step_3(folder: Path) -> subprocess.CompletedProcess[str]:
    """``hintpipe train --resume`` of the run in ``folder`` to step 3, saving every step."""
    return subprocess.run(
        [*CLI, "--steps", "3", "--checkpoint-dir", str(folder), "--resume", "--checkpoint-every", "1"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )


def test_another_runs_step_folder_is_never_overwritten(saved: Path, tmp_path: Path) -> None:
    folder = _copy(saved, tmp_path)
    _as_other_run(folder / "step-00000002", "other")  # as if copied in from another run
    foreign = {p.name: p.read_bytes() for p in (folder / "step-00000002").iterdir()}
    resumed = _resumed_to_step_3(folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == 1  # its own newest; step-2 is the other run's
    assert (
        f"hintpipe train: step 2 was not saved: {folder / 'step-00000002'} belongs to another run (other) and is "
        "kept; move it elsewhere to save this run's checkpoints at that step"
    ) in resumed.stderr.splitlines()
    assert {p.name: p.read_bytes() for p in (folder / "step-00000002").iterdir()} == foreign
    assert (folder / "latest").read_text() == "step-00000003"


# -- no link in a run folder is followed (issue 51) --------------------------------------------------------------


def _outside(tmp_path: Path) -> tuple[Path, Path]:
    """A file and a folder of the user's outside the run folder, for links to point at."""
    file, folder = tmp_path / "precious.txt", tmp_path / "elsewhere"
    file.write_text("precious\n")
    folder.mkdir()
    (folder / "keep.txt").write_text("keep\n")
    return file, folder


def _untouched(file: Path, folder: Path) -> None:
    assert (file.read_bytes(), file.stat().st_size) == (b"precious\n", 9)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {"keep.txt": b"keep\n"}


def _link_refused(link: Path, target: Path) -> str:
    return (
        f"{link} is a link (to {target}); hintpipe writes and removes files in a run folder and follows no link "
        "there: remove the link (nothing was changed)"
    )


def test_a_link_planted_as_run_lock_is_refused_and_what_it_points_to_is_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, the lock was opened with O_CREAT through the link: the outside file was truncated to 0 bytes and
    # then held the lock's record.
    file, elsewhere = _outside(tmp_path)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / LOCK_FILE).symlink_to(file)
    said = _link_refused(folder / LOCK_FILE, file)
    with pytest.raises(CheckpointError) as refused:
        FolderLock(folder).acquire()
    assert str(refused.value) == said
    with pytest.raises(CheckpointError) as refused:
        train(small_run(checkpoint_dir=str(folder)))  # the Python entry, before any rank starts
    assert str(refused.value) == said
    assert _refused([*CLI, "--steps", "2", "--checkpoint-dir", str(folder)]) == f"hintpipe train: error: {said}"
    # A link put there after the check (a race): O_NOFOLLOW refuses it all the same.
    from hintpipe.runtime.checkpoint import folder_lock

    monkeypatch.setattr(folder_lock, "refuse_links", lambda paths: None)
    with pytest.raises(CheckpointError) as refused:
        FolderLock(folder).acquire()
    assert str(refused.value) == said
    _untouched(file, elsewhere)
    assert [(p.name, p.is_symlink()) for p in folder.iterdir()] == [(LOCK_FILE, True)]


@pytest.mark.parametrize("name", ["run.json", "latest", "step-00000005"])
def test_a_link_in_place_of_a_file_or_checkpoint_of_the_run_is_refused_with_nothing_changed(
    name: str, tmp_path: Path
) -> None:
    file, elsewhere = _outside(tmp_path)
    folder = tmp_path / "ck"
    folder.mkdir()
    target = elsewhere if name.startswith("step-") else file
    (folder / name).symlink_to(target)
    with pytest.raises(CheckpointError) as refused:
        claim(folder, replace=True)
    assert str(refused.value) == _link_refused(folder / name, target)
    said = _refused([*CLI, "--steps", "2", "--checkpoint-dir", str(folder), "--resume"])
    assert said == f"hintpipe train: error: {refused.value}"
    _untouched(file, elsewhere)
    assert [(p.name, p.is_symlink()) for p in folder.iterdir()] == [(name, True)]


def test_a_planted_temporary_link_is_removed_never_written_through(tmp_path: Path) -> None:
    # Before, latest.tmp was opened with "w" through the link: the outside file held "step-00000008".
    file, elsewhere = _outside(tmp_path)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "latest.tmp").symlink_to(file)
    write_synced(folder / "latest", "step-00000008")
    assert (folder / "latest").read_text() == "step-00000008"
    _untouched(file, elsewhere)
    assert [(p.name, p.is_symlink()) for p in folder.iterdir()] == [("latest", False)]


def test_a_resume_saves_past_planted_temporary_links_and_leaves_their_targets(saved: Path, tmp_path: Path) -> None:
    # Before, the resume overwrote the file latest.tmp pointed to, and a stale step-N.tmp link stopped every save
    # with "Cannot call rmtree on a symbolic link" and no path.
    file, elsewhere = _outside(tmp_path)
    folder = _copy(saved, tmp_path)
    (folder / "latest.tmp").symlink_to(file)
    (folder / "step-00000003.tmp").symlink_to(elsewhere, target_is_directory=True)
    resumed = _resumed_to_step_3(folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == 2
    _untouched(file, elsewhere)
    assert (folder / "latest").read_text() == "step-00000003"
    Manifest.read(folder / "step-00000003").verify(folder / "step-00000003")
    assert not [p.name for p in folder.iterdir() if p.is_symlink()]


# -- a checkpoint being read is not pruned (issue 51) ------------------------------------------------------------


def _fake_steps(folder: Path, steps: list[int]) -> None:
    """Checkpoints of run ``r1`` whose manifests verify (they vouch for no file)."""
    identity = RunIdentity(tensors={"0.w": [2]}, stage_ranks=[0], hint="", versions={}, run="r1")
    for step in steps:
        (folder / f"step-{step:08d}").mkdir(parents=True)
        Manifest(step, identity, {}).write(folder / f"step-{step:08d}")


def test_pruning_keeps_a_checkpoint_a_reader_holds_until_a_later_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_steps(tmp_path, [1, 2, 3])
    with held_checkpoint(tmp_path / "step-00000001") as (held, manifest):
        assert (held, manifest.step) == (tmp_path / "step-00000001", 1)
        assert prune_checkpoints(tmp_path, keep=1, run="r1") == [tmp_path / "step-00000002"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000003"]
    assert prune_checkpoints(tmp_path, keep=1, run="r1") == [tmp_path / "step-00000001"]  # the reader is done
    # A folder pruned between being listed and being held is passed over for the next older one.
    from hintpipe.runtime.checkpoint import saving

    listed = [tmp_path / "step-00000009", tmp_path / "step-00000003"]
    monkeypatch.setattr(saving, "step_folders", lambda root: listed)
    with held_checkpoint(tmp_path) as (held, manifest):
        assert (held, manifest.step) == (tmp_path / "step-00000003", 3)


def test_an_export_while_its_run_saves_and_prunes_reads_the_checkpoint_it_chose(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, 14 of 14 exports during a run with --checkpoint-every 1 failed with FileNotFoundError: the run
    # pruned the checkpoint being read. Here the run saves step 3 and prunes to one checkpoint in the middle of
    # the export, deterministically: just before the export reads the tensors of step 2, which it chose.
    from safetensors.torch import load_file

    from hintpipe.apps import export

    folder = _copy(saved, tmp_path)
    run = json.loads((folder / "run.json").read_text())["run"]
    pruned: list[Path] = []

    def the_run_goes_on(step: Path, manifest: Manifest) -> dict[str, Any]:
        shutil.copytree(folder / "step-00000002", folder / "step-00000003")  # step 3 saved: the same tensors
        Manifest(3, manifest.identity, manifest.files).write(folder / "step-00000003")
        pruned.extend(prune_checkpoints(folder, keep=1, run=run))
        return read_merged(step, manifest)

    monkeypatch.setattr(export, "read_merged", the_run_goes_on)
    done = export.export_checkpoint(folder, tmp_path / "out")
    assert (done.checkpoint, done.step) == (folder / "step-00000002", 2)
    assert pruned == [folder / "step-00000001"]  # step 2 kept while it was read
    exported = load_file(tmp_path / "out" / "model.safetensors")
    merged = load_merged(folder / "step-00000003")
    assert exported.keys() == merged.keys() and all(torch.equal(exported[k], merged[k]) for k in merged)
    assert prune_checkpoints(folder, keep=1, run=run) == [folder / "step-00000002"]  # at the run's next save
    assert sorted(p.name for p in folder.glob("step-*")) == ["step-00000003"]


# -- nothing from disk runs code ---------------------------------------------------------------------------------


class _Planted:
    """A pickle that runs a command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _forge_metadata(step: Path, marker: Path) -> None:
    (step / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))
    manifest = Manifest.read(step)
    files = {**manifest.files, ".metadata": digests([step / ".metadata"], step)[".metadata"]}
    Manifest(manifest.step, manifest.identity, files).write(step)  # the digests recomputed: it verifies


def test_a_forged_metadata_is_refused_by_load_merged_and_runs_nothing(saved: Path, tmp_path: Path) -> None:
    folder = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    _forge_metadata(folder / "step-00000002", marker)
    Manifest.read(folder / "step-00000002").verify(folder / "step-00000002")
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_merged(folder)
    assert str(refused.value) == (
        f"{folder / 'step-00000002' / '.metadata'} names posix.system, which is not torch.distributed.checkpoint "
        "metadata: refused unread (a forged or foreign file); resume from another checkpoint or start fresh"
    )
    assert not marker.exists()
    assert sorted(load_merged(folder / "step-00000001")) == sorted(load_merged(saved))  # the others still load


def test_a_forged_metadata_is_refused_on_resume_and_runs_nothing(saved: Path, tmp_path: Path) -> None:
    folder = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    _forge_metadata(folder / "step-00000002", marker)
    done = subprocess.run(
        [*CLI, "--steps", "3", "--checkpoint-dir", str(folder), "--resume"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert done.returncode == 1
    step = folder / "step-00000002"
    assert done.stderr.strip().splitlines()[-1] == (
        f"hintpipe train: failed: ranks 0, 1: CheckpointError: loading {step} failed (rank 0: "
        f"{step / '.metadata'} names posix.system, which is not torch.distributed.checkpoint metadata: refused "
        "unread (a forged or foreign file); resume from another checkpoint or start fresh)"
    ), done.stderr
    assert not marker.exists()


def _saves_then_orphaned(rank: int, world: int, folder: str) -> None:
    """Save step 2, then save step 3 as a rank whose launcher is gone (asked right before it publishes; the
    rank's watching thread, which would end it any moment, is left out)."""
    from hintpipe.runtime.checkpoint import saving

    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 2)
    saving.save_checkpoint(folder, {0: layer}, None, 2)
    saving.orphaned = lambda: True  # type: ignore[attr-defined]
    saving.save_checkpoint(folder, {0: layer}, None, 3)  # leaves at its last moment, publishing nothing


def test_a_rank_whose_launcher_is_gone_publishes_nothing(tmp_path: Path) -> None:
    # Rank 0 asks right before it renames a checkpoint into place (see [Note: nothing published after the
    # launcher died]): the save of step 3 wrote its files and its manifest, and the rank leaves without
    # publishing them (no step-00000003, latest still step 2).
    folder = tmp_path / "ck"
    with pytest.raises(RankFailure) as failed:
        run_ranks(_saves_then_orphaned, 1, str(folder), timeout=TIMEOUT)
    assert str(failed.value) == (
        "rank 0: exited without a result (exit status 1 before it could report; its error is on stderr above)"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-00000002", "step-00000003.tmp"]
    assert (folder / "latest").read_text() == "step-00000002"
    assert (folder / "step-00000003.tmp" / "manifest.json").is_file()  # whole, and never renamed into place


# -- a checkpoint's index names only its own files, read without blocking (issue 51) -----------------------------


def _forge_index(step: Path, rename: Any) -> None:
    """Point the values of ``step``'s index at ``rename(file)``, its digests recomputed: it verifies."""
    from hintpipe.runtime.checkpoint.reading import read_metadata

    metadata = read_metadata(step)
    for info in metadata.storage_data.values():
        info.relative_path = rename(info.relative_path)
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    manifest = Manifest.read(step)
    files = {**manifest.files, ".metadata": digests([step / ".metadata"], step)[".metadata"]}
    Manifest(manifest.step, manifest.identity, files).write(step)
    Manifest.read(step).verify(step)


def _index_refused(step: Path, name: str, why: str) -> str:
    return (
        f"{step / '.metadata'} names {name} for its values, {why}: refused unread (a forged or foreign file); resume "
        "from another checkpoint or start fresh"
    )


def test_an_index_that_names_files_outside_its_folder_is_refused(saved: Path, tmp_path: Path) -> None:
    # Before, load_merged (and --resume, export) read ../../outside_dir/*.distcp: whatever a forger put there.
    folder = _copy(saved, tmp_path)
    step = folder / "step-00000002"
    shutil.copytree(step, tmp_path / "outside_dir")
    _forge_index(step, lambda name: f"../../outside_dir/{name}")
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_merged(step)
    outside = f"outside its checkpoint folder {step}"
    assert str(refused.value) == _index_refused(step, "../../outside_dir/__0_0.distcp", outside)


def test_a_resume_whose_index_names_a_fifo_is_refused_at_once(saved: Path, tmp_path: Path) -> None:
    # Before, every rank blocked opening the FIFO for reading (--resume --timeout 20 hung until it was killed).
    folder = _copy(saved, tmp_path)
    step = folder / "step-00000002"
    os.mkfifo(step / "pipe.distcp")
    _forge_index(step, lambda name: "pipe.distcp" if name == "__1_0.distcp" else name)
    done = subprocess.run(
        [*CLI, "--steps", "3", "--checkpoint-dir", str(folder), "--resume"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    why = _index_refused(step, "pipe.distcp", "which is a FIFO, not a file")
    assert done.stderr.strip().splitlines()[-1] == (
        f"hintpipe train: failed: ranks 0, 1: CheckpointError: loading {step} failed (rank 0: {why})"
    ), done.stderr


def test_a_value_that_calls_a_function_is_refused_naming_it(tmp_path: Path) -> None:
    # Before, the refusal was torch's boilerplate ("... weights_only=False will likely succeed ...").
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    step = tmp_path / "ck" / "step-00000001"
    marker = tmp_path / "ran"
    dcp_save({"model": {"w": torch.ones(2)}, "planted": _Planted(marker)}, checkpoint_id=str(step), no_dist=True)
    identity = RunIdentity(tensors={"w": [2]}, stage_ranks=[0], hint="", versions={}, run="r1", keys=["w"])
    Manifest(1, identity, digests([p for p in step.iterdir()], step)).write(step)
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_merged(step)
    assert str(refused.value) == (
        "the value planted names posix.system, which is not plain data: refused unread (a forged or foreign file); "
        "resume from another checkpoint or start fresh"
    )
    assert not marker.exists()


# -- a run folder is its owner's (issue 51) ----------------------------------------------------------------------


def _modes(folder: Path) -> set[tuple[str, str]]:
    """Each kind of entry under ``folder`` (itself included) with the modes found: ``("file", "0o600")``."""
    found = {("folder", oct(stat.S_IMODE(folder.stat().st_mode)))}
    for path in folder.rglob("*"):
        found.add(("folder" if path.is_dir() else "file", oct(stat.S_IMODE(path.lstat().st_mode))))
    return found


def test_a_runs_files_are_its_owners_alone(saved: Path) -> None:
    # Before, every file was 0644 and every folder 0755 under the usual umask: any user read the weights.
    assert _modes(saved) == {("file", "0o600"), ("folder", "0o700")}


def test_a_group_readable_run_and_a_stricter_umask(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    done = subprocess.run(
        [*CLI, "--steps", "1", "--checkpoint-dir", str(folder), "--group-readable"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
        preexec_fn=lambda: os.umask(0o022),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _modes(folder) == {("file", "0o640"), ("folder", "0o750")}
    # The umask only ever makes a mode stricter: 077 keeps the group out whatever the run says.
    from hintpipe.runtime.checkpoint import permissions

    stricter = tmp_path / "strict"
    mask = os.umask(0o077)
    permissions.use(group_readable=True)
    try:
        with FolderLock(stricter):
            claim(stricter)
    finally:
        permissions.use(group_readable=False)
        os.umask(mask)
    assert _modes(stricter) == {("file", "0o600"), ("folder", "0o700")}


# -- a full disk is named (issue 51) -----------------------------------------------------------------------------


def test_a_full_disk_at_the_claim_names_run_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The lock fitted and run.json did not (4 KiB free): before, `OSError: [Errno 28] No space left on device`,
    # naming no file and nothing to do. No run.json is left, and the folder can be claimed once there is room.
    def no_room(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", no_room)
        with pytest.raises(CheckpointError) as refused:
            claim(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'run.json'}: No space left on device; free space on its file system, or use another "
        "checkpoint folder (the run did not start)"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    assert len(claim(tmp_path)) == 16


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
        f"os.pwrite = no_room\nsys.exit(main({[*CLI[3:], '--steps', '1', '--checkpoint-dir', str(folder)]!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=allow(120))
    assert (done.returncode, done.stderr.strip().splitlines()) == (
        2,
        [
            f"hintpipe train: error: {folder / LOCK_FILE}: No space left on device; free space on its file system, or "
            "use another checkpoint folder (nothing was changed)"
        ],
    ), done.stderr
