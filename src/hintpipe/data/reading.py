"""A text file read as a stream: decoded blocks of whole lines, and a JSON file's documents.

A corpus may be larger than a process's memory, so no file is read whole (but a ``.json`` file of one array,
which cannot be streamed by line). A file is read in blocks of about
:data:`BLOCK` bytes cut after a line break: UTF-8 never has a byte ``\\n`` inside a character, so every block
decodes on its own, and an undecodable byte is reported at its offset in the file, not in the block. Line
breaks are read as Python's universal newlines read them (``\\r\\n`` and ``\\r`` are ``\\n``): a block never
ends between ``\\r`` and ``\\n``, since it ends after a ``\\n``. The bytes read are counted (a progress bar) and
digested (SHA-256, for the manifest) on the way, so preparing reads each file once.

A file whose name ends in ``.gz``, ``.bz2`` or ``.xz`` is read through the standard library's ``gzip``, ``bz2``
or ``lzma`` (:data:`COMPRESSIONS`); its bytes on disk are what is counted and digested (the manifest's record
of the file), its text what is decoded (an undecodable byte's offset is in the text). A name ending in
another compression's suffix is refused, saying how to decompress it (:data:`UNREAD_COMPRESSIONS`): read as
text, its bytes would fail to decode at best.

This module is torch-free.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import json
import lzma
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hintpipe.data.refusal import FIELD_FIX, DataRefused

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
        DataRefused: (``data``) the file cannot be read, is not UTF-8 (naming the byte's offset in its text), is
            compressed in a form not read here, or does not decompress as its name says.
    """
    opener = COMPRESSIONS.get(file.suffix) if plain_name(file) != file else None
    try:
        with open(file, "rb") as raw:
            tee = io.BufferedReader(_Tee(raw, on_bytes, digest))
            reading: AbstractContextManager[_Reader] = tee if opener is None else opener(tee)
            with reading as handle:
                yield from _whole_lines(file, handle)
    except OSError as exc:
        raise DataRefused("data", f"{file}: {exc.strerror or exc}") from None


def _whole_lines(file: Path, handle: _Reader) -> Iterator[str]:
    offset = 0
    pending = bytearray()
    while block := _read(file, handle):
        cut = block.rfind(b"\n") + 1
        if not cut:  # no line break: the line goes on in the next block
            pending += block
            continue
        pending += block[:cut]
        yield _decode(file, pending, offset)
        offset += len(pending)
        pending = bytearray(block[cut:])
    if pending:
        yield _decode(file, pending, offset)


class _Reader(Protocol):
    """What a file's blocks are read from: the file, or its decompressor."""

    def read(self, size: int = -1, /) -> bytes: ...


class _Tee(io.RawIOBase):
    """A file's bytes as they are read from disk, counted and digested on the way (a compressed file's
    decompressor reads through it)."""

    def __init__(self, raw: BinaryIO, on_bytes: Callable[[int], None] | None, digest: Digest | None) -> None:
        super().__init__()
        self._raw, self._on_bytes, self._digest = raw, on_bytes, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        block = self._raw.read(len(buffer))
        buffer[: len(block)] = block
        if self._on_bytes is not None and block:
            self._on_bytes(len(block))
        if self._digest is not None:
            self._digest.update(block)
        return len(block)


#: The compressions a file's name may end in, each the standard library's reader of a file object.
COMPRESSIONS: dict[str, Callable[[BinaryIO], AbstractContextManager[_Reader]]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": lambda raw: bz2.BZ2File(raw, mode="rb"),
    ".xz": lambda raw: lzma.LZMAFile(raw, mode="rb"),  # noqa: SIM115  (each is opened in read_blocks' with)
}
#: Compressions the standard library does not read, by suffix: the format's name and its command to decompress.
UNREAD_COMPRESSIONS = {
    ".zst": ("zstd", "decompress it (zstd -d), or give it as a .gz file"),
    ".zstd": ("zstd", "decompress it (zstd -d), or give it as a .gz file"),
    ".lz4": ("LZ4", "decompress it (lz4 -d), or give it as a .gz file"),
    ".zip": ("a zip archive", "unpack it (unzip) and give its files or their folder"),
    ".7z": ("a 7-Zip archive", "unpack it (7z x) and give its files or their folder"),
    ".tar": ("a tar archive", "unpack it (tar -xf) and give its files or their folder"),
    ".tgz": ("a tar archive", "unpack it (tar -xf) and give its files or their folder"),
}


