"""Reading a checkpoint runs no code from it.

[Note: nothing from disk runs code]
torch.distributed.checkpoint keeps a checkpoint's index in ``.metadata``, a
pickle, and the non-tensor values of a state dict (an optimizer's
``param_groups``, a step count) as ``torch.save`` pickles inside the
``.distcp`` files; its reader loads the first with :func:`pickle.load` and its
planner the others with ``torch.load(weights_only=False)``. A pickle may call
any function while it loads: a forged ``.metadata`` whose manifest digests
were recomputed ran a command on ``--resume``. The manifest proves that a
checkpoint is whole, not who wrote it. So hintpipe reads ``.metadata`` with an
unpickler that admits only torch.distributed.checkpoint's metadata classes and
the few values they hold (``torch.Size``, dtypes, layouts, a path), and the
values with ``torch.load(weights_only=True)`` (tensors and plain containers).
Anything else is refused in one line, unread: :class:`UnsafeCheckpoint`.

The index names the file (and the place in it) of every value: each such path
must stay inside the step folder, be a regular file and be covered by a digest
of the checkpoint's manifest (:func:`check_items`), or the checkpoint is refused
in one line naming it, before anything is read (see [Note: a checkpoint's reads
never block] in :mod:`hintpipe.runtime.checkpoint.files`).

A caller's own ``state`` that holds objects of its own classes must admit them
with :func:`torch.serialization.add_safe_globals` to be resumed.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from hintpipe.runtime.checkpoint.files import RunFiles
from hintpipe.runtime.checkpoint.links import not_a_file, open_regular
from hintpipe.runtime.checkpoint.manifest import MANIFEST, Manifest, inside
from hintpipe.runtime.errors import CheckpointError, DamagedCheckpoint

__all__ = [
    "SafeEmptyPlanner",
    "SafeLoadPlanner",
    "SafeReader",
    "UnsafeCheckpoint",
    "check_items",
    "read_metadata",
    "refusals_said",
    "unsafe_in",
]

_METADATA = "torch.distributed.checkpoint.metadata"
#: Everything a ``.metadata`` pickle may name (dtypes are admitted by type, see :func:`_admitted`).
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        (_METADATA, "Metadata"),
        (_METADATA, "MetadataIndex"),
        (_METADATA, "StorageMeta"),
        (_METADATA, "TensorProperties"),
        (_METADATA, "TensorStorageMetadata"),
        (_METADATA, "BytesStorageMetadata"),
        (_METADATA, "ChunkStorageMetadata"),
        (_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
    }
)


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint file that would run code when read (forged, or not written by torch.distributed.checkpoint)."""


def _admitted(module: str, name: str) -> bool:
    if (module, name) in ALLOWED:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, source: Path) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if not _admitted(module, name):
            raise UnsafeCheckpoint(
                f"{self.source} names {module}.{name}, which is not torch.distributed.checkpoint metadata: refused "
                "unread (a forged or foreign file); resume from another checkpoint or start fresh"
            )
        return super().find_class(module, name)


def read_metadata(path: str | Path) -> Metadata:
    """The ``.metadata`` of the checkpoint folder ``path`` (or that file itself), read without running code,
    every file it names checked (:func:`check_items`).

    Raises:
        UnsafeCheckpoint: it names anything but torch.distributed.checkpoint's metadata classes, or is not one,
            or it names a file that is outside its folder, not a regular file or not covered by a digest.
    """
    source = Path(path)
    if source.is_dir():
        source = source / ".metadata"
    with os.fdopen(_opened(source), "rb") as f:
        return check_items(_checked(_load(f, source), source), source)


def _load(file: Any, source: Path) -> Any:
    try:
        return _MetadataUnpickler(file, source).load()
    except UnsafeCheckpoint:
        raise
    except Exception as exc:  # a truncated or garbled pickle
        raise UnsafeCheckpoint(f"{source} is not a readable checkpoint index ({type(exc).__name__}: {exc})") from None


def _checked(found: Any, source: Path) -> Metadata:
    if not isinstance(found, Metadata):
        raise UnsafeCheckpoint(f"{source} holds a {type(found).__name__}, not a checkpoint index: refused")
    return found


