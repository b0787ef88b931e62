"""What a checkpoint belongs to, and proof that its files are the ones written.

A checkpoint folder holds torch.distributed.checkpoint's files and, written
last, ``manifest.json``: the run's identity (:class:`RunIdentity`: the run it
belongs to, every tensor's name and shape, and the model's description where
the run knew it) and a SHA-256 digest and size per file, then
``manifest.sha256``, the manifest's own digest. A folder
without a manifest was never finished; a file whose digest differs was
damaged after it was written, and so was a manifest edited by hand. Both are
told apart from a checkpoint of *another model* (other tensors), which is
refused rather than skipped: falling back past it would silently resume
something older.

This module is torch-free: the checks run anywhere, on any copy of the folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from hintpipe.runtime.checkpoint.links import create_new, not_a_file, open_regular
from hintpipe.runtime.errors import CheckpointError, DamagedCheckpoint

__all__ = ["CheckpointError", "DamagedCheckpoint", "Manifest", "RunIdentity"]

MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest.sha256"
#: 1: hintpipe 0.5 and earlier (no run, no digest of its own). The identity's ``model`` (0.7) kept format 2: a
#: reader before it ignores the key, and this one reads a manifest without it as None.
FORMAT = 2
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint belongs to: its run, and every tensor's name and shape (what must be the same to
    resume it).

    ``stage_ranks``, ``hint``, ``versions``, ``aliases``, ``keys`` and ``model`` are recorded for the reader; a
    change in them is allowed (a new torch, another hint, another plan of the same model: torch.distributed.checkpoint
    loads tensors by name). ``model`` is the model's description, where the run knew it (what rebuilds the
    model without the code that trained it: see :mod:`hintpipe.runtime.checkpoint.description`); None in
    manifests written before hintpipe 0.7 and by runs that gave none.
    """

    tensors: dict[str, list[int]]  # the model's name -> shape (one name per tensor), every rank's stages
    stage_ranks: list[int]  # stage -> rank
    hint: str
    versions: dict[str, str]
    run: str = ""  # the run's id (see :mod:`hintpipe.runtime.checkpoint.run_folder`); "" before hintpipe 0.6
    aliases: list[list[str]] = dataclasses.field(default_factory=list)  # names of each tensor stages share
    keys: list[str] = dataclasses.field(default_factory=list)  # the model's state-dict keys, in its order
    model: dict[str, Any] | None = None  # the model's description (plain JSON values), or None

    def differences(self, saved: RunIdentity) -> list[str]:
        """What the run (``self``) changed from the checkpoint (``saved``), in words; empty if resumable."""
        found: list[str] = []
        only_saved = sorted(set(saved.tensors) - set(self.tensors))
        only_here = sorted(set(self.tensors) - set(saved.tensors))
        reshaped = sorted(k for k in set(saved.tensors) & set(self.tensors) if saved.tensors[k] != self.tensors[k])
        if only_saved:
            found.append(f"{len(only_saved)} tensors only in the checkpoint ({_shapes(only_saved, saved.tensors)})")
        if only_here:
            found.append(f"{len(only_here)} tensors only in this model ({_shapes(only_here, self.tensors)})")
        if reshaped:
            name = reshaped[0]
            found.append(
                f"{len(reshaped)} tensors of another shape ({name}: {_shape(saved.tensors[name])} there, "
                f"{_shape(self.tensors[name])} here)"
            )
        return found

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunIdentity:
        return cls(
            tensors={str(k): [int(d) for d in v] for k, v in data["tensors"].items()},
            stage_ranks=[int(r) for r in data["stage_ranks"]],
            hint=str(data["hint"]),
            versions={str(k): str(v) for k, v in data["versions"].items()},
            run=str(data.get("run", "")),
            aliases=[[str(n) for n in group] for group in data.get("aliases", [])],
            keys=[str(k) for k in data.get("keys", [])],
            model=None if data.get("model") is None else dict(data["model"]),
        )


