"""Nothing lost, nothing silently wrong: verified checkpoints, failing saves, signals, elastic restarts.

Each test reproduces a fault and asserts what the run does about it: which
checkpoint is used, the message, that good checkpoints survive, the time bound,
that no process or temporary folder is left behind.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SMALL_GPT, allow, hang_bound, small_run
from groups import Case, failure_text, run_cases, succeeded
from hintpipe.apps.models import ModelConfig, SeqLenDist
from hintpipe.apps.training import _train_rank
from hintpipe.runtime import liveness
from hintpipe.runtime.checkpoint import stopping
from hintpipe.runtime.checkpoint.manifest import DamagedCheckpoint, Manifest, RunIdentity
from hintpipe.runtime.checkpoint.merged import load_merged
from hintpipe.runtime.checkpoint.saving import (
    CheckpointError,
    find_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from hintpipe.runtime.errors import PeerFailure, RankFailure
from hintpipe.runtime.launch import FOLDER_PREFIX, LAUNCHER_FILE, remove_stale_folders, run_ranks
from processes import children, descendants

MODEL = SMALL_GPT
TIMEOUT = 20.0


_config = small_run  # this file's runs: 2 ranks, 6 steps, fixed, unless a test says otherwise
MLP = ModelConfig("mlp", layers=4, hidden=16)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


FULL_AT = 20_000  # bytes a file may grow to on the rank with a full disk: less than a checkpoint needs


def _train_with_a_full_disk(rank: int, world: int, config: Any, full_rank: int, limit: int) -> Any:
    """Train with files on rank ``full_rank`` limited to ``limit`` bytes (RLIMIT_FSIZE): a write past it fails
    with EFBIG, as a write to a full disk fails with ENOSPC, for real, in the kernel. The limit is lifted
    afterwards: the group's later cases write files."""
    if rank != full_rank:
        return _train_rank(rank, world, config)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        return _train_rank(rank, world, config)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _save_past_a_size_limit(rank: int, world: int, folder: str, limit: int) -> str:
    """Save a 256 x 256 layer and its AdamW state on every rank, rank 1's files limited to ``limit`` bytes (as
    :func:`_train_with_a_full_disk`): the limit falls inside a tensor that torch's zip writer writes."""
    torch.manual_seed(rank)
    layer = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(layer.parameters())
    layer(torch.ones(2, 256)).sum().backward()
    optimizer.step()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if rank == 1:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        save_checkpoint(folder, {rank: layer}, optimizer, 3)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    return "saved"