def plain_name(file: Path) -> Path:
    """``file``'s name without its compression's suffix (``corpus.jsonl.gz``: ``corpus.jsonl``): what says the
    format of its text.

    Raises:
        DataRefused: (``data``) a compression :data:`COMPRESSIONS` does not read, or an archive (``.tar.gz``
            too), saying what to do.
    """
    plain = file.with_suffix("") if file.suffix in COMPRESSIONS else file
    for name in (file, plain):
        if name.suffix in UNREAD_COMPRESSIONS:
            what, advice = UNREAD_COMPRESSIONS[name.suffix]
            raise DataRefused(
                "data", f"{file}: {what}, which hintpipe does not read (it reads {', '.join(COMPRESSIONS)}): {advice}"
            )
    return plain


def _read(file: Path, handle: _Reader) -> bytes:
    """A block of ``handle``'s bytes; a compressed file that does not decompress is refused, naming it."""
    try:
        return handle.read(BLOCK)
    except (EOFError, gzip.BadGzipFile, lzma.LZMAError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # the file could not be read (not a bad stream): said by read_blocks
        raise DataRefused("data", f"{file}: does not decompress as its name says ({exc})") from None


def _decode(file: Path, data: bytearray, offset: int) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataRefused(
            "data",
            f"{file}: not UTF-8 text (byte {offset + exc.start}: {exc.reason}); convert it to UTF-8 (iconv -f "
            "ENCODING -t UTF-8), as the tokenizer reads UTF-8",
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


#: How a JSON file's records are laid out, said when its first record does not read (a pretty-printed object
#: of records, as some datasets ship, is neither).
LAYOUTS = "a JSON file's records are one object per line, or one array of objects"


def json_documents(file: Path, blocks: Iterator[str], field: str) -> Iterator[str]:
    """A JSON file's documents: each record's ``field``. The records are one JSON object per line (JSON Lines,
    blank lines skipped), or the elements of one JSON array (the whole file, as ``json.dump`` of a list writes
    it: read whole, as an array cannot be streamed by line).

    Raises:
        DataRefused: (``data``) a record that is not a JSON object holding ``field`` as a string, naming the
            file and the line's number (the element's, in an array).
    """
    first = next(blocks, "")
    if first.lstrip().startswith("["):
        yield from _array_documents(file, "".join(itertools.chain([first], blocks)), field)
        return
    number, read = 0, 0
    for block in itertools.chain([first], blocks):
        lines = block.split("\n")
        if block.endswith("\n"):
            lines.pop()  # the empty rest after the block's last line break
        for line in lines:
            number += 1
            if line.strip():
                where = f"{file}, line {number}"
                try:
                    record = _parsed(where, line)
                except DataRefused as refused:
                    if read:
                        raise
                    raise DataRefused("data", f"{refused}; {LAYOUTS}") from None  # its first record
                read += 1
                yield _field(where, record, field)


def _array_documents(file: Path, text: str, field: str) -> Iterator[str]:
    records = _parsed(str(file), text)
    assert isinstance(records, list), "a JSON text that starts with [ is an array"
    for number, record in enumerate(records):
        yield _field(f"{file}, element {number}", record, field)


def _parsed(where: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if "line" not in where else f"column {exc.colno}"
        raise DataRefused("data", f"{where}: not JSON ({exc.msg}, {at})") from None


def _field(where: str, record: Any, field: str) -> str:
    if not isinstance(record, dict):
        raise DataRefused("data", f"{where}: a JSON {json_kind(record)}, not an object")
    if field not in record:
        keys = ", ".join(repr(k) for k in record) or "none"
        raise DataRefused("data", f"{where}: no field {field!r} (its fields: {keys})", fix=FIELD_FIX)
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
