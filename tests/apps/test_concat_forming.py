"""``--forming concat``: a step's drawn documents end to end, cut into full rows of the model's context, for any
model (see [Note: documents end to end] in :mod:`hintpipe.apps.corpus`). Every id a step draws is trained but the
tail of the last document drawn; held-out batches are cut from the documents they evaluate on, one after the
other; the rules refuse in one line what it cannot do. (Its training against the unsplit model:
tests/apps/test_train.py's ``concat`` case.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hintpipe.apps.batches import held_out_batches, step_batch
from hintpipe.apps.corpus import CONCATENATED, concatenated_stream, data_documents
from hintpipe.apps.evaluation_corpus import evaluation_parts
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli import main
from hintpipe.data.held_out import HeldOutOrder
from hintpipe.data.mixture import draw_documents

MODEL = ModelConfig(vocab=256, max_seq_len=9)  # rows of 8 inputs and 8 targets


def _ids(*ranges: range) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
    return [np.arange(r.start, r.stop, dtype=np.int64) for r in ranges]


def test_rows_are_the_documents_end_to_end_each_rows_last_id_the_next_rows_first() -> None:
    documents = _ids(range(0, 5), range(10, 13), range(20, 30))
    rows = concatenated_stream(documents, 3, 4)
    assert rows is not None and rows.tolist() == [[0, 1, 2, 3, 4], [4, 10, 11, 12, 20], [20, 21, 22, 23, 24]]
    after = concatenated_stream(documents, 3, 4, skip=4)  # the next rows: from the last id of the rows before
    assert after is not None and after.tolist() == [[4, 10, 11, 12, 20], [20, 21, 22, 23, 24], [24, 25, 26, 27, 28]]
    assert concatenated_stream(documents, 3, 4, skip=6) is None  # 12 ids left of the 13 three rows take
    as_bytes = concatenated_stream([b"abc", b"de"], 2, 2)
    assert as_bytes is not None and as_bytes.tolist() == [[97, 98, 99], [99, 100, 101]]


def _corpus(path: Path, count: int, tag: str) -> Path:
    """``count`` documents of 6 to 47 bytes, each starting with its tag and number."""
    path.write_text("\n\n".join(f"{tag}{i:03d}:" + "ab" * (i % 21) for i in range(count)), encoding="utf-8")
    return path


def test_a_step_trains_every_id_it_draws_but_the_last_documents_tail(tmp_path: Path) -> None:
    one, two = _corpus(tmp_path / "one.txt", 60, "a"), _corpus(tmp_path / "two.txt", 60, "b")
    config = TrainConfig.of(
        model=MODEL, ranks=2, microbatches=3, microbatch_size=2, data=(f"{one}:1", f"{two}:3"), forming="concat"
    )
    documents = data_documents(config.data.source, config.prepared)
    for step in (0, 5):
        inputs, targets, tokens = step_batch(config, step)
        assert [tuple(x.shape) for x in inputs] == [(2, 8)] * 3 and tokens == [16] * 3  # every row full
        stream = torch.cat([torch.cat([x[:, 0] for x in inputs]).reshape(-1, 1), torch.cat(targets)], 1)
        trained = torch.cat([stream[0], *(row[1:] for row in stream[1:])]).tolist()  # 6 rows x 8 + 1 ids
        rng = np.random.default_rng([config.training.seed, step, CONCATENATED])
        drawn: list[int] = []
        while len(drawn) < len(trained):  # the same draws, one document at a time, end to end
            drawn += [int(v) for v in draw_documents(documents, rng, 1)[0]]
        assert trained == drawn[: len(trained)] and len(trained) == 6 * 8 + 1
        assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in zip(inputs, targets, strict=True))  # shifted by one


def test_held_out_batches_are_cut_one_after_the_other_from_the_documents_evaluated_on(tmp_path: Path) -> None:
    train, valid = _corpus(tmp_path / "train.txt", 40, "t"), _corpus(tmp_path / "valid.txt", 30, "v")
    fields: dict[str, Any] = {"model": MODEL, "ranks": 2, "microbatches": 2, "microbatch_size": 2, "data": str(train)}
    config = TrainConfig.of(**fields, forming="concat", eval_data=str(valid), eval_every=1, eval_batches=3, dp=2)
    order = HeldOutOrder(evaluation_parts(config.data, config.prepared, config.eval_prepared), config.training.seed)
    ids = [int(v) for i in range(len(order)) for v in order[i]]  # the evaluation corpus's ids in its fixed order
    for replica in (0, 1):
        for number, (inputs, targets, tokens) in enumerate(held_out_batches(config, replica)):
            at = (number * 2 + replica) * 4 * 8  # batch b of the stream (2 replicas): after the 4 rows of 8 of b - 1
            assert [row.tolist() for x in inputs for row in x] == [ids[at + 8 * r : at + 8 * r + 8] for r in range(4)]
            assert [row.tolist() for y in targets for row in y] == [
                ids[at + 8 * r + 1 : at + 8 * r + 9] for r in range(4)
            ]
            assert tokens == [16, 16]


def test_what_concat_cannot_do_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train, valid = _corpus(tmp_path / "train.txt", 40, "t"), _corpus(tmp_path / "valid.txt", 8, "v")
    fields: dict[str, Any] = {"model": MODEL, "ranks": 2, "microbatches": 2, "microbatch_size": 2, "data": str(train)}
    held = sum(len(p) for p in valid.read_bytes().split(b"\n\n"))  # the byte tokenizer's ids of the 8 documents
    with pytest.raises(ValueError) as refused:
        TrainConfig.of(**fields, forming="concat", eval_data=str(valid), eval_every=1, eval_batches=9)
    assert str(refused.value) == (
        f"eval_batches 9 takes 289 held-out tokens under forming concat (9 x 2 micro-batches x 2 rows of 8 x 1 "
        f"replicas, and one, without replacement); eval_data {valid} has {held}: use eval_batches "
        f"{(held - 1) // 32} or fewer"
    )
    with pytest.raises(ValueError) as refused:
        TrainConfig.of(model=MODEL, ranks=2, microbatches=2, forming="concat")
    assert str(refused.value) == (
        "forming concat forms micro-batches from documents end to end: use it with data stdlib or data PATH"
    )
    with pytest.raises(ValueError) as refused:  # packing's refusal names concat, which any model takes
        TrainConfig.of(
            model=ModelConfig("hf-gpt2", vocab=256), ranks=2, microbatches=2, data=str(train), forming="packed"
        )
    assert str(refused.value) == (
        "forming packed needs a model that takes document masks (gpt-mini), not hf-gpt2; forming concat lays "
        "documents end to end without masks, for any model"
    )
    argv = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16", "--forming", "concat"]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "hintpipe train: error: --forming concat forms micro-batches from documents end to end: use it with --data "
        "stdlib or --data PATH"
    )
