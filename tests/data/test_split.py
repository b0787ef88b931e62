"""How a plain-text file becomes documents (:mod:`hintpipe.data.split`): by blank lines, one per file, or by a
separator, the same whatever blocks the text is read in."""

from __future__ import annotations

import pytest

from hintpipe.data.refusal import DataRefused
from hintpipe.data.split import DocumentSplit

TEXT = "one\n  two\n\n \t\nthree<|endoftext|>four\n---\nfive\n"


def _blocks(text: str, lines_each: int) -> list[str]:
    """``text`` in blocks of ``lines_each`` lines, each block but the last ending with a line break."""
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i : i + lines_each]) for i in range(0, len(lines), lines_each)]


@pytest.mark.parametrize("lines_each", [1, 2, 3, 100])
def test_documents_are_runs_of_lines_between_blank_ones_in_any_blocks(lines_each: int) -> None:
    split = DocumentSplit.parse("blank")
    assert list(split.documents(_blocks(TEXT, lines_each))) == ["one\n  two", "three<|endoftext|>four\n---\nfive"]


@pytest.mark.parametrize("lines_each", [1, 2, 100])
def test_a_separator_splits_wherever_it_falls_and_a_file_is_one_document(lines_each: int) -> None:
    by_end = DocumentSplit.parse("<|endoftext|>")
    assert (by_end.separator, by_end.by_file) == ("<|endoftext|>", False)
    assert list(by_end.documents(_blocks(TEXT, lines_each))) == ["one\n  two\n\n \t\nthree", "four\n---\nfive\n"]
    by_rule = DocumentSplit.parse("\\n---\\n")  # as a shell passes it: the escapes read
    assert list(by_rule.documents(_blocks(TEXT, lines_each))) == ["one\n  two\n\n \t\nthree<|endoftext|>four", "five\n"]
    whole = DocumentSplit.parse("file")
    assert whole.by_file and list(whole.documents(_blocks(TEXT, lines_each))) == [TEXT]
    assert list(whole.documents([" \n", "\t"])) == []  # whitespace only: no document


def test_escapes_other_than_line_break_tab_and_backslash_are_kept_as_written() -> None:
    assert DocumentSplit.parse("\\t--\\\\--\\x").separator == "\t--\\--\\x"
    assert DocumentSplit.parse("end\\").separator == "end\\"


@pytest.mark.parametrize("text", ["", "\\n", " \\t "])
def test_a_separator_of_whitespace_only_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(DataRefused) as refused:
        DocumentSplit.parse(text)
    assert refused.value.option == "data_split"
    assert str(refused.value.said(cli=True)) == (
        f"--data-split {text!r}: a separator must have a character that is not whitespace; give blank (documents "
        "between blank lines), file (one document per file) or a separator such as '<|endoftext|>'"
    )
