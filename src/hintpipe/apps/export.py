"""A checkpoint out as a model others load: what ``hintpipe export CHECKPOINT OUT_DIR`` does.

The checkpoint's manifest says which model it holds (its description, see
:mod:`hintpipe.runtime.checkpoint.description`); the model is rebuilt from it
(:mod:`hintpipe.apps.model_description`), the checkpoint's tensors are loaded
into it with ``strict=True`` (every tensor, no other: what a checkpoint holds
is proven to be that model), and it is written:

- a Hugging Face model with ``save_pretrained`` (``config.json``,
  ``generation_config.json``, ``model.safetensors``): ``from_pretrained(OUT_DIR)``
  loads it, with nothing of hintpipe's; the run's tokenizer folder (``--tokenizer``,
  or a model folder's own) is copied beside it where it is unchanged
  (:mod:`hintpipe.data.tokenizer_record`), so ``AutoTokenizer.from_pretrained(OUT_DIR)``
  loads that too;
- a built-in model as ``model.safetensors`` (every state-dict key, each tensor
  its own storage) beside ``hintpipe_model.json`` (its ModelConfig's fields),
  loaded with hintpipe's builder::

      config = ModelConfig(**json.loads(Path(OUT_DIR, "hintpipe_model.json").read_text()))
      model = whole_model(config)[0]  # hintpipe.apps.models
      model.load_state_dict(safetensors.torch.load_file(Path(OUT_DIR, "model.safetensors")), strict=True)

The weights are written in float32, as they trained, unless ``dtype`` (``--dtype``) says ``bf16`` or ``fp16``:
half the size on disk, the dtype most pretrained models are shared in (torchtitan's ``export_dtype``); a Hugging
Face model's ``config.json`` then records it, so ``from_pretrained(OUT_DIR, dtype="auto")`` loads it so.
Tensors that are not floating point (a buffer of positions) stay as they are.

The files are written into a temporary folder beside ``OUT_DIR`` and moved in
once all are down: a failed export leaves ``OUT_DIR`` as it was. A run saving
into the checkpoint folder meanwhile does not prune the checkpoint being read
(see [Note: a reader's hold on a checkpoint] in
:mod:`hintpipe.runtime.checkpoint.readers`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hintpipe.apps.hf_models import without_progress_bars
from hintpipe.apps.model_description import architecture_of, rebuild_model
from hintpipe.data.tokenizer_record import TOKENIZER_FILES, copy_tokenizer
from hintpipe.modes import WeightsDtype
from hintpipe.runtime.checkpoint.description import HF
from hintpipe.runtime.checkpoint.manifest import MANIFEST, step_folders
from hintpipe.runtime.checkpoint.merged import held_checkpoint, read_merged
from hintpipe.runtime.checkpoint.run_folder import LATEST

#: A built-in model's files.
WEIGHTS = "model.safetensors"
BUILT_IN_CONFIG = "hintpipe_model.json"
#: What an earlier export into the same folder may have left that this one would contradict (``--force``
#: removes them first; every other file is left).
_EXPORTED = (
    "config.json",
    "generation_config.json",
    BUILT_IN_CONFIG,
    WEIGHTS,
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
)
_EXPORTED_SHARDS = "model-*-of-*.safetensors"


#: Each :class:`~hintpipe.modes.WeightsDtype`'s torch dtype.
_TORCH_DTYPES = {WeightsDtype.FP32: torch.float32, WeightsDtype.BF16: torch.bfloat16, WeightsDtype.FP16: torch.float16}


class ExportError(ValueError):
    """A checkpoint that cannot be exported, or a folder it cannot be exported into (one line, saying why)."""


@dataclasses.dataclass(frozen=True)
class Exported:
    """What :func:`export_checkpoint` wrote."""

    out_dir: Path
    checkpoint: Path  # the step folder exported
    step: int
    architecture: str  # the transformers class, or the built-in model's name
    files: tuple[str, ...]  # the files written into out_dir, by name
    notes: tuple[str, ...] = ()  # what was not exported, in words (a tokenizer moved since the run)
    dtype: WeightsDtype = WeightsDtype.FP32  # the floating-point tensors' dtype in the files


def export_checkpoint(
    checkpoint: str | Path, out_dir: str | Path, *, force: bool = False, dtype: str = "fp32"
) -> Exported:
    """Write the model a checkpoint holds into ``out_dir``, as its description says to rebuild it.

    ``checkpoint``: a checkpoint folder (its newest verified checkpoint) or one ``step-N`` folder. ``out_dir``
    must be new or empty, unless ``force`` (an earlier export's files there are replaced; others are left).
    ``dtype``: its floating-point tensors' (:class:`~hintpipe.modes.WeightsDtype`: ``fp32``, ``bf16``, ``fp16``).

    Raises:
        ExportError: not a checkpoint; no description (exported by hand, as the message says); a model this
            hintpipe cannot rebuild, or tensors that do not load into it; ``out_dir`` not empty.
        ValueError: an unknown ``dtype``.
        hintpipe.runtime.errors.CheckpointError: the checkpoint does not verify, or its files would run code.
    """
    written = WeightsDtype.parse(dtype)
    given, out = Path(checkpoint), Path(out_dir)
    _check_is_checkpoint(given)
    # Held until its tensors are in the model: a run saving into the folder meanwhile does not prune it (see
    # [Note: a reader's hold on a checkpoint] in hintpipe.runtime.checkpoint.readers).
    with held_checkpoint(given) as (folder, manifest):
        description = manifest.identity.model
        if description is None:
            raise ExportError(
                f"{folder} does not say which model it holds (written by hintpipe before 0.7, or by a Checkpointer "
                "given no model_description=); export it by hand: build the model, then "
                f"model.load_state_dict(hintpipe.load_merged({str(given)!r}), strict=True) and "
                f"model.save_pretrained({str(out)!r})"
            )
        _check_out_dir(out, folder, force)
        try:
            model = rebuild_model(description)
            architecture = architecture_of(description)
        except ValueError as exc:
            raise ExportError(f"cannot export {folder}: {exc}") from None
        state = read_merged(folder, manifest)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise ExportError(
                f"{folder}'s tensors do not load into the {architecture} its manifest describes: {said}"
            ) from None
    model.to(_TORCH_DTYPES[written])  # floating-point tensors only (nn.Module.to)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its folder is private (0700), and renamed into place it would stay so.
    staging = out.parent / f".{out.name}.{secrets.token_hex(4)}.export"
    staging.mkdir()
    try:
        if description["kind"] == HF:
            _save_pretrained(model, staging)
        else:
            _save_built_in(model, description["hintpipe_model"], staging)
        tokenizer = description.get("tokenizer")
        note = copy_tokenizer(tokenizer, staging) if isinstance(tokenizer, dict) else None
        files = tuple(sorted(p.name for p in staging.iterdir()))
        _move_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    notes = () if note is None else (note,)
    return Exported(
        out_dir=out,
        checkpoint=folder,
        step=manifest.step,
        architecture=architecture,
        files=files,
        notes=notes,
        dtype=written,
    )


def _check_is_checkpoint(path: Path) -> None:
    """Refuse a path that is no checkpoint at all in words of its own (not as a damaged one)."""
    if not path.exists():
        raise ExportError(f"{path} does not exist; give a --checkpoint-dir folder or one of its step-N folders")
    named = path.is_file() and path.name == LATEST
    if not named and not (path / MANIFEST).is_file() and not step_folders(path):
        raise ExportError(
            f"{path} is not a hintpipe checkpoint (no {MANIFEST} in it, no step-N folder under it); give a "
            "--checkpoint-dir folder or one of its step-N folders"
        )


def _check_out_dir(out: Path, folder: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file; give a folder to export into")
    if out.resolve() in (folder.resolve(), folder.parent.resolve()):
        raise ExportError(f"{out} is the checkpoint's own folder; export into another")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} is not empty; export into a new or empty folder, or write over it with --force")


def _save_pretrained(model: nn.Module, folder: Path) -> None:
    """``save_pretrained`` without its progress bar (a command prints one line)."""
    with without_progress_bars():
        model.save_pretrained(folder)  # type: ignore[operator]


def _save_built_in(model: nn.Module, fields: Mapping[str, Any], folder: Path) -> None:
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ExportError(f"exporting {fields.get('name')} needs safetensors: pip install -e '.[export]'") from None
    save_file(_own_storage(model.state_dict()), str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / BUILT_IN_CONFIG).write_text(json.dumps(dict(fields), indent=1, sort_keys=True) + "\n")


def _own_storage(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every key of ``state`` with a tensor of its own, contiguous: safetensors refuses tensors that share
    memory (a tied weight under two names), and ``load_file`` then gives every key ``strict=True`` wants."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        value = tensor.detach().to("cpu").contiguous()
        pointer = value.untyped_storage().data_ptr()
        out[name] = value.clone() if pointer in seen else value
        seen.add(pointer)
    return out


def _move_in(staging: Path, out: Path) -> None:
    """The staged files into ``out``: renamed whole when ``out`` does not exist, else file by file over an
    earlier export's (removed first, so that no shard of it is left beside these)."""
    if not out.exists():
        staging.replace(out)
        return
    for name in _EXPORTED:
        (out / name).unlink(missing_ok=True)
    for shard in out.glob(_EXPORTED_SHARDS):
        shard.unlink()
    for path in staging.iterdir():
        os.replace(path, out / path.name)
