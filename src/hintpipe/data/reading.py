"""A text file read as a stream: decoded blocks of whole lines, and a JSONL file's documents.

A corpus may be larger than a process's memory, so no file is read whole. A file is read in blocks of about
:data:`BLOCK` bytes cut after a line break: UTF-8 never has a byte ``\\n`` inside a character, so every block
decodes on its own, and an undecodable byte is reported at its offset in the file, not in the block. Line
breaks are read as Python's universal newlines read them (``\\r\\n`` and ``\\r`` are ``\\n``): a block never
ends between ``\\r`` and ``\\n``, since it ends after a ``\\n``. The bytes read are counted (a progress bar) and
digested (SHA-256, for the manifest) on the way, so preparing reads each file once.

This module is torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from hintpipe.data.refusal import DataRefused

#: Bytes read at a time (a block is this or more: it runs to the next line break).
BLOCK = 8 << 20


class Digest(Protocol):
    """What :func:`read_blocks` feeds the bytes it reads to (``hashlib.sha256()``)."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def read_blocks(
    file: Path, *, on_bytes: Callable[[int], None] | None = None, digest: Digest | None = None
) -> Iterator[str]:
    """``file``'s text in blocks of whole lines (universal newlines), every block but the last ending with
    ``\\n``.

    Raises:
        DataRefused: (``data``) the file cannot be read, or is not UTF-8 (naming the byte's offset).
    """
    offset = 0
    pending = bytearray()
    try:
        with open(file, "rb") as handle:
            while block := handle.read(BLOCK):
                if on_bytes is not None:
                    on_bytes(len(block))
                if digest is not None:
                    digest.update(block)
                cut = block.rfind(b"\n") + 1
                if not cut:  # no line break: the line goes on in the next block
                    pending += block
                    continue
                pending += block[:cut]
                yield _decode(file, pending, offset)
                offset += len(pending)
                pending = bytearray(block[cut:])
    except OSError as exc:
        raise DataRefused("data", f"{file}: {exc.strerror or exc}") from None
    if pending:
        yield _decode(file, pending, offset)


def _decode(file: Path, data: bytearray, offset: int) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataRefused("data", f"{file}: not UTF-8 text (byte {offset + exc.start}: {exc.reason})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def json_documents(file: Path, blocks: Iterator[str], field: str) -> Iterator[str]:
    """A JSONL file's documents: each line's ``field``; blank lines are skipped.

    Raises:
        DataRefused: (``data``) a line that is not a JSON object holding ``field`` as a string, naming the file
            and the line's number.
    """
    number = 0
    for block in blocks:
        lines = block.split("\n")
        if block.endswith("\n"):
            lines.pop()  # the empty rest after the block's last line break
        for line in lines:
            number += 1
            if line.strip():
                yield _field(file, number, line, field)


def _field(file: Path, number: int, line: str, field: str) -> str:
    where = f"{file}, line {number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataRefused("data", f"{where}: not JSON ({exc.msg}, column {exc.colno})") from None
    if not isinstance(record, dict):
        raise DataRefused("data", f"{where}: a JSON {json_kind(record)}, not an object")
    if field not in record:
        keys = ", ".join(repr(k) for k in record) or "none"
        raise DataRefused("data", f"{where}: no field {field!r} (its fields: {keys})")
    value = record[field]
    if not isinstance(value, str):
        raise DataRefused("data", f"{where}: field {field!r} is a JSON {json_kind(value)}, not a string")
    return value


def json_kind(value: Any) -> str:
    """A parsed JSON value's type, as JSON names it (another value's, a dataset's, by its Python type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)