def _opened(source: Path) -> int:
    try:
        return open_regular(source)
    except OSError as exc:
        raise UnsafeCheckpoint(f"{source} cannot be read: {exc.strerror or exc}") from None


def check_items(metadata: Metadata, source: Path) -> Metadata:
    """``metadata`` (read from ``source``, a step folder's ``.metadata``), once every file it names is inside
    the folder, a regular file, and covered by a digest of the folder's manifest (see [Note: a checkpoint's
    reads never block] in :mod:`hintpipe.runtime.checkpoint.files`).

    Raises:
        UnsafeCheckpoint: one line naming the first path that is not, and why.
    """
    folder = source.parent
    try:
        covered = set(Manifest.read(folder).files)
    except DamagedCheckpoint:
        covered = set()
    named = sorted({str(getattr(info, "relative_path", "")) for info in (metadata.storage_data or {}).values()})
    for name in named:
        kind = not_a_file(folder / name) if inside(name) else None
        if not inside(name):
            why = f"outside its checkpoint folder {folder}"
        elif kind is not None:
            why = f"which is {kind}, not a file"
        elif name not in covered:
            why = f"which no digest of its {MANIFEST} covers"
        else:
            continue
        raise UnsafeCheckpoint(
            f"{source} names {name} for its values, {why}: refused unread (a forged or foreign file); resume from "
            "another checkpoint or start fresh"
        )
    return metadata


class SafeReader(FileSystemReader):
    """torch.distributed.checkpoint's file reader, reading ``.metadata`` as :func:`read_metadata` does and
    every file as [Note: a checkpoint's reads never block] says."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.fs = RunFiles()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        with os.fdopen(_opened(path), "rb") as f:
            metadata = check_items(_checked(_load(f, path), path), path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


def unsafe_in(exc: BaseException) -> UnsafeCheckpoint | None:
    """The refusal inside an error of torch.distributed.checkpoint (which wraps what its planner raised, per
    rank), so that it is said in its own one line; None when there is none."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        found = todo.pop()
        if found is None or id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, UnsafeCheckpoint):
            return found
        failures = getattr(found, "failures", None)
        if isinstance(failures, dict):
            todo += [pair[0] for pair in failures.values() if isinstance(pair, tuple) and pair]
        todo += [found.__cause__, found.__context__]
    return None


@contextlib.contextmanager
def refusals_said() -> Iterator[None]:
    """Around a load by torch.distributed.checkpoint with :class:`SafeReader`: a refusal its planner raised
    comes out as itself, in its own one line (:func:`unsafe_in`), not inside torch's wrapping of it."""
    try:
        yield
    except BaseException as exc:
        refused = unsafe_in(exc)
        if refused is not None:
            raise refused from None
        raise


#: The global torch's refusal names ("Trying to load unsupported GLOBAL posix.system whose module ...").
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _plain(read_item: ReadItem, value: io.BytesIO) -> Any:
    """A checkpoint's non-tensor value, loaded as data only; refused naming the global it would call."""
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _GLOBAL.search(str(exc))
        named = found.group(1) if found is not None else _first_unsafe(value)
        what = f"names {named}, which is not plain data" if named else f"is not plain data ({type(exc).__name__})"
        raise UnsafeCheckpoint(
            f"the value {read_item.dest_index.fqn} {what}: refused unread (a forged or foreign file); resume from "
            "another checkpoint or start fresh"
        ) from None


def _first_unsafe(value: io.BytesIO) -> str | None:
    """The first global a ``torch.save`` file names beyond what ``weights_only`` admits, where torch's error
    did not say it."""
    value.seek(0)
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(value)
    except Exception:  # not a zip file at all
        return None
    return found[0] if found else None


class SafeLoadPlanner(DefaultLoadPlanner):
    """torch.distributed.checkpoint's load planner, loading non-tensor values as data only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_plain(self, read_item, value)


class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
    """The planner that rebuilds a whole state dict from a checkpoint, loading non-tensor values as data only."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's own is untyped

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_plain(self, read_item, value)


def _load_plain(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
    from torch.distributed.checkpoint._traverse import set_element

    loaded = _plain(read_item, value)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded
