"""The user's own text as a corpus: plain-text or JSONL files (or a folder of them), as token ids.

``hintpipe train --data PATH`` (``TrainConfig(data=PATH)``) trains on real text the user has, not only on the
standard library's (:mod:`~hintpipe.apps.corpus`). What ``PATH`` may be:

- a plain-text file (any name but ``*.jsonl``): documents separated by one or more blank lines (lines of
  whitespace only); a document is its lines as written, joined by line breaks;
- a ``.jsonl`` file: one JSON object per line, the document the string under ``field`` (``text``); blank lines
  are skipped, any other line that is not such an object is refused naming the file and the line;
- a folder: every ``*.txt`` and ``*.jsonl`` file under it (recursively), in sorted path order.

Files are read as UTF-8. The tokenizer is ``bytes`` (UTF-8 bytes, vocabulary 256: any text, no files to
ship) or a folder a Hugging Face tokenizer was saved to (``save_pretrained``; read with
``transformers.AutoTokenizer``, local files only, vocabulary ``len(tokenizer)``; transformers is imported
only then; a folder that maps to Python code of its own, an ``auto_map``, is refused: see
:mod:`~hintpipe.apps.own_code`). Documents of fewer than 2 tokens are left out: a document gives at least one
input and its target.

Every rank draws the same data from the same files, so a corpus is loaded (read and tokenized) once per
process and kept (:func:`text_corpus`, keyed by the absolute paths, the field and the tokenizer): the
launcher loads it to check it and learn its vocabulary before any rank starts, each rank once for its steps.

Held out (:func:`split_held_out`): every 20th document is held out of training, so that ``eval_every``'s
loss is on text no step trained on.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hintpipe.apps.own_code import refuse_own_code

#: The data that are not files: counting text (:func:`hintpipe.apps.models.make_batch`) and the standard
#: library's source files (:mod:`hintpipe.apps.corpus`). Any other ``data`` is a path.
BUILT_IN_DATA = ("synthetic", "stdlib")
#: The tokenizer that needs no files: UTF-8 bytes.
BYTES = "bytes"
BYTES_VOCAB = 256
#: Document ``i`` (counted after the short ones are left out) is held out when ``i % HELD_OUT_EVERY`` is
#: ``HELD_OUT_EVERY - 1``.
HELD_OUT_EVERY = 20
_SHORTEST = 2  # tokens: an input and its target
_BATCH = 1024  # documents per call of a Hugging Face tokenizer
#: The field of a JSONL line that holds its document, unless ``field`` says another.
DEFAULT_FIELD = "text"

TokenIds = npt.NDArray[np.integer[Any]]


@dataclasses.dataclass(frozen=True, eq=False)
class TextCorpus:
    """A corpus loaded from files: every document's token ids, and how they split for training.

    Attributes:
        documents: every document of 2 tokens or more, in the order of the files and of the documents in them.
        training: the documents a training step draws from (all but the held-out ones).
        held_out: the documents the held-out loss draws from (see :func:`split_held_out`).
        vocab: the tokenizer's vocabulary (every token id is below it): the model's ``vocab``.
    """

    documents: tuple[TokenIds, ...]
    training: tuple[TokenIds, ...]
    held_out: tuple[TokenIds, ...]
    vocab: int


class _Refused(ValueError):
    """A corpus or tokenizer refused: ``option`` is the option to name (``data`` or ``tokenizer``)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


_CORPORA: dict[tuple[str, str, str], TextCorpus] = {}
_TOKENIZERS: dict[str, tuple[Callable[[list[str]], list[TokenIds]], int]] = {}


def text_corpus(data: str, *, field: str = "text", tokenizer: str = BYTES, cli: bool = False) -> TextCorpus:
    """The corpus of the file or folder ``data``, tokenized by ``tokenizer`` (``bytes`` or a tokenizer folder):
    loaded on the first call in this process, kept for the next ones.

    Raises:
        ValueError: in one line naming the option (``--data`` on the command line, ``data`` in Python) and the
            path: a path that does not exist, a file that is not UTF-8, a JSONL line that is not an object with
            ``field`` as a string (its file and line number), a folder without text files, a corpus without a
            document of 2 tokens, a tokenizer folder that holds no tokenizer.
    """
    key = (os.path.abspath(data), field, tokenizer if tokenizer == BYTES else os.path.abspath(tokenizer))
    if key not in _CORPORA:
        try:
            encode, vocab = _tokenizer(tokenizer)
            texts = read_documents(data, field=field)
            documents = tuple(ids for ids in encode(list(texts)) if len(ids) >= _SHORTEST)
            if not documents:
                raise _Refused("data", f"{data}: no document of {_SHORTEST} tokens or more (an empty corpus)")
        except _Refused as exc:
            flag = "--" + exc.option if cli else exc.option
            raise ValueError(f"{flag} {exc}") from None
        training, held_out = split_held_out(documents)
        _CORPORA[key] = TextCorpus(documents, training, held_out, vocab)
    return _CORPORA[key]


