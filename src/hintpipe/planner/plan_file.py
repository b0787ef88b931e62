"""Plans on disk: ``hintpipe plan --save`` writes one, ``hintpipe train --plan`` trains from it.

A plan file holds the whole :class:`~hintpipe.planner.plan.Plan`: the cuts
and choices, and the captured graph with **the model's weights as they were
when it was planned** (the captured copy), which is what its stages are built
from. Training from a plan file therefore starts from those weights. Beside
it: the torch and hintpipe versions, the parameter names and shapes (the
model's signature) and what the caller says the model is (for the built-in
models, their config). Loading refuses a file of another torch version (the
captured graph is torch's own pickled code) and checks the rest against what
the caller expects, naming both sides.

The file is written to a temporary name and renamed, so a crash leaves either
the old file or the new one. Loading unpickles code: load only plan files you
trust.
"""

from __future__ import annotations

import importlib.metadata
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from hintpipe.planner.plan import Plan

_FORMAT = "hintpipe-plan/1"


class PlanFileError(ValueError):
    """A plan file that cannot be read, or that does not match the run."""


def _version() -> str:
    try:
        return importlib.metadata.version("hintpipe")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def signature(plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
    """The captured model's parameter names and shapes."""
    return [(name, tuple(p.shape)) for name, p in plan.graph.module.named_parameters()]


def save_plan(plan: Plan, path: str | Path, *, model: dict[str, Any] | None = None) -> Path:
    """Write ``plan`` (and ``model``, a description of the model it was made for) to ``path``, atomically."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    payload = {
        "format": _FORMAT,
        "torch": torch.__version__,
        "hintpipe": _version(),
        "signature": signature(plan),
        "model": model or {},
        "plan": plan,
    }
    with open(tmp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    return target


def load_plan(path: str | Path) -> tuple[Plan, dict[str, Any]]:
    """The plan in ``path`` and the model description saved with it.

    Raises:
        PlanFileError: unreadable, not a plan file, or written by another torch version.
    """
    try:
        payload = torch.load(path, weights_only=False)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
        raise PlanFileError(f"cannot read plan file {path}: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise PlanFileError(f"{path} is not a hintpipe plan file (write one with `hintpipe plan ... --save FILE`)")
    if payload["torch"] != torch.__version__:
        raise PlanFileError(
            f"{path} was planned with torch {payload['torch']}, this is torch {torch.__version__}: plan again"
        )
    plan = payload["plan"]
    if not isinstance(plan, Plan):
        raise PlanFileError(f"{path} holds no plan")
    if signature(plan) != payload["signature"]:
        raise PlanFileError(f"{path} is damaged: its model's parameters do not match its recorded signature")
    return plan, dict(payload["model"])


def check_plan(plan: Plan, path: str | Path, *, ranks: int, microbatches: int | None = None) -> None:
    """Refuse a plan made for another pipeline, naming both numbers."""
    if plan.ranks != ranks:
        raise PlanFileError(
            f"{path} is planned for {plan.ranks} ranks, this run has {ranks}; plan again or use --ranks {plan.ranks}"
        )
    if microbatches is not None and plan.microbatches != microbatches:
        raise PlanFileError(
            f"{path} is planned for {plan.microbatches} micro-batches, this run asks for {microbatches}; "
            f"plan again or use --microbatches {plan.microbatches}"
        )
