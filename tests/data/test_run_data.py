"""A run's data resolved once, before any rank starts (:mod:`hintpipe.data.run_data`): raw files prepared into the
cache, the entries' weights kept, the vocabulary their ids need, and an option that would change nothing refused in
the caller's words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hintpipe.data.run_data import RunData, data_vocab, prepared_documents, resolve_data


def _text(path: Path, documents: list[str]) -> str:
    path.write_text("\n\n".join(documents))
    return str(path)


def test_built_in_data_needs_no_folder_and_its_own_vocabulary() -> None:
    assert resolve_data("synthetic") == RunData((), (), None)  # the model's own
    assert resolve_data("stdlib") == RunData((), (), 256)  # bytes
    assert data_vocab("stdlib") == 256


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        (
            True,
            "--data-field body names a record's field; --data stdlib has no records (JSON, Parquet, CSV)",
        ),
        (
            False,
            "data_field body names a record's field; data stdlib has no records (JSON, Parquet, CSV)",
        ),
    ],
)
def test_an_option_that_would_change_nothing_is_refused_in_the_callers_words(cli: bool, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        resolve_data("stdlib", field="body", cli=cli)
    assert str(refused.value) == message
    with pytest.raises(ValueError, match=r"^--tokenizer /tok tokenizes a data file or folder; --data synthetic has "):
        resolve_data("synthetic", tokenizer="/tok", cli=True)


def test_raw_files_are_prepared_once_and_drawn_by_their_weights(tmp_path: Path) -> None:
    a = _text(tmp_path / "a.txt", [f"alpha {i}" for i in range(30)])
    b = _text(tmp_path / "b.txt", [f"beta {i}" for i in range(30)])
    run = resolve_data((f"{a}:3", b))
    assert (len(run.folders), run.weights, run.vocab) == (2, (3.0, 1.0), 256)
    assert resolve_data((f"{a}:3", b)).folders == run.folders  # prepared once: the cache's folders again
    drawn = prepared_documents(run.folders, run.weights).draw(np.random.default_rng(0), 400)
    alpha = sum(bytes(np.asarray(d).tolist()).startswith(b"alpha") for d in drawn)
    assert 0.65 < alpha / 400 < 0.85  # three to one
    held_out = prepared_documents(run.folders, run.weights, part="held_out")
    assert [len(part) for part in held_out.parts] == [1, 1]  # every 20th document of each


def test_a_field_for_files_without_jsonl_is_refused(tmp_path: Path) -> None:
    a = _text(tmp_path / "a.txt", ["one document"])
    with pytest.raises(ValueError) as refused:
        resolve_data(a, field="body", cli=True)
    assert str(refused.value) == (
        f"--data-field body names a record's field; --data {a} has no records (JSON, Parquet, CSV)"
    )
