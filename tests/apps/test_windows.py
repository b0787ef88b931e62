"""A document longer than the model's context is trained by windows of it, not by its first tokens alone
([Note: a long document is trained by windows] in :mod:`hintpipe.apps.corpus`)."""

from __future__ import annotations

from pathlib import Path

import torch

from hintpipe.apps.batches import held_out_batches, step_batch
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.train_config import TrainConfig

#: A model of 32 positions: a row holds at most 31 inputs and their 31 targets, 32 ids.
MODEL = ModelConfig(vocab=256, max_seq_len=32)


def _counting(count: int, start: int = 0) -> str:
    """Text whose every window of 5 characters or more occurs once: the numbers ``start``.. in 4 digits."""
    return "".join(f"{i:04d}" for i in range(start, start + count))


def _rows(batch: tuple[list[torch.Tensor], list[torch.Tensor], list[int]]) -> list[bytes]:
    """Each row's ids, its inputs and its last target: the document's bytes the row was cut from."""
    inputs, targets, _ = batch
    return [
        bytes(x.tolist()) + bytes([int(y[-1])])
        for xs, ys in zip(inputs, targets, strict=True)
        for x, y in zip(xs, ys, strict=True)
    ]


def test_a_long_documents_rows_are_windows_over_all_of_it(tmp_path: Path) -> None:
    document = _counting(500)  # 2,000 bytes, one document (data_split file), 62 rows long
    (tmp_path / "long.txt").write_text(document)
    config = TrainConfig.of(
        model=MODEL, ranks=2, microbatches=2, microbatch_size=2, data=str(tmp_path / "long.txt"), data_split="file"
    )
    covered = [False] * len(document)
    for step in range(50):
        rows = _rows(step_batch(config, step))
        assert rows == _rows(step_batch(config, step))  # the same on every rank, and on resume
        for row in rows:
            assert len(row) == 32
            start = document.index(row.decode())  # a window of the document, wherever it starts
            covered[start : start + 32] = [True] * 32
    # Before, every row was the document's first 32 bytes: 1.6% of it.
    assert sum(covered) > 0.8 * len(document)


def test_short_documents_are_cropped_from_their_start_and_held_out_windows_are_the_same_each_evaluation(
    tmp_path: Path,
) -> None:
    short = [f"s{i:03d}:" + "ab" * (i % 9) for i in range(40)]  # 5 to 21 bytes: each whole in a row
    long = [_counting(40, 1000 * i) for i in range(120)]  # 160 bytes each, 5 rows long; 6 held out
    for name, documents in (("short", short), ("long", long)):
        (tmp_path / f"{name}.txt").write_text("\n\n".join(documents))
    config = TrainConfig.of(model=MODEL, ranks=2, microbatches=2, microbatch_size=3, data=str(tmp_path / "short.txt"))
    for row in _rows(step_batch(config, 0)):
        assert any(d.startswith(row.decode()) for d in short)
    config = TrainConfig.of(
        model=MODEL, ranks=2, microbatches=2, microbatch_size=3, data=str(tmp_path / "long.txt"), eval_batches=1
    )
    held_out = [long[i] for i in range(19, 120, 20)]  # every 20th document
    first = [_rows(batch) for batch in held_out_batches(config)]
    assert first == [_rows(batch) for batch in held_out_batches(config)]
    rows = [row.decode() for batch in first for row in batch]
    assert all(any(row in d for d in held_out) for row in rows)
    assert not all(any(d.startswith(row) for d in held_out) for row in rows)  # windows, not only first tokens


def test_formed_micro_batches_take_windows_of_the_models_context(tmp_path: Path) -> None:
    long = [_counting(40, 1000 * i) for i in range(40)]
    (tmp_path / "long.txt").write_text("\n\n".join(long))
    config = TrainConfig.of(
        model=MODEL, ranks=2, microbatches=2, microbatch_size=3, data=str(tmp_path / "long.txt"), forming="padded"
    )
    starts = set()
    for step in range(5):
        inputs, targets, _ = step_batch(config, step)
        for xs, ys in zip(inputs, targets, strict=True):
            for x, y in zip(xs, ys, strict=True):
                row = (bytes(x.tolist()) + bytes([int(y[-1])])).decode()
                assert len(row) == 32  # the longest a formed row takes: max_seq_len - 1 inputs and a target more
                document = next(d for d in long if row in d)
                starts.add(document.index(row))
    assert len(starts) > 1  # before, 0 alone
