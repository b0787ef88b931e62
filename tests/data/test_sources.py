"""What ``--data`` names (:mod:`hintpipe.data.sources`): an entry and its weight, the kind of source its path is,
the files it reads in order, and each refusal in one line naming the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintpipe.data.refusal import DataRefused
from hintpipe.data.sources import DataEntry, Source, SourceKind, data_entries
from hintpipe.data.split import DocumentSplit

BLANK, BY_FILE = DocumentSplit.parse("blank"), DocumentSplit.parse("file")


def test_an_entry_is_a_path_and_a_weight_and_a_path_of_its_own_colons_is_kept(tmp_path: Path) -> None:
    assert DataEntry.parse("a.jsonl:0.7") == DataEntry("a.jsonl:0.7", "a.jsonl", 0.7)
    assert DataEntry.parse("a.jsonl") == DataEntry("a.jsonl", "a.jsonl", 1.0)
    assert DataEntry.parse("hf:json:data/*.jsonl") == DataEntry("hf:json:data/*.jsonl", "hf:json:data/*.jsonl")
    odd = tmp_path / "notes:2"  # a file whose name ends as a weight would: a path as it exists
    odd.write_text("x")
    assert DataEntry.parse(str(odd)).weight == 1.0


@pytest.mark.parametrize("weight", ["0", "-1", "inf", "nan"])
def test_a_weight_that_is_not_a_positive_number_is_refused(weight: str) -> None:
    with pytest.raises(DataRefused) as refused:
        DataEntry.parse(f"a.jsonl:{weight}")
    assert str(refused.value.said(cli=True)) == (
        f"--data a.jsonl:{weight}: the weight {weight} must be a positive number (PATH:WEIGHT, e.g. a.jsonl:0.5)"
    )


def test_built_in_data_is_given_alone() -> None:
    assert data_entries("stdlib") == (DataEntry("stdlib", "stdlib"),)
    assert [e.weight for e in data_entries(("a.txt:3", "b.txt"))] == [3.0, 1.0]
    with pytest.raises(DataRefused) as refused:
        data_entries(("a.txt", "synthetic"))
    assert str(refused.value.said(cli=False)) == (
        "data synthetic is built-in data and takes no other --data beside it; give it alone, or only paths"
    )


def test_a_path_is_the_kind_of_source_it_is(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("x")
    (tmp_path / "c.jsonl").write_text("{}")
    (tmp_path / "t.parquet").write_bytes(b"")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    (saved / "dataset_info.json").write_text("{}")
    kinds = {name: Source.of(str(tmp_path / name)).kind for name in ("notes.md", "c.jsonl", "saved")}
    assert kinds == {"notes.md": SourceKind.TEXT, "c.jsonl": SourceKind.JSONL, "saved": SourceKind.HF_SAVED}
    parquet = Source.of(str(tmp_path / "t.parquet"))
    assert (parquet.kind, parquet.builder, parquet.pattern) == (
        SourceKind.HF_FILES,
        "parquet",
        str(tmp_path / "t.parquet"),
    )
    assert Source.of("hf:csv:data/*.csv") == Source("hf:csv:data/*.csv", SourceKind.HF_FILES, "csv", "data/*.csv")
    assert Source.of(str(tmp_path)).kind is SourceKind.FOLDER


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("hf:xml:data/*.xml", "hf:BUILDER:FILES takes a builder of json, text, parquet, csv and the files, e.g. "
         "hf:parquet:data/*.parquet"),
        ("hf:json", "hf:BUILDER:FILES takes a builder of json, text, parquet, csv and the files, e.g. "
         "hf:parquet:data/*.parquet"),
        ("/no/such/corpus.txt", "no such file or folder"),
    ],
)  # fmt: skip
def test_a_path_that_is_no_source_is_refused_naming_it(path: str, why: str) -> None:
    with pytest.raises(DataRefused) as refused:
        Source.of(path)
    assert str(refused.value) == f"{path}: {why}"


def test_a_saved_dataset_dict_is_refused_naming_its_splits(tmp_path: Path) -> None:
    (tmp_path / "dataset_dict.json").write_text("{}")
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    with pytest.raises(DataRefused) as refused:
        Source.of(str(tmp_path))
    assert str(refused.value) == (
        f"{tmp_path}: a saved DatasetDict; give one of its splits' folders ({tmp_path / 'test'}, {tmp_path / 'train'})"
    )


def test_a_folder_reads_its_text_files_or_every_file_but_hidden_ones_in_path_order(tmp_path: Path) -> None:
    for name in ("b/z.txt", "a.jsonl", "code.py", ".git/HEAD", "b/__pycache__/m.pyc", "c.txt.bak"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("text")
    folder = Source.of(str(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in folder.files(BLANK)] == ["a.jsonl", "b/z.txt"]
    every = [p.relative_to(tmp_path).as_posix() for p in folder.files(BY_FILE)]
    assert every == ["a.jsonl", "b/z.txt", "c.txt.bak", "code.py"]
    assert folder.reads_field  # it has a .jsonl file: --data-field says which field is its documents


def test_a_folder_without_a_file_to_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(DataRefused, match=r": a folder without a \.txt or \.jsonl file in it$"):
        Source.of(str(tmp_path)).files(BLANK)
    with pytest.raises(DataRefused, match=r"^hf:json:/none/\*\.jsonl: no file matches /none/\*\.jsonl$"):
        Source.of("hf:json:/none/*.jsonl").files(BLANK)


def test_a_folders_documents_are_its_files_documents_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("three\n\nfour")
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    assert list(Source.of(str(tmp_path)).texts(BLANK, "text")) == ["one", "two", "three", "four"]
    assert list(Source.of(str(tmp_path / "b.txt")).texts(BY_FILE, "text")) == ["three\n\nfour"]
