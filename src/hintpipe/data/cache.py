"""Raw files prepared on a run's first use: ``train --data corpus.jsonl`` tokenizes it once into a cache
folder, and every later run (and every rank) reads that folder.

[Note: a cache folder is named by what it was made from]
The folder's name ends with a digest of the source (its absolute path, kind, every file's path, size and
modification time), the tokenizer's identity (:mod:`~hintpipe.data.tokenizer`), ``--data-split`` and
``--data-field``. A source edited since, or another tokenizer, is another name, so it is prepared again into
another folder: a run never reads shards of what its source was. The price is a folder per version of a
source; the cache may be deleted whenever no run is starting (``rm -r ~/.cache/hintpipe/data``).

Where: ``$HINTPIPE_CACHE/data``, else ``$XDG_CACHE_HOME/hintpipe/data``, else ``~/.cache/hintpipe/data``.

Who prepares: the process that resolves the run's data, before any rank starts (``hintpipe train``'s
launcher; :class:`~hintpipe.apps.train_config.TrainConfig` when made in Python). Under ``torchrun`` every
process resolves it: an exclusive lock (``flock``) on the folder's lock file lets the first prepare while the
others wait for it, then find it prepared. The ranks themselves only open what was prepared.

This module is torch-free.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from hintpipe.data.manifest import VERSION, is_prepared
from hintpipe.data.prepare import Progress, prepare
from hintpipe.data.sources import Source
from hintpipe.data.split import DocumentSplit
from hintpipe.data.tokenizer import tokenizer_identity

CACHE_ENV = "HINTPIPE_CACHE"


def cache_root(what: str = "data") -> Path:
    """Where hintpipe caches ``what``: prepared folders (``data``, see the module's docstring), node profiles
    (``profiles``, see :func:`hintpipe.cli.train_model.profile_cache`)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given) / what
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hintpipe" / what


def cached_folder(path: str, *, tokenizer: str, split: str, field: str, progress: Progress | None = None) -> Path:
    """The prepared folder of the source at ``path`` as the run reads it: prepared here if it is not yet.

    Raises:
        DataRefused: as :func:`~hintpipe.data.prepare.prepare`.
    """
    source = Source.of(path)
    files = source.files(DocumentSplit.parse(split))
    identity = tokenizer_identity(tokenizer)
    said = {
        "version": VERSION,
        "source": source.absolute,
        "kind": source.kind.value,
        "split": split,
        "field": field if source.reads_field else "",
        "tokenizer": [identity.name, identity.sha256],
        "files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
    }
    digest = hashlib.sha256(json.dumps(said, sort_keys=True).encode()).hexdigest()[:20]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source.pattern or source.path).name)[:40] or "source"
    root = cache_root()
    folder = root / f"{stem}-{digest}"
    if is_prepared(folder):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{folder.name}.lock"):
        if not is_prepared(folder):
            for stale in root.glob(f".{folder.name}.preparing-*"):  # a preparation that died part-way
                shutil.rmtree(stale, ignore_errors=True)
            prepare([path], folder, tokenizer=tokenizer, split=split, field=field, progress=progress)
    return folder


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