def split_held_out(documents: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(training, held_out)``: document ``i`` is held out when ``i % 20 == 19``, the others train. A corpus of
    fewer than 20 documents holds none out: it trains on all of them, and the held-out loss draws from all of
    them too (a loss on text the run trains on, rather than none)."""
    held_out = tuple(documents[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY])
    if not held_out:
        return tuple(documents), tuple(documents)
    training = tuple(d for i, d in enumerate(documents) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1)
    return training, held_out


def data_vocab(data: str, field: str = "text", tokenizer: str = BYTES, *, cli: bool = False) -> int | None:
    """The vocabulary ``data``'s token ids need: None for ``synthetic`` (the model's own), 256 for ``stdlib``
    (bytes), the tokenizer's for a file or folder (loaded here, so that a bad corpus is refused here).

    Raises:
        ValueError: as :func:`text_corpus`; a tokenizer folder for built-in data, whose tokens are their own.
    """
    if field != DEFAULT_FIELD and not _reads_jsonl(data):  # an option that would change nothing
        said, named = ("--data-field", "--data") if cli else ("data_field", "data")
        raise ValueError(
            f"{said} {field} names the field of a JSONL line's document; {named} {data} has no .jsonl file"
        )
    if data not in BUILT_IN_DATA:
        return text_corpus(data, field=field, tokenizer=tokenizer, cli=cli).vocab
    if tokenizer != BYTES:
        label = "--" if cli else ""
        raise ValueError(
            f"{label}tokenizer {tokenizer} tokenizes a data file or folder; {label}data {data} has tokens of its own"
        )
    return None if data == "synthetic" else BYTES_VOCAB


def _reads_jsonl(data: str) -> bool:
    """Whether ``data`` is a ``.jsonl`` file or a folder with one under it (what ``field`` applies to)."""
    if data in BUILT_IN_DATA:
        return False
    path = Path(data)
    if path.is_dir():
        return any(p.is_file() for p in path.rglob("*.jsonl"))
    return path.suffix == ".jsonl"


def read_documents(data: str, *, field: str = "text") -> tuple[str, ...]:
    """The documents of the file or folder ``data`` as text, in order (before tokenizing: none left out).

    Raises:
        ValueError: as :func:`text_corpus` (naming the path, without the option).
    """
    path = Path(data)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
        if not files:
            raise _Refused("data", f"{data}: a folder without a .txt or .jsonl file in it")
    elif path.is_file():
        files = [path]
    else:
        raise _Refused("data", f"{data}: no such file or folder")
    documents: list[str] = []
    for file in files:
        text = _read(file)
        documents += _json_lines(file, text, field) if file.suffix == ".jsonl" else _paragraphs(text)
    return tuple(documents)


def _read(file: Path) -> str:
    try:
        with open(file, encoding="utf-8") as handle:  # universal newlines: \r\n is \n
            return handle.read()
    except UnicodeDecodeError as exc:
        raise _Refused("data", f"{file}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise _Refused("data", f"{file}: {exc.strerror or exc}") from None


def _paragraphs(text: str) -> list[str]:
    """A plain-text file's documents: runs of lines between blank ones."""
    documents: list[str] = []
    lines: list[str] = []
    for line in [*text.split("\n"), ""]:
        if line.strip():
            lines.append(line)
        elif lines:
            documents.append("\n".join(lines))
            lines = []
    return documents


def _json_lines(file: Path, text: str, field: str) -> list[str]:
    """A JSONL file's documents: each line's ``field``."""
    documents = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{file}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _Refused("data", f"{where}: not JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(record, dict):
            raise _Refused("data", f"{where}: a JSON {_kind(record)}, not an object")
        if field not in record:
            keys = ", ".join(repr(k) for k in record) or "none"
            raise _Refused("data", f"{where}: no field {field!r} (its fields: {keys})")
        value = record[field]
        if not isinstance(value, str):
            raise _Refused("data", f"{where}: field {field!r} is a JSON {_kind(value)}, not a string")
        documents.append(value)
    return documents


def _kind(value: Any) -> str:
    """A parsed JSON value's type, as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number"}
    return names[type(value)]


def _tokenizer(name: str) -> tuple[Callable[[list[str]], list[TokenIds]], int]:
    """``(encode, vocabulary)``: ``encode`` turns texts into their token ids; loaded once per process."""
    if name == BYTES:
        return _encode_bytes, BYTES_VOCAB
    key = os.path.abspath(name)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _hugging_face(name)
    return _TOKENIZERS[key]


def _encode_bytes(texts: list[str]) -> list[TokenIds]:
    return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]


def _hugging_face(name: str) -> tuple[Callable[[list[str]], list[TokenIds]], int]:
    """A tokenizer folder's tokenizer (``AutoTokenizer.from_pretrained``, local files only, no code from the
    folder: see :mod:`hintpipe.apps.own_code`)."""
    if not Path(name).is_dir():
        saved = "the tokenizer is bytes, or a folder a Hugging Face tokenizer was saved to"
        raise _Refused("tokenizer", f"{name}: no such folder ({saved})")
    try:
        refuse_own_code(name, ("tokenizer_config.json", "config.json"), what="tokenizer")
    except ValueError as exc:
        raise _Refused("tokenizer", str(exc)) from None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise _Refused("tokenizer", f"{name}: a tokenizer folder needs transformers: pip install -e '.[hf]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for a folder it cannot read
        first = (str(exc).strip().splitlines() or [""])[0]
        raise _Refused(
            "tokenizer", f"{name}: not a folder a Hugging Face tokenizer was saved to ({type(exc).__name__}: {first})"
        ) from None
    vocab = len(tokenizer)
    dtype = np.int32 if vocab <= np.iinfo(np.int32).max else np.int64

    def encode(texts: list[str]) -> list[TokenIds]:
        out: list[TokenIds] = []
        for start in range(0, len(texts), _BATCH):
            ids = tokenizer(texts[start : start + _BATCH], verbose=False)["input_ids"]
            out += [np.asarray(row, dtype=dtype) for row in ids]
        return out

    return encode, vocab
