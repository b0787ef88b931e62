"""A planned run's node profiles, kept in its checkpoint folder, so that its resume cuts the model as it did.

[Note: a resume plans as its run did]
A model the command line plans (a Hugging Face folder, a built-in ``hf-*``, a ``module:function``) is cut where
its measured node times put the cuts, and times measured again differ: two plans of one model cut it a node
apart (``transformer.h.1.mlp.dropout`` in one, ``...mlp.c_proj`` in the next, in 1 of 4 plans of a 4-layer
GPT-2). A resume plans again, so it could go on with other cuts than the run it continued: other stages,
other dropout masks (see [Note: a task's random numbers] in :mod:`hintpipe.runtime.loop.task_seeds`), and
float sums in another order. Measured: a GPT-2 folder with dropout trained 4 steps straight and 2 + 2 resumed
ended 7.4e-3 apart.

So rank 0 keeps the plan's profiles in the folder (:data:`PROFILES_FILE`, written once the run holds the
folder), keyed by what they measured (:func:`profile_key`: the captured graph's code, its parameters and the
example's shapes, the device); a resume's plan reuses them when its capture has the same key: the same
search on the same costs makes the same plan. A capture with another key (another micro-batch size, another
model) is planned afresh, and the command says so. A plan file (``--plan``) needs none of this: its cuts are
in it. A fresh run of the same model on the same machine plans from the profiles the command keeps in its
cache (see [Note: a planned model's runs repeat] in :mod:`hintpipe.cli.train_model`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path
from typing import Any

import torch

from hintpipe.planner.capture import CapturedGraph, CaptureSpec
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.plan import Plan
from hintpipe.planner.profile import signature
from hintpipe.runtime.checkpoint.disk import NO_ROOM, cannot_write
from hintpipe.runtime.checkpoint.links import NotAFile, open_regular
from hintpipe.runtime.checkpoint.manifest import write_synced
from hintpipe.runtime.checkpoint.run_folder import PROFILES_FILE
from hintpipe.runtime.errors import CheckpointError

FORMAT = 1


def profile_key(graph: CapturedGraph, spec: CaptureSpec) -> str:
    """What a graph's profiles measured, as the profile cache keys them (:func:`hintpipe.planner.profile.signature`:
    the graph's code, its parameters' and the example's shapes, the device), for an example made as ``spec``
    says."""
    example, kwargs = spec.zeros(graph.module)
    return signature(graph, (*example, *(v for v in kwargs.values() if isinstance(v, torch.Tensor))))


def record_profiles(folder: Path, plan: Plan) -> None:
    """Keep ``plan``'s profiles in the run's ``folder`` (rank 0, once the run holds it), replacing what was there.

    Raises:
        CheckpointError: no room for them (named in one line).
    """
    path = folder / PROFILES_FILE
    text = json.dumps(
        {
            "format": FORMAT,
            "key": profile_key(plan.graph, plan.spec),
            "profiles": [dataclasses.asdict(p) for p in plan.profiles],
        }
    )
    try:
        write_synced(path, text)
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        raise CheckpointError(cannot_write(path, exc)) from None


@dataclasses.dataclass(frozen=True)
class RecordedProfiles:
    """What a run folder's :data:`PROFILES_FILE` holds: the key of the capture they measured, and the profiles."""

    key: str
    profiles: tuple[NodeProfile, ...]

    def of(self, graph: CapturedGraph, spec: CaptureSpec) -> list[NodeProfile] | None:
        """The profiles, if they measured this capture (``graph`` made as ``spec`` says); else None."""
        return list(self.profiles) if self.key == profile_key(graph, spec) else None


def recorded_profiles(folder: Path) -> RecordedProfiles | None:
    """The profiles the run in ``folder`` planned with (None: it keeps none), read before anything is captured, so
    that a damaged file is refused at once.

    Raises:
        CheckpointError: the file is there and cannot be read (not a file, not JSON of this format).
    """
    path = folder / PROFILES_FILE
    try:
        with os.fdopen(open_regular(path)) as f:
            data: Any = json.load(f)
        if data["format"] != FORMAT:
            raise ValueError(f"format {data['format']!r}, this hintpipe reads {FORMAT}")
        return RecordedProfiles(str(data["key"]), tuple(NodeProfile.from_json(row) for row in data["profiles"]))
    except FileNotFoundError:
        return None
    except NotAFile as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise CheckpointError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path} is not a run's profiles ({exc}); remove it and the resume plans afresh (it may cut the model "
            "elsewhere)"
        ) from None
