"""A corpus of its own to evaluate on (``eval_data``, ``--eval-data``): evaluations read only it, and the run
trains on every document of its data ([Note: an evaluation corpus of its own] in :mod:`hintpipe.apps.batches`)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from hintpipe.apps.batches import held_out_batches, step_batch
from hintpipe.apps.evaluation_corpus import evaluation_parts
from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.run_record import DATA_CHANGED, BatchRecord
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli import main

MODEL = ModelConfig(vocab=256, max_seq_len=32)


def _documents(path: Path, count: int, tag: str) -> Path:
    """``count`` short documents, each starting with its tag and number (``t007:``)."""
    path.write_text("\n\n".join(f"{tag}{i:03d}:" + "ab" * (i % 7 + 1) for i in range(count)), encoding="utf-8")
    return path


def _names(batch: tuple[list[torch.Tensor], list[torch.Tensor], list[int]]) -> list[str]:
    """Each row's document, by its tag and number (a document shorter than the context is cropped from its start)."""
    return [bytes(row[:4].tolist()).decode() for rows in batch[0] for row in rows]


def _run(tmp_path: Path, **changes: Any) -> TrainConfig:
    train = _documents(tmp_path / "train.txt", 40, "t")  # t019 and t039 are the held-out split's
    fields: dict[str, Any] = {"model": MODEL, "ranks": 2, "microbatches": 2, "microbatch_size": 3, "data": str(train)}
    return TrainConfig.of(**(fields | {"eval_every": 1} | changes))


def test_with_an_evaluation_corpus_every_document_trains_and_evaluations_read_only_that_corpus(tmp_path: Path) -> None:
    valid = str(_documents(tmp_path / "valid.txt", 24, "v"))
    apart, given = _run(tmp_path), _run(tmp_path, eval_data=valid, eval_batches=4)

    def trained(config: TrainConfig) -> set[str]:
        return {name for step in range(60) for name in _names(step_batch(config, step))}

    # What each evaluates on: the 24 documents of its own corpus, or the data's held-out 2 (t019 and t039).
    assert [len(part) for part in evaluation_parts(given.data, given.prepared, given.eval_prepared)] == [24]
    assert [len(part) for part in evaluation_parts(apart.data, apart.prepared, apart.eval_prepared)] == [2]
    assert trained(apart) == {f"t{i:03d}" for i in range(40) if i % 20 != 19}
    assert trained(given) == {f"t{i:03d}" for i in range(40)}
    # 4 batches of 2 x 3 documents: all 24 of the evaluation corpus, none twice, the same at every evaluation.
    evaluated = [name for batch in held_out_batches(given) for name in _names(batch)]
    assert sorted(evaluated) == [f"v{i:03d}" for i in range(24)]
    assert [name for batch in held_out_batches(given) for name in _names(batch)] == evaluated
    (drawn,) = held_out_batches(given.replaced(eval_batches=0))
    assert {name[0] for name in _names(drawn)} == {"v"}
    # What the ranks receive: the config crosses processes with its evaluation corpus's folders.
    copied = pickle.loads(pickle.dumps(given))
    assert copied.eval_prepared == given.eval_prepared != () and copied.prepared == given.prepared
    assert [name for batch in held_out_batches(copied) for name in _names(batch)] == evaluated
    # Other documents train, so a resume across the change says so.
    record = BatchRecord.of(given)
    record.compare(BatchRecord.of(apart).fields())
    assert record.changed == [DATA_CHANGED]


def test_an_evaluation_corpus_is_refused_in_one_line_where_it_cannot_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    valid = str(_documents(tmp_path / "valid.txt", 24, "v"))
    refusals: dict[str, dict[str, Any]] = {
        "eval_data is evaluated every eval_every steps, and eval_every is 0 (none): give both": {
            "eval_data": valid,
            "eval_every": 0,
        },
        "eval_data stdlib: built-in data trains; evaluate on files or folders": {"eval_data": "stdlib"},
        f"eval_data {tmp_path}/nope.txt: no such file or folder": {"eval_data": f"{tmp_path}/nope.txt"},
        "eval_batches 5 takes 30 held-out documents (5 x 2 micro-batches x 3 x 1 replicas, without replacement); "
        f"eval_data {valid} has 24: use eval_batches 4 or fewer": {"eval_data": valid, "eval_batches": 5},
    }
    # Text to evaluate on, beside counting text to train on: a model that reads no text, or too few ids for it.
    synthetic = {"data": "synthetic", "eval_data": valid, "seq_len_dist": SeqLenDist(16)}
    refusals[f"eval_data {valid!r} is text: use a language model (gpt-mini, hf-gpt2, a model folder)"] = synthetic | {
        "model": ModelConfig("mlp")
    }
    refusals[
        f"eval_data {valid!r} has token ids up to 255 (tokenizer bytes); gpt-mini's vocabulary is 64: use "
        "ModelConfig(vocab=256)"
    ] = synthetic | {"model": ModelConfig(vocab=64, max_seq_len=32)}
    # The training file itself, or a copy of it under another name: the same documents.
    train = _documents(tmp_path / "train.txt", 40, "t")
    (tmp_path / "copy.txt").write_text(train.read_text(encoding="utf-8"), encoding="utf-8")
    for same in (tmp_path / "train.txt", tmp_path / "copy.txt"):
        refusals[
            f"eval_data {same} is also in data: its documents would train and be evaluated on; evaluate on a corpus "
            "of its own, or leave eval_data out (then every 20th document of data is held out)"
        ] = {"eval_data": (valid, str(same))}
    for message, changes in refusals.items():
        with pytest.raises(ValueError) as info:
            _run(tmp_path, **changes)
        assert str(info.value) == message
    argv = [
        "train",
        "--ranks",
        "2",
        "--microbatches",
        "2",
        "--layers",
        "2",
        "--hidden",
        "16",
        "--data",
        str(tmp_path / "train.txt"),
    ]
    assert main([*argv, "--eval-data", valid]) == 2
    assert capsys.readouterr().err == (
        "hintpipe train: error: --eval-data is evaluated every --eval-every steps, and --eval-every is 0 (none): "
        "give both\n"
    )
    assert main([*argv, "--eval-data", f"{tmp_path}/nope.txt", "--eval-every", "1"]) == 2
    assert (
        capsys.readouterr().err == f"hintpipe train: error: --eval-data {tmp_path}/nope.txt: no such file or folder\n"
    )
