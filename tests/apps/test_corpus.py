"""The standard library as a corpus: real documents, byte tokens, lengths as they come."""

from __future__ import annotations

import json
import statistics

import pytest

from hintpipe.apps.corpus import VOCAB, stdlib_batch, stdlib_documents
from hintpipe.cli import main


def test_micro_batches_are_real_documents_cropped_to_the_shortest() -> None:
    documents = stdlib_documents()
    assert len(documents) > 100
    inputs, targets, tokens = stdlib_batch(microbatches=8, size=2, step=3, seed=0, max_len=4096)
    again = stdlib_batch(microbatches=8, size=2, step=3, seed=0, max_len=4096)
    assert all((a == b).all() for a, b in zip(inputs, again[0], strict=True))  # the same on every rank
    for x, y, count in zip(inputs, targets, tokens, strict=True):
        assert x.shape == y.shape and count == x.numel()
        assert (x[:, 1:] == y[:, :-1]).all()  # next-byte prediction
        assert int(x.max()) < VOCAB
        row = bytes(x[0].tolist()) + bytes([int(y[0, -1])])
        assert any(row in d for d in documents)  # a window of a real definition (see test_windows.py)
    lengths = [x.shape[1] for x in stdlib_batch(64, 1, 0, 0, 1 << 20)[0]]
    assert max(lengths) > 4 * statistics.median(lengths)  # heavy-tailed, as files are


def test_training_on_the_stdlib_has_the_unsplit_models_gradients(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--model", "gpt-mini", "--layers", "2", "--hidden", "32", "--ranks", "2", "--microbatches", "4"]
    assert main([*argv, "--steps", "2", "--data", "stdlib", "--microbatch-size", "2", "--check-grads", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_grad_rel_diff"] < 1e-4
    assert main([*argv, "--model", "mlp", "--data", "stdlib"]) == 2
    assert "--data stdlib is text: use a language model" in capsys.readouterr().err