def _shape(shape: list[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _shapes(names: list[str], tensors: Mapping[str, list[int]]) -> str:
    shown = ", ".join(f"{n} {_shape(tensors[n])}" for n in names[:2])
    return shown + (", ..." if len(names) > 2 else "")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A finished checkpoint's record: its step, the run's identity, and each file's size and digest."""

    step: int
    identity: RunIdentity
    files: dict[str, tuple[int, str]]  # relative name -> (bytes, sha256)

    def write(self, folder: Path) -> None:
        """Written last, through a temporary name, and synced: its presence means every file is down. Its own
        digest follows it, so that a manifest edited by hand is refused, not believed."""
        data = {"format": FORMAT, "step": self.step, "identity": self.identity.to_json(), "files": self.files}
        text = json.dumps(data, indent=1, sort_keys=True)
        write_synced(folder / MANIFEST, text)
        write_synced(folder / MANIFEST_DIGEST, hashlib.sha256(text.encode()).hexdigest())

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        if not path.is_file():
            raise DamagedCheckpoint(
                f"{folder.name} has no {MANIFEST} (its save never finished, or hintpipe before 0.3 wrote it)"
            )
        try:
            text = path.read_text()
            data = json.loads(text)
            if data.get("format") not in (1, FORMAT):
                raise DamagedCheckpoint(f"{folder.name}: {MANIFEST} has format {data.get('format')!r}, not {FORMAT}")
            if data["format"] == FORMAT:
                _check_digest(folder, text)
            return cls(
                step=int(data["step"]),
                identity=RunIdentity.from_json(data["identity"]),
                files={str(k): (int(v[0]), str(v[1])) for k, v in data["files"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise DamagedCheckpoint(f"{folder.name}: {MANIFEST} is unreadable ({type(exc).__name__}: {exc})") from None

    def verify(self, folder: Path) -> None:
        """Every recorded file present, of its size and digest.

        Raises:
            DamagedCheckpoint: naming the first file that differs.
        """
        if step_of(folder) != self.step:
            raise DamagedCheckpoint(f"{folder.name}: its {MANIFEST} is for step {self.step}")
        for name, (size, digest) in sorted(self.files.items()):
            if not inside(name):
                raise DamagedCheckpoint(f"{folder.name}: its {MANIFEST} names {name}, outside its folder")
            path = folder / name
            kind = not_a_file(path)
            if kind is not None:  # a link, a FIFO (whose read would block), a device: never read
                raise DamagedCheckpoint(f"{folder.name}: {name} is {kind}, not a file")
            if not path.is_file():
                raise DamagedCheckpoint(f"{folder.name}: {name} is missing")
            if path.stat().st_size != size:
                raise DamagedCheckpoint(f"{folder.name}: {name} has {path.stat().st_size} bytes, {size} were written")
            if file_digest(path) != digest:
                raise DamagedCheckpoint(f"{folder.name}: {name} is not the file that was written (checksum differs)")


def inside(name: str) -> bool:
    """Whether ``name`` (a checkpoint's file, as its manifest or index names it) stays inside its folder: a
    relative path without ``..``."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and "\\" not in name and all(p not in ("..", ".") for p in path.parts)


def _check_digest(folder: Path, text: str) -> None:
    path = folder / MANIFEST_DIGEST
    if not path.is_file():
        raise DamagedCheckpoint(f"{folder.name}: {MANIFEST_DIGEST} is missing")
    if path.read_text().strip() != hashlib.sha256(text.encode()).hexdigest():
        raise DamagedCheckpoint(f"{folder.name}: {MANIFEST} was changed after it was written (its digest differs)")


def file_digest(path: Path) -> str:
    with os.fdopen(open_regular(path), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digests(paths: Iterable[Path], root: Path) -> dict[str, tuple[int, str]]:
    """Size and digest of each file, keyed by its name relative to ``root``."""
    return {str(p.relative_to(root)): (p.stat().st_size, file_digest(p)) for p in paths}


def step_of(folder: Path) -> int | None:
    """The step of a ``step-<n>`` folder, or None for any other name."""
    match = _STEP_DIR.match(folder.name)
    return int(match.group(1)) if match else None


def step_folders(root: Path) -> list[Path]:
    """The finished-looking checkpoint folders under ``root``, newest first (``.tmp`` folders excluded)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: Path) -> None:
    """A rename or a new file is durable only once its folder's entry is synced."""
    sync_file(path)


def write_synced(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``: a reader sees the old file or the whole new one. Its temporary
    (``<name>.tmp``) is created new, never written through a link (see [Note: no link in a run folder is
    followed] in :mod:`hintpipe.runtime.checkpoint.links`)."""
    temporary = path.with_name(path.name + ".tmp")
    with os.fdopen(create_new(temporary), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    sync_folder(path.parent)
