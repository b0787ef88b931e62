"""The package layout: torch-free layers stay torch-free, and old module paths still import."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from hintpipe._compat import MOVED

TORCH_FREE = [
    "hintpipe",
    "hintpipe.spec",
    "hintpipe.units",
    "hintpipe.scoreboard",
    "hintpipe.schedule.rules",
    "hintpipe.schedule.generators",
    "hintpipe.schedule.validation",
    "hintpipe.schedule.hint_csv",
    "hintpipe.sim",
    "hintpipe.sim.expected",
    "hintpipe.observe.trace",
    "hintpipe.runtime",
    "hintpipe.runtime.errors",
    "hintpipe.runtime.injection",
    "hintpipe.apps.model_config",
    "hintpipe.cli",
]


def test_the_scheduling_core_imports_no_torch() -> None:
    code = f"import sys\nfor name in {TORCH_FREE!r}:\n    __import__(name)\nassert 'torch' not in sys.modules\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_path_is_the_new_module_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} moved to {new}; import it from there"
    ]
