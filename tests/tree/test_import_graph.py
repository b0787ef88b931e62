"""``scripts/import_graph.py``'s rules, each shown failing on a made-up graph (and the tree passing them is the
test command's own run of the script)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_graph.py"


@pytest.fixture(scope="module")
def rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("hintpipe.planner.capture", "hintpipe.runtime.pipeline"),
        ("hintpipe.sim.simulator", "hintpipe.runtime.loop.reports"),
        ("hintpipe.runtime.assembly", "hintpipe.apps.training"),
        ("hintpipe.data.shards", "hintpipe.apps.batches"),
        ("hintpipe.options", "hintpipe.runtime.loop.executor"),  # an arrow up through the options
        ("hintpipe.run_options", "hintpipe.apps.lr_schedule"),
        # the runtime and the simulator are two drivers of dispatch: neither takes the other's
        ("hintpipe.runtime.loop.ready_forecast", "hintpipe.sim.simulator"),
        ("hintpipe.runtime.injection", "hintpipe.sim"),
        # dispatch stands on the schedule and the foundation alone
        ("hintpipe.dispatch.scoreboard", "hintpipe.runtime.loop.step_loop"),
        ("hintpipe.dispatch.expected", "hintpipe.sim.simulator"),
        ("hintpipe.dispatch.fit", "hintpipe.planner.plan"),
        ("hintpipe.dispatch.by_size", "hintpipe.apps.training"),
        ("hintpipe.dispatch.budgets", "hintpipe.cli.train"),
        ("hintpipe.dispatch.policy", "hintpipe.options"),
        ("hintpipe.dispatch.sample", "hintpipe.observe.trace"),
        ("hintpipe.scoreboard", "hintpipe.run_options"),  # the old name's shim is dispatch's
        # what a schedule is needs no dispatch
        ("hintpipe.schedule.hint", "hintpipe.dispatch.rank_graph"),
    ],
)
def test_a_forbidden_arrow_fails_naming_the_import(rules: ModuleType, source: str, target: str) -> None:
    a, b = rules.part(source), rules.part(target)
    assert rules.forbidden({(a, b): [(source, target, False)]}) == [
        f"forbidden: {source} imports {target} ({a} -> {b})"
    ]


def test_the_options_name_the_runtime_s_types_under_type_checking_only(rules: ModuleType) -> None:
    typed = {("options", "runtime"): [("hintpipe.options", "hintpipe.runtime.parallel.tied", True)]}
    assert rules.forbidden(typed) == []
    into_apps = {("options", "apps"): [("hintpipe.options", "hintpipe.apps.optimizer", True)]}
    assert rules.forbidden(into_apps) == [
        "forbidden: hintpipe.options imports hintpipe.apps.optimizer (options -> apps)"
    ]


def test_the_foundation_imports_only_the_foundation(rules: ModuleType) -> None:
    graph = {("base", "schedule"): [("hintpipe.units", "hintpipe.schedule.hint", False)]}
    assert rules.forbidden(graph) == ["forbidden: hintpipe.units imports hintpipe.schedule.hint (base -> schedule)"]
    assert rules.part("hintpipe.modes") == rules.part("hintpipe.choice") == "base"


def test_a_runtime_module_never_imports_a_higher_floor(rules: ModuleType) -> None:
    up = {"hintpipe.runtime.loop.step_loop": {"hintpipe.runtime.parallel.tied"}}
    assert rules.floor_breaches(up) == [
        "floor: hintpipe.runtime.loop.step_loop (floor 2) imports hintpipe.runtime.parallel.tied (floor 3)"
    ]
    assert rules.floor_breaches({"hintpipe.runtime.parallel.tied": {"hintpipe.runtime.loop.hooks"}}) == []


def test_modules_that_import_each_other_are_a_cycle(rules: ModuleType) -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert rules.cycles(edges) == [["a", "b", "c"]]
    assert rules.cycles({"a": {"b"}, "b": set()}) == []


def test_an_import_under_type_checking_is_told_apart(
    rules: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "hintpipe"
    package.mkdir()
    (package / "options.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from hintpipe.units import parse_size\n"
        "if TYPE_CHECKING:\n"
        "    from hintpipe.runtime.parallel.tied import TiedParameter\n"
        "    from hintpipe.units import format_size\n"
    )
    monkeypatch.setattr(rules, "SOURCE", package)
    assert rules.imports(package / "options.py") == {
        "hintpipe.units": False,  # imported at run time too
        "hintpipe.runtime.parallel.tied": True,
    }


def test_dispatch_is_a_part_and_the_old_names_shims_are_its(rules: ModuleType) -> None:
    parts = [rules.part(m) for m in ("hintpipe.dispatch", "hintpipe.dispatch.scoreboard", "hintpipe.scoreboard")]
    assert [*parts, rules.part("hintpipe.policy")] == ["dispatch"] * 4
    above = ("runtime", "sim", "planner", "apps", "cli", "options", "forming", "data", "observe")
    assert {("dispatch", part) for part in above} | {("runtime", "sim"), ("schedule", "dispatch")} <= rules.FORBIDDEN
    allowed = {("dispatch", "schedule"): [("hintpipe.dispatch.fit", "hintpipe.schedule.hint", False)]}
    allowed[("dispatch", "base")] = [("hintpipe.dispatch.policy", "hintpipe.choice", False)]
    allowed[("runtime", "dispatch")] = [("hintpipe.runtime.loop.ready_forecast", "hintpipe.dispatch.expected", False)]
    allowed[("sim", "dispatch")] = [("hintpipe.sim.simulator", "hintpipe.dispatch.engine", False)]
    assert rules.forbidden(allowed) == []


def test_a_torch_free_part_that_imports_torch_fails(rules: ModuleType) -> None:
    outside = {
        "hintpipe.dispatch.scoreboard": {"numpy", "torch"},
        "hintpipe.schedule.hint": {"torch"},
        "hintpipe.sim.simulator": {"numpy"},
        "hintpipe.runtime.pipeline": {"torch"},  # the runtime is torch's
    }
    assert rules.torch_breaches(outside) == [
        "torch: hintpipe.dispatch.scoreboard imports torch (dispatch is torch-free)",
        "torch: hintpipe.schedule.hint imports torch (schedule is torch-free)",
    ]


def test_what_a_module_imports_outside_hintpipe_is_found(rules: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "engine.py"
    path.write_text(
        "import heapq\nimport torch.distributed as dist\nfrom numpy import typing\n"
        "from hintpipe.dispatch import layout\nfrom . import sample\n"
        "def late() -> None:\n    from torch import nn\n"
    )
    assert rules.outside_imports(path) == {"heapq", "numpy", "torch"}
