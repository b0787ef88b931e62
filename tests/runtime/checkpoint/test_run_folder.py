"""A run folder is its run's (:mod:`hintpipe.runtime.checkpoint.run_folder`): a claim no one shares, a lost
``run.json`` written back, hintpipe's names taken by something else refused, another run's step folder never
overwritten, nothing published by a rank whose launcher is gone, files its owner's alone, a full disk at the
claim named.

Each test reproduces a row of issue 38's fault campaign or of issue 51's probe. Asserted: the exact one-line
refusal, what is left on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from conftest import TRAIN_CLI, allow, copied, hang_bound, refused_in_one_line, trained
from hintpipe.runtime.checkpoint.folder_lock import LOCK_FILE, FolderLock
from hintpipe.runtime.checkpoint.manifest import Manifest
from hintpipe.runtime.checkpoint.run_folder import adopt, claim, write_run
from hintpipe.runtime.errors import CheckpointError, RankFailure
from hintpipe.runtime.launch import run_ranks

TIMEOUT = 20.0


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


def test_a_new_run_keeps_no_profiles_of_the_run_it_replaced_and_a_folder_of_profiles_alone_is_a_runs(
    tmp_path: Path,
) -> None:
    # profiles.json is a planned run's (see hintpipe.apps.run_profiles): a folder holding it and nothing else of
    # the user's is not foreign, and the run that replaces the folder's run does not resume from its profiles.
    (tmp_path / "profiles.json").write_text("{}")
    write_run(tmp_path, "aaaa", "now")
    with FolderLock(tmp_path):
        claim(tmp_path, replace=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", LOCK_FILE]
    other = tmp_path / "other"
    other.mkdir()
    (other / "profiles.json").write_text("{}")
    claim(other)
    assert sorted(p.name for p in other.iterdir()) == ["run.json"]


def test_latest_made_a_folder_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    (tmp_path / "latest").mkdir()
    with pytest.raises(CheckpointError) as refused:
        claim(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'latest'} is a folder; hintpipe writes the pointer to the newest checkpoint there as a file: "
        "move it elsewhere (nothing was changed)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    said = refused_in_one_line([*TRAIN_CLI, "--steps", "2", "--checkpoint-dir", str(tmp_path)])
    assert said == f"hintpipe train: error: {refused.value}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_a_folder_that_lost_run_json_resumes_its_own_checkpoints(saved_run: Path, tmp_path: Path) -> None:
    folder = copied(saved_run, tmp_path)
    run = json.loads((folder / "run.json").read_text())["run"]
    (folder / "run.json").unlink()
    resumed = trained(folder, 3, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = f"resumed from {folder / 'step-00000002'} (step 2 of 3)"  # before, nothing said where it went on from
    assert f"hintpipe train: {said}" in resumed.stderr.splitlines(), resumed.stderr
    assert (json.loads(resumed.stdout)["resumed_from"], json.loads(resumed.stdout)["resumed"]) == (2, said)
    assert json.loads((folder / "run.json").read_text())["run"] == run  # written back
    assert Manifest.read(folder / "step-00000003").identity.run == run


def _as_other_run(step: Path, run: str) -> None:
    manifest = Manifest.read(step)
    Manifest(manifest.step, dataclasses.replace(manifest.identity, run=run), manifest.files).write(step)


def test_a_folder_without_run_json_and_two_runs_says_which_file_to_write(saved_run: Path, tmp_path: Path) -> None:
    folder = copied(saved_run, tmp_path)
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


def test_another_runs_step_folder_is_never_overwritten(saved_run: Path, tmp_path: Path) -> None:
    folder = copied(saved_run, tmp_path)
    _as_other_run(folder / "step-00000002", "other")  # as if copied in from another run
    foreign = {p.name: p.read_bytes() for p in (folder / "step-00000002").iterdir()}
    resumed = trained(folder, 3, "--resume", "--checkpoint-every", "1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == 1  # its own newest; step-2 is the other run's
    assert (
        f"hintpipe train: step 2 was not saved: {folder / 'step-00000002'} belongs to another run (other) and is "
        "kept; move it elsewhere to save this run's checkpoints at that step"
    ) in resumed.stderr.splitlines()
    assert {p.name: p.read_bytes() for p in (folder / "step-00000002").iterdir()} == foreign
    assert (folder / "latest").read_text() == "step-00000003"


# -- nothing published without a launcher -------------------------------------------------------------------------


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


# -- a run folder is its owner's (issue 51) ----------------------------------------------------------------------


def _modes(folder: Path) -> set[tuple[str, str]]:
    """Each kind of entry under ``folder`` (itself included) with the modes found: ``("file", "0o600")``."""
    found = {("folder", oct(stat.S_IMODE(folder.stat().st_mode)))}
    for path in folder.rglob("*"):
        found.add(("folder" if path.is_dir() else "file", oct(stat.S_IMODE(path.lstat().st_mode))))
    return found


def test_a_runs_files_are_its_owners_alone(saved_run: Path) -> None:
    # Before, every file was 0644 and every folder 0755 under the usual umask: any user read the weights.
    assert _modes(saved_run) == {("file", "0o600"), ("folder", "0o700")}


def test_a_group_readable_run_and_a_stricter_umask(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    done = subprocess.run(
        [*TRAIN_CLI, "--steps", "1", "--checkpoint-dir", str(folder), "--group-readable"],
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
