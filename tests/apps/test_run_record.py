"""A resume says when its batches change ([Note: a resume says when its batches change] in
:mod:`hintpipe.apps.run_record`): another seed, batch shape or data than the checkpoint's run, in one note; the
same data moved elsewhere is the same data; a changed schedule is still refused."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import hintpipe
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.run_record import DATA_CHANGED, RunRecord, data_identity
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli import main
from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
from hintpipe.runtime.errors import CheckpointError
from hintpipe.runtime.launch import run_ranks

MODEL = ModelConfig(vocab=256, layers=2, hidden=16, heads=2, max_seq_len=64)


def _corpus(path: Path, count: int = 40) -> Path:
    path.write_text("\n\n".join(f"d{i:02d}:" + "ab" * (i % 7 + 2) for i in range(count)))
    return path


def _config(data: Path | tuple[str, ...] | str, **changes: Any) -> TrainConfig:
    fields: dict[str, Any] = {"model": MODEL, "ranks": 2, "microbatches": 2}
    fields["data"] = data if isinstance(data, tuple) else str(data)
    return TrainConfig.of(**(fields | changes))


def _resumed(saved: TrainConfig, now: TrainConfig) -> RunRecord:
    record = RunRecord.of(now)
    record.load_state_dict(RunRecord.of(saved).state_dict())
    return record


def test_a_resume_names_each_change_of_its_batches_in_one_note(tmp_path: Path) -> None:
    run = _config(_corpus(tmp_path / "a.txt"))
    assert _resumed(run, run).note(4) is None
    changed = _resumed(run, run.replaced(seed=3, microbatch_size=2))
    assert changed.note(4) == (
        "resumed at step 4 with other batches than its run's (seed 0 then, 3 now; microbatch_size 4 then, 2 now): "
        "the steps from here train on other batches than the uninterrupted run would have"
    )
    shorter = dataclasses.replace(run, model=dataclasses.replace(MODEL, max_seq_len=32))  # a folder's --max-seq-len
    assert _resumed(run, shorter).batches.changed == ["max_seq_len 64 then, 32 now"]
    with pytest.raises(CheckpointError, match=r"^the checkpoint's run has lr 0.001, this one 0.01: resuming"):
        _resumed(run, run.replaced(lr=1e-2))


def test_the_data_is_its_contents_not_its_path(tmp_path: Path) -> None:
    first = _corpus(tmp_path / "a.txt")
    moved = tmp_path / "elsewhere" / "b.txt"
    moved.parent.mkdir()
    shutil.copy(first, moved)
    run = _config(first)
    assert data_identity(run) == data_identity(_config(moved))
    assert _resumed(run, _config(moved)).note(2) is None
    edited = _corpus(tmp_path / "c.txt", count=41)
    others = [_config(edited), _config(first, data_split="file"), _config((str(first), str(moved)))]
    for other in others:
        assert data_identity(other) != data_identity(run)
        assert _resumed(run, other).batches.changed == [DATA_CHANGED]
    assert data_identity(_config("stdlib")) == "stdlib"


def test_the_command_line_says_a_resume_with_another_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the resume went on without a word, on other batches than the run's."""
    corpus = _corpus(tmp_path / "a.txt")
    argv = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16", "--data", str(corpus)]
    argv += ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "1"]
    assert main([*argv, "--steps", "1"]) == 0
    capsys.readouterr()
    assert main([*argv, "--steps", "2", "--resume", "--seed", "5"]) == 0
    said = capsys.readouterr().err.splitlines()
    assert (
        "hintpipe train: resumed at step 1 with other batches than its run's (seed 0 then, 5 now): the steps "
        "from here train on other batches than the uninterrupted run would have" in said
    )


def _resume_an_older_record(rank: int, world: int, folder: str, config: TrainConfig) -> tuple[int, list[str]]:
    """Save step 1 with the record a checkpoint of earlier 0.7 holds (the schedule alone), then resume it with
    this run's record (the schedule and the batches)."""
    torch.manual_seed(0)
    stages = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)]
    with hintpipe.Pipeline.from_modules(stages, loss_fn=torch.nn.functional.mse_loss, microbatches=2) as pipe:
        optimizer = torch.optim.SGD([p for m in pipe.modules.values() for p in m.parameters()], lr=0.1)
        record = RunRecord.of(config)
        older = Checkpointer(folder, pipe, optimizer, state=record.schedule)
        older.start()
        older.after_step(1, last=True)
        older.close()
        resumed = Checkpointer(folder, pipe, optimizer, state=record)
        step = resumed.resume()
        resumed.close()
    return step, record.batches.changed


def test_a_checkpoint_of_a_smaller_record_resumes_comparing_what_it_holds(tmp_path: Path) -> None:
    """Before, its load failed: ``Missing key in checkpoint state_dict: user-state.batches_data``."""
    config = _config(_corpus(tmp_path / "a.txt"))
    assert run_ranks(_resume_an_older_record, 2, str(tmp_path / "ck"), config, timeout=120) == [(1, [])] * 2
