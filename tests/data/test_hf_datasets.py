"""Hugging Face ``datasets`` as sources (:mod:`hintpipe.data.hf_datasets`): a saved dataset's or local files'
column, record by record, its bytes heard of as they are read, and each bad column or folder refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintpipe.data.hf_datasets import file_texts, saved_texts
from hintpipe.data.refusal import DataRefused


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    import datasets

    folder = tmp_path_factory.mktemp("hf") / "saved"
    datasets.Dataset.from_dict({"text": ["one", "two", "three"], "n": [1, 2, 3]}).save_to_disk(str(folder))
    return str(folder)


def test_a_saved_datasets_column_is_its_documents_and_its_bytes_are_heard_of(saved: str) -> None:
    heard: list[int] = []
    assert list(saved_texts(saved, "text", on_bytes=heard.append)) == ["one", "two", "three"]
    assert heard == [sum(p.stat().st_size for p in Path(saved).rglob("*.arrow"))]  # all of it, in one batch


def test_local_files_are_read_by_their_builder(tmp_path: Path) -> None:
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"text": "x", "id": 1}\n{"text": "y", "id": 2}\n')
    heard: list[int] = []
    assert list(file_texts("hf:json:a.jsonl", "json", [str(lines)], "text", on_bytes=heard.append)) == ["x", "y"]
    assert heard == [lines.stat().st_size]


def test_a_column_that_is_not_text_or_not_there_is_refused_naming_it(saved: str) -> None:
    with pytest.raises(DataRefused) as refused:
        list(saved_texts(saved, "n"))
    assert str(refused.value) == f"{saved}, record 0: column 'n' is a number, not a string"
    with pytest.raises(DataRefused) as refused:
        list(saved_texts(saved, "body"))
    assert str(refused.value) == f"{saved}: no column 'body' (its columns: 'text', 'n')"
    said = f"{saved}: no column 'body' (its columns: 'text', 'n'); name one with"
    assert str(refused.value.said(cli=True)) == f"--data {said} --data-field"
    assert str(refused.value.said(cli=False)) == f"data {said} data_field"


def test_a_folder_that_is_no_saved_dataset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataRefused) as refused:
        list(saved_texts(str(tmp_path), "text"))
    assert str(refused.value).startswith(
        f"{tmp_path}: not a dataset datasets.load_from_disk reads (FileNotFoundError: "
    )
