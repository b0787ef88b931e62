"""The tokenizer that turns documents into token ids, and its identity: what a prepared folder records, so that
shards are never read as if another tokenizer had made them.

``bytes`` (UTF-8 bytes, vocabulary 256: any text, no files to ship) or a folder a Hugging Face tokenizer was
saved to (``save_pretrained``; read with ``transformers.AutoTokenizer``, local files only, vocabulary
``len(tokenizer)``; transformers is imported only then). A folder's identity is the SHA-256 of its tokenizer
files (:data:`~hintpipe.data.tokenizer_record.TOKENIZER_FILES`), not its path: a folder moved is the same
tokenizer, a file edited in place is another.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hintpipe.data.refusal import DataRefused
from hintpipe.data.tokenizer_record import tokenizer_record
from hintpipe.own_code import refuse_own_code

#: The tokenizer that needs no files: UTF-8 bytes.
BYTES = "bytes"
BYTES_VOCAB = 256
_BATCH = 1024  # documents per call of a Hugging Face tokenizer

TokenIds = npt.NDArray[np.integer[Any]]
Encode = Callable[[list[str]], list[TokenIds]]


@dataclasses.dataclass(frozen=True)
class TokenizerIdentity:
    """Which tokenizer made some token ids: ``bytes``, or a folder (``folder`` where it was, ``sha256`` of its
    files)."""

    name: str  # "bytes" or "folder"
    folder: str = ""
    sha256: str = ""

    def same(self, other: TokenizerIdentity) -> bool:
        return self.name == other.name and self.sha256 == other.sha256

    def __str__(self) -> str:
        return BYTES if self.name == BYTES else f"{self.folder} (SHA-256 {self.sha256[:12]})"

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenizerIdentity:
        return cls(str(data["name"]), str(data.get("folder", "")), str(data.get("sha256", "")))


def tokenizer_identity(name: str) -> TokenizerIdentity:
    """The identity of tokenizer ``name`` (``bytes`` or a folder), read without loading it.

    Raises:
        DataRefused: (``tokenizer``) a folder that does not exist.
    """
    if name == BYTES:
        return TokenizerIdentity(BYTES)
    _check_folder(name)
    files = tokenizer_record(name)["files"]
    digest = hashlib.sha256("".join(f"{file}\0{files[file]}\n" for file in sorted(files)).encode())
    return TokenizerIdentity("folder", str(Path(name).resolve()), digest.hexdigest())


_LOADED: dict[str, tuple[Encode, int]] = {}


def load_tokenizer(name: str) -> tuple[Encode, int]:
    """``(encode, vocabulary)``: ``encode`` turns texts into their token ids; loaded once per process.

    Raises:
        DataRefused: (``tokenizer``) no such folder, transformers not installed, a folder that holds no
            tokenizer.
    """
    if name == BYTES:
        return encode_bytes, BYTES_VOCAB
    key = os.path.abspath(name)
    if key not in _LOADED:
        _LOADED[key] = _hugging_face(name)
    return _LOADED[key]


def encode_bytes(texts: list[str]) -> list[TokenIds]:
    return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]


def _check_folder(name: str) -> None:
    if not Path(name).is_dir():
        saved = "the tokenizer is bytes, or a folder a Hugging Face tokenizer was saved to"
        raise DataRefused("tokenizer", f"{name}: no such folder ({saved})")


def _hugging_face(name: str) -> tuple[Encode, int]:
    """A tokenizer folder's tokenizer (``AutoTokenizer.from_pretrained``, local files only)."""
    _check_folder(name)
    try:
        refuse_own_code(name, ("tokenizer_config.json", "config.json"), what="tokenizer")
    except ValueError as exc:
        raise DataRefused("tokenizer", str(exc)) from None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataRefused(
            "tokenizer", f"{name}: a tokenizer folder needs transformers: pip install -e '.[hf]'"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for a folder it cannot read
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DataRefused(
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
