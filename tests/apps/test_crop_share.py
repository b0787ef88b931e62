"""What ``--forming crop`` trains of what it draws (:func:`hintpipe.apps.batches.crop_share`), said by the command
line when it is far less: each micro-batch is cropped to its shortest document, so on documents of mixed lengths
most of a step's text was never trained, and no figure of a run said so."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintpipe.apps.batches import crop_share, step_batch
from hintpipe.apps.corpus import cropped_share, data_documents, drawn_microbatches
from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli import main

MODEL = ModelConfig(vocab=256, max_seq_len=32)


def test_a_micro_batch_trains_its_shortest_documents_length_of_each_up_to_the_context() -> None:
    # Micro-batch 1: 2 documents cropped to 2 ids, 1 target each, of 3 + 1 a row could hold. Micro-batch 2: to 3
    # ids (2 targets each) of a 16-id context's 15 (the long one) + 2.
    drawn = [[b"abcd", b"ab"], [b"abcdefgh" * 10, b"abc"]]
    assert cropped_share(drawn, 16) == (2 * 1 + 2 * 2) / ((3 + 1) + (15 + 2))
    assert cropped_share([[b"abcd", b"wxyz"]], 16) == 1.0


def test_the_share_is_of_the_tokens_the_steps_train(tmp_path: Path) -> None:
    corpus = tmp_path / "mixed.txt"  # documents of 6 to 60 bytes: rows cropped to the shortest lose most
    corpus.write_text("\n\n".join(f"d{i:03d}:" + "ab" * (i % 28) for i in range(200)), encoding="utf-8")
    config = TrainConfig.of(model=MODEL, ranks=2, microbatches=3, microbatch_size=4, data=str(corpus))
    documents = data_documents(config.data.source, config.prepared)
    whole = sum(
        min(len(d), 32) - 1
        for step in range(8)
        for chosen in drawn_microbatches(documents, 3, 4, step, 0)
        for d in chosen
    )
    trained = sum(sum(step_batch(config, step)[2]) for step in range(8))  # what the steps' rows hold
    share = crop_share(config)
    assert share == trained / whole and share < 0.6
    counting = TrainConfig.of(model=MODEL, ranks=2, microbatches=3, seq_len_dist=SeqLenDist(16))
    assert crop_share(counting) is None  # counting text: nothing cropped


def test_the_command_line_says_what_crop_trains_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hintpipe.apps.training

    corpus = tmp_path / "mixed.txt"
    corpus.write_text("\n\n".join(f"d{i:03d}:" + "ab" * (i % 28) for i in range(200)), encoding="utf-8")
    monkeypatch.setattr(hintpipe.apps.training, "train", lambda config: None)  # what a torchrun rank but 0 returns
    argv = ["train", "--ranks", "2", "--microbatches", "3", "--microbatch-size", "4", "--max-seq-len", "32"]
    assert main([*argv, "--layers", "2", "--hidden", "16", "--data", str(corpus)]) == 0
    share = crop_share(TrainConfig.of(model=MODEL, ranks=2, microbatches=3, microbatch_size=4, data=str(corpus)))
    assert share is not None
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hintpipe train: --forming crop trains {share:.0%} of the tokens its micro-batches draw (each cropped to its "
        "shortest document; from the first 8 steps' draws): --forming concat or padded trains them all"
    )
    assert main([*argv, "--layers", "2", "--hidden", "16", "--data", str(corpus), "--forming", "padded"]) == 0
    assert "--forming crop" not in capsys.readouterr().err
