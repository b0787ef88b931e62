"""Old module paths, kept importable after the package was reorganised.

``import hintpipe.simulator`` (a path from before the reorganisation) gives
the module that now lives at ``hintpipe.sim.simulator``, with a
``DeprecationWarning`` naming the new path. The table below is the whole
mapping; it is also the CHANGELOG's list of moves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "hintpipe.task": "hintpipe.schedule.task",
    "hintpipe.hint": "hintpipe.schedule.hint",
    "hintpipe.generators": "hintpipe.schedule.generators",
    "hintpipe.validation": "hintpipe.schedule.validation",
    "hintpipe.hint_csv": "hintpipe.schedule.hint_csv",
    "hintpipe.costs": "hintpipe.sim.cost_model",
    "hintpipe.variability": "hintpipe.sim.variability",
    "hintpipe.simulator": "hintpipe.sim.simulator",
    "hintpipe.study": "hintpipe.sim.compare",
    "hintpipe.trace": "hintpipe.observe.trace",
    "hintpipe.timeline": "hintpipe.observe.timeline",
    "hintpipe.mailbox": "hintpipe.runtime.mailbox",
    "hintpipe.executor": "hintpipe.runtime.executor",
    "hintpipe.pipeline": "hintpipe.runtime.pipeline",
    "hintpipe.launch": "hintpipe.runtime.launch",
    "hintpipe.checkpoint": "hintpipe.runtime.checkpoint",
    "hintpipe.inject": "hintpipe.runtime.faults",
    "hintpipe.capture": "hintpipe.planner.capture",
    "hintpipe.profiling": "hintpipe.planner.profile",
    "hintpipe.stagegen": "hintpipe.planner.stagegen",
    "hintpipe.planning": "hintpipe.planner.plan",
    "hintpipe.model_config": "hintpipe.apps.model_config",
    "hintpipe.models": "hintpipe.apps.models",
    "hintpipe.training": "hintpipe.apps.training",
}


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its new name."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader())


def install() -> None:
    """Make the old paths importable (idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
