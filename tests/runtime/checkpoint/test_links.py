"""Nothing is written, truncated or removed through a link in a run folder
(:mod:`hintpipe.runtime.checkpoint.links`): a kept file found as a link is refused, a stale temporary is removed
without following it, and a checkpoint's file is read only when it is a regular file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import TRAIN_CLI, copied, refused_in_one_line, small_run, trained
from hintpipe.apps.training import train
from hintpipe.runtime.checkpoint.folder_lock import LOCK_FILE, FolderLock
from hintpipe.runtime.checkpoint.links import (
    NotAFile,
    create_new,
    not_a_file,
    open_regular,
    refuse_links,
    remove_temporary,
)
from hintpipe.runtime.checkpoint.manifest import Manifest, write_synced
from hintpipe.runtime.checkpoint.run_folder import claim
from hintpipe.runtime.errors import CheckpointError


def test_a_kept_file_found_as_a_link_is_refused_naming_it_and_its_target(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "latest").symlink_to(tmp_path / "elsewhere")
    refuse_links([tmp_path / "run.json", tmp_path / "absent"])
    with pytest.raises(CheckpointError) as refused:
        refuse_links([tmp_path / "run.json", tmp_path / "latest"])
    assert str(refused.value) == (
        f"{tmp_path / 'latest'} is a link (to {tmp_path / 'elsewhere'}); hintpipe writes and removes files in a run "
        "folder and follows no link there: remove the link (nothing was changed)"
    )


def test_a_stale_temporary_is_removed_and_a_links_target_is_left(tmp_path: Path) -> None:
    target = tmp_path / "users-file"
    target.write_text("keep me")
    (tmp_path / "latest.tmp").symlink_to(target)
    (tmp_path / "step-00000002.tmp").mkdir()
    (tmp_path / "step-00000002.tmp" / "part").write_text("x")
    remove_temporary(tmp_path / "latest.tmp")
    remove_temporary(tmp_path / "step-00000002.tmp")
    remove_temporary(tmp_path / "none.tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users-file"] and target.read_text() == "keep me"


def test_a_new_file_is_created_after_a_planted_link_is_removed_not_through_it(tmp_path: Path) -> None:
    target = tmp_path / "users-file"
    target.write_text("keep me")
    (tmp_path / "latest.tmp").symlink_to(target)
    fd = create_new(tmp_path / "latest.tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write("step-00000008")
    assert (tmp_path / "latest.tmp").read_text() == "step-00000008" and not (tmp_path / "latest.tmp").is_symlink()
    assert target.read_text() == "keep me"


def test_only_a_regular_file_is_opened_for_reading(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("tensors")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    kinds = {name: not_a_file(tmp_path / name) for name in ("file", "link", "fifo", "folder", "none")}
    assert kinds == {"file": None, "link": "a link", "fifo": "a FIFO", "folder": "a folder", "none": None}
    assert not_a_file(Path("/dev/null")) == "a device"
    with os.fdopen(open_regular(tmp_path / "file")) as handle:
        assert handle.read() == "tensors"
    with pytest.raises(NotAFile, match=r"/fifo is a FIFO, not a file: never read$"):
        open_regular(tmp_path / "fifo")  # at once: a FIFO's open does not wait for a writer
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "none")


# -- in a run: no link in a run folder is followed (issue 51) -------------------------------------------------------


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
    assert (
        refused_in_one_line([*TRAIN_CLI, "--steps", "2", "--checkpoint-dir", str(folder)])
        == f"hintpipe train: error: {said}"
    )
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
    said = refused_in_one_line([*TRAIN_CLI, "--steps", "2", "--checkpoint-dir", str(folder), "--resume"])
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


def test_a_resume_saves_past_planted_temporary_links_and_leaves_their_targets(saved_run: Path, tmp_path: Path) -> None:
    # Before, the resume overwrote the file latest.tmp pointed to, and a stale step-N.tmp link stopped every save
    # with "Cannot call rmtree on a symbolic link" and no path.
    file, elsewhere = _outside(tmp_path)
    folder = copied(saved_run, tmp_path)
    (folder / "latest.tmp").symlink_to(file)
    (folder / "step-00000003.tmp").symlink_to(elsewhere, target_is_directory=True)
    resumed = trained(folder, 3, "--resume", "--checkpoint-every", "1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == 2
    _untouched(file, elsewhere)
    assert (folder / "latest").read_text() == "step-00000003"
    Manifest.read(folder / "step-00000003").verify(folder / "step-00000003")
    assert not [p.name for p in folder.iterdir() if p.is_symlink()]
