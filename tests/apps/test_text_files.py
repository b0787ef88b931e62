"""The user's own text as documents (:mod:`hintpipe.apps.text_files`): plain-text, JSONL and folder corpora read
the same way on every rank, tokenized by bytes, and every 20th document held out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hintpipe.apps.text_files import read_documents, split_held_out, text_corpus


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _lists(corpus_documents: Any) -> list[list[int]]:
    return [d.tolist() for d in corpus_documents]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_text_file_s_documents_are_its_runs_of_lines_between_blank_ones(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"  # any name but .jsonl is plain text
    path.write_bytes(b"first line\n  indented\r\n\n \t\n\nsecond\n\n\nx\n\ncaf\xc3\xa9")
    assert read_documents(str(path)) == ("first line\n  indented", "second", "x", "café")
    corpus = text_corpus(str(path))
    # "x" is 1 token: left out; é is two bytes.
    assert _lists(corpus.documents) == [_ids("first line\n  indented"), _ids("second"), [99, 97, 102, 195, 169]]
    assert corpus.vocab == 256
    assert text_corpus(str(path)) is corpus  # loaded once per process


def test_a_jsonl_file_s_documents_are_its_lines_field(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "c.jsonl", [{"text": "alpha", "id": 1}, {"body": "b", "text": "beta\n\ngamma"}])
    with path.open("a") as handle:
        handle.write("\n   \n" + json.dumps({"text": "", "body": "delta"}) + "\n")  # blank lines are skipped
    assert read_documents(str(path)) == ("alpha", "beta\n\ngamma", "")
    assert _lists(text_corpus(str(path)).documents) == [_ids("alpha"), _ids("beta\n\ngamma")]  # "" left out
    with pytest.raises(ValueError, match=r", line 1: no field 'body' \(its fields: 'text', 'id'\)$"):
        read_documents(str(path), field="body")
    _jsonl(path, [{"body": "one"}, {"body": "two"}])
    assert read_documents(str(path), field="body") == ("one", "two")


def test_a_folder_s_documents_are_its_text_files_sorted(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "z.txt").write_text("zed\n\nzulu")
    (folder / "sub" / "c.txt").write_text("see")
    _jsonl(folder / "a.jsonl", [{"text": "ay"}, {"text": "aye"}])
    (folder / "b.md").write_text("not read")
    (folder / "y.txt.bak").write_text("not read")
    assert read_documents(str(folder)) == ("ay", "aye", "see", "zed", "zulu")
    assert _lists(text_corpus(str(folder)).documents) == [_ids(t) for t in ("ay", "aye", "see", "zed", "zulu")]


def test_every_20th_document_is_held_out_and_a_small_corpus_holds_none_out() -> None:
    training, held_out = split_held_out(list(range(45)))
    assert held_out == (19, 39)
    assert training == tuple(i for i in range(45) if i not in (19, 39))
    assert split_held_out(list(range(19))) == (tuple(range(19)), tuple(range(19)))  # none to hold out: all
    assert split_held_out(list(range(20))) == (tuple(range(19)), (19,))
