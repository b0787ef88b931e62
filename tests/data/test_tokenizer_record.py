"""The tokenizer a run trained with (:mod:`hintpipe.data.tokenizer_record`): recorded by each file's digest, and
copied beside an export only when every file is still there, unchanged; otherwise a note says why."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hintpipe.data.tokenizer_record import copy_tokenizer, tokenizer_record


def _tokenizer(folder: Path) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {}}')
    (folder / "vocab.txt").write_text("a\nb\n")
    (folder / "notes.md").write_text("not a tokenizer file")
    return folder


def test_a_record_names_the_folder_and_each_tokenizer_files_digest(tmp_path: Path) -> None:
    record = tokenizer_record(str(_tokenizer(tmp_path / "tok")))
    assert record == {
        "folder": str((tmp_path / "tok").resolve()),
        "files": {
            "tokenizer.json": hashlib.sha256(b'{"model": {}}').hexdigest(),
            "vocab.txt": hashlib.sha256(b"a\nb\n").hexdigest(),
        },
    }


def test_an_unchanged_tokenizer_is_copied_and_a_changed_one_is_not(tmp_path: Path) -> None:
    folder = _tokenizer(tmp_path / "tok")
    record = tokenizer_record(str(folder))
    out = tmp_path / "export"
    out.mkdir()
    assert copy_tokenizer(record, out) is None
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "vocab.txt"]
    (folder / "vocab.txt").write_text("a\nb\nc\n")
    later = tmp_path / "later"
    later.mkdir()
    assert copy_tokenizer(record, later) == (
        f"the run's tokenizer was not copied: {folder.resolve() / 'vocab.txt'} changed since the run; copy the one "
        "it used by hand"
    )
    assert list(later.iterdir()) == []  # nothing, not the files that were still the same


def test_a_gone_file_or_a_record_without_files_is_a_note(tmp_path: Path) -> None:
    folder = _tokenizer(tmp_path / "tok")
    record = tokenizer_record(str(folder))
    (folder / "tokenizer.json").unlink()
    gone = f"{folder.resolve() / 'tokenizer.json'} is gone"
    assert copy_tokenizer(record, tmp_path) == (
        f"the run's tokenizer was not copied: {gone}; copy the tokenizer into the export by hand"
    )
    outside = {"folder": str(folder), "files": {"../secret": "0"}}  # a name that is not a file of the folder
    assert copy_tokenizer(outside, tmp_path) == (
        f"the run's tokenizer was not copied: {folder / '../secret'} is gone; copy the tokenizer into the export by "
        "hand"
    )
    assert copy_tokenizer({"folder": "/x", "files": {}}, tmp_path) == (
        "the run's tokenizer (/x) was recorded without files: copy it into the export by hand"
    )
