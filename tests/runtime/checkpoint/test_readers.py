"""A checkpoint being read is not pruned under its reader (:mod:`hintpipe.runtime.checkpoint.readers`): any number
of readers hold a step folder at once, and pruning removes only one that nobody holds."""

from __future__ import annotations

from pathlib import Path

from hintpipe.runtime.checkpoint.readers import reading, remove_unread


def _step(tmp_path: Path) -> Path:
    folder = tmp_path / "step-00000001"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_a_held_folder_is_kept_until_every_reader_is_done(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    with reading(folder) as first:
        with reading(folder) as second:  # shared: another reader at once
            assert (first, second) == (True, True)
            assert not remove_unread(folder) and folder.is_dir()
        assert not remove_unread(folder)  # the first still reads
    assert remove_unread(folder) and not folder.exists()


def test_a_folder_that_is_gone_is_held_by_nobody_and_removed_already(tmp_path: Path) -> None:
    with reading(tmp_path / "step-00000009") as held:
        assert held is False
    assert remove_unread(tmp_path / "step-00000009")


def test_a_link_or_a_file_is_never_removed_nor_what_it_points_to(tmp_path: Path) -> None:
    target = _step(tmp_path)
    link = tmp_path / "step-00000002"
    link.symlink_to(target)
    assert not remove_unread(link) and link.is_symlink() and (target / "model.safetensors").is_file()
    (tmp_path / "step-00000003").write_text("not a folder")
    assert not remove_unread(tmp_path / "step-00000003")
    with reading(tmp_path / "step-00000003") as held:
        assert held is False