class _FullAfter:
    """A file on a disk with ``room`` bytes left: past them every write fails with ENOSPC, as the kernel's do."""

    def __init__(self, file: Any, room: int) -> None:
        self._file, self._room = file, room

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size > self._room:
            self._room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= size
        return int(self._file.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _FullAfter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def _train_until_the_disk_fills(rank: int, world: int, config: Any, full_rank: int, step: str) -> Any:
    """Train with the disk of rank ``full_rank`` full once it writes the checkpoint files of ``step`` (each file
    of it opened for writing takes 1,000 bytes)."""
    if rank != full_rank:
        return _train_rank(rank, world, config)
    opened = io.open

    def open_on_a_full_disk(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        found = opened(file, mode, *args, **kwargs)
        name = str(getattr(found, "name", file))
        full = "w" in mode and (step in name or step in str(file)) and ".distcp" in name + str(file)
        return _FullAfter(found, 1000) if full else found

    io.open = builtins.open = open_on_a_full_disk
    try:
        return _train_rank(rank, world, config)
    finally:
        io.open = builtins.open = opened


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The runs that start from nothing, on one spawned group: 6 steps uninterrupted (the baseline the
    resumed runs must equal), 4 of them saved after steps 2 and 4 (the pristine folder the damage tests copy),
    a run with a failing save, a 5-step run keeping 2 checkpoints, and a 4-step MLP run."""
    root = tmp_path_factory.mktemp("first")
    names = ("four", "failing", "keeps", "mlp", "final", "full", "no space", "cosine", "zip")
    folders = {name: root / name / "ck" for name in names}
    cases = {
        "uninterrupted": Case(_train_rank, (_config(),)),
        "four": Case(_train_rank, (_config(steps=4, checkpoint_dir=str(folders["four"]), checkpoint_every=2),)),
        # A timeout of 120 s: a rank left waiting for the failed one would take that long.
        "failing": Case(
            _train_rank,
            (
                _config(
                    checkpoint_dir=str(folders["failing"]), checkpoint_every=2, faults=("savefail:1:3",), timeout=120
                ),
            ),
        ),
        "keeps": Case(
            _train_rank,
            (_config(steps=5, checkpoint_dir=str(folders["keeps"]), checkpoint_every=1, checkpoint_keep=2),),
        ),
        "mlp": Case(
            _train_rank,
            (_config(model=MLP, steps=4, checkpoint_dir=str(folders["mlp"]), checkpoint_every=1, checkpoint_keep=2),),
        ),
        "final": Case(_train_rank, (_config(steps=5, checkpoint_dir=str(folders["final"]), checkpoint_every=3),)),
        "full": Case(
            _train_with_a_full_disk,
            (_config(checkpoint_dir=str(folders["full"]), checkpoint_every=2, timeout=120), 1, FULL_AT),
        ),
        "zip": Case(_save_past_a_size_limit, (str(folders["zip"]), 100_000)),
        "no space": Case(
            _train_until_the_disk_fills,
            (_config(checkpoint_dir=str(folders["no space"]), checkpoint_every=2, timeout=120), 0, "step-00000004"),
        ),
        "cosine": Case(
            _train_rank,
            (
                _config(
                    steps=4,
                    checkpoint_dir=str(folders["cosine"]),
                    checkpoint_every=2,
                    lr_schedule="warmup-cosine",
                    warmup_steps=1,
                ),
            ),
        ),
    }
    return {"folders": folders, "results": run_cases(2, cases, timeout_s=120)}


@pytest.fixture(scope="module")
def uninterrupted(first_runs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The parameters after 6 steps without any fault."""
    result = succeeded(first_runs["results"]["uninterrupted"])[0]
    assert result is not None and result.state is not None
    return result.state  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def four_steps(first_runs: dict[str, Any]) -> Path:
    """A run of 4 of the 6 steps, saved after steps 2 and 4 (the pristine copy; tests work on copies)."""
    succeeded(first_runs["results"]["four"])
    folder: Path = first_runs["folders"]["four"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest",
        "run.json",
        "run.lock",
        "step-00000002",
        "step-00000004",
    ]
    return folder


# -- a corrupt or incomplete checkpoint falls back to the previous valid one ------------------------------------


def _truncate(folder: Path) -> str:
    path = folder / "step-00000004" / "__1_0.distcp"
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size // 2)
    return f"step-00000004: __1_0.distcp has {size // 2} bytes, {size} were written; resuming from step-00000002"


def _flip(folder: Path) -> str:
    path = folder / "step-00000004" / "__0_0.distcp"
    data = bytearray(path.read_bytes())
    data[1000:1400] = bytes(255 - b for b in data[1000:1400])  # 400 bytes overwritten, the size unchanged
    path.write_bytes(bytes(data))
    return (
        "step-00000004: __0_0.distcp is not the file that was written (checksum differs); resuming from step-00000002"
    )


def _no_metadata(folder: Path) -> str:
    (folder / "step-00000004" / ".metadata").unlink()
    return "step-00000004: .metadata is missing; resuming from step-00000002"


def _no_manifest(folder: Path) -> str:
    (folder / "step-00000004" / "manifest.json").unlink()
    return (
        "step-00000004 has no manifest.json (its save never finished, or hintpipe before 0.3 wrote it); "
        "resuming from step-00000002"
    )


def _empty_latest(folder: Path) -> str:
    (folder / "latest").write_text("")
    return ""


def _nothing_usable(folder: Path) -> str:
    (folder / "step-00000004" / "manifest.json").unlink()
    (folder / "step-00000002" / "__0_0.distcp").unlink()
    return ""


DAMAGES = {f.__name__: f for f in (_truncate, _flip, _no_metadata, _no_manifest, _empty_latest, _nothing_usable)}


@pytest.fixture(scope="module")
def resumed(four_steps: Path, first_runs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every resume from a damaged copy of the 4-step folder, and a resume of the MLP run with a smaller MLP,
    on one spawned group; each case's folder, what its damage said, and its snapshot before the run."""
    root = tmp_path_factory.mktemp("resumed")
    cases: dict[str, Case] = {}
    said: dict[str, str] = {}
    folders: dict[str, Path] = {}
    before: dict[str, dict[str, bytes]] = {}
    for name, damage in DAMAGES.items():
        folder = folders[name] = root / name / "ck"
        shutil.copytree(four_steps, folder)
        said[name] = damage(folder)
        before[name] = _snapshot(folder)
        config = _config(checkpoint_dir=str(folder), checkpoint_every=2, checkpoint_keep=3, resume=True)
        cases[name] = Case(_train_rank, (config,))
    succeeded(first_runs["results"]["mlp"])
    folders["smaller"] = first_runs["folders"]["mlp"]
    before["smaller"] = _snapshot(folders["smaller"])
    smaller = ModelConfig("mlp", layers=2, hidden=16)
    config = _config(model=smaller, steps=8, checkpoint_dir=str(folders["smaller"]), checkpoint_every=1, resume=True)
    cases["smaller"] = Case(_train_rank, (config,))
    for name in ("another", "replaced"):  # a fresh run in a folder holding the 4-step run's checkpoints
        folder = folders[name] = root / name / "ck"
        shutil.copytree(four_steps, folder)
        before[name] = _snapshot(folder)
        config = _config(steps=4, checkpoint_dir=str(folder), checkpoint_every=2, replace_checkpoints=name != "another")
        cases[name] = Case(_train_rank, (config,))
    # The 4-step run of 2 stages, resumed as 4 stages (interleaved on the same 2 ranks): another plan.
    folder = folders["replanned"] = root / "replanned" / "ck"
    shutil.copytree(four_steps, folder)
    config = _config(checkpoint_dir=str(folder), checkpoint_every=2, resume=True, hint="interleaved-1f1b", chunks=2)
    cases["replanned"] = Case(_train_rank, (config,))
    # Resumes that would reshape the learning rate's schedule: a warm-up-cosine run of 4 steps resumed as 8, and
    # the 4-step run (a constant rate) resumed with another rate.
    succeeded(first_runs["results"]["cosine"])
    folders["longer"] = first_runs["folders"]["cosine"]
    before["longer"] = _snapshot(folders["longer"])
    config = _config(steps=8, checkpoint_dir=str(folders["longer"]), resume=True, lr_schedule="warmup-cosine")
    cases["longer"] = Case(_train_rank, (dataclasses.replace(config, warmup_steps=1),))
    folder = folders["other rate"] = root / "other rate" / "ck"
    shutil.copytree(four_steps, folder)
    cases["other rate"] = Case(_train_rank, (_config(checkpoint_dir=str(folder), resume=True, lr=2e-3),))
    folders["empty"] = root / "empty" / "ck"
    cases["empty"] = Case(_train_rank, (_config(steps=2, checkpoint_dir=str(folders["empty"]), resume=True),))
    return {"results": run_cases(2, cases, timeout_s=120), "said": said, "folders": folders, "before": before}


@pytest.mark.parametrize("damage", ["_truncate", "_flip", "_no_metadata", "_no_manifest"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    damage: str, resumed: dict[str, Any], uninterrupted: dict[str, torch.Tensor]
) -> None:
    folder = resumed["folders"][damage]
    result = succeeded(resumed["results"][damage])[0]
    assert result is not None and result.state is not None
    assert result.notes == (resumed["said"][damage],)
    assert (result.resumed_from, result.resumed_checkpoint) == (2, str(folder / "step-00000002"))
    assert _equal(result.state, uninterrupted)  # steps 2..5 again, bitwise the same as without the fault
    # The good checkpoint survived the run, byte for byte: pruning keeps 3 verified checkpoints (step-6, the new
    # step-4, and step-2).
    good = {k.removeprefix("step-00000002/"): v for k, v in resumed["before"][damage].items() if "step-00000002" in k}
    assert _snapshot(folder / "step-00000002") == good
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest",
        "run.json",
        "run.lock",
        "step-00000002",
        "step-00000004",
        "step-00000006",
    ]


def test_an_empty_latest_pointer_does_not_matter(
    resumed: dict[str, Any], uninterrupted: dict[str, torch.Tensor]
) -> None:
    result = succeeded(resumed["results"]["_empty_latest"])[0]
    assert result is not None and result.state is not None
    assert (result.resumed_from, result.notes) == (4, ())
    assert _equal(result.state, uninterrupted)


def test_no_usable_checkpoint_is_one_line_naming_each(resumed: dict[str, Any]) -> None:
    folder = resumed["folders"]["_nothing_usable"]
    assert failure_text(resumed["results"]["_nothing_usable"]) == (
        f"ranks 0, 1: CheckpointError: resuming from {folder} failed (rank 0: no usable checkpoint in {folder} "
        "(step-00000004 has no manifest.json (its save never finished, or hintpipe before 0.3 wrote it); "
        "step-00000002: __0_0.distcp is missing); "
        "start fresh without resuming, or in another checkpoint folder)"
    )
    assert _snapshot(folder) == resumed["before"]["_nothing_usable"]


# -- resuming another run is refused, and its checkpoints are left as they were -------------------------------


def test_resuming_with_a_changed_model_is_refused_with_the_originals_intact(resumed: dict[str, Any]) -> None:
    folder = resumed["folders"]["smaller"]
    text = failure_text(resumed["results"]["smaller"])
    assert text == (
        f"ranks 0, 1: CheckpointError: resuming from {folder} failed (rank 0: {folder / 'step-00000004'} was "
        "written for another model (4 tensors only in the checkpoint (2.0.bias 16, 2.0.weight 16x16, ...)); "
        f"resume with the model it was written for, or start fresh in another checkpoint folder ({folder} is left "
        "as it is))"
    ), text
    assert "\n" not in text
    assert _snapshot(folder) == resumed["before"]["smaller"]


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference between two state dicts of the same names."""
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("longer", "steps 4, this one 8: resuming would change the learning-rate schedule (warmup-cosine) mid-run; "
         "resume with steps 4 to keep it"),
        ("other rate", "lr 0.001, this one 0.002: resuming would change the learning-rate schedule (constant) "
         "mid-run; resume with lr 0.001 to keep it"),
    ],
)  # fmt: skip
def test_a_resume_that_would_reshape_the_learning_rate_is_refused(
    resumed: dict[str, Any], case: str, said: str
) -> None:
    # Before, --steps raised on resume reshaped a warm-up-cosine schedule silently (the rate went to 0, then up).
    folder = resumed["folders"][case]
    assert failure_text(resumed["results"][case]) == (
        f"ranks 0, 1: CheckpointError: the checkpoint's run has {said}, or start a new run in another checkpoint folder"
    )
    if case in resumed["before"]:
        assert _snapshot(folder) == resumed["before"][case]


def test_a_warmup_longer_than_the_run_is_refused() -> None:
    with pytest.raises(ValueError) as refused:
        _config(steps=4, lr_schedule="warmup-cosine", warmup_steps=5)
    assert str(refused.value) == (
        "warmup_steps 5 is more than steps 4: the warm-up would never end; use warmup_steps 4 or fewer"
    )


def test_a_run_resumes_under_another_plan_of_the_same_model(
    resumed: dict[str, Any], uninterrupted: dict[str, torch.Tensor]
) -> None:
    # Checkpoints name tensors as the model does (layer 2's weight is 2.0.weight whichever stage holds it), so
    # 2 stages saved resume as 4. The maths is the same; gradients accumulate over micro-batches in the
    # interleaved order, so float32 sums differ in their last bits: 1e-5 after 2 AdamW steps of lr 1e-3.
    result = succeeded(resumed["results"]["replanned"])[0]
    assert result.resumed_from == 4 and result.notes == ()
    assert _close(result.state, uninterrupted) < 1e-5
    folder = resumed["folders"]["replanned"]
    assert Manifest.read(folder / "step-00000006").identity.stage_ranks == [0, 1, 0, 1]


def test_the_command_line_resumes_with_more_ranks(tmp_path: Path) -> None:
    # Saved by 2 ranks after step 2, resumed by 3 to step 4: rank 2 has no random state in the checkpoint (it
    # keeps its own; this model draws none), and the run ends as an uninterrupted 2-rank run does.
    two, three = tmp_path / "two", tmp_path / "three"

    def train(ranks: int, steps: int, folder: Path, *more: str) -> list[str]:
        argv = [sys.executable, "-m", "hintpipe", "train", *CLI_MODEL, "--ranks", str(ranks), "--json"]
        return [*argv, "--steps", str(steps), "--checkpoint-dir", str(folder), "--checkpoint-every", "2", *more]

    straight = subprocess.Popen(train(2, 4, two), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = _run(train(2, 2, three))
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _run(train(3, 4, three, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = "hintpipe train: rank 2 found no random state in step-00000002 (saved by fewer ranks) and kept its own"
    assert said in resumed.stderr.splitlines(), resumed.stderr
    _, err = straight.communicate(timeout=hang_bound(TIMEOUT))
    assert straight.returncode == 0, err[-3000:]
    assert _close(load_merged(three), load_merged(two)) < 1e-5
    assert Manifest.read(three / "step-00000004").identity.stage_ranks == [0, 1, 2]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=hang_bound(TIMEOUT))


def test_a_fresh_run_in_another_runs_folder_is_refused_naming_its_checkpoints(resumed: dict[str, Any]) -> None:
    folder = resumed["folders"]["another"]
    assert failure_text(resumed["results"]["another"]) == (
        f"ranks 0, 1: CheckpointError: starting a run in {folder} failed (rank 0: {folder} holds the checkpoints of "
        "another run (step-00000002, step-00000004): resume that run (--resume), start in another folder, or "
        "replace them (--replace-checkpoints))"
    )
    assert _snapshot(folder) == resumed["before"]["another"]


def test_replacing_another_runs_checkpoints_starts_a_new_run(
    resumed: dict[str, Any], first_runs: dict[str, Any]
) -> None:
    folder = resumed["folders"]["replaced"]
    result = succeeded(resumed["results"]["replaced"])[0]
    old_run = json.loads(resumed["before"]["replaced"]["run.json"])["run"]
    new_run = json.loads((folder / "run.json").read_text())["run"]
    assert new_run != old_run
    assert {Manifest.read(folder / name).identity.run for name in ("step-00000002", "step-00000004")} == {new_run}
    # The same 4 steps as the run it replaced: the same parameters, in checkpoints of its own.
    assert _equal(result.state, succeeded(first_runs["results"]["four"])[0].state)
    assert _equal(load_merged(folder / "step-00000004"), result.state)


def test_resuming_an_empty_folder_starts_a_run_there_and_says_so(resumed: dict[str, Any]) -> None:
    folder = resumed["folders"]["empty"]
    result = succeeded(resumed["results"]["empty"])[0]
    assert (result.resumed_from, result.notes) == (
        0,
        (f"{folder} holds no checkpoint to resume: a new run starts there",),
    )
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "run.json", "run.lock", "step-00000002"]


def test_the_command_line_refuses_another_runs_folder_before_starting_ranks(four_steps: Path) -> None:
    argv = [sys.executable, "-m", "hintpipe", "train", *CLI_MODEL, "--steps", "2", "--checkpoint-dir", str(four_steps)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=allow(60))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"hintpipe train: error: --checkpoint-dir {four_steps} holds the checkpoints of another run (step-00000002, "
        "step-00000004): resume that run (--resume), start in another folder, or replace them (--replace-checkpoints)"
    )


def test_identity_differences_name_what_changed() -> None:
    saved = RunIdentity({"0.w": [4, 4], "1.w": [4]}, [0, 1], "1f1b", {})
    assert saved.differences(saved) == []
    assert RunIdentity({"0.w": [4, 8], "1.w": [4]}, [0, 1], "gpipe", {"torch": "9"}).differences(saved) == [
        "1 tensors of another shape (0.w: 4x4 there, 4x8 here)"
    ]
    # Another placement of the same tensors resumes: torch.distributed.checkpoint loads tensors by name.
    assert RunIdentity(saved.tensors, [1, 0], "", {}).differences(saved) == []
    assert RunIdentity({"0.w": [4, 4]}, [0], "1f1b", {}).differences(saved) == [
        "1 tensors only in the checkpoint (1.w 4)"
    ]


# -- saving: finite values only, failures reach every rank at once, pruning waits for proof --------------------


def _save_nan(rank: int, world: int, folder: str) -> str:
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight[0, 0] = float("nan")
    optimizer = torch.optim.AdamW(layer.parameters())
    try:
        save_checkpoint(folder, {rank: layer}, optimizer, 7)
    except CheckpointError as exc:
        return str(exc)
    return "saved"


def test_a_parameter_that_is_not_finite_is_never_saved(tmp_path: Path) -> None:
    (message,) = run_ranks(_save_nan, 1, str(tmp_path / "ck"), timeout=TIMEOUT)
    assert message == (
        f"saving checkpoint step 7 in {tmp_path / 'ck'} failed (rank 0: parameter 0.weight is not finite; "
        "nothing was saved, the earlier checkpoints are kept)"
    )
    assert not (tmp_path / "ck" / "step-00000007").exists()


def _lost_after_publishing(rank: int, world: int, folder: str) -> str:
    """Rank 1 dies in a save's last phase, after every rank vouched for its files (rank 0 then publishes)."""
    from hintpipe.runtime.checkpoint import saving

    vouching = saving.together  # type: ignore[attr-defined]

    def together(action: Any, *args: Any, **kwargs: Any) -> Any:
        if rank == 1 and getattr(action, "__name__", "") == "finish":
            os._exit(1)
        return vouching(action, *args, **kwargs)

    saving.together = together  # type: ignore[attr-defined]
    torch.manual_seed(0)
    saving.save_checkpoint(folder, {rank: torch.nn.Linear(2, 2)}, None, 3)  # rank 0 raises, naming rank 1
    return "saved"


def test_a_rank_lost_after_its_checkpoint_was_published_says_it_is_whole(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    with pytest.raises(RankFailure) as failed:
        run_ranks(_lost_after_publishing, 2, str(folder), timeout=TIMEOUT)
    (said,) = [line for line in str(failed.value).splitlines() if line.startswith("rank 0: ")]
    assert re.fullmatch(
        rf"rank 0: CheckpointError: saving checkpoint step 3 in {re.escape(str(folder))} failed \(rank 1 stopped "
        rf"answering \(no sign of life for \d+ s\)\); {re.escape(str(folder / 'step-00000003'))} was whole and "
        r"published before that: --resume continues from it",
        said,
    ), said
    Manifest.read(folder / "step-00000003").verify(folder / "step-00000003")  # whole, as it says
    assert (folder / "latest").read_text() == "step-00000003"


def test_a_failing_save_ends_both_ranks_at_once(first_runs: dict[str, Any]) -> None:
    folder = first_runs["folders"]["failing"]
    results = first_runs["results"]["failing"]
    assert failure_text(results) == (
        f"ranks 0, 1: CheckpointError: saving checkpoint step 4 in {folder} failed (rank 1: "
        f"{folder / 'step-00000004.tmp'}: No space left on device (injected); free space on its file system, or use "
        "another checkpoint folder; nothing of this checkpoint was kept, the earlier ones are)"
    )
    elapsed = max(r.elapsed for r in results)
    assert elapsed < 120, elapsed  # it ended before the 120 s timeout could have fired (seconds here)
    assert find_checkpoint(folder)[0] == folder / "step-00000002"


def test_a_full_disk_ends_every_rank_in_one_line_and_frees_what_it_wrote(first_runs: dict[str, Any]) -> None:
    folder = first_runs["folders"]["full"]
    results = first_runs["results"]["full"]
    assert failure_text(results) == (  # before, "OSError: [Errno 27] File too large", no file named
        f"ranks 0, 1: CheckpointError: saving checkpoint step 2 in {folder} failed (rank 1: "
        f"{folder / 'step-00000002.tmp' / '__1_0.distcp'}: File too large; this process's file-size limit (ulimit "
        "-f) is reached: raise it, or use another checkpoint folder; nothing of this checkpoint was kept, the "
        "earlier ones are)"
    )
    assert max(r.elapsed for r in results) < 120  # it ended before the 120 s timeout could have fired
    assert sorted(p.name for p in folder.iterdir()) == ["run.json", "run.lock"]  # the partial step-00000002.tmp is gone


def test_a_size_limit_inside_a_tensor_is_named_not_lost_in_torchs_zip_writer(first_runs: dict[str, Any]) -> None:
    # Before: "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598".
    folder = first_runs["folders"]["zip"]
    assert failure_text(first_runs["results"]["zip"]) == (
        f"ranks 0, 1: CheckpointError: saving checkpoint step 3 in {folder} failed (rank 1: "
        f"{folder / 'step-00000003.tmp' / '__1_0.distcp'}: File too large; this process's file-size limit (ulimit "
        "-f) is reached: raise it, or use another checkpoint folder; nothing of this checkpoint was kept, the "
        "earlier ones are)"
    )
    assert list(folder.iterdir()) == []  # the partial step-00000003.tmp is gone


def test_a_disk_that_fills_during_a_save_is_named_and_the_earlier_checkpoint_kept(first_runs: dict[str, Any]) -> None:
    # Before, torch's zip writer lost the error: "RuntimeError: [enforce fail at inline_container.cc:672] .
    # unexpected pos ...".
    folder = first_runs["folders"]["no space"]
    assert failure_text(first_runs["results"]["no space"]) == (
        f"ranks 0, 1: CheckpointError: saving checkpoint step 4 in {folder} failed (rank 0: "
        f"{folder / 'step-00000004.tmp' / '__0_0.distcp'}: No space left on device; free space on its file system, "
        "or use another checkpoint folder; nothing of this checkpoint was kept, the earlier ones are)"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "run.json", "run.lock", "step-00000002"]
    assert (folder / "latest").read_text() == "step-00000002"
    Manifest.read(folder / "step-00000002").verify(folder / "step-00000002")


def test_the_last_step_is_saved_whatever_the_interval(first_runs: dict[str, Any]) -> None:
    result = succeeded(first_runs["results"]["final"])[0]
    folder = first_runs["folders"]["final"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest",
        "run.json",
        "run.lock",
        "step-00000003",
        "step-00000005",
    ]
    assert _equal(load_merged(folder / "step-00000005"), result.state)
    # A folder, or its latest pointer, is its newest verified checkpoint.
    assert _equal(load_merged(folder), result.state) and _equal(load_merged(folder / "latest"), result.state)


def test_pruning_waits_for_a_verified_newer_checkpoint(four_steps: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(four_steps, folder)
    shutil.copytree(folder / "step-00000002", folder / "step-00000001")
    manifest = Manifest.read(folder / "step-00000002")
    dataclasses.replace(manifest, step=1).write(folder / "step-00000001")  # as if saved at step 1
    assert Manifest.read(folder / "step-00000001").step == 1
    (folder / "step-00000004" / "__0_0.distcp").write_bytes(b"damaged")
    assert prune_checkpoints(folder, keep=1) == []  # the newest does not verify: everything older stays
    shutil.rmtree(folder / "step-00000004")
    shutil.copytree(four_steps / "step-00000004", folder / "step-00000004")
    assert prune_checkpoints(folder, keep=1) == [folder / "step-00000002", folder / "step-00000001"]
    with pytest.raises(DamagedCheckpoint, match=r"its manifest\.json is for step 2"):
        shutil.copytree(four_steps / "step-00000002", folder / "step-00000003")
        Manifest.read(folder / "step-00000003").verify(folder / "step-00000003")


def test_a_manifest_edited_by_hand_is_refused_in_one_line(four_steps: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(four_steps, folder)
    path = folder / "step-00000004" / "manifest.json"
    path.write_text(path.read_text().replace('"files": {', '"files": {"extra": [0, ""], ', 1))
    with pytest.raises(DamagedCheckpoint) as info:
        Manifest.read(folder / "step-00000004")
    assert str(info.value) == "step-00000004: manifest.json was changed after it was written (its digest differs)"
    assert find_checkpoint(folder)[0] == folder / "step-00000002"  # skipped, as any damaged checkpoint


def test_a_run_keeps_the_proven_checkpoints(first_runs: dict[str, Any]) -> None:
    succeeded(first_runs["results"]["keeps"])
    folder = first_runs["folders"]["keeps"]
    # Exactly --checkpoint-keep 2, the last save pruned after too (before, step-3 was left as a third).
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest",
        "run.json",
        "run.lock",
        "step-00000004",
        "step-00000005",
    ]
    assert (folder / "latest").read_text() == "step-00000005"


# -- signals -------------------------------------------------------------------------------------------------


def _launch(folder: Path, steps: int = 100000, every: int = 2, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "hintpipe", "train", *CLI_MODEL, "--steps", str(steps), "--json"]
    argv += ["--checkpoint-dir", str(folder), "--checkpoint-every", str(every), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


CLI_MODEL = ["--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"]
CLI_MODEL += ["--microbatch-size", "2", "--policy", "fixed", "--timeout", str(TIMEOUT)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def _all_gone(pids: list[int], within: float = 10.0) -> bool:
    """Every process ended (the resource tracker leaves a moment after the launcher)."""
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _wait_training(process: subprocess.Popen[str], folder: Path) -> list[int]:
    """The launcher's processes (its children and theirs), once the first checkpoint is written (the ranks are
    mid-run)."""
    deadline = time.monotonic() + hang_bound(TIMEOUT)
    while not (folder / "latest").exists():
        assert process.poll() is None, process.communicate(timeout=allow(30))[1]
        assert time.monotonic() < deadline, "no checkpoint was ever written"
        time.sleep(0.1)
    return descendants(process.pid)


def _signalled(folder: Path, signum: int, to_group: bool) -> tuple[subprocess.Popen[str], str, list[int], float]:
    process = _launch(folder)
    ranks = _wait_training(process, folder)
    sent = time.monotonic()
    if to_group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, err = process.communicate(timeout=hang_bound(TIMEOUT))
    return process, err, ranks, time.monotonic() - sent


def _folders_of(launcher: int) -> list[Path]:
    """The temporary folders the launcher ``launcher`` made that still exist (other runs' come and go)."""
    found = []
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            if (folder / LAUNCHER_FILE).read_text().strip() == str(launcher):
                found.append(folder)
        except OSError:
            continue
    return found


def _check_stopped(process: subprocess.Popen[str], err: str, signum: int, folder: Path) -> int:
    """The run said, in its last line, which checkpoint it saved after which step; returns that step."""
    assert process.returncode == 128 + signum, err
    saved = max(p for p in folder.iterdir() if p.name.startswith("step-"))
    step = int(saved.name.removeprefix("step-"))
    assert err.strip().splitlines()[-1] == (
        f"hintpipe train: stopped by {signal.Signals(signum).name} after step {step} of 100000: checkpoint {saved} "
        f"saved; --resume continues from step {step}"
    ), err
    Manifest.read(saved).verify(saved)
    return step


@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGINT, False), (signal.SIGHUP, True)])
def test_a_signal_finishes_the_step_saves_and_leaves_nothing_behind(
    signum: int, to_group: bool, tmp_path: Path
) -> None:
    # SIGTERM to the launcher alone: test_a_run_stopped_by_a_signal_resumes_bitwise. SIGHUP to the launcher and
    # its ranks, as a dropped SSH session sends it to the session's process group, stops the run as SIGTERM does.
    folder = tmp_path / "ck"
    process, err, ranks, elapsed = _signalled(folder, signum, to_group)
    assert elapsed < 30
    _check_stopped(process, err, signum, folder)
    assert len(ranks) >= 2 and _all_gone(ranks)  # the ranks (and multiprocessing's resource tracker)
    assert _folders_of(process.pid) == []  # this run left no temporary folder behind


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    # Messages 300 ms late: a step takes seconds, so the second signal comes while the ranks finish theirs.
    process = _launch(folder, 100000, 1, "--variability", "comm:300ms")
    ranks = _wait_training(process, folder)
    process.send_signal(signal.SIGINT)
    # Two signals pending at once are one (POSIX does not queue them): the second goes only once the launcher
    # has handled the first, which it says on stderr.
    assert process.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + hang_bound(TIMEOUT)
    while not any("again stops at once" in line for line in said):
        readable, _, _ = select.select([process.stderr], [], [], max(0.0, deadline - time.monotonic()))
        assert readable, "the launcher never said it handled the first signal: " + "".join(said)
        line = process.stderr.readline()
        assert line, "".join(said)
        said.append(line)
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=hang_bound(TIMEOUT))
    err = "".join(said) + rest
    assert process.returncode == 128 + signal.SIGINT, err
    assert err.strip().splitlines()[-1] == "hintpipe train: ranks killed after a second SIGINT; nothing more was saved"
    assert len(ranks) >= 2 and _all_gone(ranks)  # the ranks (and multiprocessing's resource tracker)
    assert _folders_of(process.pid) == []  # this run left no temporary folder behind


def _ranks_of(launcher: int) -> list[int]:
    """The launcher's rank processes: its children but multiprocessing's resource tracker and fork server, and
    the fork server's children (on Linux the ranks are forked from it)."""
    ranks = []
    for child in children(launcher):
        command = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"forkserver" in command:
            ranks += children(child)
        elif b"resource_tracker" not in command:
            ranks.append(child)
    return ranks


def test_a_rank_killed_mid_run_is_named_by_every_rank(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    process = _launch(folder, 100000, 1)
    _wait_training(process, folder)
    victim = _ranks_of(process.pid)[-1]
    os.kill(victim, signal.SIGKILL)  # as the out-of-memory killer does
    _, err = process.communicate(timeout=hang_bound(TIMEOUT))
    assert process.returncode == 1, err
    lines = err.strip().splitlines()
    killed = [line for line in lines if line.endswith(": exited without a result (killed by SIGKILL)")]
    assert len(killed) == 1, err
    dead = int(killed[0].split(":")[0].removeprefix("rank "))
    (other,) = [line for line in lines if line.startswith(f"rank {1 - dead}: ")]
    # Mid-step its peer's mailbox (or the step's loss broadcast, or the stop check after it) sees the
    # connection drop; during a save, the phase sees its heartbeat stop.
    mid_step = f"rank {1 - dead}: PeerFailure: rank {1 - dead}: rank {dead} failed in "
    saving = rf"rank {1 - dead}: CheckpointError: saving checkpoint step (\d+) in {re.escape(str(folder))} failed "
    saving += rf"\(rank {dead} stopped answering \(no sign of life for \d s\)\)"
    saving += rf"(; {re.escape(str(folder))}/step-\d+ was whole and published before that: --resume continues from it)?"
    assert _folders_of(process.pid) == []
    latest = (folder / "latest").read_text()
    Manifest.read(folder / latest).verify(folder / latest)
    # Which of the two it said is where the kill landed, and the folder says where that was (a checkpoint after
    # every step): in the save of the step after the newest checkpoint (or in that save's last phase, after rank 0
    # published it), or in the step that checkpoint began.
    newest = int(latest.removeprefix("step-"))
    in_save = re.fullmatch(saving, other)
    if in_save is not None and in_save.group(2):  # lost after rank 0 published the step it was saving
        assert int(in_save.group(1)) == newest, err
        assert in_save.group(2).startswith(f"; {folder / latest} was whole"), err
    elif in_save is not None:
        assert int(in_save.group(1)) == newest + 1, err
    else:
        assert other.startswith(mid_step), err
        named = re.search(r"step (-?\d+)", other.removeprefix(mid_step))
        assert named is not None and int(named.group(1)) == newest, err


@pytest.mark.parametrize("step", [None, 7])
def test_a_peer_lost_in_the_stop_check_names_the_step(monkeypatch: pytest.MonkeyPatch, step: int | None) -> None:
    def reset(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[../pair.cc:553] Connection closed by peer [127.0.0.1]:5506")

    monkeypatch.setattr(torch.distributed, "all_reduce", reset)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(liveness, "wait_for_silence", lambda: {1: 21.0})
    after = "a step" if step is None else "step 7"
    with pytest.raises(PeerFailure) as raised:
        stopping.StopRequest().agreed(step=step)
    said = f"rank 0: rank 1 failed in the check for a stop request after {after} "
    assert str(raised.value) == said + "(rank 1 stopped answering (no sign of life for 21 s))"
    monkeypatch.setattr(liveness, "wait_for_silence", lambda: {})
    with pytest.raises(PeerFailure) as raised:
        stopping.StopRequest().agreed(step=step)
    said = f"rank 0: the check for a stop request after {after} failed: "
    assert str(raised.value) == said + "RuntimeError: Connection closed by peer [127.0.0.1]:5506"


def test_sigquit_stops_at_once_and_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    process = _launch(folder, 100000, 1)
    ranks = _wait_training(process, folder)
    process.send_signal(signal.SIGQUIT)
    _, err = process.communicate(timeout=hang_bound(TIMEOUT))
    assert process.returncode == 128 + signal.SIGQUIT, err
    assert err.strip().splitlines()[-1] == "hintpipe train: ranks killed after SIGQUIT; nothing more was saved"
    assert len(ranks) >= 2 and _all_gone(ranks)
    assert _folders_of(process.pid) == []
    Manifest.read(folder / (folder / "latest").read_text()).verify(folder / (folder / "latest").read_text())


def test_a_run_stopped_by_a_signal_resumes_bitwise(tmp_path: Path) -> None:
    stopped, reference = tmp_path / "stopped", tmp_path / "reference"
    process, err, ranks, elapsed = _signalled(stopped, signal.SIGTERM, to_group=False)
    assert elapsed < 30
    step = _check_stopped(process, err, signal.SIGTERM, stopped)
    assert len(ranks) >= 2 and _all_gone(ranks)  # the ranks (and multiprocessing's resource tracker)
    assert _folders_of(process.pid) == []  # this run left no temporary folder behind
    end = str(step + 2)
    for folder, more in ((stopped, ["--resume"]), (reference, [])):
        argv = [sys.executable, "-m", "hintpipe", "train", *CLI_MODEL, "--steps", end, "--json"]
        argv += ["--checkpoint-dir", str(folder), "--checkpoint-every", "1", *more]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=hang_bound(TIMEOUT))
        assert done.returncode == 0, done.stderr[-3000:]
    final = f"step-{step + 2:08d}"
    assert _equal(load_merged(stopped / final), load_merged(reference / final))


@pytest.mark.parametrize("frozen", [0, 1])
def test_a_rank_stopped_while_it_saves_is_named_and_every_rank_ends(tmp_path: Path, frozen: int) -> None:
    # A rank stops itself (SIGSTOP) inside its save of step 2, as a rank does on a frozen disk or a debugger
    # attaching: the other names it once its heartbeat has been silent for --timeout, and the launcher kills it.
    # Rank 0 too: the rendezvous store lives in the launcher, not in rank 0, so it does not stop with it.
    folder, other = tmp_path / "ck", 1 - frozen
    began = time.monotonic()
    process = _launch(folder, 4, 1, "--faults", f"savestop:{frozen}:1", "--timeout", "5")
    _, err = process.communicate(timeout=hang_bound(5.0))
    elapsed = time.monotonic() - began
    assert process.returncode == 1, err
    said = err.strip().splitlines()[-3:]
    assert said[0] == "hintpipe train: failed:", err
    assert said[1 + frozen] == f"rank {frozen}: exited without a result (stopped by the launcher)", err
    # The cause, asserted: the frozen rank is named, and the silence it reports is at least what makes a rank
    # count as stopped (liveness.SILENT_AFTER) and at most the run's whole time (not a figure of the clock).
    saving = rf"rank {other}: CheckpointError: saving checkpoint step 2 in {re.escape(str(folder))} failed "
    found = re.fullmatch(
        saving + rf"\(rank {frozen} stopped answering \(no sign of life for (\d+) s\)\)", said[1 + other]
    )
    assert found is not None, said[1 + other]
    assert liveness.SILENT_AFTER <= int(found.group(1)) <= elapsed
    assert elapsed < 60, elapsed  # start-up, a step, 5 s of silence: seconds, not the default 300 s timeout
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "run.json", "run.lock", "step-00000001"]
    Manifest.read(folder / "step-00000001").verify(folder / "step-00000001")
    assert _all_gone(_group(process.pid))  # the ranks (and multiprocessing's resource tracker, a moment later)


def _read_a_fifo(rank: int, world: int, fifo: str) -> int:
    from hintpipe.runtime.checkpoint.collective import together

    return together(lambda: len(Path(fifo).read_bytes()), f"reading {fifo}", error=CheckpointError)[rank]


def test_ranks_blocked_in_file_io_end_naming_what_they_awaited(tmp_path: Path) -> None:
    # Every rank opens a FIFO no one writes (a forged checkpoint's "file"): before, each blocked in open() while
    # its heartbeat went on, and nothing ended. A writer comes after 60 s, so that a runtime without the
    # watchdog ends too (and fails the test) rather than hang it.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer_at_last() -> None:
        if done.wait(60):
            return
        while not done.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader yet
                time.sleep(0.1)

    valve = threading.Thread(target=writer_at_last, daemon=True)
    valve.start()
    try:
        with pytest.raises(RankFailure) as failed:
            run_ranks(_read_a_fifo, 2, str(fifo), timeout=2.0)
    finally:
        done.set()
        valve.join(timeout=allow(10))
    assert str(failed.value).splitlines() == [
        f"rank {rank}: CheckpointError: reading {fifo} failed (rank {rank}: its own part of reading {fifo} made no "
        "progress in 7 s (blocked in file I/O: a FIFO, a hung file system?))"
        for rank in (0, 1)
    ]


def _group(pid: int) -> list[int]:
    """The processes of the session ``pid`` leads (a launcher started in a session of its own, and its ranks)."""
    found = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True, timeout=allow(30)).stdout.split()
    return [int(p) for p in found if _alive(int(p))]


def _published(folder: Path) -> set[int]:
    """The steps of the checkpoints published in ``folder`` (renamed into place; a ``.tmp`` one is not)."""
    return {int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if p.name[5:].isdigit()}


def _nothing_published_after(at_kill: set[int], now: set[int]) -> bool:
    """Whether ``now`` holds no checkpoint published after the kill that ``at_kill`` was listed at: at most the
    one step after the newest then, a save that had passed its last check (see [Note: nothing published after
    the launcher died]) and was renaming its folder when the process it checks died."""
    return now - at_kill <= {max(at_kill, default=0) + 1}


def test_ranks_never_outlive_a_killed_launcher(tmp_path: Path) -> None:
    # SIGKILL to the launcher while its ranks start (0.3 s and 1.5 s in: before and while they import torch) and
    # once they train (its first checkpoint written): every rank ends, and no checkpoint is published after the
    # kill (the folder listed at the kill, and again once every process is gone). Three runs at once, each
    # saving every step.
    runs = {name: _launch(tmp_path / name, 100000, 1) for name in ("0.3 s", "1.5 s", "training")}
    try:
        began = time.monotonic()
        at_kill: dict[str, set[int]] = {}
        for name, process in runs.items():
            if name == "training":
                _wait_training(process, tmp_path / name)
            else:
                time.sleep(max(0.0, began + float(name.split()[0]) - time.monotonic()))
            process.kill()
            at_kill[name] = _published(tmp_path / name)
            process.wait(timeout=allow(15))  # not communicate(): a rank left alive holds the pipes open
        assert at_kill["training"], "the training run was killed before its first checkpoint"
        for name, process in runs.items():
            deadline = time.monotonic() + allow(15)
            while _group(process.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _group(process.pid) == [], f"killed at {name}: ranks left"
            process.communicate(timeout=allow(15))
        for name in runs:
            assert _nothing_published_after(at_kill[name], _published(tmp_path / name)), (name, at_kill[name])
    finally:  # a rank left alive by a failed check: its session, killed (the launcher led it)
        for process in runs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def test_a_dead_launchers_temporary_folder_is_removed_by_the_next() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=allow(30))  # its pid is no one's now
    stale = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (stale / LAUNCHER_FILE).write_text(str(dead.pid))
    (stale / "rank0.pkl").write_bytes(b"left behind")
    mine = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (mine / LAUNCHER_FILE).write_text(str(os.getpid()))  # a live launcher's: kept
    try:
        assert stale in remove_stale_folders()
        assert not stale.exists() and mine.is_dir()
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)


def _readme_loop(rank: int, world: int, folder: str, stop_file: str, steps: int) -> tuple[int, int, str]:
    """The README's training loop: Checkpointer and StopRequest around Pipeline.step."""
    from hintpipe.apps.models import build_layers, lm_loss, make_batch, split_layers
    from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
    from hintpipe.runtime.checkpoint.stopping import StopRequest
    from hintpipe.runtime.pipeline import Pipeline

    stages = split_layers(build_layers(MODEL), world)
    done = 0
    pipe = Pipeline.from_modules(stages, loss_fn=lm_loss, microbatches=2, policy="fixed")
    with pipe, StopRequest(stop_file) as stop:
        optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()])
        checkpoints = Checkpointer(folder, pipe, optimizer, every=100)
        first = checkpoints.resume()
        for step in range(first, steps):
            inputs, targets, _ = make_batch(MODEL, 2, 2, SeqLenDist(8), step, 0)
            pipe.step(inputs, target=targets)
            optimizer.step()
            optimizer.zero_grad()
            done = step + 1
            stopping = stop.agreed()
            checkpoints.after_step(done, stopping=stopping)
            if stopping:
                break
    return first, done, stop.name


