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

A caller's own ``state`` that holds objects of its own classes must admit them
with :func:`torch.serialization.add_safe_globals` to be resumed.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from hintpipe.runtime.errors import CheckpointError

__all__ = [
    "SafeEmptyPlanner",
    "SafeLoadPlanner",
    "SafeReader",
    "UnsafeCheckpoint",
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
    """The ``.metadata`` of the checkpoint folder ``path`` (or that file itself), read without running code.

    Raises:
        UnsafeCheckpoint: it names anything but torch.distributed.checkpoint's metadata classes, or is not one.
    """
    source = Path(path)
    if source.is_dir():
        source = source / ".metadata"
    with source.open("rb") as f:
        return _checked(_load(f, source), source)


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


class SafeReader(FileSystemReader):
    """torch.distributed.checkpoint's file reader, reading ``.metadata`` as :func:`read_metadata` does."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _checked(_load(f, Path(path)), Path(path))
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


def _plain(read_item: ReadItem, value: io.BytesIO) -> Any:
    """A checkpoint's non-tensor value, loaded as data only."""
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        reason = next((line for line in first if "Unsupported global" in line), first[0] if first else "")
        raise UnsafeCheckpoint(
            f"the value {read_item.dest_index.fqn} is not plain data ({reason.strip()}): refused unread"
        ) from None


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
