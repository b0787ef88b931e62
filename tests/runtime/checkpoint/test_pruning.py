"""Old checkpoints go, ``keep`` stay (:mod:`hintpipe.runtime.checkpoint.pruning`): exactly, newest first, only the
run's own, never while the newest does not verify, and a damaged older one goes with them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hintpipe.runtime.checkpoint.manifest import MANIFEST, Manifest, RunIdentity
from hintpipe.runtime.checkpoint.pruning import prune_checkpoints


def _steps(folder: Path, steps: list[int], run: str = "r1") -> None:
    """Checkpoints of ``run`` whose manifests verify (they vouch for no file)."""
    identity = RunIdentity(tensors={"0.w": [2]}, stage_ranks=[0], hint="", versions={}, run=run)
    for step in steps:
        (folder / f"step-{step:08d}").mkdir(parents=True)
        Manifest(step, identity, {}).write(folder / f"step-{step:08d}")


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_keep_newest_stay_and_the_rest_go_newest_first(tmp_path: Path) -> None:
    _steps(tmp_path, [1, 2, 3, 4])
    assert prune_checkpoints(tmp_path, keep=2) == [tmp_path / "step-00000002", tmp_path / "step-00000001"]
    assert _left(tmp_path) == ["step-00000003", "step-00000004"]
    assert prune_checkpoints(tmp_path, keep=2) == []
    assert prune_checkpoints(tmp_path, keep=0) == [tmp_path / "step-00000003"]  # the newest always stays


def test_another_runs_checkpoints_are_never_touched(tmp_path: Path) -> None:
    _steps(tmp_path, [1, 3])
    _steps(tmp_path, [2, 4], run="r2")
    assert prune_checkpoints(tmp_path, keep=1, run="r1") == [tmp_path / "step-00000001"]
    assert _left(tmp_path) == ["step-00000002", "step-00000003", "step-00000004"]


def test_nothing_goes_while_the_newest_is_damaged_and_a_damaged_older_one_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _steps(tmp_path, [1, 2, 3])
    (tmp_path / "step-00000003" / MANIFEST).write_text("{")  # the newest save never finished
    with caplog.at_level(logging.WARNING, "hintpipe.runtime.checkpoint.pruning"):
        assert prune_checkpoints(tmp_path, keep=1) == []
    assert [r.getMessage() for r in caplog.records] == [
        "keeping every older checkpoint: step-00000003: manifest.json is unreadable (JSONDecodeError: Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1))"
    ]
    (tmp_path / "step-00000003" / MANIFEST).unlink()
    _steps(tmp_path, [4])
    # Step 4 verifies: the damaged step 3 goes, and step 1 beyond the two kept (4 and 2).
    assert prune_checkpoints(tmp_path, keep=2) == [tmp_path / "step-00000003", tmp_path / "step-00000001"]
    assert _left(tmp_path) == ["step-00000002", "step-00000004"]