def test_the_readme_loop_stops_saved_and_resumes(tmp_path: Path) -> None:
    folder, stop_file = str(tmp_path / "ck"), tmp_path / "stop"
    stop_file.write_text(str(int(signal.SIGTERM)))  # as the launcher writes it on a signal
    first = run_ranks(_readme_loop, 2, folder, str(stop_file), 5, timeout=TIMEOUT)
    assert first == [(0, 1, "SIGTERM")] * 2  # every rank stopped after the same, first, step
    assert find_checkpoint(folder)[0] == tmp_path / "ck" / "step-00000001"
    stop_file.unlink()
    assert run_ranks(_readme_loop, 2, folder, str(stop_file), 3, timeout=TIMEOUT) == [(1, 3, "")] * 2


# -- elastic restarts under torchrun ----------------------------------------------------------------------------


def test_an_elastic_restart_resumes_and_ends_bitwise_equal(tmp_path: Path) -> None:
    common = ["--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"]
    common += ["--policy", "fixed", "--steps", "6", "--checkpoint-every", "1", "--json", "--timeout", str(TIMEOUT)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    restarted, reference = tmp_path / "restarted", tmp_path / "reference"
    fault = ["--checkpoint-dir", str(restarted), "--resume", "--faults", "crash:1:3"]
    elastic = subprocess.run(
        [*torchrun, "--max-restarts", "1", "-m", "hintpipe", "train", *common, *fault],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT) * 2,
    )
    assert elastic.returncode == 0, elastic.stderr[-3000:]
    assert '"resumed_from": 3' in elastic.stdout  # the second attempt went on from the last checkpoint
    plain = subprocess.run(
        [sys.executable, "-m", "hintpipe", "train", *common, "--checkpoint-dir", str(reference)],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert _equal(load_merged(restarted / "step-00000006"), load_merged(reference / "step-00000006"))


def test_ranks_never_outlive_a_killed_torchrun_agent(tmp_path: Path) -> None:
    # SIGKILL to torchrun's agent once its ranks train (saving every step): both ranks end within seconds of the
    # kill, no checkpoint is published after it (listed at the kill, and again once the ranks are gone), and the
    # folder is free again (rank 0 held it). The output goes to a file: a pipe would be held open by a rank
    # left alive, and reading it would wait for that rank instead of failing.
    folder = tmp_path / "ck"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv = [*torchrun, "-m", "hintpipe", "train", *CLI_MODEL, "--steps", "100000", "--json"]
    log = (tmp_path / "agent.txt").open("w")
    agent = subprocess.Popen(
        [*argv, "--checkpoint-dir", str(folder), "--checkpoint-every", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + hang_bound(TIMEOUT)
        while not (folder / "latest").exists():
            assert agent.poll() is None, (tmp_path / "agent.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint was ever written"
            time.sleep(0.1)
        ranks = descendants(agent.pid)
        assert len(ranks) == 2
        agent.kill()
        killed = time.monotonic()
        at_kill = _published(folder)
        gone = _all_gone(ranks, within=15.0)
        ended_within = time.monotonic() - killed
        assert gone, f"ranks left training {ended_within:.0f} s after their agent died"
        assert _nothing_published_after(at_kill, _published(folder)), (at_kill, _published(folder))
    finally:
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        agent.kill()
        agent.wait(timeout=allow(15))
        log.close()
    from hintpipe.runtime.checkpoint.folder_lock import FolderInUse, FolderLock

    # The folder is free once the run's last process is: the lock goes with the process that held it, which the
    # kernel may still be ending a moment after its pid stopped answering (15 s, as for the ranks above).
    deadline = time.monotonic() + allow(15.0)
    while True:
        try:
            with FolderLock(folder) as lock:
                assert lock.held
            break
        except FolderInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
