"""How a plain-text file becomes documents (``--data-split``): by blank lines, one file one document, or by a
separator the user names.

- ``blank`` (the default): documents are runs of lines between blank ones (lines of whitespace only); a
  document is its lines as written, joined by line breaks. Prose, notes, Markdown.
- ``file``: each file is one document, as written. Source code, articles, books: a folder of files keeps each
  file whole (a folder is read file by file, see :mod:`~hintpipe.data.sources`).
- anything else is a separator: documents are the text between two of them, as written (``<|endoftext|>``,
  or ``\\n---\\n``: ``\\n``, ``\\t`` and ``\\\\`` in the flag are a line break, a tab and a backslash, since a
  shell passes neither of the first two easily).

A document of whitespace only is no document. JSONL files and datasets are not split: each record is one
document, whatever the split says.

The splitters take the text in blocks (:func:`~hintpipe.data.reading.read_blocks`) and keep only the
document being read between blocks, so a file of any size is split in bounded memory.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from hintpipe.data.refusal import DataRefused

BLANK = "blank"
FILE = "file"
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


@dataclasses.dataclass(frozen=True)
class DocumentSplit:
    """A ``--data-split`` value: ``text`` as the user wrote it; ``separator`` the text between documents
    (empty for ``blank`` and ``file``)."""

    text: str
    separator: str = ""

    @classmethod
    def parse(cls, text: str) -> DocumentSplit:
        """``blank``, ``file``, or a separator (its escapes read).

        Raises:
            DataRefused: (``data_split``) an empty separator, or one of whitespace only (every blank line would
                split).
        """
        if text in (BLANK, FILE):
            return cls(text)
        separator = _unescape(text)
        if not separator.strip():
            raise DataRefused(
                "data_split",
                f"{text!r}: a separator must have a character that is not whitespace; give blank (documents "
                "between blank lines), file (one document per file) or a separator such as '<|endoftext|>'",
            )
        return cls(text, separator)

    @property
    def by_file(self) -> bool:
        return self.text == FILE

    def documents(self, blocks: Iterable[str]) -> Iterator[str]:
        """The documents of a file whose text comes in ``blocks`` (every block but the last ending with a line
        break)."""
        if self.separator:
            return _by_separator(blocks, self.separator)
        if self.by_file:
            return _whole(blocks)
        return _by_blank_lines(blocks)


def _unescape(text: str) -> str:
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            out.append(_ESCAPES.get(following, "\\" + following))
        else:
            out.append(char)
    return "".join(out)


def _by_blank_lines(blocks: Iterable[str]) -> Iterator[str]:
    lines: list[str] = []
    for block in blocks:
        parts = block.split("\n")
        if block.endswith("\n"):
            parts.pop()  # the empty rest after the block's last line break, not a blank line
        for line in parts:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "\n".join(lines)
                lines = []
    if lines:
        yield "\n".join(lines)


def _by_separator(blocks: Iterable[str], separator: str) -> Iterator[str]:
    rest = ""
    for block in blocks:
        parts = (rest + block).split(separator)
        rest = parts.pop()  # the document still being read (a separator may straddle two blocks)
        yield from (part for part in parts if part.strip())
    if rest.strip():
        yield rest


def _whole(blocks: Iterable[str]) -> Iterator[str]:
    text = "".join(blocks)
    if text.strip():
        yield text
