"""Nothing is written, truncated or removed through a link in a run folder
(:mod:`hintpipe.runtime.checkpoint.links`): a kept file found as a link is refused, a stale temporary is removed
without following it, and a checkpoint's file is read only when it is a regular file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hintpipe.runtime.checkpoint.links import (
    NotAFile,
    create_new,
    not_a_file,
    open_regular,
    refuse_links,
    remove_temporary,
)
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
