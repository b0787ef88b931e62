"""A prepared folder opened for reading: checked against its sources and the run's tokenizer, then read by
document, training and held-out documents apart.

Checks (:func:`check_prepared`), each refused in one line that says how to fix it:

- **the tokenizer**: the run's must be the one the shards were made with (its identity, see
  :mod:`~hintpipe.data.tokenizer`); token ids read with another tokenizer's vocabulary would train on
  nonsense without an error.
- **the sources**: a source that is still where it was must be as it was. A file of another size, a file
  added to or gone from a source folder, or a file whose time changed and whose SHA-256 differs, is a change:
  the shards no longer hold what the source says. A file whose time changed but whose bytes did not (copied,
  touched) is the same. A source no longer there at all is not checked: the shards are the data, and a
  prepared folder may be copied to a machine without the sources.

Held out (:data:`~hintpipe.data.manifest.HELD_OUT_EVERY`): every 20th document is held out of training, so
that the held-out loss is on text no step trained on; the two views map their indices onto the corpus's
without a list of them (training document ``j`` is document ``j + j // 19``, held-out ``j`` is ``20 j + 19``).

This module is torch-free.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import numpy.typing as npt

from hintpipe.data.manifest import HELD_OUT_EVERY, MANIFEST, Manifest, read_manifest
from hintpipe.data.refusal import DataRefused
from hintpipe.data.shards import Shards
from hintpipe.data.sources import Source, SourceKind
from hintpipe.data.split import DocumentSplit
from hintpipe.data.tokenizer import BYTES, tokenizer_identity

#: Which of a prepared corpus's documents: all of them, the training ones or the held-out ones.
Part = Literal["all", "training", "held_out"]


class DocumentView:
    """Some of a prepared corpus's documents, by index: all of them, the training ones or the held-out ones."""

    def __init__(self, shards: Shards, part: Part) -> None:
        self.shards = shards
        self.part = part
        total = len(shards)
        held = total // HELD_OUT_EVERY
        self._split = held > 0  # a corpus of fewer than 20 documents holds none out
        self._length = {"all": total, "training": total - held, "held_out": held}[part] if self._split else total

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> npt.NDArray[Any]:
        if not 0 <= index < self._length:
            raise IndexError(f"{self.part} document {index} of {self._length}")
        return self.shards.document(self.corpus_index(index))

    def corpus_index(self, index: int) -> int:
        """The corpus's index of this view's document ``index``."""
        if not self._split or self.part == "all":
            return index
        every = HELD_OUT_EVERY
        return index + index // (every - 1) if self.part == "training" else every * index + every - 1


class PreparedCorpus:
    """A prepared folder's documents, mapped (:class:`~hintpipe.data.shards.Shards`): ``documents`` all of them,
    ``training`` and ``held_out`` its split; ``vocab`` the tokenizer's vocabulary."""

    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = folder
        self.manifest = manifest
        self.shards = Shards(folder, list(manifest.shards))
        self.documents = DocumentView(self.shards, "all")
        self.training = DocumentView(self.shards, "training")
        self.held_out = DocumentView(self.shards, "held_out")

    @property
    def vocab(self) -> int:
        return self.manifest.vocab

    def part(self, part: Part) -> DocumentView:
        """The view of ``part`` of the documents."""
        return {"all": self.documents, "training": self.training, "held_out": self.held_out}[part]


def open_prepared(folder: str | os.PathLike[str]) -> PreparedCorpus:
    """Prepared folder ``folder``, opened once per process (again if it was prepared again since).

    Raises:
        DataRefused: (``data``) as :func:`~hintpipe.data.manifest.read_manifest`.
    """
    path = Path(folder).resolve()
    return _open(path, (path / MANIFEST).stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _open(path: Path, stamp: int) -> PreparedCorpus:
    del stamp  # the cache's key: a folder prepared again is opened again
    return PreparedCorpus(path, read_manifest(path))


def check_prepared(folder: str, manifest: Manifest, *, tokenizer: str) -> None:
    """Refuse a prepared folder the run cannot use as it is: the run's ``tokenizer`` not the shards' (unless
    ``tokenizer`` is the very folder the manifest names, now gone: the shards need no tokenizer to be read), or
    a source changed since (see the module's docstring).

    Raises:
        DataRefused: (``tokenizer``, ``data``) in one line that says what to give or what to run.
    """
    made = manifest.tokenizer
    named = tokenizer in (manifest.tokenizer_given, made.folder)
    gone = named and made.name != BYTES and not Path(tokenizer).exists()
    if not gone:
        run = tokenizer_identity(tokenizer)
        if not run.same(made):
            raise DataRefused(
                "tokenizer",
                f"{tokenizer}: {folder} was prepared with tokenizer {made}, not this one ({run}); use that "
                f"tokenizer ({made.folder or BYTES}), or prepare the sources again with this one",
            )
    for source in manifest.sources:
        change = _change(source.path, SourceKind(source.kind), manifest.split, {f.path: f for f in source.files})
        if change is not None:
            raise DataRefused(
                "data",
                f"{folder}: its source {source.given} changed since it was prepared ({change}); prepare it again: "
                f"{manifest.command} --out {folder} --replace",
            )


def _change(path: str, kind: SourceKind, split: str, recorded: dict[str, Any]) -> str | None:
    """How the source at ``path`` differs from its files as recorded (None: it does not, or it is gone)."""
    if not path.startswith("hf:") and not os.path.exists(path):
        return None
    source = Source(path, kind) if kind is not SourceKind.HF_FILES else Source.of(path)
    try:
        files = [str(f.resolve()) for f in source.files(DocumentSplit.parse(split))]
    except DataRefused:
        files = []
    for name in files:
        if name not in recorded:
            return f"{name} is new"
    for name, record in recorded.items():
        if name not in files:
            return f"{name} is gone"
        stat = os.stat(name)
        if stat.st_size != record.size_bytes:
            return f"{name} is {stat.st_size:,} bytes, was {record.size_bytes:,}"
        if stat.st_mtime_ns != record.mtime_ns and _sha256(Path(name)) != record.sha256:
            return f"{name} has other bytes (its SHA-256 differs)"
    return None


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
