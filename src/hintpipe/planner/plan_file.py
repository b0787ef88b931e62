"""Plans on disk: ``hintpipe plan --save`` writes one, ``hintpipe train --plan`` trains from it.

A plan file holds data only, no code: the plan's cuts and choices, the
profiles, how the model was captured (:class:`~hintpipe.planner.capture.CaptureSpec`:
input shapes and keyword inputs), the captured graph's code as text (to
compare, never to run), **the model's weights as they were when it was
planned**, the torch and hintpipe versions, and what the caller says the
model is (for the built-in models, their config). It is read with
``torch.load(weights_only=True)``, which builds tensors and plain values and
nothing else.

Loading needs the model itself (the caller's code, which the caller trusts):
it is captured again as the spec says, the graph must be the one that was
planned (its code and parameter shapes; otherwise the file is refused in one
line naming both versions), and the saved weights are loaded into it. So a
plan file of another torch version loads where that version captures the
same graph.

The file is written to a temporary name and renamed, so a crash leaves either
the old file or the new one.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hintpipe.planner.capture import CaptureError, CaptureSpec
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.partition import Partition, StagePlan
from hintpipe.planner.plan import Plan

_FORMAT = "hintpipe-plan/2"


class PlanFileError(ValueError):
    """A plan file that cannot be read, or that does not match the run."""


def _version() -> str:
    try:
        return importlib.metadata.version("hintpipe")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def save_plan(plan: Plan, path: str | Path, *, model: dict[str, Any] | None = None) -> Path:
    """Write ``plan`` (and ``model``, a description of the model it was made for: plain values) to ``path``,
    atomically."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    payload = {
        "format": _FORMAT,
        "torch": str(torch.__version__),
        "hintpipe": _version(),
        "model": model or {},
        "plan": _plan_data(plan),
        "spec": dataclasses.asdict(plan.spec),
        "code": plan.graph.module.code,
        "shapes": _shapes(plan.graph.module),
        "fingerprint": plan.fingerprint,
        # On the host: a plan made on a GPU loads where there is none.
        "weights": {name: t.detach().to("cpu", copy=True) for name, t in plan.graph.module.state_dict().items()},
    }
    with open(tmp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    return target


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """A plan file's contents as plain values and tensors (nothing is built or run).

    Raises:
        PlanFileError: unreadable, or not a plan file of this format.
    """
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        # torch's refusal of anything but tensors and plain values says what it found on one line of many
        said = next((line for line in lines if line.startswith("WeightsUnpickler error")), lines[0])
        raise PlanFileError(f"cannot read plan file {path}: {said}") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise PlanFileError(f"{path} is not a hintpipe plan file (write one with `hintpipe plan ... --save FILE`)")
    return payload


def load_plan(path: str | Path, model: nn.Module) -> tuple[Plan, dict[str, Any]]:
    """The plan in ``path`` for ``model`` (the model it was planned for: captured again, its graph checked
    against the planned one, the planned weights loaded), and the model description saved with it.

    Raises:
        PlanFileError: unreadable, not a plan file, or ``model`` does not capture to the planned graph.
    """
    payload = read_plan_file(path)
    spec = _spec(payload["spec"])
    versions = f"planned with torch {payload['torch']} and hintpipe {payload['hintpipe']}"
    try:
        graph = spec.recapture(model)
    except CaptureError as exc:
        raise PlanFileError(f"{path}: the model cannot be captured as it was when {versions}: {exc}") from None
    differs = _difference(graph.module, payload)
    if differs:
        raise PlanFileError(
            f"{path} was {versions}; here (torch {torch.__version__}, hintpipe {_version()}) the model captures "
            f"to another graph ({differs}): plan again, or give the model it was planned for"
        )
    try:
        graph.module.load_state_dict(payload["weights"], strict=True)
    except RuntimeError as exc:
        raise PlanFileError(f"{path}: the model's parameters are not the planned ones: {exc}") from None
    plan = _plan(payload["plan"], graph, spec)
    if plan.fingerprint != payload["fingerprint"]:
        raise PlanFileError(f"{path} is damaged: the plan rebuilt from it is not the one that was saved")
    return plan, dict(payload["model"])


def _shapes(module: nn.Module) -> list[tuple[str, list[int]]]:
    return [(name, list(t.shape)) for name, t in module.state_dict().items()]


def _difference(module: nn.Module, payload: dict[str, Any]) -> str:
    """How the captured graph differs from the planned one, in words ("" if it does not)."""
    if module.code != payload["code"]:
        return "other operations"
    here, planned = dict(_shapes(module)), dict(payload["shapes"])
    if here.keys() != planned.keys():
        return f"other tensors: {sorted(here.keys() ^ planned.keys())[:3]}"
    name = next((n for n in planned if here[n] != planned[n]), None)
    return "" if name is None else f"{name} is {here[name]} here, {planned[name]} planned"


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


def _plan_data(plan: Plan) -> dict[str, Any]:
    """Everything of ``plan`` but its graph, as plain values."""
    return {
        "hint": plan.hint,
        "ranks": plan.ranks,
        "chunks": plan.chunks,
        "microbatches": plan.microbatches,
        "microbatch_size": plan.microbatch_size,
        "partition": dataclasses.asdict(plan.partition),
        "baselines": {name: dataclasses.asdict(p) for name, p in plan.baselines.items()},
        "tied": plan.tied,
        "tied_stages": plan.tied_stages,
        "profiles": [dataclasses.asdict(p) for p in plan.profiles],
        "hf_model": None if plan.hf_model is None else list(plan.hf_model),
    }


def _partition(data: dict[str, Any]) -> Partition:
    stages = tuple(StagePlan(**stage) for stage in data["stages"])
    return Partition(tuple(data["cuts"]), data["bottleneck_ms"], stages, data["max_microbatch_size"])


def _plan(data: dict[str, Any], graph: Any, spec: CaptureSpec) -> Plan:
    return Plan(
        hint=data["hint"],
        ranks=data["ranks"],
        chunks=data["chunks"],
        microbatches=data["microbatches"],
        microbatch_size=data["microbatch_size"],
        partition=_partition(data["partition"]),
        baselines={name: _partition(p) for name, p in data["baselines"].items()},
        tied=tuple(tuple(group) for group in data["tied"]),
        tied_stages=tuple(tuple(stages) for stages in data["tied_stages"]),
        graph=graph,
        profiles=tuple(NodeProfile.from_json(p) for p in data["profiles"]),
        spec=spec,
        hf_model=None if data.get("hf_model") is None else (str(data["hf_model"][0]), str(data["hf_model"][1])),
    )


def _spec(data: dict[str, Any]) -> CaptureSpec:
    return CaptureSpec(
        modules=None if data["modules"] is None else tuple(data["modules"]),
        inputs=tuple((tuple(shape), dtype) for shape, dtype in data["inputs"]),
        kwargs=tuple((key, value) for key, value in data["kwargs"]),
        tensor_kwargs=tuple((key, tuple(shape), dtype) for key, shape, dtype in data["tensor_kwargs"]),
        autocast=data.get("autocast", True),  # (a file written before the option: captured to follow one)
    )
