"""A checkpoint being read is not pruned under its reader (:mod:`hintpipe.runtime.checkpoint.readers`): any number
of readers hold a step folder at once, and pruning removes only one that nobody holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import copied
from hintpipe.runtime.checkpoint.manifest import Manifest, RunIdentity
from hintpipe.runtime.checkpoint.merged import held_checkpoint, load_merged, read_merged
from hintpipe.runtime.checkpoint.readers import reading, remove_unread
from hintpipe.runtime.checkpoint.saving import prune_checkpoints


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
    saved_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, 14 of 14 exports during a run with --checkpoint-every 1 failed with FileNotFoundError: the run
    # pruned the checkpoint being read. Here the run saves step 3 and prunes to one checkpoint in the middle of
    # the export, deterministically: just before the export reads the tensors of step 2, which it chose.
    from safetensors.torch import load_file

    from hintpipe.apps import export

    folder = copied(saved_run, tmp_path)
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
