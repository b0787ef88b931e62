"""A planned model's run repeats, and its resume goes on exactly: a Hugging Face folder with dropout (GPT-2's
default 0.1), planned by ``hintpipe train``, under the ``ready`` policy.

Before: two runs of one plan with one seed drew other dropout masks (each launch's ranks started from another
generator state, and ``ready`` ran forwards in message order); a resume planned afresh from new measurements
and could cut the model elsewhere. See [Note: a task's random numbers] (hintpipe.runtime.loop.task_seeds) and
[Note: a resume plans as its run did] (hintpipe.apps.run_profiles).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from conftest import parse_cli
from groups import Case, run_cases, succeeded
from hintpipe.apps.run_profiles import profile_key, record_profiles
from hintpipe.apps.train_config import TrainConfig
from hintpipe.apps.training import _train_rank
from hintpipe.cli.train import config_from
from hintpipe.cli.train_model import profile_cache
from hintpipe.runtime.checkpoint.merged import load_merged
from hintpipe.runtime.checkpoint.run_folder import PROFILES_FILE
from hintpipe.runtime.errors import CheckpointError

RUN = ["--ranks", "2", "--microbatches", "4", "--microbatch-size", "2", "--seq-len-dist", "fixed:16", "--steps", "4"]
RUN += ["--checkpoint-every", "2", "--policy", "ready", "--seed", "5"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer GPT-2 of width 32 with the config's default dropout (0.1 everywhere), as save_pretrained wrote it."""
    root = tmp_path_factory.mktemp("dropout-gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(root / "model")
    return root


def _config(folder: Path, run: str, *more: str) -> TrainConfig:
    args = parse_cli(["train", "--model", str(folder / "model"), *RUN, "--checkpoint-dir", str(folder / run), *more])
    return config_from(args, args.policy)


def _cut_back_to_step_2(source: Path, copy: Path) -> None:
    """``copy``: the run in ``source`` as it was after its step-2 checkpoint (its step-4 one gone)."""
    shutil.copytree(source, copy)
    shutil.rmtree(copy / "step-00000004")
    (copy / "latest").write_text("step-00000002")


@pytest.fixture(scope="module")
def runs(folder: Path) -> dict[str, Any]:
    straight = _config(folder, "straight")
    again = straight.replaced(checkpoint_dir=str(folder / "again"))  # the same plan, run again
    done = run_cases(2, {"straight": Case(_train_rank, (straight,)), "again": Case(_train_rank, (again,))}, timeout=240)
    _cut_back_to_step_2(folder / "straight", folder / "resumed")
    resumed = _config(folder, "resumed", "--resume")  # plans in this process, as the command does
    done |= run_cases(2, {"resumed": Case(_train_rank, (resumed,))}, timeout=240)
    return {"configs": {"straight": straight, "resumed": resumed}, "results": done}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_runs_of_one_plan_and_seed_train_bitwise_alike_under_ready(folder: Path, runs: dict[str, Any]) -> None:
    straight, again = (succeeded(runs["results"][name])[0] for name in ("straight", "again"))
    assert straight.losses == again.losses
    assert _equal(load_merged(folder / "straight"), load_merged(folder / "again"))


def test_a_second_run_of_the_model_plans_as_the_first_from_the_kept_profiles(
    folder: Path, runs: dict[str, Any]
) -> None:
    # Measured again, the times could move a cut; the profiles kept in the cache ($HINTPIPE_CACHE/profiles) make
    # the next run of the same model and example on this machine plan as the first did.
    straight = runs["configs"]["straight"].plan
    second = _config(folder, "second").plan
    assert second is not None and second.profiles == straight.profiles and second.partition == straight.partition
    assert list((profile_cache()).iterdir()) != []


def test_a_resume_plans_as_its_run_did_and_ends_bitwise_as_the_uninterrupted_run(
    folder: Path, runs: dict[str, Any]
) -> None:
    straight, resumed = runs["configs"]["straight"], runs["configs"]["resumed"]
    assert resumed.plan is not None and straight.plan is not None
    assert resumed.plan.profiles == straight.plan.profiles  # the run's, not measured again
    assert resumed.plan.partition == straight.plan.partition
    done = succeeded(runs["results"]["resumed"])[0]
    assert done.resumed_from == 2
    assert done.losses == succeeded(runs["results"]["straight"])[0].losses[2:]
    assert _equal(load_merged(folder / "resumed"), load_merged(folder / "straight"))


def test_the_kept_profiles_decide_the_resumes_cuts(folder: Path, runs: dict[str, Any], tmp_path: Path) -> None:
    # The folder's profiles, made to say that the first stage's nodes cost 20 times more: the resume's plan
    # follows them (the cut moves earlier), so it is those it planned with, whatever this machine measures now.
    straight = runs["configs"]["straight"].plan
    _cut_back_to_step_2(folder / "straight", tmp_path / "run")
    data = json.loads((tmp_path / "run" / PROFILES_FILE).read_text())
    cut = straight.partition.cuts[1]
    for row in data["profiles"][:cut]:
        row["forward_s"] *= 20
        row["backward_s"] *= 20
    (tmp_path / "run" / PROFILES_FILE).write_text(json.dumps(data))
    args = parse_cli(["train", "--model", str(folder / "model"), *RUN, "--checkpoint-dir", str(tmp_path / "run")])
    args.resume = True
    plan = config_from(args, args.policy).plan
    assert plan is not None
    assert [p.forward_s for p in plan.profiles] == [row["forward_s"] for row in data["profiles"]]
    assert plan.partition.cuts[1] < cut


def test_a_resume_that_captures_another_graph_plans_afresh_and_says_so(
    folder: Path, runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    straight = runs["configs"]["straight"].plan
    _cut_back_to_step_2(folder / "straight", tmp_path / "run")
    kept = json.loads((tmp_path / "run" / PROFILES_FILE).read_text())
    assert kept["key"] == profile_key(straight.graph, straight.spec)
    argv = ["train", "--model", str(folder / "model"), *RUN, "--checkpoint-dir", str(tmp_path / "run")]
    args = parse_cli([*argv, "--resume", "--microbatch-size", "1"])
    plan = config_from(args, args.policy).plan
    assert plan is not None and plan.profiles != straight.profiles
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hintpipe train: {tmp_path / 'run' / PROFILES_FILE} measured another capture of the model (another "
        "micro-batch size or model): planned afresh, so the resumed run may cut the model elsewhere"
    )


def test_a_damaged_profiles_file_is_refused_naming_it(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / PROFILES_FILE
    path.write_text('{"format": 1, "key": ')
    args = parse_cli(["train", "--model", str(folder / "model"), *RUN, "--checkpoint-dir", str(tmp_path / "run")])
    args.resume = True
    with pytest.raises(CheckpointError) as refused:
        config_from(args, args.policy)
    assert str(refused.value) == (
        f"{path} is not a run's profiles (Expecting value: line 1 column 22 (char 21)); remove it and the resume "
        "plans afresh (it may cut the model elsewhere)"
    )
    path.unlink()
    path.symlink_to(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        config_from(args, args.policy)
    assert str(refused.value) == f"{path} is a link, not a file: never read"


def test_a_full_disk_at_the_profiles_is_named_and_leaves_none(
    runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_room(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(CheckpointError) as refused:
        record_profiles(tmp_path, runs["configs"]["straight"].plan)
    assert str(refused.value) == (
        f"{tmp_path / PROFILES_FILE}: No space left on device; free space on its file system, or use another "
        "checkpoint folder"
    )
    assert not (tmp_path / PROFILES_FILE).exists()
