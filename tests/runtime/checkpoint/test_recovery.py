"""Nothing lost, nothing silently wrong: verified checkpoints, failing saves, resumes (a run stopped from
outside: tests/runtime/checkpoint/test_stopping.py).

Each test reproduces a fault and asserts what the run does about it: which
checkpoint is used, the message, that good checkpoints survive, the time bound,
that no process or temporary folder is left behind.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SMALL_CLI, SMALL_GPT, allow, hang_bound, same_tensors, small_run
from groups import Case, failure_text, run_cases, succeeded
from hintpipe.apps.models import ModelConfig
from hintpipe.apps.training import _train_rank
from hintpipe.runtime.checkpoint.manifest import DamagedCheckpoint, Manifest, RunIdentity
from hintpipe.runtime.checkpoint.merged import load_merged
from hintpipe.runtime.checkpoint.saving import (
    CheckpointError,
    find_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from hintpipe.runtime.errors import RankFailure
from hintpipe.runtime.launch import run_ranks

MODEL = SMALL_GPT
TIMEOUT = 20.0


_config = small_run  # this file's runs: 2 ranks, 6 steps, fixed, unless a test says otherwise
MLP = ModelConfig("mlp", layers=4, hidden=16)


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
    return {"folders": folders, "results": run_cases(2, cases, timeout=120)}


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
    cases["longer"] = Case(_train_rank, (config.replaced(warmup_steps=1),))
    folder = folders["other rate"] = root / "other rate" / "ck"
    shutil.copytree(four_steps, folder)
    cases["other rate"] = Case(_train_rank, (_config(checkpoint_dir=str(folder), resume=True, lr=2e-3),))
    folders["empty"] = root / "empty" / "ck"
    cases["empty"] = Case(_train_rank, (_config(steps=2, checkpoint_dir=str(folders["empty"]), resume=True),))
    return {"results": run_cases(2, cases, timeout=120), "said": said, "folders": folders, "before": before}


@pytest.mark.parametrize("damage", ["_truncate", "_flip", "_no_metadata", "_no_manifest"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    damage: str, resumed: dict[str, Any], uninterrupted: dict[str, torch.Tensor]
) -> None:
    folder = resumed["folders"][damage]
    result = succeeded(resumed["results"][damage])[0]
    assert result is not None and result.state is not None
    assert result.notes == (resumed["said"][damage],)
    assert (result.resumed_from, result.resumed_checkpoint) == (2, str(folder / "step-00000002"))
    assert same_tensors(result.state, uninterrupted)  # steps 2..5 again, bitwise the same as without the fault
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
    assert same_tensors(result.state, uninterrupted)


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
        argv = [sys.executable, "-m", "hintpipe", "train", *SMALL_CLI, "--ranks", str(ranks), "--json"]
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
    assert same_tensors(result.state, succeeded(first_runs["results"]["four"])[0].state)
    assert same_tensors(load_merged(folder / "step-00000004"), result.state)


def test_resuming_an_empty_folder_starts_a_run_there_and_says_so(resumed: dict[str, Any]) -> None:
    folder = resumed["folders"]["empty"]
    result = succeeded(resumed["results"]["empty"])[0]
    assert (result.resumed_from, result.notes) == (
        0,
        (f"{folder} holds no checkpoint to resume: a new run starts there",),
    )
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "run.json", "run.lock", "step-00000002"]


def test_the_command_line_refuses_another_runs_folder_before_starting_ranks(four_steps: Path) -> None:
    argv = [sys.executable, "-m", "hintpipe", "train", *SMALL_CLI, "--steps", "2", "--checkpoint-dir", str(four_steps)]
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
    assert same_tensors(load_merged(folder / "step-00000005"), result.state)
    # A folder, or its latest pointer, is its newest verified checkpoint.
    assert same_tensors(load_merged(folder), result.state) and same_tensors(
        load_merged(folder / "latest"), result.state
    )


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
