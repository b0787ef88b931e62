"""Nothing read from a checkpoint runs code or reaches outside it (:mod:`hintpipe.runtime.checkpoint.reading`):
a forged ``.metadata`` (its digests recomputed, so it verifies) refused by ``load_merged`` and on ``--resume``
naming what it names, an index pointing outside its step folder or at a FIFO refused at once, a value that
calls a function refused naming it."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import copied, trained
from hintpipe.runtime.checkpoint.manifest import Manifest, RunIdentity, digests
from hintpipe.runtime.checkpoint.merged import load_merged
from hintpipe.runtime.checkpoint.reading import UnsafeCheckpoint

TIMEOUT = 20.0


# -- nothing from disk runs code ---------------------------------------------------------------------------------


class _Planted:
    """A pickle that runs a command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _forged(step: Path, metadata: object) -> None:
    """``metadata`` pickled as ``step``'s ``.metadata``, its digest recomputed: the step verifies."""
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    manifest = Manifest.read(step)
    files = {**manifest.files, ".metadata": digests([step / ".metadata"], step)[".metadata"]}
    Manifest(manifest.step, manifest.identity, files).write(step)


def _forge_metadata(step: Path, marker: Path) -> None:
    _forged(step, _Planted(marker))


def test_a_forged_metadata_is_refused_by_load_merged_and_runs_nothing(saved_run: Path, tmp_path: Path) -> None:
    folder = copied(saved_run, tmp_path)
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
    assert sorted(load_merged(folder / "step-00000001")) == sorted(load_merged(saved_run))  # the others still load


def test_a_forged_metadata_is_refused_on_resume_and_runs_nothing(saved_run: Path, tmp_path: Path) -> None:
    folder = copied(saved_run, tmp_path)
    marker = tmp_path / "ran"
    _forge_metadata(folder / "step-00000002", marker)
    done = trained(folder, 3, "--resume")
    assert done.returncode == 1
    step = folder / "step-00000002"
    assert done.stderr.strip().splitlines()[-1] == (
        f"hintpipe train: failed: ranks 0, 1: CheckpointError: loading {step} failed (rank 0: "
        f"{step / '.metadata'} names posix.system, which is not torch.distributed.checkpoint metadata: refused "
        "unread (a forged or foreign file); resume from another checkpoint or start fresh)"
    ), done.stderr
    assert not marker.exists()


# -- a checkpoint's index names only its own files, read without blocking (issue 51) -----------------------------


def _forge_index(step: Path, rename: Any) -> None:
    """Point the values of ``step``'s index at ``rename(file)``, its digests recomputed: it verifies."""
    from hintpipe.runtime.checkpoint.reading import read_metadata

    metadata = read_metadata(step)
    for info in metadata.storage_data.values():
        info.relative_path = rename(info.relative_path)
    _forged(step, metadata)
    Manifest.read(step).verify(step)


def _index_refused(step: Path, name: str, why: str) -> str:
    return (
        f"{step / '.metadata'} names {name} for its values, {why}: refused unread (a forged or foreign file); resume "
        "from another checkpoint or start fresh"
    )


def test_an_index_that_names_files_outside_its_folder_is_refused(saved_run: Path, tmp_path: Path) -> None:
    # Before, load_merged (and --resume, export) read ../../outside_dir/*.distcp: whatever a forger put there.
    folder = copied(saved_run, tmp_path)
    step = folder / "step-00000002"
    shutil.copytree(step, tmp_path / "outside_dir")
    _forge_index(step, lambda name: f"../../outside_dir/{name}")
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_merged(step)
    outside = f"outside its checkpoint folder {step}"
    assert str(refused.value) == _index_refused(step, "../../outside_dir/__0_0.distcp", outside)


def test_a_resume_whose_index_names_a_fifo_is_refused_at_once(saved_run: Path, tmp_path: Path) -> None:
    # Before, every rank blocked opening the FIFO for reading (--resume --timeout 20 hung until it was killed).
    folder = copied(saved_run, tmp_path)
    step = folder / "step-00000002"
    os.mkfifo(step / "pipe.distcp")
    _forge_index(step, lambda name: "pipe.distcp" if name == "__1_0.distcp" else name)
    done = trained(folder, 3, "--resume")
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
