"""A folder laid out in a dataset's splits (:mod:`hintpipe.data.dataset_splits`): ``--data DIR`` reads its train
split, ``--data DIR/SPLIT`` another, ``--eval-data DIR`` its evaluation split; a folder without two named splits
is read whole, as before. Before, such a folder was read whole, its validation and test files among the training
documents, and its ``.parquet`` shards not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hintpipe.data.dataset_splits import folder_splits
from hintpipe.data.prepared import open_prepared
from hintpipe.data.refusal import DataRefused
from hintpipe.data.run_data import resolve_data
from hintpipe.data.sources import Source, evaluation_source
from hintpipe.data.split import DocumentSplit

BLANK, BY_FILE = DocumentSplit.parse("blank"), DocumentSplit.parse("file")


def _parquet(path: Path, texts: list[str]) -> None:
    datasets = pytest.importorskip("datasets")
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(path))


def _jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _hub_folder(root: Path) -> Path:
    """A dataset as the Hub lays it out: two train shards of Parquet, a validation shard of JSON lines."""
    _parquet(root / "data" / "train-00000-of-00002.parquet", ["train one", "train two"])
    _parquet(root / "data" / "train-00001-of-00002.parquet", ["train three"])
    _jsonl(root / "data" / "validation-00000-of-00001.jsonl", ["held one", "held two"])
    (root / "README.md").write_text("# a dataset card")
    return root


def test_a_hub_folder_trains_on_its_train_split_and_reads_another_by_its_name(tmp_path: Path) -> None:
    hub = _hub_folder(tmp_path / "hub")
    train = Source.of(str(hub))
    assert [p.relative_to(hub).as_posix() for p in train.files(BLANK)] == [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
    ]
    assert list(train.texts(BLANK, "text")) == ["train one", "train two", "train three"]
    assert train.reads_field  # Parquet's columns
    validation = Source.of(str(hub / "validation"))
    assert list(validation.texts(BLANK, "text")) == ["held one", "held two"]
    assert evaluation_source(str(hub)) == str(hub / "validation")
    with pytest.raises(DataRefused) as refused:
        Source.of(str(hub / "test"))
    assert str(refused.value.said(cli=True)) == (
        f"--data {hub / 'test'}: no such file or folder, nor a split of {hub} (train, validation)"
    )
    with pytest.raises(DataRefused, match=r"/corpsu: no such file or folder$"):  # no split's name: no folder walked
        Source.of(str(hub / "corpsu"))


def test_train_and_test_files_side_by_side_are_two_splits_and_the_run_evaluates_on_the_other(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.txt").write_text("alpha beta\n\ngamma delta\n\nepsilon zeta")
    (folder / "test.txt").write_text("held out one\n\nheld out two")
    assert [p.name for p in Source.of(str(folder)).files(BLANK)] == ["train.txt"]
    trained = resolve_data(str(folder))
    evaluated = resolve_data(str(folder), option="eval_data")
    assert len(open_prepared(trained.folders[0]).part("all")) == 3
    assert len(open_prepared(evaluated.folders[0]).part("all")) == 2


def test_a_folder_without_a_train_split_and_another_is_read_whole(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("corpus.txt", "valid.txt"):  # a validation split but no train split: no layout of splits
        (plain / name).write_text("some words")
    assert [p.name for p in Source.of(str(plain)).files(BLANK)] == ["corpus.txt", "valid.txt"]
    assert evaluation_source(str(plain)) == str(plain)
    code = tmp_path / "code"
    for name in ("train.py", "tests/test_train.py"):  # source code read file by file: tests/ is no split
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text("x = 1")
    assert [p.relative_to(code).as_posix() for p in Source.of(str(code)).files(BY_FILE)] == [
        "tests/test_train.py",
        "train.py",
    ]


def test_a_folder_of_parquet_shards_is_read_through_datasets(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    _parquet(shards / "part-0.parquet", ["one", "two"])
    _parquet(shards / "part-1.parquet", ["three"])
    assert folder_splits(shards, lambda p: p.is_file()) is None
    assert list(Source.of(str(shards)).texts(BLANK, "text")) == ["one", "two", "three"]
